//! The session runtime: one session's authoritative state and its agent
//! turn, as hosted by a worker process (and by the simulator's fake workers).
//!
//! It enforces the v1 busy rules (nothing queues: a prompt while a turn runs
//! is `busy`; steer and abort need a running prompt; `set_model` and
//! `set_thinking` need idle), runs the agent loop (model call → tool calls →
//! model call … until the model stops), retries transient model errors in
//! phase `retry`, compacts the model's context in phase `compaction` when it
//! nears the model's window, builds snapshots, streams progress, and decides
//! what is stored. It does no IO: storage writes, model calls, tool runs and
//! messages to the server are [`RuntimeOutput`]s; model events, tool results,
//! storage failures and time come back as [`RuntimeInput`]s.
//!
//! ```text
//!            prompt                      Done(toolUse)               all tools done
//!  Idle ─────────────► Streaming ───────────────────────► Tools ──────────────────► (next call)
//!                        │  ▲  Done(stop): steer queued? ──► take steer ─► (next call)
//!                        │  │  Done(stop), no steer ───────► Idle
//!           Failed(retry)▼  │ deadline
//!                      Retrying          (next call) = Compacting first when the
//!                                         context nears the model's window
//! ```
//!
//! **Calling protocol.** The driver carries out outputs in order. A
//! [`RuntimeOutput::Persist`] must be durable before any later output of the
//! same step is carried out; if it fails, the driver drops the rest of the
//! batch and feeds [`RuntimeInput::StorageFailed`]. This is how "an item is
//! committed before its `item_finished` is broadcast" holds. Deliver
//! [`RuntimeInput::Tick`] at [`Runtime::next_deadline`].
//!
//! **Durable revision.** Every change bumps the snapshot revision and
//! persists it, so revisions keep increasing across worker restarts.
//!
//! **Steering.** Steer text waits in `queuedSteer` until the current model
//! call or tool call finishes; it is then taken into the transcript before
//! the next model call. Tool calls of the same reply that have not started
//! yet are skipped (recorded as errors) so the model hears the user first.

use crate::approval::{ApprovalPolicy, Approvals, Decision, Gate, Question};
use crate::ids::OpId;
use crate::protocol::{
    AssistantItem, AssistantStatus, Content, DeltaKind, ErrorCode, JsonValue, ModelMetadata,
    ModelRef, ProtocolError, SessionPhase, SessionSnapshot, StopReason, ThinkingLevel, ToolItem,
    ToolStatus, TranscriptItem, TranscriptProgress, Usage, UserItem,
};
use crate::time::Instant;
use crate::wire::Value;
use crate::worker::{CreateSpec, FromWorker, Operation, RuntimeMessage, TailSnapshot};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

mod checks;
mod context;
mod turn;

use context::add_usage;

/// A summary standing in for the conversation up to an item, in model calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The summary text.
    pub text: String,
    /// Id of the last transcript item it covers.
    pub through: String,
    /// Tokens and cost of every summary call of the session so far, this
    /// one's included (the providers' reports summed): compaction is paid
    /// for too, and no transcript item carries it.
    pub usage: Option<Usage>,
}

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
    /// Items, oldest first. Never shortened: compaction only changes what
    /// the model is sent.
    pub transcript: Vec<TranscriptItem>,
    /// Steer messages not yet taken into a turn.
    pub queued_steer: Vec<UserItem>,
    /// The latest context summary, if the session was compacted.
    pub summary: Option<Summary>,
    /// Its approval policy, tools allowed always, and questions waiting.
    pub approvals: Approvals,
}

impl StoredSession {
    /// Applies one durable write, as storage does: an item replaces the one
    /// with its id in place or is appended; state overwrites the settings,
    /// steer queue, summary and revision. The default model is not session
    /// state. (The in-memory stores of the simulator and test servers use this;
    /// `io/store` does the same to SQLite.)
    pub fn apply(&mut self, write: &Persist) {
        match write {
            Persist::Item(item) => match self.transcript.iter_mut().find(|i| i.id() == item.id()) {
                Some(existing) => *existing = item.clone(),
                None => self.transcript.push(item.clone()),
            },
            Persist::State {
                revision,
                updated_at,
                name,
                model,
                thinking_level,
                queued_steer,
                summary,
                approvals,
            } => {
                self.approvals = approvals.clone();
                self.name = name.clone();
                self.revision = *revision;
                self.updated_at = *updated_at;
                self.model = model.clone();
                self.thinking_level = *thinking_level;
                self.queued_steer = queued_steer.clone();
                self.summary = summary.clone();
            }
            // Not in the session's database: the settings and the session
            // directory's `editor-mcp.json` hold them.
            Persist::DefaultModel(_) | Persist::EditorMcp(_) => {}
        }
    }
}

