//! A fake world around the real kernel: clients speaking bytes, fake worker
//! processes running the real [`Runtime`] with the faux provider, a fake
//! durable store, and virtual time.
//!
//! # Deliveries
//!
//! Every input reaches the kernel through one FIFO ([`World::run`] drains it
//! and carries out each step's outputs in order). What happens *between* the
//! kernel and its peers is decided by [`Holds`]:
//!
//! - With [`Holds::none`] (the scripted scenarios) everything is delivered at
//!   once: a client's frame reaches the kernel as soon as it is sent, a worker
//!   boots as soon as it is spawned, a worker's messages arrive as soon as it
//!   writes them. A run is then a pure function of the calls made.
//! - With held deliveries (the swarm and the model checker) each of those
//!   hops waits in a per-channel FIFO until a driver calls
//!   [`World::deliver`]. Channels are per connection (each direction), per
//!   worker (each direction), plus worker boots, exit notices, the catalog
//!   load and store removals. Order is kept *within* a channel (a byte stream
//!   or a pipe never reorders) and is free *across* channels, which is where
//!   delays and reordering come from. Client bytes can be delivered in any
//!   split (a prefix of what is queued) or coalesced (everything queued).
//!
//! # Facts
//!
//! With [`Options::record_facts`] the world records what checkers need to
//! judge the kernel ([`Fact`]): requests sent, every message the kernel
//! queued together with the requester's attachment right after that kernel
//! step, operations the runtimes received, completions the kernel consumed,
//! connections that ended. The checkers read them; the
//! world itself judges nothing.
//!
//! [`Runtime`]: kernel::runtime::Runtime

use crate::summary::{self, Names};
use kernel::faux;
use kernel::host::{HostInput, WorkerHost};
use kernel::ids::{ChannelId, ConnId, OpId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::worker::WorkerFrame;
use kernel::protocol::{
    Command, CommandResult, ErrorCode, ServerEvent, ServerMessage, SessionPhase,
    TranscriptProgress, decode_server_message,
};
use kernel::server::{Config, Frame, Input, Output, Server};
use kernel::time::Instant;
use kernel::wire::CborLimits;
use kernel::wire::frame::FRAME_HEADER_LEN;
use kernel::worker::{FromWorker, Operation, WorkerState};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// The server id every simulated server reports.
pub const SERVER_ID: &str = "00000000-0000-4000-8000-000000000001";

/// Appends a trace line, formatting it only when the world keeps a trace.
macro_rules! trace {
    ($world:expr, $($arg:tt)*) => {
        if $world.options.trace {
            let line = format!($($arg)*);
            $world.log(line);
        }
    };
}

mod clients;
mod delivery;
mod memo;
mod replacement;
mod store;
pub mod v8;
mod workers;

pub use clients::Client;
pub use delivery::{Amount, Delivery};
pub use memo::{HashWrite, Memo};
pub use store::Store;
use workers::{FakeWorker, WatchedOp};
pub use workers::{WorkerScript, WorkerStage};

/// Which hops wait for an explicit [`World::deliver`]. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Holds {
    /// Client → server bytes (and the client's end of stream).
    pub to_server: bool,
    /// Server → client frames (and the server's close).
    pub to_client: bool,
    /// A spawned worker opening its session and reporting ready.
    pub boot: bool,
    /// Server → worker messages.
    pub to_worker: bool,
    /// Worker → server messages.
    pub from_worker: bool,
    /// The notice that a worker process exited.
    pub exit: bool,
    /// The catalog load after a server (re)start.
    pub catalog: bool,
    /// Store removals requested by the kernel.
    pub removal: bool,
    /// A catalog rescan's result (the directory is read when the kernel
    /// asks; the kernel hears back later).
    pub scan: bool,
    /// An exit notice may overtake the worker's messages still in flight (as
    /// in the daemon, where `wait()` and the channel reader are separate tasks).
    pub exit_overtakes: bool,
    /// An orphan's announcement travels while the orphan works on: what it
    /// streams meanwhile is not in the snapshot the server adopts it with.
    pub announce: bool,
}

impl Holds {
    /// Everything delivered at once (the scripted scenarios).
    pub fn none() -> Self {
        Self::default()
    }

    /// Everything held (the swarm).
    pub fn all() -> Self {
        Self {
            to_server: true,
            to_client: true,
            boot: true,
            to_worker: true,
            from_worker: true,
            exit: true,
            catalog: true,
            removal: true,
            scan: true,
            exit_overtakes: true,
            announce: true,
        }
    }
}

/// Knobs of a world.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seeds the server's ids.
    pub seed: u64,
    /// Token the server requires, if any.
    pub token: Option<String>,
    /// Kernel limits.
    pub limits: Limits,
    /// Delay between faux deltas.
    pub faux_delay: Duration,
    /// How long a fake tool run takes.
    pub tool_delay: Duration,
    /// Record progress deltas in the trace (they are many).
    pub trace_deltas: bool,
    /// Keep a trace at all (the swarm turns it off for speed).
    pub trace: bool,
    /// Keep every message each client received ([`Client::received`]).
    pub keep_received: bool,
    /// Record [`Fact`]s for the checkers.
    pub record_facts: bool,
    /// Do not decode frames that no checker reads (server snapshots,
    /// recognised by their first bytes). Needs `trace` and
    /// `keep_received` off. Halves the simulator's own work.
    pub skip_unchecked: bool,
    /// Which hops wait for a delivery.
    pub holds: Holds,
    /// The models offered (the model checker offers one, to keep states small).
    pub models: Vec<kernel::protocol::ModelMetadata>,
    /// A worker told to dispose hangs with this probability (drawn from a
    /// generator of this seed): alive and silent until killed.
    pub hang_on_dispose: Option<(u64, crate::prng::Ratio)>,
    /// Sessions have two MCP servers (`s0`, `s1`); each start and each call
    /// goes wrong with this probability (drawn from a generator of this seed).
    pub mcp: Option<(u64, crate::prng::Ratio)>,
    /// The limits every fake worker's host runs with (orphan grace, …).
    pub worker_limits: kernel::limits::WorkerLimits,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            seed: 1,
            token: None,
            limits: Limits::default(),
            faux_delay: Duration::from_millis(10),
            tool_delay: Duration::from_millis(20),
            trace_deltas: false,
            trace: true,
            keep_received: true,
            record_facts: false,
            skip_unchecked: false,
            holds: Holds::none(),
            models: faux::models(),
            hang_on_dispose: None,
            mcp: None,
            worker_limits: kernel::limits::WorkerLimits::default(),
        }
    }
}

