//! `pi-server serve`: one task owns the kernel [`Server`] and turns
//! everything that happens (accepts, bytes, writes, worker frames, process
//! exits, timers, signals) into kernel inputs, then carries out the outputs.
//! It makes no protocol decisions.
//!
//! Tasks around the loop: the public and worker accept loops, one writer per
//! client connection, one reader and one writer per worker channel, one
//! waiter per worker process, and blocking-pool jobs for the catalog scan
//! and session removal. They talk to the loop through one bounded event
//! channel (the worker readers block when the loop falls behind) and are
//! talked to through per-task channels whose size the kernel already bounds.
//!
//! The loop reads client connections itself: a socket that becomes readable
//! wakes the loop through a waker of its own ([`Readiness`]), which queues
//! the connection; the loop then reads each queued connection (at most
//! [`READS_PER_TURN`] times a turn, then it goes to the back of the queue).
//! A request therefore costs no task hand-off and no copy through a channel
//! (BENCHMARKS.md, item 1, P9), and the loop reads only as fast as it handles
//! what it read.
//!
//! Client output takes a short path: the loop gathers the frames of the
//! events it handles per connection (shared, not copied) and writes them to
//! the socket itself, in one non-blocking vectored write. Only what the socket does not take at once goes to the
//! connection's writer task, which waits for the socket to drain; while it
//! holds bytes, later frames queue behind them, so the order is kept. A
//! request whose answer fits the socket buffer therefore costs no task
//! hand-off at all (BENCHMARKS.md, item 1).
//!
//! The loop ([`run_on`]) is generic over the [`Platform`] it runs on: the
//! real one ([`Native`]: Unix sockets, TCP, worker processes) in `serve`, a
//! simulated one in the turmoil tests. [`bind`] and [`run`] are the real
//! server's two halves.

mod platform;
mod workers;

use platform::advance;
pub use platform::{ClientSocket, Conn, Listener, Native, NativeClients, Platform, Spawned};
use workers::{accept_workers, read_worker_hello};

use crate::duplex::Duplex;
use crate::socket;
use kernel::ids::{ChannelId, ConnId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::worker::{WorkerFrame, decode_worker_frame, frame_worker_message};
use kernel::server::{CloseReason, Config, Frame, Input, Output, Server};
use kernel::wire::{CborLimits, FrameDecoder};
use kernel::worker::CreateSpec;
use pi_config as config;
use pi_store as store;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::limits::{ACCEPT_RETRY, EVENT_BATCH, LOOP_EVENTS, READS_PER_TURN};
pub use pi_config::{ServeOptions, WebAccess};

/// The tracing target of the kernel's steps (`input → [outputs]`, at trace
/// level): `RUST_LOG=pi_server::steps=trace` shows every decision.
pub const STEPS: &str = "pi_server::steps";

/// Where consecutive flushes start in the list of connections to write: a
/// stride prime to the usual audience sizes, so the start moves around the
/// list.
const FLUSH_STRIDE: usize = 61;

/// The client connections whose sockets became readable, in the order they
/// did, and the loop's waker. Shared with each connection's [`ReadWaker`]
/// (the runtime may wake from another thread).
#[derive(Default)]
struct Readiness {
    inner: Mutex<ReadyQueue>,
}

#[derive(Default)]
struct ReadyQueue {
    conns: Vec<ConnId>,
    loop_waker: Option<Waker>,
}

impl Readiness {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyQueue> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Resolves when a connection is queued. It spends the task's budget
    /// like tokio's own resources: a read that ran out of budget queues its
    /// connection again, and the loop must then yield to the runtime rather
    /// than find it queued at once, forever.
    fn wait(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx: &mut Context<'_>| {
            let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
            let mut queue = self.lock();
            if queue.conns.is_empty() {
                queue.loop_waker = Some(cx.waker().clone());
                Poll::Pending
            } else {
                coop.made_progress();
                Poll::Ready(())
            }
        })
    }

    /// Swaps the queued connections (in order) into `into`, which must be
    /// empty: the queue keeps `into`'s room for the next ones.
    fn take_into(&self, into: &mut Vec<ConnId>) {
        debug_assert!(into.is_empty());
        std::mem::swap(&mut self.lock().conns, into);
    }
}

/// A client connection's read waker: queues the connection (once until the
/// loop takes it) and wakes the loop.
struct ReadWaker {
    conn: ConnId,
    queued: AtomicBool,
    readiness: Arc<Readiness>,
}

