// Drives `pi-server acp` (ACP protocol v1 over stdio) with the published
// @agentclientprotocol/sdk@2.4.0, the way an editor does: each adapter is a
// child process speaking newline-delimited JSON-RPC on its stdin/stdout.
//
// Usage: node acp.mjs <config.json> [scenarios]
//   config: {"bin": ".../pi-server", "serverDir": D, "serverId": UUID, "sessionDir": S}
//   scenarios: optional comma-separated letters (default: all), e.g. "a,b,f"
// Environment: ACP_KEEP_GOING=1 runs every scenario even after a failure (the
// exit status is still non-zero), ACP_SKIP=i,j skips scenarios by letter,
// ACP_WAIT_MS overrides the per-wait bound,
// ACP_CRASH_RESTART_DELAY_MS pauses between the SIGKILL and the new serve in i.
//
// The script starts, replaces and kills `pi-server serve` itself (env
// PI_FAUX_DELAY_MS=40, RUST_LOG=info, output appended to <serverDir>/../server.log)
// and spawns adapters `pi-server --server-dir D --server-id ID --session-dir S acp`
// (stderr to <serverDir>/../acp-<name>.log). It prints `ok - <what>` per check,
// stops with a message, the JSON exchanged and the log tails on the first
// failure, and prints `acp: all checks passed` at the end.

import * as acp from "@agentclientprotocol/sdk";
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { StringDecoder } from "node:string_decoder";
import { fileURLToPath } from "node:url";

// The SDK's generated zod validators (not a public export, so loaded by path;
// optional): every session/update and every response is checked against the
// ACP v1 schema, since the SDK silently drops a session/update it cannot parse.
let zs = null;
try {
  const here = path.dirname(fileURLToPath(import.meta.url));
  zs = await import(path.join(here, "node_modules/@agentclientprotocol/sdk/dist/v1/schema/zod.gen.js"));
} catch {
  zs = null;
}

const configPath = process.argv[2];
if (!configPath) {
  console.error("usage: node acp.mjs <config.json> [scenarios]");
  process.exit(2);
}
const cfg = JSON.parse(fs.readFileSync(configPath, "utf8"));
for (const key of ["bin", "serverDir", "serverId", "sessionDir"]) {
  if (typeof cfg[key] !== "string" || !cfg[key]) {
    console.error(`config ${configPath}: missing "${key}"`);
    process.exit(2);
  }
}
const only = process.argv[3] ? new Set(process.argv[3].split(",").map((s) => s.trim())) : null;
const skip = new Set((process.env.ACP_SKIP ?? "").split(",").map((s) => s.trim()).filter(Boolean));
const KEEP_GOING = process.env.ACP_KEEP_GOING === "1";
const WAIT = Number(process.env.ACP_WAIT_MS) || 20_000;
const FAUX_DELAY_MS = "40";
const root = path.dirname(path.resolve(cfg.serverDir));
const socketPath = path.join(cfg.serverDir, `${cfg.serverId}.sock`);
const serverLog = path.join(root, "server.log");
const workRoot = path.join(root, "work");
fs.mkdirSync(cfg.serverDir, { recursive: true, mode: 0o700 });
fs.mkdirSync(cfg.sessionDir, { recursive: true });
fs.mkdirSync(workRoot, { recursive: true });
const globalArgs = ["--server-dir", cfg.serverDir, "--server-id", cfg.serverId, "--session-dir", cfg.sessionDir];

// ---------------------------------------------------------------------------
// Checks, waits, text

class CheckFailed extends Error {}

const check = (cond, what, detail) => {
  if (!cond) {
    throw new CheckFailed(`check failed: ${what}${detail === undefined ? "" : `\n  detail: ${show(detail)}`}`);
  }
  console.log(`ok - ${what}`);
};
const note = (text) => console.log(`# note: ${text}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const show = (value, max = 1500) => {
  let s;
  try {
    s = typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    s = String(value);
  }
  if (s === undefined) s = String(value);
  return s.length > max ? `${s.slice(0, max)}… (${s.length} chars)` : s;
};

/** Resolves `promise`, or fails naming `what` after `ms`. */
const within = (promise, what, ms = WAIT) => {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailed(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
};

/** Polls `cond` every 20 ms until it returns a truthy value; fails after `ms`. */
const waitFor = async (cond, what, ms = WAIT) => {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = cond();
    if (value) return value;
    if (Date.now() > deadline) {
      throw new CheckFailed(`timed out after ${ms} ms waiting for ${typeof what === "function" ? what() : what}`);
    }
    await sleep(20);
  }
};

/** A prompt whose faux reply streams in about `words` deltas (as tests/common/mod.rs). */
const longText = (words) =>
  Array.from({ length: words }, (_, i) => `word${String(i).padStart(4, "0")}`).join(" ");

/** The faux model's reply to a plain text prompt (kernel/src/faux.rs). */
const fauxReply = (prompt) => `You said: ${prompt}. This is the faux model answering offline, word by word.`;

/** The joined text of the `kind` updates (e.g. agent_message_chunk) in `updates`. */
const textOf = (updates, kind = "agent_message_chunk") =>
  updates
    .filter((u) => u.update.sessionUpdate === kind && u.update.content?.type === "text")
    .map((u) => u.update.content.text)
    .join("");

/**
 * Where `got` differs from `expected`, word by word (a longest-common-
 * subsequence diff): the words missing from `got` and the extra ones, each
 * with the word before it.
 */
const diffText = (got, expected) => {
  if (got === expected) return "equal";
  const g = got.split(/(?<= )/);
  const e = expected.split(/(?<= )/);
  const lcs = Array.from({ length: e.length + 1 }, () => new Array(g.length + 1).fill(0));
  for (let i = e.length - 1; i >= 0; i--) {
    for (let j = g.length - 1; j >= 0; j--) {
      lcs[i][j] = e[i] === g[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  const push = (kind, word, before) => {
    const last = out.at(-1);
    if (last && last.kind === kind && last.end === (kind === "missing" ? i : j)) {
      last.text += word;
      last.end++;
    } else {
      out.push({ kind, text: word, after: before, end: (kind === "missing" ? i : j) + 1 });
    }
  };
  while (i < e.length || j < g.length) {
    if (i < e.length && j < g.length && e[i] === g[j]) {
      i++;
      j++;
    } else if (j >= g.length || (i < e.length && lcs[i + 1][j] >= lcs[i][j + 1])) {
      push("missing", e[i], e[i - 1] ?? "(start)");
      i++;
    } else {
      push("extra", g[j], g[j - 1] ?? "(start)");
      j++;
    }
  }
  return `${got.length} characters received, ${expected.length} expected: ${out
    .map((d) => `${d.kind} ${JSON.stringify(d.text)} after ${JSON.stringify(d.after)}`)
    .join("; ")}`;
};
const textDetail = (got, expected) => ({
  diff: diffText(got, expected),
  gotStart: got.slice(0, 60),
  gotEnd: got.slice(-60),
  expectedStart: expected.slice(0, 60),
  expectedEnd: expected.slice(-60),
  got,
  expected,
});

const isKind = (kind) => (u) => u.update.sessionUpdate === kind;

const workDir = (name) => {
  const dir = path.join(workRoot, name);
  fs.mkdirSync(dir, { recursive: true });
  return dir;
};

const responseSchemas = () =>
  zs && {
    initialize: zs.zInitializeResponse,
    "session/new": zs.zNewSessionResponse,
    "session/load": zs.zLoadSessionResponse,
    "session/list": zs.zListSessionsResponse,
    "session/resume": zs.zResumeSessionResponse,
    "session/close": zs.zCloseSessionResponse,
    "session/delete": zs.zDeleteSessionResponse,
    "session/set_config_option": zs.zSetSessionConfigOptionResponse,
    "session/prompt": zs.zPromptResponse,
  };

// ---------------------------------------------------------------------------
// Scenario bookkeeping: what to dump on failure

let seq = 0; // global order of every raw line, across adapters
let scenario = null; // { name, adapters: [] }
const spawned = new Set(); // every ChildProcess this script started

const tail = (file, lines) => {
  try {
    return fs.readFileSync(file, "utf8").split("\n").slice(-lines - 1).join("\n");
  } catch {
    return "(no file)";
  }
};

/**
 * The last `lines` entries of a raw transcript, with runs of consecutive
 * session/update chunks of one kind shown as their first and last line and
 * the joined text.
 */
const compressTranscript = (raw, lines) => {
  const kindOf = (e) =>
    e.dir === "<" && e.msg?.method === "session/update" && /_chunk$/.test(e.msg.params?.update?.sessionUpdate ?? "")
      ? `${e.msg.params.sessionId}/${e.msg.params.update.sessionUpdate}`
      : null;
  const fmt = (e) => `  ${e.dir === ">" ? "client→agent" : "agent→client"} ${show(e.line, 700)}`;
  const out = [];
  for (let i = 0; i < raw.length; ) {
    const kind = kindOf(raw[i]);
    let j = i + 1;
    if (kind) while (j < raw.length && kindOf(raw[j]) === kind) j++;
    if (j - i >= 4) {
      const text = raw
        .slice(i, j)
        .map((e) => e.msg.params.update.content?.text ?? "")
        .join("");
      out.push(fmt(raw[i]));
      out.push(`  … ${j - i - 2} more ${kind.split("/")[1]} lines; the run's joined text: ${show(JSON.stringify(text), 700)}`);
      out.push(fmt(raw[j - 1]));
    } else {
      for (let k = i; k < j; k++) out.push(fmt(raw[k]));
    }
    i = j;
  }
  const shown = out.slice(-lines);
  return `${out.length > shown.length ? `  … ${out.length - shown.length} earlier lines\n` : ""}${shown.join("\n")}`;
};

