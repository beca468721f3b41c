//! A small explicit-state model checker: every interleaving of a small
//! configuration, judged by the same checkers as the swarm.
//!
//! # Why our own explorer, and not stateright
//!
//! stateright explores states it can clone, hash and compare: the whole
//! model state must be `Clone + Hash + Eq`. Ours is the real kernel
//! (`kernel::server::Server`) inside the fake world. Both are `Clone` (plain
//! data: a copy is a snapshot), but deriving `Hash + Eq` through the kernel
//! would bind its every type to the checker — and wrapping them in a
//! stateright `Model` any other way means re-modelling the kernel, and
//! checking the model instead of the code.
//!
//! The explorer walks **action sequences** depth-first; a state with several
//! successors is cloned for each but the last. Equal states reached in
//! different orders are merged through a **fingerprint**: a 64-bit hash
//! ([`WordHash`]) of everything that decides the future — the kernel's
//! `Debug` text, the store, every fake worker and client with their queues
//! (without the sequence numbers that merely order them), the checkers' own
//! state (requests owed, running prompts, revisions seen) and the remaining
//! budgets. The large parts (the kernel, the store, each worker's host, each
//! queued message) are hashed once per change and shared, copy on write,
//! between a state and its branches ([`crate::world::Memo`]): the text of
//! what a step did not touch is not hashed again. The world is
//! deterministic, so a counterexample's path replays it exactly, with a
//! trace.
//!
//! The search runs on one thread per CPU (`SIM_THREADS=n` to choose): a
//! thread with nothing to do waits, and a busy one hands it the sibling
//! branches it would explore later. The set of seen fingerprints is shared,
//! so each state is expanded exactly once and the counts (states,
//! transitions, quiescent states) are the same as on one thread; only the
//! deepest path reported may differ.
//!
//! # What is explored
//!
//! A [`Config`] gives every client a budget of actions (attach, detach,
//! prompt, abort, steer, set_model, set_thinking, remove, stop and resume
//! reading, disconnect, reconnect), in any order or in the order listed,
//! plus budgets of faults: worker crashes, server restarts, graceful
//! hand-offs, server crashes that keep the workers, and stretches of failing
//! store writes. At every state the enabled actions are: each client action
//! still in budget; each pending hop of the world (a worker boot, the next
//! server → worker message, the next significant worker → server message
//! with the progress before it, an exit notice); letting time run until
//! something significant happens; a crash of any live worker; each fault in
//! budget; after a new server starts, the orphans seeing it appear (until
//! then clients may attach in the adoption window). Client bytes and server
//! frames are delivered at once (a client's request is atomic with its
//! arrival; the interleavings that matter are between clients, workers,
//! servers and time).
//!
//! After every action the checkers run. At every **quiescent** state
//! (nothing in flight, no deadline pending) [`crate::checkers::pending`]
//! must say the run has settled: the liveness property, checked exhaustively.

use crate::checkers::busy::prompt_text;
use crate::checkers::{self, Checkers};
use crate::prng::WordHash;
use crate::world::{
    Amount, Delivery, Holds, Milestone, Options, Reached, Store, WorkerStage, World,
};
use kernel::ids::{ConnId, WorkerId};
use kernel::protocol::{Command, ThinkingLevel};
use kernel::runtime::StoredSession;
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Something a model client can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClientAction {
    /// Attach to the session.
    Attach,
    /// Detach from it.
    Detach,
    /// Prompt it.
    Prompt,
    /// Abort its turn.
    Abort,
    /// Steer its turn.
    Steer,
    /// Switch the session to the second model.
    SetModel,
    /// Set the thinking level to high.
    SetThinking,
    /// Remove the session.
    Remove,
    /// Stop reading (a slow consumer: the server's output to it queues up).
    StopReading,
    /// Read again.
    ResumeReading,
    /// Close the connection.
    Disconnect,
    /// Open a new connection (when the last one is closed) and say hello.
    Reconnect,
}

/// One transition of the model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Client `client` does `action`.
    Client(usize, ClientAction),
    /// A pending hop of the world.
    Deliver(Delivery),
    /// Time runs until something significant happens.
    Time,
    /// A worker process dies.
    Crash(WorkerId),
    /// The server crashes and restarts (its workers die with it).
    Restart,
    /// A new server replaces the running one; the workers are handed over.
    Handoff,
    /// The server crashes; its workers live on as orphans.
    CrashKeepWorkers,
    /// A new server starts after [`Action::CrashKeepWorkers`]: the orphans
    /// announce themselves (those past their grace have retired).
    StartServer,
    /// Every store write fails from now on.
    StoreFails,
    /// Store writes succeed again.
    StoreHeals,
    /// The orphans see the new server's socket appear and announce
    /// themselves (until then, clients may attach in the adoption window).
    Announce,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Client(client, action) => write!(f, "{client}.{action:?}"),
            Self::Deliver(delivery) => match delivery {
                Delivery::ToServer(c) => write!(f, "to_server.{}", c.0),
                Delivery::ToClient(c) => write!(f, "to_client.{}", c.0),
                Delivery::Boot(w) => write!(f, "boot.{}", w.0),
                Delivery::ToWorker(w) => write!(f, "to_worker.{}", w.0),
                Delivery::FromWorker(w) => write!(f, "from_worker.{}", w.0),
                Delivery::Exit(w) => write!(f, "exit.{}", w.0),
                Delivery::Catalog => write!(f, "catalog"),
                Delivery::Removal(session) => write!(f, "removal.{session}"),
                Delivery::Scan => write!(f, "scan"),
                Delivery::Announcement(w) => write!(f, "announcement.{}", w.0),
            },
            Self::Time => write!(f, "time"),
            Self::Crash(w) => write!(f, "crash.{}", w.0),
            Self::Restart => write!(f, "restart"),
            Self::Handoff => write!(f, "handoff"),
            Self::CrashKeepWorkers => write!(f, "crash_keep_workers"),
            Self::StartServer => write!(f, "start_server"),
            Self::StoreFails => write!(f, "store_fails"),
            Self::StoreHeals => write!(f, "store_heals"),
            Self::Announce => write!(f, "announce"),
        }
    }
}

