//! Kill loops (issues 15 and 46): a turn runs while its worker is SIGKILLed
//! (mid-reply, or mid-tool with a `bash` command whose children run), its
//! server is SIGKILLed and started again, replaced gracefully, or stopped
//! with SIGTERM and started again, `rounds` times each, on one session whose
//! transcript grows. Every front door is attached through each round: the
//! v1 client that prompts, a v1 client over the web listener's WebSocket, a
//! v8 client following `pi.transcript`, and `pi-server acp` as an editor
//! runs it (one adapter per fault, across its rounds).
//!
//! After each round, every transcript item that was terminal before it must
//! still be there, unchanged, as each door sees it ("committed items checked
//! / lost"; v8 compares pi's entries). Also counted: attaches refused after
//! a restart (every door), the time from starting the new server to the
//! first attach answered, the streamed characters a client was shown and the
//! recovered (aborted) reply does not keep after a worker kill mid-reply,
//! against the checkpoint bound (4 KiB or 250 ms of text), and the processes
//! of a killed tool still running once the session runs again. The ACP
//! adapter must answer `session/list` after every round, and its
//! `session/load` at the end replays every user message.

use crate::acp::Adapter;
use crate::raw::{RawConn, decode, v1_request};
use crate::server::{Server, signal, stored_session, web_listener};
use crate::util::{Env, Report, fmt_us, percentile, sorted, us};
use crate::v8::{Replica, V8Client};
use kernel::protocol::{
    AssistantStatus, Command, CommandResult, DeltaKind, Response, ServerEvent, ServerMessage,
    SessionPhase, SessionSnapshot, TranscriptItem, TranscriptProgress,
};
use kernel::wire::Value;
use pi_client::Client;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Streamed characters a client has been shown when the fault comes: from
/// this many, varied per round over about one reply.
const SHOWN_BEFORE_FAULT: usize = 40;

/// How long anything may take to come back.
const PATIENCE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    WorkerKill,
    ToolKill,
    ServerKill,
    Replace,
    Stop,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Self::WorkerKill,
        Self::ToolKill,
        Self::ServerKill,
        Self::Replace,
        Self::Stop,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::WorkerKill => "worker SIGKILL mid-reply",
            Self::ToolKill => "worker SIGKILL mid-tool (bash with children)",
            Self::ServerKill => "server SIGKILL mid-turn, immediate re-attach",
            Self::Replace => "graceful replacement mid-turn",
            Self::Stop => "SIGTERM stop mid-turn, then a new server",
        }
    }

    /// The server goes away and another takes the session over.
    fn restarts(self) -> bool {
        matches!(self, Self::ServerKill | Self::Replace | Self::Stop)
    }
}

#[derive(Default)]
struct Tally {
    rounds: usize,
    /// Committed items checked and lost, per door: v1, web, v8.
    checked: [usize; 3],
    lost: [usize; 3],
    refused: usize,
    to_first_snapshot: Vec<f64>,
    shown_not_kept: Vec<f64>,
    completed: usize,
    leftover: usize,
    acp_silent: usize,
}

