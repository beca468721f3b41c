//! The swarm driver: one seed, random actions, faults as data, checkers after
//! every step, then a liveness phase.
//!
//! A run ([`run`]) has two phases (TigerBeetle's VOPR):
//!
//! 1. **Safety.** Until the kernel has taken [`SwarmOptions::steps`] steps,
//!    every driver step runs a fixed list of small `tick_*` functions:
//!    [`Swarm::tick_faults`] (crash a worker, restart the server, fail the
//!    store or spawns for a while, disconnect or stall a client, fail a
//!    model call), [`Swarm::tick_clients`] (maybe one client connects, says
//!    hello — or something hostile — or sends a request), and
//!    [`Swarm::tick_network`] (deliver one pending hop, oldest first or — with
//!    `reorder` — any channel, client bytes whole or split; or let time pass).
//!    The checkers run after every step.
//! 2. **Liveness.** Faults stop (the store and spawns heal, every client reads
//!    again, held boots are released, clients stop sending), every pending hop
//!    is delivered oldest first and time runs to the last deadline. Within
//!    [`SwarmOptions::liveness_steps_max`] steps the run must settle;
//!    otherwise [`checkers::pending`] names what is stuck.
//!
//! A failure has a class ([`FailureClass`]): a checker's violation
//! (correctness), no convergence (liveness) or a panic — a kernel assertion
//! or a world invariant (crash). Every run is a pure function of the seed:
//! `cargo run -p sim -- --seed S --trace` replays it line by line.

use crate::checkers::busy::{prompt_text, tool_prompt_text};
use crate::checkers::{self, Checkers, Violation};
use crate::options::{FaultKind, SwarmOptions};
use crate::prng::{Prng, Ratio, fnv};
use crate::world::{Amount, Delivery, WorkerStage, World, v8};
use kernel::faux;
use kernel::ids::{ConnId, WorkerId};
use kernel::protocol::{
    ClientMessage, Command, CreateParams, ModelRef, Request, ThinkingLevel, encode_client_message,
};
use kernel::wire::Value;
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Whether the swarm's v8 clients steer clear of kernel bugs that
/// `tests/v8_regressions.rs` reproduces, by cancelling only `waitForPrompt`
/// and never a management call. Off: bugs 7 and 8 (a cancelled attach still
/// routed the connection; a management call cancelled in the queue stalled
/// the calls behind it) are fixed, and the swarm cancels anything.
pub const AVOID_KNOWN_V8_BUGS: bool = false;

pub use crate::v8::UNKNOWN_SESSION;

/// How a run failed (TigerBeetle's `Failure`; the CLI exits with [`FailureClass::exit_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// A panic: a kernel assertion or a world invariant.
    Crash,
    /// The run did not settle once faults stopped.
    Liveness,
    /// A checker found a broken property.
    Correctness,
}

impl FailureClass {
    /// The process exit code for this class.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Crash => 127,
            Self::Liveness => 128,
            Self::Correctness => 129,
        }
    }
}

/// A failed run.
#[derive(Debug, Clone)]
pub struct Failure {
    /// What kind of failure.
    pub class: FailureClass,
    /// What went wrong.
    pub message: String,
    /// Driver step at which it was found.
    pub step: u64,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} failure at step {}: {}",
            self.class, self.step, self.message
        )
    }
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Driver steps of the safety phase.
    pub safety_steps: u64,
    /// Driver steps of the liveness phase.
    pub liveness_steps: u64,
    /// Kernel steps in all.
    pub kernel_steps: u64,
    /// Requests sent.
    pub requests: u64,
    /// Responses the kernel sent.
    pub responses: u64,
    /// Connections opened.
    pub connections: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Virtual time at the end, in milliseconds.
    pub virtual_ms: u64,
    /// `service_update`s the v8 checker judged.
    pub v8_updates: u64,
    /// v8 transcript replicas compared with the kernel's state.
    pub v8_comparisons: u64,
}