impl Wake for ReadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let waker = {
            let mut queue = self.readiness.lock();
            queue.conns.push(self.conn);
            queue.loop_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

// A worker frame is moved into the kernel's input, which boxes it once; boxing
// it here as well would cost a second allocation per frame on the hot path.
#[allow(clippy::large_enum_variant)]
enum Event<P: Platform> {
    Accepted(P::Conn),
    /// The stored sessions, and those of them a live orphan of a crashed
    /// server with our id still holds (it will announce itself to us).
    CatalogLoaded(
        Vec<kernel::protocol::SessionMetadata>,
        Vec<kernel::server::StoredDetails>,
        Vec<String>,
    ),
    /// The writer task wrote `chunks` hand-offs, `bytes` in all.
    Written {
        conn: ConnId,
        bytes: usize,
        chunks: usize,
    },
    WriterClosed {
        conn: ConnId,
    },
    WorkerHello {
        stream: P::Channel,
        token: String,
        session_id: String,
        pid: u64,
        version: u64,
        resume: Option<Box<kernel::protocol::PackedSnapshot>>,
    },
    HandoffRequested {
        stream: P::Channel,
    },
    FromWorker {
        worker: WorkerId,
        frame: WorkerFrame,
    },
    WorkerChannelClosed {
        worker: WorkerId,
    },
    WorkerExited {
        worker: WorkerId,
        status: String,
    },
    SessionRemoved {
        session_id: String,
        result: Result<(), String>,
    },
    /// The session directory changed (see `store::watch`).
    CatalogChanged,
    CatalogScanned {
        scan: u64,
        sessions: Vec<kernel::protocol::SessionMetadata>,
        models: Vec<kernel::server::StoredDetails>,
    },
}

enum WriterMsg {
    /// Frames the socket did not take at once, in order; the first `skip`
    /// bytes of the first are already written.
    Frames(Vec<Frame>, usize),
    /// Flush, then end the stream.
    Close,
}

struct ClientConn<C> {
    socket: Arc<C>,
    /// Bounded by the kernel's output bound ([`writer_capacity`]): never full.
    writer: mpsc::Sender<WriterMsg>,
    /// Hand-offs to the writer not yet reported written; while any is out,
    /// the loop must not write to the socket itself.
    handed: usize,
    /// This step's frames, gathered (shared, not copied: a snapshot
    /// broadcast to 100 clients is one buffer); written when the step's
    /// inputs are done.
    out: Vec<Frame>,
    /// Queues this connection when its socket becomes readable.
    read_waker: Arc<ReadWaker>,
    /// The peer ended its direction (or reading failed): not read again.
    read_closed: bool,
    writer_task: JoinHandle<()>,
}

impl<C> ClientConn<C> {
    /// Queues on the writer task.
    fn hand(&mut self, msg: WriterMsg) {
        if matches!(msg, WriterMsg::Frames(..)) {
            self.handed += 1;
        }
        match self.writer.try_send(msg) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                unreachable!("a connection's writer holds more than the kernel's output bound")
            }
        }
    }
}

/// Messages a connection's writer can hold: every hand-off carries at least
/// one unwritten frame header of the bytes the kernel counts against
/// `max_output_bytes_per_connection` until they are written, plus the close.
fn writer_capacity(limits: &Limits) -> usize {
    limits.max_output_bytes_per_connection / kernel::wire::frame::FRAME_HEADER_LEN + 2
}

struct WorkerProc {
    session_id: String,
    pid: Option<u32>,
    /// A worker that is a task of ours, not a process.
    task: Option<tokio::task::AbortHandle>,
    /// Bounded ([`worker_writer_capacity`]): never full.
    channel: Option<mpsc::Sender<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
    queued: Vec<Vec<u8>>,
    /// Adopted from another server: not our child, so its channel closing is its exit.
    adopted: bool,
    /// Set when our child exited; reported once its channel is drained.
    exit_status: Option<String>,
}

struct Daemon<P: Platform> {
    platform: P,
    session_dir: PathBuf,
    server: Server,
    base: tokio::time::Instant,
    events: mpsc::Sender<Event<P>>,
    conns: BTreeMap<ConnId, ClientConn<P::Conn>>,
    workers: BTreeMap<WorkerId, WorkerProc>,
    next_conn: u64,
    /// The socket files, removed when we stop serving (none on a simulated platform).
    public_path: Option<PathBuf>,
    worker_path: Option<PathBuf>,
    client_accepts: Vec<JoinHandle<()>>,
    worker_accept: Option<JoinHandle<()>>,
    /// Worker channels announcing an orphan, waiting for the kernel's verdict.
    announced: BTreeMap<ChannelId, (P::Channel, u64)>,
    next_channel: u64,
    /// The new server waiting for this one to hand over.
    successor: Option<P::Channel>,
    sockets_removed: bool,
    /// Sessions whose workers were handed over to a successor.
    released: Vec<String>,
    /// Tasks of connections closed during a hand-off (awaited before answering).
    dropped: Vec<JoinHandle<()>>,
    /// Inputs waiting while outputs are carried out (see `step`).
    inputs: std::collections::VecDeque<Input>,
    /// The outputs of the step being carried out (kept for its capacity).
    outputs: Vec<Output>,
    /// The connections taken from [`Readiness`] (kept for its capacity).
    ready: Vec<ConnId>,
    /// Connections with gathered output to write (see `flush`).
    dirty: Vec<ConnId>,
    /// Flushes so far: where each flush starts in `dirty` (see `flush`).
    flushes: usize,
    /// Client connections ready to be read.
    readiness: Arc<Readiness>,
    /// Handling a batch of events: their output is written after the last.
    deferring: bool,
    stepping: bool,
    done: bool,
    /// Workers with work under way that a stop let go on as orphans: a
    /// second stop request kills them too.
    let_go: Vec<(Option<u32>, Option<tokio::task::AbortHandle>)>,
    stopping: bool,
    /// Watches the session directory while it lives (`None`: polled).
    _catalog_watch: Option<Box<dyn Send>>,
    /// A `CatalogChanged` is queued and not handled yet: the watcher sends
    /// no other, so a burst of changes is one event in the queue.
    catalog_change_queued: Arc<AtomicBool>,
}

