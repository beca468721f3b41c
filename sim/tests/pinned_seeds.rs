//! Pinned seeds: the whole trace of a few short swarm runs, as insta
//! snapshots in `snapshots/sim/`. A change in the kernel's behaviour (or in
//! the driver) shows up here as a readable diff, one line per transition.
//!
//! Method: each seed runs 150 kernel steps with its own fault mix; the
//! snapshot is the printed options followed by the trace.

use sim::options::{Overrides, SwarmOptions};
use sim::swarm;

fn pinned(seed: u64) {
    let overrides = Overrides {
        steps: Some(150),
        ..Overrides::default()
    };
    let options = SwarmOptions::from_seed(seed, &overrides);
    let header = options.describe();
    let (report, swarm) = swarm::run(options, true);
    assert!(report.result.is_ok(), "seed {seed}: {:?}", report.result);
    let text = format!("{header}{}", swarm.world.trace_text());
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/sim"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(format!("seed_{seed}"), text));
}

/// Three clients, splits and reorders, disconnects and a slow consumer.
#[test]
fn seed_1() {
    pinned(1);
}

/// Another fault mix.
#[test]
fn seed_7() {
    pinned(7);
}

/// Another fault mix.
#[test]
fn seed_42() {
    pinned(42);
}

/// Two v8 clients beside two v1 clients on the same sessions (the seed
/// draws them; `options::draw_v8`).
#[test]
fn seed_32_v8() {
    pinned(32);
}

/// Sessions with MCP servers (the seed draws them; `options::MCP_DRAW`):
/// one never starts and is told as a notice before the first turn, and
/// tool prompts call MCP tools.
#[test]
fn seed_41_mcp() {
    pinned(41);
}
