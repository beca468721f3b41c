// PiConnection (io/daemon/src/web/assets/conn.js) against an in-memory fake
// WebSocket and a fake clock: handshake, queued requests, responses, events,
// refusals, reconnection with backoff, in-flight rejection, malformed frames.
//
// Run: node --test tests/web/

import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";

import { decodeFrame, encode, encodeFrame } from "../../io/daemon/src/web/assets/codec.js";
import { PiConnection, PiError } from "../../io/daemon/src/web/assets/conn.js";

const vectors = JSON.parse(fs.readFileSync(new URL("../../kernel/tests/vectors/cbor.json", import.meta.url), "utf8"));

/** @param {Uint8Array} bytes */
function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** @param {Uint8Array} bytes an ArrayBuffer holding exactly `bytes`, as a browser delivers it */
function arrayBuffer(bytes) {
  return bytes.slice().buffer;
}

/** A decoded value with plain objects for its (null-prototype) maps, keys in order. */
function plain(value) {
  if (Array.isArray(value)) return value.map(plain);
  if (value === null || typeof value !== "object" || value instanceof Uint8Array) return value;
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
}

/** Timers that run only when the test advances the clock. */
class FakeClock {
  now = 0;
  #next = 1;
  /** @type {Map<number, { at: number, fn: () => void }>} */
  timers = new Map();

  setTimeout = (fn, ms) => {
    const id = this.#next++;
    this.timers.set(id, { at: this.now + ms, fn });
    return id;
  };

  clearTimeout = (id) => {
    this.timers.delete(id);
  };

  /** Delays of the pending timers, from now. */
  pending() {
    return [...this.timers.values()].map((t) => t.at - this.now).sort((a, b) => a - b);
  }

  /** Moves time forward, running every timer due on the way, in order. */
  advance(ms) {
    const target = this.now + ms;
    for (;;) {
      let due = null;
      for (const [id, timer] of this.timers) {
        if (timer.at <= target && (due === null || timer.at < due[1].at)) due = [id, timer];
      }
      if (due === null) break;
      this.timers.delete(due[0]);
      this.now = due[1].at;
      due[1].fn();
    }
    this.now = target;
  }
}

/** A WebSocket class whose instances the test drives by hand. */
function fakeWebSocket() {
  /** @type {FakeSocket[]} */
  const sockets = [];
  class FakeSocket {
    constructor(url) {
      this.url = url;
      this.binaryType = "blob";
      /** @type {Uint8Array[]} */
      this.raw = [];
      this.closed = false;
      this.onopen = this.onmessage = this.onerror = this.onclose = null;
      sockets.push(this);
    }

    send(data) {
      if (this.closed) throw new Error("WebSocket is already in CLOSING or CLOSED state");
      assert.ok(data instanceof Uint8Array, "sends bytes");
      this.raw.push(data);
    }

    close() {
      this.closed = true;
    }

    /** Every message sent, decoded as one whole frame. */
    get sent() {
      return this.raw.map((bytes) => plain(decodeFrame(bytes)));
    }

    /** Requests sent, as plain objects. */
    get requests() {
      return this.sent.filter((m) => m.type === "request");
    }

    // The server's side.
    open() {
      this.onopen?.({ type: "open" });
    }

    deliver(message) {
      this.deliverBytes(encodeFrame(message));
    }

    deliverBytes(bytes) {
      this.onmessage?.({ data: arrayBuffer(bytes) });
    }

    drop(code = 1006) {
      this.closed = true;
      this.onclose?.({ code, reason: "" });
    }

    error() {
      this.closed = true;
      this.onerror?.({ type: "error" });
      this.onclose?.({ code: 1006, reason: "" });
    }
  }
  return { FakeSocket, sockets };
}

const SNAPSHOT = { serverId: "srv-1", protocolVersion: 1, revision: 0, sessions: [], models: [] };

function serverHello(connectionId = "conn-1") {
  return { type: "hello", version: 1, connectionId, snapshot: SNAPSHOT };
}

/** A connection wired to fakes, recording its states and events. */
function harness(options = {}) {
  const clock = new FakeClock();
  const { FakeSocket, sockets } = fakeWebSocket();
  const states = [];
  const events = [];
  const conn = new PiConnection({
    url: "ws://127.0.0.1:1/socket",
    token: "s3cr3t",
    onEvent: (event) => events.push(event),
    onState: (state, detail) => states.push([state, detail]),
    WebSocket: FakeSocket,
    timers: clock,
    ...options,
  });
  return {
    conn,
    clock,
    sockets,
    states,
    events,
    get socket() {
      return sockets[sockets.length - 1];
    },
    /** Starts and completes the first handshake. */
    ready(connectionId = "conn-1") {
      conn.start();
      this.socket.open();
      this.socket.deliver(serverHello(connectionId));
      return this.socket;
    },
    lastState() {
      return states[states.length - 1];
    },
  };
}

