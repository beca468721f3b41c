// The page's transport (io/daemon/src/web/assets/v8.js) against an in-memory
// fake WebSocket: what it offers at the upgrade (pi.v8 and the token as
// base64url), whole frames both ways, and how its end is reported.
//
// Run: node --test tests/web/

import { test } from "node:test";
import assert from "node:assert/strict";

import { base64url, webSocketTransport } from "../../io/daemon/src/web/assets/v8.js";

/** A WebSocket that records what it was given and is driven by the test. */
class FakeSocket {
  static last = null;
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    this.readyState = 0;
    this.sent = [];
    this.closed = false;
    FakeSocket.last = this;
  }
  send(data) {
    this.sent.push(data);
  }
  close() {
    this.closed = true;
  }
  open() {
    this.readyState = 1;
    this.onopen?.();
  }
  receive(bytes) {
    this.onmessage?.({ data: Uint8Array.from(bytes).buffer });
  }
  end() {
    this.readyState = 3;
    this.onclose?.({ code: 1006 });
  }
}

const handlers = () => {
  const seen = { data: [], closes: 0, errors: [] };
  return {
    seen,
    onData: (chunk) => seen.data.push([...chunk]),
    onClose: () => seen.closes++,
    onError: (e) => seen.errors.push(e.message),
  };
};

test("base64url is RFC 4648 §5 without padding, over UTF-8", () => {
  for (const text of ["", "a", "ab", "abc", "s3cret/ü", "web-test-token-0123456789", "??>>~~"]) {
    assert.equal(base64url(text), Buffer.from(text, "utf8").toString("base64url"), text);
  }
});

test("the upgrade offers pi.v8 and the token; frames pass whole both ways", async () => {
  const h = handlers();
  const opening = webSocketTransport({ url: "ws://host/ws", token: "s3cret/ü", WebSocketImpl: FakeSocket })(h);
  const ws = FakeSocket.last;
  assert.deepEqual(ws.protocols, ["pi.v8", "pi.token.czNjcmV0L8O8"]);
  assert.equal(ws.binaryType, "arraybuffer");
  ws.open();
  const transport = await opening;
  await transport.send(Uint8Array.of(0, 0, 0, 1, 0xf6));
  assert.deepEqual([...ws.sent[0]], [0, 0, 0, 1, 0xf6]);
  ws.receive([0, 0, 0, 1, 0xf5]);
  assert.deepEqual(h.seen.data, [[0, 0, 0, 1, 0xf5]]);
  ws.end();
  ws.end();
  assert.equal(h.seen.closes, 1, "one terminal report");
  await assert.rejects(transport.send(Uint8Array.of(1)), /closed/);
  transport.close();
  assert.ok(ws.closed);
});

test("without a token only pi.v8 is offered", async () => {
  const opening = webSocketTransport({ url: "ws://host/ws", token: null, WebSocketImpl: FakeSocket })(handlers());
  assert.deepEqual(FakeSocket.last.protocols, ["pi.v8"]);
  FakeSocket.last.open();
  await opening;
});

test("a socket that never opens rejects the transport; a text message is an error", async () => {
  const refused = webSocketTransport({ url: "ws://host/ws", WebSocketImpl: FakeSocket })(handlers());
  FakeSocket.last.end();
  await assert.rejects(refused, /closed the connection/);

  const h = handlers();
  const opening = webSocketTransport({ url: "ws://host/ws", WebSocketImpl: FakeSocket })(h);
  const ws = FakeSocket.last;
  ws.open();
  await opening;
  ws.onmessage({ data: "text" });
  ws.end();
  assert.deepEqual(h.seen.errors, ["The server sent a text message"]);
  assert.equal(h.seen.closes, 0, "the error is the one terminal report");
});
