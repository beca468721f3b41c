//! Item 1: request round trips (`list`; `attach` + `detach`) over our socket
//! against a raw Unix-socket echo of the same frames.

use crate::echo::Echo;
use crate::raw::{Kind, RawConn, kind, v1_request};
use crate::server::{Server, create_sessions};
use crate::util::{
    Drain, Env, Placement, Report, ctx_switches, fmt_us, median, percentile, schedstat, sorted, us,
};
use kernel::protocol::{ClientHello, ClientMessage, Command, PROTOCOL_VERSION};
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// `n` sequential cycles; each sends `requests` one after the other, waiting
/// for each response (and skipping events). Returns µs per cycle.
pub(crate) async fn cycles(
    conn: &mut RawConn,
    requests: &[Vec<u8>],
    n: usize,
) -> io::Result<Vec<f64>> {
    let split = cycles_split(conn, requests, n).await?;
    Ok((0..n).map(|i| split.iter().map(|s| s[i]).sum()).collect())
}

/// [`cycles`], with the µs of each request of the cycle kept apart.
pub(crate) async fn cycles_split(
    conn: &mut RawConn,
    requests: &[Vec<u8>],
    n: usize,
) -> io::Result<Vec<Vec<f64>>> {
    let mut samples = vec![Vec::with_capacity(n); requests.len()];
    for _ in 0..n {
        for (i, request) in requests.iter().enumerate() {
            let start = Instant::now();
            conn.send(request).await?;
            conn.until_response().await?;
            samples[i].push(us(start.elapsed()));
        }
    }
    Ok(samples)
}

/// Reads and frames everything that arrives until `quiet` passes with nothing.
pub(crate) async fn collect_quiet(conn: &mut RawConn, quiet: Duration) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Ok(Ok(payload)) = tokio::time::timeout(quiet, conn.frame()).await {
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&payload);
    }
    bytes
}

/// What the server sends for each request of a cycle: the frames up to and
/// including its response (trailing events go with the last request), and
/// how many bytes the other attached client (`holder`) got meanwhile.
pub(crate) async fn capture(
    conn: &mut RawConn,
    requests: &[Vec<u8>],
    holder: Option<&Holder>,
) -> io::Result<Vec<(Vec<u8>, usize)>> {
    let settle = Duration::from_millis(200);
    collect_quiet(conn, settle).await;
    let received = || holder.map_or(0, Holder::received);
    let mut script = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let before = received();
        conn.send(request).await?;
        let mut bytes = Vec::new();
        loop {
            let payload = conn.frame().await?;
            bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            bytes.extend_from_slice(&payload);
            if kind(&payload) == Kind::Response {
                break;
            }
        }
        if i + 1 == requests.len() {
            bytes.extend(collect_quiet(conn, settle).await);
        } else {
            tokio::time::sleep(settle).await;
        }
        script.push((bytes, (received() - before) as usize));
    }
    Ok(script)
}

/// A pair measured alternately: A (the baseline) then B (ours), `rounds` times.
#[derive(Debug, Default)]
pub(crate) struct Pair {
    /// Every A sample.
    pub(crate) a: Vec<f64>,
    /// Every B sample.
    pub(crate) b: Vec<f64>,
    /// Per round: median(B) / median(A).
    pub(crate) ratios: Vec<f64>,
    /// Per round: the server's µs on a CPU per cycle of B (when measured).
    pub(crate) server_run: Vec<f64>,
    /// Per round: the server's threads' µs waiting for a CPU per cycle of B.
    pub(crate) server_wait: Vec<f64>,
    /// Per round: the server's threads' context switches per cycle of B.
    pub(crate) server_switches: Vec<f64>,
    /// Per round: the baseline server's µs on a CPU per cycle of A (when measured).
    pub(crate) baseline_run: Vec<f64>,
    /// Per round: the baseline server's context switches per cycle of A.
    pub(crate) baseline_switches: Vec<f64>,
}

impl Pair {
    /// Adds one round.
    pub(crate) fn round(&mut self, a: Vec<f64>, b: Vec<f64>) {
        self.ratios.push(median(&b) / median(&a));
        self.a.extend(a);
        self.b.extend(b);
    }

    /// median(B) / median(A) over all samples.
    pub(crate) fn ratio(&self) -> f64 {
        median(&self.b) / median(&self.a)
    }

