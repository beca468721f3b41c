//! A small explicit-state model checker: every interleaving of a small
//! configuration, judged by the same checkers as the swarm.
//!
//! # Why our own explorer, and not stateright
//!
//! stateright explores states it can clone, hash and compare: the whole
//! model state must be `Clone + Hash + Eq`. Ours is the real kernel
//! (`kernel::server::Server`, which is neither `Clone` nor `Hash`), real
//! runtimes and the fake world around them; wrapping them in a stateright
//! `Model` would mean either changing the kernel for the checker's sake or
//! re-modelling it — and checking the model instead of the code.
//!
//! The world is deterministic, so a state is fully described by the actions
//! that led to it. The explorer therefore walks **action sequences**
//! depth-first and rebuilds each state by **replaying its prefix** from a
//! fresh world. Equal states reached in different orders are merged through
//! a **fingerprint**: a 64-bit FNV hash of everything that decides the
//! future — the kernel's `Debug` text, the store, every fake worker and
//! client with their queues (without the sequence numbers that merely order
//! them), the checkers' own state (requests owed, running prompts, revisions
//! seen) and the remaining budgets. Replay costs a factor of the depth;
//! the configurations are small, so that is cheap.
//!
//! # What is explored
//!
//! A [`Config`] gives every client a budget of actions (attach, detach,
//! prompt, abort, steer, disconnect, reconnect), plus budgets of worker
//! crashes and server restarts. At every state the enabled actions are:
//! each client action still in budget; each pending hop of the world (a
//! worker boot, the next server → worker message, the next significant
//! worker → server message with the progress before it, an exit notice);
//! letting time run until something significant happens; a crash of any
//! live worker; a restart. Client bytes and server frames are delivered at
//! once (a client's request is atomic with its arrival; the interleavings
//! that matter are between clients, workers and time).
//!
//! After every action the checkers run. At every **quiescent** state
//! (nothing in flight, no deadline pending) [`crate::checkers::pending`]
//! must say the run has settled: the liveness property, checked exhaustively.

use crate::checkers::busy::prompt_text;
use crate::checkers::{self, Checkers};
use crate::prng::Fnv;
use crate::world::{Amount, Delivery, Holds, Options, Store, WorkerStage, World};
use kernel::ids::{ConnId, WorkerId};
use kernel::protocol::{Command, ThinkingLevel};
use kernel::runtime::StoredSession;
use std::collections::BTreeSet;
use std::fmt;
use std::hash::{Hash, Hasher};
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
    /// The server crashes and restarts.
    Restart,
}

/// A configuration to explore.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name for reports.
    pub name: &'static str,
    /// Each client's budget: every listed action can be taken once.
    pub clients: Vec<Vec<ClientAction>>,
    /// Worker crashes allowed.
    pub crashes: u32,
    /// Server restarts allowed.
    pub restarts: u32,
    /// An exit notice may overtake the worker's messages.
    pub exit_overtakes: bool,
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
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} transitions, {} quiescent, depth {}, {} truncated, {:.2}s",
            self.states,
            self.transitions,
            self.quiescent,
            self.depth,
            self.truncated,
            self.elapsed.as_secs_f64()
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
pub struct Model {
    /// The world.
    pub world: World,
    /// The checkers.
    pub checkers: Checkers,
    /// The session all clients act on.
    pub session_id: String,
    conns: Vec<ConnId>,
    budgets: Vec<Vec<ClientAction>>,
    crashes: u32,
    restarts: u32,
}

impl Model {
    /// The initial state: a stored session that is not live, and every
    /// client connected and past its handshake.
    pub fn new(config: &Config, trace: bool) -> Self {
        Self::with_facts(config, trace, true)
    }

