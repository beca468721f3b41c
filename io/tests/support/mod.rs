//! Test support: a loopback pi server for a turmoil host.
//!
//! It carries out the kernel's outputs the way `io/src/daemon.rs` does — one
//! task owns [`Server`] and `select!`s over one bounded event channel and
//! the next deadline; per connection a reader task and a writer task that
//! batches frames and reports [`Input::Written`]; a protocol close flushes
//! first, every other close drops the connection at once — with two
//! substitutions turmoil forces: the listener is `turmoil::net::TcpListener`
//! instead of a Unix socket, and each worker is an in-process
//! [`Runtime`] (as in `sim/src/world.rs`) with the faux model and an
//! in-memory store instead of a `pi-server worker` process with SQLite.
//! Kernel time is the simulation's time in milliseconds. The store lives in
//! the host's future, so a crashed and bounced server starts empty.

use kernel::faux::{self, FauxStream};
use kernel::ids::{ConnId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::{ErrorCode, ProtocolError};
use kernel::runtime::{Runtime, RuntimeInput, RuntimeOutput, StoredSession};
use kernel::server::{Config, Frame, Input, Output, Server};
use kernel::time::Instant;
use kernel::worker::{CreateSpec, FromWorker, ToWorker};
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use turmoil::net::{TcpListener, TcpStream};

/// The port the loopback server listens on.
pub(crate) const PORT: u16 = 7447;

/// Lines noted during a run, each prefixed with the simulation time in ms.
pub(crate) type Log = Arc<Mutex<Vec<String>>>;

/// Notes `line` at the current simulation time.
pub(crate) fn note(log: &Log, line: impl Into<String>) {
    let ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
    log.lock().unwrap().push(format!("{ms:>6} {}", line.into()));
}

/// How the loopback server runs.
#[derive(Clone)]
pub(crate) struct Options {
    /// Seeds the kernel's ids.
    pub(crate) seed: u64,
    /// The kernel's bounds and deadlines.
    pub(crate) limits: Limits,
    /// Time between two events of a faux model reply.
    pub(crate) faux_delay: Duration,
    /// Every kernel step is noted here (input → outputs).
    pub(crate) log: Log,
}

enum Event {
    Accepted(TcpStream),
    Received { conn: ConnId, bytes: Vec<u8> },
    ReadClosed { conn: ConnId },
    Written { conn: ConnId, bytes: usize },
    WriterClosed { conn: ConnId },
}

enum WriterMsg {
    Frame(Frame),
    Close,
}

struct Conn {
    writer: mpsc::UnboundedSender<WriterMsg>,
    reader: JoinHandle<()>,
    writer_task: JoinHandle<()>,
}

struct Worker {
    session_id: String,
    runtime: Runtime,
    stream: Option<(u64, FauxStream)>,
}

struct Loopback {
    options: Options,
    server: Server,
    base: tokio::time::Instant,
    base_ms: u64,
    events: mpsc::Sender<Event>,
    conns: BTreeMap<ConnId, Conn>,
    workers: BTreeMap<WorkerId, Worker>,
    store: BTreeMap<String, StoredSession>,
    next_conn: u64,
    accept: Option<JoinHandle<()>>,
    inputs: VecDeque<Input>,
    stepping: bool,
    done: bool,
}

/// Serves pi protocol v1 on [`PORT`] until the kernel completes a shutdown
/// (or the host crashes). Use as `sim.host("server", move || serve(options.clone()))`.
pub(crate) async fn serve(options: Options) -> turmoil::Result {
    let listener = TcpListener::bind((IpAddr::from(Ipv4Addr::UNSPECIFIED), PORT)).await?;
    let (events, mut rx) = mpsc::channel(1024);
    let tx = events.clone();
    let accept = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            if tx.send(Event::Accepted(stream)).await.is_err() {
                return;
            }
        }
    });
    let server = Server::new(Config {
        server_id: "00000000-0000-4000-8000-000000007447".into(),
        token: None,
        seed: options.seed,
        models: faux::models(),
        limits: options.limits.clone(),
        idle_exit: None,
        adoption_grace: Duration::from_secs(30),
    });
    let base_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
    let mut lb = Loopback {
        options,
        server,
        base: tokio::time::Instant::now(),
        base_ms,
        events,
        conns: BTreeMap::new(),
        workers: BTreeMap::new(),
        store: BTreeMap::new(),
        next_conn: 1,
        accept: Some(accept),
        inputs: VecDeque::new(),
        stepping: false,
        done: false,
    };
    lb.step(Input::CatalogLoaded {
        sessions: Vec::new(),
    });
    while !lb.done {
        let deadline = lb.next_deadline().map(|at| lb.tokio_instant(at));
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // `biased`: tokio's own choice is random unless built with `tokio_unstable`.
        tokio::select! {
            biased;
            Some(event) = rx.recv() => lb.on_event(event),
            () = sleep => lb.on_deadline(),
        }
    }
    Ok(())
}

