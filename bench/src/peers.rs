//! Issue 19, item 1: peers. The same scripted work on pi-server and on two
//! published coding-agent servers that also serve sessions to clients:
//!
//! - `@openai/codex` (`codex app-server --listen unix://…`: JSON-RPC over a
//!   WebSocket on a Unix socket; `thread/start`, `turn/start`, notifications
//!   `item/agentMessage/delta` … `turn/completed`; an observer is another
//!   connection that sends `thread/resume` for the running thread);
//! - `opencode-ai` (`opencode serve`: HTTP on 127.0.0.1; `POST /session`,
//!   `POST /session/:id/prompt_async`, events on the SSE stream `GET /event`
//!   (`message.part.delta` … `session.idle`); an observer is another `/event`
//!   stream plus `GET /session/:id`).
//!
//! Both are installed from npm under `<target>/bench-peers` (once), as item 6
//! installs the TypeScript pi-server; each runs its native linux binary
//! from the package. All three systems are pointed at one scripted model
//! server in this process ([`crate::mockllm`]): pi-server and Codex speak
//! the Responses API to it, opencode Chat Completions (its
//! `@ai-sdk/openai-compatible` provider). Every reply is the same `WORDS`
//! words, one delta each. Nothing reaches the network and no key is real.
//!
//! Figures: prompt → first text delta seen by the prompting client, and
//! prompt → turn end (the driver's view); server CPU per streamed delta
//! (the server's process tree, over the mock's delta count); memory (PSS
//! summed over the server's process tree) fresh, per idle session, per
//! attached observer; after 1,000 turns in one session; after 200 observer
//! reconnects. Turn timings alternate between the systems, round by round.

use crate::mockllm::MockLlm;
use crate::raw::{Kind, RawConn, decode, is_progress, kind, v1_request};
use crate::util::{Env, Report, fmt_us, median, sorted};
use futures_util::{SinkExt, StreamExt};
use kernel::protocol::{
    Command, CommandResult, CreateParams, ModelRef, Response, ServerEvent, ServerMessage,
    SessionPhase,
};
use serde_json::{Value as Json, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

const CODEX: &str = "@openai/codex@0.171.0";
const OPENCODE: &str = "opencode-ai@1.18.33";

/// Words (text deltas) in every scripted reply.
const WORDS: u64 = 100;

/// Time allowed for one turn or one request.
const TIMEOUT: Duration = Duration::from_secs(120);

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// At most 600 bytes of an error text.
fn short(mut text: String) -> String {
    if text.len() > 600 {
        let mut cut = 600;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" …");
    }
    text
}

// ---- install -------------------------------------------------------------------

/// Installs both packages under `<target>/bench-peers` (once); returns the dir.
fn install(env: &Env) -> Res<PathBuf> {
    let dir = env.target_dir.join("bench-peers");
    std::fs::create_dir_all(&dir).map_err(err)?;
    let have = |pkg: &str, version: &str| {
        std::fs::read_to_string(dir.join("node_modules").join(pkg).join("package.json"))
            .is_ok_and(|t| t.contains(&format!("\"version\": \"{version}\"")))
    };
    if !(have("@openai/codex", "0.171.0") && have("opencode-ai", "1.18.33")) {
        std::fs::write(
            dir.join("package.json"),
            "{\n  \"name\": \"pi-bench-peers\",\n  \"private\": true\n}\n",
        )
        .map_err(err)?;
        println!("  npm install {CODEX} {OPENCODE} in {} ...", dir.display());
        let status = Process::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .args([CODEX, OPENCODE])
            .current_dir(&dir)
            .status()
            .map_err(|e| format!("cannot run npm: {e}"))?;
        if !status.success() {
            return Err(format!("npm install failed: {status}"));
        }
    }
    Ok(dir)
}

/// The native binaries the packages ship for this machine.
fn binaries(dir: &Path) -> (Res<PathBuf>, Res<PathBuf>) {
    let (npm_arch, triple) = match std::env::consts::ARCH {
        "x86_64" => ("x64", "x86_64-unknown-linux-musl"),
        "aarch64" => ("arm64", "aarch64-unknown-linux-musl"),
        other => ("?", other),
    };
    let modules = dir.join("node_modules");
    let found = |path: PathBuf| {
        if path.exists() {
            Ok(path)
        } else {
            Err(format!("{} is missing", path.display()))
        }
    };
    (
        found(
            modules
                .join(format!("@openai/codex-linux-{npm_arch}/vendor"))
                .join(triple)
                .join("bin/codex"),
        ),
        found(modules.join(format!("opencode-linux-{npm_arch}/bin/opencode"))),
    )
}

/// The first line of `bin --version`.
fn version(bin: &Path) -> String {
    Process::new(bin)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default()
}

// ---- /proc over a process tree ---------------------------------------------------

/// `pid` and all its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        all.extend(crate::util::children(all[i]));
        i += 1;
    }
    all
}

