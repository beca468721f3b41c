//! One pi protocol v8 connection of a client of ours, sans-IO: the hello,
//! requests and their answers, the states it follows as replicas, its
//! attachment, and the reconnection policy every client of ours runs
//! ([`ClientLimits`]).
//!
//! - **Server-scope states** named in [`Config::follow`] (our session
//!   status, say) are subscribed after every hello.
//! - **One session at a time** ([`Request::Attach`]): pi's management
//!   attaches it, then its transcript and models are subscribed; the attach
//!   is answered once both replicas are in. After a reconnection, or an
//!   `attachment: null` it did not ask for (a worker died, the server hands
//!   over), the same session is attached again and its replicas arrive
//!   whole: nothing is replayed, so nothing is told twice or lost. A
//!   session that is gone refuses the attach, and is not wanted any more.
//! - A loss after a handshake reconnects with bounded exponential backoff
//!   within the reconnect window; requests in flight then fail
//!   [`ClientError::Disconnected`] (they may have run: the caller judges by
//!   the replicas). The first handshake is not retried.
//!
//! # Calling protocol
//!
//! As every kernel machine: [`Connection::step`]`(now, input)` returns the
//! outputs to carry out in order; [`Connection::next_deadline`] says when
//! to feed [`Input::Tick`].
//!
//! # Invariants
//!
//! Checked after every step ([`Connection::invariants`]):
//! - Invariant: requests are pending, and states followed, only while the
//!   transport is up (handshaking or ready).
//! - Invariant: session replicas exist only under the current route, and
//!   an attach under way is for the session wanted.

use std::collections::{BTreeMap, BTreeSet};

use super::calls::error_code;
use super::replica::Replica;
use super::{Incoming, Route};
use crate::chord::call::{CallError, ServiceCall};
use crate::client::{CallId, ClientError, Reconnection, Status, TransportFailure};
use crate::limits::ClientLimits;
use crate::protocol::v8::PROTOCOL_VERSION_V8;
use crate::protocol::{ErrorCode, ProtocolError};
use crate::time::Instant;
use crate::wire::frame::encode_frame;
use crate::wire::{FrameDecoder, Value, cbor};

/// pi's transcript, followed for the attached session.
pub const TRANSCRIPT: &str = "pi.transcript";
/// pi's models state, followed for the attached session.
pub const MODELS: &str = "pi.models";
/// pi's session management (server scope).
pub const MANAGEMENT: &str = "pi.session-management";
/// Ours: every session's status (server scope, a state).
pub const STATUS: &str = "pi-server.session-status";
/// Ours: create with a working directory, name and model; the models offered.
pub const SESSIONS: &str = "pi-server.sessions";
/// pi's agent controller (session scope).
pub const AGENT: &str = "pi.agent-controller";
/// Ours: a session's approval policy and the questions waiting.
pub const APPROVALS: &str = "pi-server.approvals";
/// The session states an attachment follows.
const SESSION_STATES: [&str; 3] = [TRANSCRIPT, MODELS, APPROVALS];
const CONTROL: &str = "$chord.service";

/// How a connection is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The logical server every request names.
    pub server_id: String,
    /// Server-scope states to follow (subscribed after every hello).
    pub follow: Vec<&'static str>,
    /// Reconnect after the transport is lost.
    pub reconnect: bool,
    /// The driver can start the server: a reconnection that finds nothing
    /// listening starts one, once.
    pub launch: bool,
    /// Bounds and deadlines.
    pub limits: ClientLimits,
}

/// What a call asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A server-scope method.
    Server(ServiceCall),
    /// A method of the attached session's services.
    Session(ServiceCall),
    /// Attach this session (see the module docs).
    Attach(String),
    /// Detach; nothing is attached again after a reconnection.
    Detach,
}

/// One input to [`Connection::step`].
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A transport is open (the first, or the answer to [`Output::Connect`]).
    TransportUp,
    /// [`Output::Connect`] could not open a transport.
    ConnectFailed {
        /// How it failed.
        failure: TransportFailure,
        /// The system's words.
        message: String,
    },
    /// Bytes read from the transport.
    Received(Vec<u8>),
    /// The transport ended.
    TransportClosed {
        /// What the driver saw.
        message: String,
    },
    /// A deadline passed (spurious ticks are harmless).
    Tick,
    /// A call, answered by exactly one [`Output::Complete`].
    Call {
        /// Its token.
        call: CallId,
        /// What it asks.
        request: Request,
    },
    /// The application is done.
    Dispose,
}

