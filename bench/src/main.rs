//! `bench`: pi-server's benchmarks (issue 7), written up in `BENCHMARKS.md`.
//!
//! ```sh
//! cargo run --release -p bench -- <which|all>
//! ```
//!
//! `which` is one of `rtt` (1), `fanout` (2), `coldstart` (3), `commit` (4),
//! `scale` (5), `node` (6), `kernel` (7), `encode` (the cost of the encoder's
//! schema check), `tui` (the terminal UI's delta → screen and keystroke →
//! echo latency in a pty), `acp` (the ACP adapter against pi v1, and a
//! 500-item `session/load`), `web` (the web listener's WebSocket against the Unix
//! socket: `list` round trips and a 100-client fan-out), `caching` (Anthropic
//! prompt caching against a mock that honours `cache_control`), `soak`
//! (10,000 turns, 100 reconnects, 50 sessions created and removed: RSS over
//! time, store size, idle CPU), `peers` (the same scripted turns on
//! pi-server, `codex app-server` and `opencode serve`, all streaming from one
//! mock model server), `v8` (protocol v8 beside v1: round trips, a turn's
//! bytes and first text at turn 10 and turn 1,000, fan-out to 100
//! transcript subscribers, and the TypeScript pi-server on the same work),
//! `mcp` (a prompt's first model request with three stdio MCP servers
//! against none, and the worker's memory with them), or `all`. Each pair is measured in the same run,
//! alternating A, B, A, B, … (`BENCH_ROUNDS`, default 7), and reported as
//! medians and a ratio. `BENCH_QUICK=1` shrinks every size (for profiling).
//! `PI_SERVER_BIN` selects the binary under test (default: this target
//! directory's `release/pi-server`, built first). For profiling:
//! `BENCH_PERF=1` (or `flat`) attaches `perf record` to every server started
//! (data in `<target>/bench-perf/`), `BENCH_FANOUT_K=100` runs one audience
//! size, `BENCH_RTT=attach` only the attach/detach round trips, and
//! `BENCH_KEEP=1` keeps the scratch directory (server logs).
//!
//! Nothing here asserts a time: the targets are reported as met or missed.

mod acp;
mod caching;
mod checkpoint;
mod coldstart;
mod commit;
mod echo;
mod encode;
mod fanout;
mod kernel_bench;
mod killloop;
mod mcp;
mod mockllm;
mod node;
mod peers;
mod raw;
mod rtt;
mod scale;
mod server;
mod soak;
mod tui;
mod util;
mod v8;
mod web;

use std::process::ExitCode;
use util::{Env, Report};

/// Every benchmark, in issue order.
const ALL: &[&str] = &[
    "rtt",
    "fanout",
    "coldstart",
    "commit",
    "scale",
    "node",
    "kernel",
    "encode",
    "tui",
    "acp",
    "killloop",
    "checkpoint",
    "web",
    "caching",
    "soak",
    "peers",
    "v8",
    "mcp",
];

fn main() -> ExitCode {
    let which: Vec<String> = std::env::args().skip(1).collect();
    if which.first().map(String::as_str) == Some(echo::SUBCOMMAND) {
        return match echo::serve_main(&which[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench {}: {e}", echo::SUBCOMMAND);
                ExitCode::FAILURE
            }
        };
    }
    let which: Vec<&str> = match which.iter().map(String::as_str).collect::<Vec<_>>() {
        v if v.is_empty() || v.contains(&"all") => ALL.to_vec(),
        v => v,
    };
    if let Some(bad) = which.iter().find(|w| !ALL.contains(w)) {
        eprintln!(
            "bench: unknown benchmark {bad:?}; one of: {} or all",
            ALL.join(", ")
        );
        return ExitCode::FAILURE;
    }
    let env = match Env::discover() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("machine: {}", util::machine());
    println!("tree: {}", util::git_head(&env.workspace));
    println!(
        "binary: {}; rounds: {}{}",
        env.server_bin.display(),
        env.rounds,
        if env.quick { " (quick)" } else { "" }
    );
    let mut report = Report::default();
    let mut failed = false;
    for name in which {
        println!("== {name} (load average {})", util::loadavg());
        let started = std::time::Instant::now();
        let result = match name {
            "rtt" => rtt::run(&env, &mut report),
            "fanout" => fanout::run(&env, &mut report),
            "coldstart" => coldstart::run(&env, &mut report),
            "commit" => commit::run(&env, &mut report),
            "scale" => scale::run(&env, &mut report),
            "node" => node::run(&env, &mut report),
            "kernel" => kernel_bench::run(&env, &mut report),
            "encode" => encode::run(&env, &mut report),
            "tui" => tui::run(&env, &mut report),
            "acp" => acp::run(&env, &mut report),
            "killloop" => killloop::run(&env, &mut report),
            "checkpoint" => checkpoint::run(&env, &mut report),
            "web" => web::run(&env, &mut report),
            "caching" => caching::run(&env, &mut report),
            "soak" => soak::run(&env, &mut report),
            "peers" => peers::run(&env, &mut report),
            "v8" => v8::run(&env, &mut report),
            "mcp" => mcp::run(&env, &mut report),
            _ => unreachable!("checked above"),
        };
        if let Err(e) = result {
            failed = true;
            eprintln!("bench: {name} failed: {e}");
            report.info("!", format!("{name} failed"), e);
        }
        println!("   ({:.1} s)", started.elapsed().as_secs_f64());
    }
    println!("\n{}", report.markdown());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