/// Something the checkers need to know, in the order it happened.
#[derive(Debug, Clone)]
pub enum Fact {
    /// A client sent a request: one response is owed while the connection lives.
    RequestSent {
        conn: ConnId,
        id: String,
        command: Command,
    },
    /// The kernel queued `message` for `conn`. `attached_after` says whether
    /// `conn` was attached to the message's session right after that kernel
    /// step — `None` when that step ran several requests of `conn` (coalesced
    /// frames, deferred requests), so the state after it does not judge each
    /// message; `open_after` says whether the kernel still served `conn`.
    Emitted {
        conn: ConnId,
        message: Arc<ServerMessage>,
        attached_after: Option<bool>,
        open_after: bool,
        /// The server was shutting down after that step.
        shutting_down: bool,
    },
    /// A client's first frame was a hello with `token`, to a server
    /// configured with `expected`.
    HelloSent {
        conn: ConnId,
        token: Option<String>,
        expected: Option<String>,
    },
    /// A v8 client sent a request: one response is owed while the connection lives.
    V8RequestSent {
        conn: ConnId,
        id: String,
        target: kernel::protocol::v8::Target,
        call: kernel::chord::call::ServiceCall,
    },
    /// The kernel queued `message` for the v8 client `conn`; `open_after`
    /// says whether the kernel still served `conn` after that step.
    V8Emitted {
        conn: ConnId,
        message: Arc<v8::V8Message>,
        open_after: bool,
    },
    /// A v8 client read something that did not decode or apply.
    V8Broken { conn: ConnId, problem: String },
    /// A connection was accepted at `at`: its handshake is owed by the deadline.
    Accepted { conn: ConnId, at: Instant },
    /// A connection ended (closed by the kernel, by the client, or by a restart).
    ConnClosed { conn: ConnId },
    /// A runtime received an operation. `immediate` is the outcome it
    /// reported in the same step (a prompt that starts a turn reports later).
    RuntimeOp {
        worker: WorkerId,
        session_id: String,
        op: OpId,
        operation: Operation,
        phase_before: SessionPhase,
        immediate: Option<Result<(), ErrorCode>>,
        /// A storage write failed within that step: the runtime answers what
        /// the failure left unanswered with `internal_error`.
        store_failed: bool,
    },
    /// The kernel sent operation `op` to the worker of `session_id`: it is
    /// in flight for the kernel until it consumes its completion.
    OpSent {
        worker: WorkerId,
        session_id: String,
        op: OpId,
    },
    /// A worker answered operation `op`, which the server on its channel
    /// never gave it (or gave before the worker lost that server): the
    /// answer would complete another server's operation of that number.
    UnaskedAnswer { worker: WorkerId, op: OpId },
    /// The kernel consumed the completion of operation `op` of `worker`.
    OpDoneConsumed {
        worker: WorkerId,
        op: OpId,
        /// The worker's session, as the kernel knew it.
        session_id: Option<String>,
    },
    /// The kernel consumed the exit (or failed spawn) of `worker`.
    WorkerExitConsumed {
        worker: WorkerId,
        /// The worker's session, as the kernel knew it.
        session_id: Option<String>,
    },
    /// The worker of a ready session (idle or busy, not told to dispose)
    /// died; `open_after` are the v1 connections attached to the session
    /// before the kernel learnt it that are still open after: a runtime
    /// error closes them. (A v8 connection stays open and is told its
    /// route is gone.)
    WorkerLost {
        worker: WorkerId,
        session_id: String,
        attached: usize,
        open_after: Vec<ConnId>,
    },
    /// A model call of `worker` failed (a fault); `live` says whether its
    /// stream was still running (a finished call's failure changes
    /// nothing), `phase_after` is the runtime's phase once it took it in.
    ModelFailed {
        worker: WorkerId,
        session_id: String,
        retryable: bool,
        live: bool,
        phase_after: Option<SessionPhase>,
    },
    /// A storage write of `session_id`'s worker failed: the runtime keeps
    /// only what was stored (a reply in flight is dropped).
    StoreFailed { session_id: String },
    /// A model call of `worker` finished its stream; `phase_after` is the
    /// runtime's phase once it took that in, `unanswered` the user items
    /// after the last reply in its transcript then.
    ModelDone {
        worker: WorkerId,
        session_id: String,
        phase_after: Option<SessionPhase>,
        unanswered: usize,
    },
    /// The kernel spawned a worker for `session_id`; `orphan_holds` says
    /// whether an unadopted orphan has that session open, `expected_since`
    /// when this server was told which sessions orphans hold.
    Spawned {
        session_id: String,
        orphan_holds: bool,
        expected_since: Option<Instant>,
    },
    /// The kernel asked the store to delete a session, and it was deleted.
    StoreRemoved { session_id: String },
    /// The kernel told a worker to dispose its session: `phase` is its
    /// runtime's phase then (`None`: not open yet), `queued` the operations
    /// on their way to it, `shutting_down` whether the server is closing.
    DisposeSent {
        worker: WorkerId,
        at: Instant,
        session_id: String,
        phase: Option<SessionPhase>,
        queued: usize,
        shutting_down: bool,
    },
    /// The server process was replaced; every connection and worker is gone.
    ServerRestarted,
    /// The server adopted an orphan holding `session_id` at `at`: idle
    /// disposal waits out the adoption grace. `phase` is the orphan's
    /// runtime's then (a turn that ended while no server ran told nobody).
    Adopted {
        session_id: String,
        at: Instant,
        phase: Option<SessionPhase>,
    },
    /// The server killed `worker`.
    Killed { worker: WorkerId },
    /// An orphan of `session_id` that lost its server at `orphaned_at`
    /// retired at `at`;
    /// `interrupted` says whether its retirement marked an item of a turn
    /// that still ran as interrupted.
    OrphanRetired {
        session_id: String,
        orphaned_at: Instant,
        at: Instant,
        interrupted: bool,
    },
    /// A new server generation starts after a hand-off or a crash that kept
    /// the workers: the old one's deadlines are gone with it, and worker ids
    /// start again (orphans are adopted under new ones).
    NewServer,
    /// The kernel told `conn` the session list `listed` (a `list` response or
    /// a server snapshot) while the store held `stored`, of which `settling`
    /// the kernel cannot know yet (a worker creating it has not reported
    /// ready; a sibling server wrote it and no scan has run since); `removed`
    /// are the sessions the store removed at a kernel's request and does not
    /// hold again.
    Listed {
        conn: ConnId,
        listed: Vec<String>,
        stored: Vec<String>,
        settling: Vec<String>,
        removed: Vec<String>,
    },
}