/// Asks the server running at `worker_path` to hand over to us, and waits
/// until it has released its workers and freed its sockets.
async fn request_handoff(worker_path: &std::path::Path) -> Result<Vec<String>, String> {
    let mut stream = UnixStream::connect(worker_path).await.map_err(|e| {
        format!(
            "a server is running but its worker socket {} does not answer: {e}",
            worker_path.display()
        )
    })?;
    let frame = WorkerFrame::Replace {
        version: kernel::protocol::worker::WORKER_PROTOCOL_VERSION,
    };
    let bytes = frame_worker_message(&frame).map_err(|e| e.to_string())?;
    stream
        .write_all(&bytes)
        .await
        .map_err(|e| format!("cannot ask the running server to hand over: {e}"))?;
    // Before this server's own configuration exists: the default bounds.
    let Limits {
        max_frame_len,
        handoff_timeout,
        ..
    } = Limits::default();
    let answer = read_worker_hello(stream, max_frame_len as usize);
    match tokio::time::timeout(handoff_timeout, answer).await {
        Ok(Ok((_, WorkerFrame::Released { sessions }))) => Ok(sessions),
        Ok(Ok((_, other))) => Err(format!(
            "the running server answered the hand-off with {other:?}"
        )),
        Ok(Err(e)) => Err(format!("the running server did not hand over: {e}")),
        Err(_) => Err(format!(
            "the running server did not hand over within {} s",
            handoff_timeout.as_secs()
        )),
    }
}

/// Runs a server until it is shut down (signal, or idle exit).
/// Serves until stopped by SIGTERM or SIGINT (a second one stops at once).
pub async fn serve(opts: ServeOptions) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let bound = bind(opts).await?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let (stop, stops) = mpsc::channel(2);
    let signals = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sigterm.recv() => {}
                _ = sigint.recv() => {}
            }
            if stop.send(()).await.is_err() {
                return;
            }
        }
    });
    let result = run(bound, stops).await;
    signals.abort();
    result
}

/// A server that holds its sockets and has taken over from its predecessor,
/// and serves nothing yet ([`bind`], then [`run`]).
pub struct Bound {
    opts: ServeOptions,
    public: UnixListener,
    workers: UnixListener,
    tcp: Option<tokio::net::TcpListener>,
    web: Option<tokio::net::TcpListener>,
    public_path: PathBuf,
    worker_path: PathBuf,
    /// Sessions whose workers the predecessor released to us.
    released: Vec<String>,
}

/// Checks the options, makes the directories, takes over from a running
/// server with this id (hand-off) and binds every socket. On failure no
/// socket is left behind.
pub async fn bind(opts: ServeOptions) -> Result<Bound, String> {
    if (opts.listen_tcp.is_some() || opts.listen_web.is_some()) && opts.token.is_none() {
        // Refused before anything is bound or created.
        let what = if opts.listen_tcp.is_some() {
            "a TCP"
        } else {
            "a web"
        };
        return Err(format!(
            "{what} listener is reachable by other users and machines: it needs --token-file"
        ));
    }
    config::ensure_private_dir(&opts.server_dir)?;
    std::fs::create_dir_all(&opts.session_dir).map_err(|e| {
        format!(
            "cannot create session directory {}: {e}",
            opts.session_dir.display()
        )
    })?;
    let public_path = config::socket_path(&opts.server_dir, &opts.server_id);
    let worker_path = config::worker_socket_path(&opts.server_dir, &opts.server_id);
    let mut released = Vec::new();
    if socket::is_live(&public_path) {
        tracing::info!(socket = %public_path.display(), "a server with this id is running; asking it to hand over");
        released = request_handoff(&worker_path).await?;
        tracing::info!("the previous server handed over");
    }
    let public = socket::bind(&public_path).map_err(|e| e.to_string())?;
    let workers = match socket::bind(&worker_path) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_file(&public_path);
            return Err(e.to_string());
        }
    };
    let public = UnixListener::from_std(public).map_err(|e| e.to_string())?;
    let workers = UnixListener::from_std(workers).map_err(|e| e.to_string())?;
    let bound = async {
        let tcp = bind_remote(opts.listen_tcp.as_deref(), "tcp").await?;
        let web = bind_remote(opts.listen_web.as_deref(), "http").await?;
        Ok::<_, String>((tcp, web))
    };
    let (tcp, web) = match bound.await {
        Ok(listeners) => listeners,
        Err(e) => {
            // Leave no socket behind that nobody serves.
            let _ = std::fs::remove_file(&public_path);
            let _ = std::fs::remove_file(&worker_path);
            return Err(e);
        }
    };
    Ok(Bound {
        opts,
        public,
        workers,
        tcp,
        web,
        public_path,
        worker_path,
        released,
    })
}

