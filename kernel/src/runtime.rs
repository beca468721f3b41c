//! The session runtime: one session's authoritative state and its agent
//! turn, as hosted by a worker process (and by the simulator's fake workers).
//!
//! It enforces the v1 busy rules (nothing queues: a prompt while a turn runs
//! is `busy`; steer and abort need a running prompt; `set_model` and
//! `set_thinking` need idle), builds snapshots, streams progress, and decides
//! what is stored. It does no IO: storage writes, model calls and messages to
//! the server are [`RuntimeOutput`]s; model events and storage failures come
//! back as [`RuntimeInput`]s.
//!
//! **Calling protocol.** The driver carries out outputs in order. A
//! [`RuntimeOutput::Persist`] must be durable before any later output of the
//! same step is carried out; if it fails, the driver drops the rest of the
//! batch and feeds [`RuntimeInput::StorageFailed`]. This is how "an item is
//! committed before its `item_finished` is broadcast" holds.
//!
//! **Durable revision.** Every change bumps the snapshot revision and
//! persists it, so revisions keep increasing across worker restarts.

use crate::ids::OpId;
use crate::protocol::{
    AssistantItem, AssistantStatus, Content, DeltaKind, ErrorCode, ModelMetadata, ModelRef,
    ProtocolError, SessionPhase, SessionSnapshot, StopReason, ThinkingLevel, ToolStatus,
    TranscriptItem, TranscriptProgress, Usage, UserItem,
};
use crate::time::Instant;
use crate::worker::{CreateSpec, FromWorker, Operation};

/// Everything about a session that is stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    /// Session id (its directory name).
    pub id: String,
    /// Display name.
    pub name: Option<String>,
    /// Working directory.
    pub cwd: String,
    /// Creation time (epoch ms).
    pub created_at: u64,
    /// Last change (epoch ms).
    pub updated_at: u64,
    /// Selected model.
    pub model: ModelRef,
    /// Selected thinking level.
    pub thinking_level: ThinkingLevel,
    /// Last persisted snapshot revision.
    pub revision: u64,
    /// Items, oldest first.
    pub transcript: Vec<TranscriptItem>,
    /// Steer messages not yet taken into a turn.
    pub queued_steer: Vec<UserItem>,
}

/// A durable write.
#[derive(Debug, Clone, PartialEq)]
pub enum Persist {
    /// Insert or replace a transcript item (by id).
    Item(TranscriptItem),
    /// The session settings, steer queue and revision.
    State {
        /// Snapshot revision.
        revision: u64,
        /// Last change.
        updated_at: u64,
        /// Selected model.
        model: ModelRef,
        /// Selected thinking level.
        thinking_level: ThinkingLevel,
        /// Steer messages waiting.
        queued_steer: Vec<UserItem>,
    },
}

/// What a model call is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// Model to call.
    pub model: ModelRef,
    /// Thinking level.
    pub thinking_level: ThinkingLevel,
    /// The conversation so far (the streaming reply excluded).
    pub context: Vec<TranscriptItem>,
}

/// A model stream event.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    /// More text, thinking or tool-call input.
    Delta {
        /// What the delta extends.
        kind: DeltaKind,
        /// The text.
        text: String,
    },
    /// The reply finished.
    Done {
        /// Why it stopped.
        stop: StopReason,
        /// Token usage.
        usage: Option<Usage>,
    },
    /// The call failed; the turn ends with an error item.
    Failed {
        /// Clear, non-empty description.
        message: String,
    },
}

/// Inputs of a [`Runtime`].
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeInput {
    /// A control operation from the server.
    Operation {
        /// Correlation id of the server.
        op: OpId,
        /// What to do.
        operation: Operation,
    },
    /// An event of model call `call`.
    Model {
        /// The call it belongs to (stale calls are ignored).
        call: u64,
        /// The event.
        event: ModelEvent,
    },
    /// The server disposes the session: finish and exit.
    Dispose,
    /// A [`Persist`] failed. The runtime reports a fatal error and exits.
    StorageFailed {
        /// What failed.
        message: String,
    },
}

