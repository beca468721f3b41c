// An in-memory host serving pi's v8 services for the published TypeScript
// pi-server (@earendil-works/pi-server@0.85.1), for `cargo run --release -p
// bench -- v8`: the same work as our server's v8 side, with chord's own
// replicated state (its tracker computes the ops) and no worker process.
//
// usage: node host-v8.mjs <socket path> <server id (UUIDv4)>
//
// Server scope: pi.session-management {attach, create, detach, remove}
// (serialised, as pi's), pi.session-directory (state), pi.presentation-plugins.
// Sessions exist by name: `s<N>d<D>` and `s<N>d<D>-<anything>` hold N finished
// turns of history and stream replies one word every D ms (D = 0: each word in
// an event-loop turn of its own, `setImmediate`). Session scope:
// pi.agent-controller {prompt, waitForPrompt, ...}, pi.transcript (a
// ConversationView: entries, docs["pi.live"] with run and
// generation.message while a reply streams), pi.models, pi.session-plugins.
// A prompt answers {accepted, operationId} at once and then streams a faux
// reply: "You said: <message>. This is the faux model answering offline,
// word by word.", one word per publication, then the entry.
// Prints "ready" on stdout once listening.

import { createRemoteServiceEndpoint, defineService, RemoteServiceProvider, replicatedState } from "@earendil-works/chord";
import { BACKGROUND_CONTEXT } from "@earendil-works/chord/context";
import { SessionNotFoundError } from "@earendil-works/pi-server";
import { createUnixServer } from "@earendil-works/pi-server/unix";

const [socketPath, serverId] = process.argv.slice(2);
if (!socketPath || !serverId) {
  console.error("usage: node host-v8.mjs <socket> <serverId>");
  process.exit(2);
}

const SessionDirectory = defineService("pi.session-directory");
const SessionManagement = defineService("pi.session-management");
const PresentationPlugins = defineService("pi.presentation-plugins");
const AgentController = defineService("pi.agent-controller");
const SessionPlugins = defineService("pi.session-plugins");
const Models = defineService("pi.models");
const Transcript = defineService("pi.transcript");

const NAME = /^s(\d+)d(\d+)(-.*)?$/;
const model = { provider: "faux", modelId: "faux-1" };
const usage = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };
const assistant = (text, timestamp) => ({ role: "assistant", content: [{ type: "text", text }], provider: "faux", model: "faux-1", usage, stopReason: "stop", timestamp });
const reply = (message) => `You said: ${message}. This is the faux model answering offline, word by word.`;
const historyPrompt = (t) => [`turn ${t}:`, ...Array.from({ length: 42 }, (_, i) => `w${String(i).padStart(2, "0")}`)].join(" ");

const directory = replicatedState({ revision: 1, sessions: [] });
let tail = Promise.resolve();
const serialize = (op) => {
  const r = tail.catch(() => {}).then(op);
  tail = r.then(() => {}, () => {});
  return r;
};

const tick = (delayMs) => new Promise((resolve) => (delayMs > 0 ? setTimeout(resolve, delayMs) : setImmediate(resolve)));

