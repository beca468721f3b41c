//! Once faults stop, everything settles: every hop is delivered, no deadline
//! is pending, every request on a live connection is answered, every live
//! session is idle and attached (or gone) and the server holds its latest
//! revision, every worker process is one the kernel serves, and no
//! connection hangs half-closed.
//!
//! [`pending`] returns the first reason the run has not settled (as
//! TigerBeetle's `pending()`), or `None` once it has.

use super::Checkers;
use crate::world::{WorkerStage, World};
use kernel::protocol::SessionPhase;
use kernel::server::Stage;
use kernel::worker::WorkerState;
use std::collections::BTreeSet;

/// Why the run has not settled yet, or `None`.
pub fn pending(world: &World, checkers: &Checkers) -> Option<String> {
    if let Some((_, delivery)) = world.deliveries().first() {
        return Some(format!("delivery pending: {delivery:?}"));
    }
    if let Some(at) = world.next_event() {
        return Some(format!("deadline pending at {at}"));
    }
    if let Some((conn, id, name)) = checkers.requests.unanswered().first() {
        return Some(format!("{conn}: request {id} ({name}) unanswered"));
    }
    let mut attached = BTreeSet::new();
    for (conn, client) in world.clients() {
        match world.server.connection_stage(conn) {
            Some(Stage::Closing) => return Some(format!("{conn}: still closing")),
            Some(stage) if client.closed => {
                return Some(format!(
                    "{conn}: closed by the client, kernel says {stage:?}"
                ));
            }
            _ => {}
        }
        attached.extend(world.server.attachments(conn));
    }
    for (session_id, worker, state) in world.server.live_sessions() {
        if state != WorkerState::Idle {
            return Some(format!("{session_id}: worker {worker} is {state:?}"));
        }
        if !attached.contains(&session_id) {
            return Some(format!(
                "{session_id}: live with no attachment (not disposed)"
            ));
        }
        let held = world.server.session_revision(&session_id);
        let current = world.runtime_revision(worker);
        if current.is_some() && held != current {
            return Some(format!(
                "{session_id}: the server holds revision {held:?}, its worker {worker} {current:?}"
            ));
        }
    }
    if let Some(reason) = checkers.v8.settled(world) {
        return Some(reason);
    }
    for (worker, session_id, stage, phase) in world.workers() {
        if stage != WorkerStage::Running || phase != Some(SessionPhase::Idle) {
            return Some(format!(
                "{worker} of {session_id}: {stage:?}, runtime {phase:?}"
            ));
        }
    }
    None
}