/// Sum of the proportional set sizes (`Pss` of `/proc/<pid>/smaps_rollup`)
/// over the tree, KiB: pages shared between the processes of the tree (a
/// worker's code, say) are counted once in all, unlike a sum of RSS.
fn tree_rss(pid: u32) -> u64 {
    tree(pid).into_iter().filter_map(pss_kib).sum()
}

fn pss_kib(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU seconds the tree's live processes have run.
fn tree_cpu(pid: u32) -> f64 {
    tree(pid)
        .into_iter()
        .map(|p| crate::util::schedstat(p).0)
        .sum::<u64>() as f64
        / 1e9
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

fn kib(kib: f64) -> String {
    if kib.abs() >= 1024.0 {
        format!("{:.2} MiB", kib / 1024.0)
    } else {
        format!("{kib:.0} KiB")
    }
}

// ---- a child process, stopped on drop ----------------------------------------------

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        crate::server::signal(self.0.id(), rustix::process::Signal::TERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---- one turn's timings -------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn {
    /// Prompt sent → first text delta received.
    pub(crate) first: Duration,
    /// Prompt sent → turn end received.
    pub(crate) total: Duration,
    /// Text delta messages received.
    pub(crate) deltas: usize,
    /// Bytes received by the prompting client during the turn.
    pub(crate) bytes: usize,
}

async fn deadline<T>(what: &str, f: impl std::future::Future<Output = Res<T>>) -> Res<T> {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .map_err(|_| format!("{what}: no answer in {TIMEOUT:?}"))?
}

// ---- ours -----------------------------------------------------------------------------

struct Ours {
    server: crate::server::Server,
    conn: RawConn,
    cwd: String,
    model: ModelRef,
}

impl Ours {
    async fn start(env: &Env, mock: &MockLlm) -> Res<Self> {
        let agent = env.fresh_dir("peers-ours-agent");
        let models = json!({"providers": {"mock": {
            "baseUrl": mock.base, "api": "openai-responses",
            "models": [{"id": "mock", "contextWindow": 10_000_000, "maxTokens": 32000}]}}});
        std::fs::write(agent.join("models.json"), models.to_string()).map_err(err)?;
        std::fs::write(
            agent.join("settings.json"),
            json!({"defaultProvider": "mock", "defaultModel": "mock"}).to_string(),
        )
        .map_err(err)?;
        let sessions = env.fresh_dir("peers-ours-sessions");
        let cwd = env.fresh_dir("peers-ours-project").display().to_string();
        let vars = [("PI_CODING_AGENT_DIR", agent.display().to_string())];
        let server = crate::server::Server::start(env, &sessions, &vars)?;
        let mut conn = RawConn::connect(&server.socket).await.map_err(err)?;
        conn.hello_v1().await.map_err(err)?;
        Ok(Self {
            server,
            conn,
            cwd,
            model: ModelRef {
                provider: "mock".into(),
                id: "mock".into(),
            },
        })
    }

    async fn create(&mut self) -> Res<String> {
        let create = v1_request(
            "c",
            Command::Create(CreateParams {
                cwd: Some(self.cwd.clone()),
                name: None,
                model: Some(self.model.clone()),
                thinking_level: None,
            }),
        );
        self.conn.send(&create).await.map_err(err)?;
        let payload = self.conn.until_response().await.map_err(err)?;
        let id = match decode(&payload)? {
            ServerMessage::Response(Response {
                outcome: Ok(CommandResult::Create { session }),
                ..
            }) => session.id,
            other => return Err(short(format!("create failed: {other:?}"))),
        };
        attach(&mut self.conn, &id).await?;
        Ok(id)
    }

    async fn turn(&mut self, id: &str, text: &str) -> Res<Turn> {
        v1_turn(&mut self.conn, id, text).await
    }
}

/// One v1 turn of `conn` (attached to `id`): prompt → first text delta → turn end,
/// and the bytes it received meanwhile (`v8` measures v1 this way too).
pub(crate) async fn v1_turn(conn: &mut RawConn, id: &str, text: &str) -> Res<Turn> {
    let prompt = v1_request(
        "p",
        Command::Prompt {
            session_id: id.into(),
            text: text.into(),
        },
    );
    let start = Instant::now();
    conn.send(&prompt).await.map_err(err)?;
    let mut first = None;
    let mut deltas = 0;
    let mut bytes = 0;
    // The turn ends at the first idle snapshot of the session after a
    // delta (an event, or the prompt's answer, which comes at the end
    // of the turn); the answer is read before returning in both cases.
    // A snapshot carries the whole transcript: its id and phase come
    // first, and are read from its head (see `snapshot_head`), so that
    // this client's cost does not grow with the session.
    let mut idle_at = None;
    let mut answered = false;
    loop {
        conn.fill().await.map_err(err)?;
        let now = Instant::now();
        let mut failure = None;
        conn.drain(|payload| {
            bytes += payload.len();
            if is_progress(payload) {
                if payload.windows(15).any(|w| w == b"assistant_delta") {
                    deltas += 1;
                    first.get_or_insert(now);
                }
                return;
            }
            let head = snapshot_head(payload, id);
            match kind(payload) {
                Kind::Event if head == Some(Some(true)) && first.is_some() => {
                    idle_at.get_or_insert(now);
                }
                Kind::Response if head.is_some() && find(payload, b"\x62ok\xf5").is_some() => {
                    answered = true;
                    if head == Some(Some(true)) {
                        idle_at.get_or_insert(now);
                    }
                }
                Kind::Event if head.is_some() => {}
                _ => match decode(payload) {
                    Ok(ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }))
                        if snapshot.id == id
                            && snapshot.phase == SessionPhase::Idle
                            && first.is_some() =>
                    {
                        idle_at.get_or_insert(now);
                    }
                    Ok(ServerMessage::Response(Response {
                        outcome: Ok(CommandResult::Prompt { session }),
                        ..
                    })) => {
                        answered = true;
                        if session.phase == SessionPhase::Idle {
                            idle_at.get_or_insert(now);
                        }
                    }
                    Ok(ServerMessage::Response(Response {
                        outcome: Err(e), ..
                    })) => failure = Some(short(format!("prompt failed: {e:?}"))),
                    _ => {}
                },
            }
        });
        if let Some(f) = failure {
            return Err(f);
        }
        if answered && let Some(end) = idle_at {
            let first = first.ok_or("the turn ended without a text delta")?;
            return Ok(Turn {
                first: first - start,
                total: end - start,
                deltas,
                bytes,
            });
        }
    }
}

