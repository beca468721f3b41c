//! The ACP adapter's decisions, sans-IO: what each JSON-RPC line from the
//! editor asks of the pi server, and what each pi event and response means
//! in ACP terms.
//!
//! [`Adapter::step`] takes one [`Input`] (a line from the editor, a server
//! event, the completion of a pi call, a possible loss of progress) and
//! returns the [`Output`]s to carry out in order: lines to write to the
//! editor, pi commands to send, log lines. The host (`super::run`) owns
//! stdin, stdout and the pi client; it decides nothing.
//!
//! What a session shows is decided by the kernel's transcript follower
//! ([`Follower`]), one per session this connection has open; this module
//! only renders its updates as `session/update` notifications.
//!
//! # Invariants
//!
//! - Invariant: every JSON-RPC request gets exactly one response (a result
//!   or an error), and a `session/prompt`'s response comes after every
//!   update of its turn.
//! - What a `session/prompt` becomes is the kernel's [`Front`]'s decision,
//!   one per open session, as for every front end: it waits for the session
//!   to be idle and for our previous prompt, and a refusal follows the
//!   front's one rule (held again for the session's state, else answered
//!   with the error); `session/cancel` is the front's abort, and a prompt
//!   it withdraws before it went out ends `cancelled`.
//! - Invariant: stdout carries JSON-RPC lines only; everything else is a
//!   [`Output::Log`].

use std::collections::{BTreeMap, BTreeSet};

use agent_client_protocol_schema::v1 as acp;
use kernel::client::follow::{
    Follower, TurnOutcome, Update, input_text, tool_path, tool_title, turn_outcome,
};
use kernel::client::front::{self, Answer, Front, Request, Why};
use kernel::protocol::{
    Command, CommandResult, Content, CreateParams, ErrorCode, JsonValue, ModelMetadata, ModelRef,
    ServerEvent, SessionMetadata, SessionSnapshot, ThinkingLevel, ToolStatus,
};
use kernel::runtime::find_model;
use serde_json::{Value, json};

use pi_client::ClientError;
use pi_config::json::to_json;

/// The config option that selects the model.
pub(crate) const MODEL_OPTION: &str = "model";
/// The config option that selects the thinking level.
pub(crate) const THOUGHT_OPTION: &str = "thought_level";
/// The extension method that steers a running turn.
pub(crate) const STEER_METHOD: &str = "_pi/steer";

/// JSON-RPC error codes: the standard ones, ACP's, and ours.
mod code {
    pub(super) const PARSE: i32 = -32700;
    pub(super) const INVALID_REQUEST: i32 = -32600;
    pub(super) const METHOD_NOT_FOUND: i32 = -32601;
    pub(super) const INVALID_PARAMS: i32 = -32602;
    pub(super) const INTERNAL: i32 = -32603;
    /// ACP: a session (or other resource) that does not exist.
    pub(super) const NOT_FOUND: i32 = -32002;
    /// The session is running a turn (or otherwise refuses the operation
    /// now); pi's `busy`. In the server-defined range.
    pub(super) const BUSY: i32 = -32001;
}

/// A pi call's handle, chosen by the adapter.
pub(crate) type Token = u64;

/// What happened, for the adapter to decide on.
#[derive(Debug)]
pub(crate) enum Input {
    /// One line from the editor.
    Line(String),
    /// A server event.
    Event(ServerEvent),
    /// A line that was too long or not UTF-8, skipped.
    Oversized,
    /// Progress may have been lost (reconnection, a lagging reader).
    Gap,
    /// A pi call finished.
    Done {
        token: Token,
        result: Result<CommandResult, ClientError>,
    },
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Output {
    /// Write this JSON-RPC message as one line to the editor.
    Send(Value),
    /// Send this pi command; report its result as [`Input::Done`].
    Call { token: Token, command: Command },
    /// A line for the log (stderr).
    Log(String),
}

/// What a pi call in flight was for.
#[derive(Debug)]
enum Pending {
    /// `session/new`, with the editor's MCP servers to remember.
    New {
        rpc: Value,
        mcp: Option<kernel::protocol::JsonValue>,
    },
    /// `session/load` or `session/resume`, likewise.
    Open {
        rpc: Value,
        session: String,
        mcp: kernel::protocol::JsonValue,
    },
    /// The editor's MCP servers, remembered with the session.
    Mcp {
        session: String,
    },
    List {
        rpc: Value,
        cwd: Option<String>,
    },
    /// The listed sessions, waiting for `status` to title the unnamed ones
    /// by their first prompt.
    Titles {
        rpc: Value,
        sessions: Vec<SessionMetadata>,
    },
    /// A request of the session's front: `call` is the front's, `tag` the
    /// prompt it carries (0 for an abort).
    Front {
        session: String,
        call: u64,
        tag: u64,
        abort: bool,
    },
    Steer {
        rpc: Value,
    },
    SetConfig {
        rpc: Value,
        session: String,
    },
    Close {
        rpc: Value,
        session: String,
    },
    Delete {
        rpc: Value,
        session: String,
    },
}

/// A session this editor connection has open.
#[derive(Debug)]
struct Open {
    follower: Follower,
    /// True until the first snapshot after a `session/resume`: that
    /// snapshot is marked as shown, not replayed.
    quiet: bool,
    /// What its prompts become (the kernel decides).
    front: Front,
    /// `session/cancel` asked to stop the turn of our prompt in flight.
    cancelled: bool,
    /// The model and level the editor was last told of.
    config: Option<(ModelRef, ThinkingLevel)>,
    /// A `set_config_option` of ours is in flight: snapshots meanwhile
    /// carry our own change, not another client's.
    setting: bool,
    /// Tool calls announced with `tool_call`.
    announced: BTreeSet<String>,
    /// While its `session/load` or `session/resume` is not answered: the
    /// messages for the session that came meanwhile (an editor may send a
    /// prompt right behind the load), handled once it is open.
    deferred: Option<Vec<Deferred>>,
}

/// A message held until its session is open: `(id, method, params)`; no id
/// for a notification.
type Deferred = (Option<Value>, String, Value);

impl Open {
    /// A session that has shown nothing yet. With `quiet`, its first
    /// snapshot is marked as shown; with `deferred`, messages for it wait
    /// until it is open.
    fn new(session: String, quiet: bool, deferred: Option<Vec<Deferred>>) -> Self {
        Self {
            follower: Follower::new(session),
            quiet,
            front: Front::new(kernel::protocol::SessionPhase::Idle, 0),
            cancelled: false,
            config: None,
            setting: false,
            announced: BTreeSet::new(),
            deferred,
        }
    }
}

/// The adapter's state. See the module docs.
#[derive(Debug)]
pub(crate) struct Adapter {
    models: Vec<ModelMetadata>,
    sessions: BTreeMap<String, Open>,
    pending: BTreeMap<Token, Pending>,
    next_token: Token,
    /// The `session/prompt` requests not answered yet, by their front tag.
    prompts: BTreeMap<u64, (String, Value)>,
    out: Vec<Output>,
}

/// The editor's `mcpServers`, in the shape the session remembers them.
fn mcp_servers(servers: &[acp::McpServer]) -> Result<kernel::protocol::JsonValue, RpcError> {
    let list = serde_json::to_value(servers)
        .map_err(|e| RpcError::params(format!("invalid mcpServers: {e}")))?;
    kernel::mcp::from_acp(&pi_config::json::from_json(&list)).map_err(RpcError::params)
}

/// A JSON-RPC error object.
struct RpcError {
    code: i32,
    message: String,
}

impl RpcError {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }
}

