//! The worker host: every decision of a worker process, around its
//! [`Runtime`] and its [`Link`].
//!
//! A worker process says hello to its server, is told to open or create its
//! session, opens its store, and then runs the runtime: operations and model
//! events go in, storage writes, model calls and frames come out. When its
//! server goes away it becomes an orphan that announces itself to the next
//! one, and retires if none adopts it. This machine decides all of that; the
//! driver (`io`'s worker process, or the simulator's fake worker) opens
//! files, talks to sockets and runs model calls, and reports back.
//!
//! ```text
//!   new ─(Send hello)─► AwaitingStart ──start──► Opening ──store opened──► Running ──exit──► Done
//!                            │                     │ store failed             │  ▲
//!                            │ lost / bad frame    ▼                     lost │  │ adopted
//!                            └──────────────────► Done               Orphaned ─┘ (announcing)
//! ```
//!
//! Rules it owns:
//! - **Create policy.** A new session takes the requested model, else the
//!   user's default model if the catalog has it, else the built-in default;
//!   the requested cwd, else the process's, else `/`.
//! - **Store errors** map to protocol codes ([`StoreFailure::code`]).
//! - **Durability order.** Consecutive [`Persist`] outputs of the runtime
//!   become one [`HostOutput::Commit`]; nothing the runtime said after them
//!   is released until the driver reports [`HostInput::Committed`]. So an
//!   item is durable before any frame that mentions it leaves the process.
//!   The user's default model is saved only once its batch committed.
//! - **Storage faults.** A write that failed for want of room
//!   ([`StoreFailureKind::Full`]) is survived: the store is read back
//!   ([`HostOutput::ReloadStore`]) and the runtime goes back to it. Any other
//!   failure, or a failed read-back, is fatal.
//! - **Orphans.** A lost server makes the worker announce itself every
//!   [`WorkerLimits::announce_retry`], one attempt at a time, and retire once
//!   idle after [`WorkerLimits::orphan_grace`].
//! - **Operations belong to their server.** The runtime sees host-local
//!   operation ids; the host answers each operation to the server that
//!   sent it, under that server's id, and drops the answer once that server
//!   is gone. A new server numbers its operations from 1 again, so an
//!   adopted turn's answer must not complete the new server's operation of
//!   the same number.
//!
//! Calling protocol, as every kernel machine: [`WorkerHost::step`] with `now`
//! and one input, outputs carried out in order, and a [`HostInput::Tick`] at
//! [`WorkerHost::next_deadline`].

use crate::faux;
use crate::ids::OpId;
use crate::limits::WorkerLimits;
use crate::link::{Link, LinkAction, LinkInput, LinkState};
use crate::mcp::{McpInput, McpOutput, McpServers, OfferedTool, Route};
use crate::protocol::worker::{WORKER_PROTOCOL_VERSION, WorkerFrame};
use crate::protocol::{
    ErrorCode, JsonValue, ModelMetadata, ModelRef, PackedSnapshot, ProtocolError, SessionPhase,
};
use crate::runtime::{
    ModelEvent, ModelRequest, Persist, Policy, Runtime, RuntimeInput, RuntimeOutput, StorageFault,
    StoredSession,
};
use crate::time::Instant;
use crate::worker::{CreateSpec, FromWorker, Operation, RuntimeMessage, TailSnapshot, ToWorker};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// What the worker knows when it starts: who it is, and the facts of its
/// machine that the create policy needs.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The session this worker hosts.
    pub session_id: String,
    /// The secret it was spawned with.
    pub token: String,
    /// Its process id.
    pub pid: u64,
    /// The model catalog.
    pub models: Vec<ModelMetadata>,
    /// The user's default model (settings), if one is set.
    pub default_model: Option<ModelRef>,
    /// The process's working directory, if it has one.
    pub cwd: Option<String>,
    /// The runtime's retry, compaction and checkpoint policy.
    pub policy: Policy,
    /// Orphan and announcement bounds.
    pub limits: WorkerLimits,
    /// Record each operation that waited for the MCP servers as the runtime
    /// took it ([`WorkerHost::take_released`]), for an observer that judges
    /// the runtime's answers (the simulator's checkers).
    pub observe: bool,
}

/// An operation that waited for the session's MCP servers, as the runtime
/// took it once they were up ([`HostConfig::observe`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    /// The id its server gave it.
    pub op: OpId,
    /// The operation.
    pub operation: Operation,
    /// The runtime's phase just before it took it.
    pub phase_before: SessionPhase,
    /// The runtime's answer in the same step, if it answered at once.
    pub immediate: Option<Result<(), ErrorCode>>,
}

/// How a store operation failed, as the driver classifies it: a fact about
/// the failure, not a decision about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailureKind {
    /// The session id is not a valid one.
    InvalidId,
    /// No such session.
    NotFound,
    /// Creating a session that is already there.
    Exists,
    /// Another worker holds the session.
    Locked,
    /// No space or quota left; the store is intact.
    Full,
    /// Anything else: I/O errors, corruption, unstorable data.
    Broken,
}

