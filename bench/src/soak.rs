//! The soak (issue 19, item 2): one session with 10,000 turns over a client
//! that reconnects 100 times, while 50 other sessions are created, used for
//! one turn and removed, on one real server with the embedded faux model.
//!
//! - **RSS over time**: the server's `VmRSS`, and its workers' (separate
//!   processes) apart, every `turns / 100` turns. Warm-up is the first 10 %
//!   of the turns; the figure is the largest deviation from the median of
//!   the samples after it. Target: within 10 %. A sample is taken
//!   [`SETTLE`] after its turn (or the reconnect's `attach`) was answered,
//!   so it counts what the server keeps, not the frame it may still be
//!   letting go of as the client reads it; the reading at once is kept
//!   beside it.
//! - **Store size**: `session.sqlite` (and its `-wal`) once the session's
//!   worker has retired, against the transcript's text and the stored items'
//!   CBOR bytes.
//! - **Idle CPU**: the server's run time (`schedstat`) over a quiet window,
//!   once with a client attached to the long session (its worker alive) and
//!   once with no client and no worker. Target: under 0.1 %.
//!
//! The samples go to `<target>/bench-soak/soak.csv`; `bench/soak_plot.py`
//! draws them (`docs/soak-rss.png` in BENCHMARKS.md). The client is a raw
//! framed connection that decodes no snapshot: every turn's response and
//! snapshots carry the whole transcript (v1 snapshots are full), and the
//! bench should not spend its CPU decoding them.

use crate::raw::{RawConn, decode, v1_request};
use crate::server::{Server, create_sessions};
use crate::util::{Env, Report, children, loadavg, median, rss_kib, wait_no_children};
use kernel::faux::FauxStream;
use kernel::ids::OpId;
use kernel::protocol::{
    AssistantItem, AssistantStatus, Command, CommandResult, Content, CreateParams, DeltaKind,
    ServerMessage, StopReason, ToolItem, ToolStatus, TranscriptItem, UserItem,
};
use kernel::runtime::{
    ModelEvent, Persist, Purpose, Runtime, RuntimeInput, RuntimeOutput, StoredSession,
};
use kernel::time::Instant as KInstant;
use kernel::worker::Operation;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long after an answer the server's RSS is sampled: the server has
/// written the answer's last bytes before the client reads them, and lets
/// go of the frame once the write is reported, a moment later.
const SETTLE: Duration = Duration::from_millis(20);

/// One sample of the run.
#[derive(Debug, Clone, Copy)]
struct Sample {
    turn: usize,
    secs: f64,
    /// [`SETTLE`] after the last answer.
    server_kib: u64,
    /// At once after the last answer.
    server_at_once_kib: u64,
    workers_kib: u64,
    workers: usize,
    /// `session.sqlite` + `-wal` of the long session.
    store_bytes: u64,
    /// The last prompt response (the session's whole snapshot).
    response_bytes: usize,
    /// Milliseconds per turn since the previous sample.
    turn_ms: f64,
}

