//! Clients: byte-level peers of the server ([`Client`]). Connecting, writing
//! bytes and messages, the handshake, requests, disconnects and reading
//! back-pressure, what the world does with the frames and closes the kernel
//! queues for a client, and the accessors for client state and responses.

use super::v8::{V8Client, V8Message};
use super::{Fact, Memo, World, is_delta};
use crate::summary;
use kernel::ids::ConnId;
use kernel::protocol::{
    ClientHello, ClientMessage, Command, CommandResult, ErrorCode, Request, Response,
    ServerMessage, encode_client_message,
};
use kernel::server::{CloseReason, Frame, Input};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use std::collections::VecDeque;
use std::sync::Arc;

/// A message the kernel queued for a client, decoded once.
#[derive(Debug, Clone)]
pub(super) enum Incoming {
    /// `message` is `None` for frames no checker reads (see
    /// [`Options::skip_unchecked`](super::Options::skip_unchecked)).
    Frame {
        len: usize,
        message: Option<Arc<ServerMessage>>,
        /// The frame's bytes, kept for a tapped client only.
        bytes: Option<Frame>,
        /// The message, for a v8 client (always decoded: it drives the client).
        v8: Option<Arc<V8Message>>,
    },
    Close,
}

/// One client: a byte-level peer of the server.
#[derive(Debug, Clone)]
pub struct Client {
    /// Every message received, in order (when
    /// [`Options::keep_received`](super::Options::keep_received)).
    pub received: Vec<ServerMessage>,
    /// The server closed it, or it disconnected.
    pub closed: bool,
    /// When false, the client does not read: output piles up in the server.
    pub reading: bool,
    /// It sent a hello.
    pub said_hello: bool,
    /// It received the server hello.
    pub ready: bool,
    /// It wrote raw bytes: whatever follows on its stream may be swallowed by
    /// a frame they started, so its later requests are owed nothing.
    pub garbled: bool,
    pub(super) unread: usize,
    pub(super) next_request: u64,
    /// Bytes not yet delivered to the server, in chunks tagged with a sequence number.
    pub(super) outbox: VecDeque<(u64, Vec<u8>)>,
    /// The client closed its end after the outbox (sequence number).
    pub(super) eof: Option<u64>,
    /// Frames (and the close) queued by the server and not yet read.
    pub(super) inbox: VecDeque<(u64, Memo<Incoming>)>,
    /// Bytes written so far, and the offsets at which whole frames end.
    written: u64,
    pub(super) frame_ends: VecDeque<u64>,
    /// Bytes delivered to the server so far.
    pub(super) delivered: u64,
    /// For a client driven by a client machine: the frames it read, in
    /// order, not yet taken ([`World::take_read`]).
    pub(super) tap: Option<Vec<Frame>>,
    /// For a v8 client: what it knows ([`World::connect_v8`]).
    pub v8: Option<Box<V8Client>>,
}

impl Client {
    fn new() -> Self {
        Self {
            received: Vec::new(),
            closed: false,
            reading: true,
            said_hello: false,
            ready: false,
            garbled: false,
            unread: 0,
            next_request: 1,
            outbox: VecDeque::new(),
            eof: None,
            inbox: VecDeque::new(),
            written: 0,
            frame_ends: VecDeque::new(),
            delivered: 0,
            tap: None,
            v8: None,
        }
    }

    /// Bytes written by the client and not yet delivered to the server.
    pub fn outbox_len(&self) -> usize {
        self.outbox.iter().map(|(_, b)| b.len()).sum()
    }
}

