//! Throughput of the simulator (not a test): `cargo run -p sim --release --bin sim-bench [-- --seeds N]`.
//!
//! Reports, on this machine and build:
//! - the swarm: seeds per second, kernel steps and driver steps per second
//!   (default options: 1,000 kernel steps per seed, every checker on);
//! - one long run (100,000 kernel steps, longer transcripts);
//! - the model checker: states and transitions per second on configuration (a).

use sim::options::{Overrides, SwarmOptions};
use sim::swarm;
use std::time::Instant;

fn main() {
    let mut seeds = 1000u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--seeds" {
            seeds = args.next().and_then(|s| s.parse().ok()).expect("--seeds N");
        }
    }
    bench_swarm(seeds);
    bench_long_run();
    bench_model();
}

fn bench_swarm(seeds: u64) {
    let started = Instant::now();
    let (mut kernel, mut driver, mut failed) = (0u64, 0u64, 0u64);
    for seed in 1..=seeds {
        let (report, _) = swarm::run(SwarmOptions::from_seed(seed, &Overrides::default()), false);
        kernel += report.stats.kernel_steps;
        driver += report.stats.safety_steps + report.stats.liveness_steps;
        failed += u64::from(report.result.is_err());
    }
    let s = started.elapsed().as_secs_f64();
    println!(
        "swarm: {seeds} seeds in {s:.2}s = {:.1} seeds/s, {:.0} kernel steps/s, {:.0} driver steps/s ({failed} failed)",
        seeds as f64 / s,
        kernel as f64 / s,
        driver as f64 / s
    );
}

fn bench_long_run() {
    let overrides = Overrides {
        steps: Some(100_000),
        ..Overrides::default()
    };
    let started = Instant::now();
    let (report, _) = swarm::run(SwarmOptions::from_seed(7, &overrides), false);
    let s = started.elapsed().as_secs_f64();
    println!(
        "long run (seed 7, 100,000 kernel steps): {s:.2}s = {:.0} kernel steps/s ({})",
        report.stats.kernel_steps as f64 / s,
        if report.result.is_ok() {
            "passed"
        } else {
            "FAILED"
        }
    );
}

fn bench_model() {
    let config = sim::model::two_clients_one_session();
    match sim::model::explore(&config) {
        Ok(stats) => {
            let s = stats.elapsed.as_secs_f64();
            println!(
                "model {}: {stats} = {:.0} states/s, {:.0} transitions/s",
                config.name,
                stats.states as f64 / s,
                stats.transitions as f64 / s
            );
        }
        Err(found) => println!("model {}: {}", config.name, found.message),
    }
}