/// For a frame carrying a snapshot of session `id` (an event or a
/// response) whose `phase` lies in its first KiB: `Some(Some(idle?))`;
/// `Some(None)` for a snapshot of another session; `None` when the head does
/// not tell (then the frame is decoded whole).
fn snapshot_head(payload: &[u8], id: &str) -> Option<Option<bool>> {
    let head = &payload[..payload.len().min(1024)];
    let at = find(head, b"\x65phase")? + 6;
    let phase = head.get(at..)?;
    let mut key = vec![0x62, b'i', b'd'];
    match id.len() {
        n @ 0..=23 => key.push(0x60 + n as u8),
        n @ 24..=255 => key.extend_from_slice(&[0x78, n as u8]),
        _ => return None,
    }
    key.extend_from_slice(id.as_bytes());
    if find(head, &key).is_none() {
        return Some(None);
    }
    Some(Some(phase.starts_with(b"\x64idle")))
}

/// Attaches `conn` (after its hello) to `id`.
pub(crate) async fn attach(conn: &mut RawConn, id: &str) -> Res<()> {
    let attach = v1_request(
        "a",
        Command::Attach {
            session_id: id.into(),
        },
    );
    conn.send(&attach).await.map_err(err)?;
    let payload = conn.until_response().await.map_err(err)?;
    match decode(&payload)? {
        ServerMessage::Response(Response {
            outcome: Ok(CommandResult::Attach { .. }),
            ..
        }) => Ok(()),
        other => Err(short(format!("attach failed: {other:?}"))),
    }
}

// ---- Codex app-server ------------------------------------------------------------------

type Ws = WebSocketStream<UnixStream>;

/// A JSON-RPC connection to the Codex app-server.
struct CodexConn {
    ws: Ws,
    next: u64,
    /// Bytes of messages received.
    received: usize,
}

impl CodexConn {
    async fn connect(socket: &Path) -> Res<Self> {
        let stream = UnixStream::connect(socket).await.map_err(err)?;
        let (ws, _) = tokio_tungstenite::client_async("ws://localhost/", stream)
            .await
            .map_err(err)?;
        let mut conn = Self {
            ws,
            next: 1,
            received: 0,
        };
        conn.call(
            "initialize",
            json!({"clientInfo": {"name": "pi-bench", "version": "0"},
                "capabilities": {"experimentalApi": false, "requestAttestation": false}}),
        )
        .await?;
        conn.notify("initialized").await?;
        Ok(conn)
    }

    async fn send(&mut self, value: &Json) -> Res<()> {
        self.ws
            .send(Message::text(value.to_string()))
            .await
            .map_err(err)
    }

    async fn notify(&mut self, method: &str) -> Res<()> {
        self.send(&json!({"method": method})).await
    }

    /// The next JSON message.
    async fn message(&mut self) -> Res<Json> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    self.received += t.len();
                    return serde_json::from_str(&t).map_err(err);
                }
                Some(Ok(Message::Close(_))) | None => return Err("codex closed".into()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
    }

    /// Sends a request; returns its result (notifications before it are dropped).
    async fn call(&mut self, method: &str, params: Json) -> Res<Json> {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"id": id, "method": method, "params": params}))
            .await?;
        loop {
            let m = self.message().await?;
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                if let Some(e) = m.get("error") {
                    return Err(format!("codex {method}: {e}"));
                }
                return Ok(m["result"].clone());
            }
        }
    }
}