/// The outcome of one run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// `Ok` or the failure.
    pub result: Result<(), Failure>,
    /// Counters.
    pub stats: Stats,
    /// FNV-1a of the trace (0 when no trace was kept).
    pub trace_hash: u64,
    /// FNV-1a of the final kernel and store state.
    pub state_hash: u64,
}

/// The swarm driver of one run. See the module documentation.
pub struct Swarm {
    /// The options drawn from the seed.
    pub options: SwarmOptions,
    /// The world under test.
    pub world: World,
    /// The checkers.
    pub checkers: Checkers,
    /// Counters.
    pub stats: Stats,
    prng: Prng,
    slots: Vec<Option<ConnId>>,
    step: u64,
    creates: u32,
    storage_until: Option<u64>,
    spawn_failure_until: Option<u64>,
    slow: BTreeMap<ConnId, u64>,
    held_boots: BTreeMap<WorkerId, u64>,
    silent: Vec<ConnId>,
    /// The v8 clients' choices ([`SwarmOptions::v8_seed`]).
    v8: Prng,
}

impl Swarm {
    /// A fresh world for `options`; `trace` keeps the trace.
    pub fn new(options: SwarmOptions, trace: bool) -> Self {
        let mut world = World::new(options.world_options(trace));
        world.names.alias(UNKNOWN_SESSION, "unknown");
        let prng = Prng::new(options.driver_seed);
        let v8 = Prng::new(options.v8_seed);
        let slots = vec![None; options.clients as usize];
        Self {
            options,
            world,
            checkers: Checkers::new(),
            stats: Stats::default(),
            prng,
            slots,
            step: 0,
            creates: 0,
            storage_until: None,
            spawn_failure_until: None,
            slow: BTreeMap::new(),
            held_boots: BTreeMap::new(),
            silent: Vec::new(),
            v8,
        }
    }

    /// Both phases. Panics propagate (see [`run`]).
    pub fn run_phases(&mut self) -> Result<(), Failure> {
        self.safety()?;
        self.liveness()
    }

    fn fail(&self, class: FailureClass, message: String) -> Failure {
        Failure {
            class,
            message,
            step: self.step,
        }
    }

    fn correctness(&self, violation: Violation) -> Failure {
        self.fail(FailureClass::Correctness, violation.to_string())
    }

    fn safety(&mut self) -> Result<(), Failure> {
        let steps_max = self.options.steps * 50 + 10_000;
        while self.world.kernel_steps() < self.options.steps && self.step < steps_max {
            self.step += 1;
            self.stats.safety_steps += 1;
            self.tick_faults();
            self.tick_clients();
            self.tick_network();
            self.checkers
                .observe(&mut self.world)
                .map_err(|v| self.correctness(v))?;
        }
        Ok(())
    }

    fn liveness(&mut self) -> Result<(), Failure> {
        self.world.note(|| "liveness: faults stop".to_string());
        self.world.store.fail_writes = false;
        self.world.fail_spawns = false;
        self.held_boots.clear();
        let stalled: Vec<ConnId> = self.slow.keys().copied().collect();
        for conn in stalled {
            self.world.set_reading(conn, true);
        }
        self.slow.clear();
        for _ in 0..self.options.liveness_steps_max {
            self.step += 1;
            self.stats.liveness_steps += 1;
            let oldest = self.world.deliveries().into_iter().min();
            match oldest {
                Some((_, delivery)) => self.world.deliver(&delivery, Amount::All),
                None => {
                    if !self.world.advance_to_next() {
                        break;
                    }
                }
            }
            self.checkers
                .observe(&mut self.world)
                .map_err(|v| self.correctness(v))?;
        }
        match checkers::pending(&self.world, &self.checkers) {
            None => Ok(()),
            Some(reason) => Err(self.fail(FailureClass::Liveness, reason)),
        }
    }

    fn count(&mut self, kind: FaultKind) {
        *self.stats.faults.entry(kind.name()).or_insert(0) += 1;
    }

    fn chance(&mut self, kind: FaultKind) -> bool {
        let p = self.options.probability(kind);
        self.prng.chance(p)
    }