/** Settles a promise now-ish: its outcome, or "pending". */
async function outcome(promise) {
  const marker = Symbol("pending");
  const result = await Promise.race([
    promise.then(
      (value) => ({ ok: value }),
      (error) => ({ err: error }),
    ),
    new Promise((resolve) => setImmediate(() => resolve(marker))),
  ]);
  return result === marker ? "pending" : result;
}

test("handshake: the hello goes first, with the token; the server hello opens", () => {
  const h = harness();
  assert.equal(h.conn.state, "idle");
  h.conn.start();
  assert.deepEqual(h.states, [["connecting", undefined]]);
  assert.equal(h.sockets.length, 1);
  assert.equal(h.socket.url, "ws://127.0.0.1:1/socket");
  assert.equal(h.socket.binaryType, "arraybuffer");
  assert.equal(h.socket.raw.length, 0, "nothing before the socket opens");
  h.socket.open();
  assert.deepEqual(h.socket.sent, [{ type: "hello", version: 1, token: "s3cr3t" }]);
  const vector = vectors.frames.find((f) => f.name === "v1 client hello with a token (our extension)");
  assert.equal(hex(h.socket.raw[0]), vector.hex, "byte-exact with the kernel's vector");
  assert.equal(h.conn.state, "connecting");

  h.socket.deliver(serverHello("conn-7"));
  assert.equal(h.conn.state, "open");
  const [state, detail] = h.lastState();
  assert.equal(state, "open");
  assert.equal(detail.reconnected, false);
  assert.equal(detail.hello.connectionId, "conn-7");
  assert.equal(h.conn.serverHello.connectionId, "conn-7");
  assert.deepEqual({ ...h.conn.serverHello.snapshot }, SNAPSHOT);
  assert.equal(h.conn.connectionId, "conn-7");
  assert.deepEqual(h.clock.pending(), [], "no timer left once open");
});

test("handshake: without a token the hello is the plain v1 hello", () => {
  const h = harness({ token: undefined });
  h.conn.start();
  h.socket.open();
  assert.equal(hex(h.socket.raw[0]), vectors.frames.find((f) => f.name === "v1 client hello").hex);
  h.conn.start(); // A no-op while connecting.
  assert.equal(h.sockets.length, 1);
});

test("requests made before the handshake are queued, then sent in order", async () => {
  const h = harness();
  const before = h.conn.request("list");
  h.conn.start();
  const during = h.conn.request("create", { cwd: "/work", name: undefined, model: { provider: "p", id: "m" } });
  h.socket.open();
  assert.equal(h.socket.requests.length, 0, "not before the server's hello");
  h.socket.deliver(serverHello());
  const sent = h.socket.requests;
  assert.deepEqual(sent, [
    { type: "request", id: "r1", request: { command: "list" } },
    { type: "request", id: "r2", request: { command: "create", cwd: "/work", model: { provider: "p", id: "m" } } },
  ]);
  // The command comes first, as in the reference; undefined fields are left out.
  assert.deepEqual(Object.keys(sent[1].request), ["command", "cwd", "model"]);
  assert.equal(await outcome(before), "pending");

  // Responses may come in any order.
  h.socket.deliver({ type: "response", id: "r2", ok: true, result: { command: "create", session: { id: "s1" } } });
  h.socket.deliver({ type: "response", id: "r1", ok: true, result: { command: "list", sessions: [] } });
  const r1 = await outcome(before);
  const r2 = await outcome(during);
  assert.deepEqual({ ...r1.ok }, { command: "list", sessions: [] });
  assert.equal(r2.ok.session.id, "s1");
});

test("a request when open goes out at once; ok:false rejects with code, message and details", async () => {
  const h = harness();
  const socket = h.ready();
  const prompt = h.conn.request("prompt", { sessionId: "s1", text: "hi" });
  assert.deepEqual(socket.requests, [{ type: "request", id: "r1", request: { command: "prompt", sessionId: "s1", text: "hi" } }]);
  socket.deliver({
    type: "response",
    id: "r1",
    ok: false,
    error: { code: "busy", message: "The session is busy", details: { phase: "turn" } },
  });
  const { err } = await outcome(prompt);
  assert.ok(err instanceof PiError);
  assert.ok(err instanceof Error);
  assert.equal(err.code, "busy");
  assert.equal(err.message, "The session is busy");
  assert.deepEqual({ ...err.details }, { phase: "turn" });
  // A response to nobody's request is ignored.
  socket.deliver({ type: "response", id: "r99", ok: true, result: { command: "list", sessions: [] } });
  assert.equal(h.conn.state, "open");
});