/// A failed store operation: its kind and a message naming the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFailure {
    /// What kind of failure.
    pub kind: StoreFailureKind,
    /// What failed, for people.
    pub message: String,
}

impl StoreFailure {
    /// A failure of `kind`.
    pub fn new(kind: StoreFailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The protocol code a request failing with this gets.
    pub fn code(&self) -> ErrorCode {
        match self.kind {
            StoreFailureKind::InvalidId | StoreFailureKind::Exists => ErrorCode::InvalidRequest,
            StoreFailureKind::NotFound => ErrorCode::NotFound,
            StoreFailureKind::Locked => ErrorCode::SessionLocked,
            StoreFailureKind::Full | StoreFailureKind::Broken => ErrorCode::InternalError,
        }
    }

    fn to_protocol(&self) -> ProtocolError {
        ProtocolError::new(self.code(), self.message.clone())
    }
}

/// Inputs of a [`WorkerHost`].
#[derive(Debug, Clone, PartialEq)]
pub enum HostInput {
    /// A frame from the server on the current channel.
    Frame(WorkerFrame),
    /// The current channel to the server closed (or could not be written).
    ChannelLost,
    /// The answer to [`HostOutput::OpenStore`] or [`HostOutput::CreateStore`]:
    /// the session as stored.
    StoreOpened(Result<StoredSession, StoreFailure>),
    /// The answer to [`HostOutput::OpenStore`] for a session that pi's own
    /// durable server listed and never opened: its directory holds only
    /// pi's `meta.json` (`createdAt`, `cwd`), no model and no database.
    StoreUnopened {
        /// When pi created it (ms).
        created_at: u64,
        /// Its working directory.
        cwd: String,
    },
    /// The answer to [`HostOutput::Commit`].
    Committed(Result<(), StoreFailure>),
    /// The answer to [`HostOutput::ReloadStore`].
    Reloaded(Result<StoredSession, StoreFailure>),
    /// The answer to [`HostOutput::Announce`]: the server's first frame on
    /// the new channel, or `None` if there was no server or no answer in time.
    Announced(Option<WorkerFrame>),
    /// The server's worker socket (re)appeared: an orphan announces itself
    /// now instead of at its next retry.
    ServerAppeared,
    /// An event of model call `call`.
    Model {
        /// The call (see [`HostOutput::StartModel`]).
        call: u64,
        /// The event.
        event: ModelEvent,
    },
    /// A tool run finished.
    ToolDone {
        /// The tool item's id.
        id: String,
        /// Its output.
        content: Vec<crate::protocol::Content>,
        /// Tool-specific details.
        details: Option<JsonValue>,
        /// Whether it failed.
        is_error: bool,
    },
    /// What the session's MCP servers did: the answer to
    /// [`HostOutput::LoadMcp`] ([`McpInput::Configure`]), or to
    /// [`HostOutput::Mcp`]'s start ([`McpInput::Started`], [`McpInput::Failed`]),
    /// or a server's death.
    Mcp(McpInput),
    /// Time passed (see [`WorkerHost::next_deadline`]).
    Tick,
}

/// Outputs of a [`WorkerHost`], carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum HostOutput {
    /// Write a frame on the current channel.
    Send(WorkerFrame),
    /// Open the session's store; answer [`HostInput::StoreOpened`].
    OpenStore,
    /// Create the session's store holding this; answer [`HostInput::StoreOpened`].
    CreateStore(StoredSession),
    /// Write the store of a session that has only pi's `meta.json` (see
    /// [`HostInput::StoreUnopened`]), holding this, into its existing
    /// directory; answer [`HostInput::StoreOpened`].
    AdoptStore(StoredSession),
    /// Note in the store which server this worker serves (for a server
    /// started after a crash to find it).
    RecordServer,
    /// Make these durable in one transaction; answer [`HostInput::Committed`].
    Commit(Vec<Persist>),
    /// Read the session back from the store; answer [`HostInput::Reloaded`].
    ReloadStore,
    /// Record the user's default model (settings).
    SaveDefaultModel(ModelRef),
    /// Start model call `call`.
    StartModel {
        /// Id of the call.
        call: u64,
        /// What to ask.
        request: ModelRequest,
        /// The MCP tools offered beside the built-in ones.
        mcp_tools: Arc<[OfferedTool]>,
    },
    /// Stop model call `call`.
    CancelModel {
        /// The call.
        call: u64,
    },
    /// Run a tool; answer [`HostInput::ToolDone`].
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
    /// Call a tool of an MCP server; answer [`HostInput::ToolDone`].
    CallMcp {
        /// The tool item's id.
        id: String,
        /// The server.
        server: String,
        /// The start of it that offered the tool.
        generation: u64,
        /// The tool's name on the server.
        tool: String,
        /// Its arguments.
        input: JsonValue,
    },
    /// Read the session's MCP configuration, layer by layer; answer
    /// [`HostInput::Mcp`] with [`McpInput::Configure`].
    LoadMcp,
    /// Start or stop an MCP server ([`McpOutput::Start`], [`McpOutput::Stop`]).
    Mcp(McpOutput),
    /// Keep the state of the session's MCP servers where `pi-server mcp
    /// list` reads it ([`crate::mcp::STATUS_FILE`]); said at each change.
    RecordMcp(Vec<crate::mcp::ServerStatus>),
    /// Stop a running tool (a built-in one, or an MCP call).
    CancelTool {
        /// The tool item's id.
        id: String,
    },
    /// Connect a new channel to the server's worker socket, send this hello
    /// on it, and wait for the first frame, each within
    /// [`WorkerLimits::announce_timeout`]; answer [`HostInput::Announced`].
    /// Keep the channel until told what to do with it.
    Announce(WorkerFrame),
    /// The announcement was answered with adoption: the new channel becomes
    /// the current one.
    SwitchChannel,
    /// The announcement failed: drop the new channel.
    DropAnnouncement,
    /// Stop the process: close the store (if open) and exit, with this error
    /// when the worker could not do its job.
    Exit(Result<(), String>),
}