struct Setup {
    identity: (PathBuf, String),
    sessions: PathBuf,
    log: PathBuf,
    vars: Vec<(&'static str, String)>,
    /// `--listen` and `--token-file`: every server serves the web listener
    /// at the same address.
    args: Vec<String>,
    web: (String, String),
    session: String,
    /// The session's working directory, where a tool writes its pids.
    cwd: PathBuf,
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let rounds = env.pick(20, 100);
    let dir = env.fresh_dir("killloop");
    let sessions = dir.join("sessions");
    let cwd = dir.join("project");
    std::fs::create_dir_all(&cwd).map_err(|e| e.to_string())?;
    let session = pi_config::new_uuid();
    let mut stored = stored_session(&session, 1_700_000_000_000);
    stored.cwd = cwd.display().to_string();
    std::fs::create_dir_all(&sessions).map_err(|e| e.to_string())?;
    pi_store::SessionStore::create(&sessions, &stored).map_err(|e| e.to_string())?;
    let (args, addr, token) = web_listener(&dir)?;
    let setup = Setup {
        identity: (dir.join("servers"), pi_config::new_uuid()),
        sessions,
        log: dir.join("server.log"),
        vars: vec![("PI_FAUX_DELAY_MS", "2".into())],
        args,
        web: (addr, token),
        session,
        cwd,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut server = setup.start(env)?;
    for fault in Fault::ALL {
        let mut tally = Tally::default();
        let started = Instant::now();
        let mut acp = AcpDoor::open(env, &server, &setup)?;
        for round in 0..rounds {
            runtime
                .block_on(one_round(env, &setup, &mut server, fault, &mut tally))
                .map_err(|e| format!("{} round {round}: {e}", fault.name()))?;
            if acp.list().is_err() {
                tally.acp_silent += 1;
            }
        }
        let stored: BTreeSet<String> = runtime.block_on(async {
            let client = connect(&setup.socket()).await?;
            let snapshot = attach(&client, &setup.session, &mut 0).await?;
            client.close().await;
            Ok::<_, String>(user_texts(&snapshot))
        })?;
        acp.list()?; // what it was told of the last round
        let missed = stored.difference(&acp.told).count();
        drop(acp);
        let replayed = AcpDoor::open(env, &server, &setup)?.told;
        let acp = AcpTally {
            missed,
            replayed: replayed.intersection(&stored).count(),
            stored: stored.len(),
        };
        tally_report(report, fault, &tally, rounds, &acp);
        println!(
            "  {}: {rounds} rounds in {:.1} s",
            fault.name(),
            started.elapsed().as_secs_f64()
        );
    }
    server.stop();
    // Nothing of the loops outlives the last server: no server, worker or
    // adapter of this run (their command lines or environments name its
    // directory), once the stop has disposed the idle session.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = ours(&dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = ours(&dir);
    }
    report.push(
        "killloop",
        "processes of the run left after its last server's SIGTERM stop",
        format!("{} {left:?}", left.len()),
        "0",
        Some(left.is_empty()),
    );
    Ok(())
}

/// The processes whose command line or environment names `dir`.
fn ours(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id() && runs(*pid as i32))
        .filter(|pid| {
            ["cmdline", "environ"].iter().any(|f| {
                std::fs::read(format!("/proc/{pid}/{f}"))
                    .is_ok_and(|b| String::from_utf8_lossy(&b).contains(&needle))
            })
        })
        .collect()
}

/// The user messages the attached ACP adapter was never told (of those
/// stored), and those a fresh adapter's `session/load` replays.
struct AcpTally {
    missed: usize,
    replayed: usize,
    stored: usize,
}

fn tally_report(report: &mut Report, fault: Fault, tally: &Tally, rounds: usize, acp: &AcpTally) {
    let name = fault.name();
    let lost: usize = tally.lost.iter().sum();
    report.push(
        "killloop",
        format!("{name}: committed items checked / lost, v1 · web · v8 ({rounds} rounds)"),
        format!(
            "{} / {} · {} / {} · {} / {}",
            tally.checked[0],
            tally.lost[0],
            tally.checked[1],
            tally.lost[1],
            tally.checked[2],
            tally.lost[2]
        ),
        "0 lost",
        Some(lost == 0),
    );
    report.push(
        "killloop",
        format!(
            "{name}: ACP adapter: rounds unanswered; user messages it missed; a fresh `session/load` replays / stored"
        ),
        format!(
            "{}; {}; {} / {}",
            tally.acp_silent, acp.missed, acp.replayed, acp.stored
        ),
        "0; 0; all",
        Some(tally.acp_silent == 0 && acp.missed == 0 && acp.replayed == acp.stored),
    );
    match fault {
        Fault::WorkerKill => {
            let s = sorted(&tally.shown_not_kept);
            let max = s.last().copied().unwrap_or(0.0);
            report.push(
                "killloop",
                format!("{name}: streamed chars shown and not kept, p50 / max"),
                format!("{:.0} / {max:.0}", percentile(&s, 50.0)),
                "≤ 4096 (checkpoint)",
                Some(max <= 4096.0),
            );
        }
        Fault::ToolKill => report.push(
            "killloop",
            format!("{name}: the tool's processes left once the session runs again"),
            tally.leftover.to_string(),
            "0",
            Some(tally.leftover == 0),
        ),
        Fault::ServerKill | Fault::Replace | Fault::Stop => {
            let s = sorted(&tally.to_first_snapshot);
            report.push(
                "killloop",
                format!(
                    "{name}: attaches refused (every door); new server start → first attach answered p50 / p99"
                ),
                format!(
                    "{} refused; {} / {}",
                    tally.refused,
                    fmt_us(percentile(&s, 50.0)),
                    fmt_us(percentile(&s, 99.0))
                ),
                "0 refused",
                Some(tally.refused == 0),
            );
            report.push(
                "killloop",
                format!("{name}: turns that completed"),
                format!("{} / {}", tally.completed, tally.rounds),
                "all",
                Some(tally.completed == tally.rounds),
            );
        }
    }
}