impl Loopback {
    fn now(&self) -> Instant {
        Instant(self.base_ms + self.base.elapsed().as_millis() as u64)
    }

    fn tokio_instant(&self, at: Instant) -> tokio::time::Instant {
        self.base + Duration::from_millis(at.0.saturating_sub(self.base_ms))
    }

    /// The kernel's deadline or a faux reply's next event, whichever is first.
    fn next_deadline(&self) -> Option<Instant> {
        let workers = self.workers.values().filter_map(|w| {
            let model = w.stream.as_ref().and_then(|(_, s)| s.next_deadline());
            model.into_iter().chain(w.runtime.next_deadline()).min()
        });
        self.server.next_deadline().into_iter().chain(workers).min()
    }

    /// As the daemon: inputs that arise while outputs are carried out are
    /// queued and fed afterwards, so outputs are never interleaved.
    fn step(&mut self, input: Input) {
        self.inputs.push_back(input);
        if self.stepping {
            return;
        }
        self.stepping = true;
        while let Some(input) = self.inputs.pop_front() {
            let what = describe(&input);
            let outputs = self.server.step(self.now(), input);
            let done: Vec<String> = outputs.iter().map(describe_output).collect();
            note(&self.options.log, format!("{what} → [{}]", done.join(", ")));
            for output in outputs {
                self.carry_out(output);
            }
        }
        self.stepping = false;
    }