/// Something worth reaching: the model checker reports which of these its
/// paths reached, and its tests require those each configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Milestone {
    /// A request was answered `busy`.
    Busy,
    /// A request was answered `invalid_request`.
    InvalidRequest,
    /// A request was answered `not_found`.
    NotFound,
    /// A session was removed from the store.
    Removed,
    /// The server closed a connection that did not read (output bound).
    SlowConsumerClosed,
    /// A store write failed.
    StoreFailed,
    /// A graceful replacement took place.
    HandOff,
    /// A new server adopted an orphan.
    OrphanAdopted,
    /// An orphan retired after its grace.
    OrphanRetired,
    /// The server killed a worker (its deadline passed).
    WorkerKilled,
    /// A worker told to dispose hung.
    WorkerHung,
    /// The server asked a worker for the transcript it had let go of.
    TranscriptAskedFor,
    /// A v8 client's replica took a state update.
    V8Replicated,
    /// A v8 session call was fenced (`session_not_attached`).
    V8Fenced,
    /// A session told a notice (an MCP server failed).
    McpNotice,
    /// An MCP tool answered a call.
    McpCalled,
}

impl Milestone {
    /// Every milestone, in order.
    pub const ALL: [Milestone; 16] = [
        Self::Busy,
        Self::InvalidRequest,
        Self::NotFound,
        Self::Removed,
        Self::SlowConsumerClosed,
        Self::StoreFailed,
        Self::HandOff,
        Self::OrphanAdopted,
        Self::OrphanRetired,
        Self::WorkerKilled,
        Self::WorkerHung,
        Self::TranscriptAskedFor,
        Self::V8Replicated,
        Self::V8Fenced,
        Self::McpNotice,
        Self::McpCalled,
    ];
}

/// A set of [`Milestone`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached(u32);

impl Reached {
    /// Adds one.
    pub fn insert(&mut self, milestone: Milestone) {
        self.0 |= 1 << milestone as u32;
    }

    /// Whether it holds one.
    pub fn contains(self, milestone: Milestone) -> bool {
        self.0 & (1 << milestone as u32) != 0
    }

    /// Both sets together.
    pub fn union(self, other: Reached) -> Reached {
        Reached(self.0 | other.0)
    }

    /// The milestones it holds, in order.
    pub fn milestones(self) -> Vec<Milestone> {
        Milestone::ALL
            .into_iter()
            .filter(|m| self.contains(*m))
            .collect()
    }
}

/// The world. See the module documentation. `Clone` is a snapshot: the
/// model checker branches from a state by cloning it.
#[derive(Clone)]
pub struct World {
    /// Virtual now.
    pub now: Instant,
    /// When each orphan lost its server.
    orphaned_at: BTreeMap<WorkerId, Instant>,
    /// Draws [`Options::hang_on_dispose`]'s hangs.
    hang: Option<(crate::prng::Prng, crate::prng::Ratio)>,
    /// Draws [`Options::mcp`]'s faults.
    mcp: Option<(crate::prng::Prng, crate::prng::Ratio)>,
    /// The milestones this run reached (not part of the state: the model
    /// checker unites them over every path, for its coverage report).
    pub reached: Reached,
    /// The real kernel under test.
    pub server: Memo<Server>,
    /// Durable state.
    pub store: Store,
    /// Short names for session ids.
    pub names: Names,
    /// One line per input and output (when [`Options::trace`]).
    pub trace: Vec<String>,
    /// Behaviour of the next workers to open, by session id (`""` = any).
    pub worker_scripts: BTreeMap<String, WorkerScript>,
    /// When set, spawning a worker fails.
    pub fail_spawns: bool,
    options: Options,
    workers: BTreeMap<WorkerId, FakeWorker>,
    clients: BTreeMap<ConnId, Client>,
    /// Clients that may still have a hop pending (not closed, or closed with
    /// bytes or an end of stream still in flight), so that
    /// [`World::deliveries`] does not scan every client that ever connected.
    active: BTreeSet<ConnId>,
    inbox: VecDeque<Input>,
    next_conn: u64,
    generation: u64,
    catalog_pending: Option<u64>,
    /// When the current server was told which sessions orphans hold.
    expected_since: Option<Instant>,
    /// A rescan read from the store and not yet reported to the kernel:
    /// its sequence number, the kernel's scan id, and what it read.
    scan_pending: Option<(u64, u64, Vec<kernel::protocol::SessionMetadata>)>,
    /// Store removals on their way: session → (sequence number, the server
    /// generation that asked).
    removals: BTreeMap<String, (u64, u64)>,
    /// Sessions whose presence in the store the kernel may not know of yet:
    /// created by a worker whose ready it has not taken, changed by a sibling
    /// server, or removed at an earlier server's request, since the last
    /// catalog load or scan.
    unscanned: BTreeSet<String>,
    /// Sessions the store removed at the kernel's request (for the listed
    /// checker: a list must not name one of them that is not stored again).
    removed: BTreeSet<String>,
    /// Interrupted items in the transcript of the runtime a worker host
    /// step began with (for facts about what that step did).
    interrupted_before_step: usize,
    unwritten: BTreeMap<ConnId, usize>,
    /// Connections whose delivered bytes completed several frames at once.
    multi_frame: BTreeSet<ConnId>,
    facts: Vec<Fact>,
    seq: u64,
    kernel_steps: u64,
    shut_down: bool,
    /// Workers no server holds (released by a hand-off, or whose server
    /// died), keyed by an id outside the kernel's range: link and pid.
    orphans: BTreeMap<WorkerId, u64>,
    /// Announcing orphans, by the channel they announced on.
    channels: BTreeMap<ChannelId, WorkerId>,
    /// Announcements on their way to the server ([`Holds::announce`]):
    /// orphan → (sequence number, its hello).
    announcing: BTreeMap<WorkerId, (u64, WorkerFrame)>,
    next_channel: u64,
    /// The server process is gone ([`World::crash_server_keep_workers`]).
    server_down: bool,
    /// While facts are recorded: the operation a worker is being given, and
    /// the outcome it answered within the same step.
    watched_op: Option<WatchedOp>,
}

