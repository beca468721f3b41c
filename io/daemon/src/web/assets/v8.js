// @ts-check
/**
 * The page's one pi protocol v8 connection: the published pi-client and
 * chord (`./vendor/pi-client.module.js`, built by `../bundle/build.sh`) over
 * a WebSocket whose every binary message carries one whole frame.
 *
 * The token goes with the WebSocket's upgrade, as the subprotocol entry
 * `pi.token.<base64url>` beside `pi.v8` (a browser cannot set
 * `Authorization` on a WebSocket, and v8's hello carries none); the server
 * judges it at the hello.
 *
 * Life cycle (`onState(state, detail)`), as the page shows it:
 * - `connecting`: the first transport is being opened.
 * - `open` `{reconnected}`: the hello arrived and the server-scope services
 *   are bound (`server`): our session status (replicated), our sessions
 *   service and pi's management. The page (re-)attaches its session then.
 * - `reconnecting` `{attempt, inMs}`: the transport was lost after a
 *   handshake, or an attempt failed; the next one starts in `inMs`
 *   (doubling from `reconnectBackoffInitialMs` to `reconnectBackoffMaxMs`).
 *   One that has not succeeded `reconnectWindowMs` after the loss fails.
 *   These are the kernel's `ClientLimits`, which every Rust client runs;
 *   the page reads them with the server's id from `/client.json`.
 * - `failed` `{code, message}`: for good, until `start()` again: the server
 *   refused the hello (`auth`, `version`), or never answered (`disconnected`).
 * - `closed`: `close()` was called.
 *
 * Everything a subscription shows is the server's replicated state: a
 * reconnection subscribes again and gets it whole, so nothing is replayed
 * and nothing is shown twice.
 *
 * @module v8
 */

import {
  BACKGROUND_CONTEXT,
  Client,
  createClientServiceTransport,
  createRemoteServiceBinding,
  defineService,
} from "./vendor/pi-client.module.js";

/** The services the page uses: pi's, and ours beside them. */
export const Services = {
  Status: defineService("pi-server.session-status"),
  Sessions: defineService("pi-server.sessions"),
  Management: defineService("pi.session-management"),
  Transcript: defineService("pi.transcript"),
  Agent: defineService("pi.agent-controller"),
  Models: defineService("pi.models"),
};

/** The context every call runs in (the page cancels nothing by context). */
export const ctx = BACKGROUND_CONTEXT;

/** `hello_error` codes that end the connection for good. */
const REFUSALS = new Set(["auth", "version"]);

/** The same numbers as the kernel's `ClientLimits`, for a page that could not read them. */
export const DEFAULT_LIMITS = {
  handshakeTimeoutMs: 10_000,
  reconnectBackoffInitialMs: 50,
  reconnectBackoffMaxMs: 1_000,
  reconnectWindowMs: 30_000,
  maxFrameLen: 16 * 1024 * 1024,
};

/** UTF-8 text as base64url without padding. */
export const base64url = (text) => {
  let binary = "";
  for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
};

/**
 * A pi-client `ByteTransportFactory` over a WebSocket: one frame per binary
 * message both ways (pi-client sends each frame in one `send`).
 * @param {{url: string, token?: string|null, WebSocketImpl?: any}} options
 */
export const webSocketTransport =
  ({ url, token, WebSocketImpl = globalThis.WebSocket }) =>
  (handlers) =>
    new Promise((resolve, reject) => {
      const protocols = ["pi.v8"];
      if (token) protocols.push(`pi.token.${base64url(token)}`);
      const ws = new WebSocketImpl(url, protocols);
      ws.binaryType = "arraybuffer";
      let open = false;
      let ended = false;
      const end = (error) => {
        if (ended) return;
        ended = true;
        if (!open) reject(error ?? new Error("The server closed the connection"));
        else if (error) handlers.onError(error);
        else handlers.onClose();
      };
      ws.onopen = () => {
        open = true;
        resolve({
          send: async (chunk) => {
            if (ws.readyState !== 1) throw new Error("The connection is closed");
            ws.send(chunk);
          },
          close: () => ws.close(),
        });
      };
      ws.onmessage = (event) => {
        if (event.data instanceof ArrayBuffer) handlers.onData(new Uint8Array(event.data));
        else end(new Error("The server sent a text message"));
      };
      ws.onclose = () => end(null);
      ws.onerror = () => end(new Error("The WebSocket failed"));
    });

/** The code of an error a call or a hello failed with. */
export const codeOf = (error) => error?.code ?? (error?.name === "DisconnectedError" ? "disconnected" : undefined);

/** The page's connection: one pi-client `Client`, its server-scope
 * bindings, and the reconnection policy. */