    fn stability(&mut self, kind: FaultKind) -> u64 {
        let max = self
            .options
            .fault(kind)
            .map_or(1, |f| u64::from(f.stability.max(1)));
        self.prng.range_inclusive(1, max)
    }

    /// Open connections, in id order.
    fn open_conns(&self) -> Vec<ConnId> {
        self.slots
            .iter()
            .flatten()
            .copied()
            .filter(|c| !self.world.client(*c).closed)
            .collect()
    }

    // ---- faults ------------------------------------------------------------

    /// Injects this step's faults, in a fixed order.
    pub fn tick_faults(&mut self) {
        self.tick_worker_crash();
        self.tick_restart();
        self.tick_shutdown();
        self.tick_storage();
        self.tick_spawn_failure();
        self.tick_disconnect();
        self.tick_slow_consumer();
        self.tick_model_failure();
    }

    fn tick_worker_crash(&mut self) {
        if !self.chance(FaultKind::WorkerCrash) {
            return;
        }
        let alive: Vec<WorkerId> = self
            .world
            .workers()
            .into_iter()
            .filter(|(_, _, stage, _)| *stage != WorkerStage::Dead)
            .map(|(w, _, _, _)| w)
            .collect();
        if !alive.is_empty() {
            let worker = *self.prng.pick(&alive);
            self.count(FaultKind::WorkerCrash);
            self.world.crash_worker(worker);
        }
    }

    fn tick_restart(&mut self) {
        if !self.chance(FaultKind::ServerRestart) {
            return;
        }
        self.count(FaultKind::ServerRestart);
        self.world.restart_server();
        self.slow.clear();
        self.held_boots.clear();
        self.silent.clear();
    }

    /// A graceful shutdown; once it completed, a new server starts.
    fn tick_shutdown(&mut self) {
        if self.world.is_shut_down() {
            self.world.restart_server();
            self.slow.clear();
            self.held_boots.clear();
            self.silent.clear();
        } else if !self.world.server.is_shutting_down() && self.chance(FaultKind::Shutdown) {
            self.count(FaultKind::Shutdown);
            self.world.shutdown();
        }
    }

    fn tick_storage(&mut self) {
        if self.storage_until.is_some_and(|until| self.step >= until) {
            self.storage_until = None;
            self.world.store.fail_writes = false;
            self.world.note(|| "store heals".to_string());
        } else if self.storage_until.is_none() && self.chance(FaultKind::StorageFailure) {
            let until = self.step + self.stability(FaultKind::StorageFailure);
            self.storage_until = Some(until);
            self.world.store.fail_writes = true;
            self.count(FaultKind::StorageFailure);
            self.world
                .note(|| "store starts failing writes".to_string());
        }
    }

    fn tick_spawn_failure(&mut self) {
        if self
            .spawn_failure_until
            .is_some_and(|until| self.step >= until)
        {
            self.spawn_failure_until = None;
            self.world.fail_spawns = false;
        } else if self.spawn_failure_until.is_none() && self.chance(FaultKind::SpawnFailure) {
            let until = self.step + self.stability(FaultKind::SpawnFailure);
            self.spawn_failure_until = Some(until);
            self.world.fail_spawns = true;
            self.count(FaultKind::SpawnFailure);
        }
    }

    fn tick_disconnect(&mut self) {
        if !self.chance(FaultKind::Disconnect) {
            return;
        }
        let open = self.open_conns();
        if !open.is_empty() {
            let conn = *self.prng.pick(&open);
            let abrupt = self.prng.coin();
            self.count(FaultKind::Disconnect);
            self.world.disconnect_with(conn, abrupt);
        }
    }

    fn tick_slow_consumer(&mut self) {
        let step = self.step;
        let resume: Vec<ConnId> = self
            .slow
            .iter()
            .filter(|(_, until)| **until <= step)
            .map(|(c, _)| *c)
            .collect();
        for conn in resume {
            self.slow.remove(&conn);
            self.world.set_reading(conn, true);
        }
        if !self.chance(FaultKind::SlowConsumer) {
            return;
        }
        let open = self.open_conns();
        if !open.is_empty() {
            let conn = *self.prng.pick(&open);
            let until = step + self.stability(FaultKind::SlowConsumer);
            self.count(FaultKind::SlowConsumer);
            self.world.note(|| format!("{conn} stops reading"));
            self.world.set_reading(conn, false);
            self.slow.insert(conn, until);
        }
    }

