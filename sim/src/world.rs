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
//! connections that ended. The checkers (`crate::checkers`) read them; the
//! world itself judges nothing.

use crate::summary::{self, Names};
use kernel::faux::{self, FauxStream};
use kernel::host::{HostConfig, HostInput, HostOutput, StoreFailure, StoreFailureKind, WorkerHost};
use kernel::ids::{ChannelId, ConnId, OpId, WorkerId};
use kernel::limits::{Limits, WorkerLimits};
use kernel::protocol::worker::WorkerFrame;
use kernel::protocol::{
    ClientHello, ClientMessage, Command, CommandResult, Content, ErrorCode, ModelRef,
    ProtocolError, Request, ServerEvent, ServerMessage, SessionMetadata, SessionPhase,
    TranscriptProgress, decode_server_message, encode_client_message,
};
use kernel::runtime::{ModelEvent, Persist, Policy, Runtime, StoredSession};
use kernel::server::{CloseReason, Config, Frame, Input, Output, Server};
use kernel::time::Instant;
use kernel::wire::CborLimits;
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, FRAME_HEADER_LEN, encode_frame};
use kernel::worker::{FromWorker, Operation, ToWorker, WorkerState};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
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
    /// An exit notice may overtake the worker's messages still in flight (as
    /// in the daemon, where `wait()` and the channel reader are separate tasks).
    pub exit_overtakes: bool,
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
            exit_overtakes: true,
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
    /// Do not decode frames that no checker reads (server snapshots and
    /// assistant deltas, recognised by their first bytes). Needs `trace` and
    /// `keep_received` off. Halves the simulator's own work.
    pub skip_unchecked: bool,
    /// Which hops wait for a delivery.
    pub holds: Holds,
    /// The models offered (the model checker offers one, to keep states small).
    pub models: Vec<kernel::protocol::ModelMetadata>,
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
        }
    }
}

/// The fake durable store: what survives workers and servers.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// Sessions by id.
    pub sessions: BTreeMap<String, StoredSession>,
    /// The model new sessions start with (the most recently selected one).
    pub default_model: Option<ModelRef>,
    /// When set, every write fails.
    pub fail_writes: bool,
    /// Sessions written, created or removed since [`Store::take_dirty`].
    dirty: BTreeSet<String>,
}

impl Store {
    fn apply(&mut self, id: &str, p: &Persist) -> Result<(), String> {
        if self.fail_writes {
            return Err("simulated storage write failure".into());
        }
        let session = self
            .sessions
            .get_mut(id)
            .ok_or("session directory is gone")?;
        session.apply(p);
        self.dirty.insert(id.to_string());
        Ok(())
    }

    fn insert(&mut self, stored: StoredSession) {
        self.dirty.insert(stored.id.clone());
        self.sessions.insert(stored.id.clone(), stored);
    }

    fn remove(&mut self, id: &str) -> Option<StoredSession> {
        self.dirty.insert(id.to_string());
        self.sessions.remove(id)
    }

    /// Marks a session changed (for tests that tamper with the store).
    pub fn touch(&mut self, id: &str) {
        self.dirty.insert(id.to_string());
    }

    /// The sessions changed since the last call, in id order.
    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }

    /// The catalog a server loads at start.
    pub fn catalog(&self) -> Vec<SessionMetadata> {
        self.sessions
            .values()
            .map(|s| SessionMetadata {
                id: s.id.clone(),
                created_at: s.created_at,
                updated_at: Some(s.updated_at),
                parent_session_id: None,
                session_name: s.name.clone(),
                cwd: Some(s.cwd.clone()),
            })
            .collect()
    }
}

/// How a fake worker behaves when it opens its session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WorkerScript {
    /// Open or create normally.
    #[default]
    Normal,
    /// Report this session id instead of the real one.
    WrongId(String),
    /// Fail to open with this error.
    Fail(ErrorCode, String),
    /// Never report ready (for start deadlines).
    Hang,
    /// Say hello with a token other than the one it was spawned with.
    WrongToken,
}

/// Where a fake worker process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkerStage {
    /// Running, has not opened its session yet.
    Booting,
    /// Hangs forever while opening ([`WorkerScript::Hang`]).
    Hung,
    /// Running with its runtime (or about to exit after a failed open).
    Running,
    /// The process is gone; its exit notice is not delivered yet.
    Dead,
}

#[derive(Debug)]
struct FakeWorker {
    session_id: String,
    /// The secret it was spawned with (its hello proves it).
    token: String,
    stage: WorkerStage,
    /// The kernel's worker host, from the boot on.
    host: Option<WorkerHost>,
    /// Set by [`WorkerScript::WrongId`]: the id its ready snapshot names.
    wrong_id: Option<String>,
    stream: Option<(u64, FauxStream)>,
    /// Fake tool runs in flight: tool item id → (due, tool name).
    tools: BTreeMap<String, (Instant, String)>,
    /// Sequence number of the boot (or, once dead, of the death).
    since: u64,
    to_runtime: VecDeque<(u64, ToWorker)>,
    to_server: VecDeque<(u64, FromWorker)>,
}

impl FakeWorker {
    /// The runtime, once the session is open.
    fn runtime(&self) -> Option<&Runtime> {
        self.host.as_ref()?.runtime()
    }
}

/// A message the kernel queued for a client, decoded once.
#[derive(Debug, Clone)]
enum Incoming {
    /// `message` is `None` for frames no checker reads (see [`Options::skip_unchecked`]).
    Frame {
        len: usize,
        message: Option<Rc<ServerMessage>>,
    },
    Close,
}

/// One client: a byte-level peer of the server.
#[derive(Debug)]
pub struct Client {
    /// Every message received, in order (when [`Options::keep_received`]).
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
    unread: usize,
    next_request: u64,
    /// Bytes not yet delivered to the server, in chunks tagged with a sequence number.
    outbox: VecDeque<(u64, Vec<u8>)>,
    /// The client closed its end after the outbox (sequence number).
    eof: Option<u64>,
    /// Frames (and the close) queued by the server and not yet read.
    inbox: VecDeque<(u64, Incoming)>,
    /// Bytes written so far, and the offsets at which whole frames end.
    written: u64,
    frame_ends: VecDeque<u64>,
    /// Bytes delivered to the server so far.
    delivered: u64,
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
        }
    }

    /// Bytes written by the client and not yet delivered to the server.
    pub fn outbox_len(&self) -> usize {
        self.outbox.iter().map(|(_, b)| b.len()).sum()
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
        message: Rc<ServerMessage>,
        attached_after: Option<bool>,
        open_after: bool,
    },
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
    /// The kernel consumed the completion of operation `op` of `worker`.
    OpDoneConsumed { worker: WorkerId, op: OpId },
    /// The kernel consumed the exit (or failed spawn) of `worker`.
    WorkerExitConsumed { worker: WorkerId },
    /// The kernel asked the store to delete a session, and it was deleted.
    StoreRemoved { session_id: String },
    /// The server process was replaced; every connection and worker is gone.
    ServerRestarted,
    /// The kernel told `conn` the session list `listed` (a `list` response or
    /// a server snapshot) while the store held `stored`, of which `settling`
    /// the kernel cannot know yet (a worker creating it has not reported
    /// ready; a sibling server wrote it and no scan has run since).
    Listed {
        conn: ConnId,
        listed: Vec<String>,
        stored: Vec<String>,
        settling: Vec<String>,
    },
}

