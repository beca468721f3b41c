//! The lease swarm: the real client machines (leases, reconnection) against
//! the real server, under held and reordered deliveries, server hand-offs,
//! crashes and dropped connections (`sim::machines`).

use sim::machines;

const SEEDS: u64 = 200;
const STEPS: u64 = 3000;

#[test]
fn client_machines_keep_their_rules_under_faults() {
    let mut failures = Vec::new();
    let mut totals = machines::Report::default();
    for seed in 1..=SEEDS {
        match machines::run(seed, STEPS) {
            Ok(report) => {
                totals.kernel_steps += report.kernel_steps;
                totals.replacements += report.replacements;
                totals.crashes += report.crashes;
                totals.drops += report.drops;
                totals.strangers += report.strangers;
                totals.totals.calls += report.totals.calls;
                totals.totals.ok += report.totals.ok;
                totals.totals.disconnected += report.totals.disconnected;
                totals.totals.reconnects += report.totals.reconnects;
                totals.totals.prompts_done += report.totals.prompts_done;
                totals.totals.replays += report.totals.replays;
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    println!("{totals:#?}");
    assert!(
        failures.is_empty(),
        "{} of {SEEDS} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The run reached what it is for.
    assert!(totals.totals.prompts_done > 100, "{totals:?}");
    assert!(totals.totals.reconnects > 20, "{totals:?}");
    assert!(totals.replacements > 5 && totals.crashes > 5, "{totals:?}");
    assert!(totals.strangers > 20, "{totals:?}");
    assert!(
        totals.totals.replays > 20,
        "stale snapshots delivered again: {totals:?}"
    );
}

/// One short run, whole: three machines, a hand-off, a crash, a dropped
/// connection and two strangers with no or a wrong token, as an
/// insta snapshot in `snapshots/sim/` (a change in the client machine, the
/// kernel or the driver shows up as a readable diff).
#[test]
fn pinned_lease_seed_1() {
    let mut trace = Vec::new();
    let report = machines::run_traced(1, 400, Some(&mut trace)).expect("the seed passes");
    let text = format!("{report:#?}\n{}\n", trace.join("\n"));
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/sim"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("lease_seed_1", text));
}
