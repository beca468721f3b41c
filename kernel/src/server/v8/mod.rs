//! Protocol v8 connections: routing, attachments, and pi's chord services.
//!
//! A connection whose hello says version 8 speaks v8 for the rest of its
//! life. It has at most one attachment (a route `{sessionId,
//! attachmentId}`, a fresh id each time), announced by an `attachment`
//! envelope before the call that made it answers. Requests are routed by
//! target: the server's services (`pi.session-directory`,
//! `pi.session-management`, `pi.presentation-plugins`), or the attached
//! session's (`pi.agent-controller`, `pi.session-plugins`, `pi.models`,
//! `pi.transcript`); a session target that is not the current route is
//! `session_not_attached`, which fences frames sent under an older one.
//!
//! The sessions are the ones v1 clients see, through the same registry:
//! attaching opens the session's worker as a v1 `attach` does, and a prompt
//! is the same worker operation. What differs is only what goes out: a v8
//! subscriber of a session's transcript gets the ops that changed it
//! ([`view`]), encoded per subscription ([`chord::wire::Encoder`]), never
//! the transcript again.

mod publish;
mod server_scope;
mod session_scope;
pub(crate) mod view;

use super::{Acquire, Server, Waiter, listed_metadata};
use crate::chord::call::{CallError, Control, Mode, ServiceCall};
use crate::chord::ops::Op;
use crate::chord::wire::Encoder;
use crate::chord::{self, Member, State};
use crate::ids::{ConnId, OpId};
use crate::protocol::v8::{self as proto, ClientMessage, ServerMessage, Target};
use crate::protocol::{
    CommandResult, Content, ErrorCode, ModelRef, ProtocolError, SessionSnapshot, ThinkingLevel,
    TranscriptItem, TranscriptProgress,
};
use crate::server::Frame;
use crate::wire::Value;
use crate::wire::frame::encode_frame;
use crate::worker::{CreateSpec, Operation};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// pi's services, by the scope that provides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Svc {
    Directory,
    /// Ours: every session's state, clients, model and last activity.
    Status,
    /// Ours: what pi's management leaves out (a session's working
    /// directory, name and model at creation; the models offered).
    Sessions,
    Management,
    Presentation,
    Agent,
    SessionPlugins,
    Models,
    Transcript,
    /// Ours: the session's approval policy and the questions waiting.
    Approvals,
}

/// The server scope's catalogue, in pi's order, then ours.
const SERVER_SERVICES: [Svc; 5] = [
    Svc::Directory,
    Svc::Management,
    Svc::Presentation,
    Svc::Status,
    Svc::Sessions,
];
/// A session's catalogue.
const SESSION_SERVICES: [Svc; 5] = [
    Svc::Agent,
    Svc::SessionPlugins,
    Svc::Models,
    Svc::Transcript,
    Svc::Approvals,
];

impl Svc {
    fn id(self) -> &'static str {
        match self {
            Self::Directory => "pi.session-directory",
            Self::Status => STATUS_SERVICE,
            Self::Sessions => SESSIONS_SERVICE,
            Self::Management => "pi.session-management",
            Self::Presentation => "pi.presentation-plugins",
            Self::Agent => "pi.agent-controller",
            Self::SessionPlugins => "pi.session-plugins",
            Self::Models => "pi.models",
            Self::Transcript => "pi.transcript",
            Self::Approvals => APPROVALS_SERVICE,
        }
    }

    fn methods(self) -> &'static [&'static str] {
        match self {
            Self::Directory | Self::Status | Self::Transcript => &[],
            Self::Management => &["attach", "create", "detach", "remove"],
            Self::Sessions => &["create", "models", "rename"],
            Self::Presentation => &["prepareSession", "reload"],
            Self::Agent => &[
                "abort",
                "cancelQueued",
                "compact",
                "followUp",
                "prompt",
                "steer",
                "waitForPrompt",
            ],
            Self::SessionPlugins => &["reload"],
            Self::Approvals => &["answer", "setPolicy"],
            Self::Models => &[
                "cycleThinking",
                "getThinkingLevels",
                "refresh",
                "select",
                "selectThinking",
            ],
        }
    }

    fn has_state(self) -> bool {
        matches!(
            self,
            Self::Directory | Self::Status | Self::Models | Self::Transcript | Self::Approvals
        )
    }

    fn find(scope: &[Svc], id: &str) -> Option<Svc> {
        scope.iter().copied().find(|s| s.id() == id)
    }

    fn catalogue(scope: &[Svc]) -> Value {
        let entries: Vec<(&str, Mode)> = scope.iter().map(|s| (s.id(), Mode::Singleton)).collect();
        chord::catalogue(&entries)
    }
}