    fn on_deadline(&mut self) {
        let now = self.now();
        if self.server.next_deadline().is_some_and(|at| at <= now) {
            self.step(Input::Tick);
        }
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for id in ids {
            let Some((call, stream)) = self.workers.get_mut(&id).and_then(|w| w.stream.as_mut())
            else {
                continue;
            };
            let call = *call;
            for event in stream.step(now) {
                self.runtime_step(id, RuntimeInput::Model { call, event });
            }
            let tick = self
                .workers
                .get(&id)
                .and_then(|w| w.runtime.next_deadline());
            if tick.is_some_and(|at| at <= now) {
                self.runtime_step(id, RuntimeInput::Tick);
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Accepted(stream) => self.on_accepted(stream),
            Event::Received { conn, bytes } => self.step(Input::Received { conn, bytes }),
            Event::ReadClosed { conn } => {
                if self.server.ends_on_read_close(conn) {
                    self.drop_conn(conn);
                }
            }
            Event::Written { conn, bytes } => {
                if self.conns.contains_key(&conn) {
                    self.step(Input::Written { conn, bytes });
                }
            }
            Event::WriterClosed { conn } => self.drop_conn(conn),
        }
    }

    fn on_accepted(&mut self, stream: TcpStream) {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        let (mut read, mut write) = stream.into_split();
        let tx = self.events.clone();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = read.read(&mut buf).await {
                let bytes = buf[..n].to_vec();
                if tx.send(Event::Received { conn, bytes }).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::ReadClosed { conn }).await;
        });
        let (writer, mut frames) = mpsc::unbounded_channel::<WriterMsg>();
        let tx = self.events.clone();
        let writer_task = tokio::spawn(async move {
            'outer: while let Some(first) = frames.recv().await {
                let (mut batch, mut close, mut next) = (Vec::new(), false, Some(first));
                while let Some(msg) = next {
                    match msg {
                        WriterMsg::Frame(frame) => batch.push(frame),
                        WriterMsg::Close => {
                            close = true;
                            break;
                        }
                    }
                    next = if batch.len() < 256 {
                        frames.try_recv().ok()
                    } else {
                        None
                    };
                }
                let mut bytes = 0;
                for frame in &batch {
                    if write.write_all(frame).await.is_err() {
                        break 'outer;
                    }
                    bytes += frame.len();
                }
                if bytes > 0 && tx.send(Event::Written { conn, bytes }).await.is_err() {
                    return;
                }
                if close {
                    let _ = tokio::time::timeout(Duration::from_secs(2), write.shutdown()).await;
                    break;
                }
            }
            let _ = tx.send(Event::WriterClosed { conn }).await;
        });
        let tasks = Conn {
            writer,
            reader,
            writer_task,
        };
        self.conns.insert(conn, tasks);
        self.step(Input::Accepted { conn });
    }

    /// The connection is gone: stop its tasks and tell the kernel (once).
    fn drop_conn(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            c.reader.abort();
            c.writer_task.abort();
            self.step(Input::Disconnected { conn });
        }
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::Send { conn, frame } => {
                if let Some(c) = self.conns.get(&conn) {
                    let _ = c.writer.send(WriterMsg::Frame(frame));
                }
            }
            Output::Close { conn, reason } => {
                if !reason.flushes_first() {
                    return self.drop_conn(conn);
                }
                if let Some(c) = self.conns.get(&conn) {
                    let _ = c.writer.send(WriterMsg::Close);
                }
            }
            Output::SpawnWorker {
                worker,
                session_id,
                create,
                ..
            } => self.spawn_worker(worker, session_id, create),
            Output::ToWorker { worker, message } => {
                let input = match message {
                    ToWorker::Operation { op, operation } => {
                        RuntimeInput::Operation { op, operation }
                    }
                    ToWorker::Dispose => RuntimeInput::Dispose,
                };
                self.runtime_step(worker, input);
            }
            Output::KillWorker { worker } => self.exit_worker(worker),
            Output::RemoveSession { session_id } => {
                self.store.remove(&session_id);
                self.step(Input::SessionRemoved {
                    session_id,
                    result: Ok(()),
                });
            }
            Output::StopAccepting => {
                if let Some(accept) = self.accept.take() {
                    accept.abort();
                }
            }
            Output::ShutdownComplete => self.done = true,
            other @ (Output::AdoptWorker { .. }
            | Output::StartWorker { .. }
            | Output::RejectWorker { .. }
            | Output::ReleaseWorker { .. }
            | Output::ScanCatalog { .. }) => {
                unreachable!(
                    "no worker says hello or is announced, no hand-off requested and the catalog \
                     never changes: {other:?}"
                )
            }
        }
    }

    /// The worker "process" starts and opens (or creates) its session at once.
    fn spawn_worker(&mut self, worker: WorkerId, session_id: String, create: Option<CreateSpec>) {
        self.step(Input::WorkerSpawned {
            worker,
            token: String::new(),
        });
        let (now, models) = (self.now(), faux::models());
        let opened = match create {
            Some(spec) => Runtime::resolve_create(&spec, &faux::default_model(), &models).map(
                |(model, thinking_level)| {
                    let stored = StoredSession {
                        id: session_id.clone(),
                        name: spec.name,
                        cwd: spec.cwd.unwrap_or_else(|| "/loopback".into()),
                        created_at: now.0,
                        updated_at: now.0,
                        model,
                        thinking_level,
                        revision: 0,
                        transcript: Vec::new(),
                        queued_steer: Vec::new(),
                        summary: None,
                    };
                    self.store.insert(session_id.clone(), stored.clone());
                    Runtime::create(stored, models, now)
                },
            ),
            None => match self.store.get(&session_id) {
                Some(stored) => Ok(Runtime::open(stored.clone(), models, now)),
                None => Err(ProtocolError::new(ErrorCode::NotFound, "Session not found")),
            },
        };
        match opened {
            Ok((runtime, outputs)) => {
                let w = Worker {
                    session_id,
                    runtime,
                    stream: None,
                };
                self.workers.insert(worker, w);
                self.apply_runtime(worker, outputs);
            }
            Err(error) => {
                let message = Box::new(FromWorker::Failed { error });
                self.step(Input::FromWorker { worker, message });
                self.step(Input::WorkerExited { worker });
            }
        }
    }

    fn runtime_step(&mut self, worker: WorkerId, input: RuntimeInput) {
        let now = self.now();
        if let Some(w) = self.workers.get_mut(&worker) {
            let outputs = w.runtime.step(now, input);
            self.apply_runtime(worker, outputs);
        }
    }

    /// Carries out a runtime's outputs as `io/src/worker.rs` would, in order.
    fn apply_runtime(&mut self, worker: WorkerId, outputs: Vec<RuntimeOutput>) {
        for output in outputs {
            let now = self.now();
            let w = self.workers.get_mut(&worker).expect("a live worker");
            match output {
                RuntimeOutput::Persist(p) => {
                    let s = self.store.get_mut(&w.session_id).expect("a stored session");
                    s.apply(&p);
                }
                RuntimeOutput::Send(message) => {
                    let message = Box::new(message);
                    self.step(Input::FromWorker { worker, message });
                }
                RuntimeOutput::StartModel { call, request } => {
                    let stream = FauxStream::start(&request, now, self.options.faux_delay);
                    w.stream = Some((call, stream));
                }
                RuntimeOutput::CancelModel { .. } => w.stream = None,
                RuntimeOutput::RunTool { tool_name, .. } => {
                    unimplemented!("the loopback server runs no tools (asked for {tool_name})")
                }
                RuntimeOutput::CancelTool { .. } => {}
                RuntimeOutput::Exit => return self.exit_worker(worker),
            }
        }
    }

    fn exit_worker(&mut self, worker: WorkerId) {
        if self.workers.remove(&worker).is_some() {
            self.step(Input::WorkerExited { worker });
        }
    }
}