/// What changed, for the application to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// A server-scope state followed.
    Server(&'static str),
    /// The attached session's transcript or models.
    Session,
    /// The attachment: this session now, or none (detached, or the session
    /// was taken away: removed).
    Route(Option<String>),
}

/// One output of [`Connection::step`], carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Open a new transport to the same address.
    Connect,
    /// Start the server (nothing listens at its address).
    Launch,
    /// Write these bytes (whole frames).
    Transmit(Vec<u8>),
    /// Close the transport after writing what was transmitted.
    CloseTransport,
    /// A call finished: a method's result (`None`: void), or why not.
    Complete {
        /// Its token.
        call: CallId,
        /// Its outcome.
        result: Result<Option<Value>, ClientError>,
    },
    /// Something followed changed.
    Changed(Changed),
    /// The connection's status changed.
    Status(Status),
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Connecting,
    Handshaking { deadline: Instant },
    Ready,
    Backoff { retry_at: Instant },
    Closed { error: ClientError },
}

/// A request on the wire, until its answer.
#[derive(Debug, Clone, PartialEq)]
enum Pending {
    /// A caller's method call.
    Call(CallId),
    /// A subscription; `session` for a session state.
    Subscribe {
        subscription: String,
        service: &'static str,
        session: bool,
    },
    /// pi's `attach` (the caller's, or ours after a reconnection).
    Attach { session: String },
    /// pi's `detach`, the caller's.
    Detach(CallId),
}

/// An attach under way: the caller (none after a reconnection), and the
/// session states still to come.
#[derive(Debug, Clone, PartialEq)]
struct Attaching {
    call: Option<CallId>,
    session: String,
    waiting: BTreeSet<&'static str>,
}

/// The connection machine. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Connection {
    config: Config,
    phase: Phase,
    ever_ready: bool,
    /// The reconnection under way.
    reconnection: Option<Reconnection>,
    decoder: FrameDecoder,
    next_id: u64,
    pending: BTreeMap<String, Pending>,
    /// Subscriptions by id, with whether they are of the session.
    subs: BTreeMap<String, (Replica, bool)>,
    route: Option<Route>,
    /// The session to be attached (again after a reconnection).
    want: Option<String>,
    attaching: Option<Attaching>,
    now: Instant,
    outputs: Vec<Output>,
}

impl Connection {
    /// A connection whose first transport the driver opens now (then
    /// feeds [`Input::TransportUp`]).
    pub fn new(config: Config) -> Self {
        Self {
            decoder: FrameDecoder::new(config.limits.max_frame_len),
            config,
            phase: Phase::Connecting,
            ever_ready: false,
            reconnection: None,
            next_id: 0,
            pending: BTreeMap::new(),
            subs: BTreeMap::new(),
            route: None,
            want: None,
            attaching: None,
            now: Instant(0),
            outputs: Vec::new(),
        }
    }

