//! A committed (terminal) transcript item is never lost or changed: once the
//! store holds an item id in a terminal state, it holds that exact item
//! forever, across worker crashes and server restarts. The only way out is
//! the removal of the whole session at the kernel's request.

use super::{Check, Violation};
use crate::world::{Fact, Store};
use kernel::protocol::TranscriptItem;
use std::collections::{BTreeMap, BTreeSet};

/// A shadow copy of every committed item.
#[derive(Debug, Default, Clone)]
pub struct StoreChecker {
    /// Session → item id → (position, committed item).
    committed: BTreeMap<String, BTreeMap<String, (usize, TranscriptItem)>>,
    removed: BTreeSet<String>,
    /// Committed items seen.
    pub items: u64,
}

impl StoreChecker {
    /// Applies one fact.
    pub fn observe(&mut self, fact: &Fact) {
        if let Fact::StoreRemoved { session_id } = fact {
            self.removed.insert(session_id.clone());
        }
    }

    /// Compares the sessions written since the last call with the shadow.
    pub fn check(&mut self, store: &mut Store) -> Check {
        for session_id in store.take_dirty() {
            let Some(stored) = store.sessions.get(&session_id) else {
                if self.committed.remove(&session_id).is_some()
                    && !self.removed.contains(&session_id)
                {
                    let message = format!("{session_id}: session lost from the store");
                    return Err(Violation::new("store", message));
                }
                continue;
            };
            let shadow = self.committed.entry(session_id.clone()).or_default();
            for (id, (position, item)) in shadow.iter() {
                let now = stored.transcript.get(*position).filter(|i| i.id() == id);
                if now != Some(item) {
                    let message =
                        format!("{session_id}: committed item {id} at {position} became {now:?}");
                    return Err(Violation::new("store", message));
                }
            }
            for (position, item) in stored.transcript.iter().enumerate() {
                if item.is_terminal() && !shadow.contains_key(item.id()) {
                    shadow.insert(item.id().to_string(), (position, item.clone()));
                    self.items += 1;
                }
            }
        }
        Ok(())
    }
}
