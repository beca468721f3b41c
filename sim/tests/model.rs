//! Model checking: every interleaving of two small configurations, judged by
//! the swarm's checkers after every action and for liveness at every
//! quiescent state (see `sim::model` for the explorer and why it is ours).
//!
//! Method: depth-first search over action sequences, replaying prefixes,
//! merging states by fingerprint. Each test prints the states explored and
//! the time taken, and fails with the counterexample's path and trace.

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
        }
        Err(found) => panic!(
            "{}: {}\npath: {:?}\ntrace:\n{}",
            config.name, found.message, found.path, found.trace
        ),
    }
}

/// (a) Two clients, one session: attach, detach, prompt, abort, disconnect.
#[test]
fn two_clients_one_session() {
    check(model::two_clients_one_session(), 20_000);
}

/// (b) One client, one session, a worker crash and a server restart.
#[test]
fn crash_and_restart() {
    check(model::crash_and_restart(), 20_000);
}
