//! The client-connection machine: everything a pi protocol v1 client
//! decides, as one sans-IO value that every client front end (the CLI, the
//! terminal UI, the ACP adapter, the web client's server side) drives.
//!
//! [`Client`] owns, for one logical connection to a server:
//!
//! - the transport's life: the `hello` (with the token), its deadline, the
//!   server hello's version, frame decoding and encoding;
//! - request ids, the pending table and response matching, through the
//!   lease machine ([`lease::Leases`]), so plain requests and leases share one
//!   id space;
//! - the snapshot cache: the latest server snapshot and, per session, the
//!   latest session snapshot in revision order;
//! - **the reconnect policy** (when [`ClientConfig::reconnect`] is set): when
//!   the transport is lost after a handshake succeeded (the server was
//!   replaced, crashed or restarted), it asks for a new transport with
//!   bounded exponential backoff, says hello again, re-attaches every session
//!   a lease holds (or that a plain `attach` attached), and settles every
//!   request that was in flight:
//!   - a `prompt` whose turn went on (the re-attached snapshot holds its user
//!     message) resolves with the first idle snapshot of that session, as its
//!     response would have;
//!   - a `prompt` the server cannot be known to have taken, and every other
//!     request, fails with [`ClientError::Disconnected`] saying so.
//!
//! The first handshake is not retried: a refused `hello` or a server that
//! is not there is the caller's answer. On a reconnection, a `hello_error`
//! for good (`auth`: a new token; `version`: a new protocol) ends the client;
//! any other (our hello came after the server's handshake deadline, the
//! server is shutting down for a hand-off or at its connection limit) is
//! the server's state of the moment, and the reconnection goes on.
//!
//! # Calling protocol
//!
//! As every kernel machine: [`Client::step`]`(now, input)` returns the outputs
//! to carry out in order, and [`Client::next_deadline`] says when to feed
//! [`ClientInput::Tick`]. The driver owns the transport: it opens one when
//! told ([`ClientOutput::Connect`]), reports it ([`ClientInput::TransportUp`],
//! [`ClientInput::ConnectFailed`]), moves bytes ([`ClientInput::Received`],
//! [`ClientOutput::Transmit`]) and reports its end
//! ([`ClientInput::TransportClosed`]).
//!
//! # Invariants
//!
//! Checked after every step ([`Client::invariants`]):
//! - Invariant: the lease machine is connected exactly while the phase is
//!   `Ready`, and suspended exactly while a reconnection is under way.
//! - Invariant: every call waiting for a resumed prompt is waiting in
//!   exactly one place, and only while the client is not closed.
//! - Invariant: the cached session snapshots never go back in revision
//!   while one connection lasts.

#![warn(missing_docs)]

pub mod follow;
pub mod front;
pub mod lease;
pub mod lookup;
mod reconnect;
pub mod slash;
pub mod v8;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::limits::ClientLimits;
use crate::protocol::{
    ClientHello, ClientMessage, Command, CommandResult, PROTOCOL_VERSION, ProtocolError,
    ServerEvent, ServerMessage, ServerSnapshot, SessionPhase, SessionSnapshot, TranscriptItem,
    decode_server_message, encode_client_message,
};
use crate::time::Instant;
use crate::wire::FrameDecoder;
use crate::wire::frame::encode_frame;

pub use lease::{CallId, Completion, LeaseId, LeaseMode, LeaseStatus, ReleaseKind, SessionCommand};
use lease::{LeaseError, LeaseInput, LeaseOutput, Leases};
pub(crate) use reconnect::Reconnection;

/// How a client connects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientConfig {
    /// Sent in every `hello`.
    pub token: Option<String>,
    /// Reconnect after the transport is lost (the driver can open a new one).
    pub reconnect: bool,
    /// The driver can start the server (the CLI's own servers, started on
    /// demand): a reconnection that finds nothing listening starts one, once.
    pub launch: bool,
    /// Bounds and deadlines.
    pub limits: ClientLimits,
}