impl std::str::FromStr for Action {
    type Err = String;

    /// Reads what [`Action`]'s `Display` writes.
    fn from_str(text: &str) -> Result<Self, String> {
        use ClientAction::*;
        let (head, arg) = text.split_once('.').unwrap_or((text, ""));
        let num = || {
            arg.parse::<u64>()
                .map_err(|_| format!("{text}: expected a number after '.'"))
        };
        Ok(match head {
            "time" => Self::Time,
            "restart" => Self::Restart,
            "handoff" => Self::Handoff,
            "crash_keep_workers" => Self::CrashKeepWorkers,
            "start_server" => Self::StartServer,
            "store_fails" => Self::StoreFails,
            "store_heals" => Self::StoreHeals,
            "announce" => Self::Announce,
            "catalog" => Self::Deliver(Delivery::Catalog),
            "scan" => Self::Deliver(Delivery::Scan),
            "removal" => Self::Deliver(Delivery::Removal(arg.to_string())),
            "to_server" => Self::Deliver(Delivery::ToServer(ConnId(num()?))),
            "to_client" => Self::Deliver(Delivery::ToClient(ConnId(num()?))),
            "boot" => Self::Deliver(Delivery::Boot(WorkerId(num()?))),
            "to_worker" => Self::Deliver(Delivery::ToWorker(WorkerId(num()?))),
            "from_worker" => Self::Deliver(Delivery::FromWorker(WorkerId(num()?))),
            "exit" => Self::Deliver(Delivery::Exit(WorkerId(num()?))),
            "announcement" => Self::Deliver(Delivery::Announcement(WorkerId(num()?))),
            "crash" => Self::Crash(WorkerId(num()?)),
            client => {
                let client = client
                    .parse::<usize>()
                    .map_err(|_| format!("{text}: not an action"))?;
                let action = [
                    Attach,
                    Detach,
                    Prompt,
                    Abort,
                    Steer,
                    SetModel,
                    SetThinking,
                    Remove,
                    StopReading,
                    ResumeReading,
                    Disconnect,
                    Reconnect,
                ]
                .into_iter()
                .find(|a| format!("{a:?}") == arg)
                .ok_or_else(|| format!("{text}: not a client action"))?;
                Self::Client(client, action)
            }
        })
    }
}

/// A path as one replayable argument: actions separated by spaces.
pub fn path_text(path: &[Action]) -> String {
    path.iter()
        .map(Action::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads [`path_text`]'s output.
pub fn parse_path(text: &str) -> Result<Vec<Action>, String> {
    text.split_whitespace().map(str::parse).collect()
}

/// What one client may do: every listed action once, in any order or in
/// the order listed. A script in order keeps the state space to the
/// interleavings that matter when the orders of one client's own commands
/// do not (a steer before its prompt is configuration (a)'s business).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Budget {
    /// The actions not taken yet.
    pub actions: Vec<ClientAction>,
    /// Only the first action is enabled.
    pub in_order: bool,
    /// The client speaks protocol v8: its attach, prompt, detach, … are
    /// pi's service calls, and it replicates its session's transcript.
    pub v8: bool,
}

/// A budget whose actions may be taken in any order.
pub fn any_order(actions: Vec<ClientAction>) -> Budget {
    Budget {
        actions,
        in_order: false,
        v8: false,
    }
}

/// A budget whose actions are taken in the order listed.
pub fn in_order(actions: Vec<ClientAction>) -> Budget {
    Budget {
        actions,
        in_order: true,
        v8: false,
    }
}

/// The same budget for a client that speaks protocol v8.
pub fn v8(budget: Budget) -> Budget {
    Budget { v8: true, ..budget }
}

/// A configuration to explore.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name for reports.
    pub name: &'static str,
    /// Each client's budget of actions.
    pub clients: Vec<Budget>,
    /// Worker crashes allowed.
    pub crashes: u32,
    /// Server restarts allowed.
    pub restarts: u32,
    /// Graceful replacements allowed.
    pub handoffs: u32,
    /// Server crashes that keep the workers, each followed by a new server.
    pub orphan_crashes: u32,
    /// Times the store may start failing (it may heal after each).
    pub storage_faults: u32,
    /// The kernel's per-connection output bound (`None`: the default), small
    /// so that a client that stops reading reaches it.
    pub max_output_bytes: Option<usize>,
    /// The server lets go of every transcript once sent
    /// ([`kernel::limits::Limits::kept_transcript_bytes`] 0), so attaches
    /// wait for the worker to send it again.
    pub let_go_of_transcripts: bool,
    /// An exit notice may overtake the worker's messages.
    pub exit_overtakes: bool,
    /// Orphans' announcements travel while the orphans work on.
    pub late_announcements: bool,
    /// An orphan's grace and the pause between its announcements (`None`:
    /// the defaults, 30 s and 200 ms, in which a refused orphan announces
    /// itself 150 times).
    pub orphan_timing: Option<(Duration, Duration)>,
    /// The milestones this configuration exists to reach: its test fails
    /// when some path does not reach each of them.
    pub reaches: Vec<Milestone>,
    /// Longest action sequence explored (deeper states are counted as truncated).
    pub depth_max: usize,
}