impl Setup {
    fn start(&self, env: &Env) -> Result<Server, String> {
        let mut server = Server::spawn_with(
            env,
            &self.identity,
            &self.sessions,
            &self.vars,
            &self.log,
            &self.args,
        )?;
        server.wait_bound(PATIENCE)?;
        Ok(server)
    }

    fn socket(&self) -> PathBuf {
        pi_config::socket_path(&self.identity.0, &self.identity.1)
    }
}

/// `pi-server acp` with the session loaded, and the user messages it has
/// told its editor.
struct AcpDoor {
    adapter: Adapter,
    told: BTreeSet<String>,
}

impl AcpDoor {
    fn open(env: &Env, server: &Server, setup: &Setup) -> Result<Self, String> {
        let mut adapter = Adapter::spawn(env, server)?;
        adapter.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )?;
        let mut door = Self {
            adapter,
            told: BTreeSet::new(),
        };
        let params = json!({"sessionId": setup.session, "cwd": setup.cwd, "mcpServers": []});
        door.call("session/load", params)?;
        Ok(door)
    }

    /// A request answered; what it tells on the way is noted.
    fn call(&mut self, method: &str, params: serde_json::Value) -> Result<(), String> {
        let (id, _) = self.adapter.send(method, params)?;
        let told = &mut self.told;
        let (reply, _, _) = self
            .adapter
            .until(|v| {
                let update = &v["params"]["update"];
                if v["method"] == "session/update"
                    && update["sessionUpdate"] == "user_message_chunk"
                    && let Some(text) = update["content"]["text"].as_str()
                {
                    told.insert(text.to_owned());
                }
                v["id"] == json!(id)
            })
            .map_err(|e| format!("{method}: {e}"))?;
        match reply.get("error") {
            Some(error) => Err(format!("{method}: {error}")),
            None => Ok(()),
        }
    }

    /// The adapter answers `session/list` (its connection to the server,
    /// which it keeps across restarts, is back) within [`PATIENCE`].
    fn list(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.call("session/list", json!({})) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// The texts of a snapshot's user messages.
fn user_texts(snapshot: &SessionSnapshot) -> BTreeSet<String> {
    snapshot
        .transcript
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::User(u) => Some(kernel::client::follow::text_of(&u.content)),
            _ => None,
        })
        .collect()
}

/// The terminal items of a snapshot, as text to compare.
fn committed(snapshot: &SessionSnapshot) -> Vec<String> {
    snapshot
        .transcript
        .iter()
        .filter(|item| match item {
            TranscriptItem::Assistant(a) => !matches!(a.status, AssistantStatus::Streaming),
            _ => true,
        })
        .map(|item| format!("{item:?}"))
        .collect()
}

/// Of `before`, how many are not where they were in `after`.
fn lost<T: PartialEq>(before: &[T], after: &[T]) -> usize {
    before
        .iter()
        .enumerate()
        .filter(|(i, item)| after.get(*i) != Some(item))
        .count()
}

