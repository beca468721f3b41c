//! Shared harness of the end-to-end tests: a real `pi-server serve` child in
//! a fresh temporary directory, clients on its socket, and process hygiene.
//!
//! Every test gets its own root directory (`/tmp/pi-e2e-…`), holding
//! `server/` (sockets, ids, logs), `sessions/` and `server.log` (the server's
//! stdout and stderr, appended across restarts). Dropping the [`TestServer`]
//! (or the [`TestRoot`]) kills the server, every worker and every other
//! process that mentions the root directory in its command line or
//! environment (auto-started servers, workers reparented after a crash), waits
//! until they are gone, and removes the directory. When the test is failing,
//! the server log is printed first.
//!
//! Waits are event-driven with generous deadlines ([`WAIT`]) so that a loaded
//! two-core CI machine only makes a test slower, never flaky.

#![allow(dead_code)]

use kernel::protocol::{
    AssistantItem, AssistantStatus, ClientHello, ClientMessage, Content, CreateParams, ErrorCode,
    ProtocolError, ServerEvent, ServerMessage, SessionSnapshot, TranscriptItem, TranscriptProgress,
    decode_server_message, encode_client_message,
};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{CborLimits, FrameDecoder};
use pi_client::{Client, ClientError, ClientOptions, Status};
use std::collections::VecDeque;
use std::ffi::OsString;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::broadcast;

/// The fixed server id of every test server (a lowercase UUIDv4).
pub(crate) const SERVER_ID: &str = "0e2e7e57-0000-4000-8000-000000000001";

/// How long any single wait may take before the test fails. Generous: a
/// loaded CI machine makes things slow, not wrong.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// The `pi-server` binary under test.
pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pi-server")
}

// ---------------------------------------------------------------------------
// The temporary root directory

/// A fresh directory, cleaned up (with every process that mentions it) on drop.
#[derive(Debug)]
pub(crate) struct TestRoot {
    pub(crate) path: PathBuf,
}

impl TestRoot {
    /// A new empty directory named after `name`, with a path short enough for
    /// Unix socket names inside it (the limit is 108 bytes).
    pub(crate) fn new(name: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let base = if base.as_os_str().len() > 40 {
            PathBuf::from("/tmp")
        } else {
            base
        };
        let short: String = name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(12)
            .collect();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = base.join(format!(
            "pi-e2e-{short}-{}-{}-{:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            nanos & 0xfff
        ));
        std::fs::create_dir_all(&path).expect("create the test root");
        Self { path }
    }

    /// Points `HOME` and `PI_CODING_AGENT_DIR` of `command` into the root
    /// (the worker reads and writes `<agentDir>/settings.json`) and removes
    /// the variables that would select another server.
    pub(crate) fn isolate(&self, command: &mut Command) {
        let home = self.path.join("home");
        let agent = self.path.join("agent");
        let _ = std::fs::create_dir_all(&home);
        command
            .env("HOME", home)
            .env("PI_CODING_AGENT_DIR", agent)
            .env_remove("PI_SERVER_DIR")
            .env_remove("PI_SERVER_ID")
            .env_remove("PI_SERVER_IDLE_EXIT_MS")
            .env_remove("PI_SERVER_TOKEN_FILE")
            .env_remove("PI_FAUX_DELAY_MS")
            // The servers' own allocator tuning, not the caller's.
            .env_remove(pi_front::cli::MMAP_THRESHOLD_VAR)
            .env_remove("GLIBC_TUNABLES");
    }

    /// Every live process (other than this one) whose command line or
    /// environment mentions this root.
    pub(crate) fn processes(&self) -> Vec<u32> {
        processes_mentioning(self.path.as_os_str().as_bytes())
    }

