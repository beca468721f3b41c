//! Item 7: kernel and simulator throughput, from their own benchmarks.

use crate::util::{Env, Report};
use std::process::Command;

/// Runs `cargo <args>` in the workspace with this target directory; stdout.
fn cargo(env: &Env, args: &[&str]) -> Result<String, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .env("CARGO_TARGET_DIR", &env.target_dir)
        .current_dir(&env.workspace)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Item 7.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let out = cargo(env, &["bench", "-p", "kernel", "--bench", "steps"])?;
    print!("{out}");
    let line = out
        .lines()
        .find(|l| l.contains("steps/s"))
        .unwrap_or("no steps/s line in the output")
        .trim()
        .to_string();
    report.info(
        "7",
        "kernel steps (`cargo bench -p kernel --bench steps`, one core, mixed workload)",
        line,
    );
    // The same rounds on a catalog that does not grow (`steady`).
    let lines: Vec<&str> = out.lines().collect();
    for (i, head) in lines.iter().enumerate() {
        if let Some(at) = head.find("steady catalog of ") {
            let sessions = head[at + "steady catalog of ".len()..]
                .split_whitespace()
                .next()
                .unwrap_or("?");
            let figure = lines
                .get(i + 1)
                .map_or("no steps/s line", |l| l.trim())
                .to_string();
            report.info(
                "7",
                format!(
                    "kernel steps, mixed workload on a steady catalog of {sessions} stored \
                     sessions (each round removes its session)"
                ),
                figure,
            );
        }
    }

    // The simulator's benchmark, if it exists yet.
    let sim_bin = env.workspace.join("sim/src/bin/sim-bench.rs");
    let sim_bench = env.workspace.join("sim/benches");
    if sim_bin.is_file() {
        let out = cargo(
            env,
            &["run", "--release", "-p", "sim", "--bin", "sim-bench"],
        )?;
        print!("{out}");
        for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
            report.info(
                "7",
                "simulator throughput (`cargo run --release -p sim --bin sim-bench`)",
                line.to_string(),
            );
        }
    } else if sim_bench.is_dir() {
        let out = cargo(env, &["bench", "-p", "sim"])?;
        print!("{out}");
        let last = out
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        report.info(
            "7",
            "simulator throughput (`cargo bench -p sim`)",
            last.trim().to_string(),
        );
    } else {
        report.info(
            "7",
            "simulator throughput",
            "pending: `sim-bench` does not exist yet (being built separately)".into(),
        );
    }
    Ok(())
}