/// What an exploration found.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Distinct states (by fingerprint).
    pub states: u64,
    /// Transitions taken (including those into known states).
    pub transitions: u64,
    /// Quiescent states checked for liveness.
    pub quiescent: u64,
    /// Deepest action sequence.
    pub depth: usize,
    /// States not expanded because of `depth_max`.
    pub truncated: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// The milestones some path reached.
    pub reached: Reached,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} transitions, {} quiescent, depth {}, {} truncated, {:.2}s; reached {:?}",
            self.states,
            self.transitions,
            self.quiescent,
            self.depth,
            self.truncated,
            self.elapsed.as_secs_f64(),
            self.reached.milestones()
        )
    }
}

/// A property broken on some path.
#[derive(Debug, Clone)]
pub struct Counterexample {
    /// The actions from the initial state.
    pub path: Vec<Action>,
    /// What broke.
    pub message: String,
    /// The replayed trace.
    pub trace: String,
}

/// One state: the world, its checkers, and the remaining budgets.
#[derive(Clone)]
pub struct Model {
    /// The world.
    pub world: World,
    /// The checkers.
    pub checkers: Checkers,
    /// The session all clients act on.
    pub session_id: String,
    conns: Vec<ConnId>,
    budgets: Vec<Budget>,
    crashes: u32,
    restarts: u32,
    handoffs: u32,
    orphan_crashes: u32,
    storage_faults: u32,
    /// A new server started and the orphans have not seen it appear yet.
    announce_due: bool,
}

impl Model {
    /// The initial state: a stored session that is not live, and every
    /// client connected and past its handshake.
    pub fn new(config: &Config, trace: bool) -> Self {
        let holds = Holds {
            boot: true,
            to_worker: true,
            from_worker: true,
            exit: true,
            exit_overtakes: config.exit_overtakes,
            announce: config.late_announcements,
            ..Holds::none()
        };
        let options = Options {
            trace,
            keep_received: false,
            record_facts: true,
            skip_unchecked: !trace,
            holds,
            models: kernel::faux::models().into_iter().take(2).collect(),
            worker_limits: {
                let mut limits = kernel::limits::WorkerLimits::default();
                if let Some((grace, retry)) = config.orphan_timing {
                    limits.orphan_grace = grace;
                    limits.announce_retry = retry;
                }
                limits
            },
            // A small output bound comes with the largest frame it can hold.
            limits: {
                let mut limits = match config.max_output_bytes {
                    Some(bytes) => kernel::limits::Limits {
                        max_output_bytes_per_connection: bytes,
                        max_frame_len: (bytes - 4) as u32,
                        ..kernel::limits::Limits::default()
                    },
                    None => kernel::limits::Limits::default(),
                };
                if config.let_go_of_transcripts {
                    limits.kept_transcript_bytes = 0;
                }
                limits
            },
            ..Options::default()
        };
        let session_id = SESSION_ID.to_string();
        let mut world = World::with_store(options, stored_session(&session_id));
        let conns = config
            .clients
            .iter()
            .map(|budget| connect(&mut world, budget.v8))
            .collect();
        let mut checkers = Checkers::new();
        let setup = checkers.observe(&mut world);
        setup.expect("the setup breaks nothing");
        Self {
            world,
            checkers,
            session_id,
            conns,
            budgets: config.clients.clone(),
            crashes: config.crashes,
            restarts: config.restarts,
            handoffs: config.handoffs,
            orphan_crashes: config.orphan_crashes,
            storage_faults: config.storage_faults,
            announce_due: false,
        }
    }

    /// The actions enabled here, in a fixed order.
    pub fn enabled(&self) -> Vec<Action> {
        let mut out = Vec::new();
        let down = self.world.is_server_down();
        for (client, budget) in self.budgets.iter().enumerate() {
            if down {
                break;
            }
            let state = self.world.client(self.conns[client]);
            let distinct: BTreeSet<ClientAction> = match budget.in_order {
                true => budget.actions.iter().take(1).copied().collect(),
                false => budget.actions.iter().copied().collect(),
            };
            for action in distinct {
                let enabled = match action {
                    ClientAction::Reconnect => state.closed,
                    ClientAction::StopReading => !state.closed && state.reading,
                    ClientAction::ResumeReading => !state.closed && !state.reading,
                    _ => !state.closed,
                };
                if enabled {
                    out.push(Action::Client(client, action));
                }
            }
        }
        let deliveries = self.world.deliveries();
        out.extend(deliveries.into_iter().map(|(_, d)| Action::Deliver(d)));
        if self.world.next_event().is_some() {
            out.push(Action::Time);
        }
        if self.crashes > 0 {
            for (worker, _, stage, _) in self.world.workers() {
                if stage != WorkerStage::Dead {
                    out.push(Action::Crash(worker));
                }
            }
        }
        if down {
            out.push(Action::StartServer);
        } else {
            if self.announce_due {
                out.push(Action::Announce);
            }
            if self.restarts > 0 {
                out.push(Action::Restart);
            }
            if self.handoffs > 0 && !self.world.is_shut_down() {
                out.push(Action::Handoff);
            }
            if self.orphan_crashes > 0 {
                out.push(Action::CrashKeepWorkers);
            }
        }
        if self.world.store.fail_writes {
            out.push(Action::StoreHeals);
        } else if self.storage_faults > 0 {
            out.push(Action::StoreFails);
        }
        out
    }