impl World {
    /// A world with an empty store and a server whose catalog is loaded.
    pub fn new(options: Options) -> Self {
        Self::with_store(options, Store::default())
    }

    /// A world whose server starts on `store` (its catalog is loaded).
    pub fn with_store(options: Options, store: Store) -> Self {
        let server = Memo::new(Server::new(Self::config(&options, 0)));
        let hang = options
            .hang_on_dispose
            .map(|(seed, ratio)| (crate::prng::Prng::new(seed), ratio));
        let mcp = options
            .mcp
            .map(|(seed, ratio)| (crate::prng::Prng::new(seed), ratio));
        let mut world = Self {
            now: Instant(0),
            server,
            store,
            names: Names::default(),
            trace: Vec::new(),
            worker_scripts: BTreeMap::new(),
            fail_spawns: false,
            options,
            workers: BTreeMap::new(),
            clients: BTreeMap::new(),
            active: BTreeSet::new(),
            inbox: VecDeque::new(),
            next_conn: 1,
            generation: 0,
            reached: Reached::default(),
            hang,
            mcp,
            orphaned_at: BTreeMap::new(),
            catalog_pending: None,
            expected_since: None,
            scan_pending: None,
            removals: BTreeMap::new(),
            unscanned: BTreeSet::new(),
            removed: BTreeSet::new(),
            interrupted_before_step: 0,
            unwritten: BTreeMap::new(),
            multi_frame: BTreeSet::new(),
            facts: Vec::new(),
            seq: 0,
            kernel_steps: 0,
            shut_down: false,
            orphans: BTreeMap::new(),
            channels: BTreeMap::new(),
            announcing: BTreeMap::new(),
            next_channel: 1,
            server_down: false,
            watched_op: None,
        };
        world.load_catalog();
        world
    }

    fn config(options: &Options, generation: u64) -> Config {
        Config {
            server_id: SERVER_ID.to_string(),
            token: options.token.clone(),
            seed: options
                .seed
                .wrapping_add(generation.wrapping_mul(0x9e37_79b9)),
            models: options.models.clone(),
            limits: options.limits.clone(),
            idle_exit: None,
            local_token: true,
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The kernel hears what its rescan `scan` read: what a sibling wrote
    /// before the read is now known. The scan covers what is not live: the
    /// kernel keeps its own view of a live session.
    pub(super) fn finish_scan(
        &mut self,
        scan: u64,
        sessions: Vec<kernel::protocol::SessionMetadata>,
    ) {
        let live: BTreeSet<String> = self
            .server
            .live_sessions()
            .into_iter()
            .map(|(id, _, _)| id)
            .collect();
        let read: BTreeSet<&str> = sessions.iter().map(|m| m.id.as_str()).collect();
        // What the scan read is known now; what was created or removed
        // after the read is not.
        let stored = &self.store.sessions;
        self.unscanned.retain(|id| {
            live.contains(id) || read.contains(id.as_str()) != stored.contains_key(id)
        });
        let models = self
            .store
            .models()
            .into_iter()
            .filter(|m| read.contains(m.session_id.as_str()))
            .collect();
        self.push(Input::CatalogScanned {
            scan,
            sessions,
            models,
        });
    }

    /// Feeds the store's catalog to the server.
    pub fn load_catalog(&mut self) {
        self.catalog_pending = None;
        self.scan_pending = None;
        self.unscanned.clear();
        let sessions = self.store.catalog();
        trace!(self, "server catalog loaded ({} sessions)", sessions.len());
        let models = self.store.models();
        self.push(Input::CatalogLoaded { sessions, models });
        self.run();
    }

    fn log(&mut self, line: String) {
        self.trace.push(format!("{} {line}", self.now));
    }

    fn push(&mut self, input: Input) {
        self.inbox.push_back(input);
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn fact(&mut self, fact: Fact) {
        if self.options.record_facts {
            self.facts.push(fact);
        }
    }

    /// Turns fact recording (and the decoding it needs) on or off; the model
    /// checker replays known prefixes with it off.
    pub fn set_record_facts(&mut self, record: bool) {
        self.options.record_facts = record;
    }

    /// The facts recorded since the last call, in order.
    pub fn take_facts(&mut self) -> Vec<Fact> {
        std::mem::take(&mut self.facts)
    }

    /// Number of [`Server::step`] calls so far, across server restarts.
    pub fn kernel_steps(&self) -> u64 {
        self.kernel_steps
    }

    /// The retry and compaction policy every fake worker's runtime runs with.
    pub fn worker_policy() -> kernel::runtime::Policy {
        kernel::runtime::Policy::default()
    }

    /// The limits every fake worker runs with.
    pub fn worker_limits(&self) -> kernel::limits::WorkerLimits {
        self.options.worker_limits.clone()
    }

    /// False for a stored session the kernel cannot know of yet: a worker
    /// creating it has not reported ready, or a sibling wrote it after the
    /// last scan.
    pub fn kernel_can_know(&self, session_id: &str) -> bool {
        !self.unscanned.contains(session_id)
    }

    /// True for an orphan no server has adopted.
    pub fn is_orphan(&self, worker: WorkerId) -> bool {
        self.orphans.contains_key(&worker)
    }

    /// True while the worker's process lives (a hung one included).
    pub fn worker_runs(&self, worker: WorkerId) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.stage != WorkerStage::Dead)
    }

    /// True while no server process runs ([`World::crash_server_keep_workers`]).
    pub fn is_server_down(&self) -> bool {
        self.server_down
    }

    /// True once the server reported its graceful shutdown complete.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// How many times the server was replaced.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Adds a line to the trace (drivers note their faults).
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        trace!(self, "{}", line());
    }