test("a request that cannot be encoded rejects without touching the connection", async () => {
  const h = harness();
  const socket = h.ready();
  const { err } = await outcome(h.conn.request("prompt", { sessionId: "s1", text: "\ud800" }));
  assert.equal(err.code, "invalid_request");
  assert.equal(err.details.kind, "invalid_utf8");
  assert.equal(socket.requests.length, 0);
  assert.equal(h.conn.state, "open");
});

test("events: onEvent gets every inner event payload", () => {
  const h = harness();
  const socket = h.ready();
  const inner = [
    { type: "server_snapshot", snapshot: SNAPSHOT },
    { type: "session_snapshot", snapshot: { id: "s1" } },
    { type: "session_progress", sessionId: "s1", progress: { type: "assistant_delta", delta: "x" } },
    { type: "session_removed", sessionId: "s1" },
  ];
  for (const event of inner) socket.deliver({ type: "event", event });
  assert.deepEqual(
    h.events.map((e) => e.type),
    ["server_snapshot", "session_snapshot", "session_progress", "session_removed"],
  );
  assert.equal(h.events[2].progress.delta, "x");
});

for (const code of ["auth", "version"]) {
  test(`hello_error ${code} fails for good: no reconnection, everything pending rejects`, async () => {
    const h = harness();
    const queued = h.conn.request("list");
    h.conn.start();
    h.socket.open();
    h.socket.deliver({ type: "hello_error", error: { code, message: "Invalid token" } });
    assert.equal(h.conn.state, "failed");
    assert.deepEqual(h.lastState(), ["failed", { code, message: "Invalid token" }]);
    assert.ok(h.socket.closed);
    assert.deepEqual(h.clock.pending(), [], "no retry scheduled");
    const { err } = await outcome(queued);
    assert.equal(err.code, code);
    const later = await outcome(h.conn.request("list"));
    assert.equal(later.err.code, code);
    h.clock.advance(60_000);
    assert.equal(h.sockets.length, 1);
  });
}

for (const code of ["auth", "version"]) {
  test(`a refusal (${code}) during reconnection fails too`, () => {
    const h = harness();
    h.ready();
    h.socket.drop();
    h.clock.advance(250);
    h.socket.open();
    h.socket.deliver({ type: "hello_error", error: { code, message: "Refused" } });
    assert.deepEqual(h.lastState(), ["failed", { code, message: "Refused" }]);
    assert.deepEqual(h.clock.pending(), []);
    h.clock.advance(60_000);
    assert.equal(h.sockets.length, 2);
  });
}

test("the first connection failing before its handshake fails (no reconnection)", async () => {
  for (const [how, code] of [
    ["error", "disconnected"],
    ["drop", "disconnected"],
    ["hello_error", "internal_error"],
    ["timeout", "timeout"],
    ["garbage", "protocol"],
  ]) {
    const h = harness();
    const queued = h.conn.request("list");
    h.conn.start();
    if (how === "error") h.socket.error();
    if (how === "drop") h.socket.drop();
    if (how !== "error" && how !== "drop") h.socket.open();
    if (how === "hello_error") h.socket.deliver({ type: "hello_error", error: { code, message: "Handshake timeout" } });
    if (how === "timeout") h.clock.advance(10_000);
    if (how === "garbage") h.socket.deliverBytes(Uint8Array.of(0, 0, 0, 1, 0xc0));
    assert.equal(h.conn.state, "failed", how);
    assert.equal(h.lastState()[1].code, code, how);
    assert.equal((await outcome(queued)).err.code, code, how);
    h.clock.advance(60_000);
    assert.equal(h.sockets.length, 1, `${how}: no retry`);

    // start() again begins afresh.
    h.conn.start();
    assert.equal(h.conn.state, "connecting");
    h.socket.open();
    h.socket.deliver(serverHello());
    assert.equal(h.lastState()[1].reconnected, false);
  }
});