    /// Kills every process mentioning the root and waits until they are gone.
    pub(crate) fn kill_all(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let pids = self.processes();
            if pids.is_empty() {
                return;
            }
            for pid in &pids {
                signal(*pid, Sig::Kill);
            }
            if Instant::now() >= deadline {
                eprintln!("[harness] processes {pids:?} survive SIGKILL");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ---------------------------------------------------------------------------
// Processes, through /proc

/// A signal the harness sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sig {
    Term,
    Kill,
    #[allow(dead_code)]
    Int,
}

/// Sends `sig` to `pid`; errors (already gone) are ignored.
pub(crate) fn signal(pid: u32, sig: Sig) {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let sig = match sig {
        Sig::Term => rustix::process::Signal::TERM,
        Sig::Kill => rustix::process::Signal::KILL,
        Sig::Int => rustix::process::Signal::INT,
    };
    let _ = rustix::process::kill_process(pid, sig);
}

/// True while `pid` exists and is not a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live processes (not this one) whose command line or environment contains `needle`.
pub(crate) fn processes_mentioning(needle: &[u8]) -> Vec<u32> {
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|&pid| pid != me && alive(pid))
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            contains(&cmdline, needle) || contains(&environ, needle)
        })
        .collect()
}

/// The environment variable `name` of process `pid`, if readable.
pub(crate) fn env_of(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The command line of `pid`, as arguments.
pub(crate) fn cmdline_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Waits (asynchronously) until `pid` has exited.
pub(crate) async fn wait_exit(pid: u32, what: &str) {
    wait_until(what, || !alive(pid)).await;
}

// ---------------------------------------------------------------------------
// Generic waiting

/// Polls `ready` every 10 ms until it holds; panics after [`WAIT`].
pub(crate) async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        if ready() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `future`, or a panic naming `what` after [`WAIT`].
pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// The next event matching `want`, skipping others; panics if the
/// connection closes first or after [`WAIT`].
pub(crate) async fn next_event(
    events: &mut broadcast::Receiver<ServerEvent>,
    what: &str,
    mut want: impl FnMut(&ServerEvent) -> bool,
) -> ServerEvent {
    within(what, async {
        loop {
            match events.recv().await {
                Ok(event) if want(&event) => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    panic!("the connection closed while waiting for {what}")
                }
            }
        }
    })
    .await
}

/// Waits until the subscription ends (the connection closed); returns the
/// events received before that.
/// Waits until `client` lost its server and then completed a new handshake.
#[allow(dead_code)]
pub(crate) async fn until_reconnected(client: &Client) {
    let mut status = client.status();
    within("the client to notice the lost server", async {
        status
            .wait_for(|s| {
                !matches!(
                    s,
                    Status::Ready {
                        reconnected: false,
                        ..
                    }
                )
            })
            .await
            .map(drop)
    })
    .await
    .expect("status");
    within("the client to reconnect", async {
        status
            .wait_for(|s| {
                matches!(
                    s,
                    Status::Ready {
                        reconnected: true,
                        ..
                    } | Status::Closed { .. }
                )
            })
            .await
            .map(drop)
    })
    .await
    .expect("status");
    assert!(
        matches!(*status.borrow(), Status::Ready { .. }),
        "{:?}",
        *status.borrow()
    );
}

pub(crate) async fn until_closed(
    events: &mut broadcast::Receiver<ServerEvent>,
) -> Vec<ServerEvent> {
    within("the connection to close", async {
        let mut seen = Vec::new();
        loop {
            match events.recv().await {
                Ok(event) => seen.push(event),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return seen,
            }
        }
    })
    .await
}

/// Everything already delivered to the subscription, without waiting.
pub(crate) fn drain(events: &mut broadcast::Receiver<ServerEvent>) -> Vec<ServerEvent> {
    let mut seen = Vec::new();
    loop {
        match events.try_recv() {
            Ok(event) => seen.push(event),
            Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(_) => return seen,
        }
    }
}

/// True for a text `assistant_delta` of `session`.
pub(crate) fn is_delta_of(event: &ServerEvent, session: &str) -> bool {
    matches!(event, ServerEvent::SessionProgress {
        session_id,
        progress: TranscriptProgress::AssistantDelta { .. },
    } if session_id == session)
}