/// Where the host stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStage {
    /// Hello sent; waiting for the server's start.
    AwaitingStart,
    /// The store was asked to open or create the session.
    Opening,
    /// The runtime runs.
    Running,
    /// Exit was output.
    Done,
}

/// A commit in flight, and what waits behind it.
#[derive(Debug, Clone)]
enum Writing {
    /// Nothing in flight.
    Idle,
    /// A batch is being committed; its default models are saved after it.
    Batch { defaults: Vec<ModelRef> },
    /// A batch failed for want of room; the store is being read back.
    Reloading { message: String },
}

/// The worker-host machine. See the module documentation.
#[derive(Debug, Clone)]
pub struct WorkerHost {
    config: HostConfig,
    stage: HostStage,
    /// From the start: the revision the runtime starts above.
    revision_floor: u64,
    /// Set while creating: the session the store is asked to hold.
    creating: Option<StoredSession>,
    runtime: Option<Runtime>,
    link: Link,
    /// An announcement is out; no second one starts.
    announcing: bool,
    /// Something was left out since the last announcement's snapshot (a
    /// delta streamed, a tail published): that snapshot lags, and an
    /// adoption sends the current one at once.
    lagging: bool,
    /// The snapshot tails left out (no server heard them), merged: the
    /// next snapshot sent starts where they did.
    carry: Option<TailSnapshot>,
    writing: Writing,
    /// Runtime outputs waiting for the commit in flight.
    held: VecDeque<RuntimeOutput>,
    /// Inputs that arrived while a commit was in flight.
    deferred: VecDeque<HostInput>,
    /// Operations of the current server in the runtime: host-local id →
    /// the server's id.
    ops: BTreeMap<OpId, OpId>,
    /// The next host-local operation id.
    next_op: u64,
    /// The session's MCP servers.
    mcp: McpServers,
    /// Their tools, as model calls offer them, made at this revision.
    mcp_tools: Arc<[OfferedTool]>,
    mcp_revision: Option<u64>,
    /// Whether a turn waits for the MCP servers.
    gate: Gate,
    /// A prompt came while the configuration read at open was in use: read
    /// it again before the prompt runs.
    reload: bool,
    /// Runtime inputs that wait for the gate, or were made by the host;
    /// run in order once the store is idle.
    runnable: VecDeque<RuntimeInput>,
    /// Notices waiting for the session to be idle.
    notices: Vec<String>,
    /// The MCP call running, and when it times out.
    mcp_call: Option<(String, Instant)>,

    /// What [`WorkerHost::take_released`] returns next.
    released: Vec<Released>,
    now: Instant,
    out: Vec<HostOutput>,
}

/// Where a prompt stands with the session's MCP servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Operations go to the runtime.
    Open,
    /// The configuration was asked for; operations wait.
    Loading,
    /// Servers are starting; operations wait.
    Starting,
}

impl WorkerHost {
    /// A new worker host; its first output is its hello.
    pub fn new(config: HostConfig, now: Instant) -> (Self, Vec<HostOutput>) {
        let link = Link::new(config.limits.orphan_grace, config.limits.announce_retry);
        let mcp = McpServers::new(config.limits.mcp.clone());
        let mut host = Self {
            config,
            stage: HostStage::AwaitingStart,
            revision_floor: 0,
            creating: None,
            runtime: None,
            link,
            announcing: false,
            lagging: false,
            carry: None,
            writing: Writing::Idle,
            held: VecDeque::new(),
            deferred: VecDeque::new(),
            ops: BTreeMap::new(),
            next_op: 1,
            mcp,
            mcp_tools: Arc::from([]),
            mcp_revision: None,
            gate: Gate::Open,
            reload: false,
            runnable: VecDeque::new(),
            notices: Vec::new(),
            mcp_call: None,
            released: Vec::new(),
            now,
            out: Vec::new(),
        };
        let hello = host.hello(None);
        host.out.push(HostOutput::Send(hello));
        let out = std::mem::take(&mut host.out);
        (host, out)
    }

