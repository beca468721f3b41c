//! Fake worker processes: how they are scripted ([`WorkerScript`]) and where
//! they are in their life ([`WorkerStage`]), spawning and booting them, the
//! plumbing between the kernel's worker host and the fake store, the faux
//! model and fake tool runs, their exits and crashes, and the accessors the
//! drivers and checkers read workers through.

use super::replacement::ORPHAN_BASE;
use super::{Fact, Memo, World, is_worker_delta};
use crate::summary;
use kernel::faux::FauxStream;
use kernel::host::{HostConfig, HostInput, HostOutput, StoreFailure, StoreFailureKind, WorkerHost};
use kernel::ids::{ChannelId, OpId, WorkerId};
use kernel::mcp::{Layer, ListedTool, McpInput, McpOutput};
use kernel::protocol::worker::WorkerFrame;
use kernel::protocol::{Content, ErrorCode, ProtocolError, SessionPhase, TranscriptItem};
use kernel::runtime::{ModelEvent, Persist, Runtime, StoredSession};
use kernel::server::Input;
use kernel::time::Instant;
use kernel::wire::Value;
use kernel::worker::{FromWorker, Operation, ToWorker};
use std::collections::{BTreeMap, VecDeque};

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

#[derive(Debug, Clone)]
pub(super) struct FakeWorker {
    pub(super) session_id: String,
    /// The secret it was spawned with (its hello proves it).
    token: String,
    pub(super) stage: WorkerStage,
    /// The kernel's worker host, from the boot on.
    pub(super) host: Memo<Option<WorkerHost>>,
    /// Set by [`WorkerScript::WrongId`]: the id its ready snapshot names.
    wrong_id: Option<String>,
    pub(super) stream: Option<(u64, FauxStream)>,
    /// Fake tool runs in flight: tool item id → (due, tool name).
    pub(super) tools: BTreeMap<String, (Instant, String)>,
    /// Operations the server on its current channel gave it and it has not
    /// answered (judged from outside: a worker answers only those).
    pub(super) asked: std::collections::BTreeSet<OpId>,
    /// Fake MCP server starts answering: (name, generation) → (due, up).
    pub(super) mcp_starts: BTreeMap<(String, u64), (Instant, bool)>,
    /// Fake MCP calls in flight: tool item id → (due, server, the server dies).
    pub(super) mcp_calls: BTreeMap<String, (Instant, (String, u64), bool)>,
    /// Sequence number of the boot (or, once dead, of the death).
    pub(super) since: u64,
    pub(super) to_runtime: VecDeque<(u64, Memo<ToWorker>)>,
    pub(super) to_server: VecDeque<(u64, Memo<FromWorker>)>,
}

impl FakeWorker {
    /// The runtime, once the session is open.
    pub(super) fn runtime(&self) -> Option<&Runtime> {
        self.host.as_ref()?.runtime()
    }
}

/// An operation being given to a worker while facts are recorded.
#[derive(Debug, Clone)]
pub(super) struct WatchedOp {
    op: OpId,
    /// The outcome the worker answered within the same step.
    outcome: Option<Result<(), ErrorCode>>,
    /// A storage write failed within that step.
    store_failed: bool,
}