impl Adapter {
    /// An adapter for a server offering `models`.
    pub(crate) fn new(models: Vec<ModelMetadata>) -> Self {
        Self {
            models,
            sessions: BTreeMap::new(),
            pending: BTreeMap::new(),
            prompts: BTreeMap::new(),
            next_token: 1,
            out: Vec::new(),
        }
    }

    /// Decides on `input`.
    pub(crate) fn step(&mut self, input: Input) -> Vec<Output> {
        match input {
            Input::Line(line) => self.on_line(&line),
            Input::Event(event) => self.on_event(&event),
            Input::Oversized => self.error(
                Value::Null,
                RpcError::new(
                    code::PARSE,
                    "the line was too long or not UTF-8; it was skipped",
                ),
            ),
            Input::Gap => self.sessions.values_mut().for_each(|o| o.follower.gap()),
            Input::Done { token, result } => self.on_done(token, result),
        }
        std::mem::take(&mut self.out)
    }

    // -----------------------------------------------------------------------
    // From the editor

    fn on_line(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        let message: Value = match serde_json::from_str(line) {
            Ok(message) => message,
            Err(e) => {
                return self.error(Value::Null, RpcError::new(code::PARSE, format!("{e}")));
            }
        };
        let Some(object) = message.as_object() else {
            return self.error(
                Value::Null,
                RpcError::new(code::INVALID_REQUEST, "a JSON-RPC message is an object"),
            );
        };
        let id = object.get("id").cloned();
        let Some(method) = object.get("method").and_then(Value::as_str) else {
            if object.contains_key("result") || object.contains_key("error") {
                // We send the editor no requests, so no response is due.
                return self.log(format!(
                    "ignored a response the adapter did not ask for: {line}"
                ));
            }
            return self.error(
                id.unwrap_or(Value::Null),
                RpcError::new(code::INVALID_REQUEST, "missing `method`"),
            );
        };
        let params = object.get("params").cloned().unwrap_or(json!({}));
        let session = params.get("sessionId").and_then(Value::as_str);
        if let Some(deferred) = session
            .and_then(|id| self.sessions.get_mut(id))
            .and_then(|open| open.deferred.as_mut())
        {
            deferred.push((id, method.to_owned(), params));
            return;
        }
        self.dispatch(id, method, &params);
    }

    fn dispatch(&mut self, id: Option<Value>, method: &str, params: &Value) {
        match id {
            Some(id) => {
                if let Err(e) = self.on_request(id.clone(), method, params) {
                    self.error(id, e);
                }
            }
            None => self.on_notification(method, params),
        }
    }

    fn on_notification(&mut self, method: &str, params: &Value) {
        match acp::ClientNotification::from_method_and_params(method, params) {
            Ok(acp::ClientNotification::CancelNotification(cancel)) => {
                self.cancel(cancel.session_id.0.to_string())
            }
            Ok(_) => self.log(format!("ignored the notification {method}")),
            Err(e) => self.log(format!("ignored a notification: {e}")),
        }
    }