    fn names_session(&mut self, session_id: &str) -> String {
        if self.options.trace {
            self.names.session(session_id)
        } else {
            String::new()
        }
    }

    // ---- the kernel --------------------------------------------------------

    /// Delivers every queued input and carries out every output until quiet.
    pub fn run(&mut self) {
        while let Some(input) = self.inbox.pop_front() {
            self.run_before(&input);
            let disconnected = match &input {
                Input::Disconnected { conn } => Some(*conn),
                _ => None,
            };
            let ambiguous = match &input {
                Input::Received { conn, .. } => {
                    Ambiguous::Conn(self.multi_frame.remove(conn), *conn)
                }
                Input::CatalogLoaded { .. } => Ambiguous::All,
                _ => Ambiguous::None,
            };
            let lost = match &input {
                Input::WorkerExited { worker } if self.options.record_facts => {
                    self.attached_to_ready(*worker)
                }
                _ => None,
            };
            let outputs = self.server.step(self.now, input);
            self.kernel_steps += 1;
            if let Some((worker, session_id, attached)) = lost {
                let open_after = attached
                    .iter()
                    .copied()
                    .filter(|c| {
                        self.server
                            .connection_stage(*c)
                            .is_some_and(|s| s != kernel::server::Stage::Closing)
                    })
                    .collect();
                self.fact(Fact::WorkerLost {
                    worker,
                    session_id,
                    attached: attached.len(),
                    open_after,
                });
            }
            if self.options.record_facts && !self.unscanned.is_empty() {
                // A session whose worker the kernel took as ready is listed.
                for (id, _, state) in self.server.live_sessions() {
                    if matches!(state, WorkerState::Idle | WorkerState::Busy) {
                        self.unscanned.remove(&id);
                    }
                }
            }
            let (decoded, decoded_v8) = self.run_decode(&outputs);
            let ambiguous = self.v8_ambiguous(ambiguous, &outputs, &decoded_v8);
            if self.options.record_facts {
                self.run_record_ops(&outputs);
                self.run_record(&outputs, &decoded, ambiguous);
                self.run_record_v8(&outputs, &decoded_v8);
            }
            if let Some(conn) = disconnected
                && self.server.connection_stage(conn).is_none()
            {
                self.unwritten.remove(&conn);
            }
            for ((output, message), v8) in outputs.into_iter().zip(decoded).zip(decoded_v8) {
                self.carry_out(output, message, v8);
            }
        }
    }

    /// If `worker` runs a ready session (idle or busy), that session and
    /// the connections the kernel has attached to it.
    fn attached_to_ready(&self, worker: WorkerId) -> Option<(WorkerId, String, Vec<ConnId>)> {
        let session_id =
            self.server
                .live_sessions()
                .into_iter()
                .find_map(|(session, w, state)| {
                    let ready = matches!(state, WorkerState::Idle | WorkerState::Busy);
                    (w == worker && ready).then_some(session)
                })?;
        let attached = self
            .clients
            .iter()
            .filter(|(c, client)| {
                client.v8.is_none() && self.server.attachments(**c).contains(&session_id)
            })
            .map(|(c, _)| *c)
            .collect();
        Some((worker, session_id, attached))
    }

    /// The session the kernel runs `worker` for.
    fn session_of_worker(&self, worker: WorkerId) -> Option<String> {
        if !self.options.record_facts {
            return None;
        }
        self.server
            .live_sessions()
            .into_iter()
            .find_map(|(session, w, _)| (w == worker).then_some(session))
    }

    /// Accounting and facts about an input the kernel is about to consume.
    fn run_before(&mut self, input: &Input) {
        match input {
            Input::Written { conn, bytes } => {
                if let Some(unwritten) = self.unwritten.get_mut(conn) {
                    assert!(*unwritten >= *bytes, "{conn}: wrote more than was queued");
                    *unwritten -= bytes;
                }
            }
            Input::Disconnected { conn } => self.fact(Fact::ConnClosed { conn: *conn }),
            Input::FromWorker { worker, message } => {
                if let FromWorker::OpDone { op, .. } = message.as_ref() {
                    let session_id = self.session_of_worker(*worker);
                    self.fact(Fact::OpDoneConsumed {
                        worker: *worker,
                        op: *op,
                        session_id,
                    });
                }
            }
            Input::WorkerExited { worker } | Input::WorkerSpawnFailed { worker, .. } => {
                let session_id = self.session_of_worker(*worker);
                self.fact(Fact::WorkerExitConsumed {
                    worker: *worker,
                    session_id,
                });
            }
            _ => {}
        }
    }

