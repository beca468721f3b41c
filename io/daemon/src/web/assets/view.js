// @ts-check
/**
 * What the page shows of a session, made from the replicas its v8
 * subscriptions keep: `pi.transcript`'s state (pi's `ConversationView`)
 * and `pi.models`' state. The page never merges deltas itself: the
 * published client applies the server's ops to the replicas, and the page
 * redraws from them.
 *
 * The items are those the terminal client shows (`io/front/src/tui`):
 * - each entry in order: `pi.user` a user item, `pi.assistant` a reply,
 *   `pi.tool-result` a finished tool call (its input from the reply that
 *   called it); other kinds are not shown;
 * - then what `docs["pi.live"]` holds during a turn: the running tools,
 *   and the reply streaming (`generation.message`).
 *
 * An entry never changes once appended, so its item is made once
 * (`WeakMap` by entry), and a redraw costs what the turn added.
 *
 * @module view
 */

/** pi-ai content parts as the page's parts (a tool call's names spelt out). */
const parts = (content) =>
  typeof content === "string"
    ? [{ type: "text", text: content }]
    : (content ?? []).map((p) => (p?.type === "toolCall" ? { type: "toolCall", toolCallId: p.id, toolName: p.name, input: p.arguments } : p));

/** How a finished reply ended, as the page badges it. */
const ended = (stopReason) => (stopReason === "error" ? "error" : stopReason === "aborted" ? "aborted" : "complete");

/** A reply (pi-ai `AssistantMessage`) as an item. */
const reply = (id, m, streaming) => ({
  id,
  role: "assistant",
  content: parts(m.content),
  status: streaming ? "streaming" : ended(m.stopReason),
  model: { provider: m.provider, id: m.model },
  responseModel: m.model,
  usage: m.usage,
  stopReason: m.stopReason,
  errorMessage: m.errorMessage,
  timestamp: m.timestamp,
});

/** @type {WeakMap<object, any>} */
const made = new WeakMap();

/** The item of one entry (`null`: not shown), made once. */
const itemOf = (entry, calls) => {
  if (made.has(entry)) return made.get(entry);
  const m = entry.model?.[0];
  const id = `e${entry.id}`;
  let item = null;
  if (m && entry.kind === "pi.user") item = { id, role: "user", content: parts(m.content), timestamp: m.timestamp };
  else if (m && entry.kind === "pi.assistant") item = reply(id, m, false);
  else if (m && entry.kind === "pi.tool-result") {
    item = {
      id,
      role: "tool",
      toolCallId: m.toolCallId,
      toolName: m.toolName,
      input: calls.get(m.toolCallId)?.arguments ?? null,
      content: parts(m.content),
      status: m.isError ? "error" : "complete",
      timestamp: m.timestamp,
    };
  }
  made.set(entry, item);
  return item;
};

/** Notes the tool calls of a reply, by call id. */
const noteCalls = (calls, message) => {
  for (const p of message?.content ?? []) if (p?.type === "toolCall") calls.set(p.id, p);
};

/**
 * The session as the page draws it: its items and phase, from the
 * transcript replica; its model and thinking level from the models replica.
 * @param {any} view `pi.transcript`'s state
 * @param {any} models `pi.models`' state
 */
export const sessionOf = (view, models) => {
  const calls = new Map();
  const items = [];
  const finished = new Set();
  for (const entry of view?.entries ?? []) {
    for (const m of entry.model ?? []) if (m?.role === "assistant") noteCalls(calls, m);
    const item = itemOf(entry, calls);
    if (item) items.push(item);
    if (item?.role === "tool") finished.add(item.toolCallId);
  }
  const live = view?.docs?.["pi.live"] ?? {};
  for (const slot of live.tools ?? []) {
    if (finished.has(slot.callId)) continue;
    items.push({
      id: `tool:${slot.callId}`,
      role: "tool",
      toolCallId: slot.callId,
      toolName: slot.name,
      input: calls.get(slot.callId)?.arguments ?? null,
      content: slot.output ? [{ type: "text", text: slot.output }] : [],
      status: slot.status === "done" ? "complete" : "running",
    });
  }
  const streaming = live.generation?.message;
  if (streaming) items.push(reply("live", streaming, true));
  const configuration = models?.configuration ?? {};
  const agent = view?.docs?.["pi.agent"] ?? {};
  const model = configuration.model ?? agent.model;
  return {
    items,
    phase: live.run ? "turn" : "idle",
    model: model ? { provider: model.provider, id: model.modelId } : null,
    thinkingLevel: configuration.thinkingLevel ?? agent.thinkingLevel ?? "off",
    cwd: agent.cwd,
  };
};

/** The text parts of a user item, joined (what the page compares its own prompts with). */
export const userText = (item) => (item.content ?? []).filter((p) => p.type === "text").map((p) => p.text).join("");
