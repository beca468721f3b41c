//! Protocol v8 clients: byte-level peers that say `hello` with version 8
//! and speak chord services ([`V8Client`]).
//!
//! A v8 client sends requests (`{type:"request", id, target, call}`) and
//! cancels, and reads what the server sends as plain CBOR values
//! ([`V8Message`]): the hello, responses, `service_update`s and
//! `attachment` envelopes. It keeps what a real client keeps:
//!
//! - the **route** the last `attachment` envelope announced (its session
//!   requests are addressed with it, and may be fenced when it is stale);
//! - one **replica** per subscription (the kernel's [`Replica`], as a
//!   client of ours keeps it): the snapshot's value, then every `state`
//!   update decoded and applied, its sequence checked;
//! - the requests it is owed an answer for, and the operation ids its
//!   prompts were given.
//!
//! What does not decode or apply is reported as a problem; the world
//! records it as a [`super::Fact::V8Broken`] and the checkers judge it.
//! The same machine, fed at emission instead of at reading, is the
//! checkers' mirror of each v8 connection.

use super::{Fact, World};
use crate::summary;
pub use crate::v8::*;
use kernel::chord::call::{CallError, ServiceCall};
pub use kernel::client::v8::replica::Replica;
use kernel::ids::ConnId;
use kernel::protocol::v8::{PROTOCOL_VERSION_V8, Target};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{Value, cbor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a v8 client knows from what it sent and read. See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct V8Client {
    /// The server hello arrived.
    pub ready: bool,
    /// The route the last `attachment` envelope announced.
    pub route: Option<Route>,
    /// Requests not answered yet.
    pub pending: BTreeMap<String, Asked>,
    /// Active subscriptions, by id.
    pub subs: BTreeMap<String, Replica>,
    /// Why subscriptions ended: `unsubscribed`, or the envelope that ended their route.
    pub ended: BTreeMap<String, String>,
    /// Operation ids the prompts were given, newest last.
    pub operations: Vec<String>,
    /// Every answer, by request id (kept with
    /// [`Options::keep_received`](super::Options::keep_received)).
    pub answers: BTreeMap<String, Result<Option<Value>, CallError>>,
    /// Every message read, in order (kept with `keep_received`).
    pub received: Vec<V8Message>,
    /// Services subscribed to afresh whenever a new route is announced.
    pub auto_subscribe: Vec<&'static str>,
    pub(super) next_subscription: u64,
}

/// What reading one message did.
#[derive(Debug, Default)]
pub struct Read {
    /// What was wrong with it.
    pub problems: Vec<String>,
    /// The route changed to a new one.
    pub new_route: bool,
}

impl V8Client {
    /// Notes a request sent.
    pub fn sent(&mut self, id: &str, asked: Asked) {
        self.pending.insert(id.to_string(), asked);
    }

    /// Reads one message in stream order.
    pub fn read(&mut self, message: &V8Message, keep: bool) -> Read {
        let mut read = Read::default();
        if keep {
            self.received.push(message.clone());
        }
        match message {
            V8Message::Hello { .. } => self.ready = true,
            V8Message::HelloError(_) => {}
            V8Message::Malformed(why) => read.problems.push(format!("malformed message: {why}")),
            V8Message::Attachment(route) => {
                if *route != self.route {
                    let why = match route {
                        Some(r) => format!("replaced by route {}", r.attachment_id),
                        None => "ended by attachment null".to_string(),
                    };
                    let gone: Vec<String> = self
                        .subs
                        .iter()
                        .filter(|(_, s)| s.route.is_some() && s.route != *route)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in gone {
                        self.subs.remove(&id);
                        self.ended.insert(id, why.clone());
                    }
                    read.new_route = route.is_some();
                    self.route = route.clone();
                }
            }
            V8Message::Response { id, outcome } => {
                if keep {
                    self.answers.insert(id.clone(), outcome.clone());
                }
                match (self.pending.remove(id), outcome) {
                    (
                        Some(Asked::Subscribe {
                            subscription_id,
                            service,
                            route,
                        }),
                        Ok(Some(snapshot)),
                    ) => match Replica::from_snapshot(&service, route, snapshot.clone()) {
                        Ok(replica) => {
                            self.ended.remove(&subscription_id);
                            self.subs.insert(subscription_id, replica);
                        }
                        Err(e) => read.problems.push(e),
                    },
                    (Some(Asked::Subscribe { service, .. }), Ok(None)) => read.problems.push(
                        format!("{service}: a subscribe answered without a snapshot"),
                    ),
                    (Some(Asked::Unsubscribe(sub)), Ok(_)) => {
                        self.subs.remove(&sub);
                        self.ended.insert(sub, "unsubscribed".into());
                    }
                    (Some(Asked::Prompt), Ok(Some(result))) => {
                        if let Some(Value::Text(op)) = result.get("operationId") {
                            self.operations.push(op.clone());
                            if self.operations.len() > 8 {
                                self.operations.remove(0);
                            }
                        }
                    }
                    _ => {}
                }
            }
            V8Message::Update {
                subscription_id,
                update,
            } => {
                if let Some(replica) = self.subs.get_mut(subscription_id)
                    && let Err(e) = replica.update(update)
                {
                    read.problems.push(format!("{subscription_id}: {e}"));
                }
            }
        }
        read
    }

    /// Folds what decides this client's future into a fingerprint.
    pub fn fingerprint(&self, out: &mut impl std::fmt::Write) {
        let _ = write!(
            out,
            "|v8 {} {:?} {:?} {:?} {} {:?}",
            self.ready,
            self.route,
            self.pending,
            self.operations,
            self.next_subscription,
            self.auto_subscribe
        );
        for (id, r) in &self.subs {
            let state = r.state.as_ref().map(|(s, v)| (s, v.json_text()));
            let _ = write!(
                out,
                " {id} {} {:?} {state:?} {:?}",
                r.service,
                r.route,
                r.decoder()
            );
        }
    }

    /// The id the next subscription gets (`service-N`, as pi's client names them).
    pub fn next_subscription_id(&self) -> String {
        format!("service-{}", self.next_subscription + 1)
    }

    /// The replica of the active subscription to `service`, if any.
    pub fn replica(&self, service: &str) -> Option<&Replica> {
        self.subs.values().find(|r| r.service == service)
    }

    /// The state of the active subscription to `service`, if any.
    pub fn state(&self, service: &str) -> Option<&Value> {
        self.replica(service)
            .and_then(|r| r.state.as_ref())
            .map(|(_, v)| v)
    }
}

/// A target as its wire value.
pub fn target_value(target: &Target) -> Value {
    match target {
        Target::Server { server_id } => Value::object(vec![("serverId", Value::text(server_id))]),
        Target::Session {
            server_id,
            session_id,
            attachment_id,
        } => Value::object(vec![
            ("serverId", Value::text(server_id)),
            ("sessionId", Value::text(session_id)),
            ("attachmentId", Value::text(attachment_id)),
        ]),
    }
}

/// The server target of the simulated server.
pub fn server_target() -> Target {
    Target::Server {
        server_id: super::SERVER_ID.to_string(),
    }
}

/// The session target of `route`.
pub fn session_target(route: &Route) -> Target {
    Target::Session {
        server_id: super::SERVER_ID.to_string(),
        session_id: route.session_id.clone(),
        attachment_id: route.attachment_id.clone(),
    }
}

fn frame(value: &Value) -> Vec<u8> {
    let payload = cbor::to_vec(value).expect("a client value encodes");
    encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("fits")
}

/// `{message, images:null}`, an `AgentPromptRequest`.
pub fn prompt_request(text: &str) -> Value {
    Value::object(vec![
        ("message", Value::text(text)),
        ("images", Value::Null),
    ])
}

impl World {
    /// Opens a connection for a v8 client (it has not said hello yet).
    pub fn connect_v8_silent(&mut self) -> ConnId {
        let conn = self.connect();
        let client = self.clients.get_mut(&conn).expect("connected");
        client.v8 = Some(Box::default());
        conn
    }

    /// Opens a connection for a v8 client and says hello with version 8.
    pub fn connect_v8(&mut self) -> ConnId {
        let conn = self.connect_v8_silent();
        self.v8_hello(conn);
        conn
    }

    /// Sends `{type:"hello", version:8}` (v8 carries no token).
    pub fn v8_hello(&mut self, conn: ConnId) {
        trace!(self, "{conn} → hello v8");
        let client = self.clients.get_mut(&conn).expect("known client");
        client.said_hello = true;
        let hello = Value::object(vec![
            ("type", Value::text("hello")),
            ("version", Value::Int(PROTOCOL_VERSION_V8 as i64)),
        ]);
        self.write(conn, frame(&hello), true);
    }

    /// Services the v8 client subscribes to afresh at every new route.
    pub fn set_v8_auto_subscribe(&mut self, conn: ConnId, services: Vec<&'static str>) {
        if let Some(v8) = self
            .clients
            .get_mut(&conn)
            .and_then(|c| c.v8.as_deref_mut())
        {
            v8.auto_subscribe = services;
        }
    }

    /// The number of items in the transcript of the runtime a live worker
    /// runs for `session_id`, once it opened it.
    pub fn runtime_items(&self, session_id: &str) -> Option<usize> {
        self.workers
            .values()
            .filter(|w| w.session_id == session_id && w.stage != super::WorkerStage::Dead)
            .find_map(|w| w.runtime())
            .map(|r| r.state().transcript.len())
    }

    /// The v8 state of a client.
    pub fn v8_client(&self, conn: ConnId) -> &V8Client {
        self.clients[&conn].v8.as_deref().expect("a v8 client")
    }

    /// Whether `conn` is a v8 client's.
    pub fn is_v8(&self, conn: ConnId) -> bool {
        self.clients.get(&conn).is_some_and(|c| c.v8.is_some())
    }

    /// Sends a request; returns its id.
    pub fn v8_request(&mut self, conn: ConnId, target: Target, call: ServiceCall) -> String {
        self.v8_request_with(conn, target, call, true)
    }

    fn v8_request_with(
        &mut self,
        conn: ConnId,
        target: Target,
        call: ServiceCall,
        run: bool,
    ) -> String {
        let client = self.clients.get_mut(&conn).expect("known client");
        let id = format!("r{}", client.next_request);
        client.next_request += 1;
        let open = !client.closed && client.eof.is_none() && !client.garbled;
        let asked = Asked::of(&target, &call);
        if let Some(v8) = client.v8.as_deref_mut()
            && open
        {
            v8.sent(&id, asked);
        }
        if open && self.options.record_facts {
            self.fact(Fact::V8RequestSent {
                conn,
                id: id.clone(),
                target: target.clone(),
                call: call.clone(),
            });
        }
        if self.options.trace {
            let line = summary::v8_request(&mut self.names, &id, &target, &call);
            trace!(self, "{conn} → {line}");
        }
        let request = Value::object(vec![
            ("type", Value::text("request")),
            ("id", Value::text(&id)),
            ("target", target_value(&target)),
            ("call", call.to_value()),
        ]);
        self.write(conn, frame(&request), run);
        id
    }

    /// A call to a server-scope service.
    pub fn v8_server_call(
        &mut self,
        conn: ConnId,
        service: &str,
        member: &str,
        args: Vec<Value>,
    ) -> String {
        let call = ServiceCall::singleton(service, member, args);
        self.v8_request(conn, server_target(), call)
    }

    /// A call to a session-scope service, addressed with the route the
    /// client knows (a made-up one when it knows none: it is fenced).
    pub fn v8_session_call(
        &mut self,
        conn: ConnId,
        service: &str,
        member: &str,
        args: Vec<Value>,
    ) -> String {
        let target = self.v8_target(conn);
        let call = ServiceCall::singleton(service, member, args);
        self.v8_request(conn, target, call)
    }

    /// The session target of the route `conn` knows, or a made-up one.
    pub fn v8_target(&self, conn: ConnId) -> Target {
        let route = self.v8_client(conn).route.clone().unwrap_or(Route {
            session_id: UNKNOWN_SESSION.to_string(),
            attachment_id: UNKNOWN_ATTACHMENT.to_string(),
        });
        session_target(&route)
    }

    /// Subscribes to `service`: a server-scope one at the server, any other
    /// under the route the client knows. Returns the request id.
    pub fn v8_subscribe(&mut self, conn: ConnId, service: &str) -> String {
        self.v8_subscribe_with(conn, service, true)
    }

    fn v8_subscribe_with(&mut self, conn: ConnId, service: &str, run: bool) -> String {
        let server_scope = matches!(service, DIRECTORY | MANAGEMENT | PRESENTATION);
        let target = if server_scope {
            server_target()
        } else {
            self.v8_target(conn)
        };
        let v8 = self
            .clients
            .get_mut(&conn)
            .and_then(|c| c.v8.as_deref_mut());
        let v8 = v8.expect("a v8 client");
        v8.next_subscription += 1;
        let sub = format!("service-{}", v8.next_subscription);
        let args = vec![
            Value::text(sub),
            Value::text(service),
            Value::text("singleton"),
        ];
        let call = ServiceCall::singleton(CONTROL, "subscribe", args);
        self.v8_request_with(conn, target, call, run)
    }

    /// Cancels request `id`, naming `target`.
    pub fn v8_cancel(&mut self, conn: ConnId, id: &str, target: &Target) {
        trace!(self, "{conn} → cancel #{id}");
        let cancel = Value::object(vec![
            ("type", Value::text("cancel")),
            ("id", Value::text(id)),
            ("target", target_value(target)),
        ]);
        self.write(conn, frame(&cancel), true);
    }

    /// Sends a framed but broken envelope (the server closes the connection).
    pub fn v8_send_broken(&mut self, conn: ConnId) {
        trace!(self, "{conn} → a broken envelope");
        let broken = Value::object(vec![("type", Value::text("request"))]);
        self.write(conn, frame(&broken), true);
    }

    /// The answer to request `id` on `conn`, if it arrived (kept with `keep_received`).
    pub fn v8_answer(&self, conn: ConnId, id: &str) -> Option<&Result<Option<Value>, CallError>> {
        self.v8_client(conn).answers.get(id)
    }

    /// A v8 client reads one message.
    pub(super) fn v8_read(&mut self, conn: ConnId, message: &Arc<V8Message>) {
        let keep = self.options.keep_received;
        let Some(client) = self.clients.get_mut(&conn) else {
            return;
        };
        if matches!(**message, V8Message::Hello { .. }) {
            client.ready = true;
        }
        let Some(v8) = client.v8.as_deref_mut() else {
            return;
        };
        let read = v8.read(message, keep);
        match &**message {
            V8Message::Update { .. } if read.problems.is_empty() => {
                self.reached.insert(super::Milestone::V8Replicated);
            }
            V8Message::Response {
                outcome: Err(e), ..
            } if e.code == "session_not_attached" => {
                self.reached.insert(super::Milestone::V8Fenced);
            }
            _ => {}
        }
        let resubscribe = if read.new_route {
            v8.auto_subscribe.clone()
        } else {
            Vec::new()
        };
        for problem in read.problems {
            self.fact(Fact::V8Broken { conn, problem });
        }
        let open = self
            .clients
            .get(&conn)
            .is_some_and(|c| !c.closed && c.eof.is_none());
        for service in resubscribe.into_iter().filter(|_| open) {
            // Queued behind what the kernel is doing now, not run inside it.
            self.v8_subscribe_with(conn, service, false);
        }
    }
}