// ---------------------------------------------------------------------------
// The server: `pi-server serve` children

const server = {
  current: null,
  starts: 0,

  start() {
    const log = fs.openSync(serverLog, "a");
    fs.writeSync(log, `\n==== acp.mjs: starting serve #${++this.starts} (${new Date().toISOString()}) ====\n`);
    const child = spawn(cfg.bin, ["serve", ...globalArgs], {
      stdio: ["ignore", log, log],
      env: { ...process.env, PI_FAUX_DELAY_MS: FAUX_DELAY_MS, RUST_LOG: "info" },
    });
    fs.closeSync(log);
    child.exitedAt = null;
    child.exited = new Promise((resolve) =>
      child.on("exit", (code, signal) => {
        child.exitedAt = { code, signal };
        resolve(child.exitedAt);
      }),
    );
    child.on("error", (e) => {
      child.exitedAt = { error: String(e) };
    });
    spawned.add(child);
    this.current = child;
    return child;
  },

  /** Waits until the socket accepts a connection (and the current serve still runs). */
  async ready() {
    this.probe();
    await waitFor(
      () => {
        if (this.current?.exitedAt) {
          throw new CheckFailed(
            `pi-server serve exited during startup: ${show(this.current.exitedAt)}\n${tail(serverLog, 30)}`,
          );
        }
        return this.connectable === true;
      },
      `the server socket ${socketPath}`,
    );
  },

  // A background prober updating `connectable` (waitFor only polls).
  probe() {
    this.connectable = false;
    const attempt = () => {
      const sock = net.createConnection(socketPath);
      sock.on("connect", () => {
        this.connectable = true;
        sock.destroy();
      });
      sock.on("error", () => {
        sock.destroy();
        if (!this.connectable) setTimeout(attempt, 50);
      });
    };
    attempt();
  },

  running() {
    return this.current !== null && this.current.exitedAt === null;
  },

  async ensure() {
    if (!this.running()) {
      this.start();
      await this.ready();
    }
  },

  /** A second serve with the same id: the old one hands over and exits. */
  async replace() {
    const old = this.current;
    this.start();
    const status = await within(old.exited, "the old server to exit after the hand-over");
    await this.ready();
    return status;
  },

  async crash() {
    const old = this.current;
    old.kill("SIGKILL");
    await within(old.exited, "the SIGKILLed server to exit");
  },

  async stop() {
    const child = this.current;
    if (!child || child.exitedAt) return;
    child.kill("SIGTERM");
    try {
      await within(child.exited, "the server to exit after SIGTERM");
    } catch {
      child.kill("SIGKILL");
    }
  },
};

// ---------------------------------------------------------------------------
// An adapter: `pi-server … acp` driven through the SDK's client app

class Adapter {
  /** Spawns an adapter and completes `initialize`. */
  static async open(name) {
    const adapter = new Adapter(name);
    adapter.initializeResponse = await adapter.initialize();
    return adapter;
  }