    fn with_facts(config: &Config, trace: bool, record_facts: bool) -> Self {
        let holds = Holds {
            boot: true,
            to_worker: true,
            from_worker: true,
            exit: true,
            exit_overtakes: config.exit_overtakes,
            ..Holds::none()
        };
        let options = Options {
            trace,
            keep_received: false,
            record_facts,
            skip_unchecked: !trace,
            holds,
            models: kernel::faux::models().into_iter().take(1).collect(),
            ..Options::default()
        };
        let session_id = SESSION_ID.to_string();
        let mut world = World::with_store(options, stored_session(&session_id));
        let conns = config
            .clients
            .iter()
            .map(|_| world.connect_ready())
            .collect();
        let mut checkers = Checkers::new();
        if record_facts {
            let setup = checkers.observe(&mut world);
            setup.expect("the setup breaks nothing");
        }
        Self {
            world,
            checkers,
            session_id,
            conns,
            budgets: config.clients.clone(),
            crashes: config.crashes,
            restarts: config.restarts,
        }
    }

    /// The actions enabled here, in a fixed order.
    pub fn enabled(&self) -> Vec<Action> {
        let mut out = Vec::new();
        for (client, budget) in self.budgets.iter().enumerate() {
            let closed = self.world.client(self.conns[client]).closed;
            let distinct: BTreeSet<ClientAction> = budget.iter().copied().collect();
            for action in distinct {
                if (action == ClientAction::Reconnect) == closed {
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
        if self.restarts > 0 {
            out.push(Action::Restart);
        }
        out
    }

    /// Takes one action, then runs the checkers.
    pub fn apply(&mut self, action: &Action) -> Result<(), String> {
        self.act(action);
        self.checkers
            .observe(&mut self.world)
            .map_err(|v| v.to_string())
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
        }
    }

    fn client(&mut self, client: usize, action: ClientAction) {
        let budget = &mut self.budgets[client];
        let index = budget.iter().position(|a| *a == action).expect("enabled");
        budget.remove(index);
        let conn = self.conns[client];
        let session_id = self.session_id.clone();
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
            ClientAction::Disconnect => return self.world.disconnect(conn),
            ClientAction::Reconnect => {
                self.conns[client] = self.world.connect_ready();
                return;
            }
        };
        self.world.request(conn, command);
    }

    /// True when nothing is in flight and no deadline is pending.
    pub fn is_quiescent(&self) -> bool {
        self.world.deliveries().is_empty() && self.world.next_event().is_none()
    }

    /// The fingerprint of this state (see the module documentation).
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = Fnv::default();
        self.world.fingerprint(&mut hasher);
        self.checkers.fingerprint(&mut hasher);
        self.budgets.hash(&mut hasher);
        self.conns.hash(&mut hasher);
        (self.crashes, self.restarts).hash(&mut hasher);
        hasher.finish()
    }
}

/// The session every model starts with (stored, not live).
pub const SESSION_ID: &str = "00000000-0000-4000-8000-00000000cafe";

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

/// Rebuilds the state `path` leads to without checking it again (it was
/// checked when first reached) and gives it the checkers it had then.
fn rebuild(config: &Config, path: &[Action], checkers: &Checkers) -> Model {
    let mut model = Model::with_facts(config, false, false);
    for action in path {
        model.act(action);
    }
    model.world.set_record_facts(true);
    model.world.store.take_dirty();
    model.checkers = checkers.clone();
    model
}

/// Explores every interleaving of `config` depth-first. Returns the
/// statistics, or the first counterexample (with its replayed trace).
pub fn explore(config: &Config) -> Result<Stats, Box<Counterexample>> {
    let started = Instant::now();
    let mut explorer = Explorer {
        config,
        seen: BTreeSet::new(),
        stats: empty_stats(),
    };
    let root = Model::new(config, false);
    explorer.seen.insert(root.fingerprint());
    explorer.stats.states = 1;
    let mut path = Vec::new();
    explorer.visit(root, &mut path).map_err(|(path, message)| {
        let (model, _) = replay(config, &path, true);
        Box::new(Counterexample {
            path,
            message,
            trace: model.world.trace_text(),
        })
    })?;
    explorer.stats.elapsed = started.elapsed();
    Ok(explorer.stats)
}