    /// "p50 x, p99 y".
    pub(crate) fn describe(samples: &[f64]) -> String {
        let s = sorted(samples);
        format!(
            "p50 {}, p99 {}",
            fmt_us(percentile(&s, 50.0)),
            fmt_us(percentile(&s, 99.0))
        )
    }

    /// "server on a CPU x µs/cycle, waiting y µs/cycle" (medians of rounds).
    pub(crate) fn server_time(&self) -> String {
        if self.server_run.is_empty() {
            return String::new();
        }
        let baseline = if self.baseline_run.is_empty() {
            String::new()
        } else {
            format!(
                " (the echo: {} on a CPU, {:.1} context switches)",
                fmt_us(median(&self.baseline_run)),
                median(&self.baseline_switches)
            )
        };
        format!(
            "; server threads per cycle: {} on a CPU, {} waiting for one, {:.1} context switches{baseline}",
            fmt_us(median(&self.server_run)),
            fmt_us(median(&self.server_wait)),
            median(&self.server_switches)
        )
    }

    /// The per-round ratio range.
    pub(crate) fn spread(&self) -> String {
        let s = sorted(&self.ratios);
        format!(
            "rounds {:.2}–{:.2}",
            s.first().copied().unwrap_or(f64::NAN),
            s.last().copied().unwrap_or(f64::NAN)
        )
    }
}

/// Round trips of `requests` against our server and against an echo of the
/// same frames, alternating.
pub(crate) async fn versus_echo(
    env: &Env,
    ours: &mut RawConn,
    server_pid: u32,
    requests: &[Vec<u8>],
    n: usize,
    holder: Option<&Holder>,
) -> Result<(Pair, Vec<usize>, Vec<(usize, usize)>), String> {
    let err = |e: io::Error| e.to_string();
    cycles(ours, requests, n / 5 + 1).await.map_err(err)?; // warm up
    let script = capture(ours, requests, holder).await.map_err(err)?;
    let request_sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
    let reply_sizes: Vec<(usize, usize)> = script
        .iter()
        .map(|(reply, side)| (reply.len(), *side))
        .collect();
    let echo = Echo::start(&env.fresh_dir("echo").join("echo.sock"), script).map_err(err)?;
    let _side = echo.side().map_err(err)?;
    let mut baseline = RawConn::connect(&echo.path).await.map_err(err)?;
    cycles(&mut baseline, requests, n / 5 + 1)
        .await
        .map_err(err)?;
    let mut pair = Pair::default();
    for _ in 0..env.rounds {
        let echo_before = schedstat(echo.pid());
        let echo_switches = ctx_switches(echo.pid());
        let a = cycles(&mut baseline, requests, n).await.map_err(err)?;
        pair.baseline_run
            .push((schedstat(echo.pid()).0 - echo_before.0) as f64 / 1e3 / n as f64);
        pair.baseline_switches
            .push((ctx_switches(echo.pid()) - echo_switches) as f64 / n as f64);
        let before = schedstat(server_pid);
        let switches = ctx_switches(server_pid);
        let b = cycles(ours, requests, n).await.map_err(err)?;
        let after = schedstat(server_pid);
        pair.server_switches
            .push((ctx_switches(server_pid) - switches) as f64 / n as f64);
        pair.server_run
            .push((after.0 - before.0) as f64 / 1e3 / n as f64);
        pair.server_wait
            .push((after.1 - before.1) as f64 / 1e3 / n as f64);
        pair.round(a, b);
    }
    Ok((pair, request_sizes, reply_sizes))
}

/// A connection that stays attached to a session (so it stays live) and
/// drains whatever it is sent on its own thread.
#[derive(Debug)]
pub(crate) struct Holder {
    drain: Drain,
}

impl Holder {
    /// Connects, says hello, attaches `session_id` and waits for the answer.
    pub(crate) fn attach(socket: &Path, session_id: &str) -> io::Result<Self> {
        let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
        stream.write_all(&crate::raw::v1_frame(&ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: None,
        })))?;
        stream.write_all(&v1_request(
            "hold",
            Command::Attach {
                session_id: session_id.into(),
            },
        ))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        loop {
            let mut header = [0u8; 4];
            stream.read_exact(&mut header).map_err(|e| {
                io::Error::other(format!("the holder's attach was not answered: {e}"))
            })?;
            let mut payload = vec![0u8; u32::from_be_bytes(header) as usize];
            stream.read_exact(&mut payload)?;
            if kind(&payload) == Kind::Response {
                break;
            }
        }
        stream.set_read_timeout(None)?;
        Ok(Self {
            drain: Drain::start(stream)?,
        })
    }

    /// Bytes received since the attach was answered.
    pub(crate) fn received(&self) -> u64 {
        self.drain.received()
    }
}