    fn on_request(&mut self, rpc: Value, method: &str, params: &Value) -> Result<(), RpcError> {
        use acp::ClientRequest as R;
        let request = R::from_method_and_params(method, params).map_err(|e| match e {
            agent_client_protocol_schema::MethodDispatchError::UnknownMethod { .. } => {
                RpcError::new(
                    code::METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                )
            }
            e => RpcError::params(e.to_string()),
        })?;
        match request {
            R::InitializeRequest(_) => {
                self.respond(rpc, to_value(initialize()));
                Ok(())
            }
            R::AuthenticateRequest(_) => {
                self.respond(rpc, json!({}));
                Ok(())
            }
            R::NewSessionRequest(new) => {
                let cwd = path_text(&new.cwd, "cwd")?;
                let mcp = mcp_servers(&new.mcp_servers)?;
                let params = CreateParams {
                    cwd: Some(cwd),
                    ..CreateParams::default()
                };
                // A new session remembers none: nothing to replace.
                let mcp =
                    Some(mcp).filter(|m| !matches!(m, kernel::wire::Value::Map(e) if e.is_empty()));
                self.call(Pending::New { rpc, mcp }, Command::Create(params));
                Ok(())
            }
            R::LoadSessionRequest(load) => {
                let mcp = mcp_servers(&load.mcp_servers)?;
                self.open(rpc, load.session_id.0.to_string(), false, mcp)
            }
            R::ResumeSessionRequest(resume) => {
                let mcp = mcp_servers(&resume.mcp_servers)?;
                self.open(rpc, resume.session_id.0.to_string(), true, mcp)
            }
            R::ListSessionsRequest(list) => {
                let cwd = list
                    .cwd
                    .as_deref()
                    .map(|p| path_text(p, "cwd"))
                    .transpose()?;
                self.call(Pending::List { rpc, cwd }, Command::List);
                Ok(())
            }
            R::PromptRequest(prompt) => {
                let session = prompt.session_id.0.to_string();
                let text = prompt_text(&prompt.prompt)?;
                self.prompt(rpc, session, text)
            }
            R::SetSessionConfigOptionRequest(set) => {
                let session = set.session_id.0.to_string();
                self.set_config(rpc, session, &set.config_id.0, &set.value)
            }
            R::CloseSessionRequest(close) => {
                let session = close.session_id.0.to_string();
                self.opened(&session)?;
                let command = Command::Detach {
                    session_id: session.clone(),
                };
                self.call(Pending::Close { rpc, session }, command);
                Ok(())
            }
            R::DeleteSessionRequest(delete) => {
                let session = delete.session_id.0.to_string();
                let command = Command::Remove {
                    session_id: session.clone(),
                };
                self.call(Pending::Delete { rpc, session }, command);
                Ok(())
            }
            R::ExtMethodRequest(ext) if ext.method.as_ref() == STEER_METHOD => {
                #[derive(serde::Deserialize)]
                #[serde(rename_all = "camelCase")]
                struct Steer {
                    session_id: String,
                    prompt: String,
                }
                let steer: Steer = serde_json::from_str(ext.params.get())
                    .map_err(|e| RpcError::params(format!("invalid {STEER_METHOD} params: {e}")))?;
                self.opened(&steer.session_id)?;
                let command = Command::Steer {
                    session_id: steer.session_id,
                    text: steer.prompt,
                };
                self.call(Pending::Steer { rpc }, command);
                Ok(())
            }
            _ => Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("Method not found: {method}"),
            )),
        }
    }

    /// `session/load` (replay) or `session/resume` (no replay): attach.
    fn open(
        &mut self,
        rpc: Value,
        session: String,
        quiet: bool,
        mcp: kernel::protocol::JsonValue,
    ) -> Result<(), RpcError> {
        if self.sessions.contains_key(&session) {
            return Err(RpcError::params(format!(
                "session {session} is already open on this connection"
            )));
        }
        // Open before the attach is answered: the session's events may
        // arrive first (the follower tells no delta of a reply it did not
        // see start).
        let open = Open::new(session.clone(), quiet, Some(Vec::new()));
        self.sessions.insert(session.clone(), open);
        let command = Command::Attach {
            session_id: session.clone(),
        };
        self.call(Pending::Open { rpc, session, mcp }, command);
        Ok(())
    }

    /// Remembers the editor's MCP servers with `session`, in place of
    /// those it remembered: the session's worker runs them, for this editor
    /// and every other client, until an editor says otherwise.
    fn remember_mcp(&mut self, session: String, servers: kernel::protocol::JsonValue) {
        let command = Command::SetMcpServers {
            session_id: session.clone(),
            servers,
        };
        self.call(Pending::Mcp { session }, command);
    }

    fn prompt(&mut self, rpc: Value, session: String, text: String) -> Result<(), RpcError> {
        let tag = self.next_token;
        self.next_token += 1;
        let open = self.opened(&session)?;
        open.follower.expect_own(text.clone());
        let outputs = open.front.step(front::Input::Prompt { text, tag });
        self.prompts.insert(tag, (session.clone(), rpc));
        self.front_outputs(&session, outputs);
        Ok(())
    }

    fn cancel(&mut self, session: String) {
        let Some(open) = self.sessions.get_mut(&session) else {
            return self.log(format!("session/cancel: session {session} is not open"));
        };
        if !open.front.busy() {
            return self.log(format!(
                "session/cancel: no prompt of ours runs in {session}"
            ));
        }
        open.cancelled = true;
        let outputs = open.front.step(front::Input::Abort);
        self.front_outputs(&session, outputs);
    }

    /// Forgets an open session; its prompts not answered yet are answered
    /// with `end` (a stop reason, or an error).
    fn drop_session(&mut self, session: &str, end: Result<acp::StopReason, RpcError>) {
        self.sessions.remove(session);
        let tags: Vec<u64> = self
            .prompts
            .iter()
            .filter(|(_, (s, _))| s == session)
            .map(|(tag, _)| *tag)
            .collect();
        for tag in tags {
            let (_, rpc) = self.prompts.remove(&tag).expect("listed");
            match &end {
                Ok(stop) => self.respond(rpc, to_value(acp::PromptResponse::new(*stop))),
                Err(e) => self.error(rpc, RpcError::new(e.code, e.message.clone())),
            }
        }
    }

    /// Carries out what a session's front decided.
    fn front_outputs(&mut self, session: &str, outputs: Vec<front::Output>) {
        for output in outputs {
            match output {
                front::Output::Send { call, request, tag } => {
                    let session_id = session.to_owned();
                    let (command, abort) = match request {
                        Request::Prompt(text) => (Command::Prompt { session_id, text }, false),
                        Request::Steer(text) => (Command::Steer { session_id, text }, false),
                        Request::Abort => (Command::Abort { session_id }, true),
                        // Typed lines only (ACP's prompts are never slash commands).
                        Request::SetModel(model) => {
                            (Command::SetModel { session_id, model }, false)
                        }
                        Request::SetThinking(thinking_level) => (
                            Command::SetThinking {
                                session_id,
                                thinking_level,
                            },
                            false,
                        ),
                        Request::Rename(name) => (Command::Rename { session_id, name }, false),
                        Request::Compact(instructions) => (
                            Command::Compact {
                                session_id,
                                instructions,
                            },
                            false,
                        ),
                        // ACP's prompts are never slash commands: no answer
                        // or policy comes from its front, and v1 has none.
                        Request::Answer { .. } | Request::SetApprovals(_) => {
                            let refused = kernel::client::ClientError::Server(
                                kernel::protocol::ProtocolError::new(
                                    kernel::protocol::ErrorCode::InvalidRequest,
                                    "approvals are not answered over ACP's protocol v1 link",
                                ),
                            );
                            let outcome = Err(refused);
                            let outputs = match self.sessions.get_mut(session) {
                                Some(open) => {
                                    open.front.step(front::Input::Answered { call, outcome })
                                }
                                None => Vec::new(),
                            };
                            self.front_outputs(session, outputs);
                            continue;
                        }
                    };
                    let pending = Pending::Front {
                        session: session.to_owned(),
                        call,
                        tag,
                        abort,
                    };
                    self.call(pending, command);
                }
                front::Output::HandBack { why, tag, .. } => {
                    let Some((_, rpc)) = self.prompts.remove(&tag) else {
                        continue;
                    };
                    match why {
                        Why::Aborted | Why::Withdrawn => {
                            let response = acp::PromptResponse::new(acp::StopReason::Cancelled);
                            self.respond(rpc, to_value(response));
                        }
                        Why::Refused(e) => {
                            let error = e;
                            self.error(rpc, pi_error(&error, Some(session)));
                        }
                        Why::Busy => self.error(
                            rpc,
                            RpcError::new(
                                code::BUSY,
                                format!("busy: a turn is already running in session {session}"),
                            ),
                        ),
                        Why::Lost(how) => self.error(
                            rpc,
                            RpcError::new(
                                code::INTERNAL,
                                format!("the connection was lost while the prompt was sent ({how}); it may have run"),
                            ),
                        ),
                        Why::Closed | Why::NotConnected => self.error(
                            rpc,
                            RpcError::new(code::INTERNAL, "the connection to the server is closed"),
                        ),
                        Why::Invalid(why) => self.error(rpc, RpcError::params(why)),
                    }
                }
                front::Output::Notice(front::Notice::AbortRefused(e)) => {
                    self.log(format!("cannot cancel the turn of session {session}: {e}"));
                }
                // Typed lines only: ACP's prompts are text as they are.
                front::Output::Notice(_) | front::Output::Local(_) | front::Output::Finished => {}
            }
        }
    }

    fn set_config(
        &mut self,
        rpc: Value,
        session: String,
        option: &str,
        value: &acp::SessionConfigOptionValue,
    ) -> Result<(), RpcError> {
        let value = value
            .as_value_id()
            .map(|v| v.0.to_string())
            .ok_or_else(|| RpcError::params(format!("configOption {option} takes a value id")))?;
        let command = match option {
            MODEL_OPTION => {
                let model = value
                    .split_once('/')
                    .map(|(provider, id)| ModelRef {
                        provider: provider.into(),
                        id: id.into(),
                    })
                    .filter(|m| find_model(&self.models, m).is_ok())
                    .ok_or_else(|| {
                        RpcError::params(format!(
                            "value: unknown model {value:?}; the server offers {}",
                            self.models
                                .iter()
                                .map(model_value)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                    })?;
                Command::SetModel {
                    session_id: session.clone(),
                    model,
                }
            }
            THOUGHT_OPTION => {
                let level = ThinkingLevel::parse(&value).ok_or_else(|| {
                    RpcError::params(format!("value: unknown thinking level {value:?}"))
                })?;
                Command::SetThinking {
                    session_id: session.clone(),
                    thinking_level: level,
                }
            }
            other => {
                return Err(RpcError::params(format!(
                    "configId: unknown option {other:?}; the options are {MODEL_OPTION} and {THOUGHT_OPTION}"
                )));
            }
        };
        self.opened(&session)?.setting = true;
        self.call(Pending::SetConfig { rpc, session }, command);
        Ok(())
    }

    fn opened(&mut self, session: &str) -> Result<&mut Open, RpcError> {
        self.sessions.get_mut(session).ok_or_else(|| {
            RpcError::new(
                code::NOT_FOUND,
                format!(
                    "session {session} is not open on this connection: call session/new, session/load or session/resume first"
                ),
            )
        })
    }

    // -----------------------------------------------------------------------
    // From the server

    fn on_event(&mut self, event: &ServerEvent) {
        match event {
            ServerEvent::ServerSnapshot { snapshot } => self.models = snapshot.models.clone(),
            ServerEvent::SessionSnapshot { snapshot } => self.on_snapshot(snapshot),
            ServerEvent::SessionProgress { session_id, .. } => {
                let Some(open) = self.sessions.get_mut(session_id) else {
                    return;
                };
                let updates = open.follower.on_event(event);
                self.show(session_id, updates);
            }
            ServerEvent::SessionRemoved { session_id } => {
                let error =
                    RpcError::new(code::NOT_FOUND, format!("session {session_id} was removed"));
                self.drop_session(session_id, Err(error));
            }
        }
    }

    /// Shows what `snapshot` adds, and tells of a model or level another
    /// client chose.
    fn on_snapshot(&mut self, snapshot: &SessionSnapshot) {
        let Some(open) = self.sessions.get_mut(&snapshot.id) else {
            return;
        };
        let held = open.front.step(front::Input::Session {
            phase: snapshot.phase,
            transcript_len: snapshot.transcript.len(),
        });
        if std::mem::take(&mut open.quiet) {
            open.follower.resume(snapshot);
        }
        let updates = open.follower.on_snapshot(snapshot);
        let config = (snapshot.model.clone(), snapshot.thinking_level);
        let changed = open.config.as_ref().is_some_and(|c| *c != config);
        let told = open.setting || open.config.is_none();
        open.config = Some(config);
        self.show(&snapshot.id, updates);
        if changed && !told {
            let options = self.config_options(snapshot);
            let update =
                acp::SessionUpdate::ConfigOptionUpdate(acp::ConfigOptionUpdate::new(options));
            self.notify(&snapshot.id, update);
        }
        self.front_outputs(&snapshot.id, held);
    }

    fn on_done(&mut self, token: Token, result: Result<CommandResult, ClientError>) {
        let Some(pending) = self.pending.remove(&token) else {
            return;
        };
        match pending {
            Pending::New { rpc, mcp } => match result.map(CommandResult::into_session) {
                Ok(Ok(snapshot)) => {
                    let open = Open::new(snapshot.id.clone(), true, None);
                    self.sessions.insert(snapshot.id.clone(), open);
                    // Sent before any prompt of the editor's: the session's
                    // first turn runs with them.
                    if let Some(servers) = mcp {
                        self.remember_mcp(snapshot.id.clone(), servers);
                    }
                    self.on_snapshot(&snapshot);
                    let response = acp::NewSessionResponse::new(snapshot.id.clone())
                        .config_options(self.config_options(&snapshot));
                    self.respond(rpc, to_value(response));
                }
                Ok(Err(what)) => self.error(rpc, unexpected(what)),
                Err(e) => self.error(rpc, pi_error(&e, None)),
            },
            Pending::Open { rpc, session, mcp } => match result.map(CommandResult::into_session) {
                Ok(Ok(snapshot)) => {
                    self.remember_mcp(session.clone(), mcp);
                    // Everything the attach holds is told before the answer.
                    self.on_snapshot(&snapshot);
                    let options = self.config_options(&snapshot);
                    let response = acp::LoadSessionResponse::new().config_options(options);
                    self.respond(rpc, to_value(response));
                    let deferred = self
                        .sessions
                        .get_mut(&session)
                        .and_then(|o| o.deferred.take())
                        .unwrap_or_default();
                    for (id, method, params) in deferred {
                        self.dispatch(id, &method, &params);
                    }
                }
                Ok(Err(what)) => self.open_failed(rpc, &session, unexpected(what)),
                Err(e) => self.open_failed(rpc, &session, pi_error(&e, Some(&session))),
            },
            Pending::Mcp { session } => {
                if let Err(e) = result {
                    self.log(format!(
                        "session {session}: the editor's MCP servers were not remembered: {e}"
                    ));
                }
            }
            Pending::List { rpc, cwd } => match result {
                Ok(CommandResult::List { sessions }) => {
                    let sessions = sessions
                        .into_iter()
                        .filter(|s| cwd.is_none() || s.cwd == cwd)
                        .collect();
                    self.call(Pending::Titles { rpc, sessions }, Command::Status);
                }
                Ok(_) => self.error(rpc, unexpected("a list")),
                Err(e) => self.error(rpc, pi_error(&e, None)),
            },
            // A server from before `status` lists its sessions untitled.
            Pending::Titles { rpc, sessions } => {
                let previews: BTreeMap<String, String> = match result {
                    Ok(CommandResult::Status { sessions }) => sessions
                        .into_iter()
                        .filter_map(|s| Some((s.session_id, s.preview?)))
                        .collect(),
                    _ => BTreeMap::new(),
                };
                let sessions: Vec<acp::SessionInfo> = sessions
                    .iter()
                    .map(|s| session_info(s, previews.get(&s.id)))
                    .collect();
                self.respond(rpc, to_value(acp::ListSessionsResponse::new(sessions)));
            }
            Pending::Front {
                session,
                call,
                tag,
                abort,
            } => self.front_done(&session, call, tag, abort, result),
            Pending::Steer { rpc } => match result {
                Ok(_) => self.respond(rpc, json!({})),
                Err(e) => self.error(rpc, pi_error(&e, None)),
            },
            Pending::SetConfig { rpc, session } => {
                if let Some(open) = self.sessions.get_mut(&session) {
                    open.setting = false;
                }
                match result.map(CommandResult::into_session) {
                    Ok(Ok(snapshot)) => {
                        self.on_snapshot(&snapshot);
                        let options = self.config_options(&snapshot);
                        let response = acp::SetSessionConfigOptionResponse::new(options);
                        self.respond(rpc, to_value(response));
                    }
                    Ok(Err(what)) => self.error(rpc, unexpected(what)),
                    Err(e) => self.error(rpc, pi_error(&e, Some(&session))),
                }
            }
            Pending::Close { rpc, session } | Pending::Delete { rpc, session } => {
                self.drop_session(&session, Ok(acp::StopReason::Cancelled));
                match result {
                    Ok(_) => self.respond(rpc, json!({})),
                    Err(e) => self.error(rpc, pi_error(&e, Some(&session))),
                }
            }
        }
    }

    /// The session could not be opened: neither could what waited for it.
    fn open_failed(&mut self, rpc: Value, session: &str, error: RpcError) {
        let deferred = self
            .sessions
            .remove(session)
            .and_then(|o| o.deferred)
            .unwrap_or_default();
        let (code, message) = (error.code, error.message.clone());
        self.error(rpc, error);
        for id in deferred.into_iter().filter_map(|(id, _, _)| id) {
            let message = format!("session {session} could not be opened: {message}");
            self.error(id, RpcError::new(code, message));
        }
    }

    /// A front request answered: a prompt's turn is shown and its request
    /// answered with how the turn ended; then the front takes the answer.
    fn front_done(
        &mut self,
        session: &str,
        call: u64,
        tag: u64,
        abort: bool,
        result: Result<CommandResult, ClientError>,
    ) {
        let snapshot = match result.map(CommandResult::into_session) {
            Ok(Ok(snapshot)) => Ok(snapshot),
            Ok(Err(what)) => Err(ClientError::Protocol(format!("unexpected {what} result"))),
            Err(e) => Err(e),
        };
        let Some(open) = self.sessions.get_mut(session) else {
            // The session was closed meanwhile; its prompts were answered then.
            return;
        };
        let base = open.front.turn_start().unwrap_or(0);
        let outcome = match (&snapshot, abort) {
            (Err(e), _) => Err(e.clone()),
            (Ok(s), true) => Ok(Answer::Abort {
                withdrawn: s
                    .queued_steer
                    .iter()
                    .map(|u| kernel::client::follow::text_of(&u.content))
                    .collect(),
            }),
            (Ok(s), false) if tag != 0 => Ok(Answer::Prompt { phase: s.phase }),
            (Ok(_), false) => Ok(Answer::Steer),
        };
        if let (Ok(snapshot), false, Some((_, rpc))) =
            (&snapshot, abort, self.prompts.get(&tag).cloned())
        {
            let cancelled = std::mem::take(&mut open.cancelled);
            self.prompts.remove(&tag);
            // Every update of the turn goes before its answer.
            self.on_snapshot(snapshot);
            let stop = match turn_outcome(snapshot, base) {
                TurnOutcome::Completed => Ok(acp::StopReason::EndTurn),
                TurnOutcome::MaxTokens => Ok(acp::StopReason::MaxTokens),
                TurnOutcome::Aborted { .. } => Ok(acp::StopReason::Cancelled),
                TurnOutcome::Failed { .. } if cancelled => Ok(acp::StopReason::Cancelled),
                TurnOutcome::Failed { message } => Err(message),
            };
            match stop {
                Ok(stop) => self.respond(rpc, to_value(acp::PromptResponse::new(stop))),
                Err(message) => self.error(
                    rpc,
                    RpcError::new(
                        code::INTERNAL,
                        format!("the model reported an error: {message}"),
                    ),
                ),
            }
        }
        let Some(open) = self.sessions.get_mut(session) else {
            return;
        };
        let outputs = open.front.step(front::Input::Answered { call, outcome });
        self.front_outputs(session, outputs);
    }

    // -----------------------------------------------------------------------
    // To the editor

    /// Renders the follower's updates of `session` as `session/update`s.
    fn show(&mut self, session: &str, updates: Vec<Update>) {
        for update in updates {
            let update = match update {
                // The editor shows its own prompt already.
                Update::User { own: true, .. } => continue,
                Update::User { text, .. } => acp::SessionUpdate::UserMessageChunk(chunk(text)),
                Update::Text { delta, .. } => acp::SessionUpdate::AgentMessageChunk(chunk(delta)),
                // The session's own word, not the model's: shown apart.
                Update::Notice { text, .. } => {
                    acp::SessionUpdate::AgentMessageChunk(chunk(format!("⚠ {text}\n\n")))
                }
                Update::Thinking { delta, .. } => {
                    acp::SessionUpdate::AgentThoughtChunk(chunk(delta))
                }
                Update::ToolCall {
                    tool_call_id,
                    tool_name,
                    input,
                } => {
                    if let Some(open) = self.sessions.get_mut(session) {
                        open.announced.insert(tool_call_id.clone());
                    }
                    acp::SessionUpdate::ToolCall(tool_call(
                        &tool_call_id,
                        &tool_name,
                        &input,
                        acp::ToolCallStatus::Pending,
                    ))
                }
                Update::Tool {
                    tool_call_id,
                    tool_name,
                    input,
                    status,
                    content,
                    ..
                } => {
                    let announced = self
                        .sessions
                        .get_mut(session)
                        .is_some_and(|o| !o.announced.insert(tool_call_id.clone()));
                    let status = tool_status(status);
                    if !announced {
                        // A tool whose call this connection never saw
                        // (replayed from a transcript without it).
                        let call = tool_call(&tool_call_id, &tool_name, &input, status);
                        self.notify(session, acp::SessionUpdate::ToolCall(call));
                    }
                    let mut fields = acp::ToolCallUpdateFields::new()
                        .status(status)
                        .content(tool_output(&tool_name, &input, &content));
                    if status == acp::ToolCallStatus::InProgress && content.is_empty() {
                        fields = acp::ToolCallUpdateFields::new().status(status);
                    }
                    acp::SessionUpdate::ToolCallUpdate(acp::ToolCallUpdate::new(
                        tool_call_id,
                        fields,
                    ))
                }
                Update::Reply { usage, .. } => {
                    let Some(usage) = usage else { continue };
                    let size = self
                        .sessions
                        .get(session)
                        .and_then(|o| o.config.as_ref())
                        .and_then(|(model, _)| find_model(&self.models, model).ok())
                        .map_or(0, |m| m.context_window);
                    acp::SessionUpdate::UsageUpdate(acp::UsageUpdate::new(usage.total_tokens, size))
                }
            };
            self.notify(session, update);
        }
    }

    /// The session's config options: the model and the thinking level.
    fn config_options(&self, snapshot: &SessionSnapshot) -> Vec<acp::SessionConfigOption> {
        let models: Vec<acp::SessionConfigSelectOption> = self
            .models
            .iter()
            .map(|m| acp::SessionConfigSelectOption::new(model_value(m), m.name.clone()))
            .collect();
        let levels: Vec<acp::SessionConfigSelectOption> = find_model(&self.models, &snapshot.model)
            .map_or_else(
                |_| vec![snapshot.thinking_level],
                |m| m.supported_thinking_levels.clone(),
            )
            .into_iter()
            .map(|level| acp::SessionConfigSelectOption::new(level.as_str(), level.as_str()))
            .collect();
        let current = format!("{}/{}", snapshot.model.provider, snapshot.model.id);
        vec![
            acp::SessionConfigOption::select(MODEL_OPTION, "Model", current, models)
                .category(acp::SessionConfigOptionCategory::Model),
            acp::SessionConfigOption::select(
                THOUGHT_OPTION,
                "Thinking",
                snapshot.thinking_level.as_str(),
                levels,
            )
            .category(acp::SessionConfigOptionCategory::ThoughtLevel),
        ]
    }

    fn notify(&mut self, session: &str, update: acp::SessionUpdate) {
        let params = to_value(acp::SessionNotification::new(session.to_owned(), update));
        self.out.push(Output::Send(json!({
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": params,
        })));
    }

    fn respond(&mut self, id: Value, result: Value) {
        self.out.push(Output::Send(
            json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        ));
    }

    fn error(&mut self, id: Value, error: RpcError) {
        self.out.push(Output::Send(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": error.code, "message": error.message },
        })));
    }

    fn log(&mut self, line: String) {
        self.out.push(Output::Log(line));
    }

    fn call(&mut self, pending: Pending, command: Command) {
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(token, pending);
        self.out.push(Output::Call { token, command });
    }
}