/// A durable write.
#[derive(Debug, Clone, PartialEq)]
pub enum Persist {
    /// Insert or replace a transcript item (by id; a replaced item keeps its position).
    Item(TranscriptItem),
    /// The session settings, steer queue, summary and revision.
    State {
        /// Snapshot revision.
        revision: u64,
        /// Last change.
        updated_at: u64,
        /// Display name (kept in `meta.json`, not the database).
        name: Option<String>,
        /// Selected model.
        model: ModelRef,
        /// Selected thinking level.
        thinking_level: ThinkingLevel,
        /// Steer messages waiting.
        queued_steer: Vec<UserItem>,
        /// The latest context summary.
        summary: Option<Summary>,
        /// Approval policy, tools allowed always, questions waiting.
        approvals: Approvals,
    },
    /// The model a new session should start with (the most recently selected one).
    DefaultModel(ModelRef),
    /// The MCP servers the session's editor configured (an object of named
    /// servers), in place of those remembered before.
    EditorMcp(JsonValue),
}

/// What a model call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Continue the conversation (stream a reply, maybe call tools).
    Reply,
    /// Summarise `context` (and the previous summary) into a shorter text.
    Summarize,
}

/// What a model call is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// Model to call.
    pub model: ModelRef,
    /// Thinking level.
    pub thinking_level: ThinkingLevel,
    /// Reply or summarise.
    pub purpose: Purpose,
    /// Summary of the conversation before `context`.
    pub summary: Option<String>,
    /// With a summary asked for: what the user wants it to keep or stress.
    pub instructions: Option<String>,
    /// The conversation since the summary (the streaming reply excluded),
    /// shared with the runtime, which extends it between calls instead of
    /// copying the history for each.
    pub context: Arc<Vec<TranscriptItem>>,
    /// The approval policy in force: a read-only session offers the
    /// reading tools alone ([`ApprovalPolicy::offers`]).
    pub approvals: ApprovalPolicy,
}

/// The model's context kept between calls ([`Runtime::context`]).
#[derive(Debug, Clone, Default)]
struct Context {
    items: Arc<Vec<TranscriptItem>>,
    /// Where `items` starts in the transcript.
    start: usize,
    /// The summary's last item when it was built.
    through: Option<String>,
    /// Build it again at the next call.
    stale: bool,
}

/// A cache of the transcript: runtimes that differ only in it are alike.
impl PartialEq for Context {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A model stream event.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    /// More text or thinking; for [`DeltaKind::ToolCall`], a fragment of the
    /// latest tool call's JSON arguments (shown to clients, not parsed here).
    Delta {
        /// What the delta extends.
        kind: DeltaKind,
        /// The text.
        text: String,
    },
    /// A tool call part starts.
    ToolCall {
        /// The provider's id of the call.
        tool_call_id: String,
        /// Which tool.
        tool_name: String,
    },
    /// The complete arguments of the latest tool call (strict JSON).
    ToolInput {
        /// Parsed arguments.
        input: JsonValue,
    },
    /// The reply finished.
    Done {
        /// Why it stopped.
        stop: StopReason,
        /// Token usage and cost.
        usage: Option<Usage>,
        /// The model that actually answered, if the provider says.
        response_model: Option<String>,
    },
    /// The provider signed the latest thinking part (see
    /// [`Content::Thinking`]'s `signature`).
    Signature {
        /// The signature, as the provider sent it.
        signature: String,
    },
    /// The call failed.
    Failed {
        /// Clear, non-empty description.
        message: String,
        /// Whether trying again may succeed (network, 429, 5xx).
        retryable: bool,
        /// The provider's requested delay before retrying.
        retry_after_ms: Option<u64>,
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
    /// A tool run finished (see [`RuntimeOutput::RunTool`]).
    ToolDone {
        /// The tool item's id.
        id: String,
        /// Its output (text and image parts).
        content: Vec<Content>,
        /// Tool-specific details (strict JSON).
        details: Option<JsonValue>,
        /// Whether the tool failed.
        is_error: bool,
    },
    /// Time passed (see [`Runtime::next_deadline`]).
    Tick,
    /// Tell the session's clients this, in the transcript: it becomes an
    /// assistant item with status `error`, which every client shows and the
    /// model is never sent (an MCP server that failed to start, say).
    Notice(String),
    /// The server disposes the session: finish and exit.
    Dispose,
    /// A [`Persist`] failed; the driver dropped the rest of that step's
    /// outputs. See [`StorageFault`] for what the runtime does.
    StorageFailed {
        /// What failed.
        message: String,
        /// What kind of failure the host saw.
        fault: StorageFault,
        /// The outputs of the step that were not carried out (from the
        /// failed write on): operations answered there are answered again.
        dropped: Vec<RuntimeOutput>,
        /// With [`StorageFault::Full`]: the session as the store holds it now.
        stored: Option<Box<StoredSession>>,
    },
}

/// How a storage write failed, as the host classifies it.
///
/// The rule: running out of room (a full disk or quota) is reported and
/// survived, since it is the user's to fix and the store is intact; any
/// other failure (an I/O error, corruption, a vanished file) is fatal, since
/// what the store holds can no longer be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageFault {
    /// No space or quota left. The runtime goes back to the stored state
    /// (given in `stored`): the running turn stops, its reply is marked with
    /// the error, the operations the failure left unanswered get the error,
    /// every client sees the state, and the repairs are written with the
    /// next change that can be written.
    Full,
    /// Anything else: a fatal error is reported and the runtime exits.
    Fatal,
}