    /// Takes one action, then runs the checkers. A panic (the kernel's or
    /// the world's) is a violation like any other, with its message.
    pub fn apply(&mut self, action: &Action) -> Result<(), String> {
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.act(action);
            self.checkers.observe(&mut self.world)
        }));
        match step {
            Ok(result) => result.map_err(|v| v.to_string()),
            Err(payload) => Err(format!("[panic] {}", panic_text(payload.as_ref()))),
        }
    }

    fn act(&mut self, action: &Action) {
        match action {
            Action::Client(client, what) => self.client(*client, *what),
            Action::Deliver(delivery) => self.world.deliver(delivery, Amount::Significant),
            Action::Time => time(&mut self.world),
            Action::Crash(worker) => {
                self.crashes -= 1;
                self.world.crash_worker(*worker);
            }
            Action::Restart => {
                self.restarts -= 1;
                self.world.restart_server();
            }
            Action::Handoff => {
                self.handoffs -= 1;
                self.world.replace_server_quietly();
                self.announce_due = true;
            }
            Action::CrashKeepWorkers => {
                self.orphan_crashes -= 1;
                self.world.crash_server_keep_workers();
            }
            Action::StartServer => {
                self.world.start_server_quietly();
                self.announce_due = true;
            }
            Action::Announce => {
                self.announce_due = false;
                self.world.announce_orphans();
            }
            Action::StoreFails => {
                self.storage_faults -= 1;
                self.world.store.fail_writes = true;
            }
            Action::StoreHeals => self.world.store.fail_writes = false,
        }
    }

    fn client(&mut self, client: usize, action: ClientAction) {
        let budget = &mut self.budgets[client].actions;
        let index = budget.iter().position(|a| *a == action).expect("enabled");
        budget.remove(index);
        let conn = self.conns[client];
        let session_id = self.session_id.clone();
        if self.budgets[client].v8 {
            return self.v8_client(client, action);
        }
        let command = match action {
            ClientAction::Attach => Command::Attach { session_id },
            ClientAction::Detach => Command::Detach { session_id },
            ClientAction::Prompt => {
                let text = prompt_text(conn, &self.world.next_request_id(conn), false);
                Command::Prompt { session_id, text }
            }
            ClientAction::Abort => Command::Abort { session_id },
            ClientAction::Steer => {
                let text = format!("steer {conn}#{}", self.world.next_request_id(conn));
                Command::Steer { session_id, text }
            }
            ClientAction::SetModel => Command::SetModel {
                session_id,
                model: second_model(),
            },
            ClientAction::SetThinking => Command::SetThinking {
                session_id,
                thinking_level: ThinkingLevel::High,
            },
            ClientAction::Remove => Command::Remove { session_id },
            ClientAction::StopReading => return self.world.set_reading(conn, false),
            ClientAction::ResumeReading => return self.world.set_reading(conn, true),
            ClientAction::Disconnect => return self.world.disconnect(conn),
            ClientAction::Reconnect => {
                self.conns[client] = self.world.connect_ready();
                return;
            }
        };
        self.world.request(conn, command);
    }

    /// What a v8 client's action sends.
    fn v8_client(&mut self, client: usize, action: ClientAction) {
        use crate::world::v8::{AGENT, MANAGEMENT, MODELS, prompt_request};
        use kernel::wire::Value;
        let conn = self.conns[client];
        let session = Value::text(&self.session_id);
        let w = &mut self.world;
        match action {
            ClientAction::Attach => {
                w.v8_server_call(conn, MANAGEMENT, "attach", vec![session]);
            }
            ClientAction::Detach => {
                w.v8_server_call(conn, MANAGEMENT, "detach", vec![]);
            }
            ClientAction::Remove => {
                w.v8_server_call(conn, MANAGEMENT, "remove", vec![session]);
            }
            ClientAction::Prompt => {
                let text = prompt_text(conn, &w.next_request_id(conn), false);
                w.v8_session_call(conn, AGENT, "prompt", vec![prompt_request(&text)]);
            }
            ClientAction::Steer => {
                let text = format!("steer {conn}#{}", w.next_request_id(conn));
                w.v8_session_call(conn, AGENT, "steer", vec![prompt_request(&text)]);
            }
            ClientAction::Abort => {
                w.v8_session_call(conn, AGENT, "abort", vec![]);
            }
            ClientAction::SetModel => {
                let model = second_model();
                let args = vec![Value::Map(vec![
                    ("provider".into(), Value::text(model.provider)),
                    ("modelId".into(), Value::text(model.id)),
                ])];
                w.v8_session_call(conn, MODELS, "select", args);
            }
            ClientAction::SetThinking => {
                let args = vec![Value::text(ThinkingLevel::High.as_str())];
                w.v8_session_call(conn, MODELS, "selectThinking", args);
            }
            ClientAction::StopReading => w.set_reading(conn, false),
            ClientAction::ResumeReading => w.set_reading(conn, true),
            ClientAction::Disconnect => w.disconnect(conn),
            ClientAction::Reconnect => self.conns[client] = connect(w, true),
        }
    }

    /// True when nothing is in flight, no deadline is pending and no fault
    /// is still to end: a server that is down is always followed by a new
    /// one, failing store writes heal, and a client that stopped reading
    /// reads again.
    pub fn is_quiescent(&self) -> bool {
        self.world.deliveries().is_empty()
            && self.world.next_event().is_none()
            && !self.world.is_server_down()
            && !self.announce_due
            && !self.world.store.fail_writes
            && self.conns.iter().all(|&conn| {
                let client = self.world.client(conn);
                client.closed || client.reading
            })
    }

    /// The fingerprint of this state (see the module documentation).
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = WordHash::default();
        self.world.fingerprint(&mut hasher);
        self.checkers.fingerprint(&mut hasher);
        self.budgets.hash(&mut hasher);
        self.conns.hash(&mut hasher);
        (
            self.crashes,
            self.restarts,
            self.handoffs,
            self.orphan_crashes,
            self.storage_faults,
            self.announce_due,
        )
            .hash(&mut hasher);
        hasher.finish()
    }
}