/// A v8 connection's route: the session it is attached to, under which id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    pub(crate) session_id: String,
    pub(crate) attachment_id: String,
}

/// One subscription of a client: a service, the attachment it was made
/// under (session services), and the encoder of its one state stream.
#[derive(Debug, Clone)]
struct Sub {
    svc: Svc,
    attachment: Option<String>,
    /// `None` until the first publication after its snapshot. Shared by
    /// the subscriptions that saw the same publications since their
    /// snapshots, whose streams are alike ([`Server::v8_publish`]).
    encoder: Option<Arc<Encoder>>,
}

/// What a v8 connection adds to a connection.
#[derive(Debug, Clone, Default)]
pub(crate) struct V8Conn {
    pub(crate) route: Option<Route>,
    /// Requests not answered yet, with their target (a cancel must name it).
    active: BTreeMap<String, Target>,
    subs: BTreeMap<String, Sub>,
    /// Requests that arrived before the server hello went out.
    deferred: VecDeque<(String, Target, Value)>,
    /// `prepareSession` was called on this connection (`reload` needs it).
    prepared: bool,
    /// The `pi.session-management` call under way: the connection's
    /// management calls run one at a time, in the order sent (pi runs them
    /// on one queue), so an attach and a detach behind it end as sent.
    managing: Option<String>,
    /// Management calls waiting for it.
    management_queue: VecDeque<(String, ServiceCall)>,
}

impl V8Conn {
    pub(crate) fn active_len(&self) -> usize {
        self.active.len()
    }
}

/// A prompt's end, as `waitForPrompt` tells it.
#[derive(Debug, Clone, PartialEq)]
enum PromptEnd {
    Done(String),
    Unanswered(String),
}

/// A `waitForPrompt` waiting for its prompt's end.
#[derive(Debug, Clone)]
struct PromptWait {
    conn: ConnId,
    request_id: String,
    op: u64,
}

/// pi's session-scope states of one live session, kept while v8 clients
/// are attached to it.
#[derive(Debug, Clone)]
pub(crate) struct SessionView {
    transcript: State,
    models: State,
    /// `pi-server.approvals`' state.
    approvals: State,
    /// Entries in the view (the finished prefix of the transcript).
    finished: usize,
    /// Items after it: a streaming reply and running tools.
    streaming: Vec<TranscriptItem>,
    /// Prompts started through `pi.agent-controller`, by operation id:
    /// `None` while they run. The newest [`KEPT_PROMPTS`] ended ones are kept.
    prompts: BTreeMap<u64, Option<PromptEnd>>,
    waits: Vec<PromptWait>,
    /// How the transcript's last reply ended, as of `synced`.
    last_reply: PromptEnd,
}

/// How many ended prompts a session remembers for `waitForPrompt`.
const KEPT_PROMPTS: usize = 64;

/// How a v1 error reads on a v8 connection: `not_found` is pi's
/// `session_not_found`; every other code keeps its name and message.
fn call_error(error: &ProtocolError) -> CallError {
    let code = match error.code {
        ErrorCode::NotFound => "session_not_found",
        code => code.as_str(),
    };
    CallError::new(code, error.message.clone())
}

fn in_band_error(code: &str, message: &str) -> Value {
    Value::object(vec![
        ("code", Value::text(code)),
        ("message", Value::text(message)),
    ])
}

/// `AgentOperationResponse` / `AgentQueueResponse`: `key` is `operationId` or `entryId`.
fn accepted(key: &str, id: Option<u64>, error: Option<(&str, &str)>) -> Value {
    Value::object(vec![
        ("accepted", Value::Bool(id.is_some())),
        (
            key,
            id.map_or(Value::Null, |id| Value::text(id.to_string())),
        ),
        (
            "error",
            error.map_or(Value::Null, |(c, m)| in_band_error(c, m)),
        ),
    ])
}

