//! The simulator's command line.
//!
//! ```text
//! cargo run -p sim -- --seed S [--trace]           replay one run exactly
//! cargo run -p sim -- --seeds N [--from S]         a swarm of N seeds
//! cargo run --release -p sim -- --model [large|KEY] model-check the configurations
//! cargo run --release -p sim -- --replay KEY 'PATH' replay a model path, with its trace
//! cargo run --release -p sim -- --lease N [--from S] [--trace] the lease swarm (client machines)
//! knobs: --steps N  --clients N  --v8 N  --faults kind,kind  --no-faults
//! SIM_THREADS=n: the model checker's threads (default: one per CPU)
//! ```
//!
//! Exit codes: 0 passed, 127 crash, 128 liveness, 129 correctness, 2 usage.

use sim::options::{FaultKind, Overrides, SwarmOptions, parse_seed};
use sim::swarm::{self, Report};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: sim [--seed S [--trace] | --seeds N [--from S] | --model [large|KEY] \
| --replay KEY PATH | --lease N [--from S]] \
[--steps N] [--clients N] [--v8 N] [--faults kind,kind | --no-faults]
(--v8 N: the first N client slots speak protocol v8)
(SIM_THREADS=n: the model checker's threads; one per CPU by default)";

#[derive(Debug, Default)]
struct Args {
    seed: Option<u64>,
    seeds: Option<u64>,
    from: Option<u64>,
    trace: bool,
    model: Option<Option<String>>,
    replay: Option<(String, String)>,
    lease: Option<u64>,
    overrides: Overrides,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--seed" => args.seed = Some(parse_seed(&value()?)?),
            "--seeds" => args.seeds = Some(value()?.parse().map_err(|e| format!("--seeds: {e}"))?),
            "--from" => args.from = Some(parse_seed(&value()?)?),
            "--steps" => {
                args.overrides.steps = Some(value()?.parse().map_err(|e| format!("--steps: {e}"))?)
            }
            "--clients" => {
                let n = value()?.parse().map_err(|e| format!("--clients: {e}"))?;
                args.overrides.clients = Some(n);
            }
            "--v8" => {
                let n = value()?.parse().map_err(|e| format!("--v8: {e}"))?;
                args.overrides.v8 = Some(n);
            }
            "--faults" => args.overrides.faults = Some(parse_faults(&value()?)?),
            "--no-faults" => args.overrides.faults = Some(Vec::new()),
            "--trace" => args.trace = true,
            "--model" => args.model = Some(None),
            "--lease" => args.lease = Some(value()?.parse().map_err(|e| format!("--lease: {e}"))?),
            "--replay" => {
                let key = value()?;
                let path = it
                    .next()
                    .ok_or("--replay needs a configuration key and a path")?;
                args.replay = Some((key, path));
            }
            key if matches!(args.model, Some(None)) && !key.starts_with('-') => {
                args.model = Some(Some(key.to_string()))
            }
            "--help" | "-h" => return Err(help()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn parse_faults(list: &str) -> Result<Vec<FaultKind>, String> {
    let names = list.split(',').filter(|s| !s.is_empty());
    names
        .map(|n| FaultKind::parse(n).ok_or_else(|| format!("unknown fault {n}\n{}", help())))
        .collect()
}

fn help() -> String {
    let mut out = format!("{USAGE}\n\nfaults:\n");
    for kind in FaultKind::ALL {
        out.push_str(&format!("  {:<16} {}\n", kind.name(), kind.describe()));
    }
    out
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if let Some((key, path)) = &args.replay {
        return replay_model(key, path);
    }
    if let Some(which) = &args.model {
        return run_model(which.as_deref());
    }
    if let Some(count) = args.lease {
        return run_lease(args.from.unwrap_or(1), count, args.trace);
    }
    match args.seeds {
        Some(count) => run_swarm(&args, count),
        None => run_one(&args),
    }
}

fn run_model(which: Option<&str>) -> ExitCode {
    let configs = match which {
        None => sim::model::configs(false),
        Some("large") => sim::model::configs(true),
        Some(key) => match sim::model::config_named(key) {
            Some(config) => vec![config],
            None => {
                let keys: Vec<&str> = sim::model::configs(true)
                    .iter()
                    .map(sim::model::key)
                    .collect();
                eprintln!(
                    "no model configuration {key} (there are {})",
                    keys.join(", ")
                );
                return ExitCode::from(2);
            }
        },
    };
    for config in configs {
        let name = sim::model::key(&config);
        let mut progress = |stats: &sim::model::Stats| {
            let rate = stats.states as f64 / stats.elapsed.as_secs_f64().max(1e-9);
            let (states, seconds) = (stats.states, stats.elapsed.as_secs_f64());
            eprintln!("({name}) {states} states in {seconds:.1}s ({rate:.0} states/s)");
        };
        match sim::model::explore_with(&config, &mut progress) {
            Ok(stats) => println!("{}: {stats}", config.name),
            Err(found) => {
                let path = sim::model::path_text(&found.path);
                println!(
                    "{}: {}\nshortest path ({} actions): {path}\nreplay: cargo run --release -p sim -- --replay {} '{path}'\n{}",
                    config.name,
                    found.message,
                    found.path.len(),
                    sim::model::key(&config),
                    found.trace
                );
                return ExitCode::from(129);
            }
        }
    }
    ExitCode::SUCCESS
}

/// The lease swarm of `sim/tests/lease_swarm.rs` over any range of seeds.
fn run_lease(from: u64, count: u64, trace: bool) -> ExitCode {
    const STEPS: u64 = 3000;
    let started = Instant::now();
    let mut totals = sim::machines::MachineStats::default();
    for seed in from..from + count {
        let mut lines = Vec::new();
        let result = sim::machines::run_traced(seed, STEPS, trace.then_some(&mut lines));
        for line in &lines {
            println!("{line}");
        }
        match result {
            Ok(report) => totals.add(&report.totals),
            Err(e) => {
                println!("FAILED lease seed={seed}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{count} lease seeds from {from} in {seconds:.2}s: {:.1} seeds/s",
        count as f64 / seconds.max(1e-9)
    );
    println!(
        "calls {}: ok {}, failed {}, disconnected {}; reconnects {}, prompts done {}, \
         stale snapshots replayed {}, readers fallen behind {}, reconnections lost again {}, \
         lines typed {}",
        totals.calls,
        totals.ok,
        totals.failed,
        totals.disconnected,
        totals.reconnects,
        totals.prompts_done,
        totals.replays,
        totals.lags,
        totals.flakes,
        totals.typed
    );
    for (kind, n) in &totals.errors {
        println!("  {kind}: {n}");
    }
    ExitCode::SUCCESS
}

fn replay_model(key: &str, path: &str) -> ExitCode {
    let Some(config) = sim::model::config_named(key) else {
        eprintln!("no model configuration {key}");
        return ExitCode::from(2);
    };
    let path = match sim::model::parse_path(path) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let (model, verdict) = sim::model::replay(&config, &path, true);
    print!("{}", model.world.trace_text());
    match verdict {
        Ok(()) => {
            println!("{}: the path breaks nothing", config.name);
            ExitCode::SUCCESS
        }
        Err(message) => {
            println!("{}: {message}", config.name);
            ExitCode::from(129)
        }
    }
}

fn random_seed() -> u64 {
    // The only entropy in the simulator: choosing a seed when none is given.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    nanos.map_or(1, |d| d.as_nanos() as u64)
}

fn run_one(args: &Args) -> ExitCode {
    let seed = args.seed.unwrap_or_else(random_seed);
    let options = SwarmOptions::from_seed(seed, &args.overrides);
    print!("{}", options.describe());
    let started = Instant::now();
    let (report, swarm) = swarm::run(options, args.trace);
    if args.trace {
        print!("{}", swarm.world.trace_text());
    }
    print_stats(&report, started.elapsed().as_secs_f64());
    finish(&report)
}

fn print_stats(report: &Report, seconds: f64) {
    let s = &report.stats;
    println!(
        "steps: safety={} liveness={} kernel={} | requests={} responses={} connections={} | virtual={}ms",
        s.safety_steps,
        s.liveness_steps,
        s.kernel_steps,
        s.requests,
        s.responses,
        s.connections,
        s.virtual_ms
    );
    let faults: Vec<String> = s.faults.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!("faults injected: {}", faults.join(" "));
    if s.v8_updates > 0 {
        println!(
            "v8: {} updates judged, {} replicas compared with the kernel",
            s.v8_updates, s.v8_comparisons
        );
    }
    println!(
        "trace_hash={:#018x} state_hash={:#018x} wall={:.3}s",
        report.trace_hash, report.state_hash, seconds
    );
}

fn finish(report: &Report) -> ExitCode {
    match &report.result {
        Ok(()) => {
            println!("PASSED seed={}", report.seed);
            ExitCode::SUCCESS
        }
        Err(failure) => {
            println!("FAILED seed={}: {failure}", report.seed);
            println!(
                "reproduce with: cargo run -p sim -- --seed {} --trace",
                report.seed
            );
            ExitCode::from(failure.class.exit_code() as u8)
        }
    }
}

fn run_swarm(args: &Args, count: u64) -> ExitCode {
    let from = args.from.or(args.seed).unwrap_or_else(random_seed);
    println!("swarm: {count} seeds from {from}");
    let started = Instant::now();
    let mut kernel_steps = 0;
    let mut failed: Option<Report> = None;
    for seed in from..from.saturating_add(count) {
        let options = SwarmOptions::from_seed(seed, &args.overrides);
        let (report, _) = swarm::run(options, false);
        kernel_steps += report.stats.kernel_steps;
        if let Err(failure) = &report.result {
            println!("FAILED seed={seed}: {failure}");
            failed.get_or_insert(report);
        }
        let done = seed - from + 1;
        if done.is_multiple_of(10_000) {
            let seconds = started.elapsed().as_secs_f64();
            println!("... {done} seeds in {seconds:.0}s");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{count} seeds in {seconds:.2}s: {:.1} seeds/s, {:.0} kernel steps/s",
        count as f64 / seconds,
        kernel_steps as f64 / seconds
    );
    match failed {
        None => ExitCode::SUCCESS,
        Some(report) => finish(&report),
    }
}