/// A client past its handshake: a v1 one, or a v8 one that subscribes to
/// its session's transcript whenever it is told a new route.
fn connect(world: &mut World, v8: bool) -> ConnId {
    if !v8 {
        return world.connect_ready();
    }
    let conn = world.connect_v8_silent();
    world.set_v8_auto_subscribe(conn, vec![crate::world::v8::TRANSCRIPT]);
    world.v8_hello(conn);
    conn
}

/// The session every model starts with (stored, not live).
pub const SESSION_ID: &str = "00000000-0000-4000-8000-00000000cafe";

/// The model [`ClientAction::SetModel`] switches to: the second one offered.
fn second_model() -> kernel::protocol::ModelRef {
    let model = &kernel::faux::models()[1];
    kernel::protocol::ModelRef {
        provider: model.provider.clone(),
        id: model.id.clone(),
    }
}

/// A store holding one empty session.
fn stored_session(session_id: &str) -> Store {
    let stored = StoredSession {
        id: session_id.to_string(),
        name: None,
        cwd: "/work".to_string(),
        created_at: 0,
        updated_at: 0,
        model: kernel::faux::default_model(),
        thinking_level: ThinkingLevel::Off,
        revision: 1,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        summary: None,
        approvals: Default::default(),
    };
    let mut store = Store::default();
    store.sessions.insert(session_id.to_string(), stored);
    store
}

/// Runs the clock until a deadline does something significant: the kernel
/// steps (a tick) or a worker has a message other than progress to send.
fn time(world: &mut World) {
    let significant = |w: &World| (w.kernel_steps(), w.deliveries().len());
    let before = significant(world);
    while world.advance_to_next() {
        if significant(world) != before {
            break;
        }
    }
}

/// What a caught panic said.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    match LAST_PANIC.with(|last| last.borrow_mut().take()) {
        Some(location) => format!("{message} at {location}"),
        None => message.to_string(),
    }
}

thread_local! {
    /// Where the last panic on this thread happened (kept by the explorer's hook).
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// While it lives, panics are kept for [`panic_text`] instead of printed:
/// the explorer reports them with their path.
struct QuietPanics(Option<PanicHook>);

/// A panic hook, as `std::panic::take_hook` returns it.
type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send>;

impl QuietPanics {
    fn install() -> Self {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(|info| {
            let location = info.location().map(ToString::to_string);
            LAST_PANIC.with(|last| *last.borrow_mut() = location);
        }));
        Self(Some(previous))
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        // A panicking thread may not touch the hook; the process is ending then.
        if let Some(previous) = self.0.take().filter(|_| !std::thread::panicking()) {
            std::panic::set_hook(previous);
        }
    }
}

/// Replays `path` from the initial state, checking every step.
pub fn replay(config: &Config, path: &[Action], trace: bool) -> (Model, Result<(), String>) {
    let mut model = Model::new(config, trace);
    for action in path {
        if let Err(message) = model.apply(action) {
            return (model, Err(message));
        }
    }
    (model, Ok(()))
}

/// Explores every interleaving of `config` depth-first. Returns the
/// statistics, or a counterexample: the shortest path to a violation
/// (searched breadth-first once depth-first search found one), with its
/// replayed trace.
pub fn explore(config: &Config) -> Result<Stats, Box<Counterexample>> {
    explore_with(config, &mut |_| {})
}

/// [`explore`], calling `progress` with the statistics so far every
/// [`PROGRESS_EVERY`] states.
pub fn explore_with(
    config: &Config,
    progress: &mut dyn FnMut(&Stats),
) -> Result<Stats, Box<Counterexample>> {
    let started = Instant::now();
    let _quiet = QuietPanics::install();
    let root = Model::new(config, false);
    let shared = Shared::new(config, threads());
    shared.seen(root.fingerprint());
    shared.states.store(1, Ordering::Relaxed);
    shared
        .pool
        .lock()
        .expect("pool")
        .items
        .push((root, Vec::new()));
    let mut totals = empty_stats();
    totals.states = 1;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..shared.threads)
            .map(|_| scope.spawn(|| shared.work()))
            .collect();
        // This thread reports progress while the workers explore.
        let mut reported = 0;
        while !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let states = shared.states.load(Ordering::Relaxed);
            if states / PROGRESS_EVERY > reported {
                reported = states / PROGRESS_EVERY;
                let mut stats = empty_stats();
                stats.states = states;
                stats.elapsed = started.elapsed();
                progress(&stats);
            }
        }
        for worker in workers {
            let stats = worker.join().expect("explorer threads catch panics");
            totals.transitions += stats.transitions;
            totals.quiescent += stats.quiescent;
            totals.depth = totals.depth.max(stats.depth);
            totals.truncated += stats.truncated;
            totals.reached = totals.reached.union(stats.reached);
        }
    });
    if let Some(found) = shared.found.into_inner().expect("found") {
        let (path, message) = shortest(config, found.0.len()).unwrap_or(found);
        let (model, _) = replay(config, &path, true);
        return Err(Box::new(Counterexample {
            path,
            message,
            trace: model.world.trace_text(),
        }));
    }
    totals.states = shared.states.load(Ordering::Relaxed);
    totals.elapsed = started.elapsed();
    Ok(totals)
}