/// Binds a remote listener (`tcp` or `http`) at `addr`, if one is asked for.
async fn bind_remote(
    addr: Option<&str>,
    scheme: &str,
) -> Result<Option<tokio::net::TcpListener>, String> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    tokio::net::TcpListener::bind(addr)
        .await
        .map(Some)
        .map_err(|e| format!("cannot listen on {scheme}://{addr}: {e}"))
}

/// Serves on `bound` until the kernel completes a shutdown. Each message on
/// `stop` is a request to stop: the first shuts down gracefully, a second
/// stops at once.
pub async fn run(bound: Bound, stop: mpsc::Receiver<()>) -> Result<(), String> {
    let Bound {
        opts,
        public,
        workers,
        tcp,
        web,
        public_path,
        worker_path,
        released,
    } = bound;
    tracing::info!(server_id = %opts.server_id, socket = %public_path.display(), sessions = %opts.session_dir.display(), "serving");
    let mut clients = vec![NativeClients::Unix(public)];
    if let Some(listener) = tcp {
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(address = %local, "accepting remote clients (token required)");
        clients.push(NativeClients::Tcp(listener));
    }
    // Worker tokens come from the OS CSPRNG with no fallback: without it
    // the server does not start, rather than hand out guessable ones.
    config::secret().map_err(|e| format!("cannot start: {e}"))?;
    let config = Config {
        server_id: opts.server_id.clone(),
        token: opts.token.clone(),
        // With a network listener the token guards it; the socket keeps its
        // file permissions as its guard. Without one, the token was given
        // for the socket.
        local_token: opts.listen_tcp.is_none() && opts.listen_web.is_none(),
        // The kernel's ids are not secrets.
        seed: config::random_u64(),
        models: pi_agent::ModelRegistry::load(&config::agent_dir())
            .models()
            .to_vec(),
        limits: Limits {
            adoption_wait: env_duration_ms(
                "PI_SERVER_ADOPTION_WAIT_MS",
                Limits::default().adoption_wait,
            ),
            adoption_grace: env_duration_ms(
                "PI_SERVER_ADOPTION_GRACE_MS",
                Limits::default().adoption_grace,
            ),
            ..Limits::default()
        },
        idle_exit: opts.idle_exit,
    };
    if let Some(listener) = web {
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        let proxies: Vec<kernel::ids::PeerAddr> = opts
            .web_access
            .proxies
            .iter()
            .map(|ip| kernel::ids::PeerAddr(ip.to_string()))
            .collect();
        let policy = kernel::web::WebPolicy::for_listener(
            &crate::web::listen_addr(local),
            false,
            &opts.web_access.hosts,
            &opts.web_access.origins,
            &proxies,
        );
        tracing::info!(address = %local, "serving the web client (token required)");
        clients.push(NativeClients::Web(crate::web::serve(
            listener,
            policy,
            config.limits.max_frame_len,
            &opts.server_id,
        )));
    }
    let serving = Serving {
        platform: Native {
            worker_path: worker_path.clone(),
            session_dir: opts.session_dir.clone(),
        },
        config,
        session_dir: opts.session_dir,
        clients,
        workers,
        public_path: Some(public_path),
        worker_path: Some(worker_path),
        released,
    };
    run_on(serving, stop).await
}

/// What [`run_on`] serves with: the platform, the kernel's configuration,
/// and listeners that are bound already.
pub struct Serving<P: Platform> {
    /// The machine.
    pub platform: P,
    /// The kernel server's configuration.
    pub config: Config,
    /// Where the sessions are stored (the catalog is scanned there).
    pub session_dir: PathBuf,
    /// Client listeners.
    pub clients: Vec<P::Clients>,
    /// The worker listener.
    pub workers: P::Workers,
    /// The client socket's file, removed when accepting stops.
    pub public_path: Option<PathBuf>,
    /// The worker socket's file, removed at the end. Orphans of a crashed
    /// server name it in their session locks.
    pub worker_path: Option<PathBuf>,
    /// Sessions whose workers a predecessor released to us.
    pub released: Vec<String>,
}

