//! The physical floor of a request round trip: a raw Unix-socket server that
//! answers the n-th frame it receives with a scripted reply (the exact frames
//! our server sent for the same request, captured beforehand). Where our
//! server also sends to another attached client (a `detach` tells the others),
//! the echo writes as many bytes to its "side" connection, so both sides of
//! the ratio do the same writes.
//!
//! It runs in a process of its own (this binary, re-executed with
//! `echo-serve`), on a current-thread tokio runtime, like `pi-server serve`:
//! a thread of the bench process would be woken on the client's CPU more
//! often than a separate process is, and on this VM a wake-up of the other,
//! idle CPU costs tens of µs — the ratio would measure CPU placement, not
//! the server (BENCHMARKS.md, item 1).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// The argument that makes this binary an echo server.
pub(crate) const SUBCOMMAND: &str = "echo-serve";

/// A running echo server process; killed on drop.
#[derive(Debug)]
pub(crate) struct Echo {
    /// Its socket.
    pub(crate) path: PathBuf,
    child: Child,
}

impl Echo {
    /// Listens at `path`; the i-th frame received on a connection is answered
    /// with `script[i % script.len()]`: already framed bytes for the sender,
    /// and a number of bytes for the side connection ([`Echo::side`]).
    pub(crate) fn start(path: &Path, script: Vec<(Vec<u8>, usize)>) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let script_path = path.with_extension("script");
        let mut bytes = Vec::new();
        for (reply, side) in &script {
            bytes.extend_from_slice(&(reply.len() as u64).to_le_bytes());
            bytes.extend_from_slice(reply);
            bytes.extend_from_slice(&(*side as u64).to_le_bytes());
        }
        std::fs::write(&script_path, bytes)?;
        let child = Command::new(std::env::current_exe()?)
            .arg(SUBCOMMAND)
            .arg(path)
            .arg(&script_path)
            .stdin(Stdio::null())
            .spawn()?;
        let echo = Self {
            path: path.to_path_buf(),
            child,
        };
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(path).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err(std::io::Error::other(
                    "the echo server did not bind in 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(echo)
    }

    /// Its process id (for its scheduler statistics).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Connects the side connection, drained by a thread, like a second
    /// attached client.
    pub(crate) fn side(&self) -> std::io::Result<crate::util::Drain> {
        let mut stream = std::os::unix::net::UnixStream::connect(&self.path)?;
        stream.write_all(&(SIDE_MARK.len() as u32).to_be_bytes())?;
        stream.write_all(SIDE_MARK)?;
        crate::util::Drain::start(stream)
    }
}

/// The first frame of the side connection.
const SIDE_MARK: &[u8] = b"side";

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `bench echo-serve <socket> <script>`: the echo server process.
pub(crate) fn serve_main(args: &[String]) -> Result<(), String> {
    let [socket, script_path] = args else {
        return Err("usage: bench echo-serve <socket> <script>".into());
    };
    let bytes = std::fs::read(script_path).map_err(|e| format!("{script_path}: {e}"))?;
    let mut script = Vec::new();
    let mut rest = &bytes[..];
    let word = |at: &[u8]| u64::from_le_bytes(at[..8].try_into().expect("8")) as usize;
    while rest.len() >= 16 {
        let len = word(rest);
        let side = word(&rest[8 + len..]);
        script.push((rest[8..8 + len].to_vec(), side));
        rest = &rest[16 + len..];
    }
    let script: &'static [(Vec<u8>, usize)] = Vec::leak(script);
    let zeros: &'static [u8] =
        Vec::leak(vec![
            0u8;
            script.iter().map(|(_, side)| *side).max().unwrap_or(0)
        ]);
    let side: SideSlot = Arc::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let listener = UnixListener::bind(socket).map_err(|e| format!("bind {socket}: {e}"))?;
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, script, zeros, Arc::clone(&side)));
            }
        }
    })
}

/// The side connection, once it said so.
type SideSlot = Arc<Mutex<Option<Arc<tokio::net::UnixStream>>>>;

async fn serve(
    mut stream: tokio::net::UnixStream,
    script: &'static [(Vec<u8>, usize)],
    zeros: &'static [u8],
    side: SideSlot,
) {
    let spin = std::env::var("BENCH_ECHO_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_micros);
    let mut buf = vec![0u8; 64 * 1024];
    let (mut start, mut end) = (0usize, 0usize);
    let mut n = 0usize;
    loop {
        // Answer every complete frame in the buffer.
        loop {
            if end - start < 4 {
                break;
            }
            let len = u32::from_be_bytes(buf[start..start + 4].try_into().expect("4")) as usize;
            if end - start < 4 + len {
                break;
            }
            if n == 0 && &buf[start + 4..start + 4 + len] == SIDE_MARK {
                *side.lock().expect("side slot") = Some(Arc::new(stream));
                return;
            }
            start += 4 + len;
            let (reply, side_bytes) = &script[n % script.len()];
            n += 1;
            if let Some(spin) = spin {
                // `BENCH_ECHO_SPIN_US`: stand-in for a server's work per request.
                let until = Instant::now() + spin;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            if stream.write_all(reply).await.is_err() {
                return;
            }
            let other = side.lock().expect("side slot").clone();
            if let Some(other) = other
                && *side_bytes > 0
            {
                let mut rest = &zeros[..*side_bytes];
                while !rest.is_empty() {
                    if other.writable().await.is_err() {
                        break;
                    }
                    match other.try_write(rest) {
                        Ok(n) => rest = &rest[n..],
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => break,
                    }
                }
            }
        }
        if start == end {
            start = 0;
            end = 0;
        } else if start > 0 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        if buf.len() - end < 16 * 1024 {
            buf.resize(buf.len() * 2, 0);
        }
        match stream.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return,
            Ok(read) => end += read,
        }
    }
}
