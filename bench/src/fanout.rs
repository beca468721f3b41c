//! Item 2: one session streaming deltas to 1, 10 and 100 attached clients.
//!
//! Every client is a raw connection that attached the session; client 0 also
//! sends the prompt. A reader per client timestamps each read and hashes
//! every `session_progress` payload in it (the server encodes a broadcast
//! once, so the same event has the same bytes on every connection). Only the
//! other frames are decoded, to see the turn's final idle snapshot.
//!
//! - deliveries/s: progress frames received by all clients together, divided
//!   by the time from the first to the last progress arrival;
//! - first delivery: from the request that starts the stream to the first
//!   progress arrival at any client (a server that holds its events back and
//!   sends them at the end would look fast by the rate alone);
//! - delivery latency: for each event, each client's arrival minus the
//!   earliest arrival of the same event at any client (the fan-out skew; the
//!   worker → server hop before the first delivery is not in it);
//! - memory per attached client: server RSS after connecting and attaching
//!   N idle clients minus before, divided by N;
//! - server CPU per delivery: user+system time of the server and its worker
//!   during the turn, divided by deliveries.

use crate::raw::{RawConn, decode, is_progress, v1_request};
use crate::server::{Server, create_sessions};
use crate::util::{
    Env, Report, Split, children, fmt_rate, fmt_us, hash_bytes, median, percentile, rss_kib,
    schedstat, sorted, us, wait_no_children,
};
use kernel::protocol::{
    Command, CommandResult, Response, ServerEvent, ServerMessage, SessionPhase,
};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// One client's arrivals: (payload hash, arrival time).
pub(crate) type Arrivals = Vec<(u64, Instant)>;

/// The outcome of one fan-out round.
#[derive(Debug, Default)]
pub(crate) struct FanoutResult {
    /// Frames delivered to all clients together.
    pub(crate) deliveries: usize,
    /// Distinct events.
    pub(crate) events: usize,
    /// First to last arrival.
    pub(crate) span: Duration,
    /// The request that started the stream to the first arrival.
    pub(crate) first_delivery: Duration,
    /// Per (client, event): arrival minus the event's earliest arrival, µs.
    pub(crate) skew: Vec<f64>,
    /// The same, for the first and the last tenth of the clients in the
    /// order they connected (at least one client each): whether the last
    /// connections of a burst wait behind the first ones.
    pub(crate) skew_first: Vec<f64>,
    pub(crate) skew_last: Vec<f64>,
    /// Server (+ worker) CPU seconds during the round.
    pub(crate) server_cpu: f64,
    /// The bench's own CPU seconds during the round (the clients).
    pub(crate) client_cpu: f64,
    /// Seconds the server's (+ worker's) threads waited for a CPU.
    pub(crate) server_wait: f64,
    /// Seconds the bench's own threads (the clients) waited for a CPU.
    pub(crate) client_wait: f64,
}

impl FanoutResult {
    /// Deliveries per second.
    pub(crate) fn rate(&self) -> f64 {
        self.deliveries as f64 / self.span.as_secs_f64().max(1e-9)
    }
}

/// Matches the same event across clients (hash + occurrence number).
/// `per_client` is in the order the clients connected; `started` is when
/// the request that starts the stream was about to go out.
pub(crate) fn analyze(per_client: &[Arrivals], started: Instant) -> FanoutResult {
    let mut by_event: HashMap<(u64, u32), Vec<(usize, Instant)>> = HashMap::new();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut deliveries = 0;
    for (client, arrivals) in per_client.iter().enumerate() {
        let mut seen: HashMap<u64, u32> = HashMap::new();
        for &(hash, at) in arrivals {
            let n = seen.entry(hash).or_insert(0);
            by_event.entry((hash, *n)).or_default().push((client, at));
            *n += 1;
            deliveries += 1;
            first = Some(first.map_or(at, |f| f.min(at)));
            last = Some(last.map_or(at, |l| l.max(at)));
        }
    }
    let tenth = per_client.len().div_ceil(10);
    let last_tenth = per_client.len().saturating_sub(tenth);
    let mut skew = Vec::with_capacity(deliveries);
    let (mut skew_first, mut skew_last) = (Vec::new(), Vec::new());
    for times in by_event.values() {
        let earliest = times.iter().map(|t| t.1).min().expect("non-empty");
        for &(client, at) in times {
            let late = us(at - earliest);
            skew.push(late);
            if client < tenth {
                skew_first.push(late);
            }
            if client >= last_tenth {
                skew_last.push(late);
            }
        }
    }
    FanoutResult {
        deliveries,
        events: by_event.len(),
        span: match (first, last) {
            (Some(f), Some(l)) => l - f,
            _ => Duration::ZERO,
        },
        first_delivery: first.map_or(Duration::ZERO, |f| f.saturating_duration_since(started)),
        skew,
        skew_first,
        skew_last,
        server_cpu: 0.0,
        client_cpu: 0.0,
        server_wait: 0.0,
        client_wait: 0.0,
    }
}