/// Outputs of a [`Runtime`], carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeOutput {
    /// Make this durable before carrying out the next output.
    Persist(Persist),
    /// Send to the server.
    Send(RuntimeMessage),
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
    /// Run a tool in the session's working directory; answer with [`RuntimeInput::ToolDone`].
    RunTool {
        /// The tool item's id.
        id: String,
        /// Which tool.
        tool_name: String,
        /// Its arguments.
        input: JsonValue,
        /// Working directory.
        cwd: String,
    },
    /// Stop a running tool (kill its processes); no [`RuntimeInput::ToolDone`] is expected.
    CancelTool {
        /// The tool item's id.
        id: String,
    },
    /// The runtime is finished: exit the process.
    Exit,
}

/// Retry and compaction settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Model calls per reply before a transient error ends the turn.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Compact when the estimated context passes this share of the window, in percent.
    pub compaction_percent: u64,
    /// The newest items kept verbatim by a compaction: as many as fit in
    /// this share of the window, in percent (at least the newest item, and
    /// never a tool result without the call that asked for it).
    pub keep_recent_percent: u64,
    /// How far the stored text of a streaming reply may lag what clients saw.
    pub checkpoint: crate::limits::Checkpoint,
    /// The approval policy of the settings: sessions that set none follow it.
    pub approvals: ApprovalPolicy,
    /// A question nobody answers within this is denied (off: it waits).
    pub approval_timeout: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            compaction_percent: 80,
            keep_recent_percent: 25,
            checkpoint: crate::limits::Checkpoint::default(),
            approvals: ApprovalPolicy::Auto,
            approval_timeout: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Stage {
    /// A model reply streams into the transcript item at `item`.
    Streaming { call: u64, item: usize },
    /// Tool calls of the last reply run one at a time: `running` is the tool
    /// item in flight, `waiting` the tool items not started yet. With
    /// `asking`, `running` has not started: it waits for an answer to its
    /// question ([`Approvals::pending`]).
    Tools {
        running: String,
        waiting: VecDeque<String>,
        asking: bool,
    },
    /// A transient model error; the next call starts at `at`.
    Retrying { at: Instant },
    /// The context is being summarised.
    Compacting {
        call: u64,
        text: String,
        through: String,
    },
}

/// What becomes of queued steers when a turn ends before a model call saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queued {
    /// Into the transcript (the turn ended by itself, or the session closed).
    Commit,
    /// Back to the client (an abort).
    Withdraw,
}

#[derive(Debug, Clone, PartialEq)]
struct Turn {
    prompt_op: OpId,
    stage: Stage,
    /// Failed attempts of the current model call.
    failures: u32,
    /// The provider said the context overflowed its window, and the turn
    /// compacted to retry: a second overflow ends the turn.
    overflow_retried: bool,
    /// A compaction asked for (`compact`): no reply follows it, and its
    /// operation is answered when the summary is stored.
    compaction: bool,
    /// Its instructions for the summary.
    instructions: Option<String>,
}

/// Why a compaction runs, which decides how much it summarises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The context passed [`Policy::compaction_percent`] of the window:
    /// all but the newest items that fit in [`Policy::keep_recent_percent`].
    Threshold,
    /// The provider refused the context as too long: all but the newest item.
    Overflow,
    /// Asked for: as at the threshold, whatever the context's size.
    Asked,
}

/// The session runtime. See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Runtime {
    state: StoredSession,
    models: Vec<ModelMetadata>,
    policy: Policy,
    turn: Option<Turn>,
    next_call: u64,
    next_item: u64,
    finished: bool,
    now: Instant,
    out: Vec<RuntimeOutput>,
    /// Streamed text shown to clients and not yet stored: since when, and
    /// how many bytes (see [`Policy::checkpoint`]).
    unsaved: Option<(Instant, usize)>,
    /// Items the store holds as running that a full store kept from being
    /// ended, with their transcript positions: written back, ended, by the
    /// next operation.
    repairs: Vec<(usize, TranscriptItem)>,
    /// The stored revision is behind the one clients saw (a full store).
    behind: bool,
    /// How many items from the front of the transcript were finished at
    /// the last publication: the next one sends the items after them.
    shown: usize,
    /// The first position changed out of order since the last publication
    /// (items put back, the store read back); `usize::MAX` if none.
    dirty: usize,
    /// The transcript as last published, to check the tails against.
    #[cfg(debug_assertions)]
    published: Vec<TranscriptItem>,
    /// The model's context as the last call saw it.
    context: Context,
}