  constructor(name) {
    this.name = name;
    this.raw = []; // { seq, dir: "<" | ">", t, line, msg }
    this.nonJson = []; // stdout lines that are not JSON-RPC objects
    this.schemaErrors = []; // { line, error }
    this.updates = []; // SDK-delivered session/update params: { sessionId, update }
    this.permissions = [];
    this.methodOfId = new Map();
    this.stderrPath = path.join(root, `acp-${name}.log`);
    const err = fs.openSync(this.stderrPath, "a");
    this.child = spawn(cfg.bin, [...globalArgs, "acp"], {
      stdio: ["pipe", "pipe", err],
      env: { ...process.env, PI_FAUX_DELAY_MS: FAUX_DELAY_MS, RUST_LOG: "info" },
    });
    fs.closeSync(err);
    spawned.add(this.child);
    this.exitedAt = null;
    this.exited = new Promise((resolve) =>
      this.child.on("exit", (code, signal) => {
        this.exitedAt = { code, signal };
        resolve(this.exitedAt);
      }),
    );
    this.child.on("error", (e) => {
      this.exitedAt = { error: String(e) };
    });
    this.child.stdin.on("error", () => {});
    scenario?.adapters.push(this);

    const decoder = new StringDecoder("utf8");
    let pending = "";
    const input = new ReadableStream({
      start: (controller) => {
        this.child.stdout.on("data", (buf) => {
          pending += decoder.write(buf);
          let nl;
          while ((nl = pending.indexOf("\n")) >= 0) {
            this.recordIn(pending.slice(0, nl));
            pending = pending.slice(nl + 1);
          }
          controller.enqueue(new Uint8Array(buf));
        });
        this.child.stdout.on("end", () => {
          if (pending.trim()) this.recordIn(pending);
          try {
            controller.close();
          } catch {}
        });
        this.child.stdout.on("error", () => {});
      },
    });
    const output = new WritableStream({
      write: (chunk) => {
        const text = Buffer.from(chunk).toString("utf8");
        for (const line of text.split("\n")) if (line.trim()) this.recordOut(line);
        return new Promise((resolve, reject) =>
          this.child.stdin.write(chunk, (e) => (e ? reject(e) : resolve())),
        );
      },
      close: () => this.child.stdin.end(),
    });

    const app = acp
      .client({ name: `acp-e2e-${name}` })
      .onNotification(acp.methods.client.session.update, ({ params }) => {
        this.updates.push({ sessionId: params.sessionId, update: params.update });
      })
      .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
        this.permissions.push(params);
        const option = params.options.find((o) => String(o.kind).startsWith("allow")) ?? params.options[0];
        return { outcome: { outcome: "selected", optionId: option.optionId } };
      });
    this.conn = app.connect(acp.ndJsonStream(output, input));
    this.agent = this.conn.agent;
  }

  recordIn(line) {
    const entry = { seq: ++seq, dir: "<", t: Date.now(), line, msg: undefined };
    this.raw.push(entry);
    if (!line.trim()) return;
    try {
      entry.msg = JSON.parse(line);
    } catch {
      this.nonJson.push(line);
      return;
    }
    const msg = entry.msg;
    if (msg === null || typeof msg !== "object" || Array.isArray(msg) || msg.jsonrpc !== "2.0") {
      this.nonJson.push(line);
      return;
    }
    if (!zs) return;
    if (msg.method === "session/update") {
      const parsed = zs.zSessionNotification.safeParse(msg.params);
      if (!parsed.success) this.schemaErrors.push({ line, error: parsed.error.message });
    } else if ("id" in msg && "result" in msg) {
      const method = this.methodOfId.get(msg.id);
      const schema = method && responseSchemas()[method];
      if (schema) {
        const parsed = schema.safeParse(msg.result);
        if (!parsed.success) this.schemaErrors.push({ line, error: `${method} response: ${parsed.error.message}` });
      }
    }
  }

  recordOut(line) {
    const entry = { seq: ++seq, dir: ">", t: Date.now(), line, msg: undefined };
    try {
      entry.msg = JSON.parse(line);
      if (entry.msg && "id" in entry.msg && typeof entry.msg.method === "string") {
        this.methodOfId.set(entry.msg.id, entry.msg.method);
      }
    } catch {}
    this.raw.push(entry);
  }

  /** The id of the first `method` request written after raw index `from`. */
  idOf(method, from) {
    const entry = this.raw.slice(from).find((e) => e.dir === ">" && e.msg?.method === method && "id" in e.msg);
    return entry?.msg.id;
  }

  /** Raw index of the response to request `id`, or -1. */
  responseIndex(id) {
    return this.raw.findIndex((e) => e.dir === "<" && e.msg && e.msg.id === id && !("method" in e.msg));
  }

  /**
   * Sends a request through the SDK and waits for its answer (bounded).
   * Returns { result, id, sentAt, answeredAt } (raw indices); rejects with the
   * SDK's RequestError on a JSON-RPC error.
   */
  async call(method, params, ms = WAIT) {
    const sentAt = this.raw.length;
    const promise = this.agent.request(method, params);
    promise.catch(() => {});
    let result;
    try {
      result = await within(promise, `${this.name}: the response to ${method} ${show(params, 200)}`, ms);
    } catch (e) {
      if (e instanceof CheckFailed || e instanceof acp.RequestError) throw e;
      throw new CheckFailed(
        `${this.name}: ${method} failed without a JSON-RPC answer: ${e?.message ?? e} (adapter ${show(this.exitedAt ?? "still running")})`,
      );
    }
    const id = this.idOf(method, sentAt);
    return { result, id, sentAt, answeredAt: this.responseIndex(id) };
  }

  async req(method, params, ms = WAIT) {
    return (await this.call(method, params, ms)).result;
  }

  /** Expects `method` to fail; returns the RequestError. */
  async reqError(method, params, what, ms = WAIT) {
    let result;
    try {
      result = await this.req(method, params, ms);
    } catch (e) {
      if (e instanceof CheckFailed) throw e;
      return e;
    }
    throw new CheckFailed(`check failed: ${what}: expected an error, got the result ${show(result)}`);
  }

  async initialize() {
    return this.req(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name: "pi-acp-e2e", version: "1.0.0" },
    });
  }

  async newSession(cwd, mcpServers = []) {
    const response = await this.req(acp.methods.agent.session.new, { cwd, mcpServers });
    return response;
  }

  /** Starts a prompt; returns the pending response (rejections are kept, not thrown unhandled). */
  prompt(sessionId, prompt, ms = 40_000) {
    const blocks = typeof prompt === "string" ? [{ type: "text", text: prompt }] : prompt;
    const p = this.req(acp.methods.agent.session.prompt, { sessionId, prompt: blocks }, ms);
    p.catch(() => {});
    return p;
  }

  /** SDK-delivered updates of `sessionId` from index `from`. */
  updatesOf(sessionId, from = 0) {
    return this.updates.slice(from).filter((u) => u.sessionId === sessionId);
  }

  /** Raw session/update params of `sessionId` between raw indices [from, to). */
  rawUpdates(sessionId, from, to = this.raw.length) {
    return this.raw
      .slice(from, to)
      .filter((e) => e.dir === "<" && e.msg?.method === "session/update" && e.msg.params?.sessionId === sessionId)
      .map((e) => ({ seq: e.seq, sessionId, update: e.msg.params.update }));
  }

  async waitUpdate(sessionId, pred, what, from = 0, ms = WAIT) {
    return waitFor(() => this.updatesOf(sessionId, from).find(pred), `${this.name}: ${what}`, ms);
  }

  kill(signal = "SIGKILL") {
    if (!this.exitedAt) this.child.kill(signal);
  }

  async dispose() {
    if (this.exitedAt) return;
    try {
      this.child.stdin.end();
    } catch {}
    const gone = await Promise.race([this.exited.then(() => true), sleep(3000).then(() => false)]);
    if (!gone) {
      this.kill("SIGKILL");
      await Promise.race([this.exited, sleep(3000)]);
    }
  }

  transcript(lines = 60) {
    return compressTranscript(this.raw, lines);
  }

}

// ---------------------------------------------------------------------------
// A raw adapter: lines written by hand (bad input)

class RawAdapter {
  constructor(name) {
    this.name = name;
    this.raw = [];
    this.nonJson = [];
    this.schemaErrors = [];
    this.stderrPath = path.join(root, `acp-${name}.log`);
    const err = fs.openSync(this.stderrPath, "a");
    this.child = spawn(cfg.bin, [...globalArgs, "acp"], {
      stdio: ["pipe", "pipe", err],
      env: { ...process.env, PI_FAUX_DELAY_MS: FAUX_DELAY_MS, RUST_LOG: "info" },
    });
    fs.closeSync(err);
    spawned.add(this.child);
    this.exitedAt = null;
    this.exited = new Promise((resolve) =>
      this.child.on("exit", (code, signal) => {
        this.exitedAt = { code, signal };
        resolve(this.exitedAt);
      }),
    );
    this.child.stdin.on("error", () => {});
    scenario?.adapters.push(this);
    const decoder = new StringDecoder("utf8");
    let pending = "";
    this.child.stdout.on("data", (buf) => {
      pending += decoder.write(buf);
      let nl;
      while ((nl = pending.indexOf("\n")) >= 0) {
        this.recordIn(pending.slice(0, nl));
        pending = pending.slice(nl + 1);
      }
    });
  }