/// True for any session snapshot or progress event of `session`.
pub(crate) fn is_session_event_of(event: &ServerEvent, session: &str) -> bool {
    match event {
        ServerEvent::SessionSnapshot { snapshot } => snapshot.id == session,
        ServerEvent::SessionProgress { session_id, .. } => session_id == session,
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Results

/// The protocol error code of a failed call; panics on success or another failure.
#[track_caller]
pub(crate) fn code<T: std::fmt::Debug>(result: Result<T, ClientError>) -> ProtocolError {
    match result {
        Err(ClientError::Server(error)) => error,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// Asserts a call failed with `expected`; returns the message.
#[track_caller]
pub(crate) fn expect_code<T: std::fmt::Debug>(
    result: Result<T, ClientError>,
    expected: ErrorCode,
) -> String {
    let error = code(result);
    assert_eq!(error.code, expected, "unexpected error: {error:?}");
    error.message
}

/// The assistant items of a transcript.
pub(crate) fn assistants(snapshot: &SessionSnapshot) -> Vec<&AssistantItem> {
    snapshot
        .transcript
        .iter()
        .filter_map(|i| match i {
            TranscriptItem::Assistant(a) => Some(a),
            _ => None,
        })
        .collect()
}

/// The number of user items of a transcript.
pub(crate) fn user_count(snapshot: &SessionSnapshot) -> usize {
    snapshot
        .transcript
        .iter()
        .filter(|i| matches!(i, TranscriptItem::User(_)))
        .count()
}

/// The text of an assistant item.
pub(crate) fn text_of(item: &AssistantItem) -> String {
    item.content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The status of the last transcript item if it is an assistant item.
pub(crate) fn last_assistant_status(snapshot: &SessionSnapshot) -> Option<AssistantStatus> {
    match snapshot.transcript.last() {
        Some(TranscriptItem::Assistant(a)) => Some(a.status),
        _ => None,
    }
}

/// A prompt whose faux reply streams in about `words` deltas (each word is
/// long enough to be its own delta), so the turn lasts `words × delay`.
pub(crate) fn long_text(words: usize) -> String {
    (0..words)
        .map(|i| format!("word{i:04}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Create parameters with a cwd.
pub(crate) fn params(name: &str) -> CreateParams {
    CreateParams {
        cwd: Some("/tmp".into()),
        name: Some(name.into()),
        ..CreateParams::default()
    }
}

/// True for a lowercase UUIDv4.
pub(crate) fn is_uuid_v4(s: &str) -> bool {
    kernel::rng::is_uuid_v4(s)
}

// ---------------------------------------------------------------------------
// The server under test

/// How to start a test server.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Token required in hello (`--token-file`).
    pub(crate) token: Option<String>,
    /// `PI_FAUX_DELAY_MS` of the server and its workers.
    pub(crate) faux_delay_ms: u64,
    /// `--idle-exit-ms`.
    pub(crate) idle_exit_ms: Option<u64>,
    /// Extra environment of the server.
    pub(crate) env: Vec<(String, String)>,
    /// Extra arguments of `serve`.
    pub(crate) serve_args: Vec<String>,
    /// The program `serve` runs from, when not the build under test.
    pub(crate) program: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            token: None,
            faux_delay_ms: 5,
            idle_exit_ms: None,
            env: Vec::new(),
            serve_args: Vec::new(),
            program: None,
        }
    }
}

/// A `pi-server serve` child and its directories.
#[derive(Debug)]
pub(crate) struct TestServer {
    pub(crate) server_dir: PathBuf,
    pub(crate) session_dir: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) log_path: PathBuf,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) options: Options,
    child: Option<Child>,
    // Last: dropped after the child is killed.
    pub(crate) root: TestRoot,
}

impl TestServer {
    /// A server with default options, ready for clients.
    pub(crate) async fn start(name: &str) -> Self {
        Self::start_with(name, Options::default()).await
    }

    /// A server with `options`, ready for clients.
    pub(crate) async fn start_with(name: &str, options: Options) -> Self {
        let mut server = Self::new(name, options);
        server.spawn();
        server.wait_ready().await;
        server
    }

    /// The directories of a server, without starting it.
    pub(crate) fn new(name: &str, options: Options) -> Self {
        let root = TestRoot::new(name);
        let server_dir = root.path.join("server");
        let session_dir = root.path.join("sessions");
        let token_file = options.token.as_ref().map(|token| {
            let file = root.path.join("token");
            std::fs::write(&file, format!("{token}\n")).expect("write the token file");
            // Private, as a token guarding a network listener must be.
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod the token file");
            file
        });
        Self {
            socket: server_dir.join(format!("{SERVER_ID}.sock")),
            log_path: root.path.join("server.log"),
            server_dir,
            session_dir,
            token_file,
            options,
            child: None,
            root,
        }
    }

    /// The `serve` command line (without spawning it).
    pub(crate) fn serve_command(&self) -> Command {
        let program = self.options.program.as_deref();
        let mut command = Command::new(program.unwrap_or(Path::new(bin())));
        command
            .arg("serve")
            .arg("--server-dir")
            .arg(&self.server_dir)
            .arg("--server-id")
            .arg(SERVER_ID)
            .arg("--session-dir")
            .arg(&self.session_dir);
        if let Some(file) = &self.token_file {
            command.arg("--token-file").arg(file);
        }
        if let Some(ms) = self.options.idle_exit_ms {
            command.arg("--idle-exit-ms").arg(ms.to_string());
        }
        command.args(&self.options.serve_args);
        self.root.isolate(&mut command);
        command
            .env("PI_FAUX_DELAY_MS", self.options.faux_delay_ms.to_string())
            .env("RUST_LOG", "info")
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        command
    }

    /// A client command of the CLI for this server's directories (the
    /// command may start a server there if none runs).
    pub(crate) fn cli(&self, args: &[&str]) -> Command {
        let mut command = Command::new(bin());
        command
            .arg("--server-dir")
            .arg(&self.server_dir)
            .arg("--server-id")
            .arg(SERVER_ID)
            .arg("--session-dir")
            .arg(&self.session_dir);
        if let Some(file) = &self.token_file {
            command.arg("--token-file").arg(file);
        }
        command.args(args);
        self.root.isolate(&mut command);
        command
            .env("PI_FAUX_DELAY_MS", self.options.faux_delay_ms.to_string())
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        command
    }

    /// Runs a CLI command to completion (bounded by [`WAIT`]).
    pub(crate) async fn run_cli(&self, args: &[&str]) -> CliOutput {
        run(self.cli(args)).await
    }

    /// Spawns the server (appending its output to the log).
    pub(crate) fn spawn(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open the server log");
        let err = log.try_clone().expect("clone the log handle");
        let child = self
            .serve_command()
            .stdout(log)
            .stderr(err)
            .spawn()
            .expect("spawn pi-server serve");
        self.child = Some(child);
    }

    /// The server's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// Waits until a client completes a handshake.
    pub(crate) async fn wait_ready(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            match Client::connect(&self.socket, self.options.token.as_deref()).await {
                Ok(client) => {
                    client.close().await;
                    return;
                }
                Err(ClientError::Transport { failure, .. }) if failure.nothing_listening() => {}
                Err(e) => panic!("the server refused a client: {e}\n{}", self.log()),
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "the server exited during startup ({status}):\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the server did not answer within {WAIT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A connected client (with the configured token).
    pub(crate) async fn connect(&self) -> Client {
        match Client::connect(&self.socket, self.options.token.as_deref()).await {
            Ok(client) => client,
            Err(e) => panic!("cannot connect: {e}\n{}", self.log()),
        }
    }

    /// A client that does not reconnect, for tests of what losing the
    /// server does to a client.
    pub(crate) async fn connect_once(&self) -> Client {
        let options = ClientOptions {
            reconnect: false,
            ..ClientOptions::default()
        };
        let token = self.options.token.as_deref();
        match Client::connect_with(&self.socket, token, options).await {
            Ok(client) => client,
            Err(e) => panic!("cannot connect: {e}\n{}", self.log()),
        }
    }

    /// A raw connection to the socket (no hello sent).
    pub(crate) async fn raw(&self) -> RawConn {
        RawConn::connect(&self.socket).await
    }

    /// Sends SIGTERM and waits for the server to exit; returns its status.
    pub(crate) async fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid();
        signal(pid, Sig::Term);
        self.wait_exit().await
    }

    /// Waits for the server process to exit by itself.
    pub(crate) async fn wait_exit(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("the server is running");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().expect("wait for the server") {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts a second `serve` for the same id while this one runs (a
    /// hand-off: the running server releases its workers and exits), waits
    /// for the old process to exit and the new one to answer; returns the
    /// old server's exit status.
    pub(crate) async fn replace(&mut self) -> ExitStatus {
        let mut old = self.child.take().expect("the server is running");
        self.spawn();
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = old.try_wait().expect("wait for the old server") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the old server did not hand over within {WAIT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        self.wait_ready().await;
        status
    }

    /// SIGKILLs the server (workers keep running).
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, wait, spawn again, wait until ready.
    pub(crate) async fn restart(&mut self) {
        let status = self.terminate().await;
        assert!(status.success(), "graceful close exits 0, got {status}");
        self.spawn();
        self.wait_ready().await;
    }

    /// Live worker processes of this server: `(pid, session id)`.
    pub(crate) fn workers(&self) -> Vec<(u32, String)> {
        let mut needle = OsString::from("PI_WORKER_SESSION_DIR=");
        needle.push(self.session_dir.as_os_str());
        let mut needle = needle.as_bytes().to_vec();
        needle.push(0);
        processes_mentioning(&needle)
            .into_iter()
            .filter_map(|pid| Some((pid, env_of(pid, "PI_WORKER_SESSION_ID")?)))
            .collect()
    }

    /// Live worker pids of `session`.
    pub(crate) fn workers_of(&self, session: &str) -> Vec<u32> {
        self.workers()
            .into_iter()
            .filter(|(_, s)| s == session)
            .map(|(pid, _)| pid)
            .collect()
    }

    /// The one live worker of `session` (waits for it to appear).
    pub(crate) async fn worker_of(&self, session: &str) -> u32 {
        let mut found = Vec::new();
        wait_until(&format!("one worker of {session}"), || {
            found = self.workers_of(session);
            found.len() == 1
        })
        .await;
        found[0]
    }

    /// Waits until no worker of `session` runs.
    pub(crate) async fn wait_no_worker(&self, session: &str) {
        wait_until(&format!("the worker of {session} to exit"), || {
            self.workers_of(session).is_empty()
        })
        .await;
    }

    /// The session's directory.
    pub(crate) fn session_path(&self, session: &str) -> PathBuf {
        self.session_dir.join(session)
    }

    /// The server log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// True while the server process runs.
    pub(crate) fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "---- server log ({}), last lines ----",
                self.log_path.display()
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
            eprintln!("---- end of server log ----");
        }
        self.kill();
        // The root's drop kills the workers and removes the directory.
    }
}

/// Whether `program --version` runs and exits 0.
pub(crate) fn available(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `tests/mcp`, with the reference MCP servers installed from npm (once,
/// by its `install.sh`).
pub(crate) async fn mcp_servers() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
    let install = run_bounded(
        Command::new(dir.join("install.sh")),
        Duration::from_secs(300),
        "tests/mcp/install.sh (it needs npm)",
    )
    .await;
    assert!(
        install.status.success(),
        "tests/mcp/install.sh failed: {install:#?}"
    );
    dir
}

/// Runs `command` to completion off the test's runtime, capturing its
/// output; killed after `bound` (a script with its own budget).
pub(crate) async fn run_bounded(command: Command, bound: Duration, what: &str) -> CliOutput {
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let output = match tokio::time::timeout(bound, child.wait_with_output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("wait for {what}: {e}")),
        Err(_) => panic!("{what} did not finish within {bound:?}"),
    };
    CliOutput {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Prints the last 80 lines of the server log under `root` to stderr.
pub(crate) fn print_server_log_tail(root: &Path) {
    let log = std::fs::read_to_string(root.join("server.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(80).collect();
    eprintln!("---- server log, last lines ----");
    for line in tail.iter().rev() {
        eprintln!("{line}");
    }
    eprintln!("---- end of server log ----");
}

/// What a finished command printed.
#[derive(Debug)]
pub(crate) struct CliOutput {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl CliOutput {
    /// Panics with the output unless the command exited 0.
    #[track_caller]
    pub(crate) fn success(self) -> Self {
        assert!(self.status.success(), "the command failed: {self:#?}");
        self
    }
}

/// Runs `command` to completion, capturing its output; killed after [`WAIT`].
pub(crate) async fn run(command: Command) -> CliOutput {
    let mut command = tokio::process::Command::from(command);
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().expect("spawn pi-server");
    let output = within("a CLI command", child.wait_with_output())
        .await
        .expect("wait for pi-server");
    CliOutput {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

// ---------------------------------------------------------------------------
// The stored transcript, read directly from SQLite

/// `(role, status)` of every stored item of a session, in order. Opens the
/// database read-only; only call it when no worker runs.
pub(crate) fn stored_items(session_dir: &Path) -> Vec<(String, Option<String>)> {
    let db = rusqlite::Connection::open_with_flags(
        session_dir.join("session.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open session.sqlite");
    let mut stmt = db
        .prepare("SELECT role, status FROM items ORDER BY seq")
        .expect("prepare");
    stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

// ---------------------------------------------------------------------------
// A raw protocol connection

/// A socket speaking frames by hand: for hostile and slow clients.
#[derive(Debug)]
pub(crate) struct RawConn {
    pub(crate) stream: UnixStream,
    decoder: FrameDecoder,
    ready: VecDeque<Vec<u8>>,
}

impl RawConn {
    /// Connects without sending anything.
    pub(crate) async fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).await.expect("connect raw");
        Self {
            stream,
            decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_LEN),
            ready: VecDeque::new(),
        }
    }

    /// Writes raw bytes.
    pub(crate) async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write raw bytes");
    }

    /// Writes one framed client message.
    pub(crate) async fn send(&mut self, message: &ClientMessage) {
        let payload = encode_client_message(message).expect("encode");
        let frame = encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("frame");
        self.write(&frame).await;
    }

    /// Sends a hello.
    pub(crate) async fn hello(&mut self, version: u64, token: Option<&str>) {
        self.send(&ClientMessage::Hello(ClientHello {
            version,
            token: token.map(str::to_owned),
        }))
        .await;
    }

    /// The next message, or `None` at the end of the stream.
    pub(crate) async fn recv(&mut self) -> Option<ServerMessage> {
        loop {
            if let Some(payload) = self.ready.pop_front() {
                return Some(
                    decode_server_message(&payload, &CborLimits::default())
                        .expect("a valid server message"),
                );
            }
            let mut buf = vec![0u8; 64 * 1024];
            let n = match self.stream.read(&mut buf).await {
                Ok(n) => n,
                // A reset after the server closed with unread input.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
                Err(e) => panic!("raw read failed: {e}"),
            };
            if n == 0 {
                return None;
            }
            let mut out = Vec::new();
            self.decoder
                .push(&buf[..n], &mut out)
                .expect("valid frames");
            self.ready.extend(out);
        }
    }

    /// Expects `hello_error` as the last frame, then the end of the stream.
    pub(crate) async fn expect_hello_error(&mut self) -> ProtocolError {
        within("hello_error and close", async {
            let error = match self.recv().await {
                Some(ServerMessage::HelloError(error)) => error,
                other => panic!("expected hello_error, got {other:?}"),
            };
            let after = self.recv().await;
            assert!(
                after.is_none(),
                "hello_error must be the last frame, then {after:?}"
            );
            error
        })
        .await
    }
}