async fn connect(socket: &Path) -> Result<Client, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match Client::connect(socket, None).await {
            Ok(client) => return Ok(client),
            Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Tries `attempt` until it succeeds, within [`PATIENCE`]; counts the
/// failures on the way in `refused`. `what` names it in the error.
async fn until_attached<T, F, Fut>(
    what: &str,
    refused: &mut usize,
    mut attempt: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match attempt().await {
            Ok(attached) => return Ok(attached),
            Err(e) if Instant::now() > deadline => return Err(format!("{what}: {e}")),
            Err(_) => {
                *refused += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Attaches until answered; counts refusals.
async fn attach(
    client: &Client,
    session: &str,
    refused: &mut usize,
) -> Result<SessionSnapshot, String> {
    until_attached("attach", refused, || async {
        client.attach(session).await.map_err(|e| e.to_string())
    })
    .await
}

/// A v1 client over the WebSocket, attached: its connection and the
/// session's committed items. Connections refused or attaches refused
/// until it is are counted.
async fn web_attach(setup: &Setup, refused: &mut usize) -> Result<(RawConn, Vec<String>), String> {
    let (addr, token) = &setup.web;
    until_attached("web attach", refused, || async {
        let mut conn = RawConn::connect_web(addr, token)
            .await
            .map_err(|e| e.to_string())?;
        conn.hello_v1().await.map_err(|e| e.to_string())?;
        let attach = Command::Attach {
            session_id: setup.session.clone(),
        };
        conn.send(&v1_request("a", attach))
            .await
            .map_err(|e| e.to_string())?;
        let payload = conn.until_response().await.map_err(|e| e.to_string())?;
        match decode(&payload)? {
            ServerMessage::Response(Response {
                outcome: Ok(CommandResult::Attach { session }),
                ..
            }) => Ok((conn, committed(&session))),
            other => Err(format!("attach answered {other:?}")),
        }
    })
    .await
}

/// A v8 client attached and following `pi.transcript`: its connection and
/// pi's entries. Refusals until it is are counted.
async fn v8_attach(setup: &Setup, refused: &mut usize) -> Result<(V8Client, Vec<Value>), String> {
    until_attached("v8 attach", refused, || async {
        let mut c = V8Client::connect(&setup.socket()).await?;
        c.attach(&setup.session).await?;
        let snapshot = c.subscribe("t", "pi.transcript").await?;
        let replica = Replica::from_snapshot(&snapshot)?;
        Ok((c, replica.entry_list().to_vec()))
    })
    .await
}

/// Whether process `pid` runs (a zombie does not).
fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

async fn pid_in(path: &Path) -> Result<i32, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            return Err(format!("{} was never written", path.display()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn one_round(
    env: &Env,
    setup: &Setup,
    server: &mut Server,
    fault: Fault,
    tally: &mut Tally,
) -> Result<(), String> {
    let fault_at = SHOWN_BEFORE_FAULT + (tally.rounds * 97) % 600;
    let socket = setup.socket();
    let client = connect(&socket).await?;
    let mut ignored = 0;
    let before = attach(&client, &setup.session, &mut ignored).await?;
    let kept_before = committed(&before);
    let (web, web_before) = web_attach(setup, &mut ignored).await?;
    let (v8, v8_before) = v8_attach(setup, &mut ignored).await?;
    let mut events = client.events();
    let pids = (
        setup.cwd.join(format!("child-{}.pid", tally.rounds)),
        setup.cwd.join(format!("shell-{}.pid", tally.rounds)),
    );
    let text = match fault {
        Fault::ToolKill => format!(
            "!sleep 300 & echo $! > {}; echo $$ > {}; sleep 300",
            pids.0.display(),
            pids.1.display()
        ),
        _ => (0..150).map(|i| format!("w{i}")).fold(
            format!("{} round {}", fault.name(), tally.rounds),
            |text, w| text + " " + &w,
        ),
    };
    let prompt = {
        let client = client.clone();
        let session = setup.session.clone();
        tokio::spawn(async move { client.prompt(&session, &text).await })
    };
    let mut shown = String::new();
    let mut tool = None;
    if fault == Fault::ToolKill {
        tool = Some((pid_in(&pids.0).await?, pid_in(&pids.1).await?));
    } else {
        // Wait until the reply has shown enough text.
        let wait = tokio::time::timeout(PATIENCE, async {
            while shown.len() < fault_at {
                match events.recv().await {
                    Ok(ServerEvent::SessionProgress {
                        progress:
                            TranscriptProgress::AssistantDelta {
                                kind: DeltaKind::Text,
                                delta,
                                ..
                            },
                        ..
                    }) => shown.push_str(&delta),
                    Ok(_) => {}
                    Err(e) => return Err(format!("events: {e}")),
                }
            }
            Ok(())
        });
        wait.await
            .map_err(|_| "the reply did not stream".to_string())??;
    }

    let after = if fault.restarts() {
        let started = Instant::now();
        match fault {
            Fault::ServerKill => server.kill(),
            // SIGTERM: a graceful stop releases the running turn to its worker.
            Fault::Stop => server.stop(),
            _ => {}
        }
        let mut next = setup.start(env)?;
        if fault == Fault::Replace {
            // The old server hands its workers over and exits.
            server.wait_exit(PATIENCE)?;
        }
        std::mem::swap(server, &mut next);
        drop(next);
        let fresh = connect(&socket).await?;
        let first = attach(&fresh, &setup.session, &mut tally.refused).await?;
        tally.to_first_snapshot.push(us(started.elapsed()));
        // The turn goes on in the surviving worker; wait for its end.
        let mut events = fresh.events();
        let mut last = first;
        let deadline = Instant::now() + Duration::from_secs(60);
        while last.phase != SessionPhase::Idle {
            if Instant::now() > deadline {
                return Err("the turn did not end".into());
            }
            if let Ok(Ok(ServerEvent::SessionSnapshot { snapshot })) =
                tokio::time::timeout(Duration::from_millis(200), events.recv()).await
                && snapshot.id == setup.session
            {
                last = snapshot;
            } else if let Some(s) = fresh.session_snapshot(&setup.session) {
                last = s;
            }
        }
        if matches!(last.transcript.last(), Some(TranscriptItem::Assistant(a)) if matches!(a.status, AssistantStatus::Complete(_)))
        {
            tally.completed += 1;
        }
        prompt.abort();
        fresh.close().await;
        last
    } else {
        let holder = pi_store::live_holder(&setup.sessions, &setup.session)
            .ok_or("no live worker holds the session")?;
        signal(holder.pid, rustix::process::Signal::KILL);
        let _ = prompt.await;
        let mut refused = 0;
        let snapshot = attach(&client, &setup.session, &mut refused).await?;
        if let Some((child, shell)) = tool {
            // The session runs again: its new worker ended the dead one's tool.
            let deadline = Instant::now() + Duration::from_secs(5);
            while (runs(child) || runs(shell)) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tally.leftover += usize::from(runs(child)) + usize::from(runs(shell));
        } else {
            let kept = match snapshot.transcript.last() {
                Some(TranscriptItem::Assistant(a)) => kernel::client::follow::text_of(&a.content),
                _ => String::new(),
            };
            if !shown.starts_with(&kept) && !kept.starts_with(&shown) {
                return Err(format!(
                    "kept text {kept:?} is not what was shown {shown:?}"
                ));
            }
            tally
                .shown_not_kept
                .push(shown.len().saturating_sub(kept.len()) as f64);
        }
        snapshot
    };
    client.close().await;
    drop((web, v8));
    // Every door sees what was committed before the round.
    let (_web, web_after) = web_attach(setup, &mut tally.refused).await?;
    let (_v8, v8_after) = v8_attach(setup, &mut tally.refused).await?;
    let kept_after = committed(&after);
    tally.rounds += 1;
    for (door, (before, after)) in [(&kept_before, &kept_after), (&web_before, &web_after)]
        .into_iter()
        .enumerate()
    {
        tally.checked[door] += before.len();
        tally.lost[door] += lost(before, after);
    }
    tally.checked[2] += v8_before.len();
    tally.lost[2] += lost(&v8_before, &v8_after);
    Ok(())
}