/// CPU seconds of a process and its children (from schedstat, in ns).
pub(crate) fn tree_cpu(pid: u32) -> f64 {
    tree_sched(pid).0
}

/// Seconds a process and its children ran on a CPU and waited for one.
pub(crate) fn tree_sched(pid: u32) -> (f64, f64) {
    let (mut run, mut wait) = schedstat(pid);
    for child in children(pid) {
        let (r, w) = schedstat(child);
        run += r;
        wait += w;
    }
    (run as f64 / 1e9, wait as f64 / 1e9)
}

/// K raw clients attached to one session.
#[derive(Debug)]
pub(crate) struct Audience {
    conns: Vec<RawConn>,
    revisions: Vec<u64>,
}

impl Audience {
    /// Connects `k` clients, says hello and attaches each to `session_id`.
    pub(crate) async fn attach(socket: &Path, session_id: &str, k: usize) -> Result<Self, String> {
        let mut conns = Vec::with_capacity(k);
        for _ in 0..k {
            conns.push(RawConn::connect(socket).await.map_err(|e| e.to_string())?);
        }
        Self::join(conns, session_id).await
    }

    /// Says hello on each of `fresh` (connected, nothing sent yet) and
    /// attaches it to `session_id`.
    pub(crate) async fn join(fresh: Vec<RawConn>, session_id: &str) -> Result<Self, String> {
        let mut conns = Vec::with_capacity(fresh.len());
        let mut revisions = Vec::with_capacity(fresh.len());
        let attach = v1_request(
            "a",
            Command::Attach {
                session_id: session_id.into(),
            },
        );
        for mut conn in fresh {
            conn.hello_v1().await.map_err(|e| e.to_string())?;
            conn.send(&attach).await.map_err(|e| e.to_string())?;
            let payload = conn.until_response().await.map_err(|e| e.to_string())?;
            match decode(&payload)? {
                ServerMessage::Response(Response {
                    outcome: Ok(CommandResult::Attach { session }),
                    ..
                }) => revisions.push(session.revision),
                other => return Err(format!("attach failed: {other:?}")),
            }
            conns.push(conn);
        }
        Ok(Self { conns, revisions })
    }

    /// Client 0 sends `prompt` (a framed request); every client records the
    /// progress it receives until the turn's final idle snapshot.
    pub(crate) async fn round(
        &mut self,
        prompt: &[u8],
        server_pid: u32,
    ) -> Result<FanoutResult, String> {
        let conns = std::mem::take(&mut self.conns);
        let (cpu0, wait0) = tree_sched(server_pid);
        let (me0, me_wait0) = schedstat(std::process::id());
        let mut tasks = Vec::with_capacity(conns.len());
        let started = Instant::now();
        // Client 0 is spawned last, so every other reader is waiting before the prompt goes out.
        for (i, conn) in conns.into_iter().enumerate().rev() {
            let first = (i == 0).then(|| prompt.to_vec());
            tasks.push(tokio::spawn(record(conn, self.revisions[i], first)));
        }
        let mut per_client = Vec::with_capacity(tasks.len());
        let mut back = Vec::with_capacity(tasks.len());
        for (j, task) in tasks.into_iter().enumerate() {
            let (conn, arrivals, revision) = task
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            let i = self.revisions.len() - 1 - j;
            self.revisions[i] = revision;
            back.push(conn);
            per_client.push(arrivals);
        }
        back.reverse();
        per_client.reverse();
        self.conns = back;
        let mut result = analyze(&per_client, started);
        let (cpu1, wait1) = tree_sched(server_pid);
        result.server_cpu = cpu1 - cpu0;
        result.server_wait = wait1 - wait0;
        let (me1, me_wait1) = schedstat(std::process::id());
        result.client_cpu = (me1 - me0) as f64 / 1e9;
        result.client_wait = (me_wait1 - me_wait0) as f64 / 1e9;
        Ok(result)
    }
}

/// The revision of an idle session snapshot carried by `message`, if any.
fn idle_revision(message: &ServerMessage) -> Option<u64> {
    let snapshot = match message {
        ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => snapshot,
        ServerMessage::Response(Response {
            outcome: Ok(CommandResult::Prompt { session }),
            ..
        }) => session,
        _ => return None,
    };
    (snapshot.phase == SessionPhase::Idle).then_some(snapshot.revision)
}

