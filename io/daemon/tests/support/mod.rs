//! Test support: the real server on a turmoil host.
//!
//! [`serve`] runs the daemon's own loop ([`pi_daemon::server::run_on`]) on a
//! simulated [`Platform`]: clients on turmoil TCP port [`PORT`] instead of a
//! Unix socket, and each worker as a task on the same host running the real
//! worker loop ([`pi_daemon::worker::run`]) over turmoil TCP, with SQLite in a
//! directory of its own and the simulation's clock. Blocking jobs run
//! inline and the session directory is polled, not watched, so a seed
//! replays exactly. A crashed host loses its tasks (as a machine losing
//! power loses its processes); its directory survives a bounce.
//!
//! What the kernel decides is read from the daemon's step trace
//! ([`pi_daemon::server::STEPS`]), which [`trace_steps`] notes in a [`Log`].

use kernel::faux;
use kernel::limits::{Limits, WorkerLimits};
use kernel::server::{Config, Frame};
use kernel::time::Instant;
use pi_daemon::duplex::Locked;
use pi_daemon::server::{Conn, Listener, Platform, Serving, Spawned, run_on};
use pi_daemon::worker::{Dial, WorkerSetup};
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::task::AbortHandle;
use tracing_subscriber::layer::SubscriberExt;
use turmoil::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use turmoil::net::{TcpListener, TcpStream};

/// The port the server listens on for clients.
pub(crate) const PORT: u16 = 7447;

/// The port its workers reach it on.
const WORKER_PORT: u16 = 7448;

/// Simulated wall clock of the workers: this epoch plus the simulation's time.
const EPOCH_MS: u64 = 1_800_000_000_000;

/// Lines noted during a run, each prefixed with the simulation time in ms.
pub(crate) type Log = Arc<Mutex<Vec<String>>>;

/// Notes `line` at the current simulation time.
pub(crate) fn note(log: &Log, line: impl Into<String>) {
    let ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
    log.lock().unwrap().push(format!("{ms:>6} {}", line.into()));
}

/// Notes every kernel step of the server (`input → [outputs]`) in `log`,
/// while the guard lives (on this thread, which runs every host).
pub(crate) fn trace_steps(log: &Log) -> tracing::subscriber::DefaultGuard {
    let subscriber = tracing_subscriber::registry().with(Steps(log.clone()));
    tracing::subscriber::set_default(subscriber)
}

struct Steps(Log);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Steps {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != pi_daemon::server::STEPS {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        note(&self.0, message.0);
    }
}

/// How the server runs.
#[derive(Clone)]
pub(crate) struct Options {
    /// Seeds the kernel's ids.
    pub(crate) seed: u64,
    /// The kernel's bounds and deadlines.
    pub(crate) limits: Limits,
    /// Time between two events of a faux model reply.
    pub(crate) faux_delay: Duration,
    /// The host's disk: sessions under `sessions/`, an empty agent dir
    /// (the faux models only) under `agent/`.
    pub(crate) disk: Arc<Disk>,
}

/// A directory standing in for a host's disk; deleted with the last handle
/// (when the simulation that holds it is dropped).
pub(crate) struct Disk(PathBuf);