/// Explorer threads: `SIM_THREADS`, or one per CPU.
fn threads() -> usize {
    std::env::var("SIM_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A violation reached in fewer than `than` actions, if any, by a
/// breadth-first search (queued states are kept as paths and replayed).
fn shortest(config: &Config, than: usize) -> Option<Found> {
    let root = Model::new(config, false);
    let mut seen = BTreeSet::from([root.fingerprint()]);
    let mut queue = std::collections::VecDeque::from([Vec::<Action>::new()]);
    while let Some(path) = queue.pop_front() {
        if path.len() + 1 >= than {
            continue;
        }
        let (model, _) = replay(config, &path, false);
        for action in model.enabled() {
            let mut next = model.clone();
            let mut longer = path.clone();
            longer.push(action.clone());
            if let Err(message) = next.apply(&action) {
                return Some((longer, message));
            }
            if seen.insert(next.fingerprint()) {
                if let Some(message) = unsettled(&next) {
                    return Some((longer, message));
                }
                queue.push_back(longer);
            }
        }
    }
    None
}

/// The liveness verdict of a quiescent state.
fn unsettled(model: &Model) -> Option<String> {
    if !model.is_quiescent() {
        return None;
    }
    checkers::pending(&model.world, &model.checkers)
        .map(|reason| format!("[liveness] not settled: {reason}"))
}

fn empty_stats() -> Stats {
    Stats {
        states: 0,
        transitions: 0,
        quiescent: 0,
        depth: 0,
        truncated: 0,
        elapsed: Duration::ZERO,
        reached: Reached::default(),
    }
}

/// States between two calls of [`explore_with`]'s `progress` (which is
/// given the states found and the time taken so far).
pub const PROGRESS_EVERY: u64 = 1 << 16;

type Found = (Vec<Action>, String);

/// A state to explore, with the path that reached it.
type Work = (Model, Vec<Action>);

/// What the explorer threads share. Each runs a depth-first search; a
/// thread with nothing to do waits on the pool, and a busy thread hands it
/// the sibling branches it would explore later. Seen states are one set
/// for all (in shards), so every state is expanded once, by whichever
/// thread reaches it first: the counts are the same as with one thread.
struct Shared<'a> {
    config: &'a Config,
    threads: usize,
    seen: Vec<Mutex<HashSet<u64, BuildHasherDefault<Identity>>>>,
    pool: Mutex<Pool>,
    wake: Condvar,
    /// Threads waiting for work (a copy of `Pool::idle`, read without the lock).
    hungry: AtomicUsize,
    /// Set on a violation, or when every thread is idle and the pool empty.
    stop: AtomicBool,
    found: Mutex<Option<Found>>,
    /// Distinct states so far.
    states: AtomicU64,
}

#[derive(Default)]
struct Pool {
    items: Vec<Work>,
    idle: usize,
}

/// Fingerprints are hashes already.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 fingerprints are hashed")
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl<'a> Shared<'a> {
    fn new(config: &'a Config, threads: usize) -> Self {
        Self {
            config,
            threads,
            seen: (0..64).map(|_| Mutex::default()).collect(),
            pool: Mutex::default(),
            wake: Condvar::new(),
            hungry: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            found: Mutex::new(None),
            states: AtomicU64::new(0),
        }
    }

    /// True when `fingerprint` is new.
    fn seen(&self, fingerprint: u64) -> bool {
        let shard = (fingerprint >> 58) as usize;
        self.seen[shard].lock().expect("seen").insert(fingerprint)
    }

    /// One explorer thread: takes work from the pool until all is done.
    fn work(&self) -> Stats {
        let mut stats = empty_stats();
        while let Some((model, mut path)) = self.take() {
            if let Err(found) = self.visit(&mut stats, model, &mut path) {
                self.found.lock().expect("found").get_or_insert(found);
                self.stop.store(true, Ordering::Relaxed);
                let _pool = self.pool.lock().expect("pool");
                self.wake.notify_all();
            }
        }
        stats
    }

    /// The next state to explore; `None` when the exploration is over.
    fn take(&self) -> Option<Work> {
        let mut pool = self.pool.lock().expect("pool");
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(work) = pool.items.pop() {
                return Some(work);
            }
            pool.idle += 1;
            if pool.idle == self.threads {
                // Nobody explores, and nothing is left: done.
                self.stop.store(true, Ordering::Relaxed);
                self.wake.notify_all();
                return None;
            }
            self.hungry.store(pool.idle, Ordering::Relaxed);
            pool = self.wake.wait(pool).expect("pool");
            pool.idle -= 1;
            self.hungry.store(pool.idle, Ordering::Relaxed);
        }
    }

    /// Hands `work` to an idle thread.
    fn give(&self, work: Work) {
        let mut pool = self.pool.lock().expect("pool");
        pool.items.push(work);
        self.wake.notify_one();
    }

    /// Checks `model` (reached by `path`) and explores its successors.
    fn visit(&self, stats: &mut Stats, model: Model, path: &mut Vec<Action>) -> Result<(), Found> {
        if self.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        stats.depth = stats.depth.max(path.len());
        if model.is_quiescent() {
            stats.quiescent += 1;
            if let Some(message) = unsettled(&model) {
                return Err((path.clone(), message));
            }
        }
        if path.len() >= self.config.depth_max {
            stats.truncated += 1;
            return Ok(());
        }
        let actions = model.enabled();
        let mut current = Some(model);
        for (index, action) in actions.iter().enumerate() {
            // The last successor takes this state; the others branch from a copy.
            let last = index + 1 == actions.len();
            let mut next = if last {
                current.take().expect("kept for the last action")
            } else {
                current.as_ref().expect("kept for the last action").clone()
            };
            stats.transitions += 1;
            path.push(action.clone());
            if let Err(message) = next.apply(action) {
                return Err((path.clone(), message));
            }
            if self.seen(next.fingerprint()) {
                self.states.fetch_add(1, Ordering::Relaxed);
                stats.reached = stats.reached.union(next.world.reached);
                if !last && self.hungry.load(Ordering::Relaxed) > 0 {
                    self.give((next, path.clone()));
                } else {
                    self.visit(stats, next, path)?;
                }
            }
            path.pop();
        }
        Ok(())
    }
}