// ---------------------------------------------------------------------------
// Mapping helpers

/// The `initialize` answer: what this agent can do.
fn initialize() -> acp::InitializeResponse {
    let mut meta = acp::Meta::new();
    meta.insert("pi".into(), json!({ "steer": STEER_METHOD }));
    let sessions = acp::SessionCapabilities::new()
        .list(acp::SessionListCapabilities::new())
        .resume(acp::SessionResumeCapabilities::new())
        .close(acp::SessionCloseCapabilities::new())
        .delete(acp::SessionDeleteCapabilities::new());
    // pi v1 prompts are text: embedded text resources are inlined, images
    // and audio cannot be carried.
    let prompts = acp::PromptCapabilities::new()
        .image(false)
        .audio(false)
        .embedded_context(true);
    let capabilities = acp::AgentCapabilities::new()
        .load_session(true)
        .prompt_capabilities(prompts)
        .session_capabilities(sessions)
        .meta(meta);
    acp::InitializeResponse::new(agent_client_protocol_schema::ProtocolVersion::V1)
        .agent_capabilities(capabilities)
        .agent_info(acp::Implementation::new(
            "pi-server",
            env!("CARGO_PKG_VERSION"),
        ))
}

/// A prompt's content blocks as one pi prompt text.
fn prompt_text(blocks: &[acp::ContentBlock]) -> Result<String, RpcError> {
    let mut text = String::new();
    for (i, block) in blocks.iter().enumerate() {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        match block {
            acp::ContentBlock::Text(t) => text.push_str(&t.text),
            acp::ContentBlock::ResourceLink(link) => {
                text.push_str(&format!("[@{}]({})", link.name, link.uri))
            }
            acp::ContentBlock::Resource(embedded) => match &embedded.resource {
                acp::EmbeddedResourceResource::TextResourceContents(r) => text.push_str(&format!(
                    "<context uri=\"{}\">\n{}\n</context>",
                    r.uri, r.text
                )),
                _ => {
                    return Err(RpcError::params(format!(
                        "prompt[{i}]: binary resources cannot be sent (only text)"
                    )));
                }
            },
            acp::ContentBlock::Image(_) => {
                return Err(RpcError::params(format!(
                    "prompt[{i}]: images are not supported (promptCapabilities.image is false)"
                )));
            }
            acp::ContentBlock::Audio(_) => {
                return Err(RpcError::params(format!(
                    "prompt[{i}]: audio is not supported (promptCapabilities.audio is false)"
                )));
            }
            _ => {
                return Err(RpcError::params(format!(
                    "prompt[{i}]: this kind of content is not supported"
                )));
            }
        }
    }
    Ok(text)
}