/// One API call of the client, answered by exactly one
/// [`ClientOutput::Complete`] with the same [`CallId`].
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// Any command, outside the lease rules.
    Request(Command),
    /// Lease an existing session.
    Acquire {
        /// The session.
        session_id: String,
        /// Exclusive or shared.
        mode: LeaseMode,
    },
    /// `create` a session, held by an exclusive lease.
    Create(crate::protocol::CreateParams),
    /// Release a lease.
    Release {
        /// The lease.
        lease: LeaseId,
        /// What a failed `detach` does to it.
        kind: ReleaseKind,
    },
    /// A session command through a lease.
    Command {
        /// The lease.
        lease: LeaseId,
        /// The command.
        command: SessionCommand,
    },
}

/// One input to [`Client::step`].
#[derive(Debug, Clone, PartialEq)]
pub enum ClientInput {
    /// A transport is open (the first one, or the answer to
    /// [`ClientOutput::Connect`]): the hello goes out.
    TransportUp,
    /// [`ClientOutput::Connect`] could not open a transport.
    ConnectFailed {
        /// What the driver saw.
        reason: String,
        /// Nothing listens at the address (no socket, or refused): no
        /// server runs there.
        absent: bool,
    },
    /// Bytes read from the transport.
    Received(Vec<u8>),
    /// The transport ended (the peer closed it, or reading or writing failed).
    TransportClosed {
        /// What the driver saw.
        reason: String,
    },
    /// A deadline passed (spurious ticks are harmless).
    Tick,
    /// An API call.
    Call {
        /// Its completion token (unique while outstanding).
        call: CallId,
        /// What it asks.
        call_kind: Call,
    },
    /// The driver dropped a lease's handle (see [`lease::LeaseInput::Forget`]).
    Forget {
        /// The lease.
        lease: LeaseId,
    },
    /// The application is done: fail what is pending, close the transport.
    Dispose,
}

/// Where the connection stands, as [`ClientOutput::Status`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// The handshake completed.
    Ready {
        /// The server's name for this connection.
        connection_id: String,
        /// True when this is a reconnection.
        reconnected: bool,
    },
    /// The transport was lost; a reconnection is under way.
    Reconnecting {
        /// What ended the last transport.
        reason: String,
    },
    /// The client is closed for good.
    Closed {
        /// Why.
        error: ClientError,
    },
}

/// One output of [`Client::step`], carried out in order.
// Outputs live for one step and are moved once; boxing the event would
// cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ClientOutput {
    /// Open a new transport to the same server address.
    Connect,
    /// Start the server (nothing listens at its address); a later
    /// [`ClientOutput::Connect`] finds it.
    Launch,
    /// Write these bytes (whole frames) to the transport, in order.
    Transmit(Vec<u8>),
    /// Close the transport after writing what was transmitted.
    CloseTransport,
    /// An API call finished.
    Complete {
        /// Its token.
        call: CallId,
        /// Its outcome.
        result: Result<Completion, ClientError>,
    },
    /// A server event, for the application's subscribers (after the cache
    /// took it in). A re-attachment's snapshot is reported as a
    /// `session_snapshot` event too, so a follower sees the state after a gap.
    Event(ServerEvent),
    /// The connection's status changed.
    Status(Status),
}

