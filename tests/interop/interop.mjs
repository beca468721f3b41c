// Drives a running pi-server with the published @earendil-works/pi-client@0.84.4.
// Usage: node interop.mjs <socket path>. Exits non-zero with a message on any failure.
import { PiClient, PiServerError } from "@earendil-works/pi-client";
import { createUnixTransportFactory } from "@earendil-works/pi-client/unix";

const path = process.argv[2];
const check = (cond, what) => {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok - ${what}`);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const a = await PiClient.connect({ transportFactory: createUnixTransportFactory({ path }) });
check(a.connected, "client 1 connects (hello + ServerSnapshot)");
check(a.snapshot.protocolVersion === 1 && a.snapshot.models.length > 0, "server snapshot lists models");
const before = await a.listSessions();
check(Array.isArray(before), "list");

const s = await a.createSession({ cwd: "/tmp", name: "interop" });
check(typeof s.id === "string" && s.id.length === 36, "create returns a server-assigned id");
check(s.snapshot.attached && s.snapshot.locked && s.snapshot.phase === "idle", "create snapshot is attached, locked, idle");

const deltas = [];
const unsub = s.onEvent((e) => {
  if (e.type === "session_progress" && e.progress.type === "assistant_delta") deltas.push(e.progress.delta);
});
const done = await s.prompt("hello interop");
unsub();
check(done.phase === "idle", "prompt resolves when the turn ends");
const reply = done.transcript.at(-1);
check(reply.role === "assistant" && reply.status === "complete", "reply is a complete assistant item");
check(deltas.length >= 3 && deltas.join("").includes("hello interop"), `progress deltas streamed (${deltas.length})`);

// Steer and abort during a turn.
const pending = s.prompt("a long task");
await sleep(60);
const steered = await s.steer("focus on tests");
check(steered.queuedSteerCount === 1 && steered.queuedSteer[0].content[0].text === "focus on tests", "steer is queued and visible");
try {
  await s.prompt("second");
  throw new Error("a second prompt must be busy");
} catch (e) {
  check(e instanceof PiServerError && e.code === "busy", "a second prompt is rejected busy");
}
const aborted = await s.abort();
check(aborted.phase === "idle", "abort ends the turn");
const finished = await pending;
check(finished.transcript.some((i) => i.role === "assistant" && i.status === "aborted"), "the aborted prompt still succeeds with an aborted item");

// Models and thinking.
const models = a.snapshot.models;
const reasoner = models.find((m) => m.reasoning && m.supportedThinkingLevels.length > 1);
check(reasoner !== undefined, "a reasoning model with several thinking levels");
const withModel = await s.setModel({ provider: reasoner.provider, id: reasoner.id });
check(withModel.model.id === reasoner.id, "set_model");
const level = reasoner.supportedThinkingLevels.at(-1);
const withThinking = await s.setThinking(level);
check(withThinking.thinkingLevel === level, "set_thinking");
try {
  await s.setModel({ provider: "nope", id: "missing" });
  throw new Error("unknown model must fail");
} catch (e) {
  check(e instanceof PiServerError && e.code === "invalid_request", "set_model of an unknown model is invalid_request");
}

// A second client attaches and sees the same snapshot.
const b = await PiClient.connect({ transportFactory: createUnixTransportFactory({ path }) });
const sb = await b.attachSession(s.id);
check(sb.snapshot.revision === s.snapshot.revision && sb.snapshot.transcript.length === s.snapshot.transcript.length, "client 2 attaches and sees the same snapshot");
const seen = new Promise((resolve) => {
  const off = sb.subscribe((snap) => {
    if (snap.phase === "idle" && snap.transcript.length > finished.transcript.length) {
      off();
      resolve(snap);
    }
  });
});
const third = await s.prompt("seen by both");
const other = await seen;
check(other.revision === third.revision, "client 2 receives the same final snapshot");

await sb.detach();
check(!sb.attached, "client 2 detaches");
await s.detach();
const listed = await a.listSessions();
check(listed.some((m) => m.id === s.id && m.sessionName === "interop"), "the session is listed after detach");
await b.dispose();
await a.dispose();
console.log("interop: all checks passed");