/// The loop: serves until the kernel completes a shutdown. Each message on
/// `stop` is a request to stop: the first shuts down gracefully, a second
/// stops at once.
pub async fn run_on<P: Platform>(
    serving: Serving<P>,
    mut stop: mpsc::Receiver<()>,
) -> Result<(), String> {
    let Serving {
        platform,
        config,
        session_dir,
        clients,
        workers,
        public_path,
        worker_path,
        released,
    } = serving;
    let (tx, mut rx) = mpsc::channel::<Event<P>>(LOOP_EVENTS);
    let server = Server::new(config);
    let client_accepts = clients
        .into_iter()
        .map(|listener| tokio::spawn(accept_clients::<P>(listener, tx.clone())))
        .collect();
    let limits = &server.config().limits;
    let worker_accept = Some(tokio::spawn(accept_workers::<P>(
        workers,
        tx.clone(),
        limits.max_frame_len as usize,
        limits.worker_hello_timeout,
    )));
    // Watch before the first scan, so no change falls between the two.
    let catalog_change_queued = Arc::new(AtomicBool::new(false));
    let (catalog_watch, unwatched) =
        watch_catalog(&platform, &session_dir, &catalog_change_queued, &tx);
    load_catalog(&platform, &session_dir, worker_path.clone(), tx.clone());

    let mut d = Daemon {
        platform,
        session_dir,
        server,
        base: tokio::time::Instant::now(),
        events: tx,
        conns: BTreeMap::new(),
        workers: BTreeMap::new(),
        next_conn: 1,
        public_path,
        worker_path,
        client_accepts,
        worker_accept,
        announced: BTreeMap::new(),
        next_channel: 1,
        successor: None,
        sockets_removed: false,
        released: Vec::new(),
        dropped: Vec::new(),
        inputs: Default::default(),
        outputs: Vec::new(),
        ready: Vec::new(),
        dirty: Vec::new(),
        flushes: 0,
        readiness: Arc::default(),
        deferring: false,
        stepping: false,
        done: false,
        let_go: Vec::new(),
        stopping: false,
        _catalog_watch: catalog_watch,
        catalog_change_queued,
    };
    if let Some(e) = unwatched {
        tracing::warn!(
            "{e}; polling it instead, every {} ms",
            d.server.config().limits.catalog_poll.as_millis()
        );
        d.step(Input::CatalogUnwatched);
    }
    d.expect_adoptions(released, "the released workers");
    let mut stops = 0;
    while !d.done {
        let deadline = d
            .server
            .next_deadline()
            .map(|at| d.base + Duration::from_millis(at.as_millis()));
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let readiness = Arc::clone(&d.readiness);
        // `biased`: the order is the listed one, so a simulated run replays
        // exactly (tokio's own choice is random).
        tokio::select! {
            biased;
            Some(event) = rx.recv() => d.batch(Some(event), &mut rx),
            () = readiness.wait() => d.batch(None, &mut rx),
            () = sleep => d.step(Input::Tick),
            Some(()) = stop.recv() => { stops += 1; d.on_stop(stops) }
        }
    }
    if let Some(task) = d.worker_accept.take() {
        task.abort();
    }
    d.cleanup_sockets();
    if let Some(successor) = d.successor.take() {
        hand_over(successor, &mut d).await?;
    }
    tracing::info!("server stopped");
    Ok(())
}

/// Follows the session directory: a change queues one catalog event (no
/// more until the loop takes it). `Err` when it cannot be watched.
fn watch_catalog<P: Platform>(
    platform: &P,
    session_dir: &std::path::Path,
    queued: &Arc<AtomicBool>,
    tx: &mpsc::Sender<Event<P>>,
) -> (Option<Box<dyn Send>>, Option<String>) {
    let queued = Arc::clone(queued);
    let tx = tx.clone();
    let watch = platform.watch(
        session_dir,
        Box::new(move || {
            if !queued.swap(true, Ordering::AcqRel) {
                let _ = tx.blocking_send(Event::CatalogChanged);
            }
        }),
    );
    match watch {
        Ok(watch) => (Some(watch), None),
        Err(e) => (None, Some(e)),
    }
}

/// Scans the session directory once, off the loop: the sessions, their
/// models, and those whose live worker is one of ours (orphans to expect).
fn load_catalog<P: Platform>(
    platform: &P,
    session_dir: &std::path::Path,
    our_workers: Option<PathBuf>,
    tx: mpsc::Sender<Event<P>>,
) {
    let scan_dir = session_dir.to_path_buf();
    let scan = platform.blocking(move || {
        let (sessions, models) = store::scan_catalog_with_models(&scan_dir);
        let orphans = sessions
            .iter()
            .filter(|m| {
                our_workers.as_deref().is_some_and(|ours| {
                    store::live_holder(&scan_dir, &m.id)
                        .is_some_and(|h| h.server.as_deref() == Some(ours))
                })
            })
            .map(|m| m.id.clone())
            .collect();
        Event::CatalogLoaded(sessions, models, orphans)
    });
    tokio::spawn(async move {
        let _ = tx.send(scan.await).await;
    });
}

/// Answers the server that replaces this one, once our sockets are gone
/// and every worker is released: it may bind now.
async fn hand_over<P: Platform>(
    mut successor: P::Channel,
    d: &mut Daemon<P>,
) -> Result<(), String> {
    // Aborted connection tasks drop their sockets when they finish: wait
    // for that, so no client of ours is still connected when the successor binds.
    for task in std::mem::take(&mut d.dropped) {
        let _ = task.await;
    }
    let sessions = std::mem::take(&mut d.released);
    let bytes =
        frame_worker_message(&WorkerFrame::Released { sessions }).map_err(|e| e.to_string())?;
    successor
        .write_all(&bytes)
        .await
        .map_err(|e| format!("cannot answer the successor: {e}"))?;
    tracing::info!("handed over to the new server");
    Ok(())
}

async fn accept_clients<P: Platform>(mut listener: P::Clients, tx: mpsc::Sender<Event<P>>) {
    loop {
        match listener.accept().await {
            Ok(conn) => {
                if tx.send(Event::Accepted(conn)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_RETRY).await;
            }
        }
    }
}

impl<P: Platform> Daemon<P> {
    fn now(&self) -> kernel::time::Instant {
        kernel::time::Instant(self.base.elapsed().as_millis() as u64)
    }

