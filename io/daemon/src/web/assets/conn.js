// @ts-check
/**
 * The browser's one pi protocol v1 connection, over a WebSocket whose every
 * binary message carries exactly one whole frame (both ways).
 *
 * Life cycle (`onState(state, detail)`):
 * - `connecting`: {@link PiConnection#start} opened the first socket and sent
 *   the hello (`{type:"hello", version:1, token}`; `token` is the server's
 *   extension, omitted when not given).
 * - `open` `{reconnected, hello}`: the server's hello arrived
 *   (`serverHello`). Requests queued so far have been sent.
 * - `reconnecting` `{attempt, inMs}`: the transport was lost after a
 *   handshake, or a reconnection attempt failed; the next attempt starts in
 *   `inMs` (doubling from `reconnect.initialMs` to `reconnect.maxMs`). A
 *   reconnection that has not completed a handshake `reconnect.windowMs`
 *   after the loss fails (`disconnected`).
 *
 * The reconnection policy is the kernel's (`ClientLimits`, which every Rust
 * client runs): the page reads its numbers from the server
 * (`/client-limits.json`) and passes them here; the defaults below are the
 * same numbers, for tests and a page that could not read them.
 * - `failed` `{code, message}`: for good, until `start()` is called again.
 *   Either the server refused the hello (`auth`, `version`), or the first
 *   connection never completed its handshake: the transport failed
 *   (`disconnected`), the server did not answer in time (`timeout`), sent
 *   something malformed (`protocol`) or any other `hello_error` (its code).
 * - `closed`: {@link PiConnection#close} was called.
 *
 * Requests made before a handshake completes (before `start()`, while
 * connecting or reconnecting) are queued and sent once it does. Requests in
 * flight when the transport is lost reject with code `disconnected`: they
 * may or may not have run, and the app decides what to do. Nothing is
 * replayed on reconnection; the app re-attaches when it sees `open` with
 * `reconnected: true`.
 *
 * Runs unchanged in browsers and under Node with an injected WebSocket
 * implementation; it uses no DOM.
 *
 * @module conn
 */

import { DEFAULT_MAX_FRAME_LEN, decodeFrame, encodeFrame } from "./codec.js";

/** The protocol version spoken. */
export const PROTOCOL_VERSION = 1;

/** `hello_error` codes that end the connection for good. */
const REFUSALS = new Set(["auth", "version"]);

/**
 * An error of the protocol (`ok:false` responses, `hello_error`) or of the
 * connection (`disconnected`, `closed`, `timeout`, `protocol`).
 */
export class PiError extends Error {
  /**
   * @param {string} code
   * @param {string} message
   * @param {unknown} [details]
   */
  constructor(code, message, details) {
    super(message);
    this.name = "PiError";
    /** @type {string} */
    this.code = code;
    /** @type {unknown} */
    this.details = details;
  }
}

/**
 * The part of the WebSocket interface the connection uses.
 * @typedef {object} SocketLike
 * @property {string} binaryType
 * @property {(data: Uint8Array) => void} send
 * @property {(code?: number, reason?: string) => void} close
 * @property {((event: any) => void) | null} onopen
 * @property {((event: { data: unknown }) => void) | null} onmessage
 * @property {((event: any) => void) | null} onerror
 * @property {((event: { code?: number, reason?: string }) => void) | null} onclose
 */

/**
 * @typedef {object} ReconnectOptions
 * @property {number} [initialMs] First retry delay (default 50).
 * @property {number} [maxMs] Longest retry delay (default 1000).
 * @property {number} [windowMs] How long a reconnection may take before it
 *   fails (default 30000).
 */

/**
 * @typedef {object} Timers
 * @property {(fn: () => void, ms: number) => unknown} setTimeout
 * @property {(handle: any) => void} clearTimeout
 */

