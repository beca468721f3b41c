//! A stored session is never missing from the session list (issue #15,
//! item 6): every `list` response and server snapshot names every session
//! in the store, but those the kernel cannot know of yet (a worker creating
//! it has not reported ready; a sibling server wrote it after the last
//! scan of the directory).

use super::{Check, Violation};
use crate::world::Fact;

/// Judges one fact.
pub fn observe(fact: &Fact) -> Check {
    let Fact::Listed {
        conn,
        listed,
        stored,
        settling,
    } = fact
    else {
        return Ok(());
    };
    let missing: Vec<&String> = stored
        .iter()
        .filter(|id| !listed.contains(id) && !settling.contains(id))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Violation::new(
        "listed",
        format!("{conn} was sent a session list without the stored sessions {missing:?}"),
    ))
}