/// pi's session id rule: `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`.
fn is_session_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The text of an `AgentPromptRequest` (`{message, images}`).
/// An `AgentPromptRequest`'s text and images (`{message, images: null |
/// [{type:"image", data, mimeType}]}`), or what is wrong with it. An image
/// is base64 of one of the types models take, at most `max` of them.
fn prompt_input(args: &[Value], max: usize) -> Result<(String, Vec<Content>), String> {
    let [request] = args else {
        return Err("expected one {message, images}".into());
    };
    let text = match request.get("message") {
        Some(Value::Text(text)) if !text.is_empty() => text.clone(),
        _ => return Err("expected {message, images}: a non-empty message".into()),
    };
    let images = match request.get("images") {
        None | Some(Value::Null) => return Ok((text, Vec::new())),
        Some(Value::Array(images)) => images,
        Some(_) => return Err("images must be null or a list".into()),
    };
    if images.len() > max {
        return Err(format!("at most {max} images go with one prompt"));
    }
    let mut parts = Vec::with_capacity(images.len());
    for (i, image) in images.iter().enumerate() {
        let (Some(Value::Text(kind)), Some(Value::Text(data)), Some(Value::Text(mime))) =
            (image.get("type"), image.get("data"), image.get("mimeType"))
        else {
            return Err(format!(
                "images[{i}] must be {{type:\"image\", data, mimeType}}"
            ));
        };
        if kind != "image" {
            return Err(format!("images[{i}] must be of type \"image\""));
        }
        if !IMAGE_TYPES.contains(&mime.as_str()) {
            return Err(format!(
                "images[{i}] is {mime}; models take {}",
                IMAGE_TYPES.join(", ")
            ));
        }
        let base64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
        if data.is_empty() || data.len() % 4 != 0 || !data.bytes().all(base64) {
            return Err(format!("images[{i}]'s data is not base64"));
        }
        parts.push(Content::Image {
            data: data.clone(),
            mime_type: mime.clone(),
        });
    }
    Ok((text, parts))
}

/// The image types the providers take.
const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

impl SessionView {
    fn new(
        snapshot: &SessionSnapshot,
        models: &[crate::protocol::ModelMetadata],
        approvals: Value,
    ) -> Self {
        let finished = view::finished_prefix(&snapshot.transcript);
        Self {
            transcript: State::new(view::conversation_view(snapshot)),
            models: State::new(view::models_state(snapshot, models)),
            approvals: State::new(approvals),
            finished,
            streaming: snapshot.transcript[finished..].to_vec(),
            prompts: BTreeMap::new(),
            waits: Vec::new(),
            last_reply: prompt_end(&snapshot.transcript)
                .unwrap_or_else(|| PromptEnd::Unanswered("The turn produced no reply".into())),
        }
    }

    /// Brings the states to a new snapshot, whose transcript holds the
    /// items from `from` on (`tail`): the entries from there are replaced
    /// by the tail's finished items (usually only new ones are added), the
    /// documents and the models by a diff. A whole transcript (`from` 0)
    /// is diffed whole. Returns each state's publication, if it changed.
    fn sync(
        &mut self,
        head: &SessionSnapshot,
        from: usize,
        tail: Vec<TranscriptItem>,
        models: &[crate::protocol::ModelMetadata],
    ) -> (Option<Vec<Op>>, Option<Vec<Op>>) {
        if let Some(end) = prompt_end(&tail) {
            self.last_reply = end;
        } else if from == 0 {
            self.last_reply = PromptEnd::Unanswered("The turn produced no reply".into());
        }
        let transcript = if from == 0 {
            let whole = SessionSnapshot {
                transcript: tail,
                ..head.clone()
            };
            self.finished = view::finished_prefix(&whole.transcript);
            self.streaming = whole.transcript[self.finished..].to_vec();
            self.transcript.publish(view::conversation_view(&whole))
        } else {
            self.follow(head, from, tail)
        };
        let models = self.models.publish(view::models_state(head, models));
        (transcript, models)
    }

    /// [`Self::sync`] for a tail: ops on the entries from `from` and on the documents.
    fn follow(
        &mut self,
        head: &SessionSnapshot,
        from: usize,
        tail: Vec<TranscriptItem>,
    ) -> Option<Vec<Op>> {
        let keep = from.min(self.finished);
        let mut items = std::mem::take(&mut self.streaming);
        debug_assert!(
            from - keep <= items.len(),
            "a tail starts within what the view has"
        );
        items.truncate(from - keep);
        items.extend(tail);
        let done = view::finished_prefix(&items);
        self.streaming = items.split_off(done);
        let mut ops = Vec::new();
        if done > 0 || keep < self.finished {
            let entries = items
                .iter()
                .enumerate()
                .map(|(i, item)| view::entry(keep + i, item))
                .collect();
            ops.push(Op::Splice(
                crate::chord_path!["entries"],
                keep,
                self.finished - keep,
                entries,
            ));
        }
        self.finished = keep + done;
        let busy = head.phase != crate::protocol::SessionPhase::Idle;
        let docs = [
            ("pi.agent", view::agent_doc(head)),
            ("pi.live", view::live_doc(busy, &self.streaming)),
        ];
        for (kind, new) in docs {
            let old = self
                .transcript
                .value()
                .get("docs")
                .and_then(|d| d.get(kind));
            let old = old.cloned().unwrap_or(Value::Null);
            chord::ops::diff(&old, &new, &mut crate::chord_path!["docs", kind], &mut ops);
        }
        if ops.is_empty() {
            return None;
        }
        Some(match self.transcript.apply(&ops) {
            Ok(()) => ops,
            // Not expected (the ops come from this view): subscribers get
            // the state whole, as it stands.
            Err(_) => {
                let value = self.transcript.value().clone();
                self.transcript.replace(value)
            }
        })
    }

