// Drives the web client served by `pi-server serve --listen http://…` in a
// real headless Chromium (Debian's `chromium`, through playwright-core's
// executablePath), the way a user does: token entry, the session list,
// create, prompt with streaming, a second browser watching, steer, abort,
// model and thinking changes, a reload mid-turn, a server replacement
// mid-turn, a turn that sends only what it adds, an image with a prompt, a
// worker killed mid-turn, keyboard-only use with WCAG AA contrast, a wrong
// token and a page of a foreign origin.
//
// Usage: node web.mjs <config.json> [scenarios]
//   config: {"bin", "serverDir", "serverId", "sessionDir", "screens"}
//   scenarios: optional comma-separated letters (default: all)
// Environment: WEB_CHROMIUM overrides /usr/bin/chromium; WEB_WAIT_MS the
// per-wait bound.
//
// The script starts and replaces its own `pi-server serve` processes (env
// PI_FAUX_DELAY_MS=40, output appended to <serverDir>/../server.log). Each
// scenario saves a screenshot to <screens>/<letter>-<what>.png. It prints
// `ok - <what>` per check and `web: all checks passed` at the end.

import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import path from "node:path";

const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const only = process.argv[3] ? new Set(process.argv[3].split(",")) : null;
const WAIT = Number(process.env.WEB_WAIT_MS) || 20_000;
const CHROMIUM = process.env.WEB_CHROMIUM || "/usr/bin/chromium";
const root = path.dirname(path.resolve(cfg.serverDir));
const work = path.join(root, "work");
const tokenFile = path.join(root, "token");
const TOKEN = "web-test-token-0123456789";
fs.mkdirSync(cfg.serverDir, { recursive: true, mode: 0o700 });
fs.mkdirSync(cfg.sessionDir, { recursive: true });
fs.mkdirSync(work, { recursive: true });
fs.mkdirSync(cfg.screens, { recursive: true });
fs.writeFileSync(tokenFile, TOKEN + "\n", { mode: 0o600 });
const globalArgs = ["--server-dir", cfg.serverDir, "--server-id", cfg.serverId, "--session-dir", cfg.sessionDir];

class CheckFailed extends Error {}
const check = (cond, what, detail) => {
  if (!cond) throw new CheckFailed(`check failed: ${what}${detail === undefined ? "" : `\n  detail: ${JSON.stringify(detail)?.slice(0, 1500)}`}`);
  console.log(`ok - ${what}`);
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const until = async (cond, what, ms = WAIT) => {
  const end = Date.now() + ms;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > end) throw new CheckFailed(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(25);
  }
};
const longText = (words) => Array.from({ length: words }, (_, i) => `word${String(i).padStart(4, "0")}`).join(" ");
const fauxReply = (prompt) => `You said: ${prompt}. This is the faux model answering offline, word by word.`;

// ---------------------------------------------------------------------------
// Servers

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });

const PORT = await freePort();
const BASE = `http://127.0.0.1:${PORT}`;
const servers = new Set();

/** Starts a server (a successor takes over from the running one). */
const startServer = async () => {
  const log = fs.openSync(path.join(root, "server.log"), "a");
  const child = spawn(
    cfg.bin,
    ["serve", ...globalArgs, "--listen", `http://127.0.0.1:${PORT}`, "--token-file", tokenFile],
    { stdio: ["ignore", log, log], env: { ...process.env, PI_FAUX_DELAY_MS: "40", RUST_LOG: "info" } },
  );
  fs.closeSync(log);
  child.exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  servers.add(child);
  await until(async () => (await get("/", { host: `127.0.0.1:${PORT}` })).status === 200, "the web listener");
  return child;
};