/**
 * @typedef {object} PiConnectionOptions
 * @property {string} url The WebSocket URL.
 * @property {string} [token] The server's token, sent in the hello.
 * @property {string} [clientName] A name for this client, for the app's own
 *   use (v1's hello is closed: it is not sent).
 * @property {(event: any) => void} [onEvent] Every server `event` payload.
 * @property {(state: string, detail?: any) => void} [onState] Life-cycle changes.
 * @property {new (url: string) => SocketLike} [WebSocket] Default `globalThis.WebSocket`.
 * @property {ReconnectOptions} [reconnect]
 * @property {number} [handshakeTimeoutMs] How long to wait for the server's
 *   hello once the socket is open (default 10000).
 * @property {number} [maxFrameLen] Largest frame payload, both ways
 *   (default 16 MiB).
 * @property {Timers} [timers] Timer functions (default the global ones; tests inject fakes).
 */

/**
 * @typedef {object} Pending
 * @property {string} id
 * @property {Uint8Array} frame
 * @property {(result: any) => void} resolve
 * @property {(error: PiError) => void} reject
 */

/**
 * Calls `fn`, reporting an exception without letting it unwind into the
 * connection's state machine.
 * @param {((...args: any[]) => void) | undefined} fn
 * @param {...any} args
 */
function callOut(fn, ...args) {
  if (!fn) return;
  try {
    fn(...args);
  } catch (error) {
    queueMicrotask(() => {
      throw error;
    });
  }
}

/** @param {unknown} value */
function isMap(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array);
}

/** @param {unknown} error */
function describe(error) {
  return error instanceof Error ? error.message : String(error);
}

export class PiConnection {
  /** @type {string} */ #url;
  /** @type {string | undefined} */ #token;
  /** @type {((event: any) => void) | undefined} */ #onEvent;
  /** @type {((state: string, detail?: any) => void) | undefined} */ #onState;
  /** @type {new (url: string) => SocketLike} */ #impl;
  /** @type {number} */ #initialMs;
  /** @type {number} */ #maxMs;
  /** @type {number} */ #windowMs;
  /** @type {number} */ #handshakeTimeoutMs;
  /** @type {number} */ #maxFrameLen;
  /** @type {Timers} */ #timers;

  /** @type {string} */ #state = "idle";
  /** @type {SocketLike | null} */ #socket = null;
  /** True while the current socket awaits the server's hello. */
  #handshaking = false;
  /** True once a handshake completed since `start()`. */
  #everOpened = false;
  #attempt = 0;
  #nextId = 1;
  /** @type {unknown} */ #retryTimer = null;
  /** Runs from a loss until a handshake: its end fails the reconnection. @type {unknown} */
  #windowTimer = null;
  /** @type {unknown} */ #handshakeTimer = null;
  /** Requests not yet sent, in order. @type {Pending[]} */ #queue = [];
  /** Requests sent and not answered, by id. @type {Map<string, Pending>} */ #inFlight = new Map();

  /** The server's hello of the current (or last) connection, or null. */
  serverHello = /** @type {any} */ (null);

  /** @param {PiConnectionOptions} options */
  constructor({
    url,
    token,
    clientName,
    onEvent,
    onState,
    WebSocket: impl = /** @type {any} */ (globalThis).WebSocket,
    reconnect = { initialMs: 50, maxMs: 1000, windowMs: 30_000 },
    handshakeTimeoutMs = 10_000,
    maxFrameLen = DEFAULT_MAX_FRAME_LEN,
    timers,
  }) {
    if (typeof impl !== "function") throw new TypeError("PiConnection needs a WebSocket implementation");
    this.#url = url;
    this.#token = token;
    /** The client's name, for the app's own use. */
    this.clientName = clientName;
    this.#onEvent = onEvent;
    this.#onState = onState;
    this.#impl = impl;
    this.#initialMs = Math.max(0, reconnect.initialMs ?? 50);
    this.#maxMs = Math.max(this.#initialMs, reconnect.maxMs ?? 1000);
    this.#windowMs = Math.max(0, reconnect.windowMs ?? 30_000);
    this.#handshakeTimeoutMs = handshakeTimeoutMs;
    this.#maxFrameLen = maxFrameLen;
    // Called without a receiver: a browser's timers refuse any other `this`.
    const set = timers?.setTimeout ?? ((fn, ms) => globalThis.setTimeout(fn, ms));
    const clear = timers?.clearTimeout ?? ((handle) => globalThis.clearTimeout(handle));
    this.#timers = { setTimeout: (fn, ms) => set(fn, ms), clearTimeout: (handle) => clear(handle) };
  }

