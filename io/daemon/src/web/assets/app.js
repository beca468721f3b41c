// The pi-server web client: a session list and one session's live view,
// over pi protocol v1 on a WebSocket (`./conn.js`). Plain ES modules, no
// build step; Preact, htm and marked are vendored under ./vendor/.
//
// What the page shows of a session follows the terminal client (io/front/src/tui)
// and the kernel's follower (kernel/src/client/follow.rs):
//
// - Snapshots are authoritative. A snapshot of a newer revision, or the
//   one answering our attach, replaces what is shown: the server sends a
//   snapshot current as of the deltas that follow it (an attach during a
//   turn waits for the worker's), so a page joining mid-reply shows the
//   reply so far and streams on. Another snapshot of the revision already
//   shown is merged: a part keeps the longer text when one is a prefix of
//   the other.
// - Deltas only append, to the streaming assistant item's content part
//   named by `messageId`/`contentIndex`, and only when that item's content
//   was seen (an item event or a snapshot) with no gap since. Deltas for
//   an id neither a snapshot nor an item event named are dropped. After a
//   gap a reply shows its text, a marked gap, then the deltas that follow,
//   until the re-attach's snapshot (or its next item event) fills it in
//   whole. Nothing is shown twice.
// - A user message is labelled as another client's when it arrives live and
//   is not a text this page sent (the protocol does not record the sender;
//   history is not labelled), as the terminal client does.
//
// Colour pairs (WCAG 2 contrast; all text pairs are at least 4.5:1):
//   light: text #1b1b1f on #ffffff 17.17, on surface #f3f4f6 15.60, on
//   user #eaf1fb 15.10; muted #55585f on #ffffff 7.12, on #f3f4f6 6.47, on
//   #eaf1fb 6.27; link #0a58ca on #ffffff 6.44, on #f3f4f6 5.85, on #eaf1fb
//   5.66; button #ffffff on #0a58ca 6.44; danger #ffffff on #b3261e 6.54;
//   error #8c1d18 on #fdecea 7.97; banner #5b3a00 on #fff1cc 9.12; badges
//   ok #1e6b35 6.54 / warn #8a4b00 6.80 / err #b3261e 6.54 on #ffffff
//   (5.94-6.18 on #f3f4f6); focus ring #0a58ca 6.44 and control borders
//   #767a82 4.31 against #ffffff (3:1 needed for non-text).
//   dark: text #e4e4e7 on #141417 14.49, on #212127 12.62, on #1c2a3f
//   11.40; muted #a9abb3 on #141417 8.02, on #212127 6.99, on #1c2a3f 6.31;
//   link #8ab4f8 on #141417 8.72, on #212127 7.60, on #1c2a3f 6.86; button
//   #0b1d3a on #8ab4f8 7.96; danger #2b0a08 on #f2b8b5 10.70; error #ffdad6
//   on #4a1512 11.55; banner #ffe08a on #3a2c00 10.57; badges ok #7fd69a
//   10.50 / warn #f5c26b 11.22 / err #f2b8b5 10.77 on #141417; borders
//   #7d808a 4.66.

import { h, render } from "./vendor/preact.module.js";
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from "./vendor/hooks.module.js";
import htm from "./vendor/htm.module.js";
import { Marked } from "./vendor/marked.esm.js";
import { PiConnection } from "./conn.js";

const html = htm.bind(h);

const TOKEN_KEY = "pi-token";
/** How often the list asks for fresh metadata and live status. */
const LIST_POLL_MS = 5000;

// ---------------------------------------------------------------------------
// Text

/** Bidirectional overrides would reorder what follows them; NUL and other
 * C0 controls (but tab and newline) carry nothing worth showing. */
const UNSAFE = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f\u202a-\u202e\u2066-\u2069]/g;
const clean = (text) => String(text ?? "").replace(/\r\n?/g, "\n").replace(UNSAFE, "\ufffd");

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);