/// A pending hop, as offered to drivers by [`World::deliveries`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Delivery {
    /// Client bytes (or its end of stream) to the server.
    ToServer(ConnId),
    /// Server frames (or its close) to a reading client.
    ToClient(ConnId),
    /// A spawned worker opens its session.
    Boot(WorkerId),
    /// The next server message to a worker.
    ToWorker(WorkerId),
    /// The next worker message to the server.
    FromWorker(WorkerId),
    /// The server learns that a worker process exited.
    Exit(WorkerId),
    /// The new server's catalog finishes loading.
    Catalog,
    /// A store removal finishes.
    Removal(String),
}

/// How much of a channel one [`World::deliver`] moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Amount {
    /// Everything queued (coalesced client bytes; all frames or messages).
    All,
    /// The first item (the first chunk of client bytes as it was written).
    One,
    /// At most this many client bytes, or this many frames or messages.
    Up(usize),
    /// Worker messages up to and including the first that is not progress.
    Significant,
}

/// The world. See the module documentation.
pub struct World {
    /// Virtual now.
    pub now: Instant,
    /// The real kernel under test.
    pub server: Server,
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
    removals: BTreeMap<String, u64>,
    /// Stored sessions the kernel may not know of yet: created by a worker
    /// whose ready it has not taken, or changed by a sibling server, since
    /// the last catalog load or scan.
    unscanned: BTreeSet<String>,
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
    next_channel: u64,
    /// The server process is gone ([`World::crash_server_keep_workers`]).
    server_down: bool,
    /// While facts are recorded: the operation a worker is being given, and
    /// the outcome it answered within the same step.
    watched_op: Option<WatchedOp>,
}

/// An operation being given to a worker while facts are recorded.
#[derive(Debug)]
struct WatchedOp {
    op: OpId,
    /// The outcome the worker answered within the same step.
    outcome: Option<Result<(), ErrorCode>>,
    /// A storage write failed within that step.
    store_failed: bool,
}

impl World {
    /// A world with an empty store and a server whose catalog is loaded.
    pub fn new(options: Options) -> Self {
        Self::with_store(options, Store::default())
    }