    fn tick_model_failure(&mut self) {
        if !self.chance(FaultKind::ModelFailure) {
            return;
        }
        let streaming: Vec<WorkerId> = self
            .world
            .workers()
            .into_iter()
            .map(|(w, _, _, _)| w)
            .filter(|w| self.world.is_streaming(*w))
            .collect();
        if !streaming.is_empty() {
            let worker = *self.prng.pick(&streaming);
            let retryable = self.prng.coin();
            self.count(FaultKind::ModelFailure);
            self.world.fail_model(worker, retryable);
        }
    }

    // ---- clients -----------------------------------------------------------

    /// Maybe one client acts: connects (and says hello, or something
    /// hostile, or nothing) or sends a request.
    pub fn tick_clients(&mut self) {
        let action = self.options.client_action;
        if !self.prng.chance(action) {
            return;
        }
        let slot = self.prng.below(self.slots.len() as u64) as usize;
        let v8 = self.options.v8_slots.contains(&(slot as u32));
        match self.slots[slot] {
            Some(conn) if self.world.client(conn).closed => self.open_slot(slot, v8),
            Some(conn) if self.silent.contains(&conn) => {}
            Some(conn) if v8 => self.v8_request(conn),
            Some(conn) => self.client_request(conn),
            None => self.open_slot(slot, v8),
        }
    }

    /// A client connects in `slot`.
    fn open_slot(&mut self, slot: usize, v8: bool) {
        match v8 {
            true => {
                let conn = self.world.connect_v8_silent();
                self.stats.connections += 1;
                self.slots[slot] = Some(conn);
                self.v8_open(conn);
            }
            false => {
                let conn = self.world.connect();
                self.stats.connections += 1;
                self.slots[slot] = Some(conn);
                self.client_open(conn);
            }
        }
    }

    fn client_open(&mut self, conn: ConnId) {
        if self.chance(FaultKind::Idle) {
            self.count(FaultKind::Idle);
            self.world.note(|| format!("{conn} stays silent"));
            self.silent.push(conn);
        } else if self.chance(FaultKind::Garbage) {
            self.count(FaultKind::Garbage);
            self.garbage(conn, true);
        } else {
            self.world.hello(conn, 1, None);
        }
    }

    /// Something a well-behaved client never sends.
    fn garbage(&mut self, conn: ConnId, first: bool) {
        match self.prng.below(4) {
            0 => {
                let len = self.prng.range_inclusive(1, 24) as usize;
                let bytes: Vec<u8> = (0..len).map(|_| self.prng.next_u64() as u8).collect();
                self.world.send_bytes(conn, bytes);
            }
            1 => {
                // A version the server speaks neither of: 8 is protocol v8.
                let version = match self.prng.range_inclusive(2, 9) {
                    8 => 9,
                    v => v,
                };
                self.world.hello(conn, version, None)
            }
            2 if first => {
                let request = Request {
                    id: "r0".into(),
                    command: Command::List,
                };
                let payload = encode_client_message(&ClientMessage::Request(request));
                let frame = encode_frame(&payload.expect("encodable"), DEFAULT_MAX_FRAME_LEN);
                self.world.send_bytes(conn, frame.expect("fits"));
            }
            _ => {
                // A frame header announcing more than the kernel accepts.
                let len = self.options.limits.max_frame_len.saturating_add(1);
                self.world.send_bytes(conn, len.to_be_bytes().to_vec());
            }
        }
    }

