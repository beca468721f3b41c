//! The session list follows the store (issue #15, item 6):
//!
//! - a stored session is never missing from it: every `list` response and
//!   server snapshot names every session in the store, but those the kernel
//!   cannot know of yet (a worker creating it has not reported ready; a
//!   sibling server wrote it after the last scan of the directory);
//! - a removed session never comes back: none names a session the store
//!   removed at a kernel's request and does not hold again (a scan of the
//!   directory read before the removal must not restore it), but one the
//!   kernel cannot know is gone (removed for an earlier server, with no
//!   scan since).

use super::{Check, Violation};
use crate::world::Fact;

/// Judges one fact.
pub fn observe(fact: &Fact) -> Check {
    let Fact::Listed {
        conn,
        listed,
        stored,
        settling,
        removed,
    } = fact
    else {
        return Ok(());
    };
    let missing: Vec<&String> = stored
        .iter()
        .filter(|id| !listed.contains(id) && !settling.contains(id))
        .collect();
    if !missing.is_empty() {
        return Err(Violation::new(
            "listed",
            format!("{conn} was sent a session list without the stored sessions {missing:?}"),
        ));
    }
    let restored: Vec<&String> = removed
        .iter()
        .filter(|id| listed.contains(id) && !settling.contains(id))
        .collect();
    if !restored.is_empty() {
        return Err(Violation::new(
            "listed",
            format!("{conn} was sent a session list naming the removed sessions {restored:?}"),
        ));
    }
    Ok(())
}