  recordIn(line) {
    const entry = { seq: ++seq, dir: "<", line, msg: undefined };
    this.raw.push(entry);
    if (!line.trim()) return;
    try {
      entry.msg = JSON.parse(line);
      if (entry.msg?.jsonrpc !== "2.0") this.nonJson.push(line);
    } catch {
      this.nonJson.push(line);
    }
  }

  send(line) {
    this.raw.push({ seq: ++seq, dir: ">", line });
    this.child.stdin.write(`${line}\n`);
    return this.raw.length;
  }

  /** Sends a request object; returns its response message (result or error). */
  async request(message, what = message.method) {
    const from = this.send(JSON.stringify(message));
    return this.responseTo(message.id, from, what);
  }

  async responseTo(id, from, what) {
    return waitFor(
      () =>
        this.raw.slice(from).find((e) => e.dir === "<" && e.msg && !("method" in e.msg) && e.msg.id === id)?.msg,
      `${this.name}: the response (id ${JSON.stringify(id)}) to ${what}`,
    );
  }

  kill() {
    if (!this.exitedAt) this.child.kill("SIGKILL");
  }

  async dispose() {
    if (this.exitedAt) return;
    try {
      this.child.stdin.end();
    } catch {}
    const gone = await Promise.race([this.exited.then(() => true), sleep(3000).then(() => false)]);
    if (!gone) this.kill();
  }

  transcript(lines = 60) {
    return compressTranscript(this.raw, lines);
  }

}

// ---------------------------------------------------------------------------
// Shared checks

const optionById = (configOptions, id) => (configOptions ?? []).find((o) => o.id === id);
const values = (option) => (option?.options ?? []).map((o) => o.value);

const checkConfigOptions = (configOptions, { model, level, levels }, where) => {
  check(Array.isArray(configOptions), `${where}: configOptions is an array`, configOptions);
  const m = optionById(configOptions, "model");
  check(
    m && m.category === "model" && m.type === "select" && m.currentValue === model,
    `${where}: model option (category model, select) with currentValue ${model}`,
    m,
  );
  const vs = values(m);
  check(
    ["faux/faux-1", "faux/faux-reasoner", "faux/faux-tiny"].every((v) => vs.includes(v)) &&
      m.options.every((o) => typeof o.name === "string" && o.name.length > 0),
    `${where}: model options list every faux model with a name`,
    m.options,
  );
  const t = optionById(configOptions, "thought_level");
  check(
    t && t.category === "thought_level" && t.type === "select" && t.currentValue === level,
    `${where}: thought_level option (category thought_level, select) with currentValue ${level}`,
    t,
  );
  check(
    JSON.stringify(values(t)) === JSON.stringify(levels),
    `${where}: thought_level options are ${levels.join(", ")}`,
    t.options,
  );
};

/** Follows nextCursor until every session is listed. */
const listAll = async (adapter, params = {}) => {
  const sessions = [];
  let cursor;
  for (let page = 0; page < 100; page++) {
    const res = await adapter.req(acp.methods.agent.session.list, cursor ? { ...params, cursor } : params);
    check(Array.isArray(res.sessions), `session/list ${show(params)} answers {sessions: [...]}`, res);
    sessions.push(...res.sessions);
    if (!res.nextCursor) return sessions;
    cursor = res.nextCursor;
  }
  throw new CheckFailed("session/list: more than 100 pages");
};

/** Waits until `adapter` has received `expected.length` characters of agent text of `sessionId` since `from`, then a little more (to see duplicates). */
const settledText = async (adapter, sessionId, from, expected, what) => {
  await waitFor(
    () => textOf(adapter.updatesOf(sessionId, from)).length >= expected.length,
    () =>
      `${adapter.name}: ${what} (${expected.length} characters; got ${
        textOf(adapter.updatesOf(sessionId, from)).length
      }, ending ${JSON.stringify(textOf(adapter.updatesOf(sessionId, from)).slice(-80))})`,
  );
  await sleep(400);
  return textOf(adapter.updatesOf(sessionId, from));
};

const firstChunk = (adapter, sessionId, from, what = "the first agent_message_chunk") =>
  adapter.waitUpdate(sessionId, isKind("agent_message_chunk"), what, from);

// ---------------------------------------------------------------------------
// Scenarios

const scenarios = [];
const define = (letter, name, run) => scenarios.push({ letter, name, run });

define("a", "initialize, session/new, prompt, stdout hygiene", async () => {
  const a = new Adapter("a");
  const init = await a.initialize();
  check(init.protocolVersion === 1, "initialize: protocolVersion 1", init);
  const caps = init.agentCapabilities ?? {};
  check(caps.loadSession === true, "initialize: loadSession true", caps);
  const pc = caps.promptCapabilities ?? {};
  check(
    pc.image !== true && pc.audio !== true && pc.embeddedContext === true,
    "initialize: promptCapabilities image false, audio false, embeddedContext true",
    pc,
  );
  if (pc.image !== false || pc.audio !== false) note(`promptCapabilities image/audio are not explicitly false: ${show(pc)}`);
  const sc = caps.sessionCapabilities ?? {};
  check(
    ["list", "resume", "close", "delete"].every((k) => sc[k] !== null && typeof sc[k] === "object"),
    "initialize: sessionCapabilities list, resume, close, delete",
    sc,
  );
  check(
    init.agentInfo?.name === "pi-server" && typeof init.agentInfo.version === "string" && init.agentInfo.version,
    `initialize: agentInfo pi-server ${init.agentInfo?.version}`,
    init.agentInfo,
  );
  check(caps._meta?.pi?.steer === "_pi/steer", "initialize: agentCapabilities._meta.pi.steer is _pi/steer", caps._meta);

  const cwd = workDir("a");
  const created = await a.newSession(cwd);
  check(typeof created.sessionId === "string" && created.sessionId.length > 0, `session/new returns a sessionId (${created.sessionId})`, created);
  checkConfigOptions(created.configOptions, { model: "faux/faux-1", level: "off", levels: ["off"] }, "session/new");
  const s = created.sessionId;

  const text = "hello acp world";
  const from = a.updates.length;
  const done = await a.prompt(s, text);
  check(done.stopReason === "end_turn", "session/prompt answers end_turn", done);
  await sleep(100);
  const ups = a.updatesOf(s, from);
  const chunks = ups.filter(isKind("agent_message_chunk"));
  const reply = textOf(ups);
  check(chunks.length >= 3 && reply.includes(text), `agent_message_chunk texts (${chunks.length}) contain the prompt text`, reply);
  check(reply === fauxReply(text), "the streamed reply is the whole faux reply, exactly once", textDetail(reply, fauxReply(text)));
  check(!ups.some(isKind("user_message_chunk")), "no user_message_chunk echoes the client's own prompt", ups.filter(isKind("user_message_chunk")));
  const usage = ups.filter(isKind("usage_update"));
  note(usage.length ? `usage_update seen: ${show(usage.at(-1).update)}` : "no usage_update during the turn");

  // Resource blocks are accepted.
  const blocks = [
    { type: "text", text: "with context" },
    { type: "resource_link", uri: `file://${cwd}/notes.txt`, name: "notes.txt" },
    { type: "resource", resource: { uri: `file://${cwd}/inline.txt`, mimeType: "text/plain", text: "inline text" } },
  ];
  const withResources = await a.prompt(s, blocks);
  check(withResources.stopReason === "end_turn", "a prompt with resource_link and embedded text resource blocks answers end_turn", withResources);

  // Non-empty mcpServers are accepted.
  const withMcp = await a.newSession(cwd, [{ name: "example", command: "/bin/true", args: [], env: [] }]);
  check(typeof withMcp.sessionId === "string", "session/new with a non-empty mcpServers is accepted", withMcp);

  // Image blocks are refused with -32602.
  const image = await a.reqError(
    acp.methods.agent.session.prompt,
    { sessionId: s, prompt: [{ type: "image", mimeType: "image/png", data: "iVBORw0KGgo=" }] },
    "an image block",
  );
  check(image.code === -32602, "an image block is refused with -32602", { code: image.code, message: image.message, data: image.data });

  // stdout carries JSON-RPC lines only.
  check(a.raw.some((e) => e.dir === "<") && a.nonJson.length === 0, "every stdout line of the adapter is a JSON-RPC message", a.nonJson);

  // An editor closes the adapter's stdin; it must exit by itself.
  a.child.stdin.end();
  const status = await within(a.exited, "the adapter to exit after its stdin closed", 5000);
  check(true, `the adapter exits when stdin closes (${show(status)})`);
});