export class PageConnection {
  /**
   * @param {{url: string, token?: string|null, serverId: string, limits?: typeof DEFAULT_LIMITS,
   *   onState: (state: string, detail?: any) => void, onAttachment?: (attachment: any) => void,
   *   transportFactory?: any}} options
   */
  constructor(options) {
    this.options = options;
    this.limits = { ...DEFAULT_LIMITS, ...(options.limits ?? {}) };
    this.client = null;
    /** The server-scope binding while open. */
    this.server = null;
    this.state = "idle";
    this.timer = null;
    this.lostAt = null;
    this.attempt = 0;
    this.handshakes = 0;
    this.closed = false;
  }

  start() {
    this.closed = false;
    this.lostAt = null;
    this.attempt = 0;
    this.#set("connecting");
    this.#connect();
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    this.#drop();
    this.#set("closed");
  }

  /** A server-scope service of the binding (`Services.*`). */
  use(service) {
    if (!this.server) throw Object.assign(new Error("Not connected to the server"), { code: "disconnected" });
    return this.server.use(service);
  }

  /** A binding of the session services of the current attachment. */
  async bindSession() {
    const client = this.client;
    if (!client?.attachment) throw Object.assign(new Error("Not attached"), { code: "disconnected" });
    const binding = createRemoteServiceBinding({
      services: [Services.Transcript, Services.Agent, Services.Models],
      transport: createClientServiceTransport(client, () => client.attachment),
    });
    const uses = {
      transcript: binding.use(Services.Transcript),
      agent: binding.use(Services.Agent),
      models: binding.use(Services.Models),
    };
    await binding.ready(ctx);
    return { binding, ...uses };
  }

  #set(state, detail) {
    this.state = state;
    this.options.onState(state, detail);
  }

  #drop() {
    const [client, server] = [this.client, this.server];
    this.client = null;
    this.server = null;
    server?.dispose(ctx).catch(() => {});
    client?.dispose().catch(() => {});
  }

  async #connect() {
    const { url, token, serverId } = this.options;
    const transportFactory = this.options.transportFactory ?? webSocketTransport({ url, token });
    const client = new Client({ serverId, transportFactory, maxFrameLength: this.limits.maxFrameLen });
    this.client = client;
    let timeout;
    try {
      const deadline = new Promise((_, reject) => {
        timeout = setTimeout(
          () => reject(Object.assign(new Error("The server did not answer the hello in time"), { code: "timeout" })),
          this.limits.handshakeTimeoutMs,
        );
      });
      await Promise.race([client.connect(), deadline]);
      const server = createRemoteServiceBinding({
        services: [Services.Status, Services.Sessions, Services.Management],
        transport: createClientServiceTransport(client, () => ({ serverId })),
      });
      server.use(Services.Status);
      await Promise.race([server.ready(ctx), deadline]);
      if (this.client !== client) {
        server.dispose(ctx).catch(() => {});
        return;
      }
      this.server = server;
    } catch (error) {
      clearTimeout(timeout);
      if (this.client !== client) return;
      this.#drop();
      return this.#failed(error);
    }
    clearTimeout(timeout);
    client.onConnectionStateChange((change) => {
      if (change.state === "disconnected" && this.client === client) this.#lost();
    });
    client.onAttachmentChange((attachment) => {
      if (this.client === client) this.options.onAttachment?.(attachment);
    });
    const reconnected = this.handshakes++ > 0;
    this.lostAt = null;
    this.attempt = 0;
    this.#set("open", { reconnected });
  }

  #failed(error) {
    const code = codeOf(error) ?? "disconnected";
    if (REFUSALS.has(code)) {
      this.closed = true;
      return this.#set("failed", { code, message: error.message });
    }
    if (this.handshakes === 0) {
      this.closed = true;
      return this.#set("failed", { code, message: error.message });
    }
    this.#retry();
  }

  #lost() {
    this.#drop();
    if (this.closed) return;
    this.lostAt ??= Date.now();
    this.#retry();
  }

  #retry() {
    if (this.closed) return;
    const { reconnectBackoffInitialMs: initial, reconnectBackoffMaxMs: max, reconnectWindowMs: window } = this.limits;
    this.lostAt ??= Date.now();
    if (Date.now() - this.lostAt > window) {
      this.closed = true;
      return this.#set("failed", { code: "disconnected", message: "The server has not come back" });
    }
    const inMs = Math.min(max, initial * 2 ** this.attempt);
    this.attempt += 1;
    this.#set("reconnecting", { attempt: this.attempt, inMs });
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (!this.closed) this.#connect();
    }, inMs);
  }
}