    /// Whether operation `op` (the server's id) waits for the MCP servers.
    pub fn holds(&self, op: OpId) -> bool {
        self.runnable.iter().any(|input| {
            matches!(input, RuntimeInput::Operation { op: local, .. } if self.ops.get(local) == Some(&op))
        })
    }

    /// The operations that waited for the MCP servers and were taken by
    /// the runtime since the last call ([`HostConfig::observe`]).
    pub fn take_released(&mut self) -> Vec<Released> {
        std::mem::take(&mut self.released)
    }

    /// Where the host stands.
    pub fn stage(&self) -> HostStage {
        self.stage
    }

    /// The runtime, once the session is open.
    pub fn runtime(&self) -> Option<&Runtime> {
        self.runtime.as_ref()
    }

    /// True while no server holds this worker.
    pub fn is_orphaned(&self) -> bool {
        self.link.is_orphaned()
    }

    /// When to feed [`HostInput::Tick`].
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.stage != HostStage::Running {
            return None;
        }
        let runtime = self.runtime.as_ref().and_then(Runtime::next_deadline);
        let call = self.mcp_call.as_ref().map(|(_, at)| *at);
        [
            runtime,
            self.link.next_deadline(),
            self.mcp.next_deadline(),
            call,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Feeds one input at `now`.
    pub fn step(&mut self, now: Instant, input: HostInput) -> Vec<HostOutput> {
        self.now = self.now.max(now);
        if self.stage == HostStage::Done {
            return Vec::new();
        }
        if self.waiting_for_store() && !is_store_answer(&input) {
            self.deferred.push_back(input);
            return Vec::new();
        }
        self.on_input(input);
        while !self.waiting_for_store() && self.stage == HostStage::Running {
            if self.gate == Gate::Open
                && let Some(input) = self.runnable.pop_front()
            {
                self.run_gated(input, true);
                continue;
            }
            let Some(input) = self.deferred.pop_front() else {
                break;
            };
            self.on_input(input);
        }
        while !self.waiting_for_store() && self.stage != HostStage::Done {
            let Some(input) = self.deferred.pop_front() else {
                break;
            };
            self.on_input(input);
        }
        if self.stage == HostStage::Running && !self.waiting_for_store() {
            self.tick_link();
        }
        debug_assert_eq!(self.invariants(), Ok(()));
        std::mem::take(&mut self.out)
    }

    /// The host's invariants: runtime outputs and inputs wait only for the
    /// store's answer; an orphan holds no operation
    /// of the server it lost, and announces only while orphaned; the link's
    /// own hold. Its MCP gate's: while open no server is starting (so no
    /// turn starts before its servers are up), and nothing waits for it once
    /// the store is idle; the servers' own hold.
    pub fn invariants(&self) -> Result<(), String> {
        self.link.invariants()?;
        if !self.held.is_empty() && !self.waiting_for_store() {
            return Err("runtime outputs held with no store answer to wait for".into());
        }
        if !self.deferred.is_empty() && !self.waiting_for_store() && self.stage != HostStage::Done {
            return Err(format!(
                "{} inputs deferred with nothing to wait for",
                self.deferred.len()
            ));
        }
        if self.link.is_orphaned() && !self.ops.is_empty() {
            return Err(format!(
                "an orphan keeps {} operations of a server it lost",
                self.ops.len()
            ));
        }
        if self.announcing && matches!(self.link.state(), LinkState::Linked) {
            return Err("an announcement out while linked".into());
        }
        self.mcp.invariants()?;
        if self.gate == Gate::Open && !self.mcp.settled() {
            return Err("the MCP gate is open while a server is starting".into());
        }
        if self.stage == HostStage::Running
            && self.gate == Gate::Open
            && !self.waiting_for_store()
            && !self.runnable.is_empty()
        {
            return Err(format!(
                "{} inputs wait behind an open gate",
                self.runnable.len()
            ));
        }
        Ok(())
    }

    fn waiting_for_store(&self) -> bool {
        !matches!(self.writing, Writing::Idle)
    }

    fn on_input(&mut self, input: HostInput) {
        match (self.stage, input) {
            (
                HostStage::AwaitingStart,
                HostInput::Frame(WorkerFrame::Start {
                    create,
                    revision_floor,
                }),
            ) => self.on_start(create, revision_floor),
            (HostStage::AwaitingStart, HostInput::Frame(other)) => self.exit(Err(format!(
                "expected start from the server, got {other:?}"
            ))),
            (HostStage::AwaitingStart, HostInput::ChannelLost) => {
                self.exit(Err("the server closed the channel before start".into()))
            }
            (HostStage::Opening, HostInput::StoreOpened(result)) => self.on_opened(result),
            (HostStage::Opening, HostInput::StoreUnopened { created_at, cwd })
                if self.creating.is_none() =>
            {
                self.on_unopened(created_at, cwd)
            }
            (HostStage::Running, HostInput::Committed(result)) => self.on_committed(result),
            (HostStage::Running, HostInput::Reloaded(result)) => self.on_reloaded(result),
            (HostStage::Running, HostInput::Frame(frame)) => self.on_frame(frame),
            (HostStage::Running, HostInput::ChannelLost) => self.on_channel_lost(),
            (HostStage::Running, HostInput::ServerAppeared) if self.link.is_orphaned() => {
                self.announce()
            }
            (HostStage::Running, HostInput::Announced(answer)) => self.on_announced(answer),
            (HostStage::Running, HostInput::Model { call, event }) => {
                self.run(RuntimeInput::Model { call, event })
            }
            (
                HostStage::Running,
                HostInput::ToolDone {
                    id,
                    content,
                    details,
                    is_error,
                },
            ) => {
                if self.mcp_call.as_ref().is_some_and(|(i, _)| *i == id) {
                    self.mcp_call = None;
                }
                self.run(RuntimeInput::ToolDone {
                    id,
                    content,
                    details,
                    is_error,
                })
            }
            (HostStage::Running, HostInput::Mcp(input)) => self.on_mcp(input),
            (HostStage::Running, HostInput::Tick) => {
                self.on_mcp(McpInput::Tick);
                self.time_out_mcp_call();
                self.run(RuntimeInput::Tick)
            }
            // Anything else is stale (an answer after the host moved on) or
            // early (time before there is a runtime): nothing to do.
            _ => {}
        }
    }

    fn hello(&self, resume: Option<Box<PackedSnapshot>>) -> WorkerFrame {
        WorkerFrame::Hello {
            version: WORKER_PROTOCOL_VERSION,
            token: self.config.token.clone(),
            session_id: self.config.session_id.clone(),
            pid: self.config.pid,
            resume,
        }
    }

    fn exit(&mut self, result: Result<(), String>) {
        self.stage = HostStage::Done;
        self.out.push(HostOutput::Exit(result));
    }

    /// The session cannot be opened: say why, and exit.
    fn fail(&mut self, error: ProtocolError) {
        self.out.push(HostOutput::Send(WorkerFrame::FromWorker(
            FromWorker::Failed { error },
        )));
        self.exit(Ok(()));
    }

    fn on_start(&mut self, create: Option<CreateSpec>, revision_floor: u64) {
        self.revision_floor = revision_floor;
        let Some(spec) = create else {
            self.stage = HostStage::Opening;
            self.out.push(HostOutput::OpenStore);
            return;
        };
        match self.initial(spec, self.now.as_millis()) {
            Err(error) => self.fail(error),
            Ok(stored) => {
                self.stage = HostStage::Opening;
                self.creating = Some(stored.clone());
                self.out.push(HostOutput::CreateStore(stored));
            }
        }
    }

    /// A new session's first state: the model asked for, else the user's
    /// default if offered, else the faux default; the cwd asked for, else
    /// the process's, else `/`.
    fn initial(&self, spec: CreateSpec, created_at: u64) -> Result<StoredSession, ProtocolError> {
        let default = self
            .config
            .default_model
            .clone()
            .filter(|m| {
                self.config
                    .models
                    .iter()
                    .any(|x| x.provider == m.provider && x.id == m.id)
            })
            .unwrap_or_else(faux::default_model);
        let (model, thinking_level) =
            Runtime::resolve_create(&spec, &default, &self.config.models)?;
        let cwd = spec
            .cwd
            .or_else(|| self.config.cwd.clone())
            .unwrap_or_else(|| "/".to_string());
        Ok(StoredSession {
            id: self.config.session_id.clone(),
            name: spec.name,
            cwd,
            created_at,
            updated_at: self.now.as_millis(),
            model,
            thinking_level,
            revision: 0,
            transcript: Vec::new(),
            queued_steer: Vec::new(),
            summary: None,
            approvals: Default::default(),
        })
    }

    /// A session pi listed and never opened: it starts here, as a new one
    /// does, keeping pi's creation time and cwd.
    fn on_unopened(&mut self, created_at: u64, cwd: String) {
        let spec = CreateSpec {
            cwd: Some(cwd),
            name: None,
            model: None,
            thinking_level: None,
        };
        match self.initial(spec, created_at) {
            Err(error) => self.fail(error),
            Ok(stored) => {
                self.creating = Some(stored.clone());
                self.out.push(HostOutput::AdoptStore(stored));
            }
        }
    }

    fn on_opened(&mut self, result: Result<StoredSession, StoreFailure>) {
        let mut stored = match result {
            Ok(stored) => stored,
            Err(failure) => return self.fail(failure.to_protocol()),
        };
        let models = self.config.models.clone();
        let (runtime, outputs) = match self.creating.take() {
            Some(_) => Runtime::create(stored, models, self.now),
            None => {
                // Clients saw this far, even if the store is behind (a full store).
                stored.revision = stored.revision.max(self.revision_floor);
                Runtime::open(stored, models, self.now)
            }
        };
        let runtime = runtime.with_policy(self.config.policy.clone());
        // After `Ready`: the approvals, unless they are what a server
        // assumes of a session it has not heard them from.
        let mut outputs = outputs;
        outputs.extend(runtime.told_approvals().map(RuntimeOutput::Send));
        self.runtime = Some(runtime);
        self.stage = HostStage::Running;
        self.out.push(HostOutput::RecordServer);
        // The servers start now, so that the first prompt finds them up.
        self.gate = Gate::Loading;
        self.out.push(HostOutput::LoadMcp);
        self.release(outputs.into());
    }

    fn on_frame(&mut self, frame: WorkerFrame) {
        let input = match frame {
            WorkerFrame::ToWorker(ToWorker::Operation { op, operation }) => {
                if self.link.is_orphaned() {
                    return;
                }
                let local = OpId(self.next_op);
                self.next_op += 1;
                self.ops.insert(local, op);
                RuntimeInput::Operation {
                    op: local,
                    operation,
                }
            }
            WorkerFrame::ToWorker(ToWorker::Dispose) => RuntimeInput::Dispose,
            WorkerFrame::ToWorker(ToWorker::Snapshot) => {
                if !self.link.is_orphaned() {
                    self.send_whole_snapshot();
                }
                return;
            }
            // Frames a server never sends a running worker: ignored.
            _ => return,
        };
        if self.link.is_orphaned() {
            return;
        }
        let idle = self
            .runtime
            .as_ref()
            .is_some_and(|r| r.phase() == SessionPhase::Idle);
        let prompt = matches!(
            input,
            RuntimeInput::Operation {
                operation: Operation::Prompt { .. },
                ..
            }
        );

        if prompt && idle && self.runnable.is_empty() {
            // A turn starts with its MCP servers as configured now: read
            // again, once the reading under way (at open) is done.
            match self.gate {
                Gate::Open => {
                    self.gate = Gate::Loading;
                    self.out.push(HostOutput::LoadMcp);
                }
                Gate::Loading | Gate::Starting => self.reload = true,
            }
        }
        if self.gate != Gate::Open || !self.runnable.is_empty() {
            self.runnable.push_back(input);
        } else {
            self.run_gated(input, false);
        }
    }

    /// Runs an input that waited for the gate (or did not have to). The
    /// editor's MCP servers change at once, not at the next prompt: the
    /// configuration is read again after they are stored (outputs are
    /// carried out in order), and what follows waits for it.
    fn run_gated(&mut self, input: RuntimeInput, waited: bool) {
        let servers = matches!(
            input,
            RuntimeInput::Operation {
                operation: Operation::SetMcpServers { .. },
                ..
            }
        );
        let observed = match (&input, &self.runtime) {
            (RuntimeInput::Operation { op, operation }, Some(runtime))
                if waited && self.config.observe =>
            {
                Some((*op, operation.clone(), runtime.phase()))
            }
            _ => None,
        };
        if let Some(runtime) = self.runtime.as_mut() {
            let outputs = runtime.step(self.now, input);
            if let Some((op, operation, phase_before)) = observed
                && let Some(&server_op) = self.ops.get(&op)
            {
                let immediate = outputs.iter().find_map(|o| match o {
                    RuntimeOutput::Send(FromWorker::OpDone { op: done, outcome })
                        if *done == op =>
                    {
                        Some(outcome.as_ref().map(|_| ()).map_err(|e| e.code))
                    }
                    _ => None,
                });
                self.released.push(Released {
                    op: server_op,
                    operation,
                    phase_before,
                    immediate,
                });
            }
            self.release(outputs.into());
        }
        if servers && self.gate == Gate::Open {
            self.gate = Gate::Loading;
            self.out.push(HostOutput::LoadMcp);
        }
    }

    fn on_mcp(&mut self, input: McpInput) {
        if matches!(input, McpInput::Configure(_)) {
            if self.gate != Gate::Loading {
                return; // not asked for
            }
            self.gate = Gate::Starting;
        }
        for output in self.mcp.step(self.now, input) {
            match output {
                McpOutput::Notice(text) => self.notices.push(text),
                output => self.out.push(HostOutput::Mcp(output)),
            }
        }
        if self.mcp_revision != Some(self.mcp.revision()) {
            self.mcp_revision = Some(self.mcp.revision());
            self.mcp_tools = self.mcp.tools().cloned().collect();
            self.out.push(HostOutput::RecordMcp(self.mcp.status()));
        }
        if self.gate == Gate::Starting && self.mcp.settled() && self.reload {
            self.reload = false;
            self.gate = Gate::Loading;
            self.out.push(HostOutput::LoadMcp);
        }
        if self.gate == Gate::Starting && self.mcp.settled() {
            self.gate = Gate::Open;
            // Told before the waiting prompt, so that they come before its turn.
            let notices = std::mem::take(&mut self.notices);
            let waiting = std::mem::take(&mut self.runnable);
            self.runnable = notices.into_iter().map(RuntimeInput::Notice).collect();
            self.runnable.extend(waiting);
        }
        let idle = self
            .runtime
            .as_ref()
            .is_some_and(|r| r.phase() == SessionPhase::Idle);
        if self.gate == Gate::Open && idle {
            let notices = std::mem::take(&mut self.notices);
            self.runnable
                .extend(notices.into_iter().map(RuntimeInput::Notice));
        }
    }

    /// Fails the MCP call running past its deadline, and stops it.
    fn time_out_mcp_call(&mut self) {
        let Some((id, at)) = self.mcp_call.clone() else {
            return;
        };
        if self.now < at {
            return;
        }
        self.mcp_call = None;
        self.out.push(HostOutput::CancelTool { id: id.clone() });
        let secs = self.config.limits.mcp.call_timeout.as_secs_f64();
        self.runnable.push_back(tool_error(
            id,
            format!("the MCP tool did not answer within {secs} s"),
        ));
    }

    fn on_channel_lost(&mut self) {
        // Operations in the runtime now answer no one.
        self.ops.clear();
        if self.link.step(self.now, LinkInput::Lost) == Some(LinkAction::Announce) {
            self.announce();
        }
    }

    fn announce(&mut self) {
        if self.announcing {
            return;
        }
        let Some(runtime) = &self.runtime else { return };
        self.announcing = true;
        // Whole: the next server has nothing; what is left out after this
        // is carried to it once adopted.
        self.carry = None;
        self.lagging = false;
        let Ok(snapshot) = PackedSnapshot::pack(runtime.snapshot()) else {
            return; // it cannot be shown; unadopted, it retires once idle
        };
        let hello = self.hello(Some(Box::new(snapshot)));
        self.out.push(HostOutput::Announce(hello));
    }

    fn on_announced(&mut self, answer: Option<WorkerFrame>) {
        if !self.announcing {
            return;
        }
        self.announcing = false;
        if matches!(answer, Some(WorkerFrame::Adopted)) && self.link.is_orphaned() {
            self.link.step(self.now, LinkInput::Adopted);
            self.out.push(HostOutput::SwitchChannel);
            // The server holds the announcement's snapshot: what streamed
            // since would otherwise reach it only as deltas after a hole.
            if std::mem::take(&mut self.lagging) {
                self.send_whole_snapshot();
            }
            // The approvals are not in the snapshot: the new server hears them now.
            if let Some(message) = self.runtime.as_ref().and_then(Runtime::told_approvals) {
                self.out.push(packed(message));
            }
        } else {
            self.out.push(HostOutput::DropAnnouncement);
        }
    }

    /// Orphan bookkeeping after every input: announce again, or retire.
    fn tick_link(&mut self) {
        let idle = self
            .runtime
            .as_ref()
            .is_some_and(|r| r.phase() == SessionPhase::Idle);
        match self.link.step(self.now, LinkInput::Tick { idle }) {
            Some(LinkAction::Announce) => self.announce(),
            Some(LinkAction::Retire) => self.run(RuntimeInput::Dispose),
            None => {}
        }
    }

    fn run(&mut self, input: RuntimeInput) {
        let Some(runtime) = self.runtime.as_mut() else {
            return;
        };
        let outputs = runtime.step(self.now, input);
        self.release(outputs.into());
    }

    /// Carries runtime outputs over to host outputs, up to and including the
    /// next batch of writes; the rest waits for that batch to commit.
    fn release(&mut self, mut outputs: VecDeque<RuntimeOutput>) {
        while let Some(output) = outputs.pop_front() {
            let output = match output {
                RuntimeOutput::Send(message) if self.link.is_orphaned() => {
                    // No server to hear it; the announcement carries the
                    // state, and the next snapshot what changed after it.
                    self.leave_out(message);
                    continue;
                }
                output => output,
            };
            let out = match output {
                RuntimeOutput::Persist(first) => {
                    let mut batch = vec![first];
                    while let Some(RuntimeOutput::Persist(_)) = outputs.front() {
                        let Some(RuntimeOutput::Persist(p)) = outputs.pop_front() else {
                            unreachable!("checked above");
                        };
                        batch.push(p);
                    }
                    let defaults = batch
                        .iter()
                        .filter_map(|p| match p {
                            Persist::DefaultModel(m) => Some(m.clone()),
                            _ => None,
                        })
                        .collect();
                    batch.retain(|p| !matches!(p, Persist::DefaultModel(_)));
                    if batch.is_empty() {
                        self.save_defaults(defaults);
                        continue;
                    }
                    self.writing = Writing::Batch { defaults };
                    self.held = outputs;
                    self.out.push(HostOutput::Commit(batch));
                    return;
                }
                RuntimeOutput::Send(FromWorker::OpDone { op, outcome }) => {
                    // Answered under the id its server gave it, if that
                    // server is still the one this worker serves.
                    let Some(op) = self.ops.remove(&op) else {
                        self.leave_out(FromWorker::OpDone { op, outcome });
                        continue;
                    };
                    let outcome = outcome.map(|tail| self.carried(tail));
                    packed(FromWorker::OpDone { op, outcome })
                }
                RuntimeOutput::Send(message) => {
                    let message = message
                        .try_map_snapshot(|tail| Ok::<_, ()>(self.carried(tail)))
                        .expect("infallible");
                    packed(message)
                }
                RuntimeOutput::StartModel { call, request } => HostOutput::StartModel {
                    call,
                    request,
                    mcp_tools: Arc::clone(&self.mcp_tools),
                },
                RuntimeOutput::CancelModel { call } => HostOutput::CancelModel { call },
                RuntimeOutput::RunTool {
                    id,
                    tool_name,
                    input,
                    cwd,
                } => match self.mcp.route(&tool_name) {
                    Route::Builtin => HostOutput::RunTool {
                        id,
                        tool_name,
                        input,
                        cwd,
                    },
                    Route::Call {
                        server,
                        generation,
                        tool,
                    } => {
                        let deadline = self.now + self.config.limits.mcp.call_timeout;
                        self.mcp_call = Some((id.clone(), deadline));
                        HostOutput::CallMcp {
                            id,
                            server,
                            generation,
                            tool,
                            input,
                        }
                    }
                    Route::Unavailable(message) => {
                        self.runnable.push_back(tool_error(id, message));
                        continue;
                    }
                },
                RuntimeOutput::CancelTool { id } => {
                    if self.mcp_call.as_ref().is_some_and(|(i, _)| *i == id) {
                        self.mcp_call = None;
                    }
                    HostOutput::CancelTool { id }
                }
                RuntimeOutput::Exit => return self.exit(Ok(())),
            };
            self.out.push(out);
        }
    }

    fn save_defaults(&mut self, defaults: Vec<ModelRef>) {
        self.out
            .extend(defaults.into_iter().map(HostOutput::SaveDefaultModel));
    }

    fn on_committed(&mut self, result: Result<(), StoreFailure>) {
        let Writing::Batch { defaults } = std::mem::replace(&mut self.writing, Writing::Idle)
        else {
            return;
        };
        match result {
            Ok(()) => {
                self.save_defaults(defaults);
                let held = std::mem::take(&mut self.held);
                self.release(held);
            }
            Err(failure) => {
                let message = format!("storage write failed: {}", failure.message);
                if failure.kind == StoreFailureKind::Full {
                    self.writing = Writing::Reloading { message };
                    self.out.push(HostOutput::ReloadStore);
                } else {
                    self.storage_failed(message, StorageFault::Fatal, None);
                }
            }
        }
    }

    fn on_reloaded(&mut self, result: Result<StoredSession, StoreFailure>) {
        let Writing::Reloading { message } = std::mem::replace(&mut self.writing, Writing::Idle)
        else {
            return;
        };
        match result {
            Ok(stored) => self.storage_failed(message, StorageFault::Full, Some(Box::new(stored))),
            Err(failure) => {
                let message = format!(
                    "{message}; cannot read the session back: {}",
                    failure.message
                );
                self.storage_failed(message, StorageFault::Fatal, None);
            }
        }
    }

    fn storage_failed(
        &mut self,
        message: String,
        fault: StorageFault,
        stored: Option<Box<StoredSession>>,
    ) {
        let dropped = std::mem::take(&mut self.held).into();
        self.run(RuntimeInput::StorageFailed {
            message,
            fault,
            dropped,
            stored,
        });
    }
}

impl WorkerHost {
    /// The session as it stands, whole: it covers every tail left out
    /// before it, and is current as of the deltas that follow.
    fn send_whole_snapshot(&mut self) {
        if let Some(runtime) = &self.runtime {
            self.carry = None;
            let snapshot = runtime.snapshot().into();
            self.out.push(packed(FromWorker::Snapshot { snapshot }));
        }
    }