    /// Whether what streams answers an entry: the newest entry is a user
    /// message, a tool's result, or a reply that failed (a retry follows
    /// it); or nothing streams but tools. After a reply that completed, a
    /// new one answers something not yet an entry.
    fn answers_an_entry(&self) -> bool {
        if !matches!(self.streaming.first(), Some(TranscriptItem::Assistant(_))) {
            return true;
        }
        let last = match self.transcript.value().get("entries") {
            Some(Value::Array(entries)) => entries.last(),
            _ => None,
        };
        let Some(last) = last else {
            return false;
        };
        match last.get("kind") {
            Some(Value::Text(kind)) if kind == "pi.user" || kind == "pi.tool-result" => true,
            Some(Value::Text(kind)) if kind == "pi.assistant" => {
                let stop = last
                    .get("model")
                    .and_then(|m| match m {
                        Value::Array(messages) => messages.first(),
                        _ => None,
                    })
                    .and_then(|m| m.get("stopReason"));
                matches!(stop, Some(Value::Text(s)) if s == "error" || s == "aborted")
            }
            _ => false,
        }
    }

    /// The transcript state as JSON-ish text, for tests.
    #[cfg(test)]
    pub(crate) fn transcript_value(&self) -> String {
        format!("{:?}", self.transcript.value())
    }

    fn state(&self, svc: Svc) -> Option<&State> {
        match svc {
            Svc::Transcript => Some(&self.transcript),
            Svc::Models => Some(&self.models),
            Svc::Approvals => Some(&self.approvals),
            _ => None,
        }
    }

    /// A progress event: the ops on the transcript it makes, if any.
    ///
    /// A reply streams from the worker before the snapshot that commits
    /// the message it answers (the snapshot waits for the store): until
    /// that input is an entry, the reply is held here, and the snapshot
    /// shows it with what it said so far. So no client sees a reply before
    /// its prompt.
    fn advance(&mut self, progress: &TranscriptProgress) -> Option<Vec<Op>> {
        if !view::advance(&mut self.streaming, progress) {
            return None;
        }
        let mut ops = Vec::new();
        let done = view::finished_prefix(&self.streaming);
        if done == 0 && !self.answers_an_entry() {
            return None;
        }
        if done > 0 {
            let entries: Vec<Value> = self
                .streaming
                .drain(..done)
                .enumerate()
                .map(|(i, item)| view::entry(self.finished + i, &item))
                .collect();
            ops.push(Op::Splice(
                crate::chord_path!["entries"],
                self.finished,
                0,
                entries.clone(),
            ));
            self.finished += entries.len();
        }
        let live = view::live_doc(true, &self.streaming);
        let old = self
            .transcript
            .value()
            .get("docs")
            .and_then(|d| d.get("pi.live"))
            .cloned()
            .unwrap_or(Value::Null);
        chord::ops::diff(
            &old,
            &live,
            &mut crate::chord_path!["docs", "pi.live"],
            &mut ops,
        );
        if ops.is_empty() {
            return None;
        }
        match self.transcript.apply(&ops) {
            Ok(()) => Some(ops),
            // Not expected (the ops come from this view): subscribers get
            // the state whole, as it stands.
            Err(_) => {
                let value = self.transcript.value().clone();
                Some(self.transcript.replace(value))
            }
        }
    }

    fn remember(&mut self, op: u64, end: PromptEnd) {
        self.prompts.insert(op, Some(end));
        while self.prompts.values().filter(|p| p.is_some()).count() > KEPT_PROMPTS {
            let oldest = self
                .prompts
                .iter()
                .find(|(_, p)| p.is_some())
                .map(|(k, _)| *k)
                .expect("counted");
            self.prompts.remove(&oldest);
        }
    }
}

