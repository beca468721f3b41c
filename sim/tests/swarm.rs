//! The swarm: 2,000 seeds × 1,000 kernel steps, each with its own fault mix,
//! checked after every step and then for liveness.
//!
//! Method: seeds `FROM..FROM + 2000` (`FROM` = 1, or `SIM_SWARM_FROM`) are
//! split across four tests so that the test runner spreads them over the
//! cores. A failure names its class and the command that replays it.

use sim::options::{FaultKind, Overrides, SwarmOptions};
use sim::swarm;
use sim::world::Milestone;
use std::time::Instant;

const SEEDS: u64 = 2000;
const PARTS: u64 = 4;

fn part(index: u64) {
    let from: u64 = std::env::var("SIM_SWARM_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let per_part = SEEDS / PARTS;
    let first = from + index * per_part;
    let started = Instant::now();
    let mut kernel_steps = 0;
    let mut failures = Vec::new();
    for seed in first..first + per_part {
        let options = SwarmOptions::from_seed(seed, &Overrides::default());
        assert!(
            options.steps >= 1000,
            "each seed runs at least 1,000 kernel steps"
        );
        let (report, _) = swarm::run(options, false);
        kernel_steps += report.stats.kernel_steps;
        if let Err(failure) = report.result {
            failures.push(format!(
                "seed {seed}: {failure}\n  reproduce with: cargo run -p sim -- --seed {seed} --trace"
            ));
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "seeds {first}..{}: {per_part} seeds, {kernel_steps} kernel steps in {seconds:.1}s \
         ({:.0} seeds/s, {:.0} kernel steps/s)",
        first + per_part,
        per_part as f64 / seconds,
        kernel_steps as f64 / seconds
    );
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Seeds 1..501 (with the default `FROM`).
#[test]
fn swarm_part_1() {
    part(0);
}

/// Seeds 501..1001.
#[test]
fn swarm_part_2() {
    part(1);
}

/// Seeds 1001..1501.
#[test]
fn swarm_part_3() {
    part(2);
}

/// Seeds 1501..2001.
#[test]
fn swarm_part_4() {
    part(3);
}

/// Sessions with two MCP servers each, which start late, fail, never start
/// or die mid-call, beside worker crashes, server restarts and disconnects:
/// every rule holds, prompts wait for their servers and run, notices are
/// told, and MCP tools answer.
#[test]
fn mcp_servers_that_fail_hang_or_die_keep_every_rule() {
    let overrides = Overrides {
        faults: Some(vec![
            FaultKind::Mcp,
            FaultKind::WorkerCrash,
            FaultKind::ServerRestart,
            FaultKind::Disconnect,
        ]),
        ..Overrides::default()
    };
    let mut failures = Vec::new();
    let mut reached = sim::world::Reached::default();
    for seed in 1..=300 {
        let (report, swarm) = swarm::run(SwarmOptions::from_seed(seed, &overrides), false);
        reached = reached.union(swarm.world.reached);
        if let Err(failure) = report.result {
            failures.push(format!(
                "seed {seed}: {failure}\n  reproduce with: cargo run -p sim -- --seed {seed} \
                 --faults mcp,worker-crash,server-restart,disconnect --trace"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for milestone in [Milestone::McpNotice, Milestone::McpCalled] {
        assert!(reached.contains(milestone), "{milestone:?} never reached");
    }
}