/// Item 1, twice: with every process (this bench, the server, the echo) on
/// one CPU, then where the scheduler puts them.
///
/// On one CPU a round trip costs what the software does, the same for both
/// sides. Left free, each side's round trip is either fast (client and
/// server take turns on one CPU) or several times slower (each wake-up
/// crosses to the other, idle, CPU: on this VM that costs tens of µs of the
/// waker's CPU time), and which one it gets depends on timing: an echo that
/// spins 6 µs per request (`BENCH_ECHO_SPIN_US=6`) flips to the slow mode
/// (BENCHMARKS.md, item 1). The target is judged on the first.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let placement = Placement::discover()?;
    placement.apply(true, &[])?;
    let pinned = measure(env, report, &format!("all on CPU {}", placement.cpu), true);
    placement.apply(false, &[])?;
    pinned?;
    measure(env, report, "free placement", false)
}

/// Item 1 under the current CPU affinity (inherited by the processes it starts).
fn measure(env: &Env, report: &mut Report, placement: &str, judged: bool) -> Result<(), String> {
    let sessions = env.fresh_dir("rtt-sessions");
    let ids = create_sessions(&sessions, 1, 1)?;
    let id = ids[0].clone();
    let server = Server::start(env, &sessions, &[])?;
    let holder = Holder::attach(&server.socket, &id).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut conn = RawConn::connect(&server.socket)
            .await
            .map_err(|e| e.to_string())?;
        conn.hello_v1().await.map_err(|e| e.to_string())?;

        // `BENCH_RTT=attach` measures only attach+detach (for profiling).
        let only_attach = std::env::var("BENCH_RTT").is_ok_and(|v| v == "attach");
        let n = env.pick(200, 2000);
        let list = vec![v1_request("r1", Command::List)];
        if !only_attach {
            let (pair, req, rep) = versus_echo(env, &mut conn, server.pid, &list, n, Some(&holder)).await?;
            let ratio = pair.ratio();
            report.push(
                "1",
                format!(
                    "`list` round trip (1 stored session; request {} B, reply {} B), ours vs raw echo, {placement}",
                    req[0], rep[0].0
                ),
                format!(
                    "ours {} / echo {} → **{ratio:.2}×** ({}){}",
                    Pair::describe(&pair.b),
                    Pair::describe(&pair.a),
                    pair.spread(),
                    pair.server_time()
                ),
                if judged { "≤ 1.5×" } else { "(≤ 1.5× on one CPU)" },
                judged.then_some(ratio <= 1.5),
            );
        }

        let n = env.pick(100, 1000);
        let attach = v1_request(
            "r2",
            Command::Attach {
                session_id: id.clone(),
            },
        );
        let detach = v1_request("r3", Command::Detach { session_id: id.clone() });
        let requests = [attach, detach];
        let (pair, req, rep) = versus_echo(env, &mut conn, server.pid, &requests, n, Some(&holder)).await?;
        let ratio = pair.ratio();
        let split = cycles_split(&mut conn, &requests, n).await.map_err(|e| e.to_string())?;
        report.push(
            "1",
            format!(
                "`attach`+`detach` round trips (live session; requests {}+{} B, replies {}+{} B incl. the server_snapshot event after detach, and {} B to the other attached client), ours vs raw echo (which writes as much to a second client), {placement}",
                req[0], req[1], rep[0].0, rep[1].0, rep[0].1 + rep[1].1
            ),
            format!(
                "ours {} / echo {} → **{ratio:.2}×** ({}){}; ours split: attach {}, detach {}",
                Pair::describe(&pair.b),
                Pair::describe(&pair.a),
                pair.spread(),
                pair.server_time(),
                Pair::describe(&split[0]),
                Pair::describe(&split[1])
            ),
            if judged { "≤ 1.5×" } else { "(≤ 1.5× on one CPU)" },
            judged.then_some(ratio <= 1.5),
        );
        Ok(())
    })
}