    /// Decodes every frame of a step once (a broadcast shares one frame):
    /// v1 messages, and apart from them those to v8 clients.
    fn run_decode(&mut self, outputs: &[Output]) -> (Vec<Decoded>, Vec<DecodedV8>) {
        let mut last: Option<(&Frame, Arc<ServerMessage>)> = None;
        let mut decoded = Vec::with_capacity(outputs.len());
        let mut decoded_v8 = Vec::with_capacity(outputs.len());
        for output in outputs {
            let Output::Send { conn, frame } = output else {
                decoded.push(None);
                decoded_v8.push(None);
                continue;
            };
            *self.unwritten.entry(*conn).or_insert(0) += frame.len();
            if self.clients.get(conn).is_some_and(|c| c.v8.is_some()) {
                let bytes = frame.bytes();
                let message = v8::V8Message::decode(&bytes[FRAME_HEADER_LEN..]);
                decoded.push(None);
                decoded_v8.push(Some(Arc::new(message)));
                continue;
            }
            decoded_v8.push(None);
            let o = &self.options;
            let needed = o.record_facts || o.keep_received || o.trace;
            if !needed || (o.skip_unchecked && is_unchecked(frame)) {
                decoded.push(None);
                continue;
            }
            let message = match &last {
                Some((previous, message)) if previous.ptr_eq(frame) => message.clone(),
                _ => Arc::new(decode_frame(&frame.bytes())),
            };
            last = Some((frame, message.clone()));
            decoded.push(Some(message));
        }
        (decoded, decoded_v8)
    }

    /// A step that answers a v8 management call or routes a v8 connection
    /// other than the one whose bytes it read may have run a management
    /// call queued behind another at its end (after the messages before
    /// it were sent), which changes other connections' attachments: the
    /// state after the step does not judge its messages.
    fn v8_ambiguous(
        &self,
        ambiguous: Ambiguous,
        outputs: &[Output],
        decoded: &[DecodedV8],
    ) -> Ambiguous {
        let managed = outputs.iter().zip(decoded).any(|(output, message)| {
            let (Output::Send { conn, .. }, Some(message)) = (output, message) else {
                return false;
            };
            if matches!(ambiguous, Ambiguous::Conn(_, c) if c == *conn) {
                return false;
            }
            match message.as_ref() {
                v8::V8Message::Attachment(_) => true,
                v8::V8Message::Response { id, .. } => self
                    .clients
                    .get(conn)
                    .and_then(|c| c.v8.as_deref())
                    .and_then(|v| v.pending.get(id))
                    .is_some_and(v8::Asked::serialised),
                _ => false,
            }
        });
        if managed { Ambiguous::All } else { ambiguous }
    }

    /// Records the operations a step sends, before its messages: an
    /// answer of that step may count on them being in flight.
    fn run_record_ops(&mut self, outputs: &[Output]) {
        for output in outputs {
            if let Output::ToWorker {
                worker,
                message: kernel::worker::ToWorker::Operation { op, .. },
            } = output
                && let Some(w) = self.workers.get(worker)
            {
                let fact = Fact::OpSent {
                    worker: *worker,
                    session_id: w.session_id.clone(),
                    op: *op,
                };
                self.fact(fact);
            }
        }
    }

    /// Records the messages queued for v8 clients.
    fn run_record_v8(&mut self, outputs: &[Output], decoded: &[DecodedV8]) {
        for (output, message) in outputs.iter().zip(decoded) {
            if let (Output::Send { conn, .. }, Some(message)) = (output, message) {
                let open_after = self
                    .server
                    .connection_stage(*conn)
                    .is_some_and(|s| s != kernel::server::Stage::Closing);
                let fact = Fact::V8Emitted {
                    conn: *conn,
                    message: message.clone(),
                    open_after,
                };
                self.fact(fact);
            }
        }
    }

    /// Records what the checkers must know about a step's messages, judged
    /// against the kernel's state right after the step.
    fn run_record(
        &mut self,
        outputs: &[Output],
        decoded: &[Option<Arc<ServerMessage>>],
        ambiguous: Ambiguous,
    ) {
        let mut attachments: BTreeMap<ConnId, Vec<String>> = BTreeMap::new();
        for (output, message) in outputs.iter().zip(decoded) {
            match (output, message) {
                (Output::Send { conn, .. }, Some(message)) => {
                    let attached = attachments
                        .entry(*conn)
                        .or_insert_with(|| self.server.attachments(*conn));
                    let attached_after = session_of(message)
                        .is_some_and(|s| attached.iter().any(|a| a.as_str() == s));
                    let attached_after = match ambiguous {
                        Ambiguous::All => None,
                        Ambiguous::Conn(true, c) if c == *conn => None,
                        _ => Some(attached_after),
                    };
                    let open_after = self
                        .server
                        .connection_stage(*conn)
                        .is_some_and(|s| s != kernel::server::Stage::Closing);
                    let message = message.clone();
                    let conn = *conn;
                    if let Some(listed) = listed_ids(&message) {
                        let stored: Vec<String> = self.store.sessions.keys().cloned().collect();
                        let settling = self.unscanned.iter().cloned().collect();
                        let removed = self
                            .removed
                            .iter()
                            .filter(|id| !self.store.sessions.contains_key(*id))
                            .cloned()
                            .collect();
                        self.fact(Fact::Listed {
                            conn,
                            listed,
                            stored,
                            settling,
                            removed,
                        });
                    }
                    let shutting_down = self.server.is_shutting_down();
                    self.fact(Fact::Emitted {
                        conn,
                        message,
                        attached_after,
                        open_after,
                        shutting_down,
                    });
                }
                (Output::Close { conn, .. }, _) => self.fact(Fact::ConnClosed { conn: *conn }),
                _ => {}
            }
        }
    }

