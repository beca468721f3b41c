//! A fake world around the real kernel: scripted clients speaking bytes, fake
//! worker processes running the real [`Runtime`] with the faux provider, a
//! fake durable store, and virtual time.
//!
//! Everything is delivered through one FIFO of server inputs, so a run is a
//! pure function of the calls made on the world. Scenario scripts call it
//! directly; the swarm drives it from a seed.

use crate::summary::{self, Names};
use kernel::faux::{self, FauxStream};
use kernel::ids::{ConnId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::{
    ClientHello, ClientMessage, Command, ErrorCode, ProtocolError, Request, ServerMessage,
    SessionMetadata, decode_server_message, encode_client_message,
};
use kernel::runtime::{Persist, Runtime, RuntimeInput, RuntimeOutput, StoredSession};
use kernel::server::{Config, Input, Output, Server};
use kernel::time::Instant;
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{CborLimits, FrameDecoder};
use kernel::worker::{FromWorker, ToWorker};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// The server id every simulated server reports.
pub const SERVER_ID: &str = "00000000-0000-4000-8000-000000000001";

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
    /// Record progress deltas in the trace (they are many).
    pub trace_deltas: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            seed: 1,
            token: None,
            limits: Limits::default(),
            faux_delay: Duration::from_millis(10),
            trace_deltas: false,
        }
    }
}

/// The fake durable store: what survives workers and servers.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// Sessions by id.
    pub sessions: BTreeMap<String, StoredSession>,
    /// When set, every write fails.
    pub fail_writes: bool,
}

impl Store {
    fn apply(&mut self, id: &str, p: &Persist) -> Result<(), String> {
        if self.fail_writes {
            return Err("simulated storage write failure".into());
        }
        let s = self.sessions.get_mut(id).ok_or("session directory is gone")?;
        match p {
            Persist::Item(item) => match s.transcript.iter_mut().find(|i| i.id() == item.id()) {
                Some(existing) => *existing = item.clone(),
                None => s.transcript.push(item.clone()),
            },
            Persist::State { revision, updated_at, model, thinking_level, queued_steer } => {
                s.revision = *revision;
                s.updated_at = *updated_at;
                s.model = model.clone();
                s.thinking_level = *thinking_level;
                s.queued_steer = queued_steer.clone();
            }
        }
        Ok(())
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
}

#[derive(Debug)]
struct FakeWorker {
    session_id: String,
    runtime: Option<Runtime>,
    stream: Option<(u64, FauxStream)>,
}

/// One scripted client: a byte-level peer of the server.
#[derive(Debug)]
pub struct Client {
    decoder: FrameDecoder,
    /// Every message received, in order.
    pub received: Vec<ServerMessage>,
    /// The server closed it (or it disconnected).
    pub closed: bool,
    /// When false, the client does not read: output piles up in the server.
    pub reading: bool,
    unread: usize,
    next_request: u64,
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
    /// One line per input and output.
    pub trace: Vec<String>,
    /// Behaviour of the next workers to open, by session id (`""` = any).
    pub worker_scripts: BTreeMap<String, WorkerScript>,
    options: Options,
    workers: BTreeMap<WorkerId, FakeWorker>,
    clients: BTreeMap<ConnId, Client>,
    inbox: VecDeque<Input>,
    next_conn: u64,
    server_generation: u64,
}

impl World {
    /// A world with an empty store and a server whose catalog is loaded.
    pub fn new(options: Options) -> Self {
        let server = Server::new(Self::config(&options, 0));
        let mut world = Self {
            now: Instant(0),
            server,
            store: Store::default(),
            names: Names::default(),
            trace: Vec::new(),
            worker_scripts: BTreeMap::new(),
            options,
            workers: BTreeMap::new(),
            clients: BTreeMap::new(),
            inbox: VecDeque::new(),
            next_conn: 1,
            server_generation: 0,
        };
        world.load_catalog();
        world
    }

    fn config(options: &Options, generation: u64) -> Config {
        Config {
            server_id: SERVER_ID.to_string(),
            token: options.token.clone(),
            seed: options.seed.wrapping_add(generation.wrapping_mul(0x9e37_79b9)),
            models: faux::models(),
            limits: options.limits.clone(),
            idle_exit: None,
        }
    }