/** A raw HTTP GET with chosen headers: {status, body}. */
const get = (pathname, headers) =>
  new Promise((resolve) => {
    const req = http.request({ host: "127.0.0.1", port: PORT, path: pathname, headers, setHost: false }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on("upgrade", (res, socket) => {
      socket.destroy();
      resolve({ status: res.statusCode, headers: res.headers, body: "" });
    });
    req.on("error", (e) => resolve({ status: 0, body: String(e) }));
    req.end();
  });

// ---------------------------------------------------------------------------
// The page

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

const tid = (page, id) => page.locator(`[data-testid="${id}"]`);

/** A new browser context (its own session storage) on the page, token entered. */
const openPage = async (opts = {}, token = TOKEN, onPage = () => {}) => {
  const context = await browser.newContext(opts);
  const page = await context.newPage();
  page.on("pageerror", (e) => console.log(`# page error: ${e}`));
  // Before the page opens its socket (the token's submit does).
  onPage(page);
  await page.goto(BASE + "/");
  await tid(page, "token-input").fill(token);
  await tid(page, "token-submit").click();
  return { context, page };
};

const shot = async (page, name) => {
  await page.screenshot({ path: path.join(cfg.screens, `${name}.png`), fullPage: false });
};

/** Creates a session named `name` from the list and opens it; its id. */
const createSession = async (page, name) => {
  await tid(page, "session-list").waitFor({ timeout: WAIT });
  const cwd = path.join(work, name);
  fs.mkdirSync(cwd, { recursive: true });
  await tid(page, "create-cwd").fill(cwd);
  await tid(page, "create-name").fill(name);
  await tid(page, "create-submit").click();
  await until(async () => /#\/s\//.test(page.url()) || (await tid(page, "transcript").count()) > 0, `session ${name} opened`);
  const id = decodeURIComponent(page.url().split("#/s/")[1] ?? "");
  check(id.length > 0, `creating ${name} opens its view (#/s/<id>)`, page.url());
  await tid(page, "phase").waitFor({ timeout: WAIT });
  return id;
};

const assistantTexts = (page) => tid(page, "item-assistant").evaluateAll((els) => els.map((e) => ({ status: e.dataset.status, text: e.innerText })));
const lastAssistant = async (page) => (await assistantTexts(page)).at(-1);

/** Sends `text` with the input and the send button. */
const send = async (page, text) => {
  await tid(page, "prompt-input").fill(text);
  await tid(page, "send").click();
};

const waitIdle = (page) =>
  until(async () => (await tid(page, "phase").innerText()).trim() === "idle", "phase idle");

const words = (s) => s.replace(/\s+/g, " ").trim();


/**
 * Every visible text on the page has a WCAG AA contrast against its
 * effective background: 4.5:1, or 3:1 for large text (24 px, or 18.66 px bold).
 */
const contrast = async (page, what) => {
  const failures = await page.evaluate(() => {
    const rgba = (s) => {
      const m = s.match(/rgba?\(([^)]+)\)/);
      if (!m) return [0, 0, 0, 0];
      const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    };
    const over = (top, under) => {
      const a = top[3];
      return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat(1);
    };
    const background = (el) => {
      const layers = [];
      for (let e = el; e; e = e.parentElement) {
        const c = rgba(getComputedStyle(e).backgroundColor);
        if (c[3] > 0) layers.push(c);
        if (c[3] >= 1) break;
      }
      return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]);
    };
    const lum = ([r, g, b]) => {
      const f = (v) => {
        v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
      };
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const out = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    const seen = new Set();
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const el = n.parentElement;
      if (!el || seen.has(el) || !n.textContent.trim()) continue;
      seen.add(el);
      const style = getComputedStyle(el);
      const box = el.getBoundingClientRect();
      if (box.width === 0 || box.height === 0 || style.visibility === "hidden") continue;
      const bg = background(el);
      const fg = over(rgba(style.color), bg);
      const [l1, l2] = [lum(fg), lum(bg)].sort((a, b) => b - a);
      const ratio = (l1 + 0.05) / (l2 + 0.05);
      const size = parseFloat(style.fontSize);
      const bold = Number(style.fontWeight) >= 700;
      const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
      if (ratio < need) out.push({ text: n.textContent.trim().slice(0, 40), ratio: ratio.toFixed(2), need, color: style.color, bg: bg.map(Math.round).join(",") });
    }
    return out;
  });
  check(failures.length === 0, `every text in ${what} meets WCAG AA contrast`, failures);
};