    fn client_request(&mut self, conn: ConnId) {
        if self.chance(FaultKind::Garbage) {
            self.count(FaultKind::Garbage);
            return self.garbage(conn, false);
        }
        let may_create = self.creates < self.options.sessions * 3
            && self.world.store.sessions.len() < self.options.sessions as usize;
        let weights = [1, if may_create { 3 } else { 0 }, 4, 2, 5, 2, 2, 1, 1, 1];
        let command = match self.prng.weighted(&weights) {
            0 => Command::List,
            1 => {
                self.creates += 1;
                // Sometimes on another model: faux-tiny's 400-token window compacts soon.
                let model = (self.prng.below(3) == 0).then(|| self.pick_model());
                let cwd = Some("/work".into());
                Command::Create(CreateParams {
                    cwd,
                    model,
                    ..CreateParams::default()
                })
            }
            choice => {
                // Control commands mostly go to a session the client is attached to.
                let attached = self.world.server.attachments(conn);
                let control = !matches!(choice, 2 | 9);
                let session_id = if control && !attached.is_empty() && self.prng.below(5) > 0 {
                    self.prng.pick(&attached).clone()
                } else {
                    self.pick_session()
                };
                self.session_command(conn, choice, session_id)
            }
        };
        self.stats.requests += 1;
        self.world.request(conn, command);
    }

    /// A prompt's text naming its request: a tool prompt asks for an MCP
    /// tool every other time when the sessions have MCP servers.
    fn prompt(&mut self, conn: ConnId, tool: bool) -> String {
        let id = self.world.next_request_id(conn);
        if tool {
            let mcp = self.options.fault(FaultKind::Mcp).is_some();
            tool_prompt_text(conn, &id, mcp)
        } else {
            prompt_text(conn, &id, false)
        }
    }

    fn session_command(&mut self, conn: ConnId, choice: usize, session_id: String) -> Command {
        match choice {
            2 => Command::Attach { session_id },
            3 => Command::Detach { session_id },
            4 => {
                let tool = self.prng.chance(self.options.tool_prompts);
                let mut text = self.prompt(conn, tool);
                if !tool && self.prng.below(6) == 0 {
                    // A long prompt, so that small context windows fill up and compact.
                    let words = self.prng.range_inclusive(20, 160) as usize;
                    text.push_str(&" lorem ipsum".repeat(words / 2));
                }
                Command::Prompt { session_id, text }
            }
            5 => {
                let text = format!("steer {conn}#{}", self.world.next_request_id(conn));
                Command::Steer { session_id, text }
            }
            6 => Command::Abort { session_id },
            7 => {
                let model = self.pick_model();
                Command::SetModel { session_id, model }
            }
            8 => {
                let thinking_level = *self.prng.pick(&ThinkingLevel::ALL);
                Command::SetThinking {
                    session_id,
                    thinking_level,
                }
            }
            _ => Command::Remove { session_id },
        }
    }

    /// One of the faux models, or one that does not exist.
    fn pick_model(&mut self) -> ModelRef {
        let mut models: Vec<ModelRef> = faux::models()
            .into_iter()
            .map(|m| ModelRef {
                provider: m.provider,
                id: m.id,
            })
            .collect();
        models.push(ModelRef {
            provider: "faux".into(),
            id: "no-such-model".into(),
        });
        self.prng.pick(&models).clone()
    }

    /// A stored session, or now and then one that does not exist.
    fn pick_session(&mut self) -> String {
        let known: Vec<&String> = self.world.store.sessions.keys().collect();
        if known.is_empty() || self.prng.chance(Ratio::new(1, 25)) {
            return UNKNOWN_SESSION.to_string();
        }
        let index = self.prng.below(known.len() as u64) as usize;
        known[index].clone()
    }

    // ---- v8 clients --------------------------------------------------------

    fn v8_chance(&mut self, kind: FaultKind) -> bool {
        let p = self.options.probability(kind);
        self.v8.chance(p)
    }

    /// A v8 client connects: says hello (some subscribe to their session's
    /// transcript at every new route on their own), or stays silent, or
    /// sends garbage.
    fn v8_open(&mut self, conn: ConnId) {
        if self.v8_chance(FaultKind::Idle) {
            self.count(FaultKind::Idle);
            self.world.note(|| format!("{conn} stays silent"));
            self.silent.push(conn);
            return;
        }
        if self.v8_chance(FaultKind::Garbage) {
            self.count(FaultKind::Garbage);
            return self.v8_garbage(conn);
        }
        let follows: &[&'static str] = match self.v8.below(4) {
            0 => &[],
            1 => &[v8::TRANSCRIPT, v8::MODELS],
            _ => &[v8::TRANSCRIPT],
        };
        self.world.set_v8_auto_subscribe(conn, follows.to_vec());
        self.world.v8_hello(conn);
    }