test("a lost transport rejects what is in flight, keeps what is queued, and reconnects with backoff", async () => {
  const h = harness({ reconnect: { initialMs: 100, maxMs: 1000 } });
  const first = h.ready("conn-1");
  const inFlight = h.conn.request("prompt", { sessionId: "s1", text: "go" });
  first.drop();
  const { err } = await outcome(inFlight);
  assert.equal(err.code, "disconnected");
  assert.equal(h.conn.state, "reconnecting");
  assert.deepEqual(h.lastState(), ["reconnecting", { attempt: 1, inMs: 100 }]);

  const queued = h.conn.request("list");
  h.clock.advance(99);
  assert.equal(h.sockets.length, 1, "not before the delay");
  h.clock.advance(1);
  assert.equal(h.sockets.length, 2);

  // Failed attempts double the delay up to the maximum.
  const delays = [];
  for (let i = 0; i < 6; i++) {
    h.socket.error();
    const [state, detail] = h.lastState();
    assert.equal(state, "reconnecting");
    delays.push(detail.inMs);
    assert.equal(detail.attempt, i + 2);
    h.clock.advance(detail.inMs);
  }
  assert.deepEqual(delays, [200, 400, 800, 1000, 1000, 1000]);
  assert.equal(h.sockets.length, 8);

  // A retryable hello_error and a handshake timeout are retried too.
  h.socket.open();
  h.socket.deliver({ type: "hello_error", error: { code: "invalid_request", message: "Handshake timeout" } });
  assert.equal(h.lastState()[0], "reconnecting");
  h.clock.advance(h.lastState()[1].inMs);
  h.socket.open();
  h.clock.advance(10_000);
  assert.equal(h.lastState()[0], "reconnecting");
  h.clock.advance(h.lastState()[1].inMs);

  // Success: open with reconnected, the queued request goes out, the backoff resets.
  const socket = h.socket;
  socket.open();
  assert.deepEqual(socket.sent[0], { type: "hello", version: 1, token: "s3cr3t" });
  socket.deliver(serverHello("conn-2"));
  assert.equal(h.lastState()[0], "open");
  assert.equal(h.lastState()[1].reconnected, true);
  assert.equal(h.conn.connectionId, "conn-2");
  assert.deepEqual(socket.requests, [{ type: "request", id: "r2", request: { command: "list" } }]);
  socket.deliver({ type: "response", id: "r2", ok: true, result: { command: "list", sessions: [] } });
  assert.deepEqual((await outcome(queued)).ok.sessions, []);

  socket.drop();
  assert.deepEqual(h.lastState(), ["reconnecting", { attempt: 1, inMs: 100 }]);
});

test("the app re-attaches on open with reconnected: true; nothing is replayed", async () => {
  let h;
  h = harness({
    onState: (state, detail) => {
      h.states.push([state, detail]);
      if (state === "open" && detail.reconnected) h.conn.request("attach", { sessionId: "s1" });
    },
  });
  const attach = h.conn.request("attach", { sessionId: "s1" });
  const first = h.ready("conn-1");
  assert.equal(first.requests.length, 1);
  first.drop();
  assert.equal((await outcome(attach)).err.code, "disconnected");
  h.clock.advance(250);
  h.socket.open();
  h.socket.deliver(serverHello("conn-2"));
  assert.deepEqual(h.socket.requests, [{ type: "request", id: "r2", request: { command: "attach", sessionId: "s1" } }]);
});

test("malformed frames after the handshake close the socket and reconnect", () => {
  const bad = [
    ["not CBOR", Uint8Array.of(0, 0, 0, 1, 0xff)],
    ["trailing bytes after the frame", Uint8Array.of(0, 0, 0, 1, 0xf6, 0xf6)],
    ["a truncated frame", Uint8Array.of(0, 0, 0, 9, 0xa0)],
    ["not a map", encodeFrame([1, 2])],
    ["an unknown type", encodeFrame({ type: "surprise" })],
    ["a second hello", encodeFrame(serverHello())],
    ["an event without a payload", encodeFrame({ type: "event" })],
    ["a response without ok", encodeFrame({ type: "response", id: "r1" })],
  ];
  for (const [what, bytes] of bad) {
    const h = harness();
    const socket = h.ready();
    socket.deliverBytes(bytes);
    assert.ok(socket.closed, `${what}: the socket is closed`);
    assert.deepEqual(h.lastState(), ["reconnecting", { attempt: 1, inMs: 50 }], what);
    h.clock.advance(50);
    assert.equal(h.sockets.length, 2, `${what}: a new socket`);
  }
  // A text message is malformed too.
  const h = harness();
  const socket = h.ready();
  socket.onmessage({ data: "hello" });
  assert.equal(h.conn.state, "reconnecting");
});

