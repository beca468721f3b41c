//! Helpers of `tests/e2e_durable.rs`: a private directory tree per test, the
//! real `pi-server` binary, a small blocking pi v1 client, and process
//! checks. Everything a test starts is killed when its [`Env`] drops: servers
//! it spawned itself, and every other process (cold-activated servers,
//! workers, orphans) whose environment points into the test's directory.

#![allow(dead_code, unreachable_pub)]

use kernel::protocol::{
    ClientHello, ClientMessage, Command, CommandResult, CreateParams, ErrorCode, ModelRef,
    PROTOCOL_VERSION, ProtocolError, Request, ServerEvent, ServerHello, ServerMessage,
    SessionSnapshot, decode_server_message, encode_client_message,
};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{CborLimits, FrameDecoder};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_pi-server");

/// Generous bound for anything that should happen "soon" on a loaded machine.
pub const SOON: Duration = Duration::from_secs(10);

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A fresh lowercase UUIDv4.
pub fn uuid() -> String {
    kernel::rng::Rng::new(seed()).uuid_v4()
}

/// Polls `condition` every 10 ms until it holds; panics after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True while process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// Sends a signal (`"TERM"`, `"KILL"`, …) to `pid`.
pub fn signal(pid: u32, name: &str) {
    let _ = Process::new("kill")
        .arg("-s")
        .arg(name)
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// The pid recorded in a session's lock file (the worker holding it last).
pub fn lock_pid(session_dir: &Path, session_id: &str) -> Option<u32> {
    // The first line is the holder's pid; the second, its server's worker socket.
    std::fs::read_to_string(session_dir.join(session_id).join("lock"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Output of a finished command.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> &Self {
        assert!(
            self.status.success(),
            "command failed ({}):\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    pub fn failed(&self) -> &Self {
        assert!(
            !self.status.success(),
            "command should have failed:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// A `pi-server serve` child of the test.
pub struct Server {
    pub child: Child,
    pub id: String,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "server {} did not exit within {timeout:?}; log:\n{}",
                self.pid(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One test's private world: server dir, agent dir (settings, sessions).
pub struct Env {
    pub root: PathBuf,
    pub server_dir: PathBuf,
    pub agent_dir: PathBuf,
    /// The default session dir (`<agentDir>/sessions`).
    pub session_dir: PathBuf,
    vars: Vec<(String, String)>,
    started: Instant,
    name: String,
}

impl Env {
    pub fn new(name: &str) -> Self {
        // Short: socket paths must stay under 108 bytes.
        let root = std::env::temp_dir().join(format!(
            "pdur-{}-{:x}",
            std::process::id(),
            seed() & 0xffff_ffff
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create test root");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .expect("chmod root");
        let agent_dir = root.join("agent");
        let env = Self {
            server_dir: root.join("srv"),
            session_dir: agent_dir.join("sessions"),
            agent_dir,
            root,
            vars: Vec::new(),
            started: Instant::now(),
            name: name.to_owned(),
        };
        std::fs::create_dir_all(&env.server_dir).expect("create server dir");
        std::fs::set_permissions(&env.server_dir, std::fs::Permissions::from_mode(0o700))
            .expect("chmod server dir");
        env
    }

    /// Sets an environment variable for every process started from now on.
    pub fn var(&mut self, name: &str, value: &str) -> &mut Self {
        self.vars.retain(|(n, _)| n != name);
        self.vars.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The environment every process of this world gets (set, then removed).
    pub fn environment(&self) -> (Vec<(String, String)>, Vec<&'static str>) {
        let mut set = vec![
            ("HOME".to_owned(), self.root.display().to_string()),
            (
                "PI_CODING_AGENT_DIR".to_owned(),
                self.agent_dir.display().to_string(),
            ),
            (
                "PI_SERVER_DIR".to_owned(),
                self.server_dir.display().to_string(),
            ),
        ];
        set.extend(self.vars.iter().cloned());
        let removed = vec![
            "PI_SERVER_ID",
            "PI_SERVER_IDLE_EXIT_MS",
            "PI_SERVER_TOKEN_FILE",
            "PI_WORKER_ORPHAN_GRACE_MS",
            "PI_SERVER_ADOPTION_GRACE_MS",
            "PI_FAUX_DELAY_MS",
            "RUST_LOG",
        ];
        (set, removed)
    }

    /// `pi-server <args>` with this world's environment.
    pub fn command(&self, args: &[&str]) -> Process {
        let mut cmd = Process::new(BIN);
        cmd.args(args).current_dir(&self.root).stdin(Stdio::null());
        let (set, removed) = self.environment();
        for name in removed {
            cmd.env_remove(name);
        }
        for (name, value) in set {
            cmd.env(name, value);
        }
        cmd
    }

    /// Runs a client command to completion (at most 30 s).
    pub fn run(&self, args: &[&str]) -> Out {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pi-server");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`pi-server {}` did not finish within 30 s", args.join(" "));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Out {
            status,
            stdout: out_reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        }
    }

    pub fn socket(&self, server_id: &str) -> PathBuf {
        self.server_dir.join(format!("{server_id}.sock"))
    }

    /// Starts `pi-server serve --server-id <id> <extra…>` in the foreground
    /// (a child of the test), without waiting for it.
    pub fn spawn_serve(&self, server_id: &str, extra: &[&str]) -> Server {
        let log = self.root.join(format!(
            "serve-{}.log",
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::File::create(&log).expect("server log");
        let mut args = vec!["serve", "--server-id", server_id];
        args.extend_from_slice(extra);
        let child = self
            .command(&args)
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("spawn serve");
        Server {
            child,
            id: server_id.to_owned(),
            socket: self.socket(server_id),
            log,
        }
    }

    /// [`Env::spawn_serve`], then waits until it answers a hello.
    pub fn serve(&self, server_id: &str, extra: &[&str]) -> Server {
        let mut server = self.spawn_serve(server_id, extra);
        let deadline = Instant::now() + SOON;
        loop {
            if Conn::connect(&server.socket).is_ok() {
                return server;
            }
            if let Some(status) = server.child.try_wait().expect("try_wait") {
                panic!("serve exited ({status}); log:\n{}", server.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "serve did not answer; log:\n{}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Connects to server `server_id` of this world.
    pub fn connect(&self, server_id: &str) -> Conn {
        Conn::connect(&self.socket(server_id))
            .unwrap_or_else(|e| panic!("connect to {server_id}: {e}"))
    }

    /// The id in `<serverDir>/default-server-id`.
    pub fn default_server_id(&self) -> String {
        std::fs::read_to_string(self.server_dir.join("default-server-id"))
            .expect("default-server-id")
            .trim()
            .to_owned()
    }

    /// Every process (other than this one) whose environment points into this world.
    pub fn processes(&self) -> Vec<u32> {
        let marker = format!("PI_CODING_AGENT_DIR={}\0", self.agent_dir.display()).into_bytes();
        let me = std::process::id();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me && alive(pid))
            .filter(|&pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.windows(marker.len()).any(|w| w == marker.as_slice()))
            })
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for _ in 0..3 {
            let pids = self.processes();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                signal(pid, "KILL");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        } else {
            eprintln!(
                "[{}] kept {} for inspection",
                self.name,
                self.root.display()
            );
        }
        eprintln!(
            "[{}] took {:.2} s",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// A blocking pi v1 client, enough for the tests.
pub struct Conn {
    stream: UnixStream,
    decoder: FrameDecoder,
    inbox: VecDeque<ServerMessage>,
    pub events: VecDeque<ServerEvent>,
    next: u64,
    pub hello: ServerHello,
    closed: bool,
}

/// Why [`Conn::connect`] failed.
#[derive(Debug)]
pub enum ConnectError {
    Io(std::io::Error),
    Refused(ProtocolError),
    Other(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

pub fn frame(message: &ClientMessage) -> Vec<u8> {
    encode_frame(
        &encode_client_message(message).expect("encode"),
        DEFAULT_MAX_FRAME_LEN,
    )
    .expect("frame")
}

impl Conn {
    pub fn connect(path: &Path) -> Result<Self, ConnectError> {
        let mut stream = UnixStream::connect(path).map_err(ConnectError::Io)?;
        let hello = ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: None,
        });
        stream.write_all(&frame(&hello)).map_err(ConnectError::Io)?;
        let mut conn = Self {
            stream,
            decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_LEN),
            inbox: VecDeque::new(),
            events: VecDeque::new(),
            next: 1,
            hello: ServerHello {
                version: 0,
                connection_id: String::new(),
                snapshot: kernel::protocol::ServerSnapshot {
                    server_id: String::new(),
                    protocol_version: 0,
                    revision: 0,
                    sessions: Vec::new(),
                    models: Vec::new(),
                },
            },
            closed: false,
        };
        match conn.recv(Instant::now() + SOON) {
            Some(ServerMessage::Hello(hello)) => {
                conn.hello = hello;
                Ok(conn)
            }
            Some(ServerMessage::HelloError(e)) => Err(ConnectError::Refused(e)),
            Some(other) => Err(ConnectError::Other(format!(
                "expected hello, got {other:?}"
            ))),
            None => Err(ConnectError::Other("no hello".into())),
        }
    }

    /// The next message before `deadline`; `None` on timeout or end of stream.
    fn recv(&mut self, deadline: Instant) -> Option<ServerMessage> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(m) = self.inbox.pop_front() {
                return Some(m);
            }
            if self.closed {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            self.stream
                .set_read_timeout(Some(deadline - now))
                .expect("timeout");
            match self.stream.read(&mut buf) {
                Ok(0) => self.closed = true,
                Ok(n) => {
                    let mut payloads = Vec::new();
                    if self.decoder.push(&buf[..n], &mut payloads).is_err() {
                        self.closed = true;
                    }
                    for p in payloads {
                        let m = decode_server_message(&p, &CborLimits::default())
                            .expect("valid server message");
                        self.inbox.push_back(m);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => self.closed = true,
            }
        }
    }

    /// Sends a request; returns its id.
    pub fn send(&mut self, command: Command) -> String {
        let id = format!("r{}", self.next);
        self.next += 1;
        let message = ClientMessage::Request(Request {
            id: id.clone(),
            command,
        });
        self.stream
            .write_all(&frame(&message))
            .expect("send request");
        id
    }

    /// Waits for the response to request `id` (events meanwhile are kept).
    pub fn response(
        &mut self,
        id: &str,
        timeout: Duration,
    ) -> Result<CommandResult, ProtocolError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.recv(deadline) {
                Some(ServerMessage::Response(r)) if r.id == id => return r.outcome,
                Some(ServerMessage::Event(e)) => self.events.push_back(e),
                Some(_) => {}
                None => panic!(
                    "no response to {id} within {timeout:?} (closed: {})",
                    self.closed
                ),
            }
        }
    }

    pub fn request(&mut self, command: Command) -> Result<CommandResult, ProtocolError> {
        let id = self.send(command);
        self.response(&id, SOON)
    }

    pub fn create(&mut self, params: CreateParams) -> SessionSnapshot {
        match self.request(Command::Create(params)) {
            Ok(CommandResult::Create { session }) => session,
            other => panic!("create: {other:?}"),
        }
    }

    pub fn attach(&mut self, session_id: &str) -> SessionSnapshot {
        match self.request(Command::Attach {
            session_id: session_id.into(),
        }) {
            Ok(CommandResult::Attach { session }) => session,
            other => panic!("attach {session_id}: {other:?}"),
        }
    }

    pub fn set_model(&mut self, session_id: &str, provider: &str, id: &str) -> SessionSnapshot {
        let model = ModelRef {
            provider: provider.into(),
            id: id.into(),
        };
        match self.request(Command::SetModel {
            session_id: session_id.into(),
            model,
        }) {
            Ok(CommandResult::SetModel { session }) => session,
            other => panic!("set_model {session_id}: {other:?}"),
        }
    }

    pub fn list(&mut self) -> Vec<String> {
        match self.request(Command::List) {
            Ok(CommandResult::List { sessions }) => sessions.into_iter().map(|s| s.id).collect(),
            other => panic!("list: {other:?}"),
        }
    }

    /// Waits for an event matching `pred` (earlier ones are consumed).
    pub fn wait_event(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&ServerEvent) -> bool,
    ) -> Option<ServerEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(e) = self.events.pop_front() {
                if pred(&e) {
                    return Some(e);
                }
            }
            match self.recv(deadline) {
                Some(ServerMessage::Event(e)) => self.events.push_back(e),
                Some(_) => {}
                None => return None,
            }
        }
    }

    /// True if the server has closed the connection by now (reads what is
    /// already there, without waiting).
    pub fn closed_now(&mut self) -> bool {
        if self.closed {
            return true;
        }
        self.stream.set_nonblocking(true).expect("nonblocking");
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => {
                    let mut payloads = Vec::new();
                    if self.decoder.push(&buf[..n], &mut payloads).is_err() {
                        self.closed = true;
                        break;
                    }
                    for p in payloads {
                        let m = decode_server_message(&p, &CborLimits::default())
                            .expect("valid server message");
                        self.inbox.push_back(m);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.closed = true;
                    break;
                }
            }
        }
        self.stream.set_nonblocking(false).expect("blocking");
        self.closed
    }

    /// True once the server closed the connection (reads everything until then).
    pub fn is_closed(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.closed {
            match self.recv(deadline) {
                Some(ServerMessage::Event(e)) => self.events.push_back(e),
                Some(_) => {}
                None if self.closed => break,
                None => return false,
            }
        }
        true
    }
}

/// True when the error refused a hello with `code`.
pub fn refused_with(error: &ConnectError, code: ErrorCode) -> bool {
    matches!(error, ConnectError::Refused(e) if e.code == code)
}