/// Why a call failed or the client closed.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientError {
    /// The transport could not be opened, read or written (its driver
    /// classifies the system's error).
    Transport {
        /// What kind of failure.
        failure: TransportFailure,
        /// The system's words for it.
        message: String,
    },
    /// The server refused: a `hello_error`, or a response with `ok:false`.
    Server(ProtocolError),
    /// The server broke the protocol; the client is closed.
    Protocol(String),
    /// The connection is gone (or reconnecting); the text says how and what
    /// became of the request.
    Disconnected(String),
    /// The lease conflicts with one this client holds; nothing was sent.
    Ownership {
        /// The contested session.
        session_id: String,
    },
    /// The lease is not active, or its session is not attached.
    Detached {
        /// The lease's session.
        session_id: String,
    },
    /// A bound of this client's own ([`ClientLimits`]) was reached; nothing
    /// was sent.
    TooMany(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport { message, .. } => f.write_str(message),
            Self::Server(e) => write!(f, "{} ({})", e.message, e.code.as_str()),
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
            Self::Disconnected(m) => write!(f, "disconnected: {m}"),
            Self::Ownership { session_id } => {
                write!(f, "session {session_id} is already leased in this client")
            }
            Self::Detached { session_id } => {
                write!(f, "session {session_id} is not attached through this lease")
            }
            Self::TooMany(m) => write!(f, "too many: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Why a transport failed, as its driver classifies the system's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// Nothing at the address: no socket file.
    Absent,
    /// Nothing listening there: the connection was refused.
    Refused,
    /// Cut off part way: reset, a broken pipe, an early end of stream.
    CutOff,
    /// Anything else.
    Other,
}

impl TransportFailure {
    /// Nothing answers at the address, so a server may be started there.
    pub fn nothing_listening(self) -> bool {
        matches!(self, Self::Absent | Self::Refused)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Hello sent; waiting for the server's.
    Handshaking { deadline: Instant },
    /// Handshake done.
    Ready,
    /// Transport lost: waiting until `retry_at` to ask for a new one.
    Backoff { retry_at: Instant },
    /// [`ClientOutput::Connect`] went out.
    Connecting,
    /// Closed for good.
    Closed { error: ClientError },
}

/// A prompt handed back by a suspension: it resolves from the session's
/// snapshots once the re-attachment shows whether its turn ran.
#[derive(Debug, Clone, PartialEq)]
struct Resuming {
    session_id: String,
    text: String,
    /// Transcript length known when the prompt was sent: its user message
    /// can only be after it.
    base: usize,
    /// Its user message was seen after the reconnection.
    seen: bool,
}

/// The client-connection machine. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Client {
    config: ClientConfig,
    phase: Phase,
    /// Set once a handshake succeeded (reconnection applies only then).
    ever_ready: bool,
    reconnection: Option<Reconnection>,
    connection_id: Option<String>,
    decoder: FrameDecoder,
    leases: Leases,
    server: Option<ServerSnapshot>,
    sessions: BTreeMap<String, SessionSnapshot>,
    /// Sessions removed while this connection lasts: a snapshot of one
    /// after its removal is stale and not taken.
    removed: BTreeSet<String>,
    /// Transcript length at send time of each prompt request in flight.
    prompt_bases: BTreeMap<String, usize>,
    /// Re-attachments in flight after a reconnection: request id → session.
    reattaching: BTreeMap<String, String>,
    resuming: BTreeMap<CallId, Resuming>,
    /// The time of the current step.
    now: Instant,
    outputs: Vec<ClientOutput>,
}

impl Client {
    /// A client whose first transport is open: feed [`ClientInput::TransportUp`].
    pub fn new(config: ClientConfig) -> Self {
        let decoder = FrameDecoder::new(config.limits.max_frame_len);
        Self {
            config,
            phase: Phase::Connecting,
            ever_ready: false,
            reconnection: None,
            connection_id: None,
            decoder,
            leases: Leases::new(),
            server: None,
            sessions: BTreeMap::new(),
            removed: BTreeSet::new(),
            prompt_bases: BTreeMap::new(),
            reattaching: BTreeMap::new(),
            resuming: BTreeMap::new(),
            now: Instant(0),
            outputs: Vec::new(),
        }
    }

    /// Feeds one input and returns what it causes, in order.
    pub fn step(&mut self, now: Instant, input: ClientInput) -> Vec<ClientOutput> {
        assert!(self.outputs.is_empty());
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        self.now = now;
        match input {
            ClientInput::TransportUp => self.on_transport_up(now),
            ClientInput::ConnectFailed { reason, absent } => {
                self.on_connect_failed(now, reason, absent)
            }
            ClientInput::Received(bytes) => self.on_received(&bytes),
            ClientInput::TransportClosed { reason } => self.on_transport_closed(now, reason),
            ClientInput::Tick => self.on_tick(now),
            ClientInput::Call { call, call_kind } => self.on_call(call, call_kind),
            ClientInput::Forget { lease } => self.lease_step(LeaseInput::Forget { lease }),
            ClientInput::Dispose => self.on_dispose(),
        }
        self.settle_detached();
        self.invariants();
        std::mem::take(&mut self.outputs)
    }

    /// When to feed the next [`ClientInput::Tick`].
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Handshaking { deadline } => Some(deadline),
            Phase::Backoff { retry_at } => Some(retry_at),
            Phase::Ready | Phase::Connecting | Phase::Closed { .. } => None,
        }
    }

    /// True once the handshake completed and while the connection is up.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Why the client closed, if it has.
    pub fn closed(&self) -> Option<&ClientError> {
        match &self.phase {
            Phase::Closed { error } => Some(error),
            _ => None,
        }
    }

    /// The server's name for the current (or last) connection.
    pub fn connection_id(&self) -> Option<&str> {
        self.connection_id.as_deref()
    }

    /// The latest server snapshot (from the hello or a later event).
    pub fn server_snapshot(&self) -> Option<&ServerSnapshot> {
        self.server.as_ref()
    }

    /// The latest snapshot of a session seen on this client.
    pub fn session_snapshot(&self, session_id: &str) -> Option<&SessionSnapshot> {
        self.sessions.get(session_id)
    }

    /// The lease machine, for status queries.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    // ---- transport ----

    fn on_transport_up(&mut self, now: Instant) {
        if self.phase != Phase::Connecting {
            // Closed meanwhile: the driver drops the transport.
            self.outputs.push(ClientOutput::CloseTransport);
            return;
        }
        self.decoder = FrameDecoder::new(self.config.limits.max_frame_len);
        self.removed.clear();
        let hello = ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: self.config.token.clone(),
        });
        match self.frame(&hello) {
            Ok(frame) => self.outputs.push(ClientOutput::Transmit(frame)),
            Err(error) => return self.close(error),
        }
        self.phase = Phase::Handshaking {
            deadline: now + self.config.limits.handshake_timeout,
        };
    }

    fn on_connect_failed(&mut self, now: Instant, reason: String, absent: bool) {
        if self.phase != Phase::Connecting {
            return;
        }
        // The server is gone (it crashed, or retired): start it again, once
        // per reconnection, and find it at a later attempt.
        let launch = self.config.launch;
        let launches = self
            .reconnection
            .as_mut()
            .is_some_and(|r| r.launches(absent, launch));
        let reason = if launches {
            let reason = format!("{reason}; starting a server");
            self.outputs.push(ClientOutput::Launch);
            self.outputs
                .push(ClientOutput::Status(Status::Reconnecting {
                    reason: reason.clone(),
                }));
            reason
        } else {
            reason
        };
        self.transport_lost(now, reason);
    }

    fn on_transport_closed(&mut self, now: Instant, reason: String) {
        match self.phase {
            Phase::Handshaking { .. } | Phase::Ready => self.transport_lost(now, reason),
            Phase::Backoff { .. } | Phase::Connecting | Phase::Closed { .. } => {}
        }
    }

    fn on_tick(&mut self, now: Instant) {
        match self.phase {
            Phase::Handshaking { deadline } if now >= deadline => {
                self.outputs.push(ClientOutput::CloseTransport);
                let ms = self.config.limits.handshake_timeout.as_millis();
                self.transport_lost(now, format!("no hello from the server within {ms} ms"));
            }
            Phase::Backoff { retry_at } if now >= retry_at => {
                self.phase = Phase::Connecting;
                if let Some(reconnection) = &mut self.reconnection {
                    reconnection.attempt();
                }
                self.outputs.push(ClientOutput::Connect);
            }
            _ => {}
        }
    }

    /// The transport is gone (or never came): reconnect or close.
    fn transport_lost(&mut self, now: Instant, reason: String) {
        let was_ready = self.phase == Phase::Ready;
        if !self.ever_ready || !self.config.reconnect {
            let error = if self.ever_ready {
                ClientError::Disconnected(reason)
            } else {
                ClientError::Disconnected(format!("during the handshake: {reason}"))
            };
            return self.close(error);
        }
        let reconnection = *self
            .reconnection
            .get_or_insert_with(|| Reconnection::new(now));
        let retry_at = match reconnection.next_attempt(now, &self.config.limits, &reason) {
            Ok(at) => at,
            Err(error) => return self.close(error),
        };
        self.phase = Phase::Backoff { retry_at };
        if was_ready {
            self.reattaching.clear();
            self.outputs
                .push(ClientOutput::Status(Status::Reconnecting { reason }));
            self.lease_step(LeaseInput::Suspend);
        }
    }

    fn on_dispose(&mut self) {
        if self.closed().is_some() {
            return;
        }
        self.lease_step(LeaseInput::DisposeClient);
        self.close(ClientError::Disconnected(
            "the client closed the connection".into(),
        ));
    }

    /// Closes for good: every call still waiting fails with `error`.
    fn close(&mut self, error: ClientError) {
        if self.closed().is_some() {
            return;
        }
        let transport_open = matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready);
        self.phase = Phase::Closed {
            error: error.clone(),
        };
        self.lease_step(LeaseInput::Disconnected);
        for (call, _) in std::mem::take(&mut self.resuming) {
            self.complete(call, Err(error.clone()));
        }
        self.prompt_bases.clear();
        self.reattaching.clear();
        if transport_open && !self.outputs.contains(&ClientOutput::CloseTransport) {
            self.outputs.push(ClientOutput::CloseTransport);
        }
        self.outputs
            .push(ClientOutput::Status(Status::Closed { error }));
    }

    // ---- inbound ----

    fn on_received(&mut self, bytes: &[u8]) {
        if !matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready) {
            return;
        }
        let mut payloads = Vec::new();
        let pushed = self.decoder.push(bytes, &mut payloads);
        for payload in payloads {
            if !matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready) {
                return;
            }
            match decode_server_message(&payload, &self.config.limits.cbor) {
                Ok(message) => self.on_message(message),
                Err(e) => {
                    return self.close(ClientError::Protocol(format!(
                        "bad message from the server: {e}"
                    )));
                }
            }
        }
        if let Err(e) = pushed
            && matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready)
        {
            self.close(ClientError::Protocol(e.to_string()));
        }
    }

    fn on_message(&mut self, message: ServerMessage) {
        if let Phase::Handshaking { .. } = self.phase {
            return self.on_handshake_message(message);
        }
        match message {
            ServerMessage::Hello(_) => {
                self.close(ClientError::Protocol(
                    "the server sent a second hello".into(),
                ));
            }
            ServerMessage::HelloError(error) => self.close(ClientError::Server(error)),
            ServerMessage::Response(response) => {
                self.prompt_bases.remove(&response.id);
                let reattached = self.reattaching.remove(&response.id);
                if let Ok(result) = &response.outcome {
                    self.observe_result(result);
                }
                let outcome = response.outcome.clone();
                self.lease_step(LeaseInput::Response(response));
                if let Some(session_id) = reattached {
                    self.reattached(&session_id, outcome);
                }
            }
            ServerMessage::Event(event) => {
                // An older revision than the cached one is no news: the
                // server never sends one (revisions rise per connection),
                // and a front end would follow it back in time.
                if let ServerEvent::SessionSnapshot { snapshot } = &event
                    && self
                        .sessions
                        .get(&snapshot.id)
                        .is_some_and(|known| known.revision > snapshot.revision)
                {
                    return;
                }
                self.observe_event(&event);
                let resumed = match &event {
                    ServerEvent::SessionSnapshot { snapshot } => Some(snapshot.id.clone()),
                    _ => None,
                };
                self.outputs.push(ClientOutput::Event(event.clone()));
                self.lease_step(LeaseInput::Event(event));
                if let Some(session_id) = resumed {
                    self.settle_resuming(&session_id, false);
                }
            }
        }
    }

    /// A `hello_error` on a reconnection is retried unless it is for good:
    /// a token (`auth`) or protocol version (`version`) the server refuses.
    fn retries_hello_error(&self, error: &ProtocolError) -> bool {
        use crate::protocol::ErrorCode;
        self.ever_ready
            && self.config.reconnect
            && !matches!(error.code, ErrorCode::Auth | ErrorCode::Version)
    }

    fn on_handshake_message(&mut self, message: ServerMessage) {
        let hello = match message {
            ServerMessage::Hello(hello) => hello,
            ServerMessage::HelloError(error) if self.retries_hello_error(&error) => {
                // The server's state of the moment (our hello came late, it
                // is shutting down for a hand-off, it is full): try again.
                self.outputs.push(ClientOutput::CloseTransport);
                let reason = format!("the server refused the hello: {}", error.message);
                return self.transport_lost(self.now, reason);
            }
            ServerMessage::HelloError(error) => return self.close(ClientError::Server(error)),
            ServerMessage::Response(_) | ServerMessage::Event(_) => {
                return self.close(ClientError::Protocol(
                    "the server sent a message before its hello".into(),
                ));
            }
        };
        if hello.version != PROTOCOL_VERSION {
            return self.close(ClientError::Protocol(format!(
                "the server speaks protocol version {}, this client speaks {PROTOCOL_VERSION}",
                hello.version
            )));
        }
        let reconnected = self.ever_ready;
        self.phase = Phase::Ready;
        self.ever_ready = true;
        self.reconnection = None;
        self.connection_id = Some(hello.connection_id.clone());
        // A new server numbers its snapshots afresh.
        self.server = Some(hello.snapshot);
        self.outputs.push(ClientOutput::Status(Status::Ready {
            connection_id: hello.connection_id,
            reconnected,
        }));
        self.lease_step(LeaseInput::Connected);
    }

    fn observe_session(&mut self, snapshot: &SessionSnapshot) {
        if self.removed.contains(&snapshot.id) {
            return;
        }
        let newer = self
            .sessions
            .get(&snapshot.id)
            .is_none_or(|known| known.revision <= snapshot.revision);
        if newer {
            self.sessions.insert(snapshot.id.clone(), snapshot.clone());
        }
    }

    fn observe_event(&mut self, event: &ServerEvent) {
        match event {
            ServerEvent::ServerSnapshot { snapshot } => {
                let newer = self
                    .server
                    .as_ref()
                    .is_none_or(|known| known.revision <= snapshot.revision);
                if newer {
                    self.server = Some(snapshot.clone());
                }
            }
            ServerEvent::SessionSnapshot { snapshot } => self.observe_session(snapshot),
            ServerEvent::SessionProgress { .. } => {}
            ServerEvent::SessionRemoved { session_id } => {
                self.sessions.remove(session_id);
                self.removed.insert(session_id.clone());
            }
        }
    }

    fn observe_result(&mut self, result: &CommandResult) {
        if let Some(session) = result.session() {
            self.observe_session(session);
        } else if let CommandResult::Remove { session_id } = result {
            self.sessions.remove(session_id);
            self.removed.insert(session_id.clone());
        }
    }

    /// A re-attachment's response: followers get its snapshot as an event,
    /// and the prompts resumed on the session learn whether they ran.
    fn reattached(&mut self, session_id: &str, outcome: Result<CommandResult, ProtocolError>) {
        if self.closed().is_some() {
            return;
        }
        match outcome {
            Ok(CommandResult::Attach { session }) => {
                let snapshot = self.sessions.get(session_id).cloned().unwrap_or(session);
                self.outputs
                    .push(ClientOutput::Event(ServerEvent::SessionSnapshot {
                        snapshot,
                    }));
                self.settle_resuming(session_id, true);
            }
            Ok(_) => {}
            Err(error) => {
                let reason = format!(
                    "session {session_id} could not be re-attached after reconnecting: {} ({})",
                    error.message,
                    error.code.as_str()
                );
                self.fail_resuming(|r| r.session_id == session_id, &reason);
            }
        }
    }

    /// A resumed prompt waits for an idle snapshot of its session, which a
    /// session detached since (its lease released, the session removed)
    /// never sends: connected and not re-attaching it, the prompt ends as
    /// lost (it may have run).
    fn settle_detached(&mut self) {
        if self.phase != Phase::Ready || self.resuming.is_empty() {
            return;
        }
        let detached: Vec<String> = self
            .resuming
            .values()
            .map(|r| &r.session_id)
            .filter(|s| !self.leases.is_attached(s) && !self.reattaching.values().any(|r| r == *s))
            .cloned()
            .collect();
        self.fail_resuming(
            |r| detached.contains(&r.session_id),
            "the session was detached before the resumed prompt's turn ended",
        );
    }

    /// Fails the resumed prompts that `which` selects.
    fn fail_resuming(&mut self, which: impl Fn(&Resuming) -> bool, reason: &str) {
        let calls: Vec<CallId> = self
            .resuming
            .iter()
            .filter(|(_, r)| which(r))
            .map(|(call, _)| *call)
            .collect();
        for call in calls {
            self.resuming.remove(&call);
            self.complete(call, Err(ClientError::Disconnected(reason.to_owned())));
        }
    }

    // ---- calls ----

    fn on_call(&mut self, call: CallId, kind: Call) {
        if let Some(refusal) = self.over_bounds(&kind) {
            return self.complete(call, Err(ClientError::TooMany(refusal)));
        }
        let input = match kind {
            Call::Request(command) => LeaseInput::Request { call, command },
            Call::Acquire { session_id, mode } => LeaseInput::Acquire {
                call,
                session_id,
                mode,
            },
            Call::Create(params) => LeaseInput::Create { call, params },
            Call::Release { lease, kind } => LeaseInput::Release { call, lease, kind },
            Call::Command { lease, command } => LeaseInput::Command {
                call,
                lease,
                command,
            },
        };
        self.lease_step(input);
    }

    /// Why `kind` would take this client past one of its bounds, if it would.
    fn over_bounds(&self, kind: &Call) -> Option<String> {
        let limits = &self.config.limits;
        let outstanding = self.leases.outstanding_calls() + self.resuming.len();
        if outstanding >= limits.max_calls_in_flight {
            return Some(format!(
                "{outstanding} calls are outstanding, the most this client takes at once"
            ));
        }
        let attaching = match kind {
            Call::Acquire { session_id, .. } => self.leases.holder_count(session_id) == 0,
            Call::Create(_) => true,
            Call::Request(Command::Attach { .. } | Command::Create(_)) => true,
            Call::Request(_) | Call::Release { .. } | Call::Command { .. } => false,
        };
        let held = self.leases.sessions_held();
        (attaching && held >= limits.max_sessions)
            .then(|| format!("{held} sessions are held, the most this client attaches at once"))
    }

    /// Steps the lease machine and carries its outputs into ours.
    fn lease_step(&mut self, input: LeaseInput) {
        let reattaching = matches!(input, LeaseInput::Connected);
        for output in self.leases.step(self.now, input) {
            match output {
                LeaseOutput::Send(request) => {
                    match &request.command {
                        Command::Prompt { session_id, .. } => {
                            let base = self
                                .sessions
                                .get(session_id)
                                .map_or(0, |s| s.transcript.len());
                            self.prompt_bases.insert(request.id.clone(), base);
                        }
                        Command::Attach { session_id } if reattaching => {
                            self.reattaching
                                .insert(request.id.clone(), session_id.clone());
                        }
                        _ => {}
                    }
                    match self.frame(&ClientMessage::Request(request)) {
                        Ok(frame) => self.outputs.push(ClientOutput::Transmit(frame)),
                        Err(error) => return self.close(error),
                    }
                }
                LeaseOutput::Complete { call, result } => {
                    let result = result.map_err(|e| self.error(e));
                    self.complete(call, result);
                }
                LeaseOutput::CloseConnection { error } => {
                    if let LeaseError::Protocol { reason } = error {
                        self.outputs.push(ClientOutput::CloseTransport);
                        self.close(ClientError::Protocol(reason));
                    }
                }
                LeaseOutput::Orphaned { call, request } => {
                    let Command::Prompt { session_id, text } = request.command else {
                        unreachable!("only prompts are orphaned")
                    };
                    let base = self.prompt_bases.remove(&request.id).unwrap_or(0);
                    let resuming = Resuming {
                        session_id,
                        text,
                        base,
                        seen: false,
                    };
                    assert!(self.resuming.insert(call, resuming).is_none());
                }
            }
        }
        if reattaching {
            // A prompt resumed on a session that is not re-attached cannot
            // learn its outcome.
            let sessions: Vec<String> = self.reattaching.values().cloned().collect();
            self.fail_resuming(
                |r| !sessions.contains(&r.session_id),
                "the connection to the server was lost and the session is no longer attached",
            );
        }
    }

    fn complete(&mut self, call: CallId, result: Result<Completion, ClientError>) {
        self.outputs.push(ClientOutput::Complete { call, result });
    }

    /// Resolves the prompts resumed on `session_id` from its cached
    /// snapshot. `reattached`: the snapshot is the one a re-attachment (or
    /// any attach) returned, which shows whether the prompt ran.
    fn settle_resuming(&mut self, session_id: &str, reattached: bool) {
        let Some(snapshot) = self.sessions.get(session_id).cloned() else {
            return;
        };
        let calls: Vec<CallId> = self
            .resuming
            .iter()
            .filter(|(_, r)| r.session_id == session_id)
            .map(|(call, _)| *call)
            .collect();
        for call in calls {
            let resuming = self.resuming.get_mut(&call).expect("listed");
            if !resuming.seen {
                resuming.seen = holds_prompt(&snapshot, resuming.base, &resuming.text);
            }
            if !resuming.seen && reattached {
                self.resuming.remove(&call);
                let error = ClientError::Disconnected(
                    "the connection to the server was lost before it took the prompt".into(),
                );
                self.outputs.push(ClientOutput::Complete {
                    call,
                    result: Err(error),
                });
            } else if resuming.seen && snapshot.phase == SessionPhase::Idle {
                self.resuming.remove(&call);
                self.outputs.push(ClientOutput::Complete {
                    call,
                    result: Ok(Completion::Session(Box::new(snapshot.clone()))),
                });
            }
        }
    }

    fn error(&self, error: LeaseError) -> ClientError {
        match error {
            LeaseError::Ownership { session_id } => ClientError::Ownership { session_id },
            LeaseError::Detached { session_id } => ClientError::Detached { session_id },
            LeaseError::Disconnected => match &self.phase {
                // Later calls fail with the reason the client closed.
                Phase::Closed { error } => error.clone(),
                _ if self.ever_ready && self.config.reconnect => ClientError::Disconnected(
                    "the connection to the server was lost; reconnecting".into(),
                ),
                _ => ClientError::Disconnected("the connection is closed".into()),
            },
            LeaseError::ClientDisposed => {
                ClientError::Disconnected("the client has been disposed".into())
            }
            LeaseError::Server(error) => ClientError::Server(error),
            LeaseError::Protocol { reason } => ClientError::Protocol(reason),
            LeaseError::UnknownLease { lease } => {
                ClientError::Protocol(format!("unknown lease {lease}"))
            }
        }
    }

    fn frame(&self, message: &ClientMessage) -> Result<Vec<u8>, ClientError> {
        let payload = encode_client_message(message)
            .map_err(|e| ClientError::Protocol(format!("cannot encode the request: {e}")))?;
        encode_frame(&payload, self.config.limits.max_frame_len)
            .map_err(|e| ClientError::Protocol(format!("cannot frame the request: {e}")))
    }

    // ---- invariants ----

    /// Asserts the machine's invariants; [`step`](Self::step) runs it last.
    pub fn invariants(&self) {
        assert_eq!(
            self.leases.is_connected(),
            self.phase == Phase::Ready,
            "leases connected exactly while ready ({:?})",
            self.phase
        );
        let reconnecting = matches!(
            self.phase,
            Phase::Handshaking { .. } | Phase::Backoff { .. } | Phase::Connecting
        ) && self.ever_ready;
        if self.leases.is_suspended() {
            assert!(reconnecting, "suspended leases outside a reconnection");
        }
        if self.closed().is_some() {
            assert!(self.resuming.is_empty(), "resumed prompts after close");
            assert!(!self.leases.is_suspended());
        }
        if !reconnecting && self.phase != Phase::Ready {
            assert!(
                self.resuming.is_empty(),
                "resumed prompts while not resuming"
            );
        }
        assert!(self.prompt_bases.len() + self.reattaching.len() <= self.leases.pending_requests());
        let limits = &self.config.limits;
        assert!(
            self.leases.outstanding_calls() + self.resuming.len() <= limits.max_calls_in_flight,
            "calls beyond max_calls_in_flight"
        );
        assert!(
            self.leases.pending_requests() <= limits.max_requests_in_flight(),
            "requests in flight beyond the bound hosts size their queues by"
        );
    }
}

/// True if `snapshot` holds a user message with `text` at `base` or later.
fn holds_prompt(snapshot: &SessionSnapshot, base: usize, text: &str) -> bool {
    snapshot
        .transcript
        .iter()
        .skip(base)
        .any(|item| match item {
            TranscriptItem::User(user) => follow::text_of(&user.content) == text,
            _ => false,
        })
}

#[cfg(test)]
mod tests;
