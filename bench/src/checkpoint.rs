//! What streaming checkpoints cost (issue #15, item 3): the worker's CPU per
//! streamed delta with the default checkpoint (every 250 ms or 4 KiB of a
//! streaming reply) against checkpoints off (`PI_WORKER_CHECKPOINT_MS` a
//! day), two servers side by side, turns alternating between them.
//!
//! The side-by-side difference is as noisy as the machine (a few per cent
//! either way on 2 shared cores), so the bench also measures the cost
//! directly: the same store write a checkpoint makes (the streaming reply so
//! far, cloned and upserted), timed in this process at each size a turn
//! checkpoints, summed over the turn's checkpoints, against the worker CPU of
//! a turn with checkpoints off.
//!
//! Target: checkpoints cost under 5 % of a turn's worker CPU.

use crate::server::{Server, create_sessions};
use crate::util::{Env, Report, median};
use kernel::limits::Checkpoint;
use kernel::protocol::{
    AssistantStatus, Content, DeltaKind, ServerEvent, TranscriptItem, TranscriptProgress,
};
use kernel::runtime::Persist;
use pi_store::SessionStore;
use std::time::Instant;

/// One server of the pair, and what its turns measured.
struct Side {
    name: &'static str,
    dir: std::path::PathBuf,
    id: String,
    _server: Server,
    runtime: tokio::runtime::Runtime,
    client: pi_client::Client,
    cpu_per_delta_us: Vec<f64>,
    cpu_per_turn_us: Vec<f64>,
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
            cpu_per_turn_us: Vec::new(),
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
            let pid = pi_store::live_holder(dir, id)
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
            side.cpu_per_turn_us.push(cpu_us);
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
    report.info(
        "checkpoint",
        "side by side: on − off, as a share of on (noisy)",
        format!("{share:.1} %"),
    );
    let off = &sides[1];
    let reply = off
        .client
        .session_snapshot(&off.id)
        .and_then(|s| {
            s.transcript.into_iter().rev().find_map(|item| match item {
                TranscriptItem::Assistant(a) => Some(a),
                _ => None,
            })
        })
        .ok_or("off: no assistant reply in the snapshot")?;
    let direct = direct_cost(env, &reply, median(&off.turn_secs))?;
    let turn_cpu_us = median(&off.cpu_per_turn_us);
    let direct_share = direct.total_us / turn_cpu_us * 100.0;
    report.info(
        "checkpoint",
        "one checkpoint's store write, median (reply so far cloned and upserted)",
        format!(
            "{:.0} µs at {} B … {:.0} µs at {} B",
            direct.first.1, direct.first.0, direct.last.1, direct.last.0
        ),
    );
    report.push(
        "checkpoint",
        "share of the turn's worker CPU spent on checkpoints (direct)",
        format!(
            "{direct_share:.2} % ({} × {:.0} µs of {:.0} µs)",
            direct.count,
            direct.total_us / direct.count as f64,
            turn_cpu_us
        ),
        "< 5 %",
        Some(direct_share < 5.0),
    );
    Ok(())
}

/// What the checkpoints of one turn cost when done directly.
struct Direct {
    count: usize,
    total_us: f64,
    /// (bytes, µs) of the first and the last checkpoint.
    first: (usize, f64),
    last: (usize, f64),
}

/// Times the checkpoints a turn streaming `reply` over `turn_secs` makes:
/// one each time the unsaved text reaches the byte bound or the interval
/// passes, whichever comes first (the runtime's rule), each writing the
/// reply as far as it was streamed, in a fresh session of its own.
fn direct_cost(
    env: &Env,
    reply: &kernel::protocol::AssistantItem,
    turn_secs: f64,
) -> Result<Direct, String> {
    let text: String = reply
        .content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let bound = Checkpoint::default();
    let rate = text.len() as f64 / turn_secs;
    let every = (bound.bytes as f64).min(rate * bound.interval.as_secs_f64());
    let count = ((text.len() as f64 / every).floor() as usize).max(1);
    let dir = env.fresh_dir("checkpoint-direct");
    let id = create_sessions(&dir, 1, 1)?.remove(0);
    let (mut store, _) = SessionStore::open(&dir, &id).map_err(|e| e.to_string())?;
    let mut streaming = reply.clone();
    streaming.status = AssistantStatus::Streaming;
    streaming.usage = None;
    let repeats = env.pick(20, 100);
    let mut costs = Vec::with_capacity(count);
    for i in 1..=count {
        let mut len = (i as f64 * every) as usize;
        while !text.is_char_boundary(len) {
            len -= 1;
        }
        streaming.content = vec![Content::Text {
            text: text[..len].to_string(),
        }];
        let mut samples = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let started = Instant::now();
            let item = TranscriptItem::Assistant(streaming.clone());
            store
                .apply(&[Persist::Item(item)])
                .map_err(|e| e.to_string())?;
            samples.push(crate::util::us(started.elapsed()));
        }
        costs.push((len, median(&samples)));
    }
    store.close().map_err(|e| e.to_string())?;
    Ok(Direct {
        count,
        total_us: costs.iter().map(|(_, us)| us).sum(),
        first: costs[0],
        last: costs[count - 1],
    })
}