define("b", "tool call", async () => {
  const a = await Adapter.open("b");
  const { sessionId: s } = await a.newSession(workDir("b"));
  const from = a.updates.length;
  const done = await a.prompt(s, "!echo hi");
  check(done.stopReason === "end_turn", "the tool prompt answers end_turn", done);
  await sleep(100);
  const ups = a.updatesOf(s, from);
  const call = ups.find(isKind("tool_call"));
  check(call, "a tool_call update", ups.map((u) => u.update.sessionUpdate));
  const tc = call.update;
  check(tc.kind === "execute", "the tool_call's kind is execute", tc);
  check(typeof tc.title === "string" && tc.title.includes("echo"), `the tool_call's title names the command (${tc.title})`, tc);
  check(tc.status === undefined || tc.status === "pending" || tc.status === "in_progress", "the tool_call's status is pending or in_progress", tc);
  const updates = ups.filter((u) => u.update.sessionUpdate === "tool_call_update" && u.update.toolCallId === tc.toolCallId);
  const completed = updates.find((u) => u.update.status === "completed");
  check(completed, "a tool_call_update with the same toolCallId and status completed", updates.map((u) => u.update));
  check(JSON.stringify(completed.update.content ?? []).includes("hi"), "the completed tool_call_update's content holds the output hi", completed.update);
  check(
    ups.indexOf(call) < ups.indexOf(completed),
    "tool_call precedes its completed tool_call_update",
  );
  const reply = textOf(ups);
  check(reply.includes("hi"), `the agent answers with the result (${JSON.stringify(reply)})`, reply);
  if (a.permissions.length) note(`the adapter asked for permission ${a.permissions.length} time(s): ${show(a.permissions[0])}`);
});

define("c", "thinking: model and thought level", async () => {
  const a = await Adapter.open("c");
  const { sessionId: s } = await a.newSession(workDir("c"));
  const m = await a.req(acp.methods.agent.session.setConfigOption, { sessionId: s, configId: "model", value: "faux/faux-reasoner" });
  checkConfigOptions(
    m.configOptions,
    { model: "faux/faux-reasoner", level: optionById(m.configOptions, "thought_level")?.currentValue, levels: ["off", "minimal", "low", "medium", "high"] },
    "set model faux/faux-reasoner",
  );
  const t = await a.req(acp.methods.agent.session.setConfigOption, { sessionId: s, configId: "thought_level", value: "high" });
  checkConfigOptions(
    t.configOptions,
    { model: "faux/faux-reasoner", level: "high", levels: ["off", "minimal", "low", "medium", "high"] },
    "set thought_level high",
  );
  const bad = await a.reqError(
    acp.methods.agent.session.setConfigOption,
    { sessionId: s, configId: "thought_level", value: "ultra" },
    "an unknown thought level",
  );
  check(bad.code === -32602, "an unknown thought level is refused with -32602", { code: bad.code, message: bad.message });
  const text = "think about this";
  const from = a.updates.length;
  const done = await a.prompt(s, text);
  check(done.stopReason === "end_turn", "the reasoning prompt answers end_turn", done);
  await sleep(100);
  const ups = a.updatesOf(s, from);
  const thought = textOf(ups, "agent_thought_chunk");
  check(thought.length > 0, `agent_thought_chunk(s) stream thinking (${JSON.stringify(thought)})`, ups.map((u) => u.update.sessionUpdate));
  check(textOf(ups) === fauxReply(text), "agent_message_chunk(s) stream the whole reply", textDetail(textOf(ups), fauxReply(text)));
  check(
    ups.findIndex(isKind("agent_thought_chunk")) < ups.findIndex(isKind("agent_message_chunk")),
    "the thinking comes before the text",
  );
  // Back to the default (the last model chosen becomes the default of new sessions).
  await a.req(acp.methods.agent.session.setConfigOption, { sessionId: s, configId: "thought_level", value: "off" });
  const back = await a.req(acp.methods.agent.session.setConfigOption, { sessionId: s, configId: "model", value: "faux/faux-1" });
  checkConfigOptions(back.configOptions, { model: "faux/faux-1", level: "off", levels: ["off"] }, "set model back to faux/faux-1");
});

define("d", "cancel and steer", async () => {
  const a = await Adapter.open("d");
  const { sessionId: s } = await a.newSession(workDir("d"));
  const from = a.updates.length;
  const pending = a.prompt(s, `d ${longText(60)}`);
  await firstChunk(a, s, from);
  const t0 = Date.now();
  await a.agent.notify(acp.methods.agent.session.cancel, { sessionId: s });
  const done = await within(pending, "the cancelled prompt to answer", 5000);
  check(done.stopReason === "cancelled", `session/cancel → stopReason cancelled (after ${Date.now() - t0} ms)`, done);
  const again = await a.prompt(s, "after the cancel");
  check(again.stopReason === "end_turn", "the next prompt after a cancel answers end_turn", again);

  // _pi/steer during a turn, and outside a turn.
  const steerText = "steer now please";
  const from2 = a.updates.length;
  const p2 = a.prompt(s, `d2 ${longText(25)}`);
  await firstChunk(a, s, from2);
  const steered = await a.req("_pi/steer", { sessionId: s, prompt: steerText });
  check(true, `_pi/steer during a turn succeeds (${show(steered)})`);
  const done2 = await p2;
  check(done2.stopReason === "end_turn", "the steered prompt answers end_turn", done2);
  await sleep(100);
  const text2 = textOf(a.updatesOf(s, from2));
  check(text2.includes(`You said: ${steerText}.`), "the steered turn answers the steering message too", text2);
  const idle = await a.reqError("_pi/steer", { sessionId: s, prompt: "nothing runs" }, "_pi/steer outside a turn");
  check(true, `_pi/steer outside a turn is an error (${idle.code} ${idle.message})`);
});