fn describe(input: &Input) -> String {
    match input {
        Input::Tick => "tick".into(),
        Input::Accepted { conn } => format!("{conn} accepted"),
        Input::Received { conn, bytes } => format!("{conn} received {}B", bytes.len()),
        Input::Written { conn, bytes } => format!("{conn} wrote {bytes}B"),
        Input::Disconnected { conn } => format!("{conn} disconnected"),
        Input::WorkerSpawned { worker, .. } => format!("{worker} spawned"),
        Input::WorkerExited { worker } => format!("{worker} exited"),
        Input::FromWorker { worker, message } => {
            let kind = match message.as_ref() {
                FromWorker::Ready { .. } => "ready",
                FromWorker::Failed { .. } => "failed",
                FromWorker::Snapshot { .. } => "snapshot",
                FromWorker::Progress { .. } => "progress",
                FromWorker::OpDone { .. } => "op done",
                FromWorker::Fatal { .. } => "fatal",
            };
            format!("{worker} {kind}")
        }
        other => {
            let text = format!("{other:?}");
            text.chars().take(60).collect()
        }
    }
}

fn describe_output(output: &Output) -> String {
    match output {
        Output::Send { conn, frame } => format!("send {conn} {}B", frame.len()),
        Output::Close { conn, reason } => format!("close {conn} ({reason})"),
        Output::SpawnWorker { worker, create, .. } => {
            format!(
                "spawn {worker} ({})",
                if create.is_some() { "create" } else { "open" }
            )
        }
        Output::ToWorker { worker, message } => match message {
            ToWorker::Operation { operation, .. } => format!("{worker} ← {}", operation.name()),
            ToWorker::Dispose => format!("{worker} ← dispose"),
        },
        other => format!("{other:?}"),
    }
}