/// One client's reader for one turn.
async fn record(
    mut conn: RawConn,
    start_revision: u64,
    first: Option<Vec<u8>>,
) -> std::io::Result<(RawConn, Arrivals, u64)> {
    if let Some(bytes) = first {
        conn.send(&bytes).await?;
    }
    let mut arrivals = Vec::with_capacity(4096);
    let mut done = None;
    while done.is_none() {
        conn.fill().await?;
        let now = Instant::now();
        conn.drain(|payload| {
            if is_progress(payload) {
                arrivals.push((hash_bytes(payload), now));
            } else if done.is_none()
                && let Ok(message) = decode(payload)
                && let Some(revision) = idle_revision(&message)
                && revision > start_revision
            {
                done = Some(revision);
            }
        });
    }
    Ok((conn, arrivals, done.expect("loop ended")))
}

/// A prompt of `words` distinct words: the faux reply echoes it in one
/// delta per word (plus ~12 of its own).
pub(crate) fn prompt_text(words: usize) -> String {
    (0..words)
        .map(|i| format!("w{i:04}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The framed prompt request.
pub(crate) fn prompt_frame(session_id: &str, words: usize) -> Vec<u8> {
    v1_request(
        "p",
        Command::Prompt {
            session_id: session_id.into(),
            text: prompt_text(words),
        },
    )
}

/// Summary of several rounds.
pub(crate) struct Summary {
    pub(crate) rate: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p99_max: f64,
    /// p99 skew of the first and the last tenth of the clients (connect order).
    pub(crate) p99_first: f64,
    pub(crate) p99_last: f64,
    /// Median over rounds of [`FanoutResult::first_delivery`], µs.
    pub(crate) first_delivery: f64,
    pub(crate) cpu_per_delivery_us: f64,
    pub(crate) cpu_per_event_us: f64,
    pub(crate) client_cpu_per_delivery_us: f64,
    /// Server (+ worker) run-queue wait as a share of the rounds' span.
    pub(crate) wait_share: f64,
    /// The same for the bench's clients.
    pub(crate) client_wait_share: f64,
    pub(crate) events: usize,
}

/// Medians over rounds (a load spike from outside spoils one round, not the figure).
pub(crate) fn summarize(results: &[FanoutResult]) -> Summary {
    let rates: Vec<f64> = results.iter().map(FanoutResult::rate).collect();
    let per_round: Vec<(f64, f64)> = results
        .iter()
        .map(|r| {
            let s = sorted(&r.skew);
            (percentile(&s, 50.0), percentile(&s, 99.0))
        })
        .collect();
    let p50s: Vec<f64> = per_round.iter().map(|p| p.0).collect();
    let p99s: Vec<f64> = per_round.iter().map(|p| p.1).collect();
    let p99_of = |pick: fn(&FanoutResult) -> &Vec<f64>| {
        let p99s: Vec<f64> = results
            .iter()
            .map(|r| percentile(&sorted(pick(r)), 99.0))
            .collect();
        median(&p99s)
    };
    let deliveries: usize = results.iter().map(|r| r.deliveries).sum();
    let events: usize = results.iter().map(|r| r.events).sum();
    let cpu: f64 = results.iter().map(|r| r.server_cpu).sum();
    let client: f64 = results.iter().map(|r| r.client_cpu).sum();
    Summary {
        rate: median(&rates),
        p50: median(&p50s),
        p99: median(&p99s),
        p99_max: p99s.iter().copied().fold(0.0, f64::max),
        p99_first: p99_of(|r| &r.skew_first),
        p99_last: p99_of(|r| &r.skew_last),
        first_delivery: median(
            &results
                .iter()
                .map(|r| us(r.first_delivery))
                .collect::<Vec<_>>(),
        ),
        cpu_per_delivery_us: cpu * 1e6 / deliveries.max(1) as f64,
        cpu_per_event_us: cpu * 1e6 / events.max(1) as f64,
        client_cpu_per_delivery_us: client * 1e6 / deliveries.max(1) as f64,
        wait_share: results.iter().map(|r| r.server_wait).sum::<f64>()
            / results
                .iter()
                .map(|r| r.span.as_secs_f64())
                .sum::<f64>()
                .max(1e-9),
        client_wait_share: results.iter().map(|r| r.client_wait).sum::<f64>()
            / results
                .iter()
                .map(|r| r.span.as_secs_f64())
                .sum::<f64>()
                .max(1e-9),
        events: events / results.len().max(1),
    }
}

/// Item 2.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let split = Split::from_env()?;
    let runtime = Split::client_runtime(split.as_ref())?;
    let sessions = env.fresh_dir("fanout-sessions");
    // A fresh session for each audience and for the paced run: every turn
    // grows the transcript, and with it the session snapshots that open and
    // close each turn (sent to every client), so a shared session would make
    // each figure depend on what ran before it.
    let mut fresh = create_sessions(&sessions, 4, 1)?;
    let paced_id = fresh.pop().expect("four sessions");
    let mut fresh = fresh.into_iter();
    let words = env.pick(300, 2000);
    let rounds = env.rounds.min(5);

    // Burst: the faux model streams with no delay, so the pipeline is the bottleneck.
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "0".into())])?;
    if let Some(split) = &split {
        split.place(&[server.pid]);
    }
    // `BENCH_FANOUT_K=100` runs only that audience (for profiling).
    let ks: Vec<usize> = std::env::var("BENCH_FANOUT_K")
        .ok()
        .map(|v| v.split(',').filter_map(|k| k.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 10, 100]);
    for k in ks {
        let Some(id) = fresh.next() else {
            return Err("BENCH_FANOUT_K lists more than 3 audiences".into());
        };
        let prompt = prompt_frame(&id, words);
        runtime.block_on(async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let rss0 = rss_kib(server.pid).unwrap_or(0);
            let mut audience = Audience::attach(&server.socket, &id, k).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let rss1 = rss_kib(server.pid).unwrap_or(0);
            audience.round(&prompt, server.pid).await?; // warm up
            let mut results = Vec::new();
            for _ in 0..rounds {
                results.push(audience.round(&prompt, server.pid).await?);
            }
            let s = summarize(&results);
            let per_client_kib = (rss1 as f64 - rss0 as f64) / k as f64;
            let what = format!(
                "fan-out burst (`PI_FAUX_DELAY_MS=0`), {k} attached client{}, {} events/turn{}",
                if k == 1 { "" } else { "s" },
                s.events,
                Split::describe(split.as_ref())
            );
            let figure = format!(
                "**{}/s** deliveries; skew p50 {} p99 {} (p99 of the first tenth of the clients {}, of the last tenth {}); server+worker CPU {:.2} µs/delivery ({:.1} µs/event); bench clients {:.2} µs/delivery; waiting for a CPU per second of the burst: server+worker {:.0} ms, bench clients {:.0} ms; server RSS {:+.1} KiB per attached client",
                fmt_rate(s.rate),
                fmt_us(s.p50),
                fmt_us(s.p99),
                fmt_us(s.p99_first),
                fmt_us(s.p99_last),
                s.cpu_per_delivery_us,
                s.cpu_per_event_us,
                s.client_cpu_per_delivery_us,
                s.wait_share * 1000.0,
                s.client_wait_share * 1000.0,
                per_client_kib
            );
            if k == 100 {
                report.push(
                    "2",
                    what,
                    figure,
                    "≥ 200k/s, p99 < 5 ms",
                    Some(s.rate >= 200_000.0 && s.p99 < 5000.0),
                );
            } else {
                report.info("2", what, figure);
            }
            drop(audience);
            Ok::<(), String>(())
        })?;
        wait_no_children(server.pid, Duration::from_secs(15));
    }
    drop(server);

    // Paced: 1 ms between deltas, as a model streams; the latency that a client sees.
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "1".into())])?;
    if let Some(split) = &split {
        split.place(&[server.pid]);
    }
    let paced_words = env.pick(200, 1000);
    let id = paced_id;
    let prompt = prompt_frame(&id, paced_words);
    runtime.block_on(async {
        let mut audience = Audience::attach(&server.socket, &id, 100).await?;
        audience.round(&prompt, server.pid).await?;
        let mut results = Vec::new();
        for _ in 0..rounds {
            results.push(audience.round(&prompt, server.pid).await?);
        }
        let s = summarize(&results);
        report.push(
            "2",
            format!(
                "fan-out paced (`PI_FAUX_DELAY_MS=1`), 100 attached clients, {} events/turn{}",
                s.events,
                Split::describe(split.as_ref())
            ),
            format!(
                "{}/s deliveries (paced by the model); skew **p50 {} p99 {}** (median of {} rounds; worst round's p99 {}); server+worker CPU {:.2} µs/delivery; their threads waited for a CPU {:.0} ms per second of streaming",
                fmt_rate(s.rate),
                fmt_us(s.p50),
                fmt_us(s.p99),
                results.len(),
                fmt_us(s.p99_max),
                s.cpu_per_delivery_us,
                s.wait_share * 1000.0
            ),
            "p99 < 5 ms",
            Some(s.p99 < 5000.0),
        );
        Ok::<(), String>(())
    })?;
    Ok(())
}