/** Only these link targets survive; anything else is shown as plain text. */
const safeHref = (href) => {
  const h = String(href ?? "").trim();
  if (/^(https?:|mailto:)/i.test(h)) return h;
  if (/^[#/.]/.test(h) || !/^[a-z][a-z0-9+.-]*:/i.test(h)) return h;
  return null;
};

// Markdown with raw HTML escaped, never passed through, and links limited
// to safe schemes. Images are not loaded (the page's CSP forbids other
// origins anyway); they become links.
const markdown = new Marked({ gfm: true, breaks: false, async: false });
markdown.use({
  renderer: {
    html(token) {
      const text = escapeHtml(token.text ?? token.raw ?? "");
      return token.block ? `<p>${text}</p>\n` : text;
    },
    link(token) {
      const inner = this.parser.parseInline(token.tokens);
      const href = safeHref(token.href);
      if (href === null) return inner;
      const title = token.title ? ` title="${escapeHtml(token.title)}"` : "";
      return `<a href="${escapeHtml(href)}"${title} rel="noopener noreferrer nofollow" target="_blank">${inner}</a>`;
    },
    image(token) {
      const alt = escapeHtml(token.text || "image");
      const href = safeHref(token.href);
      return href === null ? `[${alt}]` : `<a href="${escapeHtml(href)}" rel="noopener noreferrer nofollow" target="_blank">[image: ${alt}]</a>`;
    },
  },
});

const renderMarkdown = (text) => {
  try {
    return markdown.parse(clean(text));
  } catch (e) {
    return `<pre>${escapeHtml(clean(text))}</pre>`;
  }
};

const textOf = (content) =>
  (content ?? [])
    .filter((c) => c.type === "text")
    .map((c) => c.text)
    .join("");

const inputText = (input, key) => (input && typeof input === "object" && typeof input[key] === "string" ? input[key] : null);

/** A tool call's one-line title, as every front end names it
 * (follow.rs `tool_title`): `bash: ls -la`, `read: src/main.rs`. */
const toolTitle = (name, input) => {
  const main =
    inputText(input, "command") ??
    inputText(input, "path") ??
    inputText(input, "file_path") ??
    inputText(input, "pattern") ??
    inputText(input, "url");
  if (main === null) return clean(name);
  const line = main.split("\n")[0];
  const short = Array.from(line).slice(0, 120).join("");
  return clean(`${name}: ${short}${short.length < main.length ? "…" : ""}`);
};

const prettyJson = (v) => {
  try {
    return clean(JSON.stringify(v, null, 2));
  } catch {
    return clean(String(v));
  }
};

const modelKey = (m) => (m ? `${m.provider}/${m.id}` : "");

const errorText = (e) => {
  const message = clean(e?.message || String(e));
  return e?.code && !message.includes(e.code) ? `${message} (${e.code})` : message;
};

const ago = (t, now) => {
  if (typeof t !== "number" || t < 946684800000) return "unknown";
  const s = Math.round((now - t) / 1000);
  if (s < 45) return "just now";
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min ago`;
  const hrs = Math.round(m / 60);
  if (hrs < 24) return `${hrs} h ago`;
  const d = Math.round(hrs / 24);
  if (d < 30) return `${d} d ago`;
  return new Date(t).toLocaleDateString();
};

const isoTime = (t) => (typeof t === "number" && t >= 946684800000 ? new Date(t).toISOString() : undefined);

// ---------------------------------------------------------------------------
// One session's transcript, merged from snapshots and progress

const isTerminal = (item) =>
  item.role === "user" || (item.role === "assistant" ? item.status !== "streaming" : item.status !== "running");

/** A fresh view state of session `id` (nothing seen yet). */
const newSession = (id) => ({
  id,
  /** The latest authoritative snapshot. */
  snap: null,
  /** Best-known items by id: the snapshot's, or further along from progress. */
  items: new Map(),
  /** Ids of items known from progress and not in the snapshot yet. */
  extra: [],
  /** Streaming replies whose deltas follow on from what is shown. */
  anchored: new Set(),
  /** For replies not anchored: id -> (contentIndex -> {kind, text}) of
   * deltas received after a gap. */
  tails: new Map(),
  /** Joined (attach/create answered) and nothing lost since. */
  synced: false,
  /** User item id -> "own" | "other" | "history". */
  origin: new Map(),
  /** Texts this page sent: {text, seen}. */
  own: [],
  attached: false,
  attaching: false,
  /** Our prompt requests pending. */
  prompting: 0,
  pendingModel: null,
  pendingThinking: null,
  draft: "",
  /** The session could not be opened: the error. */
  failed: null,
  removed: false,
  info: null,
});

/** A snapshot's part merged with what is known of the same revision: the
 * longer text when one is a prefix of the other, else the snapshot's. */
const mergeSame = (known, item) => {
  if (!known || known.role !== item.role || item.role === "user" || isTerminal(item)) return item;
  if (isTerminal(known)) return known;
  if (item.role === "tool") return (known.content?.length ?? 0) > (item.content?.length ?? 0) ? known : item;
  const a = known.content ?? [];
  const b = item.content ?? [];
  const content = [];
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const [x, y] = [a[i], b[i]];
    if (!y) content.push(x);
    else if (!x) content.push(y);
    else if (x.type === y.type && (x.type === "text" || x.type === "thinking")) {
      const f = x.type;
      content.push(x[f].length > y[f].length && x[f].startsWith(y[f]) ? x : y);
    } else content.push(y);
  }
  return { ...item, content };
};

/** Labels a user item the first time it is seen. */
const classify = (st, item, history) => {
  if (st.origin.has(item.id)) return;
  const text = textOf(item.content);
  const mine = st.own.find((o) => !o.seen && o.text === text);
  if (mine) {
    mine.seen = true;
    st.origin.set(item.id, "own");
  } else {
    st.origin.set(item.id, history ? "history" : "other");
  }
};

/** Takes a snapshot. `join`: it answers our attach or create (current as
 * of the deltas after it, like every snapshot the server sends). */
const applySnapshot = (st, s, join = false) => {
  if (!s || s.id !== st.id) return false;
  const prev = st.snap;
  if (prev && s.revision < prev.revision && !join) return false;
  const replace = !prev || s.revision !== prev.revision || join;
  const anchor = replace && (join || st.synced);
  const history = join && !prev;
  const ids = new Set();
  for (const item of s.transcript) {
    ids.add(item.id);
    const known = st.items.get(item.id);
    st.items.set(item.id, replace || !known ? item : mergeSame(known, item));
    if (replace) {
      st.tails.delete(item.id);
      if (anchor) st.anchored.add(item.id);
      else st.anchored.delete(item.id);
    }
    if (item.role === "user") classify(st, item, history);
  }
  for (const item of s.queuedSteer ?? []) classify(st, item, history);
  if (replace) {
    for (const id of [...st.items.keys()]) {
      if (!ids.has(id)) {
        st.items.delete(id);
        st.tails.delete(id);
        st.anchored.delete(id);
      }
    }
    st.extra = [];
  } else {
    st.extra = st.extra.filter((id) => !ids.has(id));
  }
  st.snap = s;
  if (join) st.synced = true;
  return true;
};

const applyProgress = (st, p) => {
  if (!st.snap || !p) return;
  switch (p.type) {
    case "item_started":
    case "item_updated":
    case "item_finished": {
      const item = p.item;
      if (!item?.id) return;
      const known = st.items.get(item.id);
      if (known && isTerminal(known) && !isTerminal(item)) return;
      st.items.set(item.id, item);
      st.anchored.add(item.id);
      st.tails.delete(item.id);
      if (!st.snap.transcript.some((i) => i.id === item.id) && !st.extra.includes(item.id)) st.extra.push(item.id);
      if (item.role === "user") classify(st, item, false);
      return;
    }
    case "assistant_delta": {
      const id = p.messageId;
      const known = st.items.get(id);
      if (!known || known.role !== "assistant" || known.status !== "streaming") return;
      // Tool-call input streams as JSON fragments: the call is shown whole
      // once its reply says it.
      if (p.kind === "toolCall") return;
      const type = p.kind === "thinking" ? "thinking" : "text";
      const index = p.contentIndex;
      if (st.anchored.has(id)) {
        const content = (known.content ?? []).slice();
        if (index === content.length) content.push(type === "thinking" ? { type, thinking: "" } : { type, text: "" });
        const part = content[index];
        if (part && part.type === type) {
          content[index] = { ...part, [type]: part[type] + p.delta };
          st.items.set(id, { ...known, content });
          return;
        }
        st.anchored.delete(id); // out of step: what follows is shown after a gap
      }
      const tails = st.tails.get(id) ?? new Map();
      const tail = tails.get(index);
      tails.set(index, { kind: type, text: (tail?.kind === type ? tail.text : "") + p.delta });
      st.tails.set(id, tails);
      return;
    }
    default:
  }
};

/** Progress may have been lost (the connection dropped). */
const gap = (st) => {
  st.anchored.clear();
  st.synced = false;
  st.attached = false;
};

/** The items shown, in order. */
const shownItems = (st) => {
  if (!st.snap) return [];
  const ids = st.snap.transcript.map((i) => i.id).concat(st.extra);
  return ids.map((id) => st.items.get(id)).filter(Boolean);
};

const usageTotal = (items) => {
  let tokens = 0;
  let cost = 0;
  for (const item of items) {
    if (item.role === "assistant" && item.usage) {
      tokens += item.usage.totalTokens ?? 0;
      cost += item.usage.cost?.total ?? 0;
    }
  }
  return { tokens, cost };
};

// ---------------------------------------------------------------------------
// The page's state

const parseRoute = () => {
  const m = /^#\/s\/(.+)$/.exec(location.hash);
  if (!m) return { name: "list" };
  try {
    return { name: "session", id: decodeURIComponent(m[1]) };
  } catch {
    return { name: "list" };
  }
};

const readToken = () => {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
};

const app = {
  token: readToken(),
  conn: null,
  conn_state: "idle",
  conn_info: {},
  /** The latest ServerSnapshot. */
  server: null,
  /** Session metadata, from the server snapshot or a `list`. */
  sessions: [],
  /** Live status by session id (our `status` extension), when offered. */
  status: new Map(),
  statusOffered: true,
  /** Latest session snapshots seen, by id (for the list's model column). */
  latest: new Map(),
  error: null,
  route: parseRoute(),
  view: null,
  now: Date.now(),
  /** Where the next render moves the focus: "list" | "session" | null. */
  focus: null,
};

// Events repaint at most once a frame; what the user did repaints at once,
// so that the page answers the click that caused it before anything else.
let paintQueued = null;
const changed = () => {
  if (paintQueued !== null) return;
  paintQueued = setTimeout(() => {
    paintQueued = null;
    paint();
  }, 16);
};
const changedNow = () => {
  if (paintQueued !== null) clearTimeout(paintQueued);
  paintQueued = null;
  paint();
};

let errorSerial = 0;
const showError = (text) => {
  app.error = { text: clean(text), serial: ++errorSerial };
  changed();
};

const isOpen = () => app.conn_state === "open";

/** The request failed because the connection went (it may have run). */
const lostConnection = (e) => e?.code === "disconnected" || e?.code === "closed";

const call = (command, params) => {
  if (!app.conn) {
    const e = new Error("Not connected to the server");
    e.code = "disconnected";
    return Promise.reject(e);
  }
  return app.conn.request(command, params);
};

// ---- connection -----------------------------------------------------------

/** Ends a connection this page no longer uses (its callbacks are ignored
 * from now on anyway). */
const closeConn = (conn) => {
  if (!conn) return;
  try {
    (conn.close ?? conn.stop)?.call(conn);
  } catch {
    // already gone
  }
};

/** The kernel's client policy (`ClientLimits`), as the server serves it:
 * the page reconnects as every Rust client does. Read once; without it the
 * connection's defaults are the same numbers. */
let clientLimits = null;
const readClientLimits = async () => {
  if (clientLimits) return clientLimits;
  try {
    const response = await fetch("/client-limits.json", { cache: "no-cache" });
    if (response.ok) clientLimits = await response.json();
  } catch {
    // the defaults then
  }
  return clientLimits;
};

const connect = async () => {
  const old = app.conn;
  app.conn = null;
  closeConn(old);
  const limits = await readClientLimits();
  const url = `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`;
  let conn;
  conn = new PiConnection({
    url,
    token: app.token ? app.token : undefined,
    clientName: "web",
    ...(limits
      ? {
          reconnect: {
            initialMs: limits.reconnectBackoffInitialMs,
            maxMs: limits.reconnectBackoffMaxMs,
            windowMs: limits.reconnectWindowMs,
          },
          handshakeTimeoutMs: limits.handshakeTimeoutMs,
        }
      : {}),
    onEvent: (ev) => {
      if (app.conn === conn) onEvent(ev);
    },
    onState: (a, b) => {
      if (app.conn === conn) onState(a, b);
    },
  });
  app.conn = conn;
  app.conn_state = "connecting";
  app.conn_info = {};
  conn.start();
  changed();
};

const onState = (a, b) => {
  const info = typeof a === "string" ? { ...(b ?? {}), state: a } : { ...(a ?? {}) };
  const state = info.state ?? info.type ?? "closed";
  app.conn_state = state;
  app.conn_info = info;
  const st = app.view;
  switch (state) {
    case "open": {
      const snapshot = info.hello?.snapshot;
      if (snapshot) takeServerSnapshot(snapshot, true);
      if (app.error?.auth) app.error = null;
      if (st) {
        if (info.reconnected) gap(st);
        st.attached = false;
        attachView(st);
      }
      refreshList();
      break;
    }
    case "reconnecting":
      if (st) gap(st);
      break;
    case "failed":
      if (st) gap(st);
      if (info.code === "auth") {
        try {
          sessionStorage.removeItem(TOKEN_KEY);
        } catch {
          // storage unavailable
        }
        app.token = null;
        app.conn = null;
        app.error = { text: `The server refused the token: ${clean(info.message || "wrong token")}`, serial: ++errorSerial, auth: true };
      } else {
        showError(`Cannot connect to the server: ${clean(info.message || info.code || "unknown error")}`);
      }
      break;
    case "closed":
      if (st) gap(st);
      break;
    default:
  }
  changed();
};

const takeServerSnapshot = (snapshot, force) => {
  if (!force && app.server && snapshot.revision < app.server.revision) return;
  app.server = snapshot;
  app.sessions = snapshot.sessions ?? [];
};

const onEvent = (ev) => {
  switch (ev?.type) {
    case "server_snapshot":
      takeServerSnapshot(ev.snapshot, false);
      scheduleStatus();
      break;
    case "session_snapshot": {
      const s = ev.snapshot;
      const seen = app.latest.get(s.id);
      if (!seen || seen.revision <= s.revision) app.latest.set(s.id, s);
      const st = app.view;
      if (st && st.id === s.id && st.snap) applySnapshot(st, s);
      break;
    }
    case "session_progress": {
      const st = app.view;
      if (st && st.id === ev.sessionId) applyProgress(st, ev.progress);
      break;
    }
    case "session_removed": {
      const id = ev.sessionId;
      app.latest.delete(id);
      app.status.delete(id);
      app.sessions = app.sessions.filter((s) => s.id !== id);
      if (app.view?.id === id) {
        app.view.removed = true;
        app.view.attached = false;
        showError("This session was removed.");
      }
      break;
    }
    default:
  }
  changed();
};

// ---- list -----------------------------------------------------------------

let statusTimer = null;
const scheduleStatus = () => {
  if (statusTimer) return;
  statusTimer = setTimeout(() => {
    statusTimer = null;
    refreshStatus();
  }, 150);
};

const refreshStatus = async () => {
  if (!app.statusOffered || !isOpen()) return;
  try {
    const r = await call("status", {});
    app.status = new Map((r.sessions ?? []).map((s) => [s.sessionId, s]));
  } catch (e) {
    if (lostConnection(e)) return;
    // Not every server offers it: say so once, then show stored facts only.
    app.statusOffered = false;
    showError(`The live status of sessions is unavailable: ${errorText(e)}`);
  }
  changed();
};

let listing = false;
const refreshList = async () => {
  if (!isOpen() || app.route.name !== "list" || listing) return;
  listing = true;
  try {
    const r = await call("list", {});
    app.sessions = r.sessions ?? [];
  } catch (e) {
    if (!lostConnection(e)) showError(`Cannot list the sessions: ${errorText(e)}`);
  } finally {
    listing = false;
  }
  await refreshStatus();
  changed();
};

setInterval(() => {
  app.now = Date.now();
  if (app.route.name === "list") refreshList();
  changed();
}, LIST_POLL_MS);

const createSession = async ({ cwd, name, model }) => {
  const params = {};
  if (cwd.trim()) params.cwd = cwd.trim();
  if (name.trim()) params.name = name.trim();
  const meta = (app.server?.models ?? []).find((m) => modelKey(m) === model);
  if (meta) params.model = { provider: meta.provider, id: meta.id };
  const r = await call("create", params);
  const s = r.session;
  leaveView();
  const st = newSession(s.id);
  st.attached = true;
  applySnapshot(st, s, true);
  const later = app.latest.get(s.id);
  if (later && later.revision > s.revision) applySnapshot(st, later);
  app.latest.set(s.id, st.snap);
  app.view = st;
  app.route = { name: "session", id: s.id };
  app.focus = "session";
  stickToBottom = true;
  location.hash = `#/s/${encodeURIComponent(s.id)}`;
  changed();
};

const removeSession = async (id) => {
  await call("remove", { sessionId: id });
  app.sessions = app.sessions.filter((s) => s.id !== id);
  app.status.delete(id);
  app.latest.delete(id);
  changed();
};

// ---- the session view -----------------------------------------------------

const attachView = async (st) => {
  if (!isOpen() || st.attached || st.attaching || st.removed) return;
  st.attaching = true;
  // Only a snapshot that arrives while the attach is answered may be newer
  // than its answer.
  app.latest.delete(st.id);
  changed();
  try {
    const r = await call("attach", { sessionId: st.id });
    if (app.view !== st) {
      // Left while it attached.
      call("detach", { sessionId: st.id }).catch(() => {});
      return;
    }
    st.failed = null;
    st.attached = true;
    applySnapshot(st, r.session, true);
    const later = app.latest.get(st.id);
    if (later && later.revision > st.snap.revision) applySnapshot(st, later);
    app.latest.set(st.id, st.snap);
  } catch (e) {
    if (lostConnection(e)) return; // re-attached when the connection is back
    st.failed = e;
    showError(`Cannot open the session: ${errorText(e)}`);
  } finally {
    st.attaching = false;
    changed();
  }
};

const leaveView = () => {
  const st = app.view;
  if (!st) return;
  app.view = null;
  if (st.attached && isOpen()) {
    call("detach", { sessionId: st.id }).catch((e) => {
      if (!lostConnection(e)) showError(`Cannot detach from the session: ${errorText(e)}`);
    });
  }
};

const onRoute = () => {
  const route = parseRoute();
  app.route = route;
  if (route.name === "session") {
    if (app.view?.id !== route.id) {
      leaveView();
      app.view = newSession(route.id);
      app.focus = "session";
      stickToBottom = true;
    }
    attachView(app.view);
  } else {
    if (app.view) app.focus = "list";
    leaveView();
    refreshList();
  }
  changed();
};

window.addEventListener("hashchange", onRoute);

const busyOf = (st) => st.prompting > 0 || (st.snap && st.snap.phase !== "idle");

const submit = async (st) => {
  const text = st.draft;
  if (!text.trim()) return;
  if (!isOpen() || !st.attached) {
    showError("Not sent: the page is not connected to the session. Your message is kept; send it again once it is back.");
    return;
  }
  const kind = busyOf(st) ? "steer" : "prompt";
  const mine = { text, seen: false };
  st.own.push(mine);
  st.draft = "";
  if (kind === "prompt") st.prompting += 1;
  changedNow();
  let keep = false;
  try {
    const r = await call(kind, { sessionId: st.id, text });
    if (r?.session) applySnapshot(st, r.session);
  } catch (e) {
    const lost = lostConnection(e);
    if (mine.seen && lost) {
      showError("The connection dropped while the turn ran. The turn goes on on the server; its reply shows here when the page is back.");
    } else if (mine.seen) {
      showError(`${kind === "prompt" ? "The prompt" : "The steer"} failed: ${errorText(e)}`);
    } else {
      st.draft = st.draft ? `${text}\n${st.draft}` : text;
      showError(
        lost
          ? "The connection dropped before the server confirmed your message. It is back in the input: check the transcript before sending it again."
          : `${kind === "prompt" ? "Prompt" : "Steer"} not accepted: ${errorText(e)}. Your message is back in the input.`,
      );
    }
    // A message that may still have reached the server stays expected, so
    // that it is not labelled as another client's when it shows up.
    keep = lost && !mine.seen;
  } finally {
    if (kind === "prompt") st.prompting -= 1;
    if (!keep) st.own = st.own.filter((o) => o !== mine);
    changed();
  }
};

const abort = async (st) => {
  try {
    const r = await call("abort", { sessionId: st.id });
    const s = r?.session;
    if (s) {
      // Steers the model never saw come back with the abort: ours go back
      // into the input.
      const withdrawn = (s.queuedSteer ?? []).filter((u) => st.origin.get(u.id) === "own").map((u) => textOf(u.content));
      applySnapshot(st, s);
      if (withdrawn.length) {
        const back = withdrawn.join("\n");
        st.draft = st.draft ? `${back}\n${st.draft}` : back;
        st.info = `The model had not seen your steer${withdrawn.length === 1 ? "" : "s"}: back in the input.`;
      }
    }
  } catch (e) {
    showError(`Cannot abort: ${errorText(e)}`);
  }
  changed();
};

const setModel = async (st, key) => {
  const meta = (app.server?.models ?? []).find((m) => modelKey(m) === key);
  if (!meta || key === modelKey(st.snap?.model)) return;
  st.pendingModel = key;
  changedNow();
  try {
    const r = await call("set_model", { sessionId: st.id, model: { provider: meta.provider, id: meta.id } });
    if (r?.session) applySnapshot(st, r.session);
  } catch (e) {
    showError(`Cannot change the model: ${errorText(e)}`);
  } finally {
    st.pendingModel = null;
    changed();
  }
};

const setThinking = async (st, level) => {
  if (!level || level === st.snap?.thinkingLevel) return;
  st.pendingThinking = level;
  changedNow();
  try {
    const r = await call("set_thinking", { sessionId: st.id, thinkingLevel: level });
    if (r?.session) applySnapshot(st, r.session);
  } catch (e) {
    showError(`Cannot change the thinking level: ${errorText(e)}`);
  } finally {
    st.pendingThinking = null;
    changed();
  }
};

// ---------------------------------------------------------------------------
// Components

const Markdown = ({ text }) => {
  const out = useMemo(() => renderMarkdown(text), [text]);
  return html`<div class="md" dangerouslySetInnerHTML=${{ __html: out }}></div>`;
};

const Image = ({ part, alt }) => {
  const mime = String(part.mimeType ?? "");
  if (!/^image\/[a-z0-9.+-]+$/i.test(mime) || typeof part.data !== "string") return html`<p class="notice">[image]</p>`;
  return html`<img src=${`data:${mime};base64,${part.data}`} alt=${alt} />`;
};

const Badge = ({ value, testid }) => html`<span class=${`badge ${value}`} data-testid=${testid}>${value}</span>`;

const UserItem = ({ item, origin, queued }) => {
  const who = origin === "own" ? "You" : origin === "other" ? "Another client" : "User";
  return html`<li class=${`item user${queued ? " queued" : ""}${origin === "other" ? " other" : ""}`} data-testid="item-user">
    <div class="who">
      <strong>${who}</strong>
      ${origin === "other" ? html`<span>sent from another client</span>` : null}
      ${queued ? html`<span>steer, queued: the model has not taken it yet</span>` : null}
    </div>
    ${(item.content ?? []).map((part, i) =>
      part.type === "image"
        ? html`<${Image} key=${i} part=${part} alt="Image attached to the message" />`
        : html`<div key=${i} class="text">${clean(part.text)}</div>`,
    )}
  </li>`;
};

const Gap = () => html`<p class="gap">… (text streamed before this page joined; shown whole when the reply ends)</p>`;

const AssistantItem = ({ item, tails }) => {
  const model = clean(item.responseModel || modelKey(item.model));
  const content = item.content ?? [];
  const streaming = item.status === "streaming";
  const indices = Math.max(content.length, tails ? Math.max(-1, ...tails.keys()) + 1 : 0);
  const parts = [];
  for (let i = 0; i < indices; i++) {
    const part = content[i];
    const tail = tails?.get(i);
    if (part?.type === "thinking" || (!part && tail?.kind === "thinking")) {
      const text = clean(part?.thinking ?? "");
      parts.push(html`<details key=${i} class="thinking" data-testid="item-thinking">
        <summary>Thinking${part?.redacted ? " (redacted)" : ""}</summary>
        <div class="thinking-text">${text}${tail ? `\n…\n${clean(tail.text)}` : ""}</div>
      </details>`);
    } else if (part?.type === "toolCall") {
      parts.push(html`<p key=${i} class="call">→ ${streaming ? `calling ${clean(part.toolName)}…` : `calls ${toolTitle(part.toolName, part.input)}`}</p>`);
    } else if (part?.type === "image") {
      parts.push(html`<${Image} key=${i} part=${part} alt="Image in the reply" />`);
    } else {
      parts.push(html`<div key=${i}>
        ${part?.type === "text" ? html`<${Markdown} text=${part.text} />` : null}
        ${tail ? html`<${Gap} /><${Markdown} text=${tail.text} />` : null}
      </div>`);
    }
  }
  // A notice of the session (an MCP server that failed, say): no reply.
  if (item.status === "error" && item.model?.provider === "pi-server" && item.model?.id === "notice") {
    return html`<li class="item notice" data-testid="item-notice"><p class="notice">⚠ ${clean(item.errorMessage || "")}</p></li>`;
  }
  let problem = null;
  if (item.status === "error") problem = `✗ The model reported an error: ${clean(item.errorMessage || "no message")}`;
  else if (item.status === "aborted") problem = `■ Turn aborted${item.errorMessage && item.errorMessage !== "Aborted" ? `: ${clean(item.errorMessage)}` : ""}`;
  else if (item.stopReason === "length") problem = "The reply was cut at the output token limit.";
  return html`<li class=${`item assistant status-${item.status}`} data-testid="item-assistant" data-status=${item.status}>
    <div class="who"><strong>Assistant</strong><span>${model}</span><${Badge} value=${item.status} /></div>
    ${parts}
    ${streaming && content.length === 0 && !tails ? html`<p class="notice">…</p>` : null}
    ${problem ? html`<p class="problem">${problem}</p>` : null}
  </li>`;
};

const ToolItem = ({ item }) => {
  const title = toolTitle(item.toolName, item.input);
  const input = useMemo(() => prettyJson(item.input), [item.input]);
  const output = clean(textOf(item.content));
  const images = (item.content ?? []).filter((c) => c.type === "image");
  return html`<li class=${`item tool status-${item.status}`} data-testid="item-tool" data-status=${item.status}>
    <div class="who"><strong>Tool</strong><span class="call">${title}</span><${Badge} value=${item.status} /></div>
    <details>
      <summary>Input</summary>
      <pre tabindex="0" aria-label=${`Input of ${title}`}>${input}</pre>
    </details>
    ${output
      ? html`<p class="caption">Output</p><pre tabindex="0" aria-label=${`Output of ${title}`}>${output}</pre>`
      : html`<p class="notice">${item.status === "running" ? "running…" : "no output"}</p>`}
    ${images.map((part, i) => html`<${Image} key=${i} part=${part} alt=${`Image output of ${title}`} />`)}
  </li>`;
};

const TokenForm = () => {
  const [value, setValue] = useState("");
  const ref = useRef(null);
  useEffect(() => ref.current?.focus(), []);
  const onSubmit = (e) => {
    e.preventDefault();
    app.token = value;
    try {
      sessionStorage.setItem(TOKEN_KEY, value);
    } catch {
      // storage unavailable: kept for this page only
    }
    app.error = null;
    connect();
  };
  return html`<form class="token-form" onSubmit=${onSubmit} aria-labelledby="token-title">
    <h2 id="token-title">Connect to pi-server</h2>
    <input type="text" autocomplete="username" value="pi-server" hidden readonly />
    <div class="field">
      <label for="token-input">Token</label>
      <input
        id="token-input"
        ref=${ref}
        data-testid="token-input"
        type="password"
        autocomplete="current-password"
        aria-describedby="token-hint"
        value=${value}
        onInput=${(e) => setValue(e.currentTarget.value)}
      />
      <span id="token-hint" class="hint">The server's token (its --token-file). It is kept in this tab only, until the tab closes.</span>
    </div>
    <div><button type="submit" class="primary" data-testid="token-submit">Connect</button></div>
  </form>`;
};

const SessionRow = ({ meta, status, model, now }) => {
  const [confirming, setConfirming] = useState(false);
  const [removing, setRemoving] = useState(false);
  const cancelRef = useRef(null);
  const removeRef = useRef(null);
  const refocus = useRef(false);
  // Unnamed: its first prompt, as the server previews it (our `status`).
  const name = clean(meta.sessionName || (status?.preview ? `“${status.preview}”` : "Untitled session"));
  const state = status?.state ?? "stored";
  useLayoutEffect(() => {
    if (confirming) cancelRef.current?.focus();
  }, [confirming]);
  const cancel = () => {
    refocus.current = true;
    setConfirming(false);
  };
  useLayoutEffect(() => {
    if (!confirming && refocus.current) {
      refocus.current = false;
      removeRef.current?.focus();
    }
  }, [confirming]);
  const confirm = async () => {
    setRemoving(true);
    try {
      await removeSession(meta.id);
    } catch (e) {
      showError(`Cannot remove ${name}: ${errorText(e)}`);
      setRemoving(false);
      setConfirming(false);
    }
  };
  return html`<li class="row" data-testid="session-row" data-session-id=${meta.id}>
    <div class="title"><a href=${`#/s/${encodeURIComponent(meta.id)}`}>${name}</a></div>
    <${Badge} value=${state} />
    <ul class="facts">
      ${meta.cwd ? html`<li>in <code>${clean(meta.cwd)}</code></li>` : null}
      ${model ? html`<li>model ${clean(model)}</li>` : null}
      <li>last activity <time datetime=${isoTime(meta.updatedAt ?? meta.createdAt)}>${ago(meta.updatedAt ?? meta.createdAt, now)}</time></li>
      ${status ? html`<li>${status.clients} ${status.clients === 1 ? "client" : "clients"} attached</li>` : null}
      <li>id <code>${clean(meta.id.slice(0, 8))}</code></li>
    </ul>
    ${confirming
      ? html`<div key="confirm" class="confirm" role="group" aria-label=${`Remove ${name}?`} onKeyDown=${(e) => e.key === "Escape" && cancel()}>
          <p>Remove “${name}” and its transcript? This cannot be undone.</p>
          <button type="button" class="danger" data-testid="confirm-remove" disabled=${removing} onClick=${confirm}>
            ${removing ? "Removing…" : "Remove"}
          </button>
          <button type="button" ref=${cancelRef} disabled=${removing} onClick=${cancel}>Cancel</button>
        </div>`
      : html`<div key="actions" class="actions">
          <button type="button" ref=${removeRef} data-testid="remove-button" aria-label=${`Remove ${name}`} onClick=${() => setConfirming(true)}>Remove</button>
        </div>`}
  </li>`;
};

const CreateForm = () => {
  const [cwd, setCwd] = useState("");
  const [name, setName] = useState("");
  const [model, setModelKey] = useState("");
  const [busy, setBusy] = useState(false);
  const models = app.server?.models ?? [];
  const onSubmit = async (e) => {
    e.preventDefault();
    if (busy) return;
    setBusy(true);
    try {
      await createSession({ cwd, name, model });
      setCwd("");
      setName("");
    } catch (err) {
      showError(`Cannot create the session: ${errorText(err)}`);
    } finally {
      setBusy(false);
    }
  };
  return html`<section class="create" aria-labelledby="create-title">
    <h2 id="create-title">New session</h2>
    <form onSubmit=${onSubmit}>
      <div class="field">
        <label for="create-cwd">Working directory</label>
        <input id="create-cwd" data-testid="create-cwd" value=${cwd} onInput=${(e) => setCwd(e.currentTarget.value)}
          placeholder="/path/to/project" autocomplete="off" spellcheck="false" aria-describedby="create-cwd-hint" />
        <span id="create-cwd-hint" class="hint">On the server's machine; empty for its default.</span>
      </div>
      <div class="field">
        <label for="create-name">Name <span class="hint">(optional)</span></label>
        <input id="create-name" data-testid="create-name" value=${name} onInput=${(e) => setName(e.currentTarget.value)} autocomplete="off" />
      </div>
      <div class="field">
        <label for="create-model">Model <span class="hint">(optional)</span></label>
        <select id="create-model" data-testid="create-model" value=${model} onChange=${(e) => setModelKey(e.currentTarget.value)}>
          <option value="">Server default</option>
          ${models.map((m) => html`<option key=${modelKey(m)} value=${modelKey(m)}>${modelLabel(m)}</option>`)}
        </select>
      </div>
      <div class="submit"><button type="submit" class="primary" data-testid="create-submit" disabled=${busy || !isOpen()}>
        ${busy ? "Creating…" : "Create session"}
      </button></div>
    </form>
  </section>`;
};

const modelLabel = (m) => clean(`${m.name} (${m.provider})${m.authenticated === false ? " — no key" : ""}`);

const ListView = () => {
  const headRef = useRef(null);
  useEffect(() => {
    if (app.focus === "list") {
      app.focus = null;
      headRef.current?.focus();
    }
  });
  const rows = [...app.sessions].sort((a, b) => (b.updatedAt ?? b.createdAt ?? 0) - (a.updatedAt ?? a.createdAt ?? 0));
  return html`<div class="list-view">
    <section class="sessions" data-testid="session-list" aria-labelledby="sessions-title">
      <h2 id="sessions-title" tabindex="-1" ref=${headRef}>Sessions</h2>
      ${rows.length === 0
        ? html`<p class="empty">No sessions yet. Create one below.</p>`
        : html`<ul class="rows">
            ${rows.map((meta) => {
              const snap = app.latest.get(meta.id);
              return html`<${SessionRow}
                key=${meta.id}
                meta=${meta}
                status=${app.status.get(meta.id)}
                model=${snap ? modelKey(snap.model) : null}
                now=${app.now}
              />`;
            })}
          </ul>`}
    </section>
    <${CreateForm} />
  </div>`;
};

/** Keeps the page at the bottom while the reader is there. */
let stickToBottom = true;
window.addEventListener(
  "scroll",
  () => {
    const doc = document.documentElement;
    stickToBottom = window.innerHeight + window.scrollY >= doc.scrollHeight - 96;
  },
  { passive: true },
);

const Composer = ({ st, busy }) => {
  const onKeyDown = (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.altKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      submit(st);
    }
  };
  const onSubmit = (e) => {
    e.preventDefault();
    submit(st);
  };
  const steer = busy;
  return html`<form class="composer" onSubmit=${onSubmit} aria-label="Message">
    <label for="prompt-input" class="sr-only">${steer ? "Steering message" : "Message"}</label>
    <textarea
      id="prompt-input"
      data-testid="prompt-input"
      rows="3"
      value=${st.draft}
      aria-describedby="prompt-hint"
      disabled=${st.removed}
      onInput=${(e) => {
        st.draft = e.currentTarget.value;
      }}
      onKeyDown=${onKeyDown}
      placeholder=${steer ? "Steer the running turn…" : "Ask the agent…"}
    ></textarea>
    <div class="buttons">
      <button type="submit" class="primary" data-testid="send" disabled=${st.removed}>${steer ? "Steer" : "Send"}</button>
      ${busy ? html`<button type="button" class="danger" data-testid="abort" onClick=${() => abort(st)}>Abort</button>` : null}
      <span id="prompt-hint" class="hint">Enter ${steer ? "steers" : "sends"}, Shift+Enter adds a line</span>
    </div>
  </form>`;
};

const SessionView = ({ st }) => {
  const headRef = useRef(null);
  useEffect(() => {
    if (app.focus === "session" && headRef.current) {
      app.focus = null;
      headRef.current.focus({ preventScroll: true });
    }
  });
  useLayoutEffect(() => {
    if (stickToBottom) window.scrollTo(0, document.documentElement.scrollHeight);
  });
  const s = st.snap;
  const title = clean(s?.name || app.sessions.find((m) => m.id === st.id)?.sessionName || "Untitled session");
  const back = html`<a href="#/" data-testid="back">← All sessions</a>`;
  if (!s) {
    return html`<section class="session" aria-labelledby="session-title">
      <div class="session-head">
        <div class="nav">${back}</div>
        <h2 id="session-title" tabindex="-1" ref=${headRef}>${title}</h2>
        <p class="notice">
          ${st.failed ? `This session cannot be opened: ${errorText(st.failed)}` : st.removed ? "This session was removed." : isOpen() ? "Opening the session…" : "Waiting for the server…"}
        </p>
        ${st.failed && isOpen()
          ? html`<button type="button" onClick=${() => { st.failed = null; attachView(st); }}>Try again</button>`
          : null}
      </div>
    </section>`;
  }
  const items = shownItems(st);
  const { tokens, cost } = usageTotal(items);
  const busy = busyOf(st);
  // Our prompt's request is answered when its turn ends: until then the
  // turn is ours, even before a snapshot says so.
  const phase = s.phase === "idle" && st.prompting > 0 ? "turn" : s.phase;
  const models = app.server?.models ?? [];
  const current = modelKey(s.model);
  const modelValue = st.pendingModel ?? current;
  const meta = models.find((m) => modelKey(m) === current);
  const levels = [...(meta?.supportedThinkingLevels ?? [])];
  if (!levels.includes(s.thinkingLevel)) levels.unshift(s.thinkingLevel);
  const thinkingValue = st.pendingThinking ?? s.thinkingLevel;
  const configurable = isOpen() && st.attached && !busy && !st.pendingModel && !st.pendingThinking && !st.removed;
  const queued = s.queuedSteer ?? [];
  return html`<section class="session" aria-labelledby="session-title">
    <div class="session-head">
      <div class="nav">
        ${back}
        <span>Phase <${Badge} value=${phase} testid="phase" /></span>
      </div>
      <h2 id="session-title" tabindex="-1" ref=${headRef}>${title}</h2>
      <p class="where">${clean(s.cwd)}</p>
      <div class="facts">
        <div class="field">
          <label for="model-picker">Model</label>
          <select id="model-picker" data-testid="model-picker" value=${modelValue} disabled=${!configurable}
            onChange=${(e) => setModel(st, e.currentTarget.value)}>
            ${models.some((m) => modelKey(m) === current) ? null : html`<option value=${current}>${clean(current)}</option>`}
            ${models.map((m) => html`<option key=${modelKey(m)} value=${modelKey(m)} selected=${modelKey(m) === modelValue}>${modelLabel(m)}</option>`)}
          </select>
        </div>
        <div class="field">
          <label for="thinking-picker">Thinking</label>
          <select id="thinking-picker" data-testid="thinking-picker" value=${thinkingValue} disabled=${!configurable || levels.length < 2}
            onChange=${(e) => setThinking(st, e.currentTarget.value)}>
            ${levels.map((l) => html`<option key=${l} value=${l} selected=${l === thinkingValue}>${l}</option>`)}
          </select>
        </div>
        <div class="stat">
          <span class="name" id="usage-label">Usage</span>
          <span data-testid="usage-total">
            ${tokens.toLocaleString("en")} tokens · $${cost.toFixed(4)}
          </span>
        </div>
      </div>
      ${st.info ? html`<p class="notice" role="status">${st.info} <button type="button" class="link" onClick=${() => { st.info = null; changed(); }}>Dismiss</button></p>` : null}
    </div>
    <ol class="transcript" data-testid="transcript" aria-live="polite" aria-label="Transcript">
      ${items.length === 0 && queued.length === 0 ? html`<li class="notice">Nothing yet. Send a message to start.</li>` : null}
      ${items.map((item) => {
        if (item.role === "user") return html`<${UserItem} key=${item.id} item=${item} origin=${st.origin.get(item.id)} />`;
        if (item.role === "assistant") return html`<${AssistantItem} key=${item.id} item=${item} tails=${st.anchored.has(item.id) ? null : st.tails.get(item.id)} />`;
        if (item.role === "tool") return html`<${ToolItem} key=${item.id} item=${item} />`;
        return null;
      })}
      ${queued.map((item) => html`<${UserItem} key=${`queued-${item.id}`} item=${item} origin=${st.origin.get(item.id)} queued=${true} />`)}
    </ol>
    <${Composer} st=${st} busy=${busy} />
  </section>`;
};

const Banner = () => {
  const { conn_state: state, conn_info: info } = app;
  let text = "";
  let retry = false;
  if (state === "connecting" && app.server) text = "Connecting to the server…";
  else if (state === "connecting") text = "Connecting…";
  else if (state === "reconnecting") {
    const secs = typeof info.inMs === "number" ? Math.max(0, Math.round(info.inMs / 1000)) : null;
    text = `Connection lost; reconnecting…${info.attempt ? ` (attempt ${info.attempt}${secs !== null ? `, next try in ${secs} s` : ""})` : ""}`;
  } else if (state === "failed" && info.code !== "auth") {
    text = `Not connected: ${clean(info.message || info.code || "the connection failed")}.`;
    retry = true;
  } else if (state === "closed" && app.token !== null) {
    text = "Disconnected from the server.";
    retry = true;
  }
  return html`<div class="banner" data-testid="conn-banner" role="status" aria-live="polite">${text
    ? html`${text}${retry ? html`<button type="button" onClick=${connect}>Reconnect</button>` : null}`
    : null}</div>`;
};

const ErrorRegion = () => {
  const e = app.error;
  if (!e) return null;
  return html`<div class="error-region" data-testid="error" role="alert">
    <p>${e.text}</p>
    <button type="button" class="link" onClick=${() => { app.error = null; changed(); }}>Dismiss</button>
  </div>`;
};

const forgetToken = () => {
  try {
    sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // storage unavailable
  }
  app.token = null;
  const old = app.conn;
  app.conn = null;
  app.conn_state = "closed";
  closeConn(old);
  if (app.view) gap(app.view);
  changed();
};

const App = () => {
  let body;
  if (app.token === null) body = html`<${TokenForm} />`;
  else if (!app.server) body = html`<p class="notice">Connecting to the server…</p>`;
  else if (app.route.name === "session" && app.view) body = html`<${SessionView} key=${app.view.id} st=${app.view} />`;
  else body = html`<${ListView} />`;
  const state = app.conn_state === "open" ? "connected" : app.conn_state;
  return html`
    <a class="skip" href="#main">Skip to content</a>
    <header class="topbar">
      <h1>pi-server</h1>
      ${app.token !== null
        ? html`<span class="conn">${state}</span><button type="button" class="link" onClick=${forgetToken}>Forget token</button>`
        : null}
    </header>
    <${Banner} />
    <${ErrorRegion} />
    <main id="main">${body}</main>
  `;
};

const root = document.getElementById("app");
const paint = () => render(html`<${App} />`, root);

// The "Skip to content" link must not change the route.
document.addEventListener("click", (e) => {
  const a = e.target.closest?.('a[href="#main"]');
  if (a) {
    e.preventDefault();
    const main = document.getElementById("main");
    main.setAttribute("tabindex", "-1");
    main.focus();
  }
});

root.textContent = "";
paint();
if (app.token !== null) connect();
onRoute();