impl Server {
    fn v8(&self, conn: ConnId) -> Option<&V8Conn> {
        self.conns.get(&conn)?.v8.as_deref()
    }

    fn v8_mut(&mut self, conn: ConnId) -> Option<&mut V8Conn> {
        self.conns.get_mut(&conn)?.v8.as_deref_mut()
    }

    /// `pi.transcript`'s state of a live session (its value, and the
    /// sequence of its last publication) while the session keeps pi's
    /// states for v8 clients: from its first v8 attach until it is no
    /// longer live. Read-only; the simulator compares v8 subscribers'
    /// replicas with it.
    pub fn v8_transcript(&self, session_id: &str) -> Option<&State> {
        Some(&self.sessions.get(session_id)?.v8.as_deref()?.transcript)
    }

    /// Whether `conn` speaks v8.
    pub(super) fn is_v8(&self, conn: ConnId) -> bool {
        self.v8(conn).is_some()
    }

    /// The server hello of a v8 connection.
    pub(super) fn v8_hello_frame(&self) -> Result<Frame, String> {
        let hello = ServerMessage::Hello {
            server_id: self.config.server_id.clone(),
        };
        self.v8_frame(&hello.to_value())
    }

    fn v8_frame(&self, message: &Value) -> Result<Frame, String> {
        let payload = proto::encode(message, &self.config.limits.cbor)?;
        let frame =
            encode_frame(&payload, self.config.limits.max_frame_len).map_err(|e| e.to_string())?;
        Ok(Frame::from(frame))
    }

    fn v8_send(&mut self, conn: ConnId, message: &ServerMessage) {
        let frame = self.v8_frame(&message.to_value());
        self.send_encoded(conn, frame);
    }

    /// One frame of a v8 connection after its hello.
    pub(super) fn on_v8_payload(&mut self, conn: ConnId, payload: &[u8]) {
        let message = match proto::decode_client_message(payload, &self.config.limits.cbor) {
            Ok(message) => message,
            Err(e) => return self.v8_fail(conn, e),
        };
        let ready = self.conns[&conn].is_ready();
        match message {
            ClientMessage::Hello => {
                self.v8_fail(conn, "hello may only be sent as the first message".into())
            }
            ClientMessage::Request { id, target, call } if ready => {
                self.on_v8_request(conn, id, target, call)
            }
            ClientMessage::Request { id, target, call } => {
                let max = self.config.limits.max_deferred_requests;
                let v8 = self.v8_mut(conn).expect("v8");
                if v8.deferred.len() >= max {
                    let message =
                        format!("More than {max} requests sent before the handshake completed");
                    return self.v8_fail(conn, message);
                }
                v8.deferred.push_back((id, target, call));
            }
            ClientMessage::Cancel { id, target } => self.on_v8_cancel(conn, id, target),
        }
    }

    /// A broken envelope ends the connection, as a v1 one does.
    fn v8_fail(&mut self, conn: ConnId, message: String) {
        self.fail_protocol(conn, ErrorCode::InvalidRequest, message);
    }

    /// Runs the requests that waited for the handshake.
    pub(super) fn v8_run_deferred(&mut self, conn: ConnId) {
        while let Some((id, target, call)) =
            self.v8_mut(conn).and_then(|v8| v8.deferred.pop_front())
        {
            if !self.conns.get(&conn).is_some_and(|c| c.is_ready()) {
                break;
            }
            self.on_v8_request(conn, id, target, call);
        }
    }

    /// Answers a request that is still active (one cancelled meanwhile is not answered twice).
    fn v8_reply(&mut self, conn: ConnId, id: &str, result: Result<Option<Value>, CallError>) {
        let limits = &self.config.limits;
        let payload = proto::encode_response(id, result.as_ref().map(Option::as_ref), &limits.cbor);
        self.v8_reply_encoded(conn, id, payload);
    }

    /// [`Self::v8_reply`] of a response's payload written already.
    fn v8_reply_encoded(&mut self, conn: ConnId, id: &str, payload: Result<Vec<u8>, String>) {
        if !self.v8_end(conn, id) {
            return;
        }
        let max = self.config.limits.max_frame_len;
        let frame =
            payload.and_then(|payload| encode_frame(&payload, max).map_err(|e| e.to_string()));
        self.send_encoded(conn, frame.map(Frame::from));
    }

