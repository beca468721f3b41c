// One session, two protocols: the published v1 client (pi-client 0.84.4,
// installed by ../interop/install.sh) and the published v8 client
// (pi-client 0.85.1 + chord 0.85.1, ./install.sh) on one running server.
//
//   node mixed.mjs <socket path> <server id>
//
// Checked: both see the same turns whoever prompts; an image goes with a v8
// prompt to the model, and v1 sees it in the transcript; a busy session is busy
// for both; a removal through v8 reaches the v1 client (`session_removed`,
// gone from its list) and the v8 one (`attachment: null`).
import { PiClient, PiServerError } from "../interop/node_modules/@earendil-works/pi-client/dist/index.js";
import { createUnixTransportFactory as v1Transport } from "../interop/node_modules/@earendil-works/pi-client/dist/unix.js";
import { createRemoteServiceBinding, defineService } from "@earendil-works/chord";
import { BACKGROUND_CONTEXT } from "@earendil-works/chord/context";
import { Client, createClientServiceTransport } from "@earendil-works/pi-client";
import { createUnixTransportFactory } from "@earendil-works/pi-client/unix";

const [path, serverId] = process.argv.slice(2);
if (!path || !serverId) throw new Error("usage: node mixed.mjs <socket path> <server id>");
const check = (cond, what) => {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`ok - ${what}`);
};
const until = async (cond, what, ms = 20000) => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};
const ctx = BACKGROUND_CONTEXT;

// v1: create and attach.
const v1 = await PiClient.connect({ transportFactory: v1Transport({ path }) });
const s1 = await v1.createSession({ cwd: "/tmp", name: "mixed" });
check(s1.snapshot.attached, "v1 creates and attaches a session");

// v8: attach the same session and follow its transcript.
const Management = defineService("pi.session-management");
const Transcript = defineService("pi.transcript");
const Agent = defineService("pi.agent-controller");
// Ours, beside pi's: every session's state, clients, model and activity.
const Status = defineService("pi-server.session-status");
const v8 = await Client.connect({ serverId, transportFactory: createUnixTransportFactory({ path }) });
const server = createRemoteServiceBinding({
  services: [Management, Status],
  transport: createClientServiceTransport(v8, () => ({ serverId })),
});
const status = server.use(Status);
await server.ready(ctx);
const statusOf = (id) => status.state.value.sessions.find((s) => s.sessionId === id);
const seenStates = new Set();
status.state.subscribe((value) => {
  for (const s of value.sessions) if (s.sessionId === s1.id) seenStates.add(s.state);
});
check(statusOf(s1.id)?.clients === 1, "the status service shows v1's session with its one client");
await server.use(Management).attach(s1.id, ctx);
check(v8.attachment?.sessionId === s1.id, "v8 attaches the same session");
await until(() => statusOf(s1.id)?.clients === 2, "the status to count both clients");
check(
  statusOf(s1.id).state === "idle" && typeof statusOf(s1.id).model?.modelId === "string" && statusOf(s1.id).thinkingLevel,
  "the status shows the live session's state, model and thinking level",
);
const session = createRemoteServiceBinding({
  services: [Transcript, Agent],
  transport: createClientServiceTransport(v8, () => v8.attachment),
});
await session.ready(ctx);
const transcript = session.use(Transcript);
const agent = session.use(Agent);
const kinds = () => transcript.state.value.entries.map((e) => e.kind);
const texts = () =>
  transcript.state.value.entries.flatMap((e) => e.model ?? []).flatMap((m) =>
    typeof m.content === "string" ? [m.content] : m.content.filter((c) => c.type === "text").map((c) => c.text),
  );

// v1 prompts: v8 sees the turn.
const done = await s1.prompt("asked over v1");
check(done.transcript.at(-1).status === "complete", "v1's prompt completes");
await until(() => kinds().filter((k) => k === "pi.assistant").length === 1, "v8 to see v1's reply");
check(texts().some((t) => t.includes("asked over v1")), "v8's transcript holds v1's prompt and its reply");

// v8 prompts: v1 sees the turn.
const answer = await agent.prompt({ message: "asked over v8", images: null }, ctx);
check(answer.accepted === true, "v8's prompt is accepted at once");
const settled = await agent.waitForPrompt(answer.operationId, ctx);
check(settled.status === "done" && settled.text.length > 0, "waitForPrompt answers with the reply's text");
await until(
  () => s1.snapshot.phase === "idle" && s1.snapshot.transcript.some((i) => i.role === "user" && i.content[0].text === "asked over v8"),
  "v1 to see v8's turn",
);
check(s1.snapshot.transcript.filter((i) => i.role === "assistant").length === 2, "v1's snapshot holds both replies");

// An image goes with a v8 prompt (v1 cannot carry one); a bad one is refused in band.
const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const seeing = await agent.prompt({ message: "what is this", images: [{ type: "image", data: png, mimeType: "image/png" }] }, ctx);
check(seeing.accepted === true, "a prompt with an image is accepted");
const seen = await agent.waitForPrompt(seeing.operationId, ctx);
check(seen.text.includes("with 1 image (image/png)"), "the model was given the image");
await until(() => s1.snapshot.transcript.some((i) => i.role === "user" && i.content.some((c) => c.type === "image")), "v1 to see the image in the transcript");
let badImage = null;
try {
  await agent.prompt({ message: "and this", images: [{ type: "image", data: png, mimeType: "image/bmp" }] }, ctx);
} catch (e) {
  badImage = e;
}
check(badImage?.code === "service_invalid_value", "an image of a type no model takes is refused");

// Busy for both: a v1 turn makes v8's prompt busy, and the other way round.
const pending = s1.prompt("a long one");
await until(() => s1.snapshot.phase !== "idle", "v1's turn to start");
const refused = await agent.prompt({ message: "too early", images: null }, ctx);
check(refused.accepted === false && refused.error.code === "busy", "v8's prompt is busy during v1's turn");
await pending;
const second = await agent.prompt({ message: "v8's long one", images: null }, ctx);
try {
  await s1.prompt("too early");
  throw new Error("v1's prompt must be busy");
} catch (e) {
  check(e instanceof PiServerError && e.code === "busy", "v1's prompt is busy during v8's turn");
}
await agent.waitForPrompt(second.operationId, ctx);
check(seenStates.has("turn") && seenStates.has("idle"), "the status service followed the turns as they ran");

// A removal through v8 reaches both.
let removed = false;
s1.onEvent?.((e) => {
  if (e.type === "session_removed") removed = true;
});
await until(() => s1.snapshot.phase === "idle", "the session to be idle");
await server.use(Management).remove(s1.id, ctx);
check(v8.attachment === undefined || v8.attachment === null, "v8 hears attachment: null");
const listed = await v1.listSessions();
check(!listed.some((m) => m.id === s1.id), "the session is gone from v1's list");
check(removed || !s1.attached, "v1 is told the session went away");
await until(() => statusOf(s1.id) === undefined, "the status to drop the removed session");

await session.dispose(ctx);
await server.dispose(ctx);
await v8.dispose();
await v1.dispose();
console.log("mixed: all checks passed");