fn empty_stats() -> Stats {
    Stats {
        states: 0,
        transitions: 0,
        quiescent: 0,
        depth: 0,
        truncated: 0,
        elapsed: Duration::ZERO,
    }
}

struct Explorer<'a> {
    config: &'a Config,
    seen: BTreeSet<u64>,
    stats: Stats,
}

type Found = (Vec<Action>, String);

impl Explorer<'_> {
    /// Checks `model` (reached by `path`) and explores its successors.
    fn visit(&mut self, model: Model, path: &mut Vec<Action>) -> Result<(), Found> {
        self.stats.depth = self.stats.depth.max(path.len());
        if model.is_quiescent() {
            self.stats.quiescent += 1;
            if let Some(reason) = checkers::pending(&model.world, &model.checkers) {
                return Err((path.clone(), format!("[liveness] not settled: {reason}")));
            }
        }
        if path.len() >= self.config.depth_max {
            self.stats.truncated += 1;
            return Ok(());
        }
        let actions = model.enabled();
        let checkers = model.checkers.clone();
        let mut current = Some(model);
        for (index, action) in actions.iter().enumerate() {
            // The last successor reuses this state; the others rebuild it.
            let mut next = if index + 1 == actions.len() {
                current.take().expect("kept for the last action")
            } else {
                rebuild(self.config, path, &checkers)
            };
            self.stats.transitions += 1;
            path.push(action.clone());
            if let Err(message) = next.apply(action) {
                return Err((path.clone(), message));
            }
            if self.seen.insert(next.fingerprint()) {
                self.stats.states += 1;
                self.visit(next, path)?;
            }
            path.pop();
        }
        Ok(())
    }
}

/// Configuration (a): two clients and one session. One client may attach,
/// prompt, abort and disconnect, the other attach and detach — each once, in
/// every interleaving with the worker's boot, messages and exit and with
/// time. (The CI-sized budget: about 32,000 states.)
pub fn two_clients_one_session() -> Config {
    use ClientAction::*;
    Config {
        name: "(a) 2 clients x 1 session: attach, detach, prompt, abort, disconnect",
        clients: vec![
            vec![Attach, Prompt, Abort, Disconnect],
            vec![Attach, Detach],
        ],
        crashes: 0,
        restarts: 0,
        exit_overtakes: false,
        depth_max: 200,
    }
}

/// Configuration (b): one client and one session, one worker crash and one
/// server restart at any point; the client may attach, prompt and detach,
/// and reconnect and attach again after the restart. Exit notices may
/// overtake the worker's messages. (The CI-sized budget: about 32,000 states.)
pub fn crash_and_restart() -> Config {
    use ClientAction::*;
    Config {
        name: "(b) 1 client x 1 session: worker crash and server restart",
        clients: vec![vec![Attach, Prompt, Detach, Reconnect, Attach]],
        crashes: 1,
        restarts: 1,
        exit_overtakes: true,
        depth_max: 200,
    }
}

/// A larger (a): the second client may also prompt (about 260,000 states;
/// run it in release: `cargo run --release -p sim -- --model large`).
pub fn two_clients_one_session_large() -> Config {
    use ClientAction::*;
    Config {
        name: "(a+) 2 clients x 1 session: both prompt",
        clients: vec![
            vec![Attach, Prompt, Abort, Disconnect],
            vec![Attach, Detach, Prompt],
        ],
        ..two_clients_one_session()
    }
}

/// A larger (b): the client prompts again after reconnecting (about 230,000 states).
pub fn crash_and_restart_large() -> Config {
    use ClientAction::*;
    Config {
        name: "(b+) 1 client x 1 session: crash, restart, prompt again",
        clients: vec![vec![Attach, Prompt, Detach, Reconnect, Attach, Prompt]],
        ..crash_and_restart()
    }
}