/// What the loop counts besides the samples.
#[derive(Debug, Default)]
struct Tally {
    reconnects: usize,
    side_sessions: usize,
    tool_turns: usize,
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let turns: usize = std::env::var("BENCH_SOAK_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(env.pick(1_000, 10_000))
        .max(100);
    // 100 reconnects and 50 side sessions per 10,000 turns (10 of each in
    // the quick run).
    let reconnects: usize = if env.quick { 10 } else { (turns / 100).max(1) };
    let side: usize = if env.quick { 10 } else { (turns / 200).max(1) };
    let samples_wanted = 100;
    let idle_secs = std::env::var("BENCH_SOAK_IDLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(env.pick(5, 20));
    let sessions = env.fresh_dir("soak-sessions");
    let id = create_sessions(&sessions, 1, 1)?.remove(0);
    let delay = std::env::var("BENCH_SOAK_DELAY_MS").unwrap_or_else(|_| "0".into());
    let mut server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", delay.clone())])?;
    println!(
        "  {turns} turns, {reconnects} reconnects, {side} sessions created and removed, faux delay {delay} ms"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;

    // The worker's cost of one streamed delta against the transcript's length.
    let step_ns: Vec<(usize, f64)> = [1_000, 20_000]
        .into_iter()
        .map(|items| (items, delta_step_ns(items)))
        .collect();
    // How often a long faux session compacts, in process.
    let (compaction_turns, compactions, summary_max) = faux_compactions(12_700, 1_000);

    let mut tally = Tally::default();
    let samples = runtime.block_on(drive(
        env,
        &server,
        &sessions,
        &id,
        Plan {
            turns,
            reconnect_every: turns / reconnects,
            side_every: turns / side,
            sample_every: (turns / samples_wanted).max(1),
        },
        &mut tally,
    ))?;

    // Idle, a client attached (the long session's worker alive).
    let mut conn = runtime.block_on(attached(&server, &id))?;
    let attached_idle = idle_cpu(server.pid, Duration::from_secs(idle_secs));
    runtime.block_on(async {
        drop(
            conn.send(&v1_request(
                "d",
                Command::Detach {
                    session_id: id.clone(),
                },
            ))
            .await,
        )
    });
    drop(conn);
    if !wait_no_children(server.pid, Duration::from_secs(30)) {
        return Err("the long session's worker did not retire".into());
    }
    std::thread::sleep(Duration::from_secs(1));
    let bare_idle = idle_cpu(server.pid, Duration::from_secs(idle_secs));
    let rss_end = rss_kib(server.pid).unwrap_or(0);
    let store = store_size(&sessions.join(&id))?;
    server.stop();
    let text = transcript_bytes(&sessions, &id)?;

    let csv = write_csv(env, &samples)?;
    println!("  samples: {}", csv.display());
    plot(env, &csv);

    // RSS after warm-up.
    let warm = turns / 10;
    let after: Vec<&Sample> = samples.iter().filter(|s| s.turn >= warm).collect();
    let deviation = |f: &dyn Fn(&Sample) -> u64| {
        let values: Vec<f64> = after.iter().map(|s| f(s) as f64).collect();
        let mid = median(&values);
        let (lo, hi) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let worst = ((hi - mid).max(mid - lo)) / mid * 100.0;
        (mid, lo, hi, worst)
    };
    let (mid, lo, hi, worst) = deviation(&|s| s.server_kib);
    let first = samples.first().map_or(0, |s| s.server_kib);
    let mib = |kib: f64| kib / 1024.0;
    report.push(
        "soak",
        format!(
            "server RSS after warm-up ({} of {turns} turns, {} reconnects, {} sessions created and removed): largest deviation from the median",
            turns - warm,
            tally.reconnects,
            tally.side_sessions
        ),
        format!(
            "**{worst:.1} %** (median {:.1} MiB, {:.1}–{:.1} MiB; {:.1} MiB at the first sample, {:.1} MiB idle at the end)",
            mib(mid),
            mib(lo),
            mib(hi),
            mib(first as f64),
            mib(rss_end as f64),
        ),
        "≤ 10 %",
        Some(worst <= 10.0),
    );
    let (mid, lo, hi, worst) = deviation(&|s| s.server_at_once_kib);
    report.info(
        "soak",
        "the same, sampled at once after the answer (a frame the client just read may still be in the server)",
        format!(
            "{worst:.1} % (median {:.1} MiB, {:.1}–{:.1} MiB)",
            mib(mid),
            mib(lo),
            mib(hi)
        ),
    );
    let slope = |f: &dyn Fn(&Sample) -> u64| {
        // Least squares of RSS over the snapshot's size, after warm-up.
        let n = after.len() as f64;
        let x: Vec<f64> = after
            .iter()
            .map(|s| s.response_bytes as f64 / 1024.0)
            .collect();
        let y: Vec<f64> = after.iter().map(|s| f(s) as f64).collect();
        let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
        let sxy: f64 = x.iter().zip(&y).map(|(x, y)| (x - mx) * (y - my)).sum();
        let sxx: f64 = x.iter().map(|x| (x - mx) * (x - mx)).sum();
        sxy / sxx
    };
    report.info(
        "soak",
        "RSS growth per KiB of the session's snapshot (least squares after warm-up), server / worker",
        format!(
            "{:.1} KiB / {:.1} KiB",
            slope(&|s| s.server_kib),
            slope(&|s| s.workers_kib)
        ),
    );
    let (wmid, wlo, whi, wworst) = deviation(&|s| s.workers_kib);
    let last = samples.last().copied();
    report.info(
        "soak",
        "worker RSS after warm-up (the long session's worker, restarted at each reconnect)",
        format!(
            "{wworst:.1} % from the median {:.1} MiB ({:.1}–{:.1} MiB)",
            mib(wmid),
            mib(wlo),
            mib(whi)
        ),
    );
    if let Some(last) = last {
        report.info(
            "soak",
            "time per turn, first and last sample interval; the last prompt response (the whole snapshot)",
            format!(
                "{:.2} ms → {:.2} ms; {:.0} KiB ({} tool turns among them)",
                samples.get(1).map_or(0.0, |s| s.turn_ms),
                last.turn_ms,
                last.response_bytes as f64 / 1024.0,
                tally.tool_turns
            ),
        );
    }
    report.info(
        "soak",
        format!(
            "`session.sqlite` (+ `-wal`) after {turns} turns vs the transcript ({} items; {} of {} tool calls failed)",
            text.items, text.tool_errors, text.tools
        ),
        format!(
            "{:.2} MiB (+ {} B) vs {:.2} MiB of text → **{:.2}×**; the items' CBOR {:.2} MiB ({:.2}× of it), {} free pages",
            store.sqlite as f64 / 1048576.0,
            store.wal,
            text.text as f64 / 1048576.0,
            (store.sqlite + store.wal) as f64 / text.text.max(1) as f64,
            store.cbor as f64 / 1048576.0,
            (store.sqlite + store.wal) as f64 / store.cbor.max(1) as f64,
            store.free_pages,
        ),
    );
    report.info(
        "soak",
        "worker runtime: one streamed delta's step (in process), by transcript length",
        step_ns
            .iter()
            .map(|(items, ns)| format!("{items} items: {:.2} µs", ns / 1e3))
            .collect::<Vec<_>>()
            .join(", "),
    );
    report.info(
        "soak",
        "faux compactions (in process) in 1,000 turns of a session that starts with 12,700 items",
        format!(
            "{compactions} (at turns {compaction_turns:?}); the summary at most {summary_max} B"
        ),
    );
    for (what, idle) in [
        ("a client attached, its worker alive", &attached_idle),
        ("no client, no worker", &bare_idle),
    ] {
        report.push(
            "soak",
            format!("idle server CPU over {idle_secs} s, {what}"),
            format!(
                "**{:.4} %** ({:.2} ms; {} clock ticks){}",
                idle.server_share * 100.0,
                idle.server_ns as f64 / 1e6,
                idle.server_ticks,
                idle.workers_ns.map_or(String::new(), |ns| format!(
                    "; worker {:.4} % ({:.2} ms)",
                    ns as f64 / idle.window.as_nanos() as f64 * 100.0,
                    ns as f64 / 1e6
                ))
            ),
            "< 0.1 %",
            Some(idle.server_share < 0.001),
        );
    }
    Ok(())
}

/// The run's shape.
#[derive(Debug, Clone, Copy)]
struct Plan {
    turns: usize,
    reconnect_every: usize,
    side_every: usize,
    sample_every: usize,
}

/// A connection that said hello and attached `id`.
async fn attached(server: &Server, id: &str) -> Result<RawConn, String> {
    let mut conn = RawConn::connect(&server.socket)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    conn.hello_v1().await.map_err(|e| format!("hello: {e}"))?;
    request(
        &mut conn,
        "a",
        Command::Attach {
            session_id: id.into(),
        },
    )
    .await?;
    Ok(conn)
}

/// Sends a request and reads frames until its response; fails on an error
/// response. Returns the response's payload, undecoded when it succeeded.
async fn request(conn: &mut RawConn, id: &str, command: Command) -> Result<Vec<u8>, String> {
    let what = format!("{command:?}");
    conn.send(&v1_request(id, command))
        .await
        .map_err(|e| format!("send: {e}"))?;
    let payload = conn
        .until_response()
        .await
        .map_err(|e| format!("{what}: {e}"))?;
    // A response is `{type, id, ok, …}`: `ok: true` sits in its first bytes.
    let head = &payload[..payload.len().min(64)];
    if head.windows(4).any(|w| w == b"\x62ok\xf5") {
        return Ok(payload);
    }
    match decode(&payload) {
        Ok(ServerMessage::Response(r)) => match r.outcome {
            Ok(_) => Ok(payload),
            Err(e) => Err(format!("{what}: {:?} {}", e.code, e.message)),
        },
        other => Err(format!("{what}: unexpected answer {other:?}")),
    }
}

/// The turns, reconnects and side sessions; returns the samples.
async fn drive(
    env: &Env,
    server: &Server,
    sessions: &Path,
    id: &str,
    plan: Plan,
    tally: &mut Tally,
) -> Result<Vec<Sample>, String> {
    let started = Instant::now();
    let mut samples = Vec::with_capacity(plan.turns / plan.sample_every + 1);
    let mut conn = attached(server, id).await?;
    let mut last = (Instant::now(), 0usize);
    let mut response_bytes = 0;
    for turn in 0..plan.turns {
        if turn > 0 && turn % plan.reconnect_every == 0 {
            drop(conn);
            conn = attached(server, id).await?;
            tally.reconnects += 1;
        }
        if turn % plan.side_every == plan.side_every / 2 {
            side_session(server, turn).await?;
            tally.side_sessions += 1;
        }
        if turn % plan.sample_every == 0 {
            let elapsed = last.0.elapsed();
            let turn_ms = if turn > last.1 {
                elapsed.as_secs_f64() * 1e3 / (turn - last.1) as f64
            } else {
                0.0
            };
            last = (Instant::now(), turn);
            let workers = children(server.pid);
            let server_at_once_kib = rss_kib(server.pid).unwrap_or(0);
            tokio::time::sleep(SETTLE).await;
            samples.push(Sample {
                turn,
                secs: started.elapsed().as_secs_f64(),
                server_kib: rss_kib(server.pid).unwrap_or(0),
                server_at_once_kib,
                workers_kib: workers.iter().filter_map(|&p| rss_kib(p)).sum(),
                workers: workers.len(),
                store_bytes: store_files(&sessions.join(id)),
                response_bytes,
                turn_ms,
            });
            if turn % (plan.sample_every * 10) == 0 {
                println!(
                    "  turn {turn}: {:.0} s, server {} KiB, workers {} KiB, response {} KiB, {turn_ms:.2} ms/turn (load average {})",
                    started.elapsed().as_secs_f64(),
                    rss_kib(server.pid).unwrap_or(0),
                    samples.last().map_or(0, |s| s.workers_kib),
                    response_bytes / 1024,
                    loadavg(),
                );
                // What is sampled so far, in case the run is cut short.
                write_csv(env, &samples)?;
            }
        }
        // Now and then a turn that runs a tool (the faux model asks for
        // `bash` on a prompt starting with `!`).
        let text = if turn % 50 == 25 {
            tally.tool_turns += 1;
            format!("!echo soak {turn}")
        } else {
            format!("turn {turn}: keep the daemon steady under a long session")
        };
        let payload = request(
            &mut conn,
            "p",
            Command::Prompt {
                session_id: id.into(),
                text,
            },
        )
        .await
        .map_err(|e| format!("turn {turn}: {e}"))?;
        response_bytes = payload.len();
    }
    drop(conn);
    Ok(samples)
}

/// A session created on a connection of its own, used for one turn, and
/// removed (its worker retires before the removal is answered).
async fn side_session(server: &Server, turn: usize) -> Result<(), String> {
    let mut conn = RawConn::connect(&server.socket)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    conn.hello_v1().await.map_err(|e| format!("hello: {e}"))?;
    let created = request(
        &mut conn,
        "c",
        Command::Create(CreateParams {
            name: Some(format!("soak side {turn}")),
            ..CreateParams::default()
        }),
    )
    .await?;
    let session_id = match decode(&created)? {
        ServerMessage::Response(r) => match r.outcome {
            Ok(CommandResult::Create { session }) => session.id,
            other => return Err(format!("create: {other:?}")),
        },
        other => return Err(format!("create: {other:?}")),
    };
    request(
        &mut conn,
        "p",
        Command::Prompt {
            session_id: session_id.clone(),
            text: format!("side session at turn {turn}"),
        },
    )
    .await?;
    request(&mut conn, "r", Command::Remove { session_id }).await?;
    Ok(())
}

/// Mean time of [`Runtime::step`] for one text delta of a streaming reply
/// in a session of `items` transcript items (in process, the faux model's
/// catalog, a delta every step and no IO): what each streamed word costs a
/// worker, which grew with the transcript while every step checked all of it.
fn delta_step_ns(items: usize) -> f64 {
    let stored = StoredSession {
        transcript: long_transcript(items),
        ..crate::server::stored_session("delta-steps", 1)
    };
    let (mut rt, _) = Runtime::open(stored, kernel::faux::models(), KInstant(1));
    let started = rt.step(
        KInstant(2),
        RuntimeInput::Operation {
            op: OpId(1),
            operation: Operation::prompt("go"),
        },
    );
    let call = started
        .iter()
        .find_map(|o| match o {
            RuntimeOutput::StartModel { call, .. } => Some(*call),
            _ => None,
        })
        .expect("a prompt starts a model call");
    let deltas = 2_000;
    let clock = Instant::now();
    for _ in 0..deltas {
        let out = rt.step(
            KInstant(3),
            RuntimeInput::Model {
                call,
                event: ModelEvent::Delta {
                    kind: DeltaKind::Text,
                    text: "word ".into(),
                },
            },
        );
        std::hint::black_box(out);
    }
    clock.elapsed().as_nanos() as f64 / f64::from(deltas)
}

/// Runs `turns` prompts in process on a faux session that starts with
/// `items` items (the faux model answering, no IO); returns the turns that
/// compacted, how many, and the longest summary stored. The faux model
/// reports 8 input tokens per item sent, so its 128,000-token window passes
/// the 80 % threshold at 12,800 items.
fn faux_compactions(items: usize, turns: usize) -> (Vec<usize>, usize, usize) {
    let stored = StoredSession {
        transcript: long_transcript(items),
        ..crate::server::stored_session("compactions", 1)
    };
    let (mut rt, _) = Runtime::open(stored, kernel::faux::models(), KInstant(1));
    let (mut at, mut summary_max) = (Vec::new(), 0);
    for turn in 0..turns {
        let now = KInstant(2 + turn as u64);
        let mut out = rt.step(
            now,
            RuntimeInput::Operation {
                op: OpId(turn as u64 + 1),
                operation: Operation::prompt(format!(
                    "turn {turn}: keep the daemon steady under a long session"
                )),
            },
        );
        loop {
            for o in &out {
                if let RuntimeOutput::Persist(Persist::State {
                    summary: Some(s), ..
                }) = o
                {
                    summary_max = summary_max.max(s.text.len());
                }
            }
            let Some((call, request)) = out.iter().find_map(|o| match o {
                RuntimeOutput::StartModel { call, request } => Some((*call, request.clone())),
                _ => None,
            }) else {
                break;
            };
            if request.purpose == Purpose::Summarize {
                at.push(turn);
            }
            let mut stream = FauxStream::start(&request, now, std::time::Duration::ZERO);
            out = stream
                .step(now)
                .into_iter()
                .flat_map(|event| rt.step(now, RuntimeInput::Model { call, event }))
                .collect();
        }
    }
    let compactions = at.len();
    (at, compactions, summary_max)
}

/// `items` transcript items, user and assistant in turn, as the soak's.
pub(crate) fn long_transcript(items: usize) -> Vec<TranscriptItem> {
    let model = kernel::faux::default_model();
    (0..items)
        .map(|i| {
            let id = format!("item-{}", i + 1);
            let text = format!("turn {i}: keep the daemon steady under a long session");
            if i % 2 == 0 {
                TranscriptItem::User(UserItem {
                    id,
                    content: vec![Content::Text { text }],
                    timestamp: i as u64,
                })
            } else {
                TranscriptItem::Assistant(AssistantItem {
                    id,
                    content: vec![Content::Text { text }],
                    model: model.clone(),
                    response_model: None,
                    usage: None,
                    timestamp: i as u64,
                    status: AssistantStatus::Complete(StopReason::Stop),
                    error_message: None,
                })
            }
        })
        .collect()
}

/// CPU used while nothing happens.
#[derive(Debug)]
struct Idle {
    window: Duration,
    server_ns: u64,
    server_share: f64,
    /// Clock ticks (`utime + stime`, 10 ms each) of the server meanwhile.
    server_ticks: u64,
    /// The workers' run time, when there were workers.
    workers_ns: Option<u64>,
}

/// The server's (and its workers') run time over `window` of idleness.
///
/// Summed per thread, over the threads alive at both ends: a thread of the
/// blocking pool that exits meanwhile (after 10 s without a job) takes its
/// run time out of the process's sum. The clock ticks of `/proc/<pid>/stat`
/// keep exited threads but count in 10 ms steps; both are reported.
fn idle_cpu(pid: u32, window: Duration) -> Idle {
    std::thread::sleep(Duration::from_millis(500));
    println!(
        "  idle window of {:.0} s (server pid {pid}, workers {:?})",
        window.as_secs_f64(),
        children(pid)
    );
    let workers = children(pid);
    let before = thread_runtimes(pid);
    let ticks_before = cpu_ticks(pid);
    let workers_before: Vec<_> = workers.iter().map(|&p| thread_runtimes(p)).collect();
    let started = Instant::now();
    std::thread::sleep(window);
    let server_ns = ran_since(&before, &thread_runtimes(pid));
    let ticks = cpu_ticks(pid).saturating_sub(ticks_before);
    let workers_ns = workers
        .iter()
        .zip(&workers_before)
        .map(|(&p, before)| ran_since(before, &thread_runtimes(p)))
        .sum();
    let window = started.elapsed();
    Idle {
        window,
        server_ns,
        server_share: server_ns as f64 / window.as_nanos() as f64,
        server_ticks: ticks,
        workers_ns: (!workers.is_empty()).then_some(workers_ns),
    }
}

/// Run time in ns of each thread of `pid` (`/proc/<pid>/task/*/schedstat`).
fn thread_runtimes(pid: u32) -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().parse::<u32>().ok();
        let stat = std::fs::read_to_string(task.path().join("schedstat")).ok();
        let run = stat.and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let (Some(tid), Some(run)) = (tid, run) {
            out.insert(tid, run);
        }
    }
    out
}

/// What the threads alive at both readings ran in between.
fn ran_since(
    before: &std::collections::BTreeMap<u32, u64>,
    after: &std::collections::BTreeMap<u32, u64>,
) -> u64 {
    after
        .iter()
        .filter_map(|(tid, run)| Some(run.saturating_sub(*before.get(tid)?)))
        .sum()
}

/// `utime + stime` of `/proc/<pid>/stat` in clock ticks (exited threads included).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15: the 12th and 13th after ')'.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// `session.sqlite` + `session.sqlite-wal` in bytes (0 for a missing file).
fn store_files(dir: &Path) -> u64 {
    ["session.sqlite", "session.sqlite-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// The store's files and what is in them.
#[derive(Debug)]
struct StoreSize {
    sqlite: u64,
    wal: u64,
    /// The stored items' bodies (protocol CBOR).
    cbor: u64,
    free_pages: u64,
}

fn store_size(dir: &Path) -> Result<StoreSize, String> {
    let len = |f: &str| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len());
    let db = rusqlite::Connection::open_with_flags(
        dir.join("session.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .map_err(|e| e.to_string())?;
    let cbor: i64 = db
        .query_row(
            "SELECT coalesce(sum(length(body)), 0) FROM items",
            [],
            |r| r.get(0),
        )
        .map_err(|e| e.to_string())?;
    let free: i64 = db
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    drop(db);
    Ok(StoreSize {
        sqlite: len("session.sqlite"),
        wal: len("session.sqlite-wal"),
        cbor: cbor as u64,
        free_pages: free as u64,
    })
}

/// The transcript as the store gives it back.
#[derive(Debug)]
struct Text {
    items: usize,
    /// Bytes of text in every content part (user, assistant, tool), and
    /// the compaction summary.
    text: u64,
    /// Tool items, and those that ended in an error.
    tools: usize,
    tool_errors: usize,
}

fn transcript_bytes(sessions: &Path, id: &str) -> Result<Text, String> {
    let (store, stored) = pi_store::SessionStore::open(sessions, id).map_err(|e| e.to_string())?;
    let content = |parts: &[Content]| -> u64 {
        parts
            .iter()
            .map(|c| match c {
                Content::Text { text } => text.len() as u64,
                Content::Thinking { thinking, .. } => thinking.len() as u64,
                // A tool call's text is its name and input; an image its data.
                Content::ToolCall {
                    tool_name, input, ..
                } => (tool_name.len() + format!("{input:?}").len()) as u64,
                Content::Image { data, .. } => data.len() as u64,
            })
            .sum()
    };
    let mut text = stored.summary.as_ref().map_or(0, |s| s.text.len() as u64);
    let tools: Vec<&ToolItem> = stored
        .transcript
        .iter()
        .filter_map(|i| match i {
            TranscriptItem::Tool(t) => Some(t),
            _ => None,
        })
        .collect();
    let tool_errors = tools
        .iter()
        .filter(|t| t.status != ToolStatus::Complete)
        .count();
    let tools = tools.len();
    for item in &stored.transcript {
        text += match item {
            TranscriptItem::User(u) => content(&u.content),
            TranscriptItem::Assistant(a) => content(&a.content),
            TranscriptItem::Tool(t) => content(&t.content),
        };
    }
    let items = stored.transcript.len();
    store.close().map_err(|e| e.to_string())?;
    Ok(Text {
        items,
        text,
        tools,
        tool_errors,
    })
}

fn write_csv(env: &Env, samples: &[Sample]) -> Result<std::path::PathBuf, String> {
    let dir = env.target_dir.join("bench-soak");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("soak.csv");
    let mut out = String::from(
        "turn,seconds,server_rss_kib,workers_rss_kib,workers,store_bytes,response_bytes,turn_ms,\
         server_rss_at_once_kib\n",
    );
    for s in samples {
        let _ = writeln!(
            out,
            "{},{:.3},{},{},{},{},{},{:.3},{}",
            s.turn,
            s.secs,
            s.server_kib,
            s.workers_kib,
            s.workers,
            s.store_bytes,
            s.response_bytes,
            s.turn_ms,
            s.server_at_once_kib
        );
    }
    std::fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Draws the samples with `bench/soak_plot.py` (python3 with matplotlib),
/// next to the CSV; a missing python or matplotlib is reported, not fatal.
fn plot(env: &Env, csv: &Path) {
    let png = csv.with_file_name("soak-rss.png");
    let script = env.workspace.join("bench").join("soak_plot.py");
    match std::process::Command::new("python3")
        .arg(&script)
        .arg(csv)
        .arg(&png)
        .status()
    {
        Ok(status) if status.success() => println!("  plot: {}", png.display()),
        Ok(status) => println!("  plot: {} failed ({status})", script.display()),
        Err(e) => println!("  plot: cannot run python3: {e}"),
    }
}