    /// Feeds the store's catalog to the server.
    pub fn load_catalog(&mut self) {
        let sessions = self.store.catalog();
        self.log(format!("server catalog loaded ({} sessions)", sessions.len()));
        self.push(Input::CatalogLoaded { sessions });
        self.run();
    }

    fn log(&mut self, line: String) {
        self.trace.push(format!("{} {line}", self.now));
    }

    fn push(&mut self, input: Input) {
        self.inbox.push_back(input);
    }

    /// Delivers every queued input and carries out every output until quiet.
    pub fn run(&mut self) {
        while let Some(input) = self.inbox.pop_front() {
            let outputs = self.server.step(self.now, input);
            for output in outputs {
                self.carry_out(output);
            }
        }
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::Send { conn, frame } => self.deliver(conn, &frame),
            Output::Close { conn, reason } => {
                self.log(format!("{conn} closed by server ({reason})"));
                if let Some(c) = self.clients.get_mut(&conn) {
                    c.closed = true;
                }
                self.push(Input::Disconnected { conn });
            }
            Output::SpawnWorker { worker, session_id, create } => {
                let short = self.names.session(&session_id);
                let kind = if create.is_some() { "create" } else { "open" };
                self.log(format!("server spawn {worker} for {short} ({kind})"));
                self.workers.insert(worker, FakeWorker { session_id: session_id.clone(), runtime: None, stream: None });
                self.push(Input::WorkerSpawned { worker });
                self.start_worker(worker, session_id, create);
            }
            Output::ToWorker { worker, message } => {
                self.log(format!("{worker} ← {}", summary::to_worker(&message)));
                let input = match message {
                    ToWorker::Operation { op, operation } => RuntimeInput::Operation { op, operation },
                    ToWorker::Dispose => RuntimeInput::Dispose,
                };
                self.runtime_step(worker, input);
            }
            Output::KillWorker { worker } => {
                self.log(format!("server kill {worker}"));
                self.exit_worker(worker);
            }
            Output::RemoveSession { session_id } => {
                let short = self.names.session(&session_id);
                self.log(format!("server remove {short} from store"));
                let result = match self.store.sessions.remove(&session_id) {
                    Some(_) => Ok(()),
                    None => Err("no such session directory".to_string()),
                };
                self.push(Input::SessionRemoved { session_id, result });
            }
            Output::StopAccepting => self.log("server stops accepting".into()),
            Output::ShutdownComplete => self.log("server shutdown complete".into()),
        }
    }

    fn deliver(&mut self, conn: ConnId, frame: &[u8]) {
        let Some(client) = self.clients.get_mut(&conn) else { return };
        let mut payloads = Vec::new();
        client.decoder.push(frame, &mut payloads).expect("the server sends valid frames");
        let mut lines = Vec::new();
        for payload in payloads {
            let message = decode_server_message(&payload, &CborLimits::default()).expect("the server sends valid messages");
            let is_delta = matches!(
                &message,
                ServerMessage::Event(kernel::protocol::ServerEvent::SessionProgress {
                    progress: kernel::protocol::TranscriptProgress::AssistantDelta { .. },
                    ..
                })
            );
            if !is_delta || self.options.trace_deltas {
                lines.push(summary::server(&mut self.names, &message));
            }
            client.received.push(message);
        }
        let reading = client.reading;
        if reading {
            self.push(Input::Written { conn, bytes: frame.len() });
        } else {
            client.unread += frame.len();
        }
        for line in lines {
            self.log(format!("{conn} ← {line}"));
        }
    }

    // ---- workers -----------------------------------------------------------

    fn start_worker(&mut self, worker: WorkerId, session_id: String, create: Option<kernel::worker::CreateSpec>) {
        let script = self
            .worker_scripts
            .get(&session_id)
            .or_else(|| self.worker_scripts.get(""))
            .cloned()
            .unwrap_or_default();
        let locked = self.workers.iter().any(|(w, f)| *w != worker && f.session_id == session_id && f.runtime.is_some());
        let message = match script {
            WorkerScript::Hang => return self.log(format!("{worker} hangs while opening")),
            WorkerScript::Fail(code, message) => FromWorker::Failed { error: ProtocolError::new(code, message) },
            _ if locked => FromWorker::Failed {
                error: ProtocolError::new(ErrorCode::SessionLocked, format!("Session is locked by another worker: {session_id}")),
            },
            script => {
                let outputs = match self.open_runtime(worker, &session_id, create) {
                    Ok(outputs) => outputs,
                    Err(error) => return self.worker_says(worker, FromWorker::Failed { error }, true),
                };
                if let WorkerScript::WrongId(id) = script {
                    let mut snapshot = self.workers[&worker].runtime.as_ref().expect("opened").snapshot();
                    snapshot.id = id;
                    self.apply_runtime(worker, outputs.into_iter().filter(|o| !matches!(o, RuntimeOutput::Send(_))).collect());
                    return self.worker_says(worker, FromWorker::Ready { snapshot }, false);
                }
                return self.apply_runtime(worker, outputs);
            }
        };
        self.worker_says(worker, message, true);
    }