fn chunk(text: String) -> acp::ContentChunk {
    acp::ContentChunk::new(acp::ContentBlock::Text(acp::TextContent::new(text)))
}

/// `provider/id`, the value of a model option.
fn model_value(model: &ModelMetadata) -> String {
    format!("{}/{}", model.provider, model.id)
}

fn tool_status(status: ToolStatus) -> acp::ToolCallStatus {
    match status {
        ToolStatus::Running => acp::ToolCallStatus::InProgress,
        ToolStatus::Complete => acp::ToolCallStatus::Completed,
        ToolStatus::Error => acp::ToolCallStatus::Failed,
    }
}

/// What kind of tool `name` is, for the editor's icon and grouping.
fn tool_kind(name: &str) -> acp::ToolKind {
    match name {
        "read" | "ls" => acp::ToolKind::Read,
        "edit" | "write" => acp::ToolKind::Edit,
        "bash" => acp::ToolKind::Execute,
        "grep" | "find" | "glob" => acp::ToolKind::Search,
        "fetch" | "web_fetch" => acp::ToolKind::Fetch,
        mcp if mcp.starts_with(kernel::mcp::PREFIX) => mcp_tool_kind(mcp),
        _ => acp::ToolKind::Other,
    }
}

/// An MCP tool's kind, by the verb its name on its server starts with
/// (`mcp__files__read_text_file` reads).
fn mcp_tool_kind(name: &str) -> acp::ToolKind {
    let tool = name
        .strip_prefix(kernel::mcp::PREFIX)
        .and_then(|rest| rest.split_once("__"))
        .map_or(name, |(_, tool)| tool)
        .to_ascii_lowercase();
    let verb = tool.split(['_', '-']).next().unwrap_or_default();
    match verb {
        "read" | "get" | "list" | "show" | "view" | "describe" => acp::ToolKind::Read,
        "write" | "edit" | "create" | "update" | "delete" | "move" | "rename" => {
            acp::ToolKind::Edit
        }
        "search" | "find" | "grep" | "query" => acp::ToolKind::Search,
        "fetch" | "download" | "browse" => acp::ToolKind::Fetch,
        "run" | "exec" | "execute" => acp::ToolKind::Execute,
        _ => acp::ToolKind::Other,
    }
}

