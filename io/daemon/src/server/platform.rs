//! What the daemon's loop needs of the machine it runs on, as one trait:
//! accepting client connections and worker channels, reading and writing
//! client bytes, starting and killing workers, blocking jobs and watching the
//! session directory.
//!
//! [`Native`] is the real one: Unix sockets (and TCP), `pi-server worker`
//! processes, the blocking pool and inotify. The turmoil tests
//! (`io/daemon/tests/support`) bring a simulated one (simulated TCP, workers as
//! tasks running the real worker loop, jobs inline), so the loop they drive
//! is [`super::run`]'s own.

use crate::duplex::{Duplex, UnixChannel, poll_read_ready_into, registered, write_watch};
use crate::limits::{
    KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES, MAX_SLICES, READ_CHUNK,
    TCP_USER_TIMEOUT_MS,
};
use kernel::server::Frame;
use std::future::Future;
use std::io;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::AbortHandle;

/// A client connection as the loop uses it. Shared (`&self`) by the loop,
/// which reads it and writes directly while the connection's writer holds
/// nothing, and the connection's writer task.
pub trait Conn: Send + Sync + 'static {
    /// The next bytes the peer sent, if some are there: `Ready(Ok(None))` at
    /// the end of the stream; `Pending` when nothing is, and then `cx`'s
    /// waker is woken when something arrives.
    fn poll_read(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Vec<u8>>>>;

    /// Writes what the socket takes now of `frames` (after `skip` bytes of
    /// the first), without waiting: `WouldBlock` when it takes nothing.
    fn try_write_frames(&self, frames: &[Frame], skip: usize) -> io::Result<usize>;

    /// Writes all of `frames` (after `skip` bytes of the first), waiting for
    /// the socket to drain as needed.
    fn write_frames(
        &self,
        frames: Vec<Frame>,
        skip: usize,
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Ends our direction of the stream (the peer reads end-of-file).
    fn shutdown_write(&self) -> impl Future<Output = ()> + Send;

    /// A remote peer's address (failed tokens back off by it); `None` for
    /// a local client.
    fn peer(&self) -> Option<kernel::ids::PeerAddr> {
        None
    }

    /// A credential the transport carried (see `kernel::server::Input::Presented`).
    fn credential(&self) -> Option<String> {
        None
    }
}

/// Something that accepts connections of type `S`.
pub trait Listener<S>: Send + 'static {
    /// The next connection. An error is logged and accepting goes on.
    fn accept(&mut self) -> impl Future<Output = io::Result<S>> + Send;
}

/// A worker started by [`Platform::spawn_worker`].
pub struct Spawned {
    /// Its process id, when it is a process of its own.
    pub pid: Option<u32>,
    /// Resolves with its exit status when it ends.
    pub exited: Pin<Box<dyn Future<Output = String> + Send>>,
    /// Stops it, when it is a task of ours rather than a process.
    pub task: Option<AbortHandle>,
}

/// The machine the loop runs on.
pub trait Platform: Send + 'static {
    /// A client connection.
    type Conn: Conn;
    /// A worker channel (length-prefixed worker frames both ways).
    type Channel: Duplex;
    /// Accepts client connections.
    type Clients: Listener<Self::Conn>;
    /// Accepts worker channels.
    type Workers: Listener<Self::Channel>;

    /// Starts the worker of `session_id`, which proves itself with `token`.
    fn spawn_worker(&mut self, session_id: &str, token: &str) -> io::Result<Spawned>;

    /// Kills a worker: `pid` is its process (from its spawn or its hello),
    /// `task` what [`Spawned::task`] gave.
    fn kill_worker(&mut self, pid: Option<u32>, task: Option<&AbortHandle>);

    /// Runs a job that blocks (a catalog scan, a removal) off the loop, and
    /// resolves with its result.
    fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static;

    /// Calls `on_change` (from a thread of its own: it may block) when the
    /// session directory changes, while the returned guard lives; `Err`
    /// (why) when it cannot watch, and the loop polls instead.
    fn watch(
        &self,
        dir: &Path,
        on_change: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Box<dyn Send>, String>;
}

