// The pi-server web client: a session list and one session's live view,
// over pi protocol v8 on a WebSocket (`./v8.js`: the published pi-client
// and chord, bundled once under ./vendor/). Plain ES modules, no build step
// of the page itself; Preact, htm and marked are vendored under ./vendor/.
//
// What the page shows follows the terminal client (io/front/src/tui):
//
// - Everything shown is replicated state: the list is our
//   `pi-server.session-status`, a session is its `pi.transcript` and
//   `pi.models` replicas (`./view.js`). The published client applies the
//   server's ops; the page only redraws. A turn costs what it adds, and a
//   page that joins mid-reply, reloads or reconnects gets the state whole
//   at subscription (the reply so far included), then streams on: nothing
//   is shown twice and there is no gap to mend.
// - A user message is labelled as another client's when it arrives live and
//   is not a text this page sent (the protocol does not record the sender;
//   history is not labelled), as the terminal client does.
// - A steer of ours shows as queued until the model takes it; an abort
//   withdraws the ones it never took, and they go back into the input.
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
import { PageConnection, Services, codeOf, ctx } from "./v8.js";
import { sessionOf, userText } from "./view.js";

const html = htm.bind(h);

const TOKEN_KEY = "pi-token";
/** How often the list's "last activity" times are redrawn. */
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

/** A fresh view state of session `id` (nothing seen yet). */
const newSession = (id) => ({
  id,
  /** The session's bound services while attached: its replicas. */
  bound: null,
  /** What is drawn, made from the replicas ({@link sessionOf}). */
  shown: null,
  /** User item id -> "own" | "other" | "history". */
  origin: new Map(),
  /** Texts this page sent, not yet seen in the transcript: {text, steer}. */
  own: [],
  attached: false,
  attaching: false,
  /** Our prompts not yet settled (their turns are ours). */
  prompting: 0,
  pendingModel: null,
  pendingThinking: null,
  draft: "",
  /** Images to go with the next prompt: {name, mimeType, data (base64)}. */
  images: [],
  /** The session could not be opened: the error. */
  failed: null,
  removed: false,
  info: null,
});