fn tool_call(
    id: &str,
    name: &str,
    input: &JsonValue,
    status: acp::ToolCallStatus,
) -> acp::ToolCall {
    let locations = tool_path(input)
        .map(|p| vec![acp::ToolCallLocation::new(p)])
        .unwrap_or_default();
    acp::ToolCall::new(id.to_owned(), tool_title(name, input))
        .kind(tool_kind(name))
        .status(status)
        .locations(locations)
        .raw_input(to_json(input))
}

/// A tool's output as ACP content: its text, and for `write` and `edit` the
/// diff ACP can show.
fn tool_output(name: &str, input: &JsonValue, content: &[Content]) -> Vec<acp::ToolCallContent> {
    let mut out = Vec::new();
    if let Some(path) = tool_path(input) {
        let diff = match name {
            "write" => input_text(input, "content").map(|new| acp::Diff::new(path, new)),
            "edit" => match (input_text(input, "oldText"), input_text(input, "newText")) {
                (Some(old), Some(new)) => Some(acp::Diff::new(path, new).old_text(old.to_owned())),
                _ => None,
            },
            _ => None,
        };
        out.extend(diff.map(acp::ToolCallContent::Diff));
    }
    let text = kernel::client::follow::text_of(content);
    if !text.is_empty() {
        let block = acp::ContentBlock::Text(acp::TextContent::new(text));
        out.push(acp::ToolCallContent::Content(acp::Content::new(block)));
    }
    out
}