impl World {
    pub(super) fn on_spawn(&mut self, worker: WorkerId, session_id: String, creating: bool) {
        let short = self.names_session(&session_id);
        let kind = if creating { "create" } else { "open" };
        if self.fail_spawns {
            trace!(self, "server spawn {worker} for {short} ({kind}) fails");
            let error = "simulated spawn failure".to_string();
            self.push(Input::WorkerSpawnFailed { worker, error });
            return;
        }
        trace!(self, "server spawn {worker} for {short} ({kind})");
        if self.options.record_facts {
            let orphan_holds = self.orphans.keys().any(|o| {
                self.workers
                    .get(o)
                    .is_some_and(|w| w.session_id == session_id)
            });
            let expected_since = self.expected_since;
            self.fact(Fact::Spawned {
                session_id: session_id.clone(),
                orphan_holds,
                expected_since,
            });
        }
        let since = self.next_seq();
        let token = format!("token-{}", worker.0);
        let fake = FakeWorker {
            session_id,
            token: token.clone(),
            stage: WorkerStage::Booting,
            host: Memo::new(None),
            wrong_id: None,
            stream: None,
            tools: BTreeMap::new(),
            mcp_starts: BTreeMap::new(),
            mcp_calls: BTreeMap::new(),
            asked: Default::default(),
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

    /// The worker opens (or creates) its session and reports ready, or fails.
    pub(super) fn boot_worker(&mut self, worker: WorkerId) {
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
                    policy: Self::worker_policy(),
                    limits: self.worker_limits(),
                    observe: self.options.record_facts,
                };
                let (host, hello) = WorkerHost::new(config, self.now);
                let w = self.workers.get_mut(&worker).expect("booting");
                *w.host = Some(host);
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
        let notice = |p: &Persist| matches!(p, Persist::Item(TranscriptItem::Assistant(a)) if kernel::runtime::notice_text(a).is_some());
        if batch.iter().any(notice) {
            self.reached.insert(super::Milestone::McpNotice);
        }
        for p in batch {
            if let Err(message) = self.store.apply(&id, p) {
                trace!(self, "{worker} storage write failed: {message}");
                self.reached.insert(super::Milestone::StoreFailed);
                if let Some(watched) = self.watched_op.as_mut() {
                    watched.store_failed = true;
                }
                if self.options.record_facts {
                    let session_id = id.clone();
                    self.fact(Fact::StoreFailed { session_id });
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
                .push_back((seq, Memo::new(message)));
        } else {
            self.push(Input::FromWorker {
                worker,
                message: Box::new(message),
            });
        }
    }

    /// A message from the server reaches a worker's host.
    pub(super) fn worker_receive(&mut self, worker: WorkerId, message: ToWorker) {
        if let ToWorker::Operation { op, operation } = message {
            return self.worker_operation(worker, op, operation);
        }
        if matches!(message, ToWorker::Dispose)
            && let Some((prng, ratio)) = self.hang.as_mut()
            && prng.chance(*ratio)
            && let Some(w) = self.workers.get_mut(&worker)
            && w.host.is_some()
        {
            // Stuck in its last write: no more reads, answers or deadlines,
            // but the process lives until the server kills it.
            *w.host = None;
            w.stream = None;
            w.tools.clear();
            w.mcp_starts.clear();
            w.mcp_calls.clear();
            w.to_runtime.clear();
            trace!(self, "{worker} hangs instead of disposing");
            self.reached.insert(super::Milestone::WorkerHung);
            return;
        }
        self.host_step(worker, HostInput::Frame(WorkerFrame::ToWorker(message)));
    }

    fn worker_operation(&mut self, worker: WorkerId, op: OpId, operation: Operation) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.host.is_some() {
            w.asked.insert(op);
        }
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
        let held = self
            .workers
            .get(&worker)
            .and_then(|w| w.host.as_ref())
            .is_some_and(|h| h.holds(op));
        if held {
            // Judged when the runtime takes it ([`World::host_step`]).
            return;
        }
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

    pub(super) fn host_step(&mut self, worker: WorkerId, input: HostInput) {
        let now = self.now;
        let orphan = self.orphans.contains_key(&worker);
        let Some(host) = self.workers.get_mut(&worker).and_then(|w| w.host.as_mut()) else {
            return;
        };
        let before = match host.runtime() {
            Some(runtime) if orphan && self.options.record_facts => interrupted_items(runtime),
            _ => 0,
        };
        let outputs = host.step(now, input);
        self.interrupted_before_step = before;
        self.note_released(worker);
        self.apply_host(worker, outputs);
    }

    /// Records, before anything they caused is carried out, the operations
    /// that waited for the MCP servers and that the runtime just took.
    fn note_released(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let Some(host) = w.host.as_mut() else {
            return;
        };
        let released = host.take_released();
        let session_id = w.session_id.clone();
        for r in released {
            self.fact(Fact::RuntimeOp {
                worker,
                session_id: session_id.clone(),
                op: r.op,
                operation: r.operation,
                phase_before: r.phase_before,
                immediate: r.immediate,
                // Its answer is taken from the runtime's own step, before
                // any write of it could fail.
                store_failed: false,
            });
        }
    }

    /// Carries out a worker host's outputs; the fake store answers at once,
    /// and what the host says next is carried out too.
    pub(super) fn apply_host(&mut self, worker: WorkerId, outputs: Vec<HostOutput>) {
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
                // The fake store holds no session of pi's own server, so
                // nothing is ever adopted; an adoption would be a create.
                HostOutput::CreateStore(stored) | HostOutput::AdoptStore(stored) => {
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
                HostOutput::LoadMcp => Some(HostInput::Mcp(McpInput::Configure(self.mcp_layers()))),
                HostOutput::Mcp(McpOutput::Start { generation, config }) => {
                    self.mcp_start(worker, config.name, generation);
                    None
                }
                HostOutput::Mcp(McpOutput::Stop { name, generation }) => {
                    let w = self.workers.get_mut(&worker).expect("live");
                    w.mcp_starts.remove(&(name, generation));
                    None
                }
                HostOutput::Mcp(McpOutput::Notice(_)) | HostOutput::RecordMcp(_) => None,
                HostOutput::CallMcp {
                    id,
                    server,
                    generation,
                    ..
                } => {
                    let dies = self.mcp_fault();
                    let due = self.now + self.options.tool_delay;
                    let w = self.workers.get_mut(&worker).expect("live");
                    w.mcp_calls.insert(id, (due, (server, generation), dies));
                    None
                }
                HostOutput::StartModel { call, request, .. } => {
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
                        Some(pid) => {
                            trace!(self, "orphan pid {} retires", pid - ORPHAN_BASE);
                            self.reached.insert(super::Milestone::OrphanRetired);
                            if self.options.record_facts
                                && let Some(&orphaned_at) = self.orphaned_at.get(&worker)
                            {
                                let after =
                                    self.workers[&worker].runtime().map_or(0, interrupted_items);
                                let session_id = self.workers[&worker].session_id.clone();
                                self.fact(Fact::OrphanRetired {
                                    session_id,
                                    orphaned_at,
                                    at: self.now,
                                    interrupted: after > self.interrupted_before_step,
                                });
                            }
                        }
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
                self.note_released(worker);
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
            snapshot.head_mut().id = id;
        }
        if let FromWorker::OpDone { op, .. } = &*message
            && let Some(w) = self.workers.get_mut(&worker)
            && !w.asked.remove(op)
            && self.options.record_facts
        {
            let op = *op;
            self.fact(Fact::UnaskedAnswer { worker, op });
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
    pub(super) fn exit_worker(&mut self, worker: WorkerId) {
        if self.orphans.remove(&worker).is_some() {
            self.orphaned_at.remove(&worker);
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
        *w.host = None;
        w.stream = None;
        w.tools.clear();
        w.mcp_starts.clear();
        w.mcp_calls.clear();
        w.to_runtime.clear();
        w.since = since;
        if !self.options.holds.exit && w.to_server.is_empty() {
            self.report_exit(worker);
        }
    }

    /// The server learns that the worker exited; whatever it still had in
    /// flight is lost.
    pub(super) fn report_exit(&mut self, worker: WorkerId) {
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
        let Some((call, stream)) = self.workers.get_mut(&worker).and_then(|w| w.stream.take())
        else {
            return;
        };
        let live = stream.next_deadline().is_some();
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
        if self.options.record_facts {
            let phase_after = self.runtime_phase(worker);
            let session_id = self.workers[&worker].session_id.clone();
            self.fact(Fact::ModelFailed {
                worker,
                session_id,
                retryable,
                live,
                phase_after,
            });
        }
        self.run();
    }

    /// Delivers what is due in a worker: model events, finished tool runs, a runtime tick.
    pub(super) fn fire_worker(&mut self, worker: WorkerId) {
        let now = self.now;
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if let Some((call, stream)) = w.stream.as_mut() {
            let call = *call;
            for event in stream.step(now) {
                let done = matches!(event, ModelEvent::Done { .. });
                self.host_step(worker, HostInput::Model { call, event });
                if done && self.options.record_facts {
                    self.model_done(worker);
                }
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
        self.mcp_due(worker, now);
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

    /// The sessions' MCP configuration: two fake servers when
    /// [`super::Options::mcp`] is on, else none.
    fn mcp_layers(&self) -> Vec<Layer> {
        if self.mcp.is_none() {
            return Vec::new();
        }
        let server = || Value::Map(vec![("command".into(), Value::text("fake"))]);
        let servers = Value::Map(vec![("s0".into(), server()), ("s1".into(), server())]);
        vec![Layer {
            source: "sim".into(),
            servers: Some(servers),
        }]
    }

    /// Whether this MCP start or call goes wrong.
    fn mcp_fault(&mut self) -> bool {
        self.mcp
            .as_mut()
            .is_some_and(|(prng, ratio)| prng.chance(*ratio))
    }

    /// A fake MCP server starts: up with one tool `t` after the tool delay,
    /// or (a fault) failed then, or never answering (the host's deadline).
    fn mcp_start(&mut self, worker: WorkerId, name: String, generation: u64) {
        let wrong = self.mcp_fault();
        let hangs = wrong && self.mcp.as_mut().is_some_and(|(prng, _)| prng.coin());
        if hangs {
            trace!(self, "{worker} MCP server {name} never starts");
            return;
        }
        let due = self.now + self.options.tool_delay;
        let w = self.workers.get_mut(&worker).expect("live");
        w.mcp_starts.insert((name, generation), (due, !wrong));
    }

    /// Answers the fake MCP starts and calls that are due.
    fn mcp_due(&mut self, worker: WorkerId, now: Instant) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let starts: Vec<_> = w
            .mcp_starts
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(k, (_, up))| (k.clone(), *up))
            .collect();
        let calls: Vec<_> = w
            .mcp_calls
            .iter()
            .filter(|(_, (at, _, _))| *at <= now)
            .map(|(id, (_, server, dies))| (id.clone(), server.clone(), *dies))
            .collect();
        for ((name, generation), up) in starts {
            let Some(w) = self.workers.get_mut(&worker) else {
                return;
            };
            w.mcp_starts.remove(&(name.clone(), generation));
            let input = if up {
                let schema = Value::Map(vec![("type".into(), Value::text("object"))]);
                let tools = vec![ListedTool {
                    name: "t".into(),
                    description: None,
                    schema,
                }];
                McpInput::Started {
                    name,
                    generation,
                    tools,
                }
            } else {
                let reason = "simulated start failure".into();
                McpInput::Failed {
                    name,
                    generation,
                    reason,
                }
            };
            self.host_step(worker, HostInput::Mcp(input));
        }
        for (id, (name, generation), dies) in calls {
            let Some(w) = self.workers.get_mut(&worker) else {
                return;
            };
            if w.mcp_calls.remove(&id).is_none() {
                continue;
            }
            if dies {
                let reason = "simulated death".into();
                let failed = McpInput::Failed {
                    name: name.clone(),
                    generation,
                    reason,
                };
                self.host_step(worker, HostInput::Mcp(failed));
            }
            let text = if dies {
                format!("MCP server {name} died")
            } else {
                self.reached.insert(super::Milestone::McpCalled);
                format!("fake MCP output for {id}")
            };
            let input = HostInput::ToolDone {
                id,
                content: vec![Content::Text { text }],
                details: None,
                is_error: dies,
            };
            self.host_step(worker, input);
        }
    }

    /// True when the worker has a model call streaming.
    /// Records [`Fact::ModelDone`] for `worker`'s call that just finished.
    fn model_done(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let session_id = w.session_id.clone();
        let (phase_after, unanswered) = match w.runtime() {
            Some(runtime) => {
                let transcript = &runtime.state().transcript;
                let last_reply = transcript
                    .iter()
                    .rposition(|i| matches!(i, TranscriptItem::Assistant(_)));
                let after = last_reply.map_or(0, |i| i + 1);
                let unanswered = transcript[after..]
                    .iter()
                    .filter(|i| matches!(i, TranscriptItem::User(_)))
                    .count();
                (Some(runtime.phase()), unanswered)
            }
            None => (None, 0),
        };
        self.fact(Fact::ModelDone {
            worker,
            session_id,
            phase_after,
            unanswered,
        });
    }

    /// The phase of the runtime `worker` runs, once it opened its session.
    pub fn runtime_phase(&self, worker: WorkerId) -> Option<SessionPhase> {
        let host = self.workers.get(&worker)?.host.as_ref()?;
        host.runtime().map(|r| r.phase())
    }

    /// The revision of the session `worker`'s runtime holds, once open.
    pub fn runtime_revision(&self, worker: WorkerId) -> Option<u64> {
        let host = self.workers.get(&worker)?.host.as_ref()?;
        host.runtime().map(|r| r.state().revision)
    }

    pub fn is_streaming(&self, worker: WorkerId) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.stream.is_some())
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
    /// Orphans idle past their grace (counted from the loss of their
    /// server, with one announcement's retry to notice): each should have
    /// retired, whatever it announced meanwhile.
    pub fn overdue_orphans(&self) -> Vec<(WorkerId, Instant)> {
        let limits = self.worker_limits();
        self.orphaned_at
            .iter()
            .filter(|(key, since)| {
                self.now >= **since + limits.orphan_grace + limits.announce_retry
                    && self.workers.get(key).is_some_and(|w| {
                        w.stage == WorkerStage::Running
                            && w.runtime().is_some_and(|r| r.phase() == SessionPhase::Idle)
                    })
            })
            .map(|(key, since)| (*key, *since))
            .collect()
    }

    pub fn workers(&self) -> Vec<(WorkerId, &str, WorkerStage, Option<SessionPhase>)> {
        let phase = |w: &FakeWorker| w.runtime().map(Runtime::phase);
        self.workers
            .iter()
            .map(|(id, w)| (*id, w.session_id.as_str(), w.stage, phase(w)))
            .collect()
    }
}

/// Transcript items a runtime marked interrupted (its worker stopped before
/// they finished).
fn interrupted_items(runtime: &Runtime) -> usize {
    let interrupted = |content: &[Content]| {
        content
            .iter()
            .any(|c| matches!(c, Content::Text { text } if text.starts_with(kernel::runtime::INTERRUPTED)))
    };
    runtime
        .state()
        .transcript
        .iter()
        .filter(|item| match item {
            TranscriptItem::Assistant(a) => {
                a.error_message.as_deref() == Some(kernel::runtime::INTERRUPTED)
            }
            TranscriptItem::Tool(t) => interrupted(&t.content),
            _ => false,
        })
        .count()
}