    /// A request of `conn` is answered: it is no longer active, and if it
    /// was the management call under way, the next one may run (at the end
    /// of the step, [`Self::v8_run_management`]). False when it was not
    /// active (cancelled, or the connection is gone).
    fn v8_end(&mut self, conn: ConnId, id: &str) -> bool {
        let Some(v8) = self.v8_mut(conn) else {
            return false;
        };
        let active = v8.active.remove(id).is_some();
        // A management call ends here even when it was cancelled before:
        // the calls behind it must not wait for an answer that never comes.
        if v8.managing.as_deref() == Some(id) {
            v8.managing = None;
            if !v8.management_queue.is_empty() {
                self.v8_managed.insert(conn);
            }
        }
        active
    }

    /// Marks `conn` for [`Self::v8_run_management`] if no management call of
    /// it is under way.
    fn v8_managed_if_idle(&mut self, conn: ConnId) {
        if self.v8(conn).is_some_and(|v| v.managing.is_none()) {
            self.v8_managed.insert(conn);
        }
    }

    /// Starts the next management call of each connection whose call under
    /// way ended in this step.
    pub(super) fn v8_run_management(&mut self) {
        while let Some(conn) = self.v8_managed.pop_first() {
            // Calls cancelled while they waited are dropped.
            let next = self.v8_mut(conn).and_then(|v| match v.managing {
                Some(_) => None,
                None => {
                    while v
                        .management_queue
                        .front()
                        .is_some_and(|(id, _)| !v.active.contains_key(id))
                    {
                        v.management_queue.pop_front();
                    }
                    v.management_queue.pop_front()
                }
            });
            if let Some((id, call)) = next
                && self.conns.get(&conn).is_some_and(|c| c.is_ready())
            {
                self.v8_mut(conn).expect("v8").managing = Some(id.clone());
                self.run_server_call(conn, id, Svc::Management, call);
            }
        }
    }

    fn on_v8_request(&mut self, conn: ConnId, id: String, target: Target, call: Value) {
        let limit = self.config.limits.max_requests_in_flight_per_connection;
        let c = self.conns.get_mut(&conn).expect("ready");
        let v8 = c.v8.as_deref_mut().expect("v8");
        if v8.active.contains_key(&id) {
            let error = CallError::invalid("Request ID is already active");
            return self.v8_send(conn, &ServerMessage::Err { id, error });
        }
        // Both bounds: requests answered (or cancelled) may still have work
        // under way that counts in flight (a create waiting for its worker).
        if v8.active.len() >= limit || c.in_flight >= limit {
            let error = CallError::invalid(format!(
                "More than {limit} requests in flight on this connection"
            ));
            return self.v8_send(conn, &ServerMessage::Err { id, error });
        }
        v8.active.insert(id.clone(), target.clone());
        if target.server_id() != self.config.server_id {
            let error = CallError::new("wrong_server", "Request was addressed to another server");
            return self.v8_reply(conn, &id, Err(error));
        }
        let Some(call) = ServiceCall::parse(&call) else {
            return self.v8_reply(conn, &id, Err(CallError::invalid("Invalid service call")));
        };
        match target {
            Target::Server { .. } => self.on_server_call(conn, id, call),
            Target::Session {
                session_id,
                attachment_id,
                ..
            } => {
                let route = Route {
                    session_id,
                    attachment_id,
                };
                if self.v8(conn).and_then(|v| v.route.as_ref()) != Some(&route) {
                    let error = CallError::new(
                        "session_not_attached",
                        "Session is not attached to this client",
                    );
                    return self.v8_reply(conn, &id, Err(error));
                }
                self.on_session_call(conn, id, route, call)
            }
        }
    }

    /// `cancel{id, target}`: answers the request `cancelled` when both match.
    fn on_v8_cancel(&mut self, conn: ConnId, id: String, target: Target) {
        if target.server_id() != self.config.server_id
            || self.v8(conn).and_then(|v| v.active.get(&id)) != Some(&target)
        {
            return;
        }
        let error = CallError::new("cancelled", "RPC request cancelled");
        self.v8_reply(conn, &id, Err(error));
    }

    /// Checks the call against its service's shape: a control call, or a
    /// method of a known service in this scope.
    fn resolve_call(&self, scope: &[Svc], call: &ServiceCall) -> Result<Option<Svc>, CallError> {
        if Control::of(call).is_some() {
            return Ok(None);
        }
        let Some(svc) = Svc::find(scope, &call.service_id) else {
            return Err(CallError::not_allowed(&call.service_id));
        };
        if call.instance.is_some() {
            return Err(CallError::mode_mismatch(
                svc.id(),
                Mode::Singleton,
                Mode::Keyed,
            ));
        }
        if svc.methods().contains(&call.member.as_str()) {
            Ok(Some(svc))
        } else if svc.has_state() && call.member == "state" {
            Err(CallError::member_mismatch(svc.id(), &call.member))
        } else {
            Err(CallError::member_not_found(svc.id(), &call.member))
        }
    }