  /** The current state: `idle`, `connecting`, `open`, `reconnecting`, `failed` or `closed`. */
  get state() {
    return this.#state;
  }

  /** The server-assigned id of the current (or last) connection, or null. */
  get connectionId() {
    return this.serverHello?.connectionId ?? null;
  }

  /**
   * Opens the connection. A no-op while connecting, open or reconnecting;
   * after `failed` it starts afresh (as a first connection).
   */
  start() {
    if (this.#state === "closed") throw new Error("PiConnection: start() after close()");
    if (this.#state !== "idle" && this.#state !== "failed") return;
    this.#everOpened = false;
    this.#attempt = 0;
    this.#setState("connecting");
    this.#openSocket();
  }

  /**
   * Sends one request; resolves with its `result` (`ok:true`), rejects with
   * a {@link PiError} carrying the server's `code`, `message` and `details`
   * (`ok:false`), or code `disconnected` if the transport is lost before the
   * response (the request may have run).
   *
   * @param {string} command
   * @param {Record<string, unknown>} [fields] the command's other fields;
   *   `undefined` ones are left out
   * @returns {Promise<any>}
   */
  request(command, fields = {}) {
    if (this.#state === "closed") {
      return Promise.reject(new PiError("closed", "The connection is closed"));
    }
    if (this.#state === "failed") {
      const { code, message } = this.#failure ?? { code: "disconnected", message: "The connection failed" };
      return Promise.reject(new PiError(code, message));
    }
    const id = `r${this.#nextId++}`;
    const request = { command, ...fields };
    request.command = command;
    let frame;
    try {
      frame = encodeFrame({ type: "request", id, request }, { maxFrameLen: this.#maxFrameLen });
    } catch (error) {
      const kind = /** @type {any} */ (error)?.kind;
      return Promise.reject(
        new PiError("invalid_request", `Cannot encode the request: ${describe(error)}`, kind ? { kind } : undefined),
      );
    }
    return new Promise((resolve, reject) => {
      const pending = { id, frame, resolve, reject };
      if (this.#state === "open") this.#send(pending);
      else this.#queue.push(pending);
    });
  }

  /** Stops for good: closes the socket, rejects what is pending with code `closed`. */
  close() {
    if (this.#state === "closed") return;
    this.#clearTimers();
    this.#dropSocket();
    this.#rejectAll(new PiError("closed", "The connection is closed"), true);
    this.#setState("closed");
  }

  // -------------------------------------------------------------------------

  /** @type {{ code: string, message: string } | null} */
  #failure = null;

  /**
   * @param {string} state
   * @param {any} [detail]
   */
  #setState(state, detail) {
    this.#state = state;
    callOut(this.#onState, state, detail);
  }

  #clearTimers() {
    if (this.#retryTimer !== null) this.#timers.clearTimeout(this.#retryTimer);
    if (this.#windowTimer !== null) this.#timers.clearTimeout(this.#windowTimer);
    this.#windowTimer = null;
    if (this.#handshakeTimer !== null) this.#timers.clearTimeout(this.#handshakeTimer);
    this.#retryTimer = null;
    this.#handshakeTimer = null;
  }

  /** Forgets the current socket (its later events are ignored) and closes it. */
  #dropSocket() {
    const socket = this.#socket;
    this.#socket = null;
    this.#handshaking = false;
    if (socket) {
      socket.onopen = socket.onmessage = socket.onerror = socket.onclose = null;
      try {
        socket.close();
      } catch {
        // Already closing.
      }
    }
  }

  /**
   * Rejects the requests in flight, and the queued ones too when `queued`.
   * @param {PiError} error
   * @param {boolean} queued
   */
  #rejectAll(error, queued) {
    const inFlight = [...this.#inFlight.values()];
    this.#inFlight.clear();
    const waiting = queued ? this.#queue.splice(0) : [];
    for (const pending of [...inFlight, ...waiting]) {
      pending.reject(new PiError(error.code, error.message, error.details));
    }
  }

  #openSocket() {
    /** @type {SocketLike} */
    let socket;
    try {
      socket = new this.#impl(this.#url);
    } catch (error) {
      this.#transportLost("disconnected", `Cannot open the WebSocket: ${describe(error)}`);
      return;
    }
    this.#socket = socket;
    this.#handshaking = true;
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      if (socket !== this.#socket) return;
      let hello;
      try {
        hello = encodeFrame(
          { type: "hello", version: PROTOCOL_VERSION, token: this.#token },
          { maxFrameLen: this.#maxFrameLen },
        );
        socket.send(hello);
      } catch (error) {
        this.#transportLost("disconnected", `Cannot send the hello: ${describe(error)}`);
        return;
      }
      this.#handshakeTimer = this.#timers.setTimeout(() => {
        this.#handshakeTimer = null;
        if (socket === this.#socket) this.#transportLost("timeout", "The server did not answer the hello in time");
      }, this.#handshakeTimeoutMs);
    };
    socket.onmessage = (event) => {
      if (socket === this.#socket) this.#onMessage(event.data);
    };
    socket.onerror = () => {
      if (socket === this.#socket) this.#transportLost("disconnected", "The WebSocket failed");
    };
    socket.onclose = (event) => {
      if (socket !== this.#socket) return;
      const reason = event?.reason ? `: ${event.reason}` : "";
      this.#transportLost("disconnected", `The WebSocket closed (code ${event?.code ?? "none"})${reason}`);
    };
  }

  /** @param {Pending} pending */
  #send(pending) {
    this.#inFlight.set(pending.id, pending);
    try {
      /** @type {SocketLike} */ (this.#socket).send(pending.frame);
    } catch (error) {
      this.#transportLost("disconnected", `Cannot send: ${describe(error)}`);
    }
  }

  /** @param {unknown} data */
  #onMessage(data) {
    if (!(data instanceof ArrayBuffer || ArrayBuffer.isView(data))) {
      this.#malformed("the server sent a message that is not binary");
      return;
    }
    let message;
    try {
      message = decodeFrame(/** @type {ArrayBuffer} */ (data), { maxFrameLen: this.#maxFrameLen });
    } catch (error) {
      this.#malformed(describe(error));
      return;
    }
    if (!isMap(message) || typeof message.type !== "string") {
      this.#malformed("the server sent a message without a type");
      return;
    }
    if (this.#handshaking) this.#onHandshakeMessage(message);
    else this.#onReadyMessage(message);
  }

  /** @param {any} message */
  #onHandshakeMessage(message) {
    if (message.type === "hello_error") {
      const error = message.error;
      if (!isMap(error) || typeof error.code !== "string" || typeof error.message !== "string") {
        this.#malformed("a hello_error without a valid error");
        return;
      }
      if (REFUSALS.has(error.code)) {
        this.#fail(error.code, error.message);
      } else {
        this.#transportLost(error.code, error.message);
      }
      return;
    }
    if (message.type !== "hello") {
      this.#malformed(`a ${JSON.stringify(message.type)} message before the server's hello`);
      return;
    }
    if (message.version !== PROTOCOL_VERSION || typeof message.connectionId !== "string" || !isMap(message.snapshot)) {
      this.#malformed("a server hello that is not protocol v1");
      return;
    }
    if (this.#handshakeTimer !== null) this.#timers.clearTimeout(this.#handshakeTimer);
    this.#handshakeTimer = null;
    this.#handshaking = false;
    const reconnected = this.#everOpened;
    this.#everOpened = true;
    this.#attempt = 0;
    if (this.#windowTimer !== null) this.#timers.clearTimeout(this.#windowTimer);
    this.#windowTimer = null;
    this.#failure = null;
    this.serverHello = message;
    this.#state = "open";
    for (const pending of this.#queue.splice(0)) {
      if (this.#state !== "open") {
        // Sending failed and the transport is gone: keep the rest for later.
        this.#queue.push(pending);
        continue;
      }
      this.#send(pending);
    }
    if (this.#state === "open") this.#setState("open", { reconnected, hello: message });
  }

  /** @param {any} message */
  #onReadyMessage(message) {
    switch (message.type) {
      case "response": {
        if (typeof message.id !== "string" || typeof message.ok !== "boolean") {
          this.#malformed("a response without an id or ok");
          return;
        }
        const pending = this.#inFlight.get(message.id);
        if (!pending) return; // Not ours (or no longer wanted): nothing to settle.
        if (message.ok) {
          this.#inFlight.delete(message.id);
          pending.resolve(message.result);
          return;
        }
        const error = message.error;
        if (!isMap(error) || typeof error.code !== "string" || typeof error.message !== "string") {
          this.#malformed("an error response without a valid error");
          return;
        }
        this.#inFlight.delete(message.id);
        pending.reject(new PiError(error.code, error.message, error.details));
        return;
      }
      case "event":
        if (!isMap(message.event)) {
          this.#malformed("an event without a payload");
          return;
        }
        callOut(this.#onEvent, message.event);
        return;
      default:
        this.#malformed(`an unexpected ${JSON.stringify(message.type)} message`);
    }
  }

  /**
   * The server sent something this client cannot read: drop the socket.
   * @param {string} what
   */
  #malformed(what) {
    this.#transportLost("protocol", `Malformed frame from the server: ${what}`);
  }

  /**
   * The current socket is gone (or must go). After a handshake, or during
   * reconnection, this schedules the next attempt; on the first connection it
   * fails.
   * @param {string} code
   * @param {string} message
   */
  #transportLost(code, message) {
    const window = this.#windowTimer;
    this.#windowTimer = null; // kept across attempts: it runs from the loss
    this.#clearTimers();
    this.#windowTimer = window;
    this.#dropSocket();
    this.#rejectAll(new PiError("disconnected", message, code === "disconnected" ? undefined : { cause: code }), false);
    if (!this.#everOpened) {
      this.#fail(code, message);
      return;
    }
    this.#attempt += 1;
    if (this.#windowTimer === null) {
      this.#windowTimer = this.#timers.setTimeout(() => {
        this.#windowTimer = null;
        if (this.#state === "reconnecting") {
          const seconds = Math.round(this.#windowMs / 1000);
          this.#fail("disconnected", `Could not reconnect to the server within ${seconds} s: ${message}`);
        }
      }, this.#windowMs);
    }
    const inMs = Math.min(this.#initialMs * 2 ** (this.#attempt - 1), this.#maxMs);
    this.#setState("reconnecting", { attempt: this.#attempt, inMs });
    if (this.#state !== "reconnecting") return; // The listener closed it.
    this.#retryTimer = this.#timers.setTimeout(() => {
      this.#retryTimer = null;
      if (this.#state === "reconnecting") this.#openSocket();
    }, inMs);
  }

  /**
   * Stops for good (until `start()`): rejects everything pending with the error.
   * @param {string} code
   * @param {string} message
   */
  #fail(code, message) {
    this.#clearTimers();
    this.#dropSocket();
    this.#failure = { code, message };
    this.#rejectAll(new PiError(code, message), true);
    this.#setState("failed", { code, message });
  }
}