/// Configuration (a): two clients and one session. One client may attach,
/// prompt, abort and disconnect, the other attach and detach — each once, in
/// every interleaving with the worker's boot, messages and exit and with
/// time. The server lets go of every transcript once sent, so an attach
/// waits for the worker to send it again. (157,052 states; 101,017 when the
/// server kept the transcript.)
pub fn two_clients_one_session() -> Config {
    use ClientAction::*;
    Config {
        name: "(a) 2 clients x 1 session: attach, detach, prompt, abort, disconnect",
        clients: vec![
            any_order(vec![Attach, Prompt, Abort, Disconnect]),
            any_order(vec![Attach, Detach]),
        ],
        crashes: 0,
        restarts: 0,
        handoffs: 0,
        orphan_crashes: 0,
        storage_faults: 0,
        max_output_bytes: None,
        let_go_of_transcripts: true,
        exit_overtakes: false,
        late_announcements: false,
        orphan_timing: None,
        reaches: vec![
            Milestone::Busy,
            Milestone::InvalidRequest,
            Milestone::WorkerKilled,
            Milestone::TranscriptAskedFor,
        ],
        depth_max: 200,
    }
}

/// Configuration (b): one client and one session, one worker crash and one
/// server restart at any point; the client may attach, prompt and detach,
/// and reconnect and attach again after the restart. Exit notices may
/// overtake the worker's messages. (61,194 states.)
pub fn crash_and_restart() -> Config {
    use ClientAction::*;
    Config {
        name: "(b) 1 client x 1 session: worker crash and server restart",
        clients: vec![any_order(vec![Attach, Prompt, Detach, Reconnect, Attach])],
        crashes: 1,
        restarts: 1,
        handoffs: 0,
        orphan_crashes: 0,
        storage_faults: 0,
        max_output_bytes: None,
        let_go_of_transcripts: false,
        exit_overtakes: true,
        late_announcements: false,
        orphan_timing: None,
        reaches: vec![Milestone::InvalidRequest],
        depth_max: 200,
    }
}

/// A larger (a): the second client may also prompt (1,447,493 states;
/// run it in release: `cargo run --release -p sim -- --model large`).
pub fn two_clients_one_session_large() -> Config {
    use ClientAction::*;
    Config {
        name: "(a+) 2 clients x 1 session: both prompt",
        clients: vec![
            any_order(vec![Attach, Prompt, Abort, Disconnect]),
            any_order(vec![Attach, Detach, Prompt]),
        ],
        ..two_clients_one_session()
    }
}

/// A larger (b): the client prompts again after reconnecting (533,412 states).
pub fn crash_and_restart_large() -> Config {
    use ClientAction::*;
    Config {
        name: "(b+) 1 client x 1 session: crash, restart, prompt again",
        clients: vec![any_order(vec![
            Attach, Prompt, Detach, Reconnect, Attach, Prompt,
        ])],
        ..crash_and_restart()
    }
}

/// Configuration (c): every command on one session. One client attaches,
/// prompts, steers, switches the model and the thinking level and prompts
/// again; another removes the session, at any point of that (79,358 states).
pub fn every_command() -> Config {
    use ClientAction::*;
    Config {
        name: "(c) 2 clients x 1 session: steer, set_model, set_thinking, a second prompt, remove",
        clients: vec![
            in_order(vec![Attach, Prompt, Steer, SetModel, SetThinking, Prompt]),
            any_order(vec![Remove]),
        ],
        reaches: vec![Milestone::Busy, Milestone::NotFound, Milestone::Removed],
        ..two_clients_one_session()
    }
}

/// Configuration (d): a slow consumer, a failing store and a hand-off
/// around one turn. The client attaches, prompts, stops reading (its output
/// bound is small, so the server may close it) and reads again, and
/// reconnects and attaches again if it was closed; one graceful
/// replacement and one stretch of failing store writes, each at any point
/// (96,884 states).
pub fn slow_consumer_storage_handoff() -> Config {
    use ClientAction::*;
    Config {
        name: "(d) 1 client x 1 session: slow consumer, storage failure, hand-off",
        clients: vec![in_order(vec![
            Attach,
            Prompt,
            StopReading,
            ResumeReading,
            Reconnect,
            Attach,
        ])],
        crashes: 0,
        restarts: 0,
        handoffs: 1,
        orphan_crashes: 0,
        storage_faults: 1,
        max_output_bytes: Some(2048),
        let_go_of_transcripts: false,
        exit_overtakes: false,
        late_announcements: false,
        orphan_timing: None,
        reaches: vec![
            Milestone::SlowConsumerClosed,
            Milestone::StoreFailed,
            Milestone::HandOff,
            Milestone::OrphanAdopted,
        ],
        depth_max: 200,
    }
}