test("events of a socket that was replaced are ignored", () => {
  const h = harness();
  const old = h.ready();
  const handlers = { onmessage: old.onmessage, onclose: old.onclose };
  old.drop();
  h.clock.advance(250);
  h.socket.open();
  h.socket.deliver(serverHello("conn-2"));
  // A late message or close from the first socket changes nothing.
  handlers.onmessage?.({ data: arrayBuffer(encodeFrame({ type: "event", event: { type: "session_removed", sessionId: "x" } })) });
  handlers.onclose?.({ code: 1006 });
  assert.equal(h.events.length, 0);
  assert.equal(h.conn.state, "open");
});

test("close() stops for good, during any state", async () => {
  // Open, with a request in flight and one queued... after close nothing is sent.
  const h = harness();
  const socket = h.ready();
  const inFlight = h.conn.request("list");
  h.conn.close();
  assert.deepEqual(h.lastState(), ["closed", undefined]);
  assert.ok(socket.closed);
  assert.equal((await outcome(inFlight)).err.code, "closed");
  assert.equal((await outcome(h.conn.request("list"))).err.code, "closed");
  assert.throws(() => h.conn.start(), /after close/);
  h.conn.close(); // Idempotent.
  assert.equal(h.states.filter(([s]) => s === "closed").length, 1);

  // While reconnecting: the pending retry is cancelled.
  const r = harness();
  r.ready();
  r.socket.drop();
  const queued = r.conn.request("list");
  r.conn.close();
  assert.deepEqual(r.clock.pending(), []);
  r.clock.advance(60_000);
  assert.equal(r.sockets.length, 1);
  assert.equal((await outcome(queued)).err.code, "closed");

  // From inside a state listener.
  const l = harness({
    onState: (state) => {
      if (state === "reconnecting") l.conn.close();
    },
  });
  l.ready();
  l.socket.drop();
  assert.equal(l.conn.state, "closed");
  assert.deepEqual(l.clock.pending(), []);
});

test("a send that throws is a lost transport", async () => {
  const h = harness();
  const socket = h.ready();
  socket.closed = true; // The socket went away without telling us yet.
  const { err } = await outcome(h.conn.request("list"));
  assert.equal(err.code, "disconnected");
  assert.equal(h.conn.state, "reconnecting");
});

test("the default WebSocket is the global one", () => {
  if (globalThis.WebSocket) {
    assert.doesNotThrow(() => new PiConnection({ url: "ws://127.0.0.1:1/" }));
  } else {
    assert.throws(() => new PiConnection({ url: "ws://127.0.0.1:1/" }), TypeError);
  }
  // Nothing but an encoded hello is needed to speak: the module uses no DOM.
  assert.equal(hex(encode({ type: "hello", version: 1 })), "a264747970656568656c6c6f6776657273696f6e01");
});

test("a reconnection that has not completed a handshake within its window fails; a handshake resets the window", async () => {
  const h = harness({ reconnect: { initialMs: 100, maxMs: 1000, windowMs: 5000 } });
  const first = h.ready("conn-1");
  first.drop();
  assert.equal(h.lastState()[0], "reconnecting");
  // Reconnected within the window: the window starts again at the next loss.
  h.clock.advance(100);
  h.socket.open();
  h.socket.deliver(serverHello("conn-2"));
  assert.equal(h.lastState()[0], "open");
  h.clock.advance(10_000);
  assert.equal(h.conn.state, "open", "no window runs while open");
  h.socket.drop();
  const pending = h.conn.request("list");
  // Every attempt fails; the window ends the reconnection.
  for (let i = 0; i < 50 && h.conn.state === "reconnecting"; i++) {
    h.clock.advance(h.lastState()[1].inMs);
    h.socket.error();
  }
  assert.equal(h.conn.state, "failed");
  assert.equal(h.lastState()[1].code, "disconnected");
  assert.match(h.lastState()[1].message, /within 5 s/);
  assert.equal((await outcome(pending)).err.code, "disconnected");
});

test("the defaults are the kernel's ClientLimits (50 ms doubling to 1 s, a 30 s window)", () => {
  const h = harness({});
  const first = h.ready("conn-1");
  first.drop();
  assert.deepEqual(h.lastState(), ["reconnecting", { attempt: 1, inMs: 50 }]);
  const delays = [];
  for (let i = 0; i < 6; i++) {
    h.clock.advance(h.lastState()[1].inMs);
    h.socket.error();
    delays.push(h.lastState()[1].inMs);
  }
  assert.deepEqual(delays, [100, 200, 400, 800, 1000, 1000]);
  assert.ok(h.clock.pending().includes(30_000 - 50 - 100 - 200 - 400 - 800 - 1000), `${h.clock.pending()}`);
});