/// Outputs of a [`Runtime`], carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeOutput {
    /// Make this durable before carrying out the next output.
    Persist(Persist),
    /// Send to the server.
    Send(FromWorker),
    /// Start model call `call`.
    StartModel {
        /// Id of the call, echoed in [`RuntimeInput::Model`].
        call: u64,
        /// What to ask.
        request: ModelRequest,
    },
    /// Stop model call `call` (its remaining events are ignored).
    CancelModel {
        /// The call to stop.
        call: u64,
    },
    /// The runtime is finished: exit the process.
    Exit,
}

#[derive(Debug, Clone, PartialEq)]
struct Turn {
    prompt_op: OpId,
    call: u64,
    /// Index in the transcript of the streaming assistant item.
    streaming: usize,
}

/// The session runtime. See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Runtime {
    state: StoredSession,
    models: Vec<ModelMetadata>,
    turn: Option<Turn>,
    next_call: u64,
    next_item: u64,
    finished: bool,
    now: Instant,
    out: Vec<RuntimeOutput>,
}

/// Message recorded on an item a turn could not finish because its worker stopped.
pub const INTERRUPTED: &str = "Interrupted: the session worker stopped before this finished";

impl Runtime {
    /// Checks a create request against the model catalog; returns the model
    /// and thinking level the new session starts with.
    pub fn resolve_create(
        spec: &CreateSpec,
        default_model: &ModelRef,
        models: &[ModelMetadata],
    ) -> Result<(ModelRef, ThinkingLevel), ProtocolError> {
        let model = spec.model.clone().unwrap_or_else(|| default_model.clone());
        let meta = find_model(models, &model)?;
        let level = match spec.thinking_level {
            Some(level) => supported(meta, level)?,
            None => meta.supported_thinking_levels[0],
        };
        Ok((model, level))
    }

    /// A brand-new session at `now` (epoch ms). Emits its first state and `Ready`.
    pub fn create(state: StoredSession, models: Vec<ModelMetadata>, now: Instant) -> (Self, Vec<RuntimeOutput>) {
        assert!(state.transcript.is_empty() && state.queued_steer.is_empty(), "a new session is empty");
        Self::open(state, models, now)
    }