    /// Feeds one input and carries out the outputs, in order. Inputs that
    /// arise while outputs are being carried out (a connection dropped, a
    /// spawn failed) are queued and fed afterwards, so outputs are never
    /// interleaved across steps. When no input is left, the gathered client
    /// output is written ([`Daemon::flush`]), which may report writes.
    fn step(&mut self, input: Input) {
        self.inputs.push_back(input);
        if !self.stepping {
            self.drain();
        }
    }

    /// Feeds the queued inputs, then (unless deferring) writes the gathered
    /// output and feeds what the writes report.
    /// Events that are already waiting, and client connections that are
    /// ready to be read, are handled together, and their output written
    /// once: in a burst (a model streaming to many clients) that is one
    /// write per client per batch, not per event. Alone, an event is
    /// written at once.
    fn batch(&mut self, first: Option<Event<P>>, rx: &mut mpsc::Receiver<Event<P>>) {
        self.deferring = true;
        if let Some(event) = first {
            self.on_event(event);
        }
        self.read_clients();
        for _ in 1..EVENT_BATCH {
            let Ok(event) = rx.try_recv() else { break };
            self.on_event(event);
        }
        self.deferring = false;
        self.drain();
    }

    fn drain(&mut self) {
        self.stepping = true;
        loop {
            while let Some(input) = self.inputs.pop_front() {
                let now = self.now();
                let traced = tracing::enabled!(target: STEPS, tracing::Level::TRACE)
                    .then(|| input.to_string());
                let mut outputs = std::mem::take(&mut self.outputs);
                self.server.step_into(now, input, &mut outputs);
                if let Some(input) = traced {
                    let done: Vec<String> = outputs.iter().map(ToString::to_string).collect();
                    tracing::trace!(target: STEPS, "{input} → [{}]", done.join(", "));
                }
                for output in outputs.drain(..) {
                    self.carry_out(output);
                }
                self.outputs = outputs;
            }
            if self.deferring {
                break;
            }
            self.flush();
            if self.inputs.is_empty() {
                break;
            }
        }
        self.stepping = false;
    }