    fn carry_out(&mut self, output: Output, message: Decoded, v8: DecodedV8) {
        match output {
            Output::Send { conn, frame } => self.on_send(conn, frame, message, v8),
            Output::Close { conn, reason } => self.on_close(conn, reason),
            Output::SpawnWorker {
                worker,
                session_id,
                create,
                ..
            } => self.on_spawn(worker, session_id, create.is_some()),
            Output::StartWorker {
                worker,
                create,
                revision_floor,
                ..
            } => {
                let start = WorkerFrame::Start {
                    create: create.map(|c| *c),
                    revision_floor,
                };
                self.host_step(worker, HostInput::Frame(start));
            }
            Output::ToWorker { worker, message } => {
                trace!(self, "{worker} ← {}", summary::to_worker(&message));
                if let kernel::worker::ToWorker::Snapshot = message {
                    self.reached.insert(Milestone::TranscriptAskedFor);
                }

                if self.options.record_facts
                    && matches!(message, kernel::worker::ToWorker::Dispose)
                    && let Some(w) = self.workers.get(&worker)
                    && w.stage != WorkerStage::Dead
                {
                    let queued = w
                        .to_runtime
                        .iter()
                        .filter(|(_, m)| matches!(**m, kernel::worker::ToWorker::Operation { .. }))
                        .count();
                    let fact = Fact::DisposeSent {
                        worker,
                        at: self.now,
                        session_id: w.session_id.clone(),
                        phase: w.runtime().map(kernel::runtime::Runtime::phase),
                        queued,
                        shutting_down: self.server.is_shutting_down(),
                    };
                    self.fact(fact);
                }
                if self.options.holds.to_worker {
                    let seq = self.next_seq();
                    if let Some(w) = self.workers.get_mut(&worker)
                        && w.stage != WorkerStage::Dead
                    {
                        w.to_runtime.push_back((seq, Memo::new(message)));
                    }
                } else {
                    self.worker_receive(worker, message);
                }
            }
            Output::KillWorker { worker } => {
                trace!(self, "server kill {worker}");
                self.reached.insert(Milestone::WorkerKilled);
                if self.options.record_facts {
                    self.fact(Fact::Killed { worker });
                }
                self.exit_worker(worker);
            }
            Output::RemoveSession { session_id } => {
                trace!(
                    self,
                    "server remove {} from store",
                    self.names.session(&session_id)
                );
                if self.options.holds.removal {
                    let seq = self.next_seq();
                    self.removals.insert(session_id, (seq, self.generation));
                } else {
                    self.finish_removal(session_id, self.generation);
                }
            }
            Output::ScanCatalog { scan } => {
                // A scan reads the directory now; the kernel may hear of it later.
                let sessions = self.store.catalog();
                trace!(
                    self,
                    "server scans the catalog ({} sessions)",
                    sessions.len()
                );
                if self.options.holds.scan {
                    self.scan_pending = Some((self.next_seq(), scan, sessions));
                } else {
                    self.finish_scan(scan, sessions);
                }
            }
            Output::StopAccepting => {
                trace!(self, "server stops accepting");
            }
            Output::ShutdownComplete => {
                trace!(self, "server shutdown complete");
                self.shut_down = true;
            }
            Output::AdoptWorker {
                channel, worker, ..
            } => self.on_adopt(channel, worker),
            Output::RejectWorker { channel, reason } => {
                // A refused hello: the worker waits for a start that never
                // comes, until the server's start deadline kills it.
                trace!(self, "server rejects {channel} ({reason})");
                if let Some(key) = self.channels.remove(&channel) {
                    // It stays an orphan: it announces again, and retires after its grace.
                    let answer = WorkerFrame::Rejected { reason };
                    self.host_step(key, HostInput::Announced(Some(answer)));
                }
            }
            Output::ReleaseWorker { worker } => self.orphan(worker),
        }
    }

    // ---- time --------------------------------------------------------------

    /// The earliest pending deadline of the server or a model stream.
    pub fn next_event(&self) -> Option<Instant> {
        let workers = self.workers.values().filter_map(worker_deadline);
        let server = self.server.next_deadline().filter(|_| !self.server_down);
        server.into_iter().chain(workers).min()
    }

    /// Advances virtual time by `d`, delivering every deadline on the way.
    pub fn advance(&mut self, d: Duration) {
        let until = self.now + d;
        while let Some(at) = self.next_event().filter(|at| *at <= until) {
            self.now = self.now.max(at);
            self.fire_due();
        }
        self.now = until;
    }

    /// Jumps to the next deadline and fires it. Returns false when none is pending.
    pub fn advance_to_next(&mut self) -> bool {
        let Some(at) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(at);
        self.fire_due();
        true
    }

    fn fire_due(&mut self) {
        let now = self.now;
        if !self.server_down && self.server.next_deadline().is_some_and(|d| d <= now) {
            self.push(Input::Tick);
            self.run();
        }
        let due: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| worker_deadline(w).is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for worker in due {
            self.fire_worker(worker);
            self.run();
        }
    }

    /// Runs until no deadline is pending (every turn finished), at most `limit`.
    pub fn settle(&mut self, limit: Duration) {
        let until = self.now + limit;
        while let Some(at) = self.next_event().filter(|at| *at <= until) {
            self.now = self.now.max(at);
            self.fire_due();
        }
    }