    fn open_runtime(
        &mut self,
        worker: WorkerId,
        session_id: &str,
        create: Option<kernel::worker::CreateSpec>,
    ) -> Result<Vec<RuntimeOutput>, ProtocolError> {
        let models = faux::models();
        let now = self.now;
        let (runtime, outputs) = match create {
            Some(spec) => {
                let (model, thinking_level) = Runtime::resolve_create(&spec, &faux::default_model(), &models)?;
                let stored = StoredSession {
                    id: session_id.to_string(),
                    name: spec.name,
                    cwd: spec.cwd.unwrap_or_else(|| "/home/sim".into()),
                    created_at: now.as_millis(),
                    updated_at: now.as_millis(),
                    model,
                    thinking_level,
                    revision: 0,
                    transcript: Vec::new(),
                    queued_steer: Vec::new(),
                };
                self.store.sessions.insert(session_id.to_string(), stored.clone());
                Runtime::create(stored, models, now)
            }
            None => {
                let stored = self.store.sessions.get(session_id).cloned().ok_or_else(|| {
                    ProtocolError::new(ErrorCode::NotFound, format!("Session not found: {session_id}"))
                })?;
                Runtime::open(stored, models, now)
            }
        };
        self.workers.get_mut(&worker).expect("spawned").runtime = Some(runtime);
        Ok(outputs)
    }

    fn worker_says(&mut self, worker: WorkerId, message: FromWorker, then_exit: bool) {
        let line = summary::from_worker(&mut self.names, &message);
        self.log(format!("{worker} → {line}"));
        self.push(Input::FromWorker { worker, message: Box::new(message) });
        if then_exit {
            self.exit_worker(worker);
        }
    }

    fn runtime_step(&mut self, worker: WorkerId, input: RuntimeInput) {
        let now = self.now;
        let Some(runtime) = self.workers.get_mut(&worker).and_then(|w| w.runtime.as_mut()) else { return };
        let outputs = runtime.step(now, input);
        self.apply_runtime(worker, outputs);
    }

    fn apply_runtime(&mut self, worker: WorkerId, outputs: Vec<RuntimeOutput>) {
        for output in outputs {
            match output {
                RuntimeOutput::Persist(p) => {
                    let id = self.workers[&worker].session_id.clone();
                    if let Err(message) = self.store.apply(&id, &p) {
                        self.log(format!("{worker} storage write failed: {message}"));
                        return self.runtime_step(worker, RuntimeInput::StorageFailed { message });
                    }
                }
                RuntimeOutput::Send(message) => {
                    let is_delta = matches!(
                        &message,
                        FromWorker::Progress { progress: kernel::protocol::TranscriptProgress::AssistantDelta { .. } }
                    );
                    if !is_delta || self.options.trace_deltas {
                        let line = summary::from_worker(&mut self.names, &message);
                        self.log(format!("{worker} → {line}"));
                    }
                    self.push(Input::FromWorker { worker, message: Box::new(message) });
                }
                RuntimeOutput::StartModel { call, request } => {
                    let stream = FauxStream::start(&request, self.now, self.options.faux_delay);
                    self.workers.get_mut(&worker).expect("live").stream = Some((call, stream));
                }
                RuntimeOutput::CancelModel { .. } => self.workers.get_mut(&worker).expect("live").stream = None,
                RuntimeOutput::Exit => {
                    self.log(format!("{worker} exits"));
                    return self.exit_worker(worker);
                }
            }
        }
    }

    fn exit_worker(&mut self, worker: WorkerId) {
        if self.workers.remove(&worker).is_some() {
            self.push(Input::WorkerExited { worker });
        }
    }