/// Configuration (e): a server crash that keeps the workers. The client
/// attaches and prompts; the server dies at any point, its worker lives on
/// as an orphan, and a new server starts before or after the orphan's
/// grace (it is adopted, or it has retired); the client reconnects and
/// attaches again, before or after the orphan announces itself. The store
/// may fail once, at any point, so an orphan may retire on a failing disk
/// (72,009 states).
pub fn crash_keeping_workers() -> Config {
    use ClientAction::*;
    Config {
        name: "(e) 1 client x 1 session: server crash keeping workers, adoption or retirement",
        clients: vec![in_order(vec![Attach, Prompt, Reconnect, Attach])],
        crashes: 0,
        restarts: 0,
        handoffs: 0,
        orphan_crashes: 1,
        storage_faults: 1,
        max_output_bytes: None,
        let_go_of_transcripts: false,
        exit_overtakes: false,
        late_announcements: false,
        orphan_timing: None,
        reaches: vec![
            Milestone::StoreFailed,
            Milestone::OrphanAdopted,
            Milestone::OrphanRetired,
        ],
        depth_max: 200,
    }
}

/// Configuration (g): a client reconnecting across a hand-over while the
/// orphan's announcement travels. The client attaches and prompts; the
/// server is replaced at any point; the orphan streams on while its
/// announcement is on the way, so the snapshot it is adopted with lags;
/// the client reconnects and attaches again before or after the adoption.
/// Every reply it rebuilds has no hole (the `streams` checker), and the
/// server holds the session as the orphan does once it settles (22,204
/// states; the orphan's grace and announcement pause are short, so that
/// a refused orphan announces itself a few times, not 150).
pub fn handoff_in_flight() -> Config {
    use ClientAction::*;
    Config {
        name: "(g) 1 client x 1 session: reconnecting across a hand-over, the announcement in flight",
        clients: vec![in_order(vec![Attach, Prompt, Reconnect, Attach])],
        crashes: 0,
        restarts: 0,
        handoffs: 1,
        orphan_crashes: 0,
        storage_faults: 0,
        max_output_bytes: None,
        let_go_of_transcripts: false,
        exit_overtakes: false,
        late_announcements: true,
        orphan_timing: Some((Duration::from_secs(20), Duration::from_secs(5))),
        reaches: vec![Milestone::HandOff, Milestone::OrphanAdopted],
        depth_max: 60,
    }
}

/// Configuration (h): (g) for a v8 client, whose transcript replica must
/// equal the server's state across the hand-over (8,870 states).
pub fn v8_handoff_in_flight() -> Config {
    use ClientAction::*;
    Config {
        name: "(h) a v8 client x 1 session: reconnecting across a hand-over, the announcement in flight",
        clients: vec![v8(in_order(vec![Attach, Prompt, Reconnect, Attach]))],
        reaches: vec![
            Milestone::HandOff,
            Milestone::OrphanAdopted,
            Milestone::V8Replicated,
        ],
        ..handoff_in_flight()
    }
}

/// Configuration (f): a v8 client attaches, prompts and detaches, in any
/// order, interleaved with the worker's boot, messages, exit and time and
/// one worker crash at any point; a v1 client attaches and detaches beside
/// it, so the session is shared. The v8 client subscribes to the
/// transcript at every new route, and its replica, its route and its
/// answers are judged after every action (the v8 checker): a crash fails
/// its calls, then ends its route, and leaves it connected (47,630
/// states).
pub fn v8_client() -> Config {
    use ClientAction::*;
    Config {
        name: "(f) a v8 and a v1 client x 1 session: v8 attach, prompt, detach, a worker crash",
        clients: vec![
            v8(any_order(vec![Attach, Prompt, Detach])),
            in_order(vec![Attach, Detach]),
        ],
        crashes: 1,
        restarts: 0,
        handoffs: 0,
        orphan_crashes: 0,
        storage_faults: 0,
        max_output_bytes: None,
        let_go_of_transcripts: false,
        exit_overtakes: false,
        late_announcements: false,
        orphan_timing: None,
        reaches: vec![Milestone::V8Replicated, Milestone::V8Fenced],
        depth_max: 200,
    }
}

/// A larger (f): the v8 client attaches again after it detached, or
/// after the crash ended its route (628,554 states; `--model large`).
pub fn v8_client_large() -> Config {
    use ClientAction::*;
    Config {
        name: "(f+) a v8 and a v1 client x 1 session: v8 attach twice",
        clients: vec![
            v8(any_order(vec![Attach, Prompt, Detach, Attach])),
            in_order(vec![Attach, Detach]),
        ],
        ..v8_client()
    }
}

/// The configurations `sim --model` checks (and CI, in `sim/tests/model.rs`);
/// with `large`, also those too slow for CI.
pub fn configs(large: bool) -> Vec<Config> {
    let mut all = vec![
        two_clients_one_session(),
        crash_and_restart(),
        every_command(),
        slow_consumer_storage_handoff(),
        crash_keeping_workers(),
        v8_client(),
        handoff_in_flight(),
        v8_handoff_in_flight(),
    ];
    if large {
        all.push(two_clients_one_session_large());
        all.push(crash_and_restart_large());
        all.push(v8_client_large());
    }
    all
}

/// A configuration's key: the letter its name starts with (`a`, `b+`, …).
pub fn key(config: &Config) -> &'static str {
    let name = config.name.strip_prefix('(').unwrap_or(config.name);
    name.split(')').next().unwrap_or(name)
}

/// The configuration with that key.
pub fn config_named(wanted: &str) -> Option<Config> {
    configs(true).into_iter().find(|c| key(c) == wanted)
}

#[cfg(test)]
mod send_tests {
    /// States move between the explorer's threads.
    #[test]
    fn a_model_is_send() {
        fn send<T: Send>() {}
        send::<super::Model>();
    }
}