    /// Something a well-behaved v8 client never sends: bytes that are not
    /// a frame, or a frame that is not an envelope (both end the stream's
    /// use), or a call the server refuses (answered with an error).
    fn v8_garbage(&mut self, conn: ConnId) {
        match self.v8.below(4) {
            0 => {
                let len = self.v8.range_inclusive(1, 24) as usize;
                let bytes: Vec<u8> = (0..len).map(|_| self.v8.next_u64() as u8).collect();
                self.world.send_bytes(conn, bytes);
            }
            1 => self.world.v8_send_broken(conn),
            2 => {
                self.world
                    .v8_server_call(conn, "no.such-service", "call", vec![]);
            }
            _ => {
                self.world
                    .v8_server_call(conn, v8::DIRECTORY, "state", vec![Value::Null]);
            }
        }
    }

    /// A v8 client sends one request (see [`AVOID_KNOWN_V8_BUGS`] for
    /// what it refrains from).
    fn v8_request(&mut self, conn: ConnId) {
        if !self.world.v8_client(conn).ready {
            return; // it awaits the server's hello
        }
        if self.v8_chance(FaultKind::Garbage) {
            self.count(FaultKind::Garbage);
            return self.v8_garbage(conn);
        }
        let routed = self.world.v8_client(conn).route.is_some();
        let may_create = self.creates < self.options.sessions * 3
            && self.world.store.sessions.len() < self.options.sessions as usize;
        let weights = [
            1,
            1,
            if may_create { 2 } else { 0 },
            // Unattached, it mostly attaches: a client's first call.
            if routed { 2 } else { 12 },
            2,
            1,
            3,
            1,
            1,
            5,
            2,
            2,
            2,
            1,
            1,
            1,
            2,
        ];
        self.stats.requests += 1;
        match self.v8.weighted(&weights) {
            0 => {
                let service = if self.v8.coin() { "server" } else { "session" };
                let call = |w: &mut World| match service {
                    "server" => w.v8_server_call(conn, v8::CONTROL, "catalogue", vec![]),
                    _ => w.v8_session_call(conn, v8::CONTROL, "catalogue", vec![]),
                };
                call(&mut self.world);
            }
            1 => {
                self.world.v8_subscribe(conn, v8::DIRECTORY);
            }
            2 => {
                self.creates += 1;
                self.world
                    .v8_server_call(conn, v8::MANAGEMENT, "create", vec![Value::Null]);
            }
            3 => {
                let session = self.v8_pick_session();
                self.world.v8_server_call(
                    conn,
                    v8::MANAGEMENT,
                    "attach",
                    vec![Value::text(session)],
                );
            }
            4 => {
                self.world
                    .v8_server_call(conn, v8::MANAGEMENT, "detach", vec![]);
            }
            5 => {
                let session = self.v8_pick_session();
                self.world.v8_server_call(
                    conn,
                    v8::MANAGEMENT,
                    "remove",
                    vec![Value::text(session)],
                );
            }
            6 => {
                self.world.v8_subscribe(conn, v8::TRANSCRIPT);
            }
            7 => {
                self.world.v8_subscribe(conn, v8::MODELS);
            }
            8 => {
                let subs: Vec<String> = self.world.v8_client(conn).subs.keys().cloned().collect();
                let sub = match subs.is_empty() {
                    true => "service-0".to_string(),
                    false => self.v8.pick(&subs).clone(),
                };
                let call = |w: &mut World, session: bool| {
                    let args = vec![Value::text(&sub)];
                    match session {
                        true => w.v8_session_call(conn, v8::CONTROL, "unsubscribe", args),
                        false => w.v8_server_call(conn, v8::CONTROL, "unsubscribe", args),
                    }
                };
                let session = self
                    .world
                    .v8_client(conn)
                    .subs
                    .get(&sub)
                    .is_some_and(|r| r.route.is_some());
                call(&mut self.world, session);
            }
            9 => {
                let tool = self.v8.chance(self.options.tool_prompts);
                let mut text = self.prompt(conn, tool);
                if !tool && self.v8.below(6) == 0 {
                    let words = self.v8.range_inclusive(20, 160) as usize;
                    text.push_str(&" lorem ipsum".repeat(words / 2));
                }
                let args = vec![v8::prompt_request(&text)];
                self.world.v8_session_call(conn, v8::AGENT, "prompt", args);
            }
            10 => {
                // Steers and follow-ups start a prompt when the session is idle.
                let (member, word) = match self.v8.coin() {
                    true => ("steer", "steer"),
                    false => ("followUp", "follow-up"),
                };
                let text = format!("{word} {conn}#{}", self.world.next_request_id(conn));
                let args = vec![v8::prompt_request(&text)];
                self.world.v8_session_call(conn, v8::AGENT, member, args);
            }
            11 => {
                self.world.v8_session_call(conn, v8::AGENT, "abort", vec![]);
            }
            12 => {
                let operations = self.world.v8_client(conn).operations.clone();
                let op = match operations.is_empty() || self.v8.below(8) == 0 {
                    true => "999999".to_string(),
                    false => self.v8.pick(&operations).clone(),
                };
                let args = vec![Value::text(op)];
                self.world
                    .v8_session_call(conn, v8::AGENT, "waitForPrompt", args);
            }
            13 => {
                let model = self.v8_pick_model();
                let args = vec![Value::Map(vec![
                    ("provider".into(), Value::text(model.provider)),
                    ("modelId".into(), Value::text(model.id)),
                ])];
                self.world.v8_session_call(conn, v8::MODELS, "select", args);
            }
            14 => {
                let level = *self.v8.pick(&ThinkingLevel::ALL);
                let args = vec![Value::text(level.as_str())];
                self.world
                    .v8_session_call(conn, v8::MODELS, "selectThinking", args);
            }
            15 => {
                let pending: Vec<String> = self
                    .world
                    .v8_client(conn)
                    .pending
                    .iter()
                    .filter(|(_, asked)| !AVOID_KNOWN_V8_BUGS || **asked == v8::Asked::Wait)
                    .map(|(id, _)| id.clone())
                    .collect();
                if pending.is_empty() {
                    self.stats.requests -= 1;
                    return;
                }
                let id = self.v8.pick(&pending).clone();
                // Sometimes with a target that is not the request's: ignored.
                let target = match self.v8.coin() {
                    true => self.world.v8_target(conn),
                    false => v8::server_target(),
                };
                self.stats.requests -= 1;
                self.world.v8_cancel(conn, &id, &target);
            }
            _ => {
                let (service, member, args) = match self.v8.below(6) {
                    0 => (v8::MODELS, "getThinkingLevels", vec![]),
                    1 => (v8::MODELS, "cycleThinking", vec![]),
                    2 => (v8::MODELS, "refresh", vec![]),
                    3 => (v8::AGENT, "cancelQueued", vec![Value::text("1")]),
                    4 => (v8::AGENT, "compact", vec![Value::Null]),
                    _ => ("pi.session-plugins", "reload", vec![]),
                };
                self.world.v8_session_call(conn, service, member, args);
            }
        }
    }