define("e", "session/list", async () => {
  const a = await Adapter.open("e");
  const cwd1 = workDir("e1");
  const cwd2 = workDir("e2");
  const { sessionId: s1 } = await a.newSession(cwd1);
  const { sessionId: s2 } = await a.newSession(cwd2);
  await a.prompt(s1, "list me");
  const all = await listAll(a);
  const e1 = all.find((x) => x.sessionId === s1);
  const e2 = all.find((x) => x.sessionId === s2);
  check(e1 && e2, "session/list shows both created sessions", all.map((x) => x.sessionId));
  check(e1.cwd === cwd1 && e2.cwd === cwd2, "the listed sessions carry their cwd", [e1, e2]);
  note(`listed entry: ${show(e1)}`);
  const filtered = await listAll(a, { cwd: cwd1 });
  check(
    filtered.some((x) => x.sessionId === s1) && !filtered.some((x) => x.sessionId === s2) && filtered.every((x) => x.cwd === cwd1),
    "session/list {cwd} shows only the sessions of that cwd",
    filtered,
  );
  // An unnamed session is titled by its first prompt, once the server has
  // read it back from the session's files.
  let titled;
  for (let i = 0; i < 100 && !titled; i++) {
    titled = (await listAll(a, { cwd: cwd1 })).find((x) => x.sessionId === s1 && x.title === "list me");
    if (!titled) await sleep(50);
  }
  check(titled, "an unnamed session is titled by its first prompt", await listAll(a, { cwd: cwd1 }));
});

define("f", "session/load after the adapter was SIGKILLed mid-turn", async () => {
  const a = await Adapter.open("f-A");
  const cwd = workDir("f");
  const { sessionId: s } = await a.newSession(cwd);
  const text = `f ${longText(80)}`;
  const expected = fauxReply(text);
  a.prompt(s, text);
  await firstChunk(a, s, 0);
  a.kill("SIGKILL");
  await within(a.exited, "adapter A to exit");
  check(true, "adapter A is SIGKILLed after the first chunk");

  const b = await Adapter.open("f-B");
  const from = b.updates.length;
  const load = await b.call(acp.methods.agent.session.load, { sessionId: s, cwd, mcpServers: [] });
  check(load.answeredAt >= 0, "session/load answers", load.result);
  const replay = b.rawUpdates(s, load.sentAt, load.answeredAt);
  const userChunk = replay.findIndex(isKind("user_message_chunk"));
  check(userChunk >= 0 && textOf(replay, "user_message_chunk").includes(text), "the replay (before the load response) holds the prompt as user_message_chunk", replay.map((u) => u.update));
  const firstAgent = replay.findIndex(isKind("agent_message_chunk"));
  check(firstAgent < 0 || firstAgent > userChunk, "the replayed user message precedes the agent text");
  note(`B's replay: ${replay.length} updates, ${replay.filter(isKind("agent_message_chunk")).length} agent_message_chunk, replayed agent text ${JSON.stringify(textOf(replay))}`);
  const got = await settledText(b, s, from, expected, "the whole reply (replay + live)");
  const live = b.rawUpdates(s, load.answeredAt + 1).filter(isKind("agent_message_chunk"));
  check(live.length > 0, `the agent text continues live after the load response (${live.length} live chunks)`);
  check(textOf(replay).length > 0 && expected.startsWith(textOf(replay)), "the replay holds the reply so far", textDetail(textOf(replay), expected));
  check(live.length > 1, `the rest streams, not one chunk at the turn's end (${live.length} live chunks)`);
  note(`B's first agent_message_chunk after the load response: ${JSON.stringify(live[0]?.update.content?.text)}`);
  check(got === expected, "B's agent text of the turn (replay + live) is the whole reply exactly once", textDetail(got, expected));

  const c = await Adapter.open("f-C");
  const load2 = await c.call(acp.methods.agent.session.load, { sessionId: s, cwd, mcpServers: [] });
  const replay2 = c.rawUpdates(s, load2.sentAt, load2.answeredAt);
  check(textOf(replay2) === expected, "a later session/load replays the same whole reply", textDetail(textOf(replay2), expected));
  check(textOf(replay2, "user_message_chunk").includes(text), "a later session/load replays the prompt");
});

// The editor's MCP servers: the reference server from npm (tests/mcp).
const everything = path.resolve(
  path.dirname(new URL(import.meta.url).pathname),
  "../mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
);
const editorMcp = [{ name: "everything", command: "node", args: [everything, "stdio"], env: [] }];

define("l", "the editor's MCP servers: offered, called, and kept by a turn that outlives the editor", async () => {
  const a = await Adapter.open("l-A");
  const cwd = workDir("l");
  const absent = { name: "absent", command: "no-such-mcp-server", args: [], env: [] };
  const { sessionId: s } = await a.newSession(cwd, [...editorMcp, absent]);
  const from = a.updates.length;
  const done = await a.prompt(s, "!mcp__everything__echo message=from-the-editor");
  check(done.stopReason === "end_turn", "the MCP tool prompt answers end_turn", done);
  await sleep(100);
  const ups = a.updatesOf(s, from);
  const notice = textOf(ups).indexOf('⚠ MCP server "absent" failed to start');
  check(notice >= 0 && notice < textOf(ups).indexOf("The mcp__everything__echo tool"), "a server that cannot start is told to the editor before the turn", textOf(ups));
  const call = ups.find(isKind("tool_call"));
  check(call && call.update.title.includes("mcp__everything__echo"), "a tool_call update names the MCP tool", ups.map((u) => u.update));
  const completed = ups.find((u) => u.update.sessionUpdate === "tool_call_update" && u.update.toolCallId === call.update.toolCallId && u.update.status === "completed");
  check(completed && JSON.stringify(completed.update.content ?? []).includes("from-the-editor"), "the MCP tool's result reaches the editor", completed?.update);
  check(textOf(ups).includes("finished"), `the model is sent the result (${JSON.stringify(textOf(ups))})`, textOf(ups));

  // The editor goes away in the middle of a long MCP call; the turn goes on.
  a.prompt(s, "!mcp__everything__trigger-long-running-operation duration=2 steps=2");
  await waitFor(() => a.updatesOf(s, from).filter(isKind("tool_call")).length >= 2, "the long MCP call to start");
  a.kill("SIGKILL");
  await within(a.exited, "adapter A to exit");
  await sleep(3000);
  const b = await Adapter.open("l-B");
  const load = await b.call(acp.methods.agent.session.load, { sessionId: s, cwd, mcpServers: editorMcp });
  const replay = b.rawUpdates(s, load.sentAt, load.answeredAt);
  const long = replay.filter((u) => u.update.sessionUpdate === "tool_call_update" && u.update.status === "completed");
  check(
    long.some((u) => JSON.stringify(u.update.content ?? []).includes("Long running operation completed")),
    "the long MCP call completed with no editor attached",
    replay.map((u) => u.update),
  );
  check(textOf(replay).includes("The mcp__everything__trigger-long-running-operation tool finished"), "and the turn answered after it", textOf(replay));
});