/// The operation of a turn resumed at open (a question a dead worker asked):
/// no server issued it, so its end answers nobody.
pub const RESUMED: OpId = OpId(u64::MAX);

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
    pub fn create(
        state: StoredSession,
        models: Vec<ModelMetadata>,
        now: Instant,
    ) -> (Self, Vec<RuntimeOutput>) {
        assert!(
            state.transcript.is_empty() && state.queued_steer.is_empty(),
            "a new session is empty"
        );
        Self::open(state, models, now)
    }

    /// Opens a stored session: marks anything a crashed worker left running
    /// as interrupted (never re-running it), persists that, and emits `Ready`.
    pub fn open(
        state: StoredSession,
        models: Vec<ModelMetadata>,
        now: Instant,
    ) -> (Self, Vec<RuntimeOutput>) {
        let next_item = state
            .transcript
            .iter()
            .map(TranscriptItem::id)
            .chain(state.queued_steer.iter().map(|i| i.id.as_str()))
            .filter_map(|id| id.rsplit('-').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let mut rt = Self {
            state,
            models,
            policy: Policy::default(),
            turn: None,
            next_call: 1,
            next_item,
            finished: false,
            now,
            out: Vec::new(),
            unsaved: None,
            repairs: Vec::new(),
            behind: false,
            shown: 0,
            dirty: usize::MAX,
            context: Context::default(),
            #[cfg(debug_assertions)]
            published: Vec::new(),
        };
        let held = rt.held_tools();
        for i in 0..rt.state.transcript.len() {
            if held.iter().any(|id| id == rt.state.transcript[i].id()) {
                continue;
            }
            if let Some(item) = interrupted(&rt.state.transcript[i]) {
                rt.state.transcript[i] = item.clone();
                rt.out.push(RuntimeOutput::Persist(Persist::Item(item)));
            }
        }
        match held.split_first() {
            // A question the dead worker asked: its call and those after it
            // never ran, so the turn goes on from there, asking again.
            Some((running, waiting)) => {
                rt.turn = Some(Turn {
                    prompt_op: RESUMED,
                    stage: Stage::Tools {
                        running: running.clone(),
                        waiting: waiting.iter().cloned().collect(),
                        asking: true,
                    },
                    failures: 0,
                    overflow_retried: false,
                    compaction: false,
                    instructions: None,
                });
            }
            None => {
                rt.state.approvals.pending.clear();
                // Steer text a dead worker never delivered still belongs to the conversation.
                rt.take_steer();
            }
        }
        rt.bump();
        rt.dirty = 0;
        let snapshot = rt.publish();
        rt.out
            .push(RuntimeOutput::Send(FromWorker::Ready { snapshot }));
        let out = std::mem::take(&mut rt.out);
        rt.check_invariants();
        (rt, out)
    }

    /// The tool items a stored question holds: the asked call and the
    /// calls of its reply after it, all still running (none ran); empty
    /// when no question waits on a running call.
    fn held_tools(&self) -> Vec<String> {
        let Some(question) = self.state.approvals.pending.first() else {
            return Vec::new();
        };
        let items = &self.state.transcript;
        let Some(at) = items
            .iter()
            .rposition(|i| i.id() == question.id && is_running(i))
        else {
            return Vec::new();
        };
        let held: Vec<String> = items[at..]
            .iter()
            .take_while(|i| is_running(i))
            .map(|i| i.id().to_string())
            .collect();
        // The reply's calls are its last items: anything after them means
        // the store is not as a held question leaves it.
        match at + held.len() == items.len() {
            true => held,
            false => Vec::new(),
        }
    }

    /// The session's approvals for the server, with the policy in force.
    pub fn approvals_message(&self) -> RuntimeMessage {
        FromWorker::Approvals {
            approvals: self.state.approvals.clone(),
            policy: self.state.approvals.effective(self.policy.approvals),
        }
    }

    /// [`Self::approvals_message`] for a server that has not heard it
    /// (at `Ready`, on adoption): none when it says what such a server
    /// assumes (nothing set, allowed or asked, and `auto` in force).
    pub fn told_approvals(&self) -> Option<RuntimeMessage> {
        let assumed = self.state.approvals == Approvals::default()
            && self.policy.approvals == ApprovalPolicy::Auto;
        (!assumed).then(|| self.approvals_message())
    }

    /// Replaces the retry and compaction policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Feeds one input at `now` (epoch ms in the daemon, virtual in the simulator).
    pub fn step(&mut self, now: Instant, input: RuntimeInput) -> Vec<RuntimeOutput> {
        self.now = self.now.max(now);
        let busy = self.turn.is_some();
        if self.finished {
            // The last writes of a finished runtime failed (the mark of an
            // interrupted reply, the state row a full store left behind).
            // What was committed stays, and the next worker repairs the
            // rest at open: the exit that waited behind them still happens.
            // Without it an orphan retiring on a failing disk lived forever.
            if let RuntimeInput::StorageFailed { dropped, .. } = &input
                && dropped.iter().any(|o| matches!(o, RuntimeOutput::Exit))
            {
                return vec![RuntimeOutput::Exit];
            }
            return Vec::new();
        }
        match input {
            RuntimeInput::Operation { op, operation } => self.on_operation(op, operation),
            RuntimeInput::Model { call, event } => self.on_model(call, event),
            RuntimeInput::ToolDone {
                id,
                content,
                details,
                is_error,
            } => self.on_tool_done(id, content, details, is_error),
            RuntimeInput::Tick => self.on_tick(),
            RuntimeInput::Notice(text) => self.on_notice(text),
            RuntimeInput::Dispose => self.on_dispose(),
            RuntimeInput::StorageFailed {
                message,
                fault,
                dropped,
                stored,
            } => match (fault, stored) {
                (StorageFault::Full, Some(stored)) => {
                    self.on_storage_full(message, dropped, *stored)
                }
                _ => {
                    self.finished = true;
                    self.out
                        .push(RuntimeOutput::Send(FromWorker::Fatal { message }));
                    self.out.push(RuntimeOutput::Exit);
                }
            },
        }
        // A step touches the transcript's tail only (the item that streams,
        // the running tools); a turn's end settles the whole turn. Debug
        // builds check both ways, so every test and swarm seed also holds
        // the release check to the full one.
        if cfg!(debug_assertions) || (busy && self.turn.is_none()) {
            self.check_invariants();
        }
        self.check_tail();
        std::mem::take(&mut self.out)
    }

    /// When [`RuntimeInput::Tick`] has something to do (a retry is due).
    pub fn next_deadline(&self) -> Option<Instant> {
        let retry = match &self.turn {
            Some(Turn {
                stage: Stage::Retrying { at },
                ..
            }) => Some(*at),
            _ => None,
        };
        let checkpoint = self
            .unsaved
            .map(|(since, _)| since + self.policy.checkpoint.interval);
        retry
            .into_iter()
            .chain(checkpoint)
            .chain(self.question_deadline())
            .min()
    }

    /// The current snapshot (`attached` false, `locked` true; the server normalises both).
    pub fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot {
            transcript: self.state.transcript.clone(),
            ..self.head()
        }
    }

    /// The current snapshot with no transcript.
    fn head(&self) -> SessionSnapshot {
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
            transcript: Vec::new(),
            queued_steer: s.queued_steer.clone(),
            queued_steer_count: s.queued_steer.len() as u64,
        }
    }

    /// The agent phase.
    pub fn phase(&self) -> SessionPhase {
        match &self.turn {
            None => SessionPhase::Idle,
            Some(t) => match t.stage {
                Stage::Streaming { .. } | Stage::Tools { .. } => SessionPhase::Turn,
                Stage::Retrying { .. } => SessionPhase::Retry,
                Stage::Compacting { .. } => SessionPhase::Compaction,
            },
        }
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
        self.write_back_repairs();
        let result = match operation {
            Operation::Prompt { text, images } => return self.on_prompt(op, text, images),
            Operation::Steer { text } => self.on_steer(text),
            Operation::Abort => return self.on_abort(op),
            Operation::Compact { instructions } => return self.on_compact(op, instructions),
            Operation::SetModel { model } => self.on_set_model(model),
            Operation::SetThinking { level } => self.on_set_thinking(level),
            Operation::SetMcpServers { servers } => {
                // Remembered before it is answered; the host starts them
                // before the next prompt runs. No revision: no client sees it.
                self.out
                    .push(RuntimeOutput::Persist(Persist::EditorMcp(servers)));
                Ok(())
            }
            Operation::Answer { id, decision } => self.on_answer(&id, decision),
            Operation::SetApprovals { policy } => self.on_set_approvals(policy),
            Operation::Rename { name } => {
                // The server checked the name (unique, well formed); a turn
                // may run: a name is no setting of it.
                self.state.name = Some(name);
                self.bump();
                Ok(())
            }
        };
        self.done(op, result);
    }

    fn on_notice(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        // Told once between two prompts: each worker of the session tells
        // its servers' failures, and a session may start several.
        let told = self
            .state
            .transcript
            .iter()
            .rev()
            .take_while(|i| !matches!(i, TranscriptItem::User(_)))
            .any(|i| matches!(i, TranscriptItem::Assistant(a) if notice_text(a) == Some(text.as_str())));
        if told {
            return;
        }
        let item = AssistantItem {
            id: self.fresh_item_id(),
            content: Vec::new(),
            model: notice_model(),
            response_model: None,
            usage: None,
            timestamp: self.now.as_millis(),
            status: AssistantStatus::Error,
            error_message: Some(text),
        };
        self.commit(TranscriptItem::Assistant(item));
        self.bump();
        self.send_snapshot();
    }

    fn on_prompt(&mut self, op: OpId, text: String, images: Vec<Content>) {
        if self.turn.is_some() {
            let error = ProtocolError::new(ErrorCode::Busy, "A prompt is already running");
            return self.done(op, Err(error));
        }
        let mut user = self.user_item(text);
        user.content.extend(images);
        self.commit(TranscriptItem::User(user));
        self.turn = Some(Turn {
            prompt_op: op,
            stage: Stage::Retrying { at: self.now },
            failures: 0,
            overflow_retried: false,
            compaction: false,
            instructions: None,
        });
        self.next_call();
    }

    /// `compact`: summarises the older conversation now, between turns; a
    /// context with nothing older than what is kept is refused, unchanged.
    fn on_compact(&mut self, op: OpId, instructions: Option<String>) {
        if self.turn.is_some() {
            let error = ProtocolError::new(
                ErrorCode::Busy,
                "The session is running a turn; compact it when the turn ends",
            );
            return self.done(op, Err(error));
        }
        self.turn = Some(Turn {
            prompt_op: op,
            stage: Stage::Retrying { at: self.now },
            failures: 0,
            overflow_retried: false,
            compaction: true,
            instructions: instructions.filter(|i| !i.trim().is_empty()),
        });
        if !self.start_compaction(Why::Asked) {
            self.turn = None;
            let error = ProtocolError::new(
                ErrorCode::InvalidRequest,
                "Nothing to compact: the conversation fits in what a compaction keeps",
            );
            self.done(op, Err(error));
        }
    }

    fn on_steer(&mut self, text: String) -> Result<(), ProtocolError> {
        match &self.turn {
            None => {
                return Err(ProtocolError::new(
                    ErrorCode::Busy,
                    "There is no active prompt to steer",
                ));
            }
            Some(turn) if turn.compaction => {
                return Err(ProtocolError::new(
                    ErrorCode::Busy,
                    "The session is compacting; prompt it when that ends",
                ));
            }
            Some(_) => {}
        }
        let item = self.user_item(text);
        self.state.queued_steer.push(item);
        self.bump();
        self.send_snapshot();
        Ok(())
    }

    fn on_abort(&mut self, op: OpId) {
        if self.turn.is_none() {
            let error = ProtocolError::new(ErrorCode::Busy, "There is no active prompt to abort");
            return self.done(op, Err(error));
        }
        // Steers the model has not seen are withdrawn, not committed: the
        // aborted reply stays the last item, and the abort's response (this
        // revision) lists them in `queuedSteer` so the client that aborted
        // can put them back in its input. The next revision drops them.
        let compaction = self.turn.as_ref().is_some_and(|t| t.compaction);
        let prompt_op = self.stop_turn("Aborted", Queued::Withdraw);
        self.done(op, Ok(()));
        let answer = match compaction {
            true => Err(ProtocolError::new(
                ErrorCode::InvalidRequest,
                "The compaction was aborted; nothing changed",
            )),
            false => Ok(()),
        };
        self.done(prompt_op, answer);
        if !self.state.queued_steer.is_empty() {
            self.state.queued_steer.clear();
            self.bump();
            self.send_snapshot();
        }
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
            levels
                .iter()
                .copied()
                .filter(|l| *l <= level)
                .max()
                .unwrap_or(levels[0])
        };
        self.state.model = model.clone();
        self.state.thinking_level = level;
        self.out
            .push(RuntimeOutput::Persist(Persist::DefaultModel(model)));
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
            Some(_) => Err(ProtocolError::new(
                ErrorCode::Busy,
                format!("Cannot {what} while a prompt is running"),
            )),
            None => Ok(()),
        }
    }

    /// Items a full store kept from being ended go back, ended, written
    /// before anything else of this step is shown (a new revision).
    fn write_back_repairs(&mut self) {
        if self.repairs.is_empty() {
            return;
        }
        for (index, item) in std::mem::take(&mut self.repairs) {
            self.out
                .push(RuntimeOutput::Persist(Persist::Item(item.clone())));
            let at = index.min(self.state.transcript.len());
            self.state.transcript.insert(at, item);
            self.dirty = self.dirty.min(at);
            self.context.stale = true;
        }
        self.bump();
        self.send_snapshot();
    }

    /// Out of room: back to what the store holds, nothing written (it would
    /// fail again); see [`StorageFault::Full`].
    fn on_storage_full(
        &mut self,
        message: String,
        dropped: Vec<RuntimeOutput>,
        mut stored: StoredSession,
    ) {
        let error = ProtocolError::new(
            ErrorCode::InternalError,
            format!("{message} (the session keeps what was stored; free some space and retry)"),
        );
        // Stop what runs; its late events are ignored once the turn is gone.
        let mut unanswered: Vec<OpId> = dropped
            .iter()
            .filter_map(|o| match o {
                RuntimeOutput::Send(FromWorker::OpDone { op, .. }) => Some(*op),
                _ => None,
            })
            .collect();
        if let Some(turn) = self.turn.take() {
            match turn.stage {
                Stage::Streaming { call, .. } | Stage::Compacting { call, .. } => {
                    self.out.push(RuntimeOutput::CancelModel { call });
                }
                Stage::Tools {
                    running, asking, ..
                } => {
                    if !asking {
                        self.out.push(RuntimeOutput::CancelTool { id: running });
                    }
                }
                Stage::Retrying { .. } => {}
            }
            if !unanswered.contains(&turn.prompt_op) {
                unanswered.push(turn.prompt_op);
            }
        }
        self.unsaved = None;
        // What was shown but not stored is gone. A reply or tool the store
        // holds as running must end with the error, but that cannot be
        // written now, and nothing is shown that is not stored: it leaves the
        // transcript until the next operation writes it back, ended.
        let mut kept = Vec::with_capacity(stored.transcript.len());
        for (index, mut item) in std::mem::take(&mut stored.transcript)
            .into_iter()
            .enumerate()
        {
            let ended = match &mut item {
                TranscriptItem::Assistant(a) if a.status == AssistantStatus::Streaming => {
                    a.status = AssistantStatus::Error;
                    a.error_message = Some(message.clone());
                    true
                }
                TranscriptItem::Tool(t) if t.status == ToolStatus::Running => {
                    t.status = ToolStatus::Error;
                    t.content.push(Content::Text {
                        text: format!("{message}; the tool call was stopped"),
                    });
                    true
                }
                _ => false,
            };
            if ended {
                self.repairs.push((index, item));
            } else {
                kept.push(item);
            }
        }
        stored.transcript = kept;
        // Clients saw revisions up to ours: the next must be above them.
        stored.revision = stored.revision.max(self.state.revision);
        stored.queued_steer.clear();
        // The turn a question waited in has ended.
        stored.approvals.pending.clear();
        let asked = !self.state.approvals.pending.is_empty();
        self.state = stored;
        if asked {
            self.send_approvals();
        }
        self.dirty = 0;
        self.context.stale = true;
        self.state.revision += 1;
        self.behind = true;
        self.send_snapshot();
        for op in unanswered {
            self.done(op, Err(error.clone()));
        }
    }

    fn on_dispose(&mut self) {
        if self.turn.is_some() {
            // The server already answered the prompt when it disposed the session.
            self.stop_turn(INTERRUPTED, Queued::Commit);
        } else if !self.repairs.is_empty() || self.behind {
            // A full store left the state row behind what clients saw: the
            // next worker must not start below it (revisions never go back).
            self.write_back_repairs();
            if self.behind {
                self.bump();
            }
        }
        self.finished = true;
        self.out.push(RuntimeOutput::Exit);
    }

    fn on_tick(&mut self) {
        if self
            .unsaved
            .is_some_and(|(since, _)| since + self.policy.checkpoint.interval <= self.now)
        {
            self.checkpoint();
        }
        let due = matches!(&self.turn, Some(Turn { stage: Stage::Retrying { at }, .. }) if *at <= self.now);
        if due {
            self.next_call();
        }
        if self.question_deadline().is_some_and(|at| at <= self.now) {
            self.time_out_question();
        }
    }

    /// Stores the streaming reply as far as it was shown.
    fn checkpoint(&mut self) {
        self.unsaved = None;
        if let Some(Turn {
            stage: Stage::Streaming { item, .. },
            ..
        }) = &self.turn
        {
            let item = self.state.transcript[*item].clone();
            self.out.push(RuntimeOutput::Persist(Persist::Item(item)));
        }
    }

    // ---- the agent loop is in `turn.rs`, the context in `context.rs` -------

    // ---- helpers -----------------------------------------------------------

    fn set_stage(&mut self, stage: Stage) {
        self.turn.as_mut().expect("a turn runs").stage = stage;
    }

    fn assistant_mut(&mut self, index: usize) -> &mut AssistantItem {
        match &mut self.state.transcript[index] {
            TranscriptItem::Assistant(a) => a,
            _ => unreachable!("the streaming item is an assistant item"),
        }
    }

    fn user_item(&mut self, text: String) -> UserItem {
        UserItem {
            id: self.fresh_item_id(),
            content: vec![Content::Text { text }],
            timestamp: self.now.as_millis(),
        }
    }

    fn fresh_item_id(&mut self) -> String {
        let id = format!("item-{}", self.next_item);
        self.next_item += 1;
        id
    }

    fn fresh_call(&mut self) -> u64 {
        let call = self.next_call;
        self.next_call += 1;
        call
    }

    fn commit(&mut self, item: TranscriptItem) {
        self.out
            .push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.state.transcript.push(item);
    }

    /// A state change: new revision, persisted with the settings and steer queue.
    fn bump(&mut self) {
        self.behind = false;
        let s = &mut self.state;
        s.revision += 1;
        s.updated_at = s.updated_at.max(self.now.as_millis());
        self.out.push(RuntimeOutput::Persist(Persist::State {
            revision: s.revision,
            updated_at: s.updated_at,
            name: s.name.clone(),
            model: s.model.clone(),
            thinking_level: s.thinking_level,
            queued_steer: s.queued_steer.clone(),
            summary: s.summary.clone(),
            approvals: s.approvals.clone(),
        }));
    }

    fn send_snapshot(&mut self) {
        let snapshot = self.publish();
        self.out
            .push(RuntimeOutput::Send(FromWorker::Snapshot { snapshot }));
    }

    fn progress(&mut self, progress: TranscriptProgress) {
        self.out
            .push(RuntimeOutput::Send(FromWorker::Progress { progress }));
    }

    /// Answers `op`: on success, with the snapshot as it stands.
    fn done(&mut self, op: OpId, outcome: Result<(), ProtocolError>) {
        let outcome = outcome.map(|()| self.publish());
        self.out
            .push(RuntimeOutput::Send(FromWorker::OpDone { op, outcome }));
    }

    /// The snapshot to publish: the transcript from the first item that
    /// is not finished at the last publication (or changed out of order
    /// since), so a publication costs the turn's tail, not the history.
    fn publish(&mut self) -> TailSnapshot {
        let items = &self.state.transcript;
        let from = self.shown.min(self.dirty).min(items.len());
        #[cfg(debug_assertions)]
        {
            assert_eq!(
                items[..from],
                self.published[..from.min(self.published.len())],
                "a tail leaves out only items published unchanged"
            );
            self.published = items.clone();
        }
        let unfinished = items[from..].iter().position(|item| !item.is_terminal());
        self.shown = from + unfinished.unwrap_or(items.len() - from);
        self.dirty = usize::MAX;
        let mut snapshot = self.head();
        snapshot.transcript = items[from..].to_vec();
        TailSnapshot { snapshot, from }
    }
}