struct Codex {
    proc: Proc,
    socket: PathBuf,
    conn: CodexConn,
    cwd: String,
}

impl Codex {
    async fn start(env: &Env, bin: &Path, mock: &MockLlm) -> Res<Self> {
        let dir = env.fresh_dir("peers-codex");
        let home = dir.join("home");
        std::fs::create_dir_all(&home).map_err(err)?;
        let config = format!(
            "model = \"mock\"\nmodel_provider = \"mock\"\napproval_policy = \"never\"\n\
             sandbox_mode = \"read-only\"\nmodel_context_window = 10000000\n\
             [model_providers.mock]\nname = \"mock\"\nbase_url = \"{}\"\n\
             wire_api = \"responses\"\nenv_key = \"PI_BENCH_MOCK_KEY\"\n\
             [analytics]\nenabled = false\n",
            mock.base
        );
        std::fs::write(home.join("config.toml"), config).map_err(err)?;
        let cwd = env.fresh_dir("peers-codex-project");
        let socket = dir.join("codex.sock");
        let log = std::fs::File::create(dir.join("codex.log")).map_err(err)?;
        let child = Process::new(bin)
            .arg("app-server")
            .arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .current_dir(&cwd)
            .env("CODEX_HOME", &home)
            .env("HOME", &dir)
            .env("PI_BENCH_MOCK_KEY", "bench-not-a-key")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run codex: {e}"))?;
        let mut proc = Proc(child);
        let start = Instant::now();
        let conn = loop {
            if let Ok(Some(status)) = proc.0.try_wait() {
                let log = std::fs::read_to_string(dir.join("codex.log")).unwrap_or_default();
                return Err(format!("codex app-server exited ({status}): {log}"));
            }
            if socket.exists()
                && let Ok(conn) = CodexConn::connect(&socket).await
            {
                break conn;
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err("codex app-server did not listen in 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok(Self {
            proc,
            socket,
            conn,
            cwd: cwd.display().to_string(),
        })
    }

    async fn create(&mut self) -> Res<String> {
        let cwd = self.cwd.clone();
        let r = self.conn.call("thread/start", json!({"cwd": cwd})).await?;
        r["thread"]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("thread/start answered {r}"))
    }

    async fn turn(&mut self, id: &str, text: &str) -> Res<Turn> {
        let start = Instant::now();
        let received0 = self.conn.received;
        let req = self.conn.next;
        self.conn.next += 1;
        self.conn
            .send(
                &json!({"id": req, "method": "turn/start", "params": {"threadId": id,
                "input": [{"type": "text", "text": text}]}}),
            )
            .await?;
        let mut first = None;
        let mut deltas = 0;
        loop {
            let m = self.conn.message().await?;
            let now = Instant::now();
            if m.get("id") == Some(&json!(req))
                && let Some(e) = m.get("error")
            {
                return Err(format!("turn/start: {e}"));
            }
            match m.get("method").and_then(Json::as_str) {
                Some("item/agentMessage/delta") if m["params"]["threadId"] == id => {
                    deltas += 1;
                    first.get_or_insert(now);
                }
                Some("turn/completed") if m["params"]["threadId"] == id => {
                    let first = first.ok_or_else(|| {
                        format!("the turn ended without a text delta: {}", m["params"])
                    })?;
                    return Ok(Turn {
                        first: first - start,
                        total: now - start,
                        deltas,
                        bytes: self.conn.received - received0,
                    });
                }
                Some("error") => return Err(format!("codex error: {}", m["params"])),
                _ => {}
            }
        }
    }

    /// A new connection following thread `id`.
    async fn observe(&self, id: &str) -> Res<CodexConn> {
        let mut conn = CodexConn::connect(&self.socket).await?;
        conn.call(
            "thread/resume",
            json!({"threadId": id, "excludeTurns": true}),
        )
        .await?;
        Ok(conn)
    }
}

// ---- opencode serve ----------------------------------------------------------------------

/// One HTTP/1.1 request on a new connection (`connection: close`); the
/// status and the body.
async fn http(addr: &str, method: &str, path: &str, body: Option<&Json>) -> Res<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr).await.map_err(err)?;
    stream.set_nodelay(true).map_err(err)?;
    let body = body.map(Json::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream
        .write_all(format!("{head}{body}").as_bytes())
        .await
        .map_err(err)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.map_err(err)?;
    let end = find(&raw, b"\r\n\r\n").ok_or("no HTTP head")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no HTTP status")?;
    let mut body = raw[end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = Vec::new();
        dechunk(&mut body, &mut out);
        body = out;
    }
    Ok((status, body))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Moves every complete chunk of `raw` into `out`; true at the last chunk.
fn dechunk(raw: &mut Vec<u8>, out: &mut Vec<u8>) -> bool {
    let mut at = 0;
    let mut last = false;
    while let Some(eol) = find(&raw[at..], b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[at..at + eol]).to_string();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or(0);
        let data = at + eol + 2;
        if raw.len() < data + size + 2 {
            break;
        }
        out.extend_from_slice(&raw[data..data + size]);
        at = data + size + 2;
        if size == 0 {
            last = true;
            break;
        }
    }
    raw.drain(..at);
    last
}

