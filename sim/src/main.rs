//! The simulator's command line.
//!
//! ```text
//! cargo run -p sim -- --seed S [--trace]           replay one run exactly
//! cargo run -p sim -- --seeds N [--from S]         a swarm of N seeds
//! cargo run --release -p sim -- --model [large]    model-check the small configurations
//! knobs: --steps N  --clients N  --faults kind,kind  --no-faults
//! ```
//!
//! Exit codes: 0 passed, 127 crash, 128 liveness, 129 correctness, 2 usage.

use sim::options::{FaultKind, Overrides, SwarmOptions, parse_seed};
use sim::swarm::{self, Report};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: sim [--seed S [--trace] | --seeds N [--from S] | --model [large]] \
[--steps N] [--clients N] [--faults kind,kind | --no-faults]";

#[derive(Debug, Default)]
struct Args {
    seed: Option<u64>,
    seeds: Option<u64>,
    from: Option<u64>,
    trace: bool,
    model: Option<bool>,
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
            "--faults" => args.overrides.faults = Some(parse_faults(&value()?)?),
            "--no-faults" => args.overrides.faults = Some(Vec::new()),
            "--trace" => args.trace = true,
            "--model" => args.model = Some(false),
            "large" if args.model.is_some() => args.model = Some(true),
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
    if let Some(large) = args.model {
        return run_model(large);
    }
    match args.seeds {
        Some(count) => run_swarm(&args, count),
        None => run_one(&args),
    }
}

fn run_model(large: bool) -> ExitCode {
    let mut configs = vec![
        sim::model::two_clients_one_session(),
        sim::model::crash_and_restart(),
    ];
    if large {
        configs.push(sim::model::two_clients_one_session_large());
        configs.push(sim::model::crash_and_restart_large());
    }
    for config in configs {
        match sim::model::explore(&config) {
            Ok(stats) => println!("{}: {stats}", config.name),
            Err(found) => {
                println!(
                    "{}: {}\npath: {:?}\n{}",
                    config.name, found.message, found.path, found.trace
                );
                return ExitCode::from(129);
            }
        }
    }
    ExitCode::SUCCESS
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