define("g", "two adapters on one session", async () => {
  const a = await Adapter.open("g-A");
  const b = await Adapter.open("g-B");
  const cwd = workDir("g");
  const created = await a.newSession(cwd);
  const s = created.sessionId;
  await b.req(acp.methods.agent.session.load, { sessionId: s, cwd, mcpServers: [] });
  check(true, "B loads A's session");
  const text = `g ${longText(50)}`;
  const expected = fauxReply(text);
  const aFrom = a.updates.length;
  const bFrom = b.updates.length;
  const pa = a.prompt(s, text);
  await waitFor(
    () => textOf(b.updatesOf(s, bFrom), "user_message_chunk").includes(text),
    "B: a user_message_chunk with A's prompt text",
  );
  check(true, "B receives a user_message_chunk with A's prompt text");
  await firstChunk(b, s, bFrom, "agent chunks of A's turn");
  check(true, "B receives agent_message_chunk(s) of A's turn");
  const busy = await b.reqError(
    acp.methods.agent.session.prompt,
    { sessionId: s, prompt: [{ type: "text", text: "g from B while busy" }] },
    "B's prompt during A's turn",
  );
  check(String(busy.message).toLowerCase().includes("busy"), `B's prompt during A's turn is refused busy (${busy.code} ${busy.message})`, { code: busy.code, message: busy.message, data: busy.data });
  const done = await pa;
  check(done.stopReason === "end_turn", "A's prompt answers end_turn", done);
  const got = await settledText(b, s, bFrom, expected, "the whole reply of A's turn");
  check(got === expected, "B receives A's whole reply exactly once", textDetail(got, expected));
  check(textOf(a.updatesOf(s, aFrom)) === expected, "A receives its whole reply exactly once", textDetail(textOf(a.updatesOf(s, aFrom)), expected));
  check(!a.updatesOf(s, aFrom).some(isKind("user_message_chunk")), "A gets no user_message_chunk of its own prompt");
  const bRejected = textOf(a.updatesOf(s, aFrom), "user_message_chunk") + textOf(b.updatesOf(s, bFrom), "user_message_chunk");
  check(!bRejected.includes("while busy"), "the refused prompt is not shown as a user message");

  // A model other than the current one (new sessions start on the last model chosen).
  const currentModel = optionById(created.configOptions, "model")?.currentValue;
  const target = currentModel === "faux/faux-reasoner" ? "faux/faux-tiny" : "faux/faux-reasoner";
  const targetLevels = target === "faux/faux-reasoner" ? ["off", "minimal", "low", "medium", "high"] : ["off"];
  const bFrom2 = b.updates.length;
  const changed = await a.req(acp.methods.agent.session.setConfigOption, { sessionId: s, configId: "model", value: target });
  check(optionById(changed.configOptions, "model")?.currentValue === target, `A switches the model from ${currentModel} to ${target}`, changed);
  const upd = await b.waitUpdate(
    s,
    (u) => u.update.sessionUpdate === "config_option_update" && optionById(u.update.configOptions, "model")?.currentValue === target,
    `a config_option_update with the new model ${target}`,
    bFrom2,
  );
  check(true, `B receives config_option_update with model ${target}`);
  checkConfigOptions(upd.update.configOptions, { model: target, level: optionById(upd.update.configOptions, "thought_level")?.currentValue, levels: targetLevels }, "config_option_update");
  await sleep(200);
  if (a.updatesOf(s, aFrom).some(isKind("config_option_update"))) note("A (which made the change) also got a config_option_update");

  const aFrom2 = a.updates.length;
  const fromB = "g from B when idle";
  const doneB = await b.prompt(s, fromB);
  check(doneB.stopReason === "end_turn", "B's prompt (idle) answers end_turn", doneB);
  await waitFor(() => textOf(a.updatesOf(s, aFrom2), "user_message_chunk").includes(fromB), "A: a user_message_chunk with B's prompt");
  await settledText(a, s, aFrom2, fauxReply(fromB), "B's reply");
  check(textOf(a.updatesOf(s, aFrom2)) === fauxReply(fromB), "A receives B's prompt and whole reply", textDetail(textOf(a.updatesOf(s, aFrom2)), fauxReply(fromB)));
});

define("h", "server replacement (hand-over) mid-prompt", async () => {
  const a = await Adapter.open("h");
  const { sessionId: s } = await a.newSession(workDir("h"));
  const text = `h ${longText(80)}`;
  const from = a.updates.length;
  const pending = a.prompt(s, text, 60_000);
  await firstChunk(a, s, from);
  const status = await server.replace();
  check(true, `a second serve took over; the old server exited (${show(status)})`);
  const done = await within(pending, "the prompt to answer after the hand-over", 30_000);
  check(done.stopReason === "end_turn", "the prompt answers end_turn across the hand-over", done);
  const got = await settledText(a, s, from, fauxReply(text), "the whole reply");
  check(got === fauxReply(text), "the reply text is whole, without gaps or duplicates", textDetail(got, fauxReply(text)));
  const again = await a.prompt(s, "after the hand-over");
  check(again.stopReason === "end_turn", "the next prompt after the hand-over answers end_turn", again);
});

define("i", "server crash (SIGKILL) mid-prompt", async () => {
  const a = await Adapter.open("i");
  const { sessionId: s } = await a.newSession(workDir("i"));
  const text = `i ${longText(80)}`;
  const expected = fauxReply(text);
  const from = a.updates.length;
  const pending = a.prompt(s, text, 60_000);
  await firstChunk(a, s, from);
  await server.crash();
  check(true, "the server is SIGKILLed mid-prompt");
  const pause = Number(process.env.ACP_CRASH_RESTART_DELAY_MS) || 0;
  if (pause > 0) await sleep(pause);
  server.start();
  await server.ready();
  check(true, "a new serve with the same id runs");
  const done = await within(pending, "the prompt to answer after the crash", 30_000);
  check(["end_turn", "cancelled"].includes(done.stopReason), `the prompt answers after the crash (${done.stopReason})`, done);
  await sleep(400);
  const got = textOf(a.updatesOf(s, from));
  if (done.stopReason === "end_turn") {
    check(got === expected, "end_turn after the crash: the reply text is whole, without gaps or duplicates", textDetail(got, expected));
  } else {
    check(expected.startsWith(got), "cancelled after the crash: the text received is a prefix of the reply (no duplicates)", textDetail(got, expected));
  }
  const again = await a.prompt(s, "after the crash");
  check(again.stopReason === "end_turn", "the next prompt after the crash answers end_turn", again);
});

