//! Item 5: scale — 10,000 stored sessions (catalog load and `list`), and
//! 1,000 idle connections (server memory, and the `list` latency of one
//! active client among them against none).

use crate::raw::{RawConn, v1_request};
use crate::rtt::{Pair, cycles, versus_echo};
use crate::server::{Server, create_sessions};
use crate::util::{Env, Report, fd_count, fmt_us, log_time, median, raise_nofile, rss_kib, us};
use kernel::protocol::{Command, ServerMessage};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cached directory of `n` stored sessions (made once with the store).
fn stored(env: &Env, n: usize) -> Result<PathBuf, String> {
    let dir = env
        .target_dir
        .join("bench-data")
        .join(format!("sessions-{n}"));
    let marker = dir.join(".complete");
    if marker.exists() {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "  creating {n} stored sessions in {} (once) ...",
        dir.display()
    );
    let start = Instant::now();
    create_sessions(&dir, n, 2)?;
    std::fs::write(&marker, b"").map_err(|e| e.to_string())?;
    println!("  ... {:.1} s", start.elapsed().as_secs_f64());
    Ok(dir)
}

/// Spawn → first hello (µs), and the server's own "serving" → "catalog
/// loaded" interval from its log (µs).
async fn boot(env: &Env, session_dir: &Path) -> Result<(f64, Option<f64>, usize), String> {
    let mut server = Server::spawn(env, session_dir, &[])?;
    server.wait_bound(Duration::from_secs(60))?;
    let mut conn = RawConn::connect(&server.socket)
        .await
        .map_err(|e| e.to_string())?;
    let hello = conn.hello_v1().await.map_err(|e| e.to_string())?;
    let took = us(server.spawned.elapsed());
    let count = match hello {
        ServerMessage::Hello(h) => h.snapshot.sessions.len(),
        other => return Err(format!("expected hello, got {other:?}")),
    };
    drop(conn);
    server.stop();
    let log = server.log_text();
    let serving = log
        .lines()
        .find(|l| l.contains("serving"))
        .and_then(log_time);
    let loaded = log
        .lines()
        .find(|l| l.contains("session catalog loaded"))
        .and_then(log_time);
    let scan = match (serving, loaded) {
        (Some(a), Some(b)) => Some((b - a) * 1e6),
        _ => None,
    };
    Ok((took, scan, count))
}

/// Item 5.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let n = env.pick(1000, 10_000);
    let big = stored(env, n)?;
    let empty = env.fresh_dir("empty-sessions");

    runtime.block_on(async {
        // Catalog load: boot with an empty session directory vs with n sessions.
        let mut pair = Pair::default();
        let mut scans = Vec::new();
        let mut listed = 0;
        for _ in 0..env.rounds.min(5) {
            let (a, _, _) = boot(env, &empty).await?;
            let (b, scan, count) = boot(env, &big).await?;
            scans.extend(scan);
            listed = count;
            pair.round(vec![a], vec![b]);
        }
        report.info(
            "5",
            format!("server start to first hello, {n} stored sessions vs none ({listed} listed in the hello)"),
            format!(
                "{} vs {} (+{}); catalog scan in the server (log: serving → catalog loaded) {}",
                fmt_us(median(&pair.b)),
                fmt_us(median(&pair.a)),
                fmt_us(median(&pair.b) - median(&pair.a)),
                if scans.is_empty() { "n/a".into() } else { fmt_us(median(&scans)) }
            ),
        );

        // list with n sessions, against an echo of the same (large) frames.
        let server = Server::start(env, &big, &[])?;
        let mut conn = RawConn::connect(&server.socket)
            .await
            .map_err(|e| e.to_string())?;
        conn.hello_v1().await.map_err(|e| e.to_string())?;
        let list = vec![v1_request("l", Command::List)];
        let (pair, _, reply) = versus_echo(env, &mut conn, server.pid, &list, env.pick(5, 20), None).await?;
        let ratio = pair.ratio();
        report.push(
            "5",
            format!("`list` round trip with {n} stored sessions (reply {:.1} MB), ours vs raw echo", reply[0].0 as f64 / 1e6),
            format!(
                "ours {} / echo {} → **{ratio:.2}×** ({}){}",
                Pair::describe(&pair.b),
                Pair::describe(&pair.a),
                pair.spread(),
                pair.server_time()
            ),
            "≤ 1.5× (item 1's target)",
            Some(ratio <= 1.5),
        );
        drop(conn);
        drop(server);
        Ok::<(), String>(())
    })?;

    // 1,000 idle connections.
    let idle_n = env.pick(200, 1000);
    let (soft, hard) = raise_nofile(4 * idle_n as u64 + 256);
    println!("  open files limit: soft {soft}, hard {hard}");
    let server = Server::start(env, &empty, &[])?;
    runtime.block_on(async {
        let mut active = RawConn::connect(&server.socket)
            .await
            .map_err(|e| e.to_string())?;
        active.hello_v1().await.map_err(|e| e.to_string())?;
        let list = vec![v1_request("l", Command::List)];
        let per_round = env.pick(300, 2000);
        cycles(&mut active, &list, per_round / 4).await.map_err(|e| e.to_string())?;
        let mut pair = Pair::default();
        let mut per_conn = Vec::new();
        let mut rss_idle = 0;
        let mut settle = Vec::new();
        for _ in 0..env.rounds.clamp(2, 3) {
            let a = cycles(&mut active, &list, per_round).await.map_err(|e| e.to_string())?;
            let fds0 = fd_count(server.pid);
            tokio::time::sleep(Duration::from_millis(200)).await;
            let rss0 = rss_kib(server.pid).unwrap_or(0);
            let mut tasks = Vec::with_capacity(idle_n);
            for _ in 0..idle_n {
                let mut conn = RawConn::connect(&server.socket)
                    .await
                    .map_err(|e| e.to_string())?;
                conn.hello_v1().await.map_err(|e| e.to_string())?;
                tasks.push(tokio::spawn(async move {
                    while conn.fill().await.is_ok() {
                        conn.drain(|_| {});
                    }
                }));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let rss1 = rss_kib(server.pid).unwrap_or(0);
            rss_idle = rss1;
            per_conn.push((rss1 as f64 - rss0 as f64) / idle_n as f64);
            let b = cycles(&mut active, &list, per_round).await.map_err(|e| e.to_string())?;
            pair.round(a, b);
            let closing = Instant::now();
            for task in tasks {
                task.abort();
            }
            tokio::task::yield_now().await;
            while fd_count(server.pid) > fds0 && closing.elapsed() < Duration::from_secs(60) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            settle.push(us(closing.elapsed()));
            // Read the server snapshots the disconnects broadcast.
            crate::rtt::collect_quiet(&mut active, Duration::from_millis(100)).await;
        }
        let ratio = pair.ratio();
        report.info(
            "5",
            format!("{idle_n} idle connections (hello done, nothing attached): server memory"),
            format!(
                "RSS {:.1} MiB with them, **{:+.1} KiB per idle connection** (first round; later rounds reuse freed memory: {:+.1} KiB); closing them all: {} until the server released them",
                rss_idle as f64 / 1024.0,
                per_conn[0],
                median(&per_conn[1..]),
                fmt_us(median(&settle))
            ),
        );
        report.info(
            "5",
            format!("`list` latency of one active client among {idle_n} idle connections vs none"),
            format!(
                "with idle {} / none {} → {ratio:.2}× ({})",
                Pair::describe(&pair.b),
                Pair::describe(&pair.a),
                pair.spread()
            ),
        );
        Ok::<(), String>(())
    })?;
    drop(server);
    Ok(())
}