/// A reply still streaming.
fn is_streaming(item: &TranscriptItem) -> bool {
    matches!(item, TranscriptItem::Assistant(a) if a.status == AssistantStatus::Streaming)
}

/// A tool call still running.
fn is_running(item: &TranscriptItem) -> bool {
    matches!(item, TranscriptItem::Tool(t) if t.status == ToolStatus::Running)
}

/// The model a notice ([`RuntimeInput::Notice`]) names: none answered it.
pub fn notice_model() -> ModelRef {
    ModelRef {
        provider: "pi-server".into(),
        id: "notice".into(),
    }
}

/// The text of `item` if it is a notice, not a reply: an assistant item of
/// [`notice_model`] with status `error`.
pub fn notice_text(item: &AssistantItem) -> Option<&str> {
    (item.status == AssistantStatus::Error
        && item.content.is_empty()
        && item.model == notice_model())
    .then_some(item.error_message.as_deref())
    .flatten()
}

/// Whether a reply is part of what the model is sent.
fn is_sent(a: &AssistantItem) -> bool {
    !matches!(a.status, AssistantStatus::Error | AssistantStatus::Aborted)
}

/// Whether a provider's error says the request did not fit the model's
/// context window (OpenAI's, Anthropic's and the common compatible wordings).
pub fn is_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context length exceeded",
        "context window",
        "prompt is too long",
        "input is too long",
        "exceeds the context",
        "reduce the length of the messages",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// Finds `model` among `models`; unknown models are `invalid_request`
