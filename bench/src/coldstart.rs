//! Item 3: worker cold start — attaching a stored idle session until its
//! snapshot arrives (the server spawns a worker, which opens the store and
//! reports ready) — against spawning the same binary to do nothing.

use crate::raw::{RawConn, v1_request};
use crate::rtt::Pair;
use crate::server::{Server, create_sessions};
use crate::util::{
    Env, Report, children, fmt_us, log_time, median, schedstat, us, wait_no_children, wall_sod,
};
use kernel::protocol::Command;
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

/// Spawns `bin args` and waits for it: wall µs, and the child's µs on a CPU
/// and waiting for one (read from its schedstat while it is a zombie).
fn spawn_nothing(bin: &Path, args: &[&str]) -> Result<(f64, f64, f64), String> {
    use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
    let start = Instant::now();
    let mut child = Process::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = Pid::from_raw(child.id() as i32).ok_or("no pid")?;
    waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
    )
    .map_err(|e| e.to_string())?;
    let took = us(start.elapsed());
    let stat =
        std::fs::read_to_string(format!("/proc/{}/schedstat", child.id())).unwrap_or_default();
    let mut fields = stat
        .split_whitespace()
        .map(|f| f.parse::<f64>().unwrap_or(0.0));
    let (run, wait) = (fields.next().unwrap_or(0.0), fields.next().unwrap_or(0.0));
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("{} {args:?} failed: {status}", bin.display()));
    }
    Ok((took, run / 1e3, wait / 1e3))
}

/// One cold attach (timed) and its detach, once the previous worker
/// exited. Also returns the wall-clock second of day of the send and of the
/// answer (to line up with the server's log), and the worker's µs on a CPU
/// and waiting for one until then.
async fn cold(
    conn: &mut RawConn,
    server_pid: u32,
    attach: &[u8],
    detach: &[u8],
) -> Result<(f64, f64, f64, f64, f64), String> {
    if !wait_no_children(server_pid, Duration::from_secs(15)) {
        return Err("the previous worker did not exit".to_string());
    }
    let sent = wall_sod();
    let start = Instant::now();
    conn.send(attach).await.map_err(|e| e.to_string())?;
    conn.until_response().await.map_err(|e| e.to_string())?;
    let took = us(start.elapsed());
    let answered = wall_sod();
    let worker = children(server_pid);
    let (run, wait) = worker.first().map_or((0, 0), |&w| schedstat(w));
    conn.send(detach).await.map_err(|e| e.to_string())?;
    conn.until_response().await.map_err(|e| e.to_string())?;
    Ok((took, sent, answered, run as f64 / 1e3, wait as f64 / 1e3))
}

/// Item 3.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    // The fastest do-nothing invocation of the binary.
    let candidates: [&[&str]; 2] = [&["--version"], &["help"]];
    let mut best: (&[&str], f64) = (candidates[0], f64::MAX);
    for args in candidates {
        let samples = (0..15)
            .map(|_| spawn_nothing(&env.server_bin, args).map(|s| s.0))
            .collect::<Result<Vec<_>, _>>()?;
        let m = median(&samples);
        if m < best.1 {
            best = (args, m);
        }
    }
    let baseline_args = best.0;

    let sessions = env.fresh_dir("cold-sessions");
    let id = create_sessions(&sessions, 1, 1)?.remove(0);
    let server = Server::start(env, &sessions, &[])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let attach = v1_request(
        "a",
        Command::Attach {
            session_id: id.clone(),
        },
    );
    let detach = v1_request("d", Command::Detach { session_id: id });
    let n = env.pick(5, 20);
    let pair = runtime.block_on(async {
        let mut conn = RawConn::connect(&server.socket)
            .await
            .map_err(|e| e.to_string())?;
        conn.hello_v1().await.map_err(|e| e.to_string())?;
        let mut marks = Vec::new();
        let mut sched = (Vec::new(), Vec::new());
        let mut base_sched = (Vec::new(), Vec::new());
        let (_, sent, answered, _, _) = cold(&mut conn, server.pid, &attach, &detach).await?; // warm the page cache
        marks.push((sent, answered));
        let mut pair = Pair::default();
        for _ in 0..env.rounds {
            let mut a = Vec::new();
            let mut b = Vec::new();
            for _ in 0..n {
                let (took, run, wait) = spawn_nothing(&env.server_bin, baseline_args)?;
                a.push(took);
                base_sched.0.push(run);
                base_sched.1.push(wait);
                let (took, sent, answered, run, wait) =
                    cold(&mut conn, server.pid, &attach, &detach).await?;
                b.push(took);
                marks.push((sent, answered));
                sched.0.push(run);
                sched.1.push(wait);
            }
            pair.round(a, b);
        }
        Ok::<_, String>((pair, marks, sched, base_sched))
    })?;
    let (pair, marks, sched, base_sched) = pair;
    // Phases, from the server's log: "worker spawned" (spawn returned, the
    // worker process exists) and the worker's "session open" (store and
    // runtime open; "ready" goes out right after).
    let log = server.log_text();
    let times = |what: &str| -> Vec<f64> {
        log.lines()
            .filter(|l| l.contains(what))
            .filter_map(log_time)
            .collect()
    };
    let (spawned, opened) = (times("worker spawned"), times("session open"));
    let mut phases = [Vec::new(), Vec::new(), Vec::new()];
    if spawned.len() == marks.len() && opened.len() == marks.len() {
        for (i, (sent, answered)) in marks.iter().enumerate().skip(1) {
            phases[0].push((spawned[i] - sent) * 1e6);
            phases[1].push((opened[i] - spawned[i]) * 1e6);
            phases[2].push((answered - opened[i]) * 1e6);
        }
    }
    let breakdown = if phases[0].is_empty() {
        "phases n/a (log lines did not line up)".to_string()
    } else {
        format!(
            "phases (medians, from the server log): spawn {} → worker start, connect, open store and runtime {} → ready and response {}",
            fmt_us(median(&phases[0])),
            fmt_us(median(&phases[1])),
            fmt_us(median(&phases[2]))
        )
    };
    let breakdown = format!(
        "{breakdown}; the worker until then: {} on a CPU, {} waiting for one (the do-nothing process: {} on a CPU, {} waiting) → CPU ratio {:.2}×",
        fmt_us(median(&sched.0)),
        fmt_us(median(&sched.1)),
        fmt_us(median(&base_sched.0)),
        fmt_us(median(&base_sched.1)),
        median(&sched.0) / median(&base_sched.0)
    );
    let ratio = pair.ratio();
    report.push(
        "3",
        format!(
            "worker cold start: attach a stored idle session until its snapshot vs `pi-server {}`",
            baseline_args.join(" ")
        ),
        format!(
            "attach {} / spawn {} → **{ratio:.2}×** ({}); {breakdown}",
            Pair::describe(&pair.b),
            Pair::describe(&pair.a),
            pair.spread()
        ),
        "≤ 3×",
        Some(ratio <= 3.0),
    );
    Ok(())
}