    /// Folds everything that decides the world's future into `hasher`: the
    /// kernel (its `Debug`), the store, every worker and client with their
    /// queues, time and pending hops — but not the sequence numbers that
    /// order hops, so that equal states reached in different orders match.
    /// The kernel, the store, each worker's host and each queued message
    /// are folded in as the [`Memo`] hash of their text, made once per change.
    /// The kernel's `Debug` leaves out its configuration, which follows from
    /// the options and the server's generation (folded in below).
    pub fn fingerprint(&self, hasher: &mut impl std::hash::Hasher) {
        use std::fmt::Write as _;
        hasher.write_u64(self.server.hash());
        hasher.write_u64(self.store.sessions.hash());
        let mut out = HashWrite(hasher);
        let _ = write!(out, "{:?}", self.now);
        for (id, w) in &self.workers {
            // The whole host: its link, its announcement and what it left
            // out decide what it sends next, as much as its runtime.
            let host = w.host.hash_with(|host, out| {
                let _ = write!(out, "{host:?}");
            });
            let _ = write!(
                out,
                "|{id} {} {:?} {host} {:?} {:?}",
                w.session_id, w.stage, w.stream, w.tools
            );
            for (_, m) in &w.to_runtime {
                out.0.write_u64(m.hash());
            }
            out.0.write(b"|");
            for (_, m) in &w.to_server {
                out.0.write_u64(m.hash());
            }
        }
        for (id, c) in &self.clients {
            let _ = write!(
                out,
                "|{id} {} {} {} {} {} {} {}",
                c.closed,
                c.reading,
                c.said_hello,
                c.ready,
                c.next_request,
                c.eof.is_some(),
                c.unread
            );
            for (_, bytes) in &c.outbox {
                out.0.write(bytes);
            }
            for (_, incoming) in &c.inbox {
                out.0.write_u64(incoming.hash());
            }
            if let Some(v8) = &c.v8 {
                v8.fingerprint(&mut out);
            }
        }
        let announcing: Vec<&WorkerId> = self.announcing.keys().collect();
        let _ = write!(
            out,
            "|{:?} {:?} {announcing:?}",
            self.orphaned_at, self.removed
        );
        let removals: Vec<(&String, u64)> =
            self.removals.iter().map(|(id, (_, g))| (id, *g)).collect();
        let _ = write!(
            out,
            "|{:?} {removals:?} {:?} {} {} {}",
            self.catalog_pending.is_some(),
            self.unwritten,
            self.store.fail_writes,
            self.fail_spawns,
            self.generation
        );
    }

    /// The trace as one string.
    pub fn trace_text(&self) -> String {
        self.trace.join("\n") + "\n"
    }
}

/// A v1 message as decoded for facts, traces and clients (`None`: not decoded).
type Decoded = Option<Arc<ServerMessage>>;
/// A message to a v8 client, decoded.
type DecodedV8 = Option<Arc<v8::V8Message>>;

/// Which connections a kernel step may have run several requests of.
#[derive(Debug, Clone, Copy)]
enum Ambiguous {
    None,
    /// `true` when that connection's delivery completed several frames.
    Conn(bool, ConnId),
    All,
}

/// Decodes one frame the kernel queued (length header included).
fn decode_frame(frame: &[u8]) -> ServerMessage {
    assert!(frame.len() >= FRAME_HEADER_LEN, "a frame has a header");
    let header: [u8; FRAME_HEADER_LEN] = frame[..FRAME_HEADER_LEN].try_into().expect("sized");
    let payload = &frame[FRAME_HEADER_LEN..];
    assert_eq!(
        u32::from_be_bytes(header) as usize,
        payload.len(),
        "frame length header"
    );
    decode_server_message(payload, &CborLimits::default()).expect("the server sends valid messages")
}

/// The session ids of a session list the server sent: a `list` response
/// or a server snapshot.
fn listed_ids(message: &ServerMessage) -> Option<Vec<String>> {
    let sessions = match message {
        ServerMessage::Response(r) => match &r.outcome {
            Ok(CommandResult::List { sessions }) => sessions,
            _ => return None,
        },
        ServerMessage::Event(ServerEvent::ServerSnapshot { snapshot }) => &snapshot.sessions,
        _ => return None,
    };
    Some(sessions.iter().map(|m| m.id.clone()).collect())
}

/// The session a server message is about, if any.
pub fn session_of(message: &ServerMessage) -> Option<&str> {
    match message {
        ServerMessage::Response(r) => match &r.outcome {
            Ok(result) => result_session(result).map(|s| s.id.as_str()),
            Err(_) => None,
        },
        ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => Some(&snapshot.id),
        ServerMessage::Event(ServerEvent::SessionProgress { session_id, .. }) => Some(session_id),
        _ => None,
    }
}

/// The session snapshot a successful response carries, if any.
pub fn result_session(result: &CommandResult) -> Option<&kernel::protocol::SessionSnapshot> {
    result.session()
}

/// The earliest thing a worker's process is waiting for.
fn worker_deadline(w: &FakeWorker) -> Option<Instant> {
    let stream = w.stream.as_ref().and_then(|(_, s)| s.next_deadline());
    let tools = w.tools.values().map(|(at, _)| *at).min();
    let tick = w.host.as_ref().and_then(WorkerHost::next_deadline);
    [stream, tools, tick].into_iter().flatten().min()
}

/// True for frames no checker reads: a server snapshot event. Its CBOR
/// starts with the event's `type` key, so the name appears within the first
/// bytes.
fn is_unchecked(frame: &Frame) -> bool {
    // The first piece holds the envelope of a frame spliced around cached parts.
    let first = &frame.pieces()[0];
    let head = &first[..first.len().min(120)];
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    has(b"server_snapshot")
}

fn is_delta(message: &ServerMessage) -> bool {
    matches!(
        message,
        ServerMessage::Event(ServerEvent::SessionProgress {
            progress: TranscriptProgress::AssistantDelta { .. },
            ..
        })
    )
}

fn is_worker_delta(message: &FromWorker) -> bool {
    matches!(
        message,
        FromWorker::Progress {
            progress: TranscriptProgress::AssistantDelta { .. }
        }
    )
}