/// naming what is offered. Shared by the runtime and the clients, which
/// check a model before they ask for it.
pub fn find_model<'a>(
    models: &'a [ModelMetadata],
    model: &ModelRef,
) -> Result<&'a ModelMetadata, ProtocolError> {
    models
        .iter()
        .find(|m| m.provider == model.provider && m.id == model.id)
        .ok_or_else(|| {
            let offered: Vec<String> = models
                .iter()
                .map(|m| format!("{}/{}", m.provider, m.id))
                .collect();
            ProtocolError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "Unknown model {}/{}; the server offers {}",
                    model.provider,
                    model.id,
                    offered.join(", ")
                ),
            )
        })
}

/// `level` if `meta` supports it; otherwise `invalid_request` naming the
/// supported levels.
pub fn supported(
    meta: &ModelMetadata,
    level: ThinkingLevel,
) -> Result<ThinkingLevel, ProtocolError> {
    if meta.supported_thinking_levels.contains(&level) {
        return Ok(level);
    }
    let levels: Vec<&str> = meta
        .supported_thinking_levels
        .iter()
        .map(|l| l.as_str())
        .collect();
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
            t.content.push(Content::Text {
                text: format!("{INTERRUPTED}; the tool call was not re-run."),
            });
            Some(TranscriptItem::Tool(t))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
