//! What streaming checkpoints cost (issue #15, item 3): the worker's CPU per
//! streamed delta with the default checkpoint (every 250 ms or 4 KiB of a
//! streaming reply) against checkpoints off (`PI_WORKER_CHECKPOINT_MS` a
//! day), two servers side by side, turns alternating between them.
//!
//! Target: checkpoints cost under 5 % of a turn's worker CPU.

use crate::server::{Server, create_sessions};
use crate::util::{Env, Report, median};
use kernel::protocol::{DeltaKind, ServerEvent, TranscriptProgress};
use std::time::Instant;

/// One server of the pair, and what its turns measured.
struct Side {
    name: &'static str,
    dir: std::path::PathBuf,
    id: String,
    _server: Server,
    runtime: tokio::runtime::Runtime,
    client: pi_io::client::Client,
    cpu_per_delta_us: Vec<f64>,
    turn_secs: Vec<f64>,
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let turns = env.pick(4, 12);
    let words = 1500;
    let mut sides = Vec::new();
    for (name, checkpoint) in [("default", None), ("off", Some("86400000"))] {
        let dir = env.fresh_dir(&format!("checkpoint-{name}"));
        let id = create_sessions(&dir, 1, 1)?.remove(0);
        let mut vars = vec![("PI_FAUX_DELAY_MS", "1".to_string())];
        if let Some(ms) = checkpoint {
            vars.push(("PI_WORKER_CHECKPOINT_MS", ms.to_string()));
        }
        let server = Server::start(env, &dir, &vars)?;
        let (runtime, client) = server.client(name)?;
        runtime
            .block_on(client.attach(&id))
            .map_err(|e| format!("{name} attach: {e}"))?;
        sides.push(Side {
            name,
            dir,
            id,
            _server: server,
            runtime,
            client,
            cpu_per_delta_us: Vec::new(),
            turn_secs: Vec::new(),
        });
    }
    let text = (0..words)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    for _ in 0..turns {
        for side in &mut sides {
            let Side {
                name,
                dir,
                id,
                runtime,
                client,
                ..
            } = side;
            let pid = pi_io::store::live_holder(dir, id)
                .ok_or_else(|| format!("{name}: no worker"))?
                .pid;
            let mut events = client.events();
            let (run_before, _) = crate::util::schedstat(pid);
            let started = Instant::now();
            runtime
                .block_on(client.prompt(id, &text))
                .map_err(|e| format!("{name} prompt: {e}"))?;
            let elapsed = started.elapsed();
            let (run_after, _) = crate::util::schedstat(pid);
            let mut deltas = 0u64;
            while let Ok(event) = events.try_recv() {
                if matches!(
                    event,
                    ServerEvent::SessionProgress {
                        progress: TranscriptProgress::AssistantDelta {
                            kind: DeltaKind::Text,
                            ..
                        },
                        ..
                    }
                ) {
                    deltas += 1;
                }
            }
            if deltas == 0 {
                return Err(format!("{name}: no deltas streamed"));
            }
            let cpu_us = (run_after - run_before) as f64 / 1000.0;
            side.cpu_per_delta_us.push(cpu_us / deltas as f64);
            side.turn_secs.push(elapsed.as_secs_f64());
        }
    }
    let per_delta = |i: usize| median(&sides[i].cpu_per_delta_us);
    let (with, without) = (per_delta(0), per_delta(1));
    let share = (with - without) / with * 100.0;
    report.info(
        "checkpoint",
        format!("worker CPU per streamed delta, checkpoints on / off (median of {turns} turns)"),
        format!("{with:.1} µs / {without:.1} µs"),
    );
    let turn_secs = median(&sides[0].turn_secs);
    report.info(
        "checkpoint",
        "checkpoints per turn (about: turn time / 250 ms)",
        format!("{:.0} in {turn_secs:.2} s", (turn_secs / 0.25).floor()),
    );
    report.push(
        "checkpoint",
        "share of the turn's worker CPU spent on checkpoints",
        format!("{share:.1} %"),
        "< 5 %",
        Some(share < 5.0),
    );
    Ok(())
}
