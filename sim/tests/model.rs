//! Model checking: every interleaving of eight small configurations, judged
//! by the swarm's checkers after every action and for liveness at every
//! quiescent state (see `sim::model` for the explorer and why it is ours).
//!
//! Method: depth-first search over action sequences, branching by cloning
//! the state, merging states by fingerprint. Each test prints the states
//! explored and the time taken, requires the milestones its configuration
//! is for (a configuration that no longer reaches what it was written for
//! checks nothing there), and fails with the shortest counterexample's
//! path, its replay command and its trace.

use sim::model::{self, Config};

fn check(config: Config, states_min: u64) {
    match model::explore(&config) {
        Ok(stats) => {
            println!("{}: {stats}", config.name);
            assert_eq!(stats.truncated, 0, "the budgets bound every path");
            assert!(
                stats.states >= states_min,
                "explored only {} states",
                stats.states
            );
            for milestone in &config.reaches {
                assert!(
                    stats.reached.contains(*milestone),
                    "{}: no path reaches {milestone:?}",
                    config.name
                );
            }
        }
        Err(found) => panic!(
            "{}: {}\nshortest path ({} actions): {}\nreplay: cargo run --release -p sim -- --replay {} '{}'\ntrace:\n{}",
            config.name,
            found.message,
            found.path.len(),
            model::path_text(&found.path),
            model::key(&config),
            model::path_text(&found.path),
            found.trace
        ),
    }
}

/// (a) Two clients, one session: attach, detach, prompt, abort, disconnect.
#[test]
fn two_clients_one_session() {
    check(model::two_clients_one_session(), 90_000);
}

/// (b) One client, one session, a worker crash and a server restart.
#[test]
fn crash_and_restart() {
    check(model::crash_and_restart(), 55_000);
}

/// (c) Every command: steer, set_model, set_thinking, a second prompt, remove.
#[test]
fn every_command() {
    check(model::every_command(), 70_000);
}

/// (d) A slow consumer, a failing store and a graceful hand-off.
#[test]
fn slow_consumer_storage_handoff() {
    check(model::slow_consumer_storage_handoff(), 90_000);
}

/// (e) A server crash that keeps its workers: adoption or retirement.
#[test]
fn crash_keeping_workers() {
    check(model::crash_keeping_workers(), 65_000);
}

/// A replayed path reproduces what the explorer saw, and the path's text
/// reads back as the same actions.
#[test]
fn a_path_replays_and_reads_back() {
    let config = model::crash_keeping_workers();
    let text = "0.Attach store_fails boot.1 crash_keep_workers time start_server";
    let path = model::parse_path(text).expect("a path");
    assert_eq!(model::path_text(&path), text);
    let (replayed, verdict) = model::replay(&config, &path, true);
    assert_eq!(
        verdict,
        Ok(()),
        "an orphan retiring on a failing store exits"
    );
    let trace = replayed.world.trace_text();
    assert!(trace.contains("orphan pid 1 retires"), "{trace}");
    assert!(model::parse_path("0.Fly").is_err());
}

/// (f) A v8 client beside a v1 client: attach, prompt, detach, a worker crash.
#[test]
fn v8_client() {
    check(model::v8_client(), 40_000);
}

/// (g) One client reconnecting across a hand-over while the orphan's
/// announcement travels and the orphan streams on.
#[test]
fn handoff_in_flight() {
    check(model::handoff_in_flight(), 20_000);
}

/// (h) As (g), for a v8 client.
#[test]
fn v8_handoff_in_flight() {
    check(model::v8_handoff_in_flight(), 8_000);
}