/// A client of opencode's `GET /event` server-sent events.
struct Sse {
    /// Bytes of events received (the body, without chunk framing).
    received: usize,
    stream: TcpStream,
    raw: Vec<u8>,
    body: Vec<u8>,
    chunked: bool,
}

impl Sse {
    async fn open(addr: &str) -> Res<Self> {
        let mut stream = TcpStream::connect(addr).await.map_err(err)?;
        stream.set_nodelay(true).map_err(err)?;
        stream
            .write_all(
                format!("GET /event HTTP/1.1\r\nhost: {addr}\r\naccept: text/event-stream\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .map_err(err)?;
        let mut raw = Vec::new();
        let end = loop {
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).await.map_err(err)?;
            if n == 0 {
                return Err("opencode closed /event".into());
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(end) = find(&raw, b"\r\n\r\n") {
                break end;
            }
        };
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        if !head.starts_with("http/1.1 200") {
            return Err(format!("GET /event: {head}"));
        }
        raw.drain(..end + 4);
        let chunked = head.contains("transfer-encoding: chunked");
        let mut body = Vec::new();
        if chunked {
            dechunk(&mut raw, &mut body);
        } else {
            body = std::mem::take(&mut raw);
        }
        let mut sse = Self {
            received: 0,
            stream,
            raw,
            body,
            chunked,
        };
        // The stream starts with `server.connected`.
        let first = sse.event().await?;
        if first["type"] != "server.connected" {
            return Err(format!("/event began with {first}"));
        }
        Ok(sse)
    }

    /// The next event's `data` as JSON.
    async fn event(&mut self) -> Res<Json> {
        loop {
            if let Some(end) = find(&self.body, b"\n\n") {
                let block: Vec<u8> = self.body.drain(..end + 2).collect();
                self.received += block.len();
                let text = String::from_utf8_lossy(&block);
                let data: String = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return serde_json::from_str(&data).map_err(err);
            }
            let mut buf = [0u8; 16384];
            let n = self.stream.read(&mut buf).await.map_err(err)?;
            if n == 0 {
                return Err("opencode closed /event".into());
            }
            if self.chunked {
                self.raw.extend_from_slice(&buf[..n]);
                dechunk(&mut self.raw, &mut self.body);
            } else {
                self.body.extend_from_slice(&buf[..n]);
            }
        }
    }
}

struct Opencode {
    proc: Proc,
    addr: String,
    events: Sse,
}

impl Opencode {
    async fn start(env: &Env, bin: &Path, mock: &MockLlm) -> Res<Self> {
        let dir = env.fresh_dir("peers-opencode");
        let cwd = env.fresh_dir("peers-opencode-project");
        let config = json!({
            "$schema": "https://opencode.ai/config.json",
            "model": "mock/mock",
            "small_model": "mock/mock",
            "autoupdate": false,
            "share": "disabled",
            "provider": {"mock": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Mock",
                "options": {"baseURL": mock.base, "apiKey": "bench-not-a-key"},
                "models": {"mock": {"name": "Mock", "limit": {"context": 10_000_000, "output": 32000}}}
            }}
        });
        std::fs::write(cwd.join("opencode.json"), config.to_string()).map_err(err)?;
        let log = std::fs::File::create(dir.join("opencode.log")).map_err(err)?;
        let mut child = Process::new(bin)
            .args(["serve", "--hostname", "127.0.0.1", "--port", "0"])
            .current_dir(&cwd)
            .env("HOME", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run opencode: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let proc = Proc(child);
        // "opencode server listening on http://127.0.0.1:<port>"
        let mut reader = BufReader::new(stdout);
        let addr = loop {
            let mut line = String::new();
            if reader.read_line(&mut line).map_err(err)? == 0 {
                let log = std::fs::read_to_string(dir.join("opencode.log")).unwrap_or_default();
                return Err(format!("opencode serve ended before listening: {log}"));
            }
            if let Some(url) = line.trim().split("listening on http://").nth(1) {
                break url.trim_end_matches('/').to_string();
            }
        };
        // Keep reading its stdout so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let events = Sse::open(&addr).await?;
        Ok(Self { proc, addr, events })
    }

    async fn create(&mut self) -> Res<String> {
        let (status, body) = http(&self.addr, "POST", "/session", Some(&json!({}))).await?;
        let v: Json = serde_json::from_slice(&body).map_err(err)?;
        match v["id"].as_str() {
            Some(id) if status == 200 => Ok(id.to_string()),
            _ => Err(format!("POST /session: {status} {v}")),
        }
    }

    async fn turn(&mut self, id: &str, text: &str) -> Res<Turn> {
        let body = json!({"parts": [{"type": "text", "text": text}],
            "model": {"providerID": "mock", "modelID": "mock"}});
        let start = Instant::now();
        let received0 = self.events.received;
        let (status, answer) = http(
            &self.addr,
            "POST",
            &format!("/session/{id}/prompt_async"),
            Some(&body),
        )
        .await?;
        if !(200..300).contains(&status) {
            return Err(format!(
                "prompt_async: {status} {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        let mut first = None;
        let mut deltas = 0;
        loop {
            let e = self.events.event().await?;
            let now = Instant::now();
            let props = &e["properties"];
            if props["sessionID"] != id {
                continue;
            }
            match e["type"].as_str() {
                Some("message.part.delta") if props["field"] == "text" => {
                    deltas += 1;
                    first.get_or_insert(now);
                }
                Some("session.idle") => {
                    let first = first.ok_or("the turn ended without a text delta")?;
                    return Ok(Turn {
                        first: first - start,
                        total: now - start,
                        deltas,
                        bytes: self.events.received - received0,
                    });
                }
                Some("session.error") => return Err(format!("opencode: {props}")),
                _ => {}
            }
        }
    }

    /// A new event stream, and the session read once (as an attach's snapshot).
    async fn observe(&self, id: &str) -> Res<Sse> {
        let sse = Sse::open(&self.addr).await?;
        let (status, _) = http(&self.addr, "GET", &format!("/session/{id}"), None).await?;
        if status != 200 {
            return Err(format!("GET /session/{id}: {status}"));
        }
        Ok(sse)
    }
}

// ---- the three, behind one face ------------------------------------------------------------

enum Sys {
    Ours(Box<Ours>),
    Codex(Box<Codex>),
    Opencode(Box<Opencode>),
}

/// An attached observer's connection, kept open.
#[allow(dead_code)] // held for its connection only
enum Observer {
    Ours(RawConn),
    Codex(Box<CodexConn>),
    Opencode(Box<Sse>),
}

impl Sys {
    fn name(&self) -> &'static str {
        match self {
            Sys::Ours(_) => "pi-server",
            Sys::Codex(_) => "codex app-server",
            Sys::Opencode(_) => "opencode serve",
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Sys::Ours(o) => o.server.pid,
            Sys::Codex(c) => c.proc.0.id(),
            Sys::Opencode(o) => o.proc.0.id(),
        }
    }

    async fn create(&mut self) -> Res<String> {
        let what = format!("{}: create", self.name());
        deadline(&what, async {
            match self {
                Sys::Ours(o) => o.create().await,
                Sys::Codex(c) => c.create().await,
                Sys::Opencode(o) => o.create().await,
            }
        })
        .await
    }

    async fn turn(&mut self, id: &str, text: &str) -> Res<Turn> {
        let what = format!("{}: turn", self.name());
        deadline(&what, async {
            match self {
                Sys::Ours(o) => o.turn(id, text).await,
                Sys::Codex(c) => c.turn(id, text).await,
                Sys::Opencode(o) => o.turn(id, text).await,
            }
        })
        .await
    }

    async fn observe(&self, id: &str) -> Res<Observer> {
        let what = format!("{}: observe", self.name());
        deadline(&what, async {
            Ok(match self {
                Sys::Ours(o) => {
                    let mut conn = RawConn::connect(&o.server.socket).await.map_err(err)?;
                    conn.hello_v1().await.map_err(err)?;
                    attach(&mut conn, id).await?;
                    Observer::Ours(conn)
                }
                Sys::Codex(c) => Observer::Codex(Box::new(c.observe(id).await?)),
                Sys::Opencode(o) => Observer::Opencode(Box::new(o.observe(id).await?)),
            })
        })
        .await
    }
}

/// Lets a fresh process settle, then reads its tree's RSS.
async fn settled_rss(pid: u32) -> f64 {
    tokio::time::sleep(Duration::from_millis(500)).await;
    tree_rss(pid) as f64
}

// ---- the item -------------------------------------------------------------------------------

struct Timings {
    first: Vec<f64>,
    total: Vec<f64>,
    cpu: f64,
    deltas: u64,
    received: usize,
}

impl Timings {
    fn new() -> Self {
        Self {
            first: Vec::new(),
            total: Vec::new(),
            cpu: 0.0,
            deltas: 0,
            received: 0,
        }
    }

    fn cpu_per_delta_us(&self) -> f64 {
        self.cpu * 1e6 / self.deltas.max(1) as f64
    }
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Res<()> {
    let mock = MockLlm::start(WORDS)?;
    let dir = install(env)?;
    let (codex_bin, opencode_bin) = binaries(&dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(err)?;
    runtime.block_on(measure(env, report, &mock, codex_bin, opencode_bin))
}

async fn measure(
    env: &Env,
    report: &mut Report,
    mock: &MockLlm,
    codex_bin: Res<PathBuf>,
    opencode_bin: Res<PathBuf>,
) -> Res<()> {
    let load0 = crate::util::loadavg();
    let mut systems: Vec<Sys> = Vec::new();
    let mut fresh: Vec<f64> = Vec::new();
    let mut versions = vec!["pi-server (this tree)".to_string()];

    let ours = Ours::start(env, mock).await?;
    fresh.push(settled_rss(ours.server.pid).await);
    systems.push(Sys::Ours(Box::new(ours)));
    // `BENCH_PEERS=codex,opencode` (a list) chooses the peers run beside ours.
    let wanted = |peer: &str| {
        std::env::var("BENCH_PEERS").map_or(true, |v| v.split(',').any(|p| p.trim() == peer))
    };
    let not_run = || "not run (BENCH_PEERS)".to_string();
    match wanted("codex").then_some(codex_bin) {
        None => report.info("peers", "codex app-server", not_run()),
        Some(Ok(bin)) => {
            versions.push(version(&bin));
            match Codex::start(env, &bin, mock).await {
                Ok(c) => {
                    fresh.push(settled_rss(c.proc.0.id()).await);
                    systems.push(Sys::Codex(Box::new(c)));
                }
                Err(e) => report.info("peers", "codex app-server cannot run here", e),
            }
        }
        Some(Err(e)) => report.info("peers", "codex app-server is not installed", e),
    }
    match wanted("opencode").then_some(opencode_bin) {
        None => report.info("peers", "opencode serve", not_run()),
        Some(Ok(bin)) => {
            versions.push(format!("opencode {}", version(&bin)));
            match Opencode::start(env, &bin, mock).await {
                Ok(o) => {
                    fresh.push(settled_rss(o.proc.0.id()).await);
                    systems.push(Sys::Opencode(Box::new(o)));
                }
                Err(e) => report.info("peers", "opencode serve cannot run here", e),
            }
        }
        Some(Err(e)) => report.info("peers", "opencode serve is not installed", e),
    }
    println!("  systems: {}", versions.join(", "));
    let names: Vec<&str> = systems.iter().map(Sys::name).collect();
    let n = systems.len();

    // Turn timings: one session each, a few warm-up turns, then rounds of
    // `per_round` turns, alternating the systems.
    let mut main_ids = Vec::new();
    for sys in systems.iter_mut() {
        let id = sys.create().await?;
        for i in 0..3 {
            sys.turn(&id, &format!("warm-up {i}")).await?;
        }
        main_ids.push(id);
    }
    let per_round = env.pick(3, 10);
    let mut timings: Vec<Timings> = (0..n).map(|_| Timings::new()).collect();
    let mut prompt_no = 0;
    for _ in 0..env.rounds {
        for (i, sys) in systems.iter_mut().enumerate() {
            let (cpu0, deltas0) = (tree_cpu(sys.pid()), mock.deltas());
            for _ in 0..per_round {
                prompt_no += 1;
                let t = sys
                    .turn(&main_ids[i], &format!("prompt {prompt_no}: please go on"))
                    .await?;
                timings[i].first.push(t.first.as_secs_f64() * 1e6);
                timings[i].total.push(t.total.as_secs_f64() * 1e6);
                timings[i].received += t.deltas;
            }
            timings[i].cpu += tree_cpu(sys.pid()) - cpu0;
            timings[i].deltas += mock.deltas() - deltas0;
        }
    }
    let turns = env.rounds * per_round;
    let ours_first = median(&timings[0].first);
    let ours_total = median(&timings[0].total);
    let ours_cpu = timings[0].cpu_per_delta_us();
    for i in 0..n {
        let t = &timings[i];
        let (first, total) = (median(&t.first), median(&t.total));
        let fs = sorted(&t.first);
        let ratio = |theirs: f64, ours: f64| {
            if i == 0 {
                String::new()
            } else {
                format!(" → **{:.1}× ours**", theirs / ours)
            }
        };
        report.info(
            "peers",
            format!(
                "{}: prompt → first text delta ({turns} turns, {WORDS}-word replies, {} rounds)",
                names[i], env.rounds
            ),
            format!(
                "p50 {} (p90 {}){}",
                fmt_us(first),
                fmt_us(crate::util::percentile(&fs, 90.0)),
                ratio(first, ours_first)
            ),
        );
        report.info(
            "peers",
            format!("{}: prompt → turn end", names[i]),
            format!("p50 {}{}", fmt_us(total), ratio(total, ours_total)),
        );
        report.info(
            "peers",
            format!("{}: server CPU per streamed delta", names[i]),
            format!(
                "{:.1} µs ({} deltas from the model, {} delta messages to the client){}",
                t.cpu_per_delta_us(),
                t.deltas,
                t.received,
                ratio(t.cpu_per_delta_us(), ours_cpu)
            ),
        );
    }

    // Memory: fresh, then per idle session (created, one turn, left idle).
    let sessions = env.pick(5, 20);
    for (i, sys) in systems.iter_mut().enumerate() {
        let before = settled_rss(sys.pid()).await;
        for k in 0..sessions {
            let id = sys.create().await?;
            sys.turn(&id, &format!("idle session {k}")).await?;
        }
        let after = settled_rss(sys.pid()).await;
        report.info(
            "peers",
            format!(
                "{}: memory (PSS of the process tree) fresh; per idle session ({sessions} sessions, one turn each, kept open)",
                names[i]
            ),
            format!(
                "{} fresh; **{} per idle session** ({} → {}; processes now: {})",
                mib(fresh[i]),
                kib((after - before) / sessions as f64),
                mib(before),
                mib(after),
                tree(sys.pid()).len()
            ),
        );
    }

    // Per attached observer.
    let k = env.pick(10, 50);
    for (i, sys) in systems.iter().enumerate() {
        let before = settled_rss(sys.pid()).await;
        let mut observers = Vec::with_capacity(k);
        for _ in 0..k {
            observers.push(sys.observe(&main_ids[i]).await?);
        }
        let after = settled_rss(sys.pid()).await;
        drop(observers);
        report.info(
            "peers",
            format!("{}: memory per attached observer ({k} observers)", names[i]),
            format!(
                "**{}** per observer ({} → {})",
                kib((after - before) / k as f64),
                mib(before),
                mib(after)
            ),
        );
    }

    // Observer reconnects: connect, attach, close, one after another.
    let reconnects = env.pick(50, 200);
    for (i, sys) in systems.iter().enumerate() {
        let before = settled_rss(sys.pid()).await;
        let mut times = Vec::with_capacity(reconnects);
        for _ in 0..reconnects {
            let start = Instant::now();
            let observer = sys.observe(&main_ids[i]).await?;
            times.push(start.elapsed().as_secs_f64() * 1e6);
            drop(observer);
        }
        let after = settled_rss(sys.pid()).await;
        report.info(
            "peers",
            format!("{}: {reconnects} observer reconnects", names[i]),
            format!(
                "connect+attach p50 {}; memory {} → {} (**{}**)",
                fmt_us(median(&times)),
                mib(before),
                mib(after),
                kib(after - before)
            ),
        );
    }

    // A long session: many turns in one session, each system in turn.
    let long = env.pick(50, 1000);
    for (i, sys) in systems.iter_mut().enumerate() {
        let id = sys.create().await?;
        let before = settled_rss(sys.pid()).await;
        let main_before = pss_kib(sys.pid()).unwrap_or(0) as f64;
        let started = Instant::now();
        let mut totals = Vec::with_capacity(long);
        let mut firsts = Vec::with_capacity(long);
        let mut bytes = Vec::with_capacity(long);
        for t in 0..long {
            let turn = sys.turn(&id, &format!("long turn {t}: go on")).await?;
            totals.push(turn.total.as_secs_f64() * 1e6);
            firsts.push(turn.first.as_secs_f64() * 1e6);
            bytes.push(turn.bytes as f64);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let after = settled_rss(sys.pid()).await;
        let main_after = pss_kib(sys.pid()).unwrap_or(0) as f64;
        let tenth = (long / 10).max(1);
        report.info(
            "peers",
            format!("{}: {long} turns in one session", names[i]),
            format!(
                "{elapsed:.1} s; turn p50 first tenth {} → last tenth {}; first delta {} → {}; \
                 bytes to the prompting client per turn {} → {}; memory {} → {} (**{} per turn**), \
                 of it the main process {} → {}",
                fmt_us(median(&totals[..tenth])),
                fmt_us(median(&totals[long - tenth..])),
                fmt_us(median(&firsts[..tenth])),
                fmt_us(median(&firsts[long - tenth..])),
                kib(median(&bytes[..tenth]) / 1024.0),
                kib(median(&bytes[long - tenth..]) / 1024.0),
                mib(before),
                mib(after),
                kib((after - before) / long as f64),
                mib(main_before),
                mib(main_after)
            ),
        );
    }
    report.info(
        "peers",
        "the scripted model server; load average",
        format!(
            "{} streams, {} deltas in all ({WORDS} per reply); versions: {}; load average {load0} at the start, {} at the end",
            mock.streams(),
            mock.deltas(),
            versions.join(", "),
            crate::util::loadavg()
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn dechunk_moves_complete_chunks_only() {
        let mut raw = b"5\r\nhello\r\n3\r\nab".to_vec();
        let mut out = Vec::new();
        assert!(!dechunk(&mut raw, &mut out));
        assert_eq!(out, b"hello");
        assert_eq!(raw, b"3\r\nab");
        raw.extend_from_slice(b"c\r\n0\r\n\r\n");
        assert!(dechunk(&mut raw, &mut out));
        assert_eq!(out, b"helloabc");
    }
}