    /// A message not sent: the tail of its snapshot goes with the next one.
    fn leave_out(&mut self, message: RuntimeMessage) {
        self.lagging = true;
        if let Some(tail) = message.into_snapshot() {
            self.carry = Some(match self.carry.take() {
                Some(carry) => carry.merged(tail),
                None => tail,
            });
        }
    }

    /// `tail` extended back over the tails left out before it.
    fn carried(&mut self, tail: TailSnapshot) -> TailSnapshot {
        match self.carry.take() {
            Some(carry) => carry.merged(tail),
            None => tail,
        }
    }
}

fn is_store_answer(input: &HostInput) -> bool {
    matches!(input, HostInput::Committed(_) | HostInput::Reloaded(_))
}

/// A runtime message for the channel, its snapshot packed. A snapshot that
/// cannot be encoded (JSON in it nested past the CBOR limits) could be
/// shown to no client: the session fails instead of going silent.
/// A tool run that failed with `message`, as the runtime hears it.
fn tool_error(id: String, message: String) -> RuntimeInput {
    RuntimeInput::ToolDone {
        id,
        content: vec![crate::protocol::Content::Text { text: message }],
        details: None,
        is_error: true,
    }
}

fn packed(message: RuntimeMessage) -> HostOutput {
    let message = message.pack().unwrap_or_else(|error| FromWorker::Fatal {
        message: format!("the session's snapshot cannot be encoded: {error}"),
    });
    HostOutput::Send(WorkerFrame::FromWorker(message))
}

#[cfg(test)]
mod tests;
