//! At most one live runtime and one worker per session (orphans included:
//! a server that spawns a worker beside a live orphan breaks it), and the
//! kernel's view of its workers is the truth: every worker process the
//! kernel has not yet seen exit, but for orphans not adopted yet, is one the
//! kernel tracks, for the same session, and back.

use super::{Check, Violation};
use crate::world::World;
use kernel::ids::WorkerId;
use std::collections::BTreeMap;

fn violation(message: String) -> Check {
    Err(Violation::new("processes", message))
}

/// Checks the world's workers against each other and against the kernel.
pub fn check(world: &World) -> Check {
    let mut runtimes: BTreeMap<&str, WorkerId> = BTreeMap::new();
    let workers = world.workers();
    for (worker, session_id, _, phase) in &workers {
        if phase.is_some()
            && let Some(other) = runtimes.insert(session_id, *worker)
        {
            return violation(format!(
                "{session_id}: two live runtimes ({other} and {worker})"
            ));
        }
    }
    // An orphan's grace counts from the loss of its server: announcing
    // itself again does not start it over.
    if let Some((orphan, since)) = world.overdue_orphans().first() {
        return violation(format!(
            "orphan {orphan}, orphaned at {since}, is idle past its grace at {}",
            world.now
        ));
    }
    if world.is_server_down() {
        // The dead server's state is no one's truth; the orphans wait for the next.
        return Ok(());
    }
    let kernel = world.server.live_sessions();
    let mut sessions: BTreeMap<&str, WorkerId> = BTreeMap::new();
    for (session_id, worker, _) in &kernel {
        if let Some(other) = sessions.insert(session_id, *worker) {
            return violation(format!(
                "{session_id}: the kernel tracks {other} and {worker}"
            ));
        }
    }
    // An orphan is no server's until it is adopted: it announces itself.
    let ours: Vec<(WorkerId, &str)> = workers
        .iter()
        .filter(|(w, _, _, _)| !world.is_orphan(*w))
        .map(|(w, s, _, _)| (*w, *s))
        .collect();
    let theirs: Vec<(WorkerId, &str)> = {
        let mut v: Vec<(WorkerId, &str)> =
            kernel.iter().map(|(s, w, _)| (*w, s.as_str())).collect();
        v.sort();
        v
    };
    if ours != theirs {
        return violation(format!(
            "world workers {ours:?} but kernel workers {theirs:?}"
        ));
    }
    Ok(())
}