    /// Feeds one input; returns the outputs to carry out, in order.
    pub fn step(&mut self, now: Instant, input: Input) -> Vec<Output> {
        self.now = now;
        match input {
            Input::TransportUp => self.on_transport_up(),
            Input::ConnectFailed { failure, message } => self.on_connect_failed(failure, message),
            Input::Received(bytes) => self.on_received(&bytes),
            Input::TransportClosed { message } => {
                if matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready) {
                    self.lost(message);
                }
            }
            Input::Tick => self.on_tick(),
            Input::Call { call, request } => self.on_call(call, request),
            Input::Dispose => self.close(ClientError::Disconnected(
                "the client closed the connection".into(),
            )),
        }
        if cfg!(debug_assertions) {
            self.invariants();
        }
        std::mem::take(&mut self.outputs)
    }

    /// When to feed [`Input::Tick`], if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Handshaking { deadline } => Some(deadline),
            Phase::Backoff { retry_at } => Some(retry_at),
            _ => None,
        }
    }

    /// Why the connection ended for good, if it did.
    pub fn closed(&self) -> Option<&ClientError> {
        match &self.phase {
            Phase::Closed { error } => Some(error),
            _ => None,
        }
    }

    /// The attachment, if any.
    pub fn route(&self) -> Option<&Route> {
        self.route.as_ref()
    }

    /// A server-scope state followed, once its snapshot is in.
    pub fn server_state(&self, service: &str) -> Option<&Value> {
        self.state(service, false)
    }

    /// A state of the attached session, once its snapshot is in.
    pub fn session_state(&self, service: &str) -> Option<&Value> {
        self.state(service, true)
    }

    fn state(&self, service: &str, session: bool) -> Option<&Value> {
        self.subs
            .values()
            .find(|(r, s)| *s == session && r.service == service)
            .and_then(|(r, _)| r.state.as_ref())
            .map(|(_, value)| value)
    }

    /// Checks the invariants (see the module docs); panics on a breach.
    pub fn invariants(&self) {
        let up = matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready);
        assert!(
            up || (self.pending.is_empty() && self.subs.is_empty() && self.route.is_none()),
            "requests or states outside a transport: {:?}",
            self.phase
        );
        assert!(
            self.route.is_some() || self.subs.values().all(|(_, session)| !session),
            "session replicas without a route"
        );
        if let Some(attaching) = &self.attaching {
            assert_eq!(
                self.want.as_ref(),
                Some(&attaching.session),
                "an attach of a session not wanted"
            );
        }
    }

    // ---- transport ----

    fn on_transport_up(&mut self) {
        if self.phase != Phase::Connecting {
            self.outputs.push(Output::CloseTransport);
            return;
        }
        self.decoder = FrameDecoder::new(self.config.limits.max_frame_len);
        let hello = Value::object(vec![
            ("type", Value::text("hello")),
            ("version", Value::Int(PROTOCOL_VERSION_V8 as i64)),
        ]);
        self.transmit(&hello);
        self.phase = Phase::Handshaking {
            deadline: self.now + self.config.limits.handshake_timeout,
        };
    }

    fn on_connect_failed(&mut self, failure: TransportFailure, message: String) {
        if self.phase != Phase::Connecting {
            return;
        }
        let launch = self.config.launch;
        let launches = self
            .reconnection
            .as_mut()
            .is_some_and(|r| r.launches(failure.nothing_listening(), launch));
        let message = if launches {
            self.outputs.push(Output::Launch);
            format!("{message}; starting a server")
        } else {
            message
        };
        self.lost(message);
    }

    fn on_tick(&mut self) {
        match self.phase {
            Phase::Handshaking { deadline } if self.now >= deadline => {
                self.outputs.push(Output::CloseTransport);
                let ms = self.config.limits.handshake_timeout.as_millis();
                self.lost(format!("no hello from the server within {ms} ms"));
            }
            Phase::Backoff { retry_at } if self.now >= retry_at => {
                self.phase = Phase::Connecting;
                if let Some(reconnection) = &mut self.reconnection {
                    reconnection.attempt();
                }
                self.outputs.push(Output::Connect);
            }
            _ => {}
        }
    }

    /// The transport is gone (or never came): what was on it fails, then
    /// reconnect or close.
    fn lost(&mut self, reason: String) {
        let was_ready = self.phase == Phase::Ready;
        self.drop_transport_state(&format!("the connection was lost ({reason})"));
        if !self.ever_ready || !self.config.reconnect {
            let error = match self.ever_ready {
                true => ClientError::Disconnected(reason),
                false => ClientError::Disconnected(format!("during the handshake: {reason}")),
            };
            return self.close(error);
        }
        let now = self.now;
        let reconnection = *self
            .reconnection
            .get_or_insert_with(|| Reconnection::new(now));
        let retry_at = match reconnection.next_attempt(now, &self.config.limits, &reason) {
            Ok(at) => at,
            Err(error) => return self.close(error),
        };
        self.phase = Phase::Backoff { retry_at };
        if was_ready {
            self.outputs
                .push(Output::Status(Status::Reconnecting { reason }));
        }
    }

    /// Everything that lived on the transport goes: calls fail, states and
    /// the route are forgotten (a reconnection gets them whole again).
    fn drop_transport_state(&mut self, why: &str) {
        for (_, pending) in std::mem::take(&mut self.pending) {
            let call = match pending {
                Pending::Call(call) | Pending::Detach(call) => Some(call),
                Pending::Attach { .. } | Pending::Subscribe { .. } => None,
            };
            if let Some(call) = call {
                self.complete(call, Err(ClientError::Disconnected(why.into())));
            }
        }
        if let Some(Attaching {
            call: Some(call), ..
        }) = self.attaching.take()
        {
            self.complete(call, Err(ClientError::Disconnected(why.into())));
        }
        self.subs.clear();
        if self.route.take().is_some() {
            self.outputs.push(Output::Changed(Changed::Route(None)));
        }
    }

    fn close(&mut self, error: ClientError) {
        if self.closed().is_some() {
            return;
        }
        let open = matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready);
        self.drop_transport_state(&error.to_string());
        self.want = None;
        self.phase = Phase::Closed {
            error: error.clone(),
        };
        if open {
            self.outputs.push(Output::CloseTransport);
        }
        self.outputs.push(Output::Status(Status::Closed { error }));
    }

    // ---- inbound ----

    fn on_received(&mut self, bytes: &[u8]) {
        let mut payloads = Vec::new();
        let pushed = self.decoder.push(bytes, &mut payloads);
        for payload in payloads {
            if !matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready) {
                return;
            }
            let message = match cbor::decode(&payload, &self.config.limits.cbor) {
                Ok(value) => Incoming::from_value(value),
                Err(e) => Incoming::Malformed(format!("not CBOR: {e}")),
            };
            self.on_message(message);
        }
        if let Err(e) = pushed
            && matches!(self.phase, Phase::Handshaking { .. } | Phase::Ready)
        {
            self.close(ClientError::Protocol(e.to_string()));
        }
    }

    fn on_message(&mut self, message: Incoming) {
        let handshaking = matches!(self.phase, Phase::Handshaking { .. });
        match message {
            Incoming::Hello { server_id } if handshaking => self.on_hello(server_id),
            Incoming::HelloError(error) if handshaking => {
                let refused = ProtocolError::new(error_code(&error.code), error.message);
                let for_good = matches!(refused.code, ErrorCode::Auth | ErrorCode::Version);
                if self.ever_ready && self.config.reconnect && !for_good {
                    // The server's state of the moment: try again.
                    self.outputs.push(Output::CloseTransport);
                    return self.lost(format!("the server refused the hello: {}", refused.message));
                }
                self.close(ClientError::Server(refused));
            }
            _ if handshaking => self.close(ClientError::Protocol(
                "the server sent a message before its hello".into(),
            )),
            Incoming::Hello { .. } | Incoming::HelloError(_) => self.close(ClientError::Protocol(
                "the server sent a second hello".into(),
            )),
            Incoming::Malformed(why) => self.close(ClientError::Protocol(why)),
            Incoming::Response { id, outcome } => self.on_response(id, outcome),
            Incoming::Update {
                subscription_id,
                update,
            } => self.on_update(&subscription_id, &update),
            Incoming::Attachment(route) => self.on_attachment(route),
        }
    }

    fn on_hello(&mut self, server_id: String) {
        if server_id != self.config.server_id {
            return self.close(ClientError::Protocol(format!(
                "the server is {server_id}, not {}",
                self.config.server_id
            )));
        }
        let reconnected = self.ever_ready;
        self.phase = Phase::Ready;
        self.ever_ready = true;
        self.reconnection = None;
        self.outputs.push(Output::Status(Status::Ready {
            connection_id: server_id,
            reconnected,
        }));
        for service in self.config.follow.clone() {
            self.subscribe(service, false);
        }
        if let Some(session) = self.want.clone() {
            self.attach(None, session);
        }
    }

    fn on_response(&mut self, id: String, outcome: Result<Option<Value>, CallError>) {
        let Some(pending) = self.pending.remove(&id) else {
            return self.close(ClientError::Protocol(format!(
                "an answer to request {id}, which was not asked"
            )));
        };
        let error =
            |e: CallError| ClientError::Server(ProtocolError::new(error_code(&e.code), e.message));
        match pending {
            Pending::Call(call) => self.complete(call, outcome.map_err(error)),
            Pending::Detach(call) => {
                self.complete(call, outcome.map_err(error));
            }
            Pending::Attach { session } => match outcome {
                Ok(_) => self.attached(&session),
                Err(e) => {
                    if self.want.as_deref() == Some(&session) {
                        self.want = None;
                    }
                    if let Some(attaching) = self.attaching.take()
                        && let Some(call) = attaching.call
                    {
                        self.complete(call, Err(error(e)));
                    }
                }
            },
            Pending::Subscribe {
                subscription,
                service,
                session,
            } => {
                let route = session.then(|| self.route.clone()).flatten();
                let replica = match outcome {
                    Ok(Some(snapshot)) => Replica::from_snapshot(service, route, snapshot),
                    Ok(None) => Err(format!(
                        "{service}: a subscribe answered without a snapshot"
                    )),
                    // The session went while we subscribed: its route's end says so.
                    Err(_) if session => return,
                    Err(e) => Err(format!("{service}: {}", e.message)),
                };
                match replica {
                    Ok(replica) => {
                        self.subs.insert(subscription, (replica, session));
                        self.outputs.push(Output::Changed(match session {
                            true => Changed::Session,
                            false => Changed::Server(service),
                        }));
                        if session {
                            self.settle_attach(service);
                        }
                    }
                    Err(why) => self.close(ClientError::Protocol(why)),
                }
            }
        }
    }

    fn on_update(&mut self, subscription: &str, update: &Value) {
        // Updates of a subscription ended (its route went) are no news.
        let Some((replica, session)) = self.subs.get_mut(subscription) else {
            return;
        };
        if let Err(why) = replica.update(update) {
            return self.close(ClientError::Protocol(why));
        }
        let changed = match *session {
            true => Changed::Session,
            false => {
                let service = self.config.follow.iter().find(|s| **s == replica.service);
                Changed::Server(service.copied().unwrap_or(STATUS))
            }
        };
        self.outputs.push(Output::Changed(changed));
    }

    fn on_attachment(&mut self, route: Option<Route>) {
        if route == self.route {
            return;
        }
        self.subs.retain(|_, (_, session)| !*session);
        self.route = route;
        let session = self.route.as_ref().map(|r| r.session_id.clone());
        self.outputs
            .push(Output::Changed(Changed::Route(session.clone())));
        // Taken away: its worker died, its server is handing over, or it
        // was removed. Attach it again; the server says which (a removed
        // one is `session_not_found`, and nothing is attached again).
        if session.is_none()
            && self.attaching.is_none()
            && let Some(wanted) = self.want.clone()
        {
            self.attach(None, wanted);
        }
    }

    // ---- calls ----

    fn on_call(&mut self, call: CallId, request: Request) {
        if let Some(error) = self.closed() {
            let error = error.clone();
            return self.complete(call, Err(error));
        }
        if self.phase != Phase::Ready {
            return self.complete(
                call,
                Err(ClientError::Disconnected(
                    "not connected to the server (reconnecting)".into(),
                )),
            );
        }
        if self.pending.len() >= self.config.limits.max_calls_in_flight {
            let max = self.config.limits.max_calls_in_flight;
            return self.complete(
                call,
                Err(ClientError::TooMany(format!("{max} calls in flight"))),
            );
        }
        match request {
            Request::Server(service_call) => {
                let target = self.server_target();
                self.request(Pending::Call(call), target, &service_call);
            }
            Request::Session(service_call) => match self.session_target() {
                Some(target) => self.request(Pending::Call(call), target, &service_call),
                None => self.complete(
                    call,
                    Err(ClientError::Detached {
                        session_id: self.want.clone().unwrap_or_default(),
                    }),
                ),
            },
            Request::Attach(session) => {
                if let Some(Attaching {
                    call: Some(earlier),
                    ..
                }) = self.attaching.take()
                {
                    self.complete(
                        earlier,
                        Err(ClientError::Disconnected(
                            "another attach replaced this one".into(),
                        )),
                    );
                }
                self.want = Some(session.clone());
                self.attach(Some(call), session);
            }
            Request::Detach => {
                self.want = None;
                self.attaching = None;
                let target = self.server_target();
                let detach = ServiceCall::singleton(MANAGEMENT, "detach", vec![]);
                self.request(Pending::Detach(call), target, &detach);
            }
        }
    }

    fn attach(&mut self, call: Option<CallId>, session: String) {
        if self.route.as_ref().is_some_and(|r| r.session_id == session)
            && SESSION_STATES
                .iter()
                .all(|s| self.session_state(s).is_some())
        {
            // Attached already, its states in: pi's attach is a no-op.
            if let Some(call) = call {
                self.complete(call, Ok(None));
            }
            return;
        }
        self.attaching = Some(Attaching {
            call,
            session: session.clone(),
            waiting: SESSION_STATES.into_iter().collect(),
        });
        let target = self.server_target();
        let attach = ServiceCall::singleton(MANAGEMENT, "attach", vec![Value::text(&session)]);
        self.request(Pending::Attach { session }, target, &attach);
    }

    /// pi's attach answered: the route is announced; follow its states.
    fn attached(&mut self, session: &str) {
        let current = self
            .attaching
            .as_ref()
            .is_some_and(|a| a.session == session)
            && self.route.as_ref().is_some_and(|r| r.session_id == session);
        if !current {
            return;
        }
        for service in SESSION_STATES {
            if self.session_state(service).is_none() {
                self.subscribe(service, true);
            } else {
                self.settle_attach(service);
            }
        }
    }

    fn settle_attach(&mut self, service: &'static str) {
        let Some(attaching) = &mut self.attaching else {
            return;
        };
        attaching.waiting.remove(service);
        if attaching.waiting.is_empty() {
            let attaching = self.attaching.take().expect("checked");
            if let Some(call) = attaching.call {
                self.complete(call, Ok(None));
            }
        }
    }

    fn subscribe(&mut self, service: &'static str, session: bool) {
        let target = match session {
            true => match self.session_target() {
                Some(target) => target,
                None => return,
            },
            false => self.server_target(),
        };
        self.next_id += 1;
        let subscription = format!("service-{}", self.next_id);
        let call = ServiceCall::singleton(
            CONTROL,
            "subscribe",
            vec![
                Value::text(&subscription),
                Value::text(service),
                Value::text("singleton"),
            ],
        );
        let pending = Pending::Subscribe {
            subscription,
            service,
            session,
        };
        self.request(pending, target, &call);
    }

    fn request(&mut self, pending: Pending, target: Value, call: &ServiceCall) {
        self.next_id += 1;
        let id = format!("r{}", self.next_id);
        let message = Value::object(vec![
            ("type", Value::text("request")),
            ("id", Value::text(&id)),
            ("target", target),
            ("call", call.to_value()),
        ]);
        if self.transmit(&message) {
            self.pending.insert(id, pending);
        } else if let Pending::Call(call) | Pending::Detach(call) = pending {
            self.complete(
                call,
                Err(ClientError::TooMany(
                    "the request is larger than a frame".into(),
                )),
            );
        }
    }

    fn server_target(&self) -> Value {
        Value::object(vec![("serverId", Value::text(&self.config.server_id))])
    }

    fn session_target(&self) -> Option<Value> {
        let route = self.route.as_ref()?;
        Some(Value::object(vec![
            ("serverId", Value::text(&self.config.server_id)),
            ("sessionId", Value::text(&route.session_id)),
            ("attachmentId", Value::text(&route.attachment_id)),
        ]))
    }

    /// Frames and queues `message`; false if it cannot be sent.
    fn transmit(&mut self, message: &Value) -> bool {
        let frame = cbor::to_vec(message)
            .ok()
            .and_then(|payload| encode_frame(&payload, self.config.limits.max_frame_len).ok());
        match frame {
            Some(frame) => {
                self.outputs.push(Output::Transmit(frame));
                true
            }
            None => false,
        }
    }

    fn complete(&mut self, call: CallId, result: Result<Option<Value>, ClientError>) {
        self.outputs.push(Output::Complete { call, result });
    }
}