impl Disk {
    /// A fresh, empty disk.
    pub(crate) fn fresh(name: &str) -> Arc<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("pi-turmoil-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("sessions")).unwrap();
        std::fs::create_dir_all(dir.join("agent")).unwrap();
        Arc::new(Self(dir))
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Serves pi protocol v1 on [`PORT`] until the kernel completes a shutdown
/// (or the host crashes). Use as `sim.host("server", move || serve(options.clone()))`.
pub(crate) async fn serve(options: Options) -> turmoil::Result {
    let any = IpAddr::from(Ipv4Addr::UNSPECIFIED);
    let clients = TcpListener::bind((any, PORT)).await?;
    let workers = TcpListener::bind((any, WORKER_PORT)).await?;
    let session_dir = options.disk.0.join("sessions");
    let serving = Serving {
        platform: Simulated {
            session_dir: session_dir.clone(),
            agent_dir: options.disk.0.join("agent"),
            faux_delay: options.faux_delay,
        },
        config: Config {
            server_id: "00000000-0000-4000-8000-000000007447".into(),
            token: None,
            seed: options.seed,
            models: faux::models(),
            limits: options.limits,
            idle_exit: None,
            local_token: true,
        },
        session_dir,
        clients: vec![Clients(clients)],
        workers: Workers(workers),
        public_path: None,
        worker_path: None,
        released: Vec::new(),
    };
    let (_stop, stops) = tokio::sync::mpsc::channel(1);
    run_on(serving, stops).await?;
    Ok(())
}

/// The simulated machine of a server host.
struct Simulated {
    session_dir: PathBuf,
    agent_dir: PathBuf,
    faux_delay: Duration,
}

fn sim_clock() -> Instant {
    Instant(EPOCH_MS + turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64)
}

impl Platform for Simulated {
    type Conn = SimConn;
    type Channel = Locked<TcpStream>;
    type Clients = Clients;
    type Workers = Workers;

    fn spawn_worker(&mut self, session_id: &str, token: &str) -> io::Result<Spawned> {
        let setup = WorkerSetup {
            dial: Loopback,
            token: token.to_owned(),
            session_id: session_id.to_owned(),
            session_dir: self.session_dir.clone(),
            agent_dir: self.agent_dir.clone(),
            pid: u64::from(std::process::id()),
            cwd: Some("/loopback".into()),
            clock: sim_clock,
            limits: WorkerLimits::default(),
            policy: kernel::runtime::Policy::default(),
            faux_delay: self.faux_delay,
        };
        let task = tokio::spawn(pi_daemon::worker::run(setup));
        let abort = task.abort_handle();
        let exited = Box::pin(async move {
            match task.await {
                Ok(Ok(())) => "exited".to_owned(),
                Ok(Err(e)) => format!("failed: {e}"),
                Err(e) => format!("stopped: {e}"),
            }
        });
        Ok(Spawned {
            pid: None,
            exited,
            task: Some(abort),
        })
    }

    fn kill_worker(&mut self, _pid: Option<u32>, task: Option<&AbortHandle>) {
        // Its hello names this process: only the task is ours to stop.
        if let Some(task) = task {
            task.abort();
        }
    }

    fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static {
        std::future::ready(job())
    }

    fn watch(
        &self,
        _dir: &Path,
        _on_change: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Box<dyn Send>, String> {
        Err("a simulated host's directory is polled".into())
    }
}

/// A worker reaches its server on the same host.
#[derive(Clone)]
struct Loopback;

impl Dial for Loopback {
    type Stream = Locked<TcpStream>;

    async fn dial(&self) -> Result<Locked<TcpStream>, String> {
        TcpStream::connect((Ipv4Addr::LOCALHOST, WORKER_PORT))
            .await
            .map(Locked)
            .map_err(|e| format!("cannot reach the server: {e}"))
    }

    fn server_path(&self) -> Option<&Path> {
        None
    }
}

/// Accepts client connections.
struct Clients(TcpListener);

impl Listener<SimConn> for Clients {
    async fn accept(&mut self) -> io::Result<SimConn> {
        let (stream, _) = self.0.accept().await?;
        let (read, write) = stream.into_split();
        Ok(SimConn {
            read: std::sync::Mutex::new(read),
            write: tokio::sync::Mutex::new(write),
        })
    }
}

/// Accepts worker channels.
struct Workers(TcpListener);

impl Listener<Locked<TcpStream>> for Workers {
    async fn accept(&mut self) -> io::Result<Locked<TcpStream>> {
        Ok(Locked(self.0.accept().await?.0))
    }
}

/// A client connection on simulated TCP. Only the loop reads, and it
/// writes directly only while the writer task holds nothing, so the locks
/// are never contended for long.
struct SimConn {
    read: std::sync::Mutex<OwnedReadHalf>,
    write: tokio::sync::Mutex<OwnedWriteHalf>,
}

impl Conn for SimConn {
    fn poll_read(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Vec<u8>>>> {
        let mut read = self
            .read
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut buf = vec![0; 64 * 1024];
        let mut filled = tokio::io::ReadBuf::new(&mut buf);
        std::task::ready!(Pin::new(&mut *read).poll_read(cx, &mut filled))?;
        let n = filled.filled().len();
        buf.truncate(n);
        Poll::Ready(Ok((n > 0).then_some(buf)))
    }

    fn try_write_frames(&self, frames: &[Frame], skip: usize) -> io::Result<usize> {
        let Ok(mut write) = self.write.try_lock() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let mut cx = Context::from_waker(Waker::noop());
        let mut written = 0;
        for (i, frame) in frames.iter().enumerate() {
            let frame = frame.bytes();
            let bytes = if i == 0 { &frame[skip..] } else { &frame[..] };
            match Pin::new(&mut *write).poll_write(&mut cx, bytes) {
                Poll::Ready(Ok(n)) => {
                    written += n;
                    if n < bytes.len() {
                        break;
                    }
                }
                Poll::Ready(Err(e)) if written == 0 => return Err(e),
                Poll::Ready(Err(_)) | Poll::Pending => break,
            }
        }
        if written == 0 && !frames.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(written)
    }

    async fn write_frames(&self, frames: Vec<Frame>, skip: usize) -> io::Result<()> {
        let mut write = self.write.lock().await;
        for (i, frame) in frames.iter().enumerate() {
            let frame = frame.bytes();
            let bytes = if i == 0 { &frame[skip..] } else { &frame[..] };
            write.write_all(bytes).await?;
        }
        Ok(())
    }

    async fn shutdown_write(&self) {
        let _ = self.write.lock().await.shutdown().await;
    }
}
