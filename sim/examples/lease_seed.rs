//! Replays one seed of the lease swarm with the world's trace:
//! `cargo run -p sim --example lease_seed -- SEED [STEPS]`.

fn main() {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let steps: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3000);
    let mut trace = Vec::new();
    let result = sim::machines::run_traced(seed, steps, Some(&mut trace));
    for line in &trace {
        println!("{line}");
    }
    match result {
        Ok(report) => println!("ok: {report:?}"),
        Err(e) => {
            println!("FAILED: {e}");
            std::process::exit(1);
        }
    }
}