impl World {
    pub(super) fn on_send(
        &mut self,
        conn: ConnId,
        frame: Frame,
        message: Option<Arc<ServerMessage>>,
        v8: Option<Arc<V8Message>>,
    ) {
        let len = frame.len();
        if let Some(message) = &message
            && let ServerMessage::Response(Response {
                outcome: Err(error),
                ..
            }) = &**message
        {
            let milestone = match error.code {
                ErrorCode::Busy => Some(super::Milestone::Busy),
                ErrorCode::InvalidRequest => Some(super::Milestone::InvalidRequest),
                ErrorCode::NotFound => Some(super::Milestone::NotFound),
                _ => None,
            };
            if let Some(milestone) = milestone {
                self.reached.insert(milestone);
            }
        }
        if let Some(message) = &message
            && self.options.trace
            && (!is_delta(message) || self.options.trace_deltas)
        {
            let line = summary::server(&mut self.names, message);
            trace!(self, "{conn} ← {line}");
        }
        if let Some(message) = &v8
            && self.options.trace
            && let Some(line) =
                summary::v8_server(&mut self.names, message, self.options.trace_deltas)
        {
            trace!(self, "{conn} ← {line}");
        }
        let held = self.options.holds.to_client;
        let seq = self.next_seq();
        let Some(client) = self.clients.get_mut(&conn) else {
            return;
        };
        if held {
            if !client.closed {
                let bytes = client.tap.is_some().then_some(frame);
                let incoming = Incoming::Frame {
                    len,
                    message,
                    bytes,
                    v8,
                };
                client.inbox.push_back((seq, Memo::new(incoming)));
            }
            return;
        }
        if let Some(tap) = &mut client.tap
            && !client.closed
        {
            tap.push(frame);
        }
        if let Some(v8) = &v8
            && !client.closed
        {
            self.v8_read(conn, v8);
        }
        let client = self.clients.get_mut(&conn).expect("checked");
        if let Some(message) = message {
            if let ServerMessage::Hello(_) = message.as_ref() {
                client.ready = true;
            }
            if self.options.keep_received {
                client.received.push(message.as_ref().clone());
            }
        }
        if client.reading {
            self.push(Input::Written { conn, bytes: len });
        } else {
            client.unread += len;
        }
    }

    pub(super) fn on_close(&mut self, conn: ConnId, reason: CloseReason) {
        trace!(self, "{conn} closed by server ({reason})");
        if reason == CloseReason::SlowConsumer {
            self.reached.insert(super::Milestone::SlowConsumerClosed);
        }
        if self.options.holds.to_client && reason.flushes_first() {
            let seq = self.next_seq();
            if let Some(c) = self.clients.get_mut(&conn).filter(|c| !c.closed) {
                c.inbox.push_back((seq, Memo::new(Incoming::Close)));
                return;
            }
        }
        self.client_closed(conn);
        self.push(Input::Disconnected { conn });
    }

    /// The client side of a connection is gone: nothing more is sent or read.
    pub(super) fn client_closed(&mut self, conn: ConnId) {
        if let Some(c) = self.clients.get_mut(&conn) {
            if !c.closed {
                self.facts_closed(conn);
            }
            let c = self.clients.get_mut(&conn).expect("checked");
            c.closed = true;
            c.inbox.clear();
            c.outbox.clear();
            c.eof = None;
            self.active.remove(&conn);
        }
    }

    fn facts_closed(&mut self, conn: ConnId) {
        self.fact(Fact::ConnClosed { conn });
    }

    /// Opens a connection; returns its id.
    pub fn connect(&mut self) -> ConnId {
        self.connect_with(false)
    }

    /// Opens a connection for a client machine: the frames it reads are kept
    /// for [`World::take_read`].
    pub fn connect_tapped(&mut self) -> ConnId {
        self.connect_with(true)
    }