/// A listed session for the editor: titled by its name, else by its first
/// prompt.
fn session_info(meta: &SessionMetadata, preview: Option<&String>) -> acp::SessionInfo {
    let updated = meta.updated_at.unwrap_or(meta.created_at);
    let title = meta.session_name.clone().or_else(|| preview.cloned());
    acp::SessionInfo::new(meta.id.clone(), meta.cwd.clone().unwrap_or_default())
        .title(title)
        .updated_at(iso_utc(updated))
}

/// Epoch milliseconds as RFC 3339 UTC.
fn iso_utc(epoch_ms: u64) -> String {
    format!("{}Z", kernel::time::format_utc(epoch_ms).replace(' ', "T"))
}

/// A pi failure as a JSON-RPC error.
fn pi_error(error: &ClientError, session: Option<&str>) -> RpcError {
    match error {
        ClientError::Server(e) => {
            let code = match e.code {
                ErrorCode::Busy | ErrorCode::SessionLocked => code::BUSY,
                ErrorCode::NotFound => code::NOT_FOUND,
                ErrorCode::InvalidRequest => code::INVALID_PARAMS,
                _ => code::INTERNAL,
            };
            let message = match (e.code, session) {
                (ErrorCode::Busy, _) => format!("busy: {}", e.message),
                (ErrorCode::NotFound, Some(id)) if !e.message.contains(id) => {
                    format!("session {id}: {}", e.message)
                }
                _ => e.message.clone(),
            };
            RpcError::new(code, message)
        }
        other => RpcError::new(code::INTERNAL, other.to_string()),
    }
}

fn unexpected(what: &str) -> RpcError {
    RpcError::new(code::INTERNAL, format!("the server answered with {what}"))
}

fn path_text(path: &std::path::Path, field: &str) -> Result<String, RpcError> {
    if !path.is_absolute() {
        return Err(RpcError::params(format!(
            "{field}: must be an absolute path, got {}",
            path.display()
        )));
    }
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| RpcError::params(format!("{field}: must be UTF-8")))
}

fn to_value(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("ACP types serialize")
}

#[cfg(test)]
mod tests;
