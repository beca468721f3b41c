// What the page draws of a session (io/daemon/src/web/assets/view.js), made
// from a ConversationView and a models state shaped as the server publishes
// them (kernel/src/server/v8/view.rs).
//
// Run: node --test tests/web/

import { test } from "node:test";
import assert from "node:assert/strict";

import { sessionOf, userText } from "../../io/daemon/src/web/assets/view.js";

const usage = { input: 1, output: 2, cacheRead: 0, cacheWrite: 0, totalTokens: 3, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0.5 } };
const entry = (id, kind, message) => ({ id, conversationId: 1, kind, model: [message] });
const user = (id, text) => entry(id, "pi.user", { role: "user", content: [{ type: "text", text }], timestamp: id });
const assistant = (content, stopReason = "stop", extra = {}) => ({ role: "assistant", content, provider: "faux", model: "faux-1", usage, stopReason, timestamp: 9, ...extra });
const agentDoc = { cwd: "/work", model: { provider: "faux", modelId: "faux-1" }, thinkingLevel: "off" };
const models = { configuration: { model: { provider: "faux", modelId: "faux-reasoner" }, thinkingLevel: "high" } };

test("entries become items, a tool result takes its input from the call", () => {
  const view = {
    conversation: { id: 1 },
    entries: [
      user(1, "list files"),
      entry(2, "pi.assistant", assistant([{ type: "toolCall", id: "c1", name: "bash", arguments: { command: "ls" } }], "toolUse")),
      entry(3, "pi.tool-result", { role: "toolResult", toolCallId: "c1", toolName: "bash", content: [{ type: "text", text: "a\nb" }], isError: false, timestamp: 3 }),
      entry(4, "pi.assistant", assistant([{ type: "text", text: "two files" }])),
      entry(5, "pi.assistant", assistant([], "aborted", { errorMessage: "Aborted" })),
      { id: 6, conversationId: 1, kind: "pi.system" },
    ],
    docs: { "pi.agent": agentDoc, "pi.live": {} },
  };
  const s = sessionOf(view, models);
  assert.deepEqual(s.items.map((i) => [i.id, i.role, i.status]), [
    ["e1", "user", undefined],
    ["e2", "assistant", "complete"],
    ["e3", "tool", "complete"],
    ["e4", "assistant", "complete"],
    ["e5", "assistant", "aborted"],
  ]);
  assert.equal(userText(s.items[0]), "list files");
  assert.deepEqual(s.items[1].content[0], { type: "toolCall", toolCallId: "c1", toolName: "bash", input: { command: "ls" } });
  assert.deepEqual(s.items[2].input, { command: "ls" });
  assert.equal(s.items[3].usage.totalTokens, 3);
  assert.deepEqual(s.items[3].model, { provider: "faux", id: "faux-1" });
  assert.equal(s.phase, "idle");
  assert.deepEqual(s.model, { provider: "faux", id: "faux-reasoner" }, "the models replica names the model");
  assert.equal(s.thinkingLevel, "high");
  assert.equal(s.cwd, "/work");
  assert.equal(sessionOf(view, models).items[0], s.items[0], "an entry's item is made once");
});

test("during a turn: the running tools with their output, then the reply streaming", () => {
  const view = {
    conversation: { id: 1 },
    entries: [user(1, "go"), entry(2, "pi.assistant", assistant([{ type: "toolCall", id: "c1", name: "bash", arguments: { command: "make" } }], "toolUse"))],
    docs: {
      "pi.agent": agentDoc,
      "pi.live": {
        run: { taskId: 1, inputs: [] },
        tools: [{ callId: "c1", name: "bash", status: "running", output: "building" }],
        generation: { attempt: 1, message: assistant([{ type: "thinking", thinking: "hm" }, { type: "text", text: "so far" }], undefined) },
      },
    },
  };
  const s = sessionOf(view, undefined);
  assert.equal(s.phase, "turn");
  const [tool, reply] = s.items.slice(2);
  assert.deepEqual([tool.role, tool.status, tool.input, tool.content[0].text], ["tool", "running", { command: "make" }, "building"]);
  assert.deepEqual([reply.id, reply.status, reply.content[1].text], ["live", "streaming", "so far"]);
  assert.deepEqual(s.model, { provider: "faux", id: "faux-1" }, "without a models replica, the agent document names it");
});

test("an empty or missing view draws nothing", () => {
  assert.deepEqual(sessionOf(undefined, undefined).items, []);
  assert.equal(sessionOf({ entries: [], docs: {} }, undefined).phase, "idle");
});