    /// A stored session, or now and then one that does not exist.
    fn v8_pick_session(&mut self) -> String {
        let known: Vec<&String> = self.world.store.sessions.keys().collect();
        if known.is_empty() || self.v8.chance(Ratio::new(1, 25)) {
            return UNKNOWN_SESSION.to_string();
        }
        let index = self.v8.below(known.len() as u64) as usize;
        known[index].clone()
    }

    /// One of the faux models, or one that does not exist.
    fn v8_pick_model(&mut self) -> ModelRef {
        let mut models: Vec<ModelRef> = faux::models()
            .into_iter()
            .map(|m| ModelRef {
                provider: m.provider,
                id: m.id,
            })
            .collect();
        models.push(ModelRef {
            provider: "faux".into(),
            id: "no-such-model".into(),
        });
        self.v8.pick(&models).clone()
    }

    // ---- network and time --------------------------------------------------

    /// Delivers one pending hop, or lets time pass (when nothing is
    /// deliverable, or with the `delay` fault).
    pub fn tick_network(&mut self) {
        let mut deliveries = self.world.deliveries();
        self.hold_boots(&deliveries);
        let step = self.step;
        let held = &self.held_boots;
        deliveries.retain(
            |(_, d)| !matches!(d, Delivery::Boot(w) if held.get(w).is_some_and(|u| *u > step)),
        );
        let delay = self.chance(FaultKind::Delay);
        if delay {
            self.count(FaultKind::Delay);
        }
        let time_advance = self.options.time_advance;
        if deliveries.is_empty() || delay || self.prng.chance(time_advance) {
            self.world.advance_to_next();
            return;
        }
        let reorder = self.chance(FaultKind::Reorder);
        let (_, delivery) = if reorder {
            deliveries[self.prng.below(deliveries.len() as u64) as usize].clone()
        } else {
            deliveries.iter().min().expect("non-empty").clone()
        };
        let amount = self.amount(&delivery);
        self.world.deliver(&delivery, amount);
    }