    fn connect_with(&mut self, tapped: bool) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        let mut client = Client::new();
        if tapped {
            client.tap = Some(Vec::new());
        }
        self.clients.insert(conn, client);
        self.active.insert(conn);
        if tapped {
            trace!(self, "{conn} connects (a client machine)");
        } else {
            trace!(self, "{conn} connects");
        }
        self.accepted(conn);
        self.run();
        conn
    }

    /// Notes a hello; the first frame of a clean stream is judged by the auth rule.
    fn hello_sent(&mut self, conn: ConnId, token: Option<String>) {
        let client = self.clients.get_mut(&conn).expect("known client");
        let first = !client.said_hello && client.next_request == 1 && !client.garbled;
        client.said_hello = true;
        if first && self.options.record_facts {
            let expected = self.options.token.clone();
            self.fact(Fact::HelloSent {
                conn,
                token,
                expected,
            });
        }
    }

    fn accepted(&mut self, conn: ConnId) {
        if self.options.record_facts {
            let at = self.now;
            self.fact(Fact::Accepted { conn, at });
        }
        self.push(Input::Accepted { conn, peer: None });
    }

    /// The frames a tapped client read since the last call.
    pub fn take_read(&mut self, conn: ConnId) -> Vec<Frame> {
        self.clients
            .get_mut(&conn)
            .and_then(|c| c.tap.as_mut())
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// A client machine writes one frame: recorded like [`World::send`]'s.
    pub fn send_frame(&mut self, conn: ConnId, bytes: Vec<u8>) {
        if self.clients.get(&conn).is_some_and(|c| c.v8.is_some()) {
            return self.send_v8_frame(conn, bytes);
        }
        let message = kernel::protocol::decode_client_message(
            &bytes[kernel::wire::frame::FRAME_HEADER_LEN..],
            &kernel::wire::CborLimits::default(),
        )
        .expect("a client machine sends valid frames");
        if self.options.trace {
            let line = summary::client(&mut self.names, &message);
            trace!(self, "{conn} → {line}");
        }
        let client = self.clients.get_mut(&conn).expect("known client");
        let open = !client.closed && client.eof.is_none();
        match message {
            ClientMessage::Hello(hello) => self.hello_sent(conn, hello.token),
            ClientMessage::Request(request) if open && self.options.record_facts => {
                self.fact(Fact::RequestSent {
                    conn,
                    id: request.id,
                    command: request.command,
                });
            }
            ClientMessage::Request(_) => {}
        }
        self.write(conn, bytes, true);
    }

    /// Opens a connection for a v8 client machine (the kernel's
    /// `client::v8::Connection`): the frames it reads are kept for
    /// [`World::take_read`], and what it sends and reads is mirrored as a
    /// v8 client's, for the checkers.
    pub fn connect_v8_tapped(&mut self) -> ConnId {
        let conn = self.connect_tapped();
        let client = self.clients.get_mut(&conn).expect("connected");
        client.v8 = Some(Box::default());
        conn
    }

    /// A v8 client machine writes one frame: its hello, or a request noted
    /// in the connection's mirror and as a fact, as the world's own v8
    /// clients' are.
    fn send_v8_frame(&mut self, conn: ConnId, bytes: Vec<u8>) {
        let payload = &bytes[kernel::wire::frame::FRAME_HEADER_LEN..];
        let limits = kernel::wire::CborLimits::default();
        let value =
            kernel::wire::cbor::decode(payload, &limits).expect("a client machine sends CBOR");
        let client = &self.clients[&conn];
        let open = !client.closed && client.eof.is_none() && !client.garbled;
        if value.get("type") == Some(&kernel::wire::Value::text("hello")) {
            trace!(self, "{conn} → hello v8 (a client machine)");
            self.clients
                .get_mut(&conn)
                .expect("known client")
                .said_hello = true;
            return self.write(conn, bytes, true);
        }
        let message = kernel::protocol::v8::decode_client_message(payload, &limits)
            .expect("a client machine sends valid v8 frames");
        if let kernel::protocol::v8::ClientMessage::Request { id, target, call } = message
            && let Some(call) = kernel::chord::call::ServiceCall::parse(&call)
        {
            trace!(self, "{conn} → #{id} {}.{}", call.service_id, call.member);
            if open {
                let client = self.clients.get_mut(&conn).expect("known client");
                if let Some(v8) = client.v8.as_deref_mut() {
                    v8.sent(&id, super::v8::Asked::of(&target, &call));
                }
                if self.options.record_facts {
                    self.fact(Fact::V8RequestSent {
                        conn,
                        id,
                        target,
                        call,
                    });
                }
            }
        }
        self.write(conn, bytes, true);
    }

    /// Sends raw bytes.
    pub fn send_bytes(&mut self, conn: ConnId, bytes: Vec<u8>) {
        trace!(self, "{conn} → {} raw bytes", bytes.len());
        self.clients.get_mut(&conn).expect("known client").garbled = true;
        self.write(conn, bytes, false);
    }

    pub(super) fn write(&mut self, conn: ConnId, bytes: Vec<u8>, frame: bool) {
        self.write_with(conn, bytes, frame, true);
    }

    /// [`Self::write`]; without `run`, unheld bytes wait in the kernel's
    /// inbox for the run under way (a client answering what it reads
    /// while the kernel's outputs are carried out).
    pub(super) fn write_with(&mut self, conn: ConnId, bytes: Vec<u8>, frame: bool, run: bool) {
        if self.options.holds.to_server {
            let seq = self.next_seq();
            let client = self.clients.get_mut(&conn).expect("known client");
            if !client.closed && client.eof.is_none() {
                client.written += bytes.len() as u64;
                if frame {
                    client.frame_ends.push_back(client.written);
                }
                client.outbox.push_back((seq, bytes));
            }
            return;
        }
        self.push(Input::Received { conn, bytes });
        if run {
            self.run();
        }
    }

    /// Sends one message.
    pub fn send(&mut self, conn: ConnId, message: &ClientMessage) {
        if self.options.trace {
            let line = summary::client(&mut self.names, message);
            trace!(self, "{conn} → {line}");
        }
        if let ClientMessage::Hello(hello) = message {
            self.hello_sent(conn, hello.token.clone());
        }
        let payload = encode_client_message(message).expect("encodable");
        let bytes = encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("fits");
        self.write(conn, bytes, true);
    }

    /// Sends `hello` (with the token, if any).
    pub fn hello(&mut self, conn: ConnId, version: u64, token: Option<&str>) {
        let hello = ClientHello {
            version,
            token: token.map(str::to_string),
        };
        self.send(conn, &ClientMessage::Hello(hello));
    }

    /// Connects and completes the handshake.
    pub fn connect_ready(&mut self) -> ConnId {
        let conn = self.connect();
        let token = self.options.token.clone();
        self.hello(conn, 1, token.as_deref());
        conn
    }

    /// Sends a request; returns its id.
    pub fn request(&mut self, conn: ConnId, command: Command) -> String {
        let client = self.clients.get_mut(&conn).expect("known client");
        let id = format!("r{}", client.next_request);
        client.next_request += 1;
        let open = !client.closed && client.eof.is_none() && !client.garbled;
        if open && self.options.record_facts {
            let fact = Fact::RequestSent {
                conn,
                id: id.clone(),
                command: command.clone(),
            };
            self.fact(fact);
        }
        self.send(
            conn,
            &ClientMessage::Request(Request {
                id: id.clone(),
                command,
            }),
        );
        id
    }

    /// The id the next request of `conn` gets.
    pub fn next_request_id(&self, conn: ConnId) -> String {
        format!("r{}", self.clients[&conn].next_request)
    }

    /// The client disconnects. With held deliveries, the server sees the end
    /// of the stream after the bytes already written (`abrupt` drops them).
    pub fn disconnect(&mut self, conn: ConnId) {
        self.disconnect_with(conn, false);
    }

    /// [`World::disconnect`], choosing whether bytes still in flight are lost.
    pub fn disconnect_with(&mut self, conn: ConnId, abrupt: bool) {
        trace!(
            self,
            "{conn} disconnects{}",
            if abrupt { " abruptly" } else { "" }
        );
        let held = self.options.holds.to_server;
        let seq = self.next_seq();
        let Some(c) = self.clients.get_mut(&conn) else {
            return;
        };
        if held && !abrupt && !c.closed {
            c.inbox.clear();
            c.eof = Some(seq);
            if !c.closed {
                c.closed = true;
                self.facts_closed(conn);
            }
            return;
        }
        if !held {
            c.closed = true;
        } else {
            self.client_closed(conn);
        }
        self.push(Input::Disconnected { conn });
        self.run();
    }

    /// Stops or resumes reading on a client.
    pub fn set_reading(&mut self, conn: ConnId, reading: bool) {
        let client = self.clients.get_mut(&conn).expect("known client");
        client.reading = reading;
        let unread = std::mem::take(&mut client.unread);
        if reading && unread > 0 && !client.closed {
            self.push(Input::Written {
                conn,
                bytes: unread,
            });
            self.run();
        }
    }

    /// A client's state.
    pub fn client(&self, conn: ConnId) -> &Client {
        &self.clients[&conn]
    }

    /// Every client, in id order.
    pub fn clients(&self) -> impl Iterator<Item = (ConnId, &Client)> {
        self.clients.iter().map(|(id, c)| (*id, c))
    }

    /// Connections the kernel has sent bytes to and not yet forgotten, in id order.
    pub fn kernel_conns(&self) -> Vec<ConnId> {
        self.unwritten.keys().copied().collect()
    }

    /// Bytes the kernel queued for `conn` that were not reported written.
    pub fn unwritten(&self, conn: ConnId) -> usize {
        self.unwritten.get(&conn).copied().unwrap_or(0)
    }

    /// The response to request `id` on `conn`, if it arrived.
    pub fn response(&self, conn: ConnId, id: &str) -> Option<&kernel::protocol::Response> {
        self.clients[&conn].received.iter().find_map(|m| match m {
            ServerMessage::Response(r) if r.id == id => Some(r),
            _ => None,
        })
    }

    /// The session id created by request `id` on `conn`.
    pub fn created(&self, conn: ConnId, id: &str) -> String {
        match self.response(conn, id).map(|r| &r.outcome) {
            Some(Ok(CommandResult::Create { session })) => session.id.clone(),
            other => panic!("request {id} did not create a session: {other:?}"),
        }
    }
}
