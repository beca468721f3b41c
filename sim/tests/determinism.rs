//! A run is a pure function of its seed.
//!
//! Method: run seeds twice with a trace and compare the trace hashes and the
//! final kernel-and-store state hashes (madsim's `check_determinism`); run
//! them once more without a trace (which also skips decoding unchecked
//! frames) and compare the state hash, so that observing a run never changes it.

use sim::options::{Overrides, SwarmOptions};
use sim::swarm;

#[test]
fn same_seed_same_trace_and_state() {
    for seed in [1, 2, 3, 42, 866, 1234, 99_999, 0xdead_beef] {
        let options = || SwarmOptions::from_seed(seed, &Overrides::default());
        let (a, _) = swarm::run(options(), true);
        let (b, _) = swarm::run(options(), true);
        let (quiet, _) = swarm::run(options(), false);
        assert!(a.result.is_ok(), "seed {seed}: {:?}", a.result);
        assert_ne!(a.trace_hash, 0);
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}: traces differ");
        assert_eq!(a.state_hash, b.state_hash, "seed {seed}: states differ");
        assert_eq!(a.stats, b.stats, "seed {seed}: stats differ");
        assert_eq!(
            a.state_hash, quiet.state_hash,
            "seed {seed}: tracing changed the run"
        );
        assert_eq!(a.stats, quiet.stats, "seed {seed}: tracing changed the run");
    }
}

#[test]
fn different_seeds_differ() {
    let run = |seed| swarm::run(SwarmOptions::from_seed(seed, &Overrides::default()), true).0;
    assert_ne!(run(5).trace_hash, run(6).trace_hash);
}