    /// Writes each connection's gathered output: straight to the socket if
    /// its writer holds nothing and the socket takes it; the rest goes to
    /// the writer, behind what it holds.
    ///
    /// Each flush starts at another connection (a fixed stride through the
    /// list): when the loop's thread loses its CPU in the middle of a flush
    /// to many connections, the ones after that point wait, and with a fixed
    /// order those would be the same connections every time.
    fn flush(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        if dirty.len() > 1 {
            let start = self.flushes.wrapping_mul(FLUSH_STRIDE) % dirty.len();
            dirty.rotate_left(start);
        }
        self.flushes = self.flushes.wrapping_add(1);
        for conn in dirty {
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            if c.out.is_empty() {
                continue;
            }
            let written = if c.handed > 0 {
                Ok(0)
            } else {
                match c.socket.try_write_frames(&c.out, 0) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
                    other => other,
                }
            };
            match written {
                Ok(n) => {
                    // Written whole, `out` keeps its room for the next flush.
                    let mut skip = 0;
                    advance(&mut c.out, &mut skip, n);
                    if !c.out.is_empty() {
                        let rest = std::mem::take(&mut c.out);
                        c.hand(WriterMsg::Frames(rest, skip));
                    }
                    if n > 0 {
                        self.inputs.push_back(Input::Written { conn, bytes: n });
                    }
                }
                Err(e) => {
                    tracing::debug!(%conn, error = %e, "client connection write failed");
                    self.drop_conn(conn);
                }
            }
        }
    }

    fn on_stop(&mut self, count: u32) {
        if count == 1 {
            tracing::info!(
                "shutting down; running turns go on in their workers for the next server (signal again to stop everything at once)"
            );
            self.stopping = true;
            self.step(Input::Shutdown);
        } else {
            tracing::warn!("second stop request: stopping now");
            for w in self.workers.values() {
                self.platform.kill_worker(w.pid, w.task.as_ref());
            }
            for (pid, task) in &self.let_go {
                self.platform.kill_worker(*pid, task.as_ref());
            }
            self.done = true;
        }
    }

    /// The workers of `sessions` (`whose`, for the log) will announce
    /// themselves: attaches to them wait for that.
    fn expect_adoptions(&mut self, sessions: Vec<String>, whose: &str) {
        if sessions.is_empty() {
            return;
        }
        tracing::info!(
            count = sessions.len(),
            "expecting {whose} to announce themselves"
        );
        self.step(Input::AdoptionsExpected { sessions });
    }

    fn on_event(&mut self, event: Event<P>) {
        match event {
            Event::Accepted(stream) => self.on_accepted(stream),
            Event::CatalogLoaded(sessions, models, orphans) => {
                tracing::info!(count = sessions.len(), "session catalog loaded");
                self.expect_adoptions(orphans, "live workers of a crashed server");
                self.step(Input::CatalogLoaded { sessions, models });
            }
            Event::Written {
                conn,
                bytes,
                chunks,
            } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.handed -= chunks;
                    self.step(Input::Written { conn, bytes });
                }
            }
            Event::WriterClosed { conn } => self.drop_conn(conn),
            Event::WorkerHello {
                stream,
                token,
                session_id,
                pid,
                resume: None,
                ..
            } => {
                let channel = ChannelId(self.next_channel);
                self.next_channel += 1;
                self.announced.insert(channel, (stream, pid));
                self.step(Input::WorkerHello {
                    channel,
                    session_id,
                    token,
                    pid,
                });
            }
            Event::WorkerHello {
                stream,
                session_id,
                pid,
                version,
                resume: Some(snapshot),
                ..
            } => {
                let channel = ChannelId(self.next_channel);
                self.next_channel += 1;
                tracing::info!(session = %session_id, pid, "an orphaned worker asks to be adopted");
                self.announced.insert(channel, (stream, pid));
                self.step(Input::WorkerAnnounced {
                    channel,
                    session_id,
                    pid,
                    version,
                    snapshot,
                });
            }
            Event::HandoffRequested { stream } => {
                tracing::info!("a new server with this id takes over; handing over");
                self.successor = Some(stream);
                self.step(Input::HandoffRequested);
            }
            Event::FromWorker { worker, frame } => match frame {
                WorkerFrame::FromWorker(message) => self.step(Input::FromWorker {
                    worker,
                    message: Box::new(message),
                }),
                other => tracing::warn!(%worker, ?other, "unexpected frame from worker"),
            },
            Event::WorkerChannelClosed { worker } => {
                let Some(w) = self.workers.get_mut(&worker) else {
                    return;
                };
                w.channel = None;
                // Not our child: its channel closing is the only exit we see. Our child
                // may have exited already; its exit was held until its last frames were read.
                if w.adopted || w.exit_status.is_some() {
                    self.report_exit(worker);
                }
            }
            Event::WorkerExited { worker, status } => {
                let Some(w) = self.workers.get_mut(&worker) else {
                    return;
                };
                w.exit_status = Some(status);
                // Frames it sent before exiting (say, why it could not open) come first.
                if w.channel.is_none() {
                    self.report_exit(worker);
                }
            }
            Event::CatalogChanged => {
                self.catalog_change_queued.store(false, Ordering::Release);
                self.step(Input::CatalogChanged);
            }
            Event::CatalogScanned {
                scan,
                sessions,
                models,
            } => {
                self.step(Input::CatalogScanned {
                    scan,
                    sessions,
                    models,
                });
            }
            Event::SessionRemoved { session_id, result } => {
                self.step(Input::SessionRemoved { session_id, result })
            }
        }
    }

    fn on_accepted(&mut self, socket: P::Conn) {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        let peer = socket.peer();
        let credential = socket.credential();
        let socket = Arc::new(socket);
        let (wtx, mut wrx) =
            mpsc::channel::<WriterMsg>(writer_capacity(&self.server.config().limits));
        let tx = self.events.clone();
        let write_socket = Arc::clone(&socket);
        let writer_task = tokio::spawn(async move {
            while let Some(msg) = wrx.recv().await {
                // Everything queued goes out together, in as few writes as the socket allows.
                let mut out: Vec<Frame> = Vec::new();
                let mut skip = 0;
                let mut chunks = 0;
                let mut close = false;
                let mut next = Some(msg);
                while let Some(m) = next {
                    match m {
                        WriterMsg::Frames(frames, first_skip) => {
                            if out.is_empty() {
                                skip = first_skip;
                            }
                            chunks += 1;
                            out.extend(frames);
                        }
                        WriterMsg::Close => {
                            close = true;
                            break;
                        }
                    }
                    next = wrx.try_recv().ok();
                }
                let bytes = out.iter().map(|f| f.len()).sum::<usize>() - skip;
                if write_socket.write_frames(out, skip).await.is_err() {
                    break;
                }
                if chunks > 0
                    && tx
                        .send(Event::Written {
                            conn,
                            bytes,
                            chunks,
                        })
                        .await
                        .is_err()
                {
                    return;
                }
                if close {
                    write_socket.shutdown_write().await;
                    break;
                }
            }
            let _ = tx.send(Event::WriterClosed { conn }).await;
        });
        self.conns.insert(
            conn,
            ClientConn {
                socket,
                writer: wtx,
                handed: 0,
                out: Vec::new(),
                read_waker: Arc::new(ReadWaker {
                    conn,
                    queued: AtomicBool::new(false),
                    readiness: Arc::clone(&self.readiness),
                }),
                read_closed: false,
                writer_task,
            },
        );
        self.step(Input::Accepted { conn, peer });
        if let Some(token) = credential {
            self.step(Input::Presented {
                conn,
                token: kernel::server::Secret(token),
            });
        }
        // The first read registers the waker.
        if let Some(c) = self.conns.get(&conn) {
            c.read_waker.wake_by_ref();
        }
    }

    /// Reads the client connections that are ready, in the order they became
    /// so, each at most [`READS_PER_TURN`] times; one with more to read is
    /// queued again, behind the others.
    fn read_clients(&mut self) {
        let mut ready = std::mem::take(&mut self.ready);
        self.readiness.take_into(&mut ready);
        for conn in ready.drain(..) {
            let mut reads = 0;
            while let Some(c) = self.conns.get(&conn) {
                if c.read_closed {
                    break;
                }
                if reads == READS_PER_TURN {
                    // More may be there: behind the others.
                    c.read_waker.wake_by_ref();
                    break;
                }
                reads += 1;
                // Cleared before reading: a wake from here on queues it again.
                c.read_waker.queued.store(false, Ordering::Release);
                let waker = Waker::from(Arc::clone(&c.read_waker));
                match c.socket.poll_read(&mut Context::from_waker(&waker)) {
                    Poll::Pending => break,
                    Poll::Ready(Ok(Some(bytes))) => self.step(Input::Received { conn, bytes }),
                    Poll::Ready(result) => {
                        if let Err(e) = result {
                            tracing::debug!(%conn, error = %e, "client connection read failed");
                        }
                        if let Some(c) = self.conns.get_mut(&conn) {
                            c.read_closed = true;
                        }
                        if self.server.ends_on_read_close(conn) {
                            self.drop_conn(conn);
                        }
                        break;
                    }
                }
            }
        }
        self.ready = ready;
    }

    /// The connection is gone: stop its tasks and tell the kernel (once).
    fn drop_conn(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.remove(&conn) {
            c.writer_task.abort();
            if self.successor.is_some() {
                // Before the successor may bind, these sockets must really be closed.
                self.dropped.push(c.writer_task);
            }
            self.step(Input::Disconnected { conn });
        }
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::Send { conn, frame } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    if c.out.is_empty() {
                        self.dirty.push(conn);
                    }
                    c.out.push(frame);
                }
            }
            Output::Close { conn, reason } => self.close_conn(conn, reason),
            Output::SpawnWorker {
                worker, session_id, ..
            } => self.spawn_worker(worker, session_id),
            Output::StartWorker {
                channel,
                worker,
                create,
                revision_floor,
            } => self.start_worker(channel, worker, create, revision_floor),
            Output::ToWorker { worker, message } => {
                let frame = WorkerFrame::ToWorker(message);
                self.send_to_worker(worker, &frame);
            }
            Output::KillWorker { worker } => self.kill_worker(worker),
            Output::RemoveSession { session_id } => {
                let dir = self.session_dir.clone();
                self.spawn_job(move || {
                    let result =
                        store::remove_session(&dir, &session_id).map_err(|e| e.to_string());
                    Event::SessionRemoved { session_id, result }
                });
            }
            Output::ScanCatalog { scan } => {
                let dir = self.session_dir.clone();
                self.spawn_job(move || {
                    let (sessions, models) = store::scan_catalog_with_models(&dir);
                    Event::CatalogScanned {
                        scan,
                        sessions,
                        models,
                    }
                });
            }
            Output::StopAccepting => self.stop_accepting(),
            Output::ShutdownComplete => {
                self.cleanup_sockets();
                // A successor waiting for the hand-off is answered when the loop ends.
                self.done = true;
            }
            Output::AdoptWorker {
                channel,
                worker,
                session_id,
            } => self.adopt_worker(channel, worker, session_id),
            Output::RejectWorker { channel, reason } => self.reject_worker(channel, reason),
            Output::ReleaseWorker { worker } => self.release_worker(worker),
        }
    }

    /// Closes a connection: at once, or once the refusal gathered for it
    /// is written.
    fn close_conn(&mut self, conn: ConnId, reason: CloseReason) {
        tracing::debug!(%conn, %reason, "closing connection");
        if reason == CloseReason::SlowConsumer {
            tracing::warn!(%conn, "client is not reading; cut off at its output bound");
        }
        if !reason.flushes_first() {
            return self.drop_conn(conn);
        }
        // The writer sends what is gathered (the refusal), then ends the stream.
        if let Some(c) = self.conns.get_mut(&conn) {
            if !c.out.is_empty() {
                let out = std::mem::take(&mut c.out);
                c.hand(WriterMsg::Frames(out, 0));
            }
            c.hand(WriterMsg::Close);
        }
    }

    /// Stops taking connections and worker channels. An accept task owns
    /// its listener (the web listener runs its HTTP server inside it): a
    /// successor binds only after these tasks are gone, awaited with the
    /// dropped connections.
    fn stop_accepting(&mut self) {
        for task in std::mem::take(&mut self.client_accepts) {
            task.abort();
            self.dropped.push(task);
        }
        if let Some(task) = self.worker_accept.take() {
            task.abort();
        }
        self.cleanup_sockets();
    }

    /// Runs a blocking job through the platform; its event comes back.
    fn spawn_job(&self, job: impl FnOnce() -> Event<P> + Send + 'static) {
        let done = self.platform.blocking(job);
        let tx = self.events.clone();
        tokio::spawn(async move {
            let _ = tx.send(done.await).await;
        });
    }

    /// Frees the socket paths (once: after a hand-off they belong to the successor).
    fn cleanup_sockets(&mut self) {
        if !std::mem::replace(&mut self.sockets_removed, true) {
            for path in [&self.public_path, &self.worker_path].into_iter().flatten() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// A duration from an environment variable in milliseconds, or the default.
pub(crate) fn env_duration_ms(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or(default, Duration::from_millis)
}

fn kill(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}