    /// A `$chord.service` call in a scope.
    fn on_control(
        &mut self,
        conn: ConnId,
        id: String,
        scope: &[Svc],
        route: Option<&Route>,
        call: &ServiceCall,
    ) {
        let result = match Control::of(call).expect("a control call") {
            Control::Catalogue => Ok(Some(Svc::catalogue(scope))),
            Control::Subscribe {
                subscription_id,
                service_id,
                mode,
            } => {
                let answer =
                    self.subscribe(conn, &id, scope, route, subscription_id, &service_id, mode);
                match answer {
                    Ok(payload) => return self.v8_reply_encoded(conn, &id, payload),
                    Err(error) => Err(error),
                }
            }
            Control::Unsubscribe { subscription_id } => {
                match self
                    .v8_mut(conn)
                    .and_then(|v| v.subs.remove(&subscription_id))
                {
                    Some(_) => Ok(None),
                    None => Err(CallError::internal()),
                }
            }
        };
        self.v8_reply(conn, &id, result);
    }

    /// Subscribes `conn`; the answer's payload, its snapshot written from
    /// the state in place (a transcript is not copied to be sent).
    #[allow(clippy::too_many_arguments)]
    fn subscribe(
        &mut self,
        conn: ConnId,
        request_id: &str,
        scope: &[Svc],
        route: Option<&Route>,
        subscription_id: String,
        service_id: &str,
        mode: Mode,
    ) -> Result<Result<Vec<u8>, String>, CallError> {
        let Some(svc) = Svc::find(scope, service_id) else {
            return Err(CallError::not_allowed(service_id));
        };
        if mode != Mode::Singleton {
            return Err(CallError::mode_mismatch(svc.id(), Mode::Singleton, mode));
        }
        if self
            .v8(conn)
            .is_some_and(|v| v.subs.contains_key(&subscription_id))
        {
            return Err(CallError::invalid(format!(
                "Duplicate service subscription {subscription_id}"
            )));
        }
        if svc == Svc::Directory {
            // Existing subscribers first, then (when there are none) the
            // state that may have gone stale while nobody subscribed.
            self.v8_publish_directory();
            self.refresh_directory(&[]);
        }
        if svc == Svc::Status {
            // As the directory: existing subscribers first, or (when there
            // are none) the state that may have gone stale meanwhile.
            self.v8_publish_status();
            if self.status_watchers.is_empty() {
                self.refresh_status(&[]);
            }
            self.status_watchers.insert(conn);
        }
        let payload = {
            let state = match (svc, route) {
                (Svc::Directory, _) => self.directory.as_ref(),
                (Svc::Status, _) => self.status_state.as_ref(),
                (_, Some(route)) => self
                    .sessions
                    .get(&route.session_id)
                    .and_then(|l| l.v8.as_deref())
                    .and_then(|v| v.state(svc)),
                (_, None) => None,
            };
            if svc.has_state() && state.is_none() {
                return Err(CallError::no_provider(svc.id()));
            }
            let mut members: Vec<Member<'_>> =
                svc.methods().iter().map(|m| Member::Method(m)).collect();
            if let Some(state) = state {
                members.push(Member::State("state", state));
            }
            proto::encode_snapshot_response(
                request_id,
                svc.id(),
                &members,
                &self.config.limits.cbor,
            )
        };
        let sub = Sub {
            svc,
            attachment: route.map(|r| r.attachment_id.clone()),
            encoder: None,
        };
        self.v8_mut(conn)
            .expect("v8")
            .subs
            .insert(subscription_id, sub);
        Ok(payload)
    }
}