    /// Decides, the first time a boot is offered, whether it is held back.
    fn hold_boots(&mut self, deliveries: &[(u64, Delivery)]) {
        for (_, delivery) in deliveries {
            let Delivery::Boot(worker) = delivery else {
                continue;
            };
            if self.held_boots.contains_key(worker) {
                continue;
            }
            let until = if self.chance(FaultKind::WorkerHold) {
                self.count(FaultKind::WorkerHold);
                self.step + self.stability(FaultKind::WorkerHold)
            } else {
                0
            };
            self.held_boots.insert(*worker, until);
        }
    }

    fn amount(&mut self, delivery: &Delivery) -> Amount {
        match delivery {
            Delivery::ToServer(conn) => {
                let len = self.world.client(*conn).outbox_len();
                if len > 1 && self.chance(FaultKind::Split) {
                    self.count(FaultKind::Split);
                    Amount::Up(self.prng.range_inclusive(1, len as u64 - 1) as usize)
                } else {
                    Amount::All
                }
            }
            Delivery::ToClient(_) | Delivery::FromWorker(_) => {
                if self.prng.coin() {
                    Amount::One
                } else {
                    Amount::All
                }
            }
            _ => Amount::One,
        }
    }

    /// FNV-1a of the kernel's and the store's state (for determinism checks).
    pub fn state_hash(&self) -> u64 {
        let state = format!("{:?}\n{:?}", self.world.server, self.world.store.sessions);
        fnv(&state)
    }
}

/// Runs one seed to the end, catching panics as [`FailureClass::Crash`].
/// Returns the report and the swarm (for its trace).
pub fn run(options: SwarmOptions, trace: bool) -> (Report, Swarm) {
    let seed = options.seed;
    let mut swarm = Swarm::new(options, trace);
    let outcome = catch_unwind(AssertUnwindSafe(|| swarm.run_phases()));
    let result = match outcome {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".to_string());
            Err(swarm.fail(FailureClass::Crash, message))
        }
    };
    swarm.stats.kernel_steps = swarm.world.kernel_steps();
    swarm.stats.responses = swarm.checkers.requests.responses;
    swarm.stats.virtual_ms = swarm.world.now.as_millis();
    swarm.stats.v8_updates = swarm.checkers.v8.updates;
    swarm.stats.v8_comparisons = swarm.checkers.v8.comparisons;
    let trace_hash = if trace {
        fnv(&swarm.world.trace_text())
    } else {
        0
    };
    let report = Report {
        seed,
        result,
        stats: swarm.stats.clone(),
        trace_hash,
        state_hash: swarm.state_hash(),
    };
    (report, swarm)
}
