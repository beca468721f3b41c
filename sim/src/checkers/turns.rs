//! The turn rules, judged from the outside: how many times a turn asks the
//! model, and where acknowledged steer text goes.
//!
//! - **Attempts.** A turn makes at most `max_attempts` failed model calls
//!   in a row (a failed summary counts too, even when the turn goes on
//!   uncompacted): after that many it ends, and a
//!   retryable failure before that many is retried (phase `retry`), unless
//!   a storage failure in the turn ended it. The
//!   count restarts when a call finishes its stream or a new prompt starts
//!   a turn.
//! - **Steer reaches the model.** A turn that ends because its reply
//!   finished leaves no user item after that reply: steer text acknowledged
//!   during the turn goes to the model before the turn ends (an abort, a
//!   failed reply or a disposal may leave it unanswered; so may a storage
//!   failure in the turn, after which the runtime keeps only what was
//!   stored).

use super::{Check, Violation};
use crate::world::Fact;
use kernel::protocol::SessionPhase;
use kernel::worker::Operation;
use std::collections::{BTreeMap, BTreeSet};

fn violation(message: String) -> Check {
    Err(Violation::new("turns", message))
}

/// See the module documentation.
#[derive(Debug, Default, Clone)]
pub struct Turns {
    /// Failed model calls in a row, per session, in its current turn (by
    /// session: a worker handed over is an orphan, then adopted, under
    /// other ids, and its turn goes on).
    failures: BTreeMap<String, u32>,
    /// Sessions with a storage failure since their last turn began.
    store_failed: BTreeSet<String>,
}

impl Turns {
    /// Applies one fact; `max_attempts` is the runtimes' retry policy.
    pub fn observe(&mut self, fact: &Fact, max_attempts: u32) -> Check {
        match fact {
            Fact::StoreFailed { session_id } => {
                self.store_failed.insert(session_id.clone());
                Ok(())
            }
            Fact::RuntimeOp {
                session_id,
                operation: Operation::Prompt { .. },
                phase_before: SessionPhase::Idle,
                store_failed,
                ..
            } => {
                self.failures.remove(session_id);
                if !store_failed {
                    self.store_failed.remove(session_id);
                }
                Ok(())
            }
            Fact::ModelDone {
                session_id,
                phase_after,
                unanswered,
                ..
            } => {
                self.failures.remove(session_id);
                let ended = *phase_after == Some(SessionPhase::Idle);
                if ended && *unanswered > 0 && !self.store_failed.contains(session_id) {
                    return violation(format!(
                        "{session_id}: the turn ended with its reply and left {unanswered} user \
                         items after it: steer text the model never saw"
                    ));
                }
                Ok(())
            }
            Fact::ModelFailed {
                worker,
                session_id,
                retryable,
                live: true,
                phase_after,
            } => {
                let failures = self.failures.entry(session_id.clone()).or_default();
                *failures += 1;
                let retrying = *phase_after == Some(SessionPhase::Retry);
                if retrying && *failures >= max_attempts {
                    return violation(format!(
                        "{worker}: a model call is retried after {failures} failed attempts \
                         (max_attempts {max_attempts})"
                    ));
                }
                let store_failed = self.store_failed.contains(session_id);
                if *retryable && !retrying && *failures < max_attempts && !store_failed {
                    return violation(format!(
                        "{worker}: a retryable failure ended the turn after {failures} of \
                         {max_attempts} attempts (phase {phase_after:?})"
                    ));
                }
                if *phase_after != Some(SessionPhase::Turn) && !retrying {
                    self.failures.remove(session_id); // the turn ended
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