    /// Opens a stored session: marks anything a crashed worker left running
    /// as interrupted, persists that, and emits `Ready`.
    pub fn open(state: StoredSession, models: Vec<ModelMetadata>, now: Instant) -> (Self, Vec<RuntimeOutput>) {
        let next_item = state
            .transcript
            .iter()
            .map(TranscriptItem::id)
            .chain(state.queued_steer.iter().map(|i| i.id.as_str()))
            .filter_map(|id| id.rsplit('-').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let mut rt = Self { state, models, turn: None, next_call: 1, next_item, finished: false, now, out: Vec::new() };
        for i in 0..rt.state.transcript.len() {
            if let Some(item) = interrupted(&rt.state.transcript[i]) {
                rt.state.transcript[i] = item.clone();
                rt.out.push(RuntimeOutput::Persist(Persist::Item(item)));
            }
        }
        rt.bump();
        let snapshot = rt.snapshot();
        rt.out.push(RuntimeOutput::Send(FromWorker::Ready { snapshot }));
        let out = std::mem::take(&mut rt.out);
        rt.check_invariants();
        (rt, out)
    }

    /// Feeds one input at `now` (epoch ms in the daemon, virtual in the simulator).
    pub fn step(&mut self, now: Instant, input: RuntimeInput) -> Vec<RuntimeOutput> {
        self.now = self.now.max(now);
        if self.finished {
            return Vec::new();
        }
        match input {
            RuntimeInput::Operation { op, operation } => self.on_operation(op, operation),
            RuntimeInput::Model { call, event } => self.on_model(call, event),
            RuntimeInput::Dispose => self.on_dispose(),
            RuntimeInput::StorageFailed { message } => {
                self.finished = true;
                self.out.push(RuntimeOutput::Send(FromWorker::Fatal { message }));
                self.out.push(RuntimeOutput::Exit);
            }
        }
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    /// The current snapshot (`attached` false, `locked` true; the server normalises both).
    pub fn snapshot(&self) -> SessionSnapshot {
        let s = &self.state;
        SessionSnapshot {
            id: s.id.clone(),
            name: s.name.clone(),
            cwd: s.cwd.clone(),
            created_at: s.created_at,
            updated_at: s.updated_at,
            phase: self.phase(),
            model: s.model.clone(),
            thinking_level: s.thinking_level,
            attached: false,
            locked: true,
            revision: s.revision,
            transcript: s.transcript.clone(),
            queued_steer: s.queued_steer.clone(),
            queued_steer_count: s.queued_steer.len() as u64,
        }
    }

    /// The agent phase.
    pub fn phase(&self) -> SessionPhase {
        if self.turn.is_some() { SessionPhase::Turn } else { SessionPhase::Idle }
    }

    /// The stored state as it stands.
    pub fn state(&self) -> &StoredSession {
        &self.state
    }

    /// True after dispose or a fatal error.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    // ---- operations ----------------------------------------------------------

    fn on_operation(&mut self, op: OpId, operation: Operation) {
        let result = match operation {
            Operation::Prompt { text } => return self.on_prompt(op, text),
            Operation::Steer { text } => self.on_steer(text),
            Operation::Abort => return self.on_abort(op),
            Operation::SetModel { model } => self.on_set_model(model),
            Operation::SetThinking { level } => self.on_set_thinking(level),
        };
        self.done(op, result.map(|()| self.snapshot()));
    }

    fn on_prompt(&mut self, op: OpId, text: String) {
        if self.turn.is_some() {
            let error = ProtocolError::new(ErrorCode::Busy, "A prompt is already running");
            return self.done(op, Err(error));
        }
        let user = self.user_item(text);
        self.commit(TranscriptItem::User(user));
        self.start_reply(op);
    }

    fn on_steer(&mut self, text: String) -> Result<(), ProtocolError> {
        if self.turn.is_none() {
            return Err(ProtocolError::new(ErrorCode::Busy, "There is no active prompt to steer"));
        }
        let item = self.user_item(text);
        self.state.queued_steer.push(item);
        self.bump();
        self.send_snapshot();
        Ok(())
    }

    fn on_abort(&mut self, op: OpId) {
        let Some(turn) = self.turn.clone() else {
            let error = ProtocolError::new(ErrorCode::Busy, "There is no active prompt to abort");
            return self.done(op, Err(error));
        };
        self.out.push(RuntimeOutput::CancelModel { call: turn.call });
        self.finish_reply(AssistantStatus::Aborted, None, Some("Aborted".to_string()));
        self.end_turn();
        self.done(op, Ok(self.snapshot()));
        self.done(turn.prompt_op, Ok(self.snapshot()));
    }

    fn on_set_model(&mut self, model: ModelRef) -> Result<(), ProtocolError> {
        self.require_idle("change the model")?;
        let meta = find_model(&self.models, &model)?;
        let level = self.state.thinking_level;
        let levels = &meta.supported_thinking_levels;
        // Keep the level if the new model has it; otherwise the closest level below, else its lowest.
        let level = if levels.contains(&level) {
            level
        } else {
            levels.iter().copied().filter(|l| *l <= level).max().unwrap_or(levels[0])
        };
        self.state.model = model;
        self.state.thinking_level = level;
        self.bump();
        Ok(())
    }

    fn on_set_thinking(&mut self, level: ThinkingLevel) -> Result<(), ProtocolError> {
        self.require_idle("change the thinking level")?;
        let meta = find_model(&self.models, &self.state.model)?;
        self.state.thinking_level = supported(meta, level)?;
        self.bump();
        Ok(())
    }

    fn require_idle(&self, what: &str) -> Result<(), ProtocolError> {
        match self.turn {
            Some(_) => Err(ProtocolError::new(ErrorCode::Busy, format!("Cannot {what} while a prompt is running"))),
            None => Ok(()),
        }
    }

    fn on_dispose(&mut self) {
        if self.turn.is_some() {
            let call = self.turn.as_ref().expect("checked").call;
            self.out.push(RuntimeOutput::CancelModel { call });
            self.finish_reply(AssistantStatus::Aborted, None, Some(INTERRUPTED.to_string()));
            self.end_turn();
        }
        self.finished = true;
        self.out.push(RuntimeOutput::Exit);
    }

    // ---- the turn ----------------------------------------------------------

    fn start_reply(&mut self, prompt_op: OpId) {
        let context = self.state.transcript.clone();
        let item = AssistantItem {
            id: self.fresh_item_id(),
            content: Vec::new(),
            model: self.state.model.clone(),
            response_model: None,
            usage: None,
            timestamp: self.now.as_millis(),
            status: AssistantStatus::Streaming,
            error_message: None,
        };
        let item = TranscriptItem::Assistant(item);
        self.out.push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.state.transcript.push(item.clone());
        let call = self.next_call;
        self.next_call += 1;
        self.turn = Some(Turn { prompt_op, call, streaming: self.state.transcript.len() - 1 });
        self.bump();
        self.progress(TranscriptProgress::ItemStarted { item });
        self.send_snapshot();
        let request = ModelRequest { model: self.state.model.clone(), thinking_level: self.state.thinking_level, context };
        self.out.push(RuntimeOutput::StartModel { call, request });
    }

    fn on_model(&mut self, call: u64, event: ModelEvent) {
        let Some(turn) = self.turn.clone() else { return };
        if turn.call != call {
            return;
        }
        match event {
            ModelEvent::Delta { kind, text } => self.on_delta(&turn, kind, text),
            ModelEvent::Done { stop, usage } => {
                self.finish_reply(AssistantStatus::Complete(stop), usage, None);
                if self.state.queued_steer.is_empty() {
                    self.end_turn();
                    self.done(turn.prompt_op, Ok(self.snapshot()));
                } else {
                    self.take_steer();
                    self.start_reply(turn.prompt_op);
                }
            }
            ModelEvent::Failed { message } => {
                let message = if message.is_empty() { "Model call failed".to_string() } else { message };
                self.finish_reply(AssistantStatus::Error, None, Some(message));
                self.end_turn();
                self.done(turn.prompt_op, Ok(self.snapshot()));
            }
        }
    }

    fn on_delta(&mut self, turn: &Turn, kind: DeltaKind, text: String) {
        let TranscriptItem::Assistant(item) = &mut self.state.transcript[turn.streaming] else {
            unreachable!("the streaming item is an assistant item")
        };
        let extends_last = matches!(
            (item.content.last(), kind),
            (Some(Content::Text { .. }), DeltaKind::Text) | (Some(Content::Thinking { .. }), DeltaKind::Thinking)
        );
        if !extends_last {
            item.content.push(match kind {
                DeltaKind::Thinking => Content::Thinking { thinking: String::new(), redacted: None },
                _ => Content::Text { text: String::new() },
            });
        }
        let index = item.content.len() - 1;
        match item.content.last_mut().expect("pushed") {
            Content::Text { text: t } => t.push_str(&text),
            Content::Thinking { thinking, .. } => thinking.push_str(&text),
            _ => unreachable!("only text and thinking parts stream"),
        }
        let message_id = item.id.clone();
        self.progress(TranscriptProgress::AssistantDelta { message_id, content_index: index as u64, kind, delta: text });
    }

    /// Ends the streaming reply with `status`, commits it, then announces it.
    fn finish_reply(&mut self, status: AssistantStatus, usage: Option<Usage>, error: Option<String>) {
        let turn = self.turn.as_ref().expect("a turn runs");
        let TranscriptItem::Assistant(item) = &mut self.state.transcript[turn.streaming] else {
            unreachable!("the streaming item is an assistant item")
        };
        item.status = status;
        item.usage = usage.or(item.usage.take());
        item.error_message = error;
        let item = TranscriptItem::Assistant(item.clone());
        self.out.push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.progress(TranscriptProgress::ItemFinished { item });
    }

    /// Moves queued steer messages into the transcript, in order.
    fn take_steer(&mut self) {
        for item in std::mem::take(&mut self.state.queued_steer) {
            let item = TranscriptItem::User(item);
            self.out.push(RuntimeOutput::Persist(Persist::Item(item.clone())));
            self.state.transcript.push(item);
        }
    }

    fn end_turn(&mut self) {
        // Steer text that no model call will see still belongs to the conversation.
        self.take_steer();
        self.turn = None;
        self.bump();
        self.send_snapshot();
    }

    // ---- helpers -----------------------------------------------------------

    fn user_item(&mut self, text: String) -> UserItem {
        UserItem { id: self.fresh_item_id(), content: vec![Content::Text { text }], timestamp: self.now.as_millis() }
    }

    fn fresh_item_id(&mut self) -> String {
        let id = format!("item-{}", self.next_item);
        self.next_item += 1;
        id
    }

    fn commit(&mut self, item: TranscriptItem) {
        self.out.push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.state.transcript.push(item);
    }

    /// A state change: new revision, persisted with the settings and steer queue.
    fn bump(&mut self) {
        let s = &mut self.state;
        s.revision += 1;
        s.updated_at = s.updated_at.max(self.now.as_millis());
        self.out.push(RuntimeOutput::Persist(Persist::State {
            revision: s.revision,
            updated_at: s.updated_at,
            model: s.model.clone(),
            thinking_level: s.thinking_level,
            queued_steer: s.queued_steer.clone(),
        }));
    }

    fn send_snapshot(&mut self) {
        let snapshot = self.snapshot();
        self.out.push(RuntimeOutput::Send(FromWorker::Snapshot { snapshot }));
    }

    fn progress(&mut self, progress: TranscriptProgress) {
        self.out.push(RuntimeOutput::Send(FromWorker::Progress { progress }));
    }

    fn done(&mut self, op: OpId, outcome: Result<SessionSnapshot, ProtocolError>) {
        self.out.push(RuntimeOutput::Send(FromWorker::OpDone { op, outcome }));
    }

    fn check_invariants(&self) {
        let s = &self.state;
        match &self.turn {
            Some(turn) => {
                let item = &s.transcript[turn.streaming];
                assert!(matches!(item, TranscriptItem::Assistant(a) if a.status == AssistantStatus::Streaming));
                assert_eq!(turn.streaming, s.transcript.len() - 1, "the streaming item is last");
            }
            None => {
                assert!(s.transcript.iter().all(TranscriptItem::is_terminal), "nothing streams while idle");
                assert!(s.queued_steer.is_empty(), "steer only queues during a turn");
            }
        }
        let meta = self.models.iter().find(|m| m.provider == s.model.provider && m.id == s.model.id);
        if let Some(meta) = meta {
            assert!(meta.supported_thinking_levels.contains(&s.thinking_level), "unsupported thinking level");
        }
    }
}

fn find_model<'a>(models: &'a [ModelMetadata], model: &ModelRef) -> Result<&'a ModelMetadata, ProtocolError> {
    models.iter().find(|m| m.provider == model.provider && m.id == model.id).ok_or_else(|| {
        ProtocolError::new(ErrorCode::InvalidRequest, format!("Unknown model {}/{}", model.provider, model.id))
    })
}