const app = {
  token: readToken(),
  /** The v8 connection ({@link PageConnection}). */
  conn: null,
  conn_state: "idle",
  conn_info: {},
  /** The server's id and the kernel's client policy (`/client.json`). */
  client: null,
  /** A connection has been open: the status below is the server's. */
  ready: false,
  /** Every session's status (our `pi-server.session-status`, replicated), by id. */
  status: new Map(),
  /** The models the server offers (our `pi-server.sessions.models`). */
  models: [],
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
const lostConnection = (e) => ["disconnected", "closed", "timeout"].includes(codeOf(e));

/** A server-scope service, or the error a call would fail with. */
const service = (s) => app.conn.use(s);

// ---- connection -----------------------------------------------------------

/** The server's id and the kernel's client policy, read once. */
const readClient = async () => {
  if (app.client) return app.client;
  const response = await fetch("/client.json", { cache: "no-cache" });
  if (!response.ok) throw new Error(`/client.json: ${response.status}`);
  app.client = await response.json();
  return app.client;
};

const connect = async () => {
  const old = app.conn;
  app.conn = null;
  old?.close();
  app.conn_state = "connecting";
  app.conn_info = {};
  changed();
  let client;
  try {
    client = await readClient();
  } catch (e) {
    app.conn_state = "failed";
    app.conn_info = { code: "disconnected", message: `Cannot reach the server: ${errorText(e)}` };
    changed();
    return;
  }
  const url = `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`;
  const conn = new PageConnection({
    url,
    token: app.token || null,
    serverId: client.serverId,
    limits: client,
    onState: (state, detail) => {
      if (app.conn === conn) onState(state, detail ?? {});
    },
    onAttachment: (attachment) => {
      if (app.conn === conn) onAttachment(attachment);
    },
  });
  app.conn = conn;
  conn.start();
};

const onState = (state, info) => {
  app.conn_state = state;
  app.conn_info = info;
  const st = app.view;
  switch (state) {
    case "open":
      if (app.error?.auth) app.error = null;
      follow();
      if (st) {
        unbind(st);
        attachView(st);
      }
      break;
    case "reconnecting":
    case "closed":
      if (st) unbind(st);
      break;
    case "failed":
      if (st) unbind(st);
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
    default:
  }
  changed();
};

/** Follows the status service, and reads the models offered. */
const follow = () => {
  const status = service(Services.Status);
  const take = (value) => {
    app.status = new Map((value?.sessions ?? []).map((s) => [s.sessionId, s]));
    app.ready = true;
    // A session gone from the status while we show it was removed.
    const st = app.view;
    if (st && !st.removed && st.attached && !app.status.has(st.id)) removed(st);
    changed();
  };
  take(status.state.value);
  status.state.subscribe(take);
  service(Services.Sessions)
    .models(ctx)
    .then((models) => {
      app.models = models ?? [];
      changed();
    })
    .catch((e) => {
      if (!lostConnection(e)) showError(`Cannot list the models: ${errorText(e)}`);
    });
};

/** The connection's attachment changed: `null` while we still show the
 * session means it was taken from us: removed (gone from the status), or
 * its worker died, and then it is attached again (a new worker starts). */
const onAttachment = (attachment) => {
  const st = app.view;
  if (!attachment && st?.attached && !st.leaving) {
    unbind(st);
    if (!app.status.has(st.id)) removed(st);
    else attachView(st);
  }
  changed();
};

const removed = (st) => {
  st.removed = true;
  st.attached = false;
  showError("This session was removed.");
};

/** Metadata of a listed session, from its status. */
const metaOf = (s) => ({ id: s.sessionId, sessionName: s.name, cwd: s.cwd, createdAt: s.createdAt, updatedAt: s.updatedAt });

setInterval(() => {
  app.now = Date.now();
  changed();
}, LIST_POLL_MS);

const createSession = async ({ cwd, name, model }) => {
  const params = {};
  if (cwd.trim()) params.cwd = cwd.trim();
  if (name.trim()) params.name = name.trim();
  const meta = app.models.find((m) => modelKey(m) === model);
  if (meta) params.model = { provider: meta.provider, modelId: meta.id };
  const created = await service(Services.Sessions).create(params, ctx);
  location.hash = `#/s/${encodeURIComponent(created.sessionId)}`;
  app.focus = "session";
};

const removeSession = async (id) => {
  await service(Services.Management).remove(id, ctx);
  app.status.delete(id);
  changed();
};

// ---- the session view -----------------------------------------------------

/** Forgets the session's bindings (the connection went, or we left). */
const unbind = (st) => {
  const bound = st.bound;
  st.bound = null;
  st.attached = false;
  bound?.binding.dispose(ctx).catch(() => {});
};

/** Redraws the session from its replicas; labels new user items. */
const redraw = (st) => {
  if (!st.bound) return;
  const history = !st.shown;
  st.shown = sessionOf(st.bound.transcript.state.value, st.bound.models.state.value);
  for (const item of st.shown.items) {
    if (item.role !== "user" || st.origin.has(item.id)) continue;
    const text = userText(item);
    const mine = history ? -1 : st.own.findIndex((o) => o.text === text);
    if (mine >= 0) st.own.splice(mine, 1);
    st.origin.set(item.id, history ? "history" : mine >= 0 ? "own" : "other");
  }
  changed();
};

const attachView = async (st) => {
  if (!isOpen() || st.attached || st.attaching || st.removed) return;
  st.attaching = true;
  changed();
  try {
    await service(Services.Management).attach(st.id, ctx);
    if (app.view !== st) return; // left while it attached: the next attach or detach replaces it
    const bound = await app.conn.bindSession();
    if (app.view !== st) {
      bound.binding.dispose(ctx).catch(() => {});
      return;
    }
    st.bound = bound;
    st.failed = null;
    st.attached = true;
    bound.transcript.state.subscribe(() => st.bound === bound && redraw(st));
    bound.models.state.subscribe(() => st.bound === bound && redraw(st));
    redraw(st);
  } catch (e) {
    if (lostConnection(e)) return; // attached again when the connection is back
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
  st.leaving = true;
  const was = st.attached;
  unbind(st);
  if (was && isOpen()) {
    service(Services.Management)
      .detach(ctx)
      .catch((e) => {
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
  }
  changed();
};

window.addEventListener("hashchange", onRoute);

const busyOf = (st) => st.prompting > 0 || (st.shown && st.shown.phase !== "idle");

/** An answer in band (`accepted: false`) as an error. */
const refused = (r) => Object.assign(new Error(r?.error?.message || "refused"), { code: r?.error?.code });

const submit = async (st) => {
  const text = st.draft;
  if (!text.trim()) return;
  if (!isOpen() || !st.attached || !st.bound) {
    showError("Not sent: the page is not connected to the session. Your message is kept; send it again once it is back.");
    return;
  }
  const agent = st.bound.agent;
  const kind = busyOf(st) ? "steer" : "prompt";
  if (kind === "steer" && st.images.length) {
    showError("Images go with a prompt, not a steer: send them when the turn ends. Your message and images are kept.");
    return;
  }
  const images = st.images;
  const mine = { text, steer: kind === "steer" };
  st.own.push(mine);
  st.draft = "";
  st.images = [];
  if (kind === "prompt") st.prompting += 1;
  changedNow();
  let accepted = false;
  try {
    const request = {
      message: text,
      images: images.length ? images.map(({ data, mimeType }) => ({ type: "image", data, mimeType })) : null,
    };
    const r = kind === "prompt" ? await agent.prompt(request, ctx) : await agent.steer(request, ctx);
    if (!r?.accepted) throw refused(r);
    accepted = true;
    // The turn is ours until it settles, as a v1 prompt's answer was.
    if (kind === "prompt") await agent.waitForPrompt(r.operationId, ctx).catch(() => {});
  } catch (e) {
    const lost = lostConnection(e);
    if (accepted && lost) {
      showError("The connection dropped while the turn ran. The turn goes on on the server; its reply shows here when the page is back.");
    } else if (!accepted) {
      st.draft = st.draft ? `${text}\n${st.draft}` : text;
      st.images = images.concat(st.images);
      showError(
        lost
          ? "The connection dropped before the server confirmed your message. It is back in the input: check the transcript before sending it again."
          : `${kind === "prompt" ? "Prompt" : "Steer"} not accepted: ${errorText(e)}. Your message is back in the input.`,
      );
      // A message that may still have reached the server stays expected,
      // so that it is not labelled as another client's when it shows up.
      if (!lost) st.own = st.own.filter((o) => o !== mine);
    }
  } finally {
    if (kind === "prompt") st.prompting -= 1;
    changed();
  }
};

const abort = async (st) => {
  const bound = st.bound;
  if (!bound) return;
  try {
    await bound.agent.abort(ctx);
    // Steers the model never saw are withdrawn with the turn: ours go back
    // into the input once the turn has ended without them.
    await until(() => st.bound !== bound || st.shown?.phase === "idle");
    const withdrawn = st.own.filter((o) => o.steer);
    if (withdrawn.length && st.bound === bound) {
      st.own = st.own.filter((o) => !o.steer);
      const back = withdrawn.map((o) => o.text).join("\n");
      st.draft = st.draft ? `${back}\n${st.draft}` : back;
      st.info = `The model had not seen your steer${withdrawn.length === 1 ? "" : "s"}: back in the input.`;
    }
  } catch (e) {
    showError(`Cannot abort: ${errorText(e)}`);
  }
  changed();
};

/** The image types the server's models take, and how much one prompt may carry. */
const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const IMAGES_MAX_BYTES = 12 * 1024 * 1024;

/** Attaches image files (picked or pasted) to the next prompt. */
const attachImages = async (st, files) => {
  for (const file of files) {
    if (!IMAGE_TYPES.includes(file.type)) {
      showError(`${file.name || "That file"} is not an image the models take (PNG, JPEG, GIF or WebP).`);
      continue;
    }
    const total = st.images.reduce((n, i) => n + i.size, 0) + file.size;
    if (total > IMAGES_MAX_BYTES) {
      showError(`${file.name || "The image"} would make the prompt's images larger than ${IMAGES_MAX_BYTES / 1024 / 1024} MiB.`);
      continue;
    }
    const url = await new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result));
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
    st.images = [...st.images, { name: file.name || "pasted image", mimeType: file.type, size: file.size, data: url.slice(url.indexOf(",") + 1) }];
  }
  changed();
};

/** Resolves once `cond()` holds, checked at each redraw's pace. */
const until = (cond) =>
  new Promise((resolve) => {
    const check = () => (cond() ? resolve() : setTimeout(check, 50));
    check();
  });

const setModel = async (st, key) => {
  const meta = app.models.find((m) => modelKey(m) === key);
  if (!meta || !st.bound || key === modelKey(st.shown?.model)) return;
  st.pendingModel = key;
  changedNow();
  try {
    await st.bound.models.select({ provider: meta.provider, modelId: meta.id }, ctx);
  } catch (e) {
    showError(`Cannot change the model: ${errorText(e)}`);
  } finally {
    st.pendingModel = null;
    changed();
  }
};

const setThinking = async (st, level) => {
  if (!level || !st.bound || level === st.shown?.thinkingLevel) return;
  st.pendingThinking = level;
  changedNow();
  try {
    await st.bound.models.selectThinking(level, ctx);
  } catch (e) {
    showError(`Cannot change the thinking level: ${errorText(e)}`);
  } finally {
    st.pendingThinking = null;
    changed();
  }
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

const AssistantItem = ({ item }) => {
  const model = clean(item.responseModel || modelKey(item.model));
  const content = item.content ?? [];
  const streaming = item.status === "streaming";
  const parts = content.map((part, i) => {
    if (part?.type === "thinking") {
      return html`<details key=${i} class="thinking" data-testid="item-thinking">
        <summary>Thinking${part.redacted ? " (redacted)" : ""}</summary>
        <div class="thinking-text">${clean(part.thinking ?? "")}</div>
      </details>`;
    }
    if (part?.type === "toolCall") {
      return html`<p key=${i} class="call">→ ${streaming ? `calling ${clean(part.toolName)}…` : `calls ${toolTitle(part.toolName, part.input)}`}</p>`;
    }
    if (part?.type === "image") return html`<${Image} key=${i} part=${part} alt="Image in the reply" />`;
    return html`<div key=${i}>${part?.type === "text" ? html`<${Markdown} text=${part.text} />` : null}</div>`;
  });
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
    ${streaming && content.length === 0 ? html`<p class="notice">…</p>` : null}
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
  const models = app.models;
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
  const rows = [...app.status.values()].map(metaOf).sort((a, b) => (b.updatedAt ?? b.createdAt ?? 0) - (a.updatedAt ?? a.createdAt ?? 0));
  return html`<div class="list-view">
    <section class="sessions" data-testid="session-list" aria-labelledby="sessions-title">
      <h2 id="sessions-title" tabindex="-1" ref=${headRef}>Sessions</h2>
      ${rows.length === 0
        ? html`<p class="empty">No sessions yet. Create one below.</p>`
        : html`<ul class="rows">
            ${rows.map((meta) => {
              const status = app.status.get(meta.id);
              const model = status?.model ? `${status.model.provider}/${status.model.modelId}` : null;
              return html`<${SessionRow} key=${meta.id} meta=${meta} status=${status} model=${model} now=${app.now} />`;
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
  const fileRef = useRef(null);
  const onPaste = (e) => {
    const files = [...(e.clipboardData?.files ?? [])].filter((f) => f.type.startsWith("image/"));
    if (files.length) {
      e.preventDefault();
      attachImages(st, files);
    }
  };
  return html`<form class="composer" onSubmit=${onSubmit} aria-label="Message">
    ${st.images.length
      ? html`<ul class="attachments" data-testid="attachments" aria-label="Images for the next prompt">
          ${st.images.map(
            (image, i) => html`<li key=${i}>
              <${Image} part=${image} alt=${`Attached: ${image.name}`} />
              <button type="button" class="link" aria-label=${`Remove ${image.name}`} onClick=${() => {
                st.images = st.images.filter((x) => x !== image);
                changed();
              }}>Remove</button>
            </li>`,
          )}
        </ul>`
      : null}
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
      onPaste=${onPaste}
      placeholder=${steer ? "Steer the running turn…" : "Ask the agent…"}
    ></textarea>
    <div class="buttons">
      <button type="submit" class="primary" data-testid="send" disabled=${st.removed}>${steer ? "Steer" : "Send"}</button>
      <input type="file" ref=${fileRef} data-testid="image-input" accept=${IMAGE_TYPES.join(",")} multiple hidden
        onChange=${(e) => {
          attachImages(st, [...e.currentTarget.files]);
          e.currentTarget.value = "";
        }} />
      <button type="button" data-testid="attach-image" disabled=${st.removed} onClick=${() => fileRef.current?.click()}>Attach image</button>
      ${busy ? html`<button type="button" class="danger" data-testid="abort" onClick=${() => abort(st)}>Abort</button>` : null}
      <span id="prompt-hint" class="hint">Enter ${steer ? "steers" : "sends"}, Shift+Enter adds a line; paste or attach images</span>
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
  const s = st.shown;
  const title = clean(app.status.get(st.id)?.name || "Untitled session");
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
  const items = s.items;
  const { tokens, cost } = usageTotal(items);
  const busy = busyOf(st);
  // Our prompt is ours until it settles, even before the transcript says
  // its turn runs; the status names the phase (a compaction, a retry).
  const live = app.status.get(st.id)?.state;
  const phase = s.phase === "idle" ? (st.prompting > 0 ? "turn" : "idle") : ["compaction", "retry", "branch_summary"].includes(live) ? live : "turn";
  const models = app.models;
  const current = modelKey(s.model);
  const modelValue = st.pendingModel ?? current;
  const meta = models.find((m) => modelKey(m) === current);
  const levels = [...(meta?.supportedThinkingLevels ?? [])];
  if (!levels.includes(s.thinkingLevel)) levels.unshift(s.thinkingLevel);
  const thinkingValue = st.pendingThinking ?? s.thinkingLevel;
  const configurable = isOpen() && st.attached && !busy && !st.pendingModel && !st.pendingThinking && !st.removed;
  // Our steers the model has not taken yet.
  const queued = st.own.filter((o) => o.steer).map((o, i) => ({ id: `q${i}`, role: "user", content: [{ type: "text", text: o.text }] }));
  return html`<section class="session" aria-labelledby="session-title">
    <div class="session-head">
      <div class="nav">
        ${back}
        <span>Phase <${Badge} value=${phase} testid="phase" /></span>
      </div>
      <h2 id="session-title" tabindex="-1" ref=${headRef}>${title}</h2>
      <p class="where">${clean(s.cwd ?? app.status.get(st.id)?.cwd ?? "")}</p>
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
        if (item.role === "assistant") return html`<${AssistantItem} key=${item.id} item=${item} />`;
        if (item.role === "tool") return html`<${ToolItem} key=${item.id} item=${item} />`;
        return null;
      })}
      ${queued.map((item) => html`<${UserItem} key=${item.id} item=${item} origin="own" queued=${true} />`)}
    </ol>
    <${Composer} st=${st} busy=${busy} />
  </section>`;
};

const Banner = () => {
  const { conn_state: state, conn_info: info } = app;
  let text = "";
  let retry = false;
  if (state === "connecting" && app.ready) text = "Connecting to the server…";
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
  old?.close();
  if (app.view) unbind(app.view);
  changed();
};

const App = () => {
  let body;
  if (app.token === null) body = html`<${TokenForm} />`;
  else if (!app.ready) body = html`<p class="notice">Connecting to the server…</p>`;
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