// ---------------------------------------------------------------------------
// Scenarios

const scenarios = {
  /** Token entry, create, prompt with streaming; the phone-sized list. */
  async a() {
    const { context, page } = await openPage();
    const id = await createSession(page, "web-a");
    const text = longText(80);
    await send(page, text);
    const lengths = [];
    await until(async () => {
      const last = await lastAssistant(page);
      if (last?.status === "streaming") lengths.push(last.text.length);
      return new Set(lengths).size >= 3;
    }, "the reply streams in several steps");
    check(lengths.every((n, i) => i === 0 || n >= lengths[i - 1]), "the streamed text only grows", lengths);
    check((await tid(page, "send").innerText()).trim() === "Steer", "while a turn runs, Send is Steer");
    await shot(page, "a-session-mid-turn");
    await waitIdle(page);
    const last = await lastAssistant(page);
    check(last.status === "complete", "the reply completes", last);
    check(words(last.text).includes(words(fauxReply(text))), "the whole faux reply is shown", last.text.slice(0, 200));
    check(words(last.text).split(fauxReply("").slice(0, 9)).length === 2, "shown once");
    check(/\d/.test(await tid(page, "usage-total").innerText()), "usage and cost are shown");
    await tid(page, "back").click();
    await until(async () => (await tid(page, "session-row").count()) > 0, "the list");
    const row = page.locator(`[data-testid="session-row"][data-session-id="${id}"]`);
    check((await row.innerText()).includes("web-a"), "the list shows the session by name");
    // An unnamed session is listed by its first prompt.
    const unnamed = await createSession(page, "");
    await send(page, "tidy up the readme please");
    await waitIdle(page);
    await tid(page, "back").click();
    const titled = page.locator(`[data-testid="session-row"][data-session-id="${unnamed}"]`);
    await until(async () => (await titled.count()) > 0 && (await titled.innerText()).includes("“tidy up the readme please”"), "the unnamed session titled by its first prompt", 15000);
    await context.close();

    const phone = await openPage({ viewport: { width: 360, height: 740 }, isMobile: true, hasTouch: true });
    await tid(phone.page, "session-list").waitFor({ timeout: WAIT });
    await until(async () => (await tid(phone.page, "session-row").count()) > 0, "rows on the phone");
    const width = await phone.page.evaluate(() => document.documentElement.scrollWidth);
    check(width <= 360, "the list fits a phone-sized screen without horizontal scrolling", width);
    await shot(phone.page, "a-list-phone");
    await phone.context.close();
  },

  /** A second browser context watches the same turn and sees the same text. */
  async b() {
    const one = await openPage();
    const id = await createSession(one.page, "web-b");
    const two = await openPage();
    await two.page.goto(`${BASE}/#/s/${encodeURIComponent(id)}`);
    await tid(two.page, "phase").waitFor({ timeout: WAIT });
    const text = longText(60);
    await send(one.page, text);
    await until(async () => (await lastAssistant(two.page))?.status === "streaming", "the watcher sees the reply stream");
    await shot(two.page, "b-watcher-mid-turn");
    await waitIdle(one.page);
    await until(async () => (await lastAssistant(two.page))?.status === "complete", "the watcher sees it complete");
    const [a, b] = [await lastAssistant(one.page), await lastAssistant(two.page)];
    check(words(a.text) === words(b.text), "both browsers show the same reply", { a: a.text.slice(0, 80), b: b.text.slice(0, 80) });
    const users = await tid(two.page, "item-user").allInnerTexts();
    check(users.length === 1 && users[0].includes("word0000"), "the watcher shows the other client's prompt", users);
    await one.context.close();
    await two.context.close();
  },

  /** Steer and abort mid-turn; a model and thinking change, kept across a reload. */
  async c() {
    const { context, page } = await openPage();
    await createSession(page, "web-c");
    await send(page, longText(200));
    await until(async () => (await lastAssistant(page))?.status === "streaming", "streaming");
    await send(page, "steered: please stop soon");
    await until(async () => (await tid(page, "item-user").allInnerTexts()).some((t) => t.includes("steered")), "the steer is shown");
    const steers = (await tid(page, "item-user").allInnerTexts()).filter((t) => t.includes("steered"));
    check(steers.length === 1, "the steer is accepted mid-turn and shown once", steers);
    await until(async () => (await lastAssistant(page))?.status === "streaming", "the steered reply streams");
    await tid(page, "abort").click();
    await until(async () => (await assistantTexts(page)).some((a) => a.status === "aborted"), "an aborted reply");
    await waitIdle(page);
    await shot(page, "c-aborted");
    const after = await assistantTexts(page);
    check(after.at(-1).status === "aborted" && (await tid(page, "send").innerText()).trim() === "Send", "abort ends the turn: the last reply is aborted and Send is back", after.map((a) => a.status));

    const models = await tid(page, "model-picker").locator("option").evaluateAll((os) => os.map((o) => ({ value: o.value, label: o.textContent })));
    const reasoner = models.find((m) => /reasoner/i.test(m.value + m.label));
    check(reasoner, "the model picker offers the reasoning model", models);
    await tid(page, "model-picker").selectOption(reasoner.value);
    await until(async () => (await tid(page, "thinking-picker").locator("option").count()) > 1, "thinking levels of the reasoning model");
    await until(async () => !(await tid(page, "thinking-picker").isDisabled()), "the thinking picker enabled");
    await tid(page, "thinking-picker").selectOption("high");
    await sleep(300);
    await page.reload();
    await tid(page, "phase").waitFor({ timeout: WAIT });
    await until(async () => (await tid(page, "thinking-picker").inputValue()) === "high", "thinking high after a reload");
    check((await tid(page, "model-picker").inputValue()) === reasoner.value, "the model is kept across a reload");
    await send(page, "think about it");
    await waitIdle(page);
    check((await tid(page, "item-thinking").count()) > 0, "a reasoning reply shows its thinking");
    await context.close();
  },

  /** A reload mid-turn loses and duplicates nothing. */
  async d() {
    const { context, page } = await openPage();
    await createSession(page, "web-d");
    const text = longText(120);
    await send(page, text);
    await until(async () => (await lastAssistant(page))?.text.length > 40, "some of the reply");
    await page.reload();
    await tid(page, "phase").waitFor({ timeout: WAIT });
    await until(async () => (await lastAssistant(page))?.status === "streaming", "the reply streams on after the reload");
    const soFar = await lastAssistant(page);
    const reply = (t) => words(t.slice(Math.max(0, t.indexOf("You said:"))));
    check(
      reply(soFar.text).length > "You said:".length && words(fauxReply(text)).startsWith(reply(soFar.text)),
      "after the reload the reply so far shows at once, with no gap",
      soFar.text.slice(0, 120),
    );
    await until(async () => {
      const now = await lastAssistant(page);
      return now?.status !== "streaming" || now.text.length > soFar.text.length;
    }, "it streams on from there");
    await waitIdle(page);
    const all = await assistantTexts(page);
    check(all.length === 1 && all[0].status === "complete", "one reply, complete", all.map((a) => a.status));
    check(words(all[0].text).includes(words(fauxReply(text))), "its whole text, once, after the reload");
    await shot(page, "d-after-reload");
    await context.close();
  },

  /** The server is replaced mid-turn: "reconnecting…", then the whole reply, once. */
  async e() {
    const { context, page } = await openPage();
    await createSession(page, "web-e");
    const text = longText(150);
    await send(page, text);
    await until(async () => (await lastAssistant(page))?.text.length > 40, "some of the reply");
    const old = [...servers].at(-1);
    const successor = startServer();
    const banner = until(async () => /reconnect/i.test(await tid(page, "conn-banner").innerText().catch(() => "")), "the reconnecting banner", WAIT).then(
      () => true,
      () => false,
    );
    await successor;
    await old.exited;
    servers.delete(old);
    check(await banner, "the page says it is reconnecting");
    await waitIdle(page);
    const all = await assistantTexts(page);
    check(all.length === 1 && all[0].status === "complete", "the turn completed across the replacement", all.map((a) => a.status));
    check(words(all[0].text).includes(words(fauxReply(text))), "its text is whole and shown once");
    await shot(page, "e-after-replacement");
    await context.close();
  },

  /** A turn sends the page what it adds: nothing of earlier turns travels again. */
  async h() {
    const frames = [];
    const { context, page } = await openPage({}, TOKEN, (page) =>
      page.on("websocket", (ws) => ws.on("framereceived", ({ payload }) => frames.push(Buffer.from(payload)))),
    );
    await createSession(page, "web-h");
    await send(page, "the first turn says alpha-marker-0042");
    await waitIdle(page);
    const before = frames.length;
    await send(page, "the second turn says beta-marker-0042");
    await waitIdle(page);
    await until(async () => words((await lastAssistant(page)).text).includes("beta-marker-0042"), "the second reply");
    const turn = Buffer.concat(frames.slice(before));
    check(turn.includes("beta-marker-0042"), "the second turn's frames carry its text");
    check(!turn.includes("alpha-marker-0042"), "and nothing of the first turn", turn.length);
    await shot(page, "h-deltas");
    await context.close();
  },

  /** An image goes with a prompt: attached, shown with the message, seen by the model. */
  async i() {
    const { context, page } = await openPage();
    await createSession(page, "web-i");
    // A 1×1 PNG.
    const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "base64");
    await tid(page, "image-input").setInputFiles({ name: "dot.png", mimeType: "image/png", buffer: png });
    await until(async () => (await tid(page, "attachments").locator("img").count()) === 1, "the image waits in the composer");
    await send(page, "what is in the picture");
    await waitIdle(page);
    const reply = words((await lastAssistant(page)).text);
    check(reply.includes("You said: what is in the picture, with 1 image (image/png)."), "the model was given the image with the text", reply);
    check((await tid(page, "item-user").locator("img").count()) === 1, "the message shows its image");
    check((await tid(page, "attachments").count()) === 0, "the composer is empty again");
    await shot(page, "i-image");
    await context.close();
  },

  /** The session's worker is killed mid-turn: the page is attached again (a new worker starts) and takes the next prompt. */
  async j() {
    const { context, page } = await openPage();
    const id = await createSession(page, "web-j");
    await send(page, longText(200));
    await until(async () => (await lastAssistant(page))?.status === "streaming", "streaming");
    const lock = fs.readFileSync(path.join(cfg.sessionDir, id, "lock"), "utf8");
    process.kill(Number(lock.split("\n")[0].trim()), "SIGKILL");
    await waitIdle(page);
    await send(page, "after the worker died");
    await until(async () => words((await lastAssistant(page))?.text ?? "").includes("You said: after the worker died."), "the next prompt answered");
    await shot(page, "j-worker-killed");
    await context.close();
  },

  /** By keyboard alone: token, create, prompt; every text meets WCAG AA contrast. */
  async g() {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(BASE + "/");
    const focusOn = async (id, what) => {
      for (let i = 0; i < 40; i++) {
        if (await page.evaluate((id) => document.activeElement?.dataset?.testid === id, id)) return;
        await page.keyboard.press("Tab");
      }
      throw new CheckFailed(`Tab never reaches ${what}`);
    };
    await focusOn("token-input", "the token input");
    await page.keyboard.type(TOKEN);
    await page.keyboard.press("Enter");
    await tid(page, "session-list").waitFor({ timeout: WAIT });
    check((await tid(page, "token-input").count()) === 0, "Enter in the token field signs in");
    const cwd = path.join(work, "web-g");
    fs.mkdirSync(cwd, { recursive: true });
    await focusOn("create-cwd", "the working directory field");
    await page.keyboard.type(cwd);
    await focusOn("create-name", "the name field");
    await page.keyboard.type("web-g");
    await page.keyboard.press("Enter");
    await tid(page, "phase").waitFor({ timeout: WAIT });
    check(/#\/s\//.test(page.url()), "Enter in the create form creates and opens the session", page.url());
    await focusOn("prompt-input", "the prompt input");
    await page.keyboard.type("hello by keyboard");
    await page.keyboard.press("Enter");
    await until(async () => (await lastAssistant(page))?.status === "streaming", "the keyboard prompt streams");
    await contrast(page, "the session view mid-turn");
    await waitIdle(page);
    check(words((await lastAssistant(page)).text).includes(words(fauxReply("hello by keyboard"))), "the keyboard prompt is answered");
    await focusOn("back", "the link back to the list");
    await page.keyboard.press("Enter");
    await until(async () => (await tid(page, "session-row").count()) > 0, "the list by keyboard");
    await contrast(page, "the session list");
    await focusOn("remove-button", "a Remove button");
    await page.keyboard.press("Enter");
    await tid(page, "confirm-remove").waitFor({ timeout: WAIT });
    await page.keyboard.press("Escape");
    await until(async () => (await tid(page, "confirm-remove").count()) === 0, "Escape cancels the removal");
    check(await page.evaluate(() => document.activeElement?.dataset?.testid === "remove-button"), "focus returns to Remove after Escape");
    await shot(page, "g-keyboard");
    await context.close();
  },

  /** A wrong token is refused and asked for again; a foreign origin and host are refused. */
  async f() {
    const { context, page } = await openPage({}, "not-the-token");
    await tid(page, "error").waitFor({ timeout: WAIT });
    await until(async () => /token/i.test(await tid(page, "error").innerText()), "the error names the token");
    check(await tid(page, "token-input").isVisible(), "a wrong token: the form asks again");
    await shot(page, "f-wrong-token");
    await context.close();

    // A page of another origin opening the socket.
    const foreign = http.createServer((_, res) => {
      res.setHeader("content-type", "text/html");
      res.end("<!doctype html><title>elsewhere</title>");
    });
    await new Promise((r) => foreign.listen(0, "127.0.0.1", r));
    const other = await browser.newContext();
    const evil = await other.newPage();
    await evil.goto(`http://127.0.0.1:${foreign.address().port}/`);
    const outcome = await evil.evaluate(
      (url) =>
        new Promise((resolve) => {
          const ws = new WebSocket(url);
          ws.onopen = () => resolve("open");
          ws.onclose = (e) => resolve(`closed ${e.code}`);
        }),
      `ws://127.0.0.1:${PORT}/ws`,
    );
    check(outcome.startsWith("closed"), "a socket from a page of another origin never opens", outcome);
    await shot(evil, "f-foreign-origin");
    await other.close();
    foreign.close();
    const upgrade = { host: `127.0.0.1:${PORT}`, origin: "http://evil.example", connection: "Upgrade", upgrade: "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==" };
    const refused = await get("/ws", upgrade);
    check(refused.status === 403 && /Origin/.test(refused.body), "the upgrade from a foreign origin is a 403", refused);
    const rebound = await get("/", { host: `rebound.example:${PORT}` });
    check(rebound.status === 403, "a page requested under a foreign Host is a 403", rebound);
    const plain = await get("/ws", { host: `127.0.0.1:${PORT}` });
    check(plain.status === 426, "a plain GET of the socket path is a 426", plain.status);
  },
};

// ---------------------------------------------------------------------------

let failed = false;
try {
  await startServer();
  for (const [letter, run] of Object.entries(scenarios)) {
    if (only && !only.has(letter)) continue;
    console.log(`# scenario ${letter}`);
    await run();
  }
} catch (e) {
  failed = true;
  console.log(e instanceof CheckFailed ? e.message : e.stack);
} finally {
  await browser.close().catch(() => {});
  for (const s of servers) s.kill("SIGTERM");
  await Promise.all([...servers].map((s) => Promise.race([s.exited, sleep(5000)])));
}
if (failed) process.exit(1);
console.log("web: all checks passed");