    /// A world whose server starts on `store` (its catalog is loaded).
    pub fn with_store(options: Options, store: Store) -> Self {
        let server = Server::new(Self::config(&options, 0));
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
            catalog_pending: None,
            removals: BTreeMap::new(),
            unscanned: BTreeSet::new(),
            unwritten: BTreeMap::new(),
            multi_frame: BTreeSet::new(),
            facts: Vec::new(),
            seq: 0,
            kernel_steps: 0,
            shut_down: false,
            orphans: BTreeMap::new(),
            channels: BTreeMap::new(),
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
            adoption_grace: std::time::Duration::from_secs(30),
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Feeds the store's catalog to the server.
    pub fn load_catalog(&mut self) {
        self.catalog_pending = None;
        self.unscanned.clear();
        let sessions = self.store.catalog();
        trace!(self, "server catalog loaded ({} sessions)", sessions.len());
        self.push(Input::CatalogLoaded { sessions });
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

    /// True once the server reported its graceful shutdown complete.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// How many times the server was replaced.
    pub fn generation(&self) -> u64 {
        self.generation
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
            let outputs = self.server.step(self.now, input);
            self.kernel_steps += 1;
            if self.options.record_facts && !self.unscanned.is_empty() {
                // A session whose worker the kernel took as ready is listed.
                for (id, _, state) in self.server.live_sessions() {
                    if matches!(state, WorkerState::Idle | WorkerState::Busy) {
                        self.unscanned.remove(&id);
                    }
                }
            }
            let decoded = self.run_decode(&outputs);
            if self.options.record_facts {
                self.run_record(&outputs, &decoded, ambiguous);
            }
            if let Some(conn) = disconnected
                && self.server.connection_stage(conn).is_none()
            {
                self.unwritten.remove(&conn);
            }
            for (output, message) in outputs.into_iter().zip(decoded) {
                self.carry_out(output, message);
            }
        }
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
                    self.fact(Fact::OpDoneConsumed {
                        worker: *worker,
                        op: *op,
                    });
                }
            }
            Input::WorkerExited { worker } | Input::WorkerSpawnFailed { worker, .. } => {
                self.fact(Fact::WorkerExitConsumed { worker: *worker });
            }
            _ => {}
        }
    }

    /// Decodes every frame of a step once (a broadcast shares one frame).
    fn run_decode(&mut self, outputs: &[Output]) -> Vec<Option<Rc<ServerMessage>>> {
        let mut last: Option<(&Frame, Rc<ServerMessage>)> = None;
        let mut decoded = Vec::with_capacity(outputs.len());
        for output in outputs {
            let Output::Send { conn, frame } = output else {
                decoded.push(None);
                continue;
            };
            *self.unwritten.entry(*conn).or_insert(0) += frame.len();
            let o = &self.options;
            let needed = o.record_facts || o.keep_received || o.trace;
            if !needed || (o.skip_unchecked && is_unchecked(frame)) {
                decoded.push(None);
                continue;
            }
            let message = match &last {
                Some((previous, message)) if std::sync::Arc::ptr_eq(previous, frame) => {
                    message.clone()
                }
                _ => Rc::new(decode_frame(frame)),
            };
            last = Some((frame, message.clone()));
            decoded.push(Some(message));
        }
        decoded
    }

    /// Records what the checkers must know about a step's messages, judged
    /// against the kernel's state right after the step.
    fn run_record(
        &mut self,
        outputs: &[Output],
        decoded: &[Option<Rc<ServerMessage>>],
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
                        self.fact(Fact::Listed {
                            conn,
                            listed,
                            stored,
                            settling,
                        });
                    }
                    self.fact(Fact::Emitted {
                        conn,
                        message,
                        attached_after,
                        open_after,
                    });
                }
                (Output::Close { conn, .. }, _) => self.fact(Fact::ConnClosed { conn: *conn }),
                _ => {}
            }
        }
    }

    fn carry_out(&mut self, output: Output, message: Option<Rc<ServerMessage>>) {
        match output {
            Output::Send { conn, frame } => self.on_send(conn, frame.len(), message),
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
                    create,
                    revision_floor,
                };
                self.host_step(worker, HostInput::Frame(start));
            }
            Output::ToWorker { worker, message } => {
                trace!(self, "{worker} ← {}", summary::to_worker(&message));
                if self.options.holds.to_worker {
                    let seq = self.next_seq();
                    if let Some(w) = self.workers.get_mut(&worker)
                        && w.stage != WorkerStage::Dead
                    {
                        w.to_runtime.push_back((seq, message));
                    }
                } else {
                    self.worker_receive(worker, message);
                }
            }
            Output::KillWorker { worker } => {
                trace!(self, "server kill {worker}");
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
                    self.removals.insert(session_id, seq);
                } else {
                    self.finish_removal(session_id);
                }
            }
            Output::ScanCatalog { scan } => {
                // A scan reads the directory at once: what a sibling wrote is now known.
                let sessions = self.store.catalog();
                trace!(
                    self,
                    "server scans the catalog ({} sessions)",
                    sessions.len()
                );
                // The scan covers what is not live: the kernel keeps its own
                // view of a live session.
                let live: BTreeSet<String> = self
                    .server
                    .live_sessions()
                    .into_iter()
                    .map(|(id, _, _)| id)
                    .collect();
                self.unscanned.retain(|id| live.contains(id));
                self.push(Input::CatalogScanned { scan, sessions });
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

    fn on_send(&mut self, conn: ConnId, len: usize, message: Option<Rc<ServerMessage>>) {
        if let Some(message) = &message
            && self.options.trace
            && (!is_delta(message) || self.options.trace_deltas)
        {
            let line = summary::server(&mut self.names, message);
            trace!(self, "{conn} ← {line}");
        }
        let held = self.options.holds.to_client;
        let seq = self.next_seq();
        let Some(client) = self.clients.get_mut(&conn) else {
            return;
        };
        if held {
            if !client.closed {
                client
                    .inbox
                    .push_back((seq, Incoming::Frame { len, message }));
            }
            return;
        }
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

    fn on_close(&mut self, conn: ConnId, reason: CloseReason) {
        trace!(self, "{conn} closed by server ({reason})");
        if self.options.holds.to_client && reason.flushes_first() {
            let seq = self.next_seq();
            if let Some(c) = self.clients.get_mut(&conn).filter(|c| !c.closed) {
                c.inbox.push_back((seq, Incoming::Close));
                return;
            }
        }
        self.client_closed(conn);
        self.push(Input::Disconnected { conn });
    }

    /// The client side of a connection is gone: nothing more is sent or read.
    fn client_closed(&mut self, conn: ConnId) {
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

    // ---- workers -----------------------------------------------------------

    fn on_spawn(&mut self, worker: WorkerId, session_id: String, creating: bool) {
        let short = self.names_session(&session_id);
        let kind = if creating { "create" } else { "open" };
        if self.fail_spawns {
            trace!(self, "server spawn {worker} for {short} ({kind}) fails");
            let error = "simulated spawn failure".to_string();
            self.push(Input::WorkerSpawnFailed { worker, error });
            return;
        }
        trace!(self, "server spawn {worker} for {short} ({kind})");
        let since = self.next_seq();
        let token = format!("token-{}", worker.0);
        let fake = FakeWorker {
            session_id,
            token: token.clone(),
            stage: WorkerStage::Booting,
            host: None,
            wrong_id: None,
            stream: None,
            tools: BTreeMap::new(),
            since,
            to_runtime: VecDeque::new(),
            to_server: VecDeque::new(),
        };
        self.workers.insert(worker, fake);
        self.push(Input::WorkerSpawned { worker, token });
        if !self.options.holds.boot {
            self.boot_worker(worker);
        }
    }

    fn names_session(&mut self, session_id: &str) -> String {
        if self.options.trace {
            self.names.session(session_id)
        } else {
            String::new()
        }
    }

    /// The worker opens (or creates) its session and reports ready, or fails.
    fn boot_worker(&mut self, worker: WorkerId) {
        let Some(w) = self
            .workers
            .get(&worker)
            .filter(|w| w.stage == WorkerStage::Booting)
        else {
            return;
        };
        let session_id = w.session_id.clone();
        let mut token = w.token.clone();
        let script = self
            .worker_scripts
            .get(&session_id)
            .or_else(|| self.worker_scripts.get(""))
            .cloned()
            .unwrap_or_default();
        self.workers.get_mut(&worker).expect("booting").stage = WorkerStage::Running;
        match script {
            WorkerScript::Hang => {
                self.workers.get_mut(&worker).expect("booting").stage = WorkerStage::Hung;
                trace!(self, "{worker} hangs while opening");
            }
            WorkerScript::Fail(code, message) => {
                let error = ProtocolError::new(code, message);
                self.worker_says(worker, FromWorker::Failed { error }, true);
            }
            script => {
                if script == WorkerScript::WrongToken {
                    token.push_str("-forged");
                }
                let config = HostConfig {
                    session_id,
                    token,
                    pid: worker.0,
                    models: self.options.models.clone(),
                    default_model: self.store.default_model.clone(),
                    cwd: Some("/home/sim".into()),
                    policy: Policy::default(),
                    limits: WorkerLimits::default(),
                };
                let (host, hello) = WorkerHost::new(config, self.now);
                let w = self.workers.get_mut(&worker).expect("booting");
                w.host = Some(host);
                if let WorkerScript::WrongId(id) = script {
                    w.wrong_id = Some(id);
                }
                self.apply_host(worker, hello);
            }
        }
    }

    /// The fake store opens a session for `worker`, or says why not.
    fn store_open(&mut self, worker: WorkerId) -> Result<StoredSession, StoreFailure> {
        let session_id = self.workers[&worker].session_id.clone();
        self.check_unlocked(worker, &session_id)?;
        self.store
            .sessions
            .get(&session_id)
            .cloned()
            .ok_or_else(|| {
                let message = format!("Session not found: {session_id}");
                StoreFailure::new(StoreFailureKind::NotFound, message)
            })
    }

    /// The fake store creates a session for `worker`.
    fn store_create(
        &mut self,
        worker: WorkerId,
        stored: StoredSession,
    ) -> Result<StoredSession, StoreFailure> {
        self.check_unlocked(worker, &stored.id)?;
        if self.store.fail_writes {
            let message = "Could not create the session directory (simulated)";
            return Err(StoreFailure::new(StoreFailureKind::Broken, message));
        }
        assert!(
            !self.store.sessions.contains_key(&stored.id),
            "{}: created twice",
            stored.id
        );
        self.store.insert(stored.clone());
        self.unscanned.insert(stored.id.clone());
        Ok(stored)
    }

    /// The session lock: another worker with its session open holds it.
    fn check_unlocked(&self, worker: WorkerId, session_id: &str) -> Result<(), StoreFailure> {
        let locked = self
            .workers
            .iter()
            .any(|(w, f)| *w != worker && f.session_id == session_id && f.runtime().is_some());
        if locked {
            let message = format!("Session is locked by another worker: {session_id}");
            return Err(StoreFailure::new(StoreFailureKind::Locked, message));
        }
        Ok(())
    }

    /// The fake store commits a batch; its failure is a full disk while the
    /// session is there (it survives), and fatal once it is gone.
    fn store_commit(&mut self, worker: WorkerId, batch: &[Persist]) -> Result<(), StoreFailure> {
        let id = self.workers[&worker].session_id.clone();
        for p in batch {
            if let Err(message) = self.store.apply(&id, p) {
                trace!(self, "{worker} storage write failed: {message}");
                if let Some(watched) = self.watched_op.as_mut() {
                    watched.store_failed = true;
                }
                let kind = if self.store.sessions.contains_key(&id) {
                    StoreFailureKind::Full
                } else {
                    StoreFailureKind::Broken
                };
                return Err(StoreFailure::new(kind, message));
            }
        }
        Ok(())
    }

    fn worker_says(&mut self, worker: WorkerId, message: FromWorker, then_exit: bool) {
        if self.options.trace {
            let line = summary::from_worker(&mut self.names, &message);
            trace!(self, "{worker} → {line}");
        }
        self.worker_send(worker, message);
        if then_exit {
            self.exit_worker(worker);
        }
    }

    fn worker_send(&mut self, worker: WorkerId, message: FromWorker) {
        if self.orphans.contains_key(&worker) {
            return; // no server to hear it; the snapshot on adoption carries the state
        }
        if self.options.holds.from_worker {
            let seq = self.next_seq();
            self.workers
                .get_mut(&worker)
                .expect("alive")
                .to_server
                .push_back((seq, message));
        } else {
            self.push(Input::FromWorker {
                worker,
                message: Box::new(message),
            });
        }
    }

    /// A message from the server reaches a worker's host.
    fn worker_receive(&mut self, worker: WorkerId, message: ToWorker) {
        if let ToWorker::Operation { op, operation } = message {
            return self.worker_operation(worker, op, operation);
        }
        self.host_step(worker, HostInput::Frame(WorkerFrame::ToWorker(message)));
    }

    fn worker_operation(&mut self, worker: WorkerId, op: OpId, operation: Operation) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let Some(runtime) = w.runtime() else {
            return;
        };
        let phase_before = runtime.phase();
        let session_id = w.session_id.clone();
        let frame = WorkerFrame::ToWorker(ToWorker::Operation {
            op,
            operation: operation.clone(),
        });
        if !self.options.record_facts {
            return self.host_step(worker, HostInput::Frame(frame));
        }
        self.watched_op = Some(WatchedOp {
            op,
            outcome: None,
            store_failed: false,
        });
        self.host_step(worker, HostInput::Frame(frame));
        let watched = self.watched_op.take().expect("set above");
        self.fact(Fact::RuntimeOp {
            worker,
            session_id,
            op,
            operation,
            phase_before,
            immediate: watched.outcome,
            store_failed: watched.store_failed,
        });
    }

    fn host_step(&mut self, worker: WorkerId, input: HostInput) {
        let now = self.now;
        let Some(host) = self.workers.get_mut(&worker).and_then(|w| w.host.as_mut()) else {
            return;
        };
        let outputs = host.step(now, input);
        self.apply_host(worker, outputs);
    }

    /// Carries out a worker host's outputs; the fake store answers at once,
    /// and what the host says next is carried out too.
    fn apply_host(&mut self, worker: WorkerId, outputs: Vec<HostOutput>) {
        let mut queue = VecDeque::from(outputs);
        while let Some(output) = queue.pop_front() {
            let answer = match output {
                HostOutput::Send(WorkerFrame::FromWorker(mut message)) => {
                    self.worker_sends(worker, &mut message);
                    self.worker_send(worker, message);
                    None
                }
                HostOutput::Send(WorkerFrame::Hello {
                    session_id,
                    token,
                    pid,
                    resume: None,
                    ..
                }) => {
                    // A fresh channel on the worker socket; the server answers
                    // with the worker's start (or refuses it).
                    let channel = ChannelId(self.next_channel);
                    self.next_channel += 1;
                    self.push(Input::WorkerHello {
                        channel,
                        session_id,
                        token,
                        pid,
                    });
                    None
                }
                HostOutput::Send(_) | HostOutput::RecordServer => None,
                HostOutput::OpenStore => Some(HostInput::StoreOpened(self.store_open(worker))),
                HostOutput::CreateStore(stored) => {
                    Some(HostInput::StoreOpened(self.store_create(worker, stored)))
                }
                HostOutput::Commit(batch) => {
                    Some(HostInput::Committed(self.store_commit(worker, &batch)))
                }
                HostOutput::ReloadStore => {
                    let id = &self.workers[&worker].session_id;
                    let stored = self.store.sessions.get(id).cloned().ok_or_else(|| {
                        StoreFailure::new(StoreFailureKind::Broken, "session directory is gone")
                    });
                    Some(HostInput::Reloaded(stored))
                }
                HostOutput::SaveDefaultModel(model) => {
                    self.store.default_model = Some(model);
                    None
                }
                HostOutput::StartModel { call, request } => {
                    let stream = FauxStream::start(&request, self.now, self.options.faux_delay);
                    self.workers.get_mut(&worker).expect("live").stream = Some((call, stream));
                    None
                }
                HostOutput::CancelModel { .. } => {
                    self.workers.get_mut(&worker).expect("live").stream = None;
                    None
                }
                HostOutput::RunTool { id, tool_name, .. } => {
                    let due = self.now + self.options.tool_delay;
                    let w = self.workers.get_mut(&worker).expect("live");
                    w.tools.insert(id, (due, tool_name));
                    None
                }
                HostOutput::CancelTool { id } => {
                    let w = self.workers.get_mut(&worker).expect("live");
                    w.tools.remove(&id);
                    None
                }
                HostOutput::Announce(hello) => self.announce(worker, hello),
                HostOutput::SwitchChannel | HostOutput::DropAnnouncement => None,
                HostOutput::Exit(_) => {
                    match self.orphans.get(&worker) {
                        Some(pid) => trace!(self, "orphan pid {} retires", pid - ORPHAN_BASE),
                        None => trace!(self, "{worker} exits"),
                    }
                    return self.exit_worker(worker);
                }
            };
            if let Some(input) = answer {
                let now = self.now;
                let Some(host) = self.workers.get_mut(&worker).and_then(|w| w.host.as_mut()) else {
                    return;
                };
                queue.extend(host.step(now, input));
            }
        }
    }

    /// What the world notes of a message a worker sends: the trace line, the
    /// outcome of a watched operation, and a scripted wrong id.
    fn worker_sends(&mut self, worker: WorkerId, message: &mut FromWorker) {
        if let FromWorker::Ready { snapshot } = message
            && let Some(id) = self
                .workers
                .get_mut(&worker)
                .and_then(|w| w.wrong_id.take())
        {
            snapshot.id = id;
        }
        if let (Some(watched), FromWorker::OpDone { op, outcome }) =
            (self.watched_op.as_mut(), &*message)
            && watched.op == *op
            && watched.outcome.is_none()
        {
            watched.outcome = Some(outcome.as_ref().map(|_| ()).map_err(|e| e.code));
        }
        let quiet = is_worker_delta(message) && !self.options.trace_deltas;
        if self.options.trace && !quiet {
            let line = summary::from_worker(&mut self.names, message);
            trace!(self, "{worker} → {line}");
        }
    }

    /// The worker process ends: its runtime (and session lock) is gone at
    /// once; the server learns it from the exit notice.
    fn exit_worker(&mut self, worker: WorkerId) {
        if self.orphans.remove(&worker).is_some() {
            self.workers.remove(&worker);
            return;
        }
        if !self.options.holds.exit && !self.options.holds.from_worker {
            if self.workers.remove(&worker).is_some() {
                self.push(Input::WorkerExited { worker });
            }
            return;
        }
        let since = self.next_seq();
        let Some(w) = self
            .workers
            .get_mut(&worker)
            .filter(|w| w.stage != WorkerStage::Dead)
        else {
            return;
        };
        w.stage = WorkerStage::Dead;
        w.host = None;
        w.stream = None;
        w.tools.clear();
        w.to_runtime.clear();
        w.since = since;
        if !self.options.holds.exit && w.to_server.is_empty() {
            self.report_exit(worker);
        }
    }

    /// The server learns that the worker exited; whatever it still had in
    /// flight is lost.
    fn report_exit(&mut self, worker: WorkerId) {
        if self.workers.remove(&worker).is_some() {
            trace!(self, "{worker} exit reported");
            self.push(Input::WorkerExited { worker });
        }
    }

    /// Kills a worker process abruptly (SIGKILL): nothing is flushed beyond what was persisted.
    pub fn crash_worker(&mut self, worker: WorkerId) {
        trace!(self, "{worker} crashes");
        self.exit_worker(worker);
        self.run();
    }

    /// The current model call of a worker fails (the stream stops). A
    /// `retryable` failure makes the runtime retry after a backoff.
    pub fn fail_model(&mut self, worker: WorkerId, retryable: bool) {
        let Some((call, _)) = self.workers.get_mut(&worker).and_then(|w| w.stream.take()) else {
            return;
        };
        trace!(
            self,
            "{worker} model call {call} fails (retryable: {retryable})"
        );
        let message = "simulated model failure".to_string();
        let event = ModelEvent::Failed {
            message,
            retryable,
            retry_after_ms: None,
        };
        self.host_step(worker, HostInput::Model { call, event });
        self.run();
    }

    /// True when the worker has a model call streaming.
    pub fn is_streaming(&self, worker: WorkerId) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.stream.is_some())
    }

    /// Adds a line to the trace (drivers note their faults).
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        trace!(self, "{}", line());
    }

    /// The live worker of a session, if any.
    pub fn worker_of(&self, session_id: &str) -> Option<WorkerId> {
        let mut alive = self
            .workers
            .iter()
            .filter(|(_, w)| w.stage != WorkerStage::Dead);
        alive
            .find(|(_, w)| w.session_id == session_id)
            .map(|(id, _)| *id)
    }

    /// Number of fake worker processes alive.
    pub fn worker_count(&self) -> usize {
        self.workers
            .values()
            .filter(|w| w.stage != WorkerStage::Dead)
            .count()
    }

    /// (session, item) of every reply a live runtime is streaming now.
    pub fn streaming_replies(&self) -> std::collections::BTreeSet<(String, String)> {
        self.workers
            .values()
            .filter(|w| w.stage != WorkerStage::Dead)
            .filter_map(|w| {
                let runtime = w.runtime()?;
                match runtime.state().transcript.last()? {
                    kernel::protocol::TranscriptItem::Assistant(a)
                        if a.status == kernel::protocol::AssistantStatus::Streaming =>
                    {
                        Some((w.session_id.clone(), a.id.clone()))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// Every fake worker the server has not yet seen exit: id, session, stage,
    /// whether its runtime is open and in a turn.
    pub fn workers(&self) -> Vec<(WorkerId, &str, WorkerStage, Option<SessionPhase>)> {
        let phase = |w: &FakeWorker| w.runtime().map(Runtime::phase);
        self.workers
            .iter()
            .map(|(id, w)| (*id, w.session_id.as_str(), w.stage, phase(w)))
            .collect()
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

    /// Delivers what is due in a worker: model events, finished tool runs, a runtime tick.
    fn fire_worker(&mut self, worker: WorkerId) {
        let now = self.now;
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if let Some((call, stream)) = w.stream.as_mut() {
            let call = *call;
            for event in stream.poll(now) {
                self.host_step(worker, HostInput::Model { call, event });
            }
        }
        let done: Vec<(String, String)> = match self.workers.get(&worker) {
            Some(w) => {
                let due = w.tools.iter().filter(|(_, (at, _))| *at <= now);
                due.map(|(id, (_, name))| (id.clone(), name.clone()))
                    .collect()
            }
            None => Vec::new(),
        };
        for (id, tool_name) in done {
            let Some(w) = self.workers.get_mut(&worker) else {
                return;
            };
            w.tools.remove(&id);
            // Fake tools fail, deterministically, on odd item ids.
            let is_error = id.ends_with(['1', '3', '5', '7', '9']);
            let text = format!("fake {tool_name} output for {id}");
            let content = vec![Content::Text { text }];
            let input = HostInput::ToolDone {
                id,
                content,
                details: None,
                is_error,
            };
            self.host_step(worker, input);
        }
        let tick = self
            .workers
            .get(&worker)
            .and_then(|w| w.host.as_ref()?.next_deadline());
        if tick.is_some_and(|d| d <= now) {
            self.host_step(worker, HostInput::Tick);
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

    // ---- clients -----------------------------------------------------------

    /// Opens a connection; returns its id.
    pub fn connect(&mut self) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.clients.insert(conn, Client::new());
        self.active.insert(conn);
        trace!(self, "{conn} connects");
        self.push(Input::Accepted { conn });
        self.run();
        conn
    }

    /// Sends raw bytes.
    pub fn send_bytes(&mut self, conn: ConnId, bytes: Vec<u8>) {
        trace!(self, "{conn} → {} raw bytes", bytes.len());
        self.clients.get_mut(&conn).expect("known client").garbled = true;
        self.write(conn, bytes, false);
    }

    fn write(&mut self, conn: ConnId, bytes: Vec<u8>, frame: bool) {
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
        self.run();
    }

    /// Sends one message.
    pub fn send(&mut self, conn: ConnId, message: &ClientMessage) {
        if self.options.trace {
            let line = summary::client(&mut self.names, message);
            trace!(self, "{conn} → {line}");
        }
        if let ClientMessage::Hello(_) = message {
            self.clients
                .get_mut(&conn)
                .expect("known client")
                .said_hello = true;
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

    // ---- held deliveries -----------------------------------------------------

    /// Every pending hop with the sequence number of its oldest item, in a
    /// fixed order (channel kind, then id).
    pub fn deliveries(&self) -> Vec<(u64, Delivery)> {
        let mut out = Vec::new();
        for conn in &self.active {
            let c = &self.clients[conn];
            if let Some((seq, _)) = c.outbox.front() {
                out.push((*seq, Delivery::ToServer(*conn)));
            } else if let Some(seq) = c.eof {
                out.push((seq, Delivery::ToServer(*conn)));
            }
            let closing = matches!(c.inbox.front(), Some((_, Incoming::Close)));
            if let Some((seq, _)) = c.inbox.front().filter(|_| c.reading || closing) {
                out.push((*seq, Delivery::ToClient(*conn)));
            }
        }
        for (id, w) in &self.workers {
            self.worker_deliveries(*id, w, &mut out);
        }
        if let Some(seq) = self.catalog_pending {
            out.push((seq, Delivery::Catalog));
        }
        for (session, seq) in &self.removals {
            out.push((*seq, Delivery::Removal(session.clone())));
        }
        out
    }

    fn worker_deliveries(&self, id: WorkerId, w: &FakeWorker, out: &mut Vec<(u64, Delivery)>) {
        match w.stage {
            WorkerStage::Booting => out.push((w.since, Delivery::Boot(id))),
            WorkerStage::Running => {
                if let Some((seq, _)) = w.to_runtime.front() {
                    out.push((*seq, Delivery::ToWorker(id)));
                }
            }
            WorkerStage::Hung => {}
            WorkerStage::Dead => {
                if w.to_server.is_empty() || self.options.holds.exit_overtakes {
                    out.push((w.since, Delivery::Exit(id)));
                }
            }
        }
        if let Some((seq, _)) = w.to_server.front() {
            out.push((*seq, Delivery::FromWorker(id)));
        }
    }

    /// Carries out one pending hop (see [`World::deliveries`]). A hop that is
    /// not pending does nothing.
    pub fn deliver(&mut self, delivery: &Delivery, amount: Amount) {
        match delivery {
            Delivery::ToServer(conn) => self.deliver_to_server(*conn, amount),
            Delivery::ToClient(conn) => self.deliver_to_client(*conn, amount),
            Delivery::Boot(worker) => {
                trace!(self, "{worker} boots");
                self.boot_worker(*worker);
            }
            Delivery::ToWorker(worker) => self.deliver_to_worker(*worker),
            Delivery::FromWorker(worker) => self.deliver_from_worker(*worker, amount),
            Delivery::Exit(worker) => {
                let dead = self
                    .workers
                    .get(worker)
                    .is_some_and(|w| w.stage == WorkerStage::Dead);
                if dead {
                    self.report_exit(*worker);
                }
            }
            Delivery::Catalog => {
                if self.catalog_pending.is_some() {
                    self.load_catalog();
                }
            }
            Delivery::Removal(session_id) => {
                if self.removals.remove(session_id).is_some() {
                    self.finish_removal(session_id.clone());
                }
            }
        }
        self.run();
    }

    fn deliver_to_server(&mut self, conn: ConnId, amount: Amount) {
        let Some(c) = self.clients.get_mut(&conn) else {
            return;
        };
        let mut bytes = Vec::new();
        let max = match amount {
            Amount::All => usize::MAX,
            Amount::One | Amount::Significant => c.outbox.front().map_or(0, |(_, b)| b.len()),
            Amount::Up(n) => n.max(1),
        };
        while bytes.len() < max {
            let Some((_, chunk)) = c.outbox.front_mut() else {
                break;
            };
            let take = chunk.len().min(max - bytes.len());
            bytes.extend(chunk.drain(..take));
            if chunk.is_empty() {
                c.outbox.pop_front();
            }
        }
        if !bytes.is_empty() {
            c.delivered += bytes.len() as u64;
            let mut frames = 0;
            while c.frame_ends.front().is_some_and(|end| *end <= c.delivered) {
                c.frame_ends.pop_front();
                frames += 1;
            }
            if frames > 1 {
                self.multi_frame.insert(conn);
            }
            trace!(self, "{conn} ⇒ server {} bytes", bytes.len());
            self.push(Input::Received { conn, bytes });
            return;
        }
        if c.eof.take().is_some() {
            self.active.remove(&conn);
            trace!(self, "{conn} ⇒ server end of stream");
            self.push(Input::Disconnected { conn });
        }
    }

    fn deliver_to_client(&mut self, conn: ConnId, amount: Amount) {
        let count = match amount {
            Amount::All => usize::MAX,
            Amount::One | Amount::Significant => 1,
            Amount::Up(n) => n.max(1),
        };
        let keep = self.options.keep_received;
        let mut written = 0;
        let mut closed = false;
        let Some(c) = self.clients.get_mut(&conn) else {
            return;
        };
        for _ in 0..count {
            let reading = c.reading;
            match c.inbox.front() {
                Some((_, Incoming::Frame { .. })) if reading => {}
                Some((_, Incoming::Close)) => {}
                _ => break,
            }
            match c.inbox.pop_front().expect("checked").1 {
                Incoming::Frame { len, message } => {
                    written += len;
                    if let Some(message) = message {
                        if let ServerMessage::Hello(_) = message.as_ref() {
                            c.ready = true;
                        }
                        if keep {
                            c.received.push(message.as_ref().clone());
                        }
                    }
                }
                Incoming::Close => {
                    closed = true;
                    break;
                }
            }
        }
        if written > 0 {
            self.push(Input::Written {
                conn,
                bytes: written,
            });
        }
        if closed {
            trace!(self, "{conn} sees the server close");
            self.client_closed(conn);
            self.push(Input::Disconnected { conn });
        }
    }

    fn deliver_to_worker(&mut self, worker: WorkerId) {
        let Some(w) = self
            .workers
            .get_mut(&worker)
            .filter(|w| w.stage == WorkerStage::Running)
        else {
            return;
        };
        let Some((_, message)) = w.to_runtime.pop_front() else {
            return;
        };
        trace!(self, "server ⇒ {worker} {}", summary::to_worker(&message));
        self.worker_receive(worker, message);
    }

    fn deliver_from_worker(&mut self, worker: WorkerId, amount: Amount) {
        let count = match amount {
            Amount::All => usize::MAX,
            Amount::One => 1,
            Amount::Up(n) => n.max(1),
            Amount::Significant => usize::MAX,
        };
        for _ in 0..count {
            let Some(w) = self.workers.get_mut(&worker) else {
                return;
            };
            let Some((_, message)) = w.to_server.pop_front() else {
                break;
            };
            let significant = !matches!(message, FromWorker::Progress { .. });
            if self.options.trace && significant {
                let line = summary::from_worker(&mut self.names, &message);
                trace!(self, "{worker} ⇒ server {line}");
            }
            self.push(Input::FromWorker {
                worker,
                message: Box::new(message),
            });
            if significant && amount == Amount::Significant {
                break;
            }
        }
        let drained = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.to_server.is_empty());
        let dead = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.stage == WorkerStage::Dead);
        if drained && dead && !self.options.holds.exit {
            self.report_exit(worker);
        }
    }

    fn finish_removal(&mut self, session_id: String) {
        let result = if self.store.fail_writes {
            Err("simulated storage failure while removing".to_string())
        } else {
            match self.store.remove(&session_id) {
                Some(_) => Ok(()),
                None => Err("no such session directory".to_string()),
            }
        };
        if result.is_ok() {
            self.fact(Fact::StoreRemoved {
                session_id: session_id.clone(),
            });
        }
        self.push(Input::SessionRemoved { session_id, result });
    }

    // ---- server lifecycle --------------------------------------------------

    /// Graceful close of the server.
    pub fn shutdown(&mut self) {
        trace!(self, "server shutdown requested");
        self.push(Input::Shutdown);
        self.run();
    }

    /// The server process dies and a new one starts on the same store. Every
    /// client is disconnected and every worker dies with it.
    pub fn restart_server(&mut self) {
        trace!(self, "server crashes and restarts");
        self.inbox.clear();
        self.workers.clear();
        self.removals.clear();
        self.unwritten.clear();
        let conns: Vec<ConnId> = self.clients.keys().copied().collect();
        for conn in conns {
            if self.options.holds == Holds::none() {
                self.clients.get_mut(&conn).expect("listed").closed = true;
            } else {
                self.client_closed(conn);
            }
        }
        self.fact(Fact::ServerRestarted);
        self.generation += 1;
        self.shut_down = false;
        self.server = Server::new(Self::config(&self.options, self.generation));
        if self.options.holds.catalog {
            self.catalog_pending = Some(self.next_seq());
        } else {
            self.load_catalog();
        }
    }

    /// Folds everything that decides the world's future into `hasher`: the
    /// kernel (its `Debug`), the store, every worker and client with their
    /// queues, time and pending hops — but not the sequence numbers that
    /// order hops, so that equal states reached in different orders match.
    pub fn fingerprint(&self, hasher: &mut impl std::hash::Hasher) {
        use std::fmt::Write as _;
        let mut out = HashWrite(hasher);
        let _ = write!(
            out,
            "{:?}|{:?}|{:?}",
            self.now, self.server, self.store.sessions
        );
        for (id, w) in &self.workers {
            let to_runtime = w.to_runtime.iter().map(|(_, m)| m);
            let to_server = w.to_server.iter().map(|(_, m)| m);
            let _ = write!(
                out,
                "|{id} {} {:?} {:?} {:?} {:?} {:?}",
                w.session_id,
                w.stage,
                w.runtime(),
                w.host.as_ref().map(WorkerHost::is_orphaned),
                w.stream,
                w.tools
            );
            for m in to_runtime {
                let _ = write!(out, " {m:?}");
            }
            for m in to_server {
                let _ = write!(out, " {m:?}");
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
                let _ = write!(out, " {bytes:?}");
            }
            for (_, incoming) in &c.inbox {
                let _ = write!(out, " {incoming:?}");
            }
        }
        let removals: Vec<&String> = self.removals.keys().collect();
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

/// Feeds formatted text straight into a hasher.
struct HashWrite<'a, H>(&'a mut H);

impl<H: std::hash::Hasher> std::fmt::Write for HashWrite<'_, H> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

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
    match result {
        CommandResult::Create { session }
        | CommandResult::Attach { session }
        | CommandResult::Prompt { session }
        | CommandResult::Steer { session }
        | CommandResult::Abort { session }
        | CommandResult::SetModel { session }
        | CommandResult::SetThinking { session } => Some(session),
        CommandResult::List { .. }
        | CommandResult::Detach { .. }
        | CommandResult::Remove { .. } => None,
    }
}

/// The earliest thing a worker's process is waiting for.
fn worker_deadline(w: &FakeWorker) -> Option<Instant> {
    let stream = w.stream.as_ref().and_then(|(_, s)| s.next_deadline());
    let tools = w.tools.values().map(|(at, _)| *at).min();
    let tick = w.host.as_ref().and_then(WorkerHost::next_deadline);
    [stream, tools, tick].into_iter().flatten().min()
}

/// True for frames no checker reads: a server snapshot event or an assistant
/// delta. Their CBOR starts with the event's `type` key, so the name appears
/// within the first bytes (a session id comes before a delta's type).
fn is_unchecked(frame: &[u8]) -> bool {
    let head = &frame[..frame.len().min(120)];
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    has(b"server_snapshot") || has(b"assistant_delta")
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

// ---- the durable server: hand-off, adoption, orphans -------------------------

/// Orphans are keyed above every id a kernel allocates.
const ORPHAN_BASE: u64 = 1 << 40;

impl World {
    /// A new server with this id replaces the current one: the old server
    /// hands its workers over (they keep running as orphans) and exits; the
    /// new one loads its catalog, expects the released sessions, and each
    /// orphan announces itself to it and is adopted (or rejected).
    pub fn replace_server(&mut self) {
        self.replace_server_then(|_| {});
    }

    /// [`World::replace_server`], running `between` after the new server
    /// expects the adoptions and before any orphan announces itself.
    pub fn replace_server_then(&mut self, between: impl FnOnce(&mut World)) {
        trace!(self, "server replacement requested");
        self.push(Input::HandoffRequested);
        self.run();
        self.next_server();
        self.expect_orphans();
        between(self);
        self.announce_orphans();
    }

    /// The server process dies; its workers survive as orphans (no server
    /// runs until [`World::start_server`]). Every client is disconnected.
    pub fn crash_server_keep_workers(&mut self) {
        trace!(self, "server crashes; its workers survive");
        self.inbox.clear();
        self.removals.clear();
        self.unwritten.clear();
        let conns: Vec<ConnId> = self.clients.keys().copied().collect();
        for conn in conns {
            self.client_closed(conn);
        }
        let ids: Vec<WorkerId> = self
            .workers
            .keys()
            .copied()
            .filter(|w| !self.orphans.contains_key(w))
            .collect();
        for worker in ids {
            if self.workers[&worker].runtime().is_some() {
                self.orphan(worker);
            } else {
                trace!(self, "{worker} dies with its server (not open yet)");
                self.workers.remove(&worker);
            }
        }
        self.server_down = true;
        self.shut_down = true;
        self.fail_announcements();
    }

    /// A new server starts (after [`World::crash_server_keep_workers`]);
    /// the orphans announce themselves and are adopted.
    pub fn start_server(&mut self) {
        self.start_server_then(|_| {});
    }

    /// [`World::start_server`], running `between` after the new server read
    /// the session locks and before any orphan announces itself.
    pub fn start_server_then(&mut self, between: impl FnOnce(&mut World)) {
        self.next_server();
        self.expect_orphans();
        between(self);
        self.announce_orphans();
    }

    /// What a starting server learns from the session locks (or, after a
    /// hand-off, from its predecessor): the sessions a live orphan holds will
    /// be announced, so it expects them.
    fn expect_orphans(&mut self) {
        let held: Vec<String> = self
            .orphans
            .keys()
            .filter_map(|o| self.workers.get(o).map(|w| w.session_id.clone()))
            .collect();
        if !held.is_empty() {
            self.push(Input::AdoptionsExpected { sessions: held });
            self.run();
        }
    }

    /// [`World::start_server`], but the catalog finishes loading only after
    /// the orphans announced themselves (a large directory scans slowly).
    pub fn start_server_catalog_late(&mut self) {
        self.new_generation(" (catalog late)");
        self.expect_orphans();
        self.announce_orphans();
        self.load_catalog();
    }

    /// A sibling server sharing the session directory changes the store
    /// (creates, renames or removes sessions); this server's watcher sees it.
    pub fn sibling_changes(&mut self, change: impl FnOnce(&mut Store) -> Vec<String>) {
        let changed = change(&mut self.store);
        trace!(self, "a sibling server changes {} sessions", changed.len());
        self.unscanned.extend(changed);
        self.push(Input::CatalogChanged);
        self.run();
    }

    /// Pids of the orphans, with their sessions.
    pub fn orphans(&self) -> Vec<(u64, String)> {
        self.orphans
            .iter()
            .map(|(o, pid)| (*pid, self.workers[o].session_id.clone()))
            .collect()
    }

    fn next_server(&mut self) {
        self.new_generation("");
        self.load_catalog();
    }

    /// A new server process, its catalog not loaded yet; `note` goes into
    /// the trace line.
    fn new_generation(&mut self, note: &str) {
        self.fail_announcements();
        self.generation += 1;
        self.shut_down = false;
        self.server_down = false;
        self.inbox.clear();
        trace!(self, "server generation {} starts{note}", self.generation);
        self.server = Server::new(Self::config(&self.options, self.generation));
    }

    /// The worker loses its server: it keeps its session (and model stream)
    /// under an orphan key, and its host starts counting the grace.
    fn orphan(&mut self, worker: WorkerId) {
        let Some(mut w) = self.workers.remove(&worker) else {
            return;
        };
        let pid = ORPHAN_BASE + (self.generation << 20) + worker.0;
        let key = WorkerId(pid);
        trace!(self, "{worker} released: orphan pid {}", pid - ORPHAN_BASE);
        // Its first announcement finds no server to adopt it: the old one is
        // leaving (or dead), and the new one does not listen yet.
        let now = self.now;
        let mut outputs = Vec::new();
        if let Some(host) = w.host.as_mut() {
            outputs = host.step(now, HostInput::ChannelLost);
            if outputs.iter().any(|o| matches!(o, HostOutput::Announce(_))) {
                outputs.retain(|o| !matches!(o, HostOutput::Announce(_)));
                outputs.extend(host.step(now, HostInput::Announced(None)));
            }
        }
        self.workers.insert(key, w);
        self.orphans.insert(key, pid);
        self.apply_host(key, outputs);
    }

    /// A new server listens: every orphan announces itself to it now.
    fn announce_orphans(&mut self) {
        let keys: Vec<WorkerId> = self.orphans.keys().copied().collect();
        for key in keys {
            self.host_step(key, HostInput::ServerAppeared);
            self.run();
        }
    }

    /// An orphan's host announces it: the server hears it if one runs;
    /// otherwise the attempt fails at once.
    fn announce(&mut self, key: WorkerId, hello: WorkerFrame) -> Option<HostInput> {
        let failed = Some(HostInput::Announced(None));
        if self.server_down || self.shut_down {
            return failed;
        }
        let (
            Some(&pid),
            WorkerFrame::Hello {
                resume: Some(snapshot),
                ..
            },
        ) = (self.orphans.get(&key), hello)
        else {
            return failed;
        };
        let channel = ChannelId(self.next_channel);
        self.next_channel += 1;
        self.channels.insert(channel, key);
        let session_id = self.workers[&key].session_id.clone();
        let short = self.names_session(&session_id);
        trace!(
            self,
            "orphan pid {} announces {short} on {channel}",
            pid - ORPHAN_BASE
        );
        self.push(Input::WorkerAnnounced {
            channel,
            session_id,
            pid,
            snapshot,
        });
        None
    }

    /// Announcements no server will answer (it died, or a new one started):
    /// they fail, and their orphans announce again later.
    fn fail_announcements(&mut self) {
        let pending = std::mem::take(&mut self.channels);
        for key in pending.into_values() {
            self.host_step(key, HostInput::Announced(None));
        }
    }

    fn on_adopt(&mut self, channel: ChannelId, worker: WorkerId) {
        let Some(key) = self.channels.remove(&channel) else {
            return;
        };
        let Some(pid) = self.orphans.remove(&key) else {
            return;
        };
        let w = self.workers.remove(&key).expect("orphan");
        trace!(
            self,
            "server adopts orphan pid {} as {worker}",
            pid - ORPHAN_BASE
        );
        self.workers.insert(worker, w);
        self.host_step(worker, HostInput::Announced(Some(WorkerFrame::Adopted)));
    }
}
