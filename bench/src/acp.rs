//! The ACP adapter's cost (issue 13), side by side in one run:
//!
//! - prompt → first `agent_message_chunk` through `pi-server acp`, against
//!   prompt → first `assistant_delta` over pi v1 directly (the same server,
//!   the same faux model; a fresh session per sample; rounds alternate);
//!   target ≤ 1.2× + 200 µs;
//! - `session/load` of a stored 500-item session: time to the response and
//!   the bytes the adapter wrote for it (the replayed history), against
//!   pi v1's `attach` of the same session (rounds alternate; each starts
//!   the session's worker).

use crate::server::{Server, stored_session};
use crate::util::{Env, Report, fmt_us, median, us, wait_no_children};
use kernel::protocol::{
    Content, CreateParams, DeltaKind, ServerEvent, TranscriptItem, TranscriptProgress, UserItem,
};
use pi_store::SessionStore;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `pi-server acp` as an editor runs it: lines in, lines out (timestamped).
pub(crate) struct Adapter {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<(Instant, String)>,
    next_id: u64,
}

impl Adapter {
    pub(crate) fn spawn(env: &Env, server: &Server) -> Result<Self, String> {
        let log = env.fresh_dir("acp").join("adapter.log");
        let stderr = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = Command::new(&env.server_bin)
            .arg("--connect")
            .arg(format!("unix://{}", server.socket.display()))
            .arg("acp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawn acp: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines,
            next_id: 1,
        })
    }

    /// Sends a request; returns its id and when it was written.
    pub(crate) fn send(&mut self, method: &str, params: Value) -> Result<(u64, Instant), String> {
        let id = self.next_id;
        self.next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let at = Instant::now();
        writeln!(self.stdin, "{line}").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        Ok((id, at))
    }

    /// Reads lines until `stop` says so; returns that line, when, and the bytes read.
    pub(crate) fn until(
        &self,
        mut stop: impl FnMut(&Value) -> bool,
    ) -> Result<(Value, Instant, usize), String> {
        let mut bytes = 0;
        let mut last = String::new();
        loop {
            let (at, line) = self
                .lines
                .recv_timeout(Duration::from_secs(10))
                .map_err(|_| format!("the adapter went quiet after {bytes} bytes; last: {last}"))?;
            bytes += line.len() + 1;
            last.clone_from(&line);
            let value: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
            if stop(&value) {
                return Ok((value, at, bytes));
            }
        }
    }

    pub(crate) fn call(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<(Value, Duration, usize), String> {
        let (id, sent) = self.send(method, params)?;
        let (reply, at, bytes) = self
            .until(|v| v["id"] == json!(id))
            .map_err(|e| format!("{method}: {e}"))?;
        if reply.get("error").is_some() {
            return Err(format!("{method}: {reply}"));
        }
        Ok((reply["result"].clone(), at - sent, bytes))
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stored session of `n` items (user and assistant in turn).
fn big_session(dir: &std::path::Path, n: usize) -> Result<String, String> {
    let id = pi_config::new_uuid();
    let mut stored = stored_session(&id, 1_700_000_000_000);
    for i in 0..n {
        let item_id = format!("item-{}", i + 1);
        stored.transcript.push(if i % 2 == 0 {
            TranscriptItem::User(UserItem {
                id: item_id,
                content: vec![Content::Text {
                    text: format!("question {i}: please look at the parser again"),
                }],
                timestamp: 1_700_000_000_000,
            })
        } else {
            crate::commit::assistant_item(&item_id, 400)
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    SessionStore::create(dir, &stored).map_err(|e| e.to_string())?;
    Ok(id)
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let sessions = env.fresh_dir("acp-sessions");
    let big = big_session(&sessions, 500)?;
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "1".into())])?;
    let (runtime, client) = server.client("v1 client")?;
    let mut adapter = Adapter::spawn(env, &server)?;
    adapter.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )?;

    let rounds = env.pick(5, 2 * env.rounds + 1);
    let (mut direct, mut acp) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        // pi v1 directly.
        let snapshot = runtime
            .block_on(client.create(CreateParams {
                cwd: Some("/tmp".into()),
                ..CreateParams::default()
            }))
            .map_err(|e| format!("create: {e}"))?;
        let mut events = client.events();
        let sent = Instant::now();
        let prompt = {
            let id = snapshot.id.clone();
            let client = &client;
            runtime.block_on(async {
                let prompt = client.prompt(&id, "hello there");
                tokio::pin!(prompt);
                let mut first = None;
                loop {
                    tokio::select! {
                        done = &mut prompt => break done.map(|_| first),
                        Ok(event) = events.recv(), if first.is_none() => {
                            if let ServerEvent::SessionProgress {
                                session_id,
                                progress: TranscriptProgress::AssistantDelta { kind: DeltaKind::Text, .. },
                            } = &event
                                && *session_id == id
                            {
                                first = Some(Instant::now());
                            }
                        }
                    }
                }
            })
        };
        let first = prompt
            .map_err(|e| format!("prompt: {e}"))?
            .ok_or("no delta before the prompt ended")?;
        direct.push((first - sent).as_secs_f64() * 1e6);
        let _ = runtime.block_on(client.detach(&snapshot.id));

        // Through the adapter.
        let (created, _, _) =
            adapter.call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))?;
        let session = created["sessionId"]
            .as_str()
            .ok_or("no sessionId")?
            .to_owned();
        let (id, sent) = adapter.send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello there"}]}),
        )?;
        let (_, at, _) = adapter.until(|v| {
            v["method"] == "session/update"
                && v["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        })?;
        acp.push((at - sent).as_secs_f64() * 1e6);
        adapter.until(|v| v["id"] == json!(id))?;
        adapter.call("session/close", json!({"sessionId": session}))?;
    }
    let (d, a) = (median(&direct), median(&acp));
    let target = 1.2 * d + 200.0;
    report.push(
        "13",
        format!(
            "prompt → first chunk: ACP {} vs v1 {} (medians of {rounds})",
            fmt_us(a),
            fmt_us(d)
        ),
        format!("{:.2}× (+{})", a / d, fmt_us(a - d)),
        "≤ 1.2× + 200 µs",
        Some(a <= target),
    );

    // `session/load` against pi v1's `attach` of the same session, each from
    // a stored session with no worker (both start one), rounds alternating.
    let (mut loads, mut attaches) = (Vec::new(), Vec::new());
    let (mut bytes, mut items) = (0, 0);
    let no_worker = |what: &str| {
        if wait_no_children(server.pid, Duration::from_secs(30)) {
            Ok(())
        } else {
            Err(format!("a worker was still running before {what}"))
        }
    };
    for _ in 0..env.pick(2, 5) {
        no_worker("an attach")?;
        let sent = Instant::now();
        let snapshot = runtime
            .block_on(client.attach(&big))
            .map_err(|e| format!("attach: {e}"))?;
        attaches.push(us(sent.elapsed()));
        items = snapshot.transcript.len();
        runtime
            .block_on(client.detach(&big))
            .map_err(|e| format!("detach: {e}"))?;
        no_worker("a load")?;
        let (_, took, wrote) = adapter.call(
            "session/load",
            json!({"sessionId": big, "cwd": "/work/bench", "mcpServers": []}),
        )?;
        loads.push(us(took));
        bytes = wrote;
        adapter.call("session/close", json!({"sessionId": big}))?;
    }
    let (load, attach) = (median(&loads), median(&attaches));
    report.push(
        "13",
        format!(
            "session/load of a {items}-item session vs pi v1 `attach` of it, each starting its worker (medians of {})",
            loads.len()
        ),
        format!(
            "{} vs {} → {:.2}×; {} KiB written",
            fmt_us(load),
            fmt_us(attach),
            load / attach,
            bytes / 1024
        ),
        "—",
        None,
    );
    drop(adapter);
    runtime.block_on(client.close());
    drop(server);
    Ok(())
}