fn supported(meta: &ModelMetadata, level: ThinkingLevel) -> Result<ThinkingLevel, ProtocolError> {
    if meta.supported_thinking_levels.contains(&level) {
        return Ok(level);
    }
    let levels: Vec<&str> = meta.supported_thinking_levels.iter().map(|l| l.as_str()).collect();
    let message = format!(
        "Model {}/{} does not support thinking level {}; it supports {}",
        meta.provider,
        meta.id,
        level.as_str(),
        levels.join(", ")
    );
    Err(ProtocolError::new(ErrorCode::InvalidRequest, message))
}

/// The terminal form of an item a stopped worker left unfinished, if it is unfinished.
fn interrupted(item: &TranscriptItem) -> Option<TranscriptItem> {
    match item {
        TranscriptItem::Assistant(a) if a.status == AssistantStatus::Streaming => {
            let mut a = a.clone();
            a.status = AssistantStatus::Aborted;
            a.error_message = Some(INTERRUPTED.to_string());
            Some(TranscriptItem::Assistant(a))
        }
        TranscriptItem::Tool(t) if t.status == ToolStatus::Running => {
            let mut t = t.clone();
            t.status = ToolStatus::Error;
            t.content.push(Content::Text { text: format!("{INTERRUPTED}; the tool call was not re-run.") });
            Some(TranscriptItem::Tool(t))
        }
        _ => None,
    }
}
