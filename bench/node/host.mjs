// A minimal in-memory host for the published TypeScript pi-server (protocol
// v8, @earendil-works/pi-server@0.85.1), for `cargo run --release -p bench -- node`.
//
// usage: node host.mjs <socket path> <server id (UUIDv4)> <sessions listed>
//
// Server-scope services (target {serverId}):
//   bench.list()                 -> an array of <sessions> session metadata objects
//                                   shaped like pi v1's SessionMetadata (our `list`)
//   $chord.service.subscribe(subscriptionId, "bench.stream", "singleton")
//                                -> a snapshot of one state member `text` ({text: ""})
//   $chord.service.unsubscribe(subscriptionId)
//   bench.stream.run(n, delayMs) -> publishes n state updates (each appends one word to
//                                   `text`) to every subscriber, as fast as the server
//                                   takes them (delayMs 0) or one every delayMs; answers
//                                   n once all were sent
// Sessions are not used (resolveSession always fails with session_not_found).
// Prints "ready" on stdout once listening.

import { SessionNotFoundError } from "@earendil-works/pi-server";
import { createUnixServer } from "@earendil-works/pi-server/unix";

const [socketPath, serverId, sessionsArg] = process.argv.slice(2);
if (!socketPath || !serverId) {
  console.error("usage: node host.mjs <socket> <serverId> <sessions>");
  process.exit(2);
}

const sessions = Array.from({ length: Number(sessionsArg ?? 1) }, (_, i) => ({
  id: `0b7d3c2e-5f7a-4c1e-9a55-${String(i).padStart(12, "0")}`,
  createdAt: 1_700_000_000_000 + i,
  updatedAt: 1_700_000_000_000 + i,
  sessionName: `bench ${i}`,
  cwd: "/work/bench",
}));

// Every live subscription: {subscriptionId, publish}.
const subscribers = new Set();
// One sequence for the shared state member, as one provider would keep it.
let sequence = 0;

function snapshot(serviceId, mode) {
  return {
    serviceId,
    mode,
    instances: [{ members: [{ name: "text", kind: "state", sequence, ops: [["r", { text: "" }]] }] }],
  };
}

const serverServices = {
  attachClient(_presentation, _context) {
    const mine = new Map();
    return {
      async invokeService(call, publish, context) {
        const name = `${call.serviceId}.${call.member}`;
        switch (name) {
          case "bench.list":
            return sessions;
          case "$chord.service.subscribe": {
            const [subscriptionId, serviceId, mode] = call.args;
            const entry = { subscriptionId, publish };
            subscribers.add(entry);
            mine.set(subscriptionId, entry);
            return snapshot(serviceId, mode);
          }
          case "$chord.service.unsubscribe": {
            const entry = mine.get(call.args[0]);
            if (entry) subscribers.delete(entry);
            mine.delete(call.args[0]);
            return undefined;
          }
          case "bench.stream.run": {
            const n = Number(call.args[0]);
            const delayMs = Number(call.args[1] ?? 0);
            const sent = [];
            for (let i = 0; i < n; i++) {
              sequence += 1;
              const update = {
                type: "state",
                member: "text",
                sequence,
                ops: [["a", ["text"], `w${String(i).padStart(4, "0")} `]],
              };
              for (const s of subscribers) sent.push(s.publish(s.subscriptionId, update, context));
              // Each update in a turn of the event loop of its own, as a
              // streamed reply's chunks arrive: the server writes as it goes.
              // (In one synchronous loop nothing went out until all n were
              // published, seconds after the first.)
              if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
              else await new Promise((resolve) => setImmediate(resolve));
            }
            await Promise.all(sent);
            return n;
          }
          default:
            throw new Error(`unknown service call ${name}`);
        }
      },
      release(_context) {
        for (const entry of mine.values()) subscribers.delete(entry);
        mine.clear();
      },
    };
  },
};

const host = {
  serverServices,
  async resolveSession(sessionId) {
    throw new SessionNotFoundError(`Unknown session: ${sessionId}`);
  },
  async openSession() {
    throw new SessionNotFoundError("no sessions in the bench host");
  },
};

const server = createUnixServer(host, {
  path: socketPath,
  serverId,
  // The bench drops its connections without a goodbye; only other errors are news.
  onError: (error) => {
    if (!["ECONNRESET", "EPIPE"].includes(error?.code)) console.error(`host error: ${error?.stack ?? error}`);
  },
});
await server.start();
console.log("ready");

const stop = async () => {
  await server.close().catch(() => {});
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