impl Server {
    /// `pi-server.session-status`'s sessions now: what `status` reports,
    /// with each session's last activity.
    fn status_sessions(&self) -> Value {
        let sessions = self
            .status()
            .into_iter()
            .map(|status| {
                let live = self
                    .sessions
                    .get(&status.session_id)
                    .and_then(|l| l.snapshot.as_deref());
                let stored = self.catalog.get(&status.session_id);
                // A live session's snapshot is newer than its stored metadata.
                let meta = match live {
                    Some(snap) => Some(listed_metadata(stored, snap)),
                    None => stored.cloned(),
                };
                let mut pairs = vec![
                    ("sessionId", Value::text(&status.session_id)),
                    ("state", Value::text(status.state.as_str())),
                    ("clients", Value::Int(status.clients as i64)),
                ];
                if let (Some(model), Some(level)) = (&status.model, status.thinking_level) {
                    pairs.push((
                        "model",
                        Value::object(vec![
                            ("provider", Value::text(&model.provider)),
                            ("modelId", Value::text(&model.id)),
                        ]),
                    ));
                    pairs.push(("thinkingLevel", Value::text(level.as_str())));
                }
                if let Some(meta) = &meta {
                    if let Some(name) = &meta.session_name {
                        pairs.push(("name", Value::text(name)));
                    }
                    if let Some(cwd) = &meta.cwd {
                        pairs.push(("cwd", Value::text(cwd)));
                    }
                    pairs.push(("createdAt", Value::Int(meta.created_at as i64)));
                    let at = meta.updated_at.unwrap_or(meta.created_at);
                    pairs.push(("updatedAt", Value::Int(at as i64)));
                }
                if let Some(preview) = &status.preview {
                    pairs.push(("preview", Value::text(preview)));
                }
                Value::object(pairs)
            })
            .collect();
        Value::Array(sessions)
    }

    /// Brings `pi-server.session-status` up to date and tells its
    /// subscribers, if it has any (a server with none builds nothing).
    pub(super) fn v8_publish_status(&mut self) {
        let watchers = std::mem::take(&mut self.status_watchers);
        let subscribers: Vec<ConnId> = watchers
            .into_iter()
            .filter(|c| {
                self.conns
                    .get(c)
                    .and_then(|c| c.v8.as_ref())
                    .is_some_and(|v| v.subs.values().any(|s| s.svc == Svc::Status))
            })
            .collect();
        self.status_watchers = subscribers.iter().copied().collect();
        if !subscribers.is_empty() {
            self.refresh_status(&subscribers);
        }
    }

    /// [`Self::v8_publish_status`] to these subscribers (none, to make the
    /// state a new subscription's snapshot shows).
    fn refresh_status(&mut self, subscribers: &[ConnId]) {
        let sessions = self.status_sessions();
        let state = self.status_state.get_or_insert_with(|| {
            State::new(Value::object(vec![("sessions", Value::Array(vec![]))]))
        });
        // An unchanged status publishes nothing (`publish` finds no ops).
        let next = Value::object(vec![("sessions", sessions)]);
        let Some(ops) = state.publish(next) else {
            return;
        };
        let sequence = state.sequence();
        self.v8_publish(subscribers, Svc::Status, sequence, &ops);
    }
}

/// Our service of every session's live status (server scope, state only).
pub(crate) const STATUS_SERVICE: &str = "pi-server.session-status";
/// Our service of what pi's management leaves out (server scope, methods only).
pub(crate) const SESSIONS_SERVICE: &str = "pi-server.sessions";
/// Our session service: the approval policy, the tools allowed always, the
/// questions waiting (`{policy, own, always, pending}`); `answer` and
/// `setPolicy`.
pub(crate) const APPROVALS_SERVICE: &str = "pi-server.approvals";

fn no_bundles() -> Value {
    Value::object(vec![("presentationFacetBundles", Value::Array(vec![]))])
}

fn invalid_args(call: &ServiceCall, what: &str) -> CallError {
    CallError::invalid_value(&call.service_id, &call.member, &format!("expected {what}"))
}

/// How a prompt's turn ended: the text of its last reply, or why there is none.
/// How the newest reply among `items` ended, if there is one.
fn prompt_end(items: &[TranscriptItem]) -> Option<PromptEnd> {
    let reply = items.iter().rev().find_map(|item| match item {
        TranscriptItem::Assistant(a) => Some(a),
        _ => None,
    })?;
    Some(match reply.status {
        crate::protocol::AssistantStatus::Complete(_) => PromptEnd::Done(view::reply_text(reply)),
        _ => PromptEnd::Unanswered(
            reply
                .error_message
                .clone()
                .unwrap_or_else(|| "The turn was aborted".into()),
        ),
    })
}

fn prompt_result(end: &PromptEnd) -> Value {
    match end {
        PromptEnd::Done(text) => Value::object(vec![
            ("status", Value::text("done")),
            ("text", Value::text(text)),
            ("reason", Value::Null),
        ]),
        PromptEnd::Unanswered(reason) => Value::object(vec![
            ("status", Value::text("unanswered")),
            ("text", Value::Null),
            ("reason", Value::text(reason)),
        ]),
    }
}