    /// Kills a worker process abruptly (SIGKILL): nothing is flushed beyond what was persisted.
    pub fn crash_worker(&mut self, worker: WorkerId) {
        self.log(format!("{worker} crashes"));
        self.exit_worker(worker);
        self.run();
    }

    /// The live worker of a session, if any.
    pub fn worker_of(&self, session_id: &str) -> Option<WorkerId> {
        self.workers.iter().find(|(_, w)| w.session_id == session_id).map(|(id, _)| *id)
    }

    /// Number of fake worker processes alive.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    // ---- time --------------------------------------------------------------

    /// The earliest pending deadline of the server or a model stream.
    pub fn next_event(&self) -> Option<Instant> {
        let streams = self.workers.values().filter_map(|w| w.stream.as_ref()?.1.next_deadline());
        self.server.next_deadline().into_iter().chain(streams).min()
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

    fn fire_due(&mut self) {
        let now = self.now;
        if self.server.next_deadline().is_some_and(|d| d <= now) {
            self.push(Input::Tick);
            self.run();
        }
        let due: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| w.stream.as_ref().is_some_and(|(_, s)| s.next_deadline().is_some_and(|d| d <= now)))
            .map(|(id, _)| *id)
            .collect();
        for worker in due {
            let Some((call, events)) = self
                .workers
                .get_mut(&worker)
                .and_then(|w| w.stream.as_mut())
                .map(|(call, s)| (*call, s.poll(now)))
            else {
                continue;
            };
            for event in events {
                self.runtime_step(worker, RuntimeInput::Model { call, event });
            }
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

    // ---- clients -----------------------------------------------------------

    /// Opens a connection; returns its id.
    pub fn connect(&mut self) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.clients.insert(
            conn,
            Client {
                decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_LEN),
                received: Vec::new(),
                closed: false,
                reading: true,
                unread: 0,
                next_request: 1,
            },
        );
        self.log(format!("{conn} connects"));
        self.push(Input::Accepted { conn });
        self.run();
        conn
    }

    /// Sends raw bytes.
    pub fn send_bytes(&mut self, conn: ConnId, bytes: Vec<u8>) {
        self.log(format!("{conn} → {} raw bytes", bytes.len()));
        self.push(Input::Received { conn, bytes });
        self.run();
    }

    /// Sends one message.
    pub fn send(&mut self, conn: ConnId, message: &ClientMessage) {
        let line = summary::client(&mut self.names, message);
        self.log(format!("{conn} → {line}"));
        let payload = encode_client_message(message).expect("encodable");
        let bytes = encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("fits");
        self.push(Input::Received { conn, bytes });
        self.run();
    }

    /// Sends `hello` (with the token, if any).
    pub fn hello(&mut self, conn: ConnId, version: u64, token: Option<&str>) {
        self.send(conn, &ClientMessage::Hello(ClientHello { version, token: token.map(str::to_string) }));
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
        self.send(conn, &ClientMessage::Request(Request { id: id.clone(), command }));
        id
    }

    /// The client disconnects.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.log(format!("{conn} disconnects"));
        if let Some(c) = self.clients.get_mut(&conn) {
            c.closed = true;
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
            self.push(Input::Written { conn, bytes: unread });
            self.run();
        }
    }

    /// A client's state.
    pub fn client(&self, conn: ConnId) -> &Client {
        &self.clients[&conn]
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
            Some(Ok(kernel::protocol::CommandResult::Create { session })) => session.id.clone(),
            other => panic!("request {id} did not create a session: {other:?}"),
        }
    }

    // ---- server lifecycle --------------------------------------------------

    /// Graceful close of the server.
    pub fn shutdown(&mut self) {
        self.log("server shutdown requested".into());
        self.push(Input::Shutdown);
        self.run();
    }

    /// The server process dies and a new one starts on the same store. Every
    /// client is disconnected and every worker dies with it.
    pub fn restart_server(&mut self) {
        self.log("server crashes and restarts".into());
        self.inbox.clear();
        let workers: Vec<WorkerId> = self.workers.keys().copied().collect();
        for w in workers {
            self.workers.remove(&w);
        }
        for c in self.clients.values_mut() {
            c.closed = true;
        }
        self.server_generation += 1;
        self.server = Server::new(Self::config(&self.options, self.server_generation));
        self.load_catalog();
    }

    /// The trace as one string.
    pub fn trace_text(&self) -> String {
        self.trace.join("\n") + "\n"
    }
}