define("j", "bad input on a raw adapter", async () => {
  const r = new RawAdapter("j");
  const init = (id) => ({ jsonrpc: "2.0", id, method: "initialize", params: { protocolVersion: 1, clientCapabilities: {} } });
  const stillServes = async (id, after) => {
    const res = await r.request(init(id), `initialize after ${after}`);
    check(res.result?.protocolVersion === 1, `after ${after} the adapter still answers initialize`, res);
  };
  const from = r.send("not json");
  const parse = await waitFor(
    () => r.raw.slice(from).find((e) => e.msg && e.msg.id === null && e.msg.error)?.msg,
    "j: a -32700 response to a non-JSON line",
  );
  check(parse.error.code === -32700 && parse.id === null, "a non-JSON line → -32700 with id null", parse);
  await stillServes(1, "the non-JSON line");

  const nope = await r.request({ jsonrpc: "2.0", id: 2, method: "nope", params: {} });
  check(nope.error?.code === -32601, "an unknown method → -32601", nope);
  await stillServes(3, "the unknown method");

  const noCwd = await r.request({ jsonrpc: "2.0", id: 4, method: "session/new", params: { mcpServers: [] } });
  check(noCwd.error?.code === -32602 && String(noCwd.error.message).includes("cwd"), "session/new without cwd → -32602 naming cwd in the message", noCwd);
  await stillServes(5, "the invalid params");

  const ghost = "00000000-0000-4000-8000-00000000dead";
  const unknown = await r.request({
    jsonrpc: "2.0",
    id: 6,
    method: "session/prompt",
    params: { sessionId: ghost, prompt: [{ type: "text", text: "hi" }] },
  });
  check(
    unknown.error && [-32002, -32602].includes(unknown.error.code) && String(unknown.error.message).includes(ghost),
    `session/prompt on an unknown session → an error naming it (${unknown.error?.code})`,
    unknown,
  );
  await stillServes(7, "the unknown session");

  const created = await r.request({ jsonrpc: "2.0", id: 8, method: "session/new", params: { cwd: workDir("j"), mcpServers: [] } });
  check(typeof created.result?.sessionId === "string", "session/new on the raw adapter", created);
  const audio = await r.request({
    jsonrpc: "2.0",
    id: 9,
    method: "session/prompt",
    params: { sessionId: created.result.sessionId, prompt: [{ type: "audio", mimeType: "audio/wav", data: "UklGRg==" }] },
  });
  check(audio.error?.code === -32602, "an audio block → -32602", audio);
  const badPrompt = await r.request({ jsonrpc: "2.0", id: 10, method: "session/prompt", params: { sessionId: created.result.sessionId } });
  check(badPrompt.error?.code === -32602 && String(badPrompt.error.message).includes("prompt"), "session/prompt without prompt → -32602 naming prompt", badPrompt);
  const ids = await r.request({ jsonrpc: "2.0", id: "str-id", method: "session/list", params: {} });
  check(ids.id === "str-id" && Array.isArray(ids.result?.sessions), "a string request id is echoed", ids);
  await stillServes(11, "the refused prompts");
  check(r.nonJson.length === 0, "every stdout line of the raw adapter is a JSON-RPC message", r.nonJson);
});

define("k", "resume, close, delete", async () => {
  const a = await Adapter.open("k-A");
  const cwd = workDir("k");
  const { sessionId: s } = await a.newSession(cwd);
  const first = await a.prompt(s, "k hello");
  check(first.stopReason === "end_turn", "A's first prompt answers end_turn", first);

  const b = await Adapter.open("k-B");
  const resumed = await b.call(acp.methods.agent.session.resume, { sessionId: s, cwd, mcpServers: [] });
  const before = b.rawUpdates(s, resumed.sentAt, resumed.answeredAt);
  check(before.length === 0, "session/resume answers with no session/update before its response (no replay)", before.map((u) => u.update));
  await sleep(300);
  check(b.updatesOf(s).length === 0, "and no replay after it either", b.updatesOf(s).map((u) => u.update));
  const bFrom = b.updates.length;
  const viaB = await b.prompt(s, "k after resume");
  check(viaB.stopReason === "end_turn" && textOf(b.updatesOf(s, bFrom)) === fauxReply("k after resume"), "the resumed session prompts and streams", textOf(b.updatesOf(s, bFrom)));

  const closed = await b.call(acp.methods.agent.session.close, { sessionId: s });
  check(b.raw[closed.answeredAt]?.msg && "result" in b.raw[closed.answeredAt].msg, "session/close answers a result (not an error)", b.raw[closed.answeredAt]?.msg);
  const bAfterClose = b.updates.length;
  const rawAfterClose = b.raw.length;
  const second = await a.prompt(s, "k after close");
  check(second.stopReason === "end_turn", "A prompts after B closed", second);
  await sleep(400);
  check(
    b.updatesOf(s, bAfterClose).length === 0 && b.rawUpdates(s, rawAfterClose).length === 0,
    "the closed connection receives no more updates of the session",
    b.updatesOf(s, bAfterClose).map((u) => u.update),
  );

  await a.req(acp.methods.agent.session.close, { sessionId: s });
  const deleted = await b.call(acp.methods.agent.session.delete, { sessionId: s });
  check(b.raw[deleted.answeredAt]?.msg && "result" in b.raw[deleted.answeredAt].msg, "session/delete answers a result (not an error)", b.raw[deleted.answeredAt]?.msg);
  const listed = await listAll(b);
  check(!listed.some((x) => x.sessionId === s), "the deleted session is gone from session/list", listed.map((x) => x.sessionId));
  const gone = await b.reqError(acp.methods.agent.session.load, { sessionId: s, cwd, mcpServers: [] }, "session/load of a deleted session");
  check(true, `session/load of the deleted session is an error (${gone.code} ${gone.message})`);
});

// ---------------------------------------------------------------------------
// Running

/** SIGKILLs the children of this script that still run (by their handles, so never a reused pid). */
function killSpawned() {
  for (const child of spawned) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }
}

const failures = [];
const started = Date.now();
const watchdog = setTimeout(() => {
  console.error("acp: the whole run exceeded 10 minutes");
  killSpawned();
  process.exit(1);
}, 10 * 60_000);

const dumpFailure = (name, error) => {
  console.log(`FAIL - ${name}: ${error instanceof CheckFailed ? error.message : error?.stack ?? error}`);
  if (error && !(error instanceof CheckFailed) && error.code !== undefined) {
    console.log(`  JSON-RPC error: ${show({ code: error.code, message: error.message, data: error.data })}`);
  }
  for (const adapter of scenario?.adapters ?? []) {
    console.log(`---- JSON exchanged with adapter ${adapter.name} (pid ${adapter.child.pid}, ${show(adapter.exitedAt ?? "running")}) ----`);
    console.log(adapter.transcript());
    console.log(`---- stderr of adapter ${adapter.name} (${adapter.stderrPath}), last lines ----`);
    console.log(tail(adapter.stderrPath, 15));
  }
  console.log(`---- server log (${serverLog}), last lines ----`);
  console.log(tail(serverLog, 25));
  console.log("---- end ----");
};

for (const sc of scenarios) {
  if (only && !only.has(sc.letter)) continue;
  if (skip.has(sc.letter)) {
    console.log(`# scenario ${sc.letter}. ${sc.name}: SKIPPED (ACP_SKIP)`);
    continue;
  }
  const name = `${sc.letter}. ${sc.name}`;
  console.log(`# scenario ${name}`);
  scenario = { name, adapters: [] };
  try {
    await server.ensure();
    await sc.run();
    await sleep(50);
    for (const adapter of scenario.adapters) {
      check(adapter.nonJson.length === 0, `${adapter.name}: stdout carried JSON-RPC lines only`, adapter.nonJson);
      check(adapter.schemaErrors.length === 0, `${adapter.name}: every session/update and response matches the ACP v1 schema`, adapter.schemaErrors);
      if (adapter instanceof Adapter) {
        const raw = adapter.raw.filter((e) => e.dir === "<" && e.msg?.method === "session/update").length;
        check(adapter.updates.length === raw, `${adapter.name}: the SDK delivered all ${raw} session/update notifications`, { delivered: adapter.updates.length, raw });
      }
    }
    console.log(`# scenario ${sc.letter} passed`);
  } catch (error) {
    failures.push(name);
    dumpFailure(name, error);
    if (!KEEP_GOING) break;
  } finally {
    await Promise.all(scenario.adapters.map((adapter) => adapter.dispose()));
  }
}

await server.stop();
killSpawned();
clearTimeout(watchdog);
const secs = ((Date.now() - started) / 1000).toFixed(1);
if (failures.length > 0) {
  console.log(`acp: ${failures.length} scenario(s) failed in ${secs} s: ${failures.join("; ")}`);
  process.exit(1);
}
console.log(`acp: all checks passed (${secs} s)`);
process.exit(0);