const hosted = new Map();
function hostSession(sessionId) {
  const existing = hosted.get(sessionId);
  if (existing) return existing;
  const [, turns, delay] = NAME.exec(sessionId);
  const delayMs = Number(delay);
  let nextId = 1;
  const entries = [];
  for (let t = 1; t <= Number(turns); t++) {
    const message = historyPrompt(t);
    entries.push({ id: nextId++, conversationId: 1, kind: "pi.user", model: [{ role: "user", content: [{ type: "text", text: message }], timestamp: t }] });
    entries.push({ id: nextId++, conversationId: 1, kind: "pi.assistant", model: [assistant(reply(message), t)] });
  }
  const transcript = replicatedState({
    conversation: { id: 1 },
    entries,
    docs: { "pi.agent": { cwd: "/work/bench", model }, "pi.live": {} },
  });
  const models = replicatedState({
    catalog: { revision: 1, availableModels: [{ ...model, name: "Faux", reasoning: false }] },
    configuration: { model, thinkingLevel: "off" },
    refresh: { status: "idle" },
  });
  const provider = new RemoteServiceProvider([
    { service: AgentController, mode: "singleton" },
    { service: SessionPlugins, mode: "singleton" },
    { service: Models, mode: "singleton" },
    { service: Transcript, mode: "singleton" },
  ]);
  provider.provide(Transcript, { state: transcript });
  provider.provide(Models, {
    state: models,
    async cycleThinking() {},
    async getThinkingLevels() { return ["off"]; },
    async refresh() {},
    async select() {},
    async selectThinking() {},
  });
  provider.provide(SessionPlugins, { async reload() {} });
  const answers = new Map();
  const waiters = new Map();
  let busy = false;
  async function stream(submission, message) {
    const live = transcript.state.docs["pi.live"];
    live.generation = { attempt: 1, message: { role: "assistant", content: [], provider: "faux", model: "faux-1", usage, timestamp: Date.now() } };
    transcript.publish(BACKGROUND_CONTEXT);
    const words = reply(message).split(" ");
    for (let i = 0; i < words.length; i++) {
      await tick(delayMs);
      const content = transcript.state.docs["pi.live"].generation.message.content;
      if (i === 0) content.push({ type: "text", text: words[0] });
      else content[0].text += ` ${words[i]}`;
      transcript.publish(BACKGROUND_CONTEXT);
    }
    await tick(delayMs);
    const text = words.join(" ");
    transcript.state.entries.push({ id: nextId++, conversationId: 1, kind: "pi.assistant", byTaskId: submission, model: [assistant(text, Date.now())] });
    delete transcript.state.docs["pi.live"].run;
    delete transcript.state.docs["pi.live"].generation;
    transcript.publish(BACKGROUND_CONTEXT);
    busy = false;
    answers.set(String(submission), text);
    for (const resolve of waiters.get(String(submission)) ?? []) resolve({ status: "done", text, reason: null });
    waiters.delete(String(submission));
  }
  provider.provide(AgentController, {
    async prompt(request, context) {
      if (busy) return { accepted: false, operationId: null, error: { code: "busy", message: "The session is running a turn" } };
      busy = true;
      const submission = nextId++;
      transcript.state.entries.push({ id: nextId++, conversationId: 1, kind: "pi.user", model: [{ role: "user", content: [{ type: "text", text: request.message }], timestamp: Date.now() }] });
      transcript.state.docs["pi.live"].run = { taskId: submission, inputs: [submission] };
      transcript.publish(context);
      void stream(submission, request.message);
      return { accepted: true, operationId: String(submission), error: null };
    },
    async steer() { return { accepted: false, entryId: null, error: { code: "operation_failed", message: "not in the bench host" } }; },
    async followUp() { return { accepted: false, entryId: null, error: { code: "operation_failed", message: "not in the bench host" } }; },
    async cancelQueued() { return { outcome: "not_found" }; },
    async abort() {},
    async compact() { return { accepted: false, operationId: null, error: { code: "operation_failed", message: "not in the bench host" } }; },
    async waitForPrompt(operationId) {
      const text = answers.get(operationId);
      if (text !== undefined) return { status: "done", text, reason: null };
      return new Promise((resolve) => waiters.set(operationId, [...(waiters.get(operationId) ?? []), resolve]));
    },
  });
  const session = { provider };
  hosted.set(sessionId, session);
  return session;
}

const host = {
  serverServices: {
    attachClient(presentation) {
      const provider = new RemoteServiceProvider([
        { service: SessionDirectory, mode: "singleton" },
        { service: SessionManagement, mode: "singleton" },
        { service: PresentationPlugins, mode: "singleton" },
      ]);
      provider.provide(SessionDirectory, { state: directory });
      provider.provide(SessionManagement, {
        create: () => serialize(async () => { throw new Error("the bench host makes sessions by name"); }),
        remove: (sessionId, context) => serialize(async () => {
          await presentation.prepareSessionRemoval(sessionId, context);
          hosted.delete(sessionId);
        }),
        attach: (sessionId, context) => serialize(() => presentation.attachSession(sessionId, context)),
        detach: (context) => serialize(() => presentation.detachSession(context)),
      });
      provider.provide(PresentationPlugins, {
        prepareSession: async () => ({ presentationFacetBundles: [] }),
        reload: async () => ({ presentationFacetBundles: [] }),
      });
      const endpoint = createRemoteServiceEndpoint(provider);
      return {
        invokeService: (call, publish, context) => endpoint.invoke(call, publish, context),
        release() { endpoint.dispose(); provider.dispose(); },
      };
    },
  },
  async resolveSession(sessionId) {
    if (!NAME.test(sessionId)) throw new SessionNotFoundError(`Unknown session: ${sessionId}`);
    return { id: sessionId, createdAt: 1_700_000_000_000 };
  },
  async openSession(metadata) {
    const session = hostSession(metadata.id);
    return {
      attachClient() {
        const endpoint = createRemoteServiceEndpoint(session.provider);
        return { invokeService: (call, publish, context) => endpoint.invoke(call, publish, context), release() { endpoint.dispose(); } };
      },
      async close() {},
    };
  },
};

const server = createUnixServer(host, {
  path: socketPath,
  serverId,
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