// ---------------------------------------------------------------------------
// The real machine

/// Unix sockets, optional TCP, worker processes.
pub struct Native {
    /// The worker socket the spawned workers reach us on.
    pub worker_path: PathBuf,
    /// Where the sessions are stored.
    pub session_dir: PathBuf,
}

/// A client connection: a Unix socket or a TCP connection.
///
/// A socket is registered with the runtime for reading only. Registered for
/// writing as well (as tokio's streams are), every read a client makes of
/// what we sent can wake the loop for nothing. A write that finds the socket
/// full waits on a registration of its own ([`ClientSocket::writable`]).
pub enum ClientSocket {
    /// A local client.
    Unix(AsyncFd<std::os::unix::net::UnixStream>),
    /// A remote client (token required).
    Tcp(AsyncFd<std::net::TcpStream>),
    /// A WebSocket of the web listener, one frame per message (token required).
    Web(crate::web::WebConn),
}

thread_local! {
    /// The buffer every client connection reads into (all on the loop's thread).
    static READ_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl ClientSocket {
    /// A local client's socket, registered for reading.
    fn unix(stream: UnixStream) -> io::Result<Self> {
        registered(stream.into_std()?, Interest::READABLE).map(Self::Unix)
    }

    /// A remote client's socket, registered for reading.
    fn tcp(stream: tokio::net::TcpStream) -> io::Result<Self> {
        registered(stream.into_std()?, Interest::READABLE).map(Self::Tcp)
    }

    /// Waits until the socket takes more, on a registration (of a duplicate
    /// descriptor) that lives only while it waits.
    async fn writable(&self) -> io::Result<()> {
        let watch = match self {
            Self::Unix(s) => write_watch(s.get_ref().as_fd())?,
            Self::Tcp(s) => write_watch(s.get_ref().as_fd())?,
            Self::Web(_) => unreachable!("a WebSocket is written by messages"),
        };
        watch.writable().await?.retain_ready();
        Ok(())
    }
}

/// Reads what is ready on `socket`, without waiting: `Ready(Ok(None))` at
/// its end.
///
/// Reads into the thread's scratch buffer, so an idle connection holds
/// none. A short read drained the socket: its readiness is cleared then,
/// which spares the reader a second `recv` that would only find nothing.
fn poll_read_socket<S: AsRawFd + AsFd>(
    socket: &AsyncFd<S>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<Option<Vec<u8>>>> {
    READ_SCRATCH.with_borrow_mut(|buf| {
        buf.resize(READ_CHUNK, 0);
        poll_read_ready_into(socket, cx, buf).map_ok(|n| (n > 0).then(|| buf[..n].to_vec()))
    })
}

impl Conn for ClientSocket {
    fn poll_read(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Vec<u8>>>> {
        match self {
            Self::Unix(s) => poll_read_socket(s, cx),
            Self::Tcp(s) => poll_read_socket(s, cx),
            Self::Web(web) => web.poll_read(cx).map(Ok),
        }
    }

    fn try_write_frames(&self, frames: &[Frame], skip: usize) -> io::Result<usize> {
        if let Self::Web(web) = self {
            return web.try_write_frames(frames, skip);
        }
        let slices = io_slices(frames, skip);
        match self {
            Self::Unix(s) => (&mut s.get_ref()).write_vectored(&slices),
            Self::Tcp(s) => (&mut s.get_ref()).write_vectored(&slices),
            Self::Web(_) => unreachable!("handled above"),
        }
    }

    async fn write_frames(&self, mut frames: Vec<Frame>, mut skip: usize) -> io::Result<()> {
        if let Self::Web(web) = self {
            return web.write_frames(frames, skip).await;
        }
        while !frames.is_empty() {
            self.writable().await?;
            match self.try_write_frames(&frames, skip) {
                Ok(n) => advance(&mut frames, &mut skip, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn shutdown_write(&self) {
        let result = match self {
            Self::Unix(s) => rustix::net::shutdown(s.get_ref(), rustix::net::Shutdown::Write),
            Self::Tcp(s) => rustix::net::shutdown(s.get_ref(), rustix::net::Shutdown::Write),
            Self::Web(web) => return web.shutdown_write().await,
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "shutdown of a client connection failed");
        }
    }

    fn peer(&self) -> Option<kernel::ids::PeerAddr> {
        match self {
            Self::Unix(_) => None,
            Self::Tcp(s) => s
                .get_ref()
                .peer_addr()
                .ok()
                .map(|a| kernel::ids::PeerAddr(a.ip().to_string())),
            Self::Web(web) => Some(web.peer()),
        }
    }

    fn credential(&self) -> Option<String> {
        match self {
            Self::Web(web) => web.credential(),
            Self::Unix(_) | Self::Tcp(_) => None,
        }
    }
}

/// The unwritten bytes of `frames` (the first has `skip` written already),
/// one slice per piece, at most [`MAX_SLICES`].
pub(super) fn io_slices(frames: &[Frame], mut skip: usize) -> Vec<io::IoSlice<'_>> {
    frames
        .iter()
        .flat_map(|f| f.pieces())
        .filter_map(|piece| {
            let rest = piece.get(skip..).unwrap_or_default();
            skip = skip.saturating_sub(piece.len());
            (!rest.is_empty()).then(|| io::IoSlice::new(rest))
        })
        .take(MAX_SLICES)
        .collect()
}

/// Drops the first `n` bytes from `frames` (the first has `*skip` written already).
pub(super) fn advance(frames: &mut Vec<Frame>, skip: &mut usize, mut n: usize) {
    let mut done = 0;
    for frame in frames.iter() {
        let left = frame.len() - *skip;
        if n < left {
            *skip += n;
            break;
        }
        n -= left;
        *skip = 0;
        done += 1;
    }
    frames.drain(..done);
}

/// The client listeners of a real server.
pub enum NativeClients {
    /// The Unix socket.
    Unix(UnixListener),
    /// `--listen tcp://…`.
    Tcp(tokio::net::TcpListener),
    /// `--listen http://…`: the WebSockets the web server upgraded.
    Web(crate::web::WebListener),
}

impl Listener<ClientSocket> for NativeClients {
    async fn accept(&mut self) -> io::Result<ClientSocket> {
        match self {
            Self::Unix(listener) => ClientSocket::unix(UnixListener::accept(listener).await?.0),
            Self::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                tracing::debug!(%peer, "remote client connected");
                let _ = stream.set_nodelay(true);
                if let Err(e) = keep_alive(&stream) {
                    tracing::warn!(%peer, error = %e, "cannot enable TCP keep-alive");
                }
                ClientSocket::tcp(stream)
            }
            Self::Web(listener) => Ok(ClientSocket::Web(listener.accept().await)),
        }
    }
}

impl Listener<UnixChannel> for UnixListener {
    async fn accept(&mut self) -> io::Result<UnixChannel> {
        UnixChannel::new(UnixListener::accept(self).await?.0)
    }
}

/// Dead-peer detection for a remote client connection.
fn keep_alive(stream: &tokio::net::TcpStream) -> rustix::io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(stream, true)?;
    sockopt::set_tcp_keepidle(stream, KEEPALIVE_IDLE)?;
    sockopt::set_tcp_keepintvl(stream, KEEPALIVE_INTERVAL)?;
    sockopt::set_tcp_keepcnt(stream, KEEPALIVE_PROBES)?;
    sockopt::set_tcp_user_timeout(stream, TCP_USER_TIMEOUT_MS)
}

impl Platform for Native {
    type Conn = ClientSocket;
    type Channel = UnixChannel;
    type Clients = NativeClients;
    type Workers = UnixListener;

    fn spawn_worker(&mut self, session_id: &str, token: &str) -> io::Result<Spawned> {
        let exe = pi_config::this_program()?;
        let mut cmd = tokio::process::Command::new(exe);
        if let Ok(path) = std::env::current_exe() {
            cmd.arg0(path); // what `ps` shows, rather than /proc/self/exe
        }
        cmd.arg("worker")
            .env("PI_WORKER_SOCKET", &self.worker_path)
            .env("PI_WORKER_TOKEN", token)
            .env("PI_WORKER_SESSION_ID", session_id)
            .env("PI_WORKER_SESSION_DIR", &self.session_dir)
            .stdin(std::process::Stdio::null())
            .process_group(0);
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let exited = Box::pin(async move {
            match child.wait().await {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            }
        });
        Ok(Spawned {
            pid,
            exited,
            task: None,
        })
    }

    fn kill_worker(&mut self, pid: Option<u32>, _task: Option<&AbortHandle>) {
        if let Some(pid) = pid {
            super::kill(pid, rustix::process::Signal::KILL);
        }
    }

    fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = T> + Send + 'static {
        let task = tokio::task::spawn_blocking(job);
        async move {
            match task.await {
                Ok(result) => result,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
    }

    fn watch(
        &self,
        dir: &Path,
        on_change: Box<dyn Fn() + Send + Sync>,
    ) -> Result<Box<dyn Send>, String> {
        pi_store::watch::watch(dir, on_change).map(|w| Box::new(w) as Box<dyn Send>)
    }
}

#[cfg(test)]
mod tests {
    use super::{Frame, advance, io_slices};

    #[tokio::test]
    async fn remote_connections_get_keep_alive_and_a_user_timeout() {
        use rustix::net::sockopt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(!sockopt::socket_keepalive(&accepted).unwrap());
        super::keep_alive(&accepted).unwrap();
        assert!(sockopt::socket_keepalive(&accepted).unwrap());
        assert_eq!(
            sockopt::tcp_keepidle(&accepted).unwrap(),
            super::KEEPALIVE_IDLE
        );
        assert_eq!(
            sockopt::tcp_keepintvl(&accepted).unwrap(),
            super::KEEPALIVE_INTERVAL
        );
        assert_eq!(
            sockopt::tcp_keepcnt(&accepted).unwrap(),
            super::KEEPALIVE_PROBES
        );
        assert_eq!(
            sockopt::tcp_user_timeout(&accepted).unwrap(),
            super::TCP_USER_TIMEOUT_MS
        );
    }

    fn frames(lens: &[usize]) -> Vec<Frame> {
        lens.iter()
            .enumerate()
            .map(|(i, &len)| Frame::from(vec![i as u8; len]))
            .collect()
    }

    fn lens(frames: &[Frame]) -> Vec<usize> {
        frames.iter().map(|f| f.len()).collect()
    }

    #[test]
    fn io_slices_cover_every_piece_after_the_written_bytes() {
        use kernel::wire::frame::frame_shared;
        let shared: Vec<std::sync::Arc<[u8]>> = vec![vec![5u8; 3].into(), vec![6u8; 2].into()];
        let spliced = frame_shared(&[1, 2], &shared, &[7], u32::MAX).unwrap();
        let frames = vec![spliced.clone(), Frame::from(vec![9u8; 2])];
        let mut all = spliced.bytes().into_owned();
        all.extend([9, 9]);
        for skip in 0..spliced.len() {
            let written: Vec<u8> = io_slices(&frames, skip)
                .iter()
                .flat_map(|s| s.iter().copied())
                .collect();
            assert_eq!(written, all[skip..], "skip {skip}");
        }
    }

    #[test]
    fn advance_drops_written_frames_and_keeps_the_offset_into_a_partial_one() {
        let mut f = frames(&[3, 5, 2]);
        let mut skip = 0;
        advance(&mut f, &mut skip, 0);
        assert_eq!((lens(&f), skip), (vec![3, 5, 2], 0));
        advance(&mut f, &mut skip, 4);
        assert_eq!((lens(&f), skip), (vec![5, 2], 1));
        assert_eq!(f[0].bytes()[0], 1, "the second frame is first now");
        advance(&mut f, &mut skip, 3);
        assert_eq!((lens(&f), skip), (vec![5, 2], 4));
        advance(&mut f, &mut skip, 1);
        assert_eq!(
            (lens(&f), skip),
            (vec![2], 0),
            "exactly the rest of a frame"
        );
        advance(&mut f, &mut skip, 2);
        assert!(f.is_empty());
        assert_eq!(skip, 0);
    }
}
