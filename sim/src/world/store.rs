//! The fake durable store ([`Store`]): the sessions, the default model and
//! the write-failure switch that survive workers and servers, with the
//! changed-session bookkeeping the checkers read and the catalog a starting
//! server loads.

use super::Memo;
use kernel::protocol::{ModelRef, SessionMetadata};
use kernel::runtime::{Persist, StoredSession};
use std::collections::{BTreeMap, BTreeSet};

/// The fake durable store: what survives workers and servers.
#[derive(Debug, Clone, Default)]
pub struct Store {
    /// Sessions by id.
    pub sessions: Memo<BTreeMap<String, StoredSession>>,
    /// The model new sessions start with (the most recently selected one).
    pub default_model: Option<ModelRef>,
    /// When set, every write fails.
    pub fail_writes: bool,
    /// Sessions written, created or removed since [`Store::take_dirty`].
    dirty: BTreeSet<String>,
}

impl Store {
    pub(super) fn apply(&mut self, id: &str, p: &Persist) -> Result<(), String> {
        if self.fail_writes {
            return Err("simulated storage write failure".into());
        }
        let session = self
            .sessions
            .get_mut(id)
            .ok_or("session directory is gone")?;
        session.apply(p);
        self.dirty.insert(id.to_string());
        Ok(())
    }

    pub(super) fn insert(&mut self, stored: StoredSession) {
        self.dirty.insert(stored.id.clone());
        self.sessions.insert(stored.id.clone(), stored);
    }

    pub(super) fn remove(&mut self, id: &str) -> Option<StoredSession> {
        self.dirty.insert(id.to_string());
        self.sessions.remove(id)
    }

    /// Marks a session changed (for tests that tamper with the store).
    pub fn touch(&mut self, id: &str) {
        self.dirty.insert(id.to_string());
    }

    /// The sessions changed since the last call, in id order.
    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }

    /// The catalog a server loads at start.
    /// The stored sessions' details, as their `meta.json` would record them.
    pub fn models(&self) -> Vec<kernel::server::StoredDetails> {
        self.sessions
            .values()
            .map(|s| kernel::server::StoredDetails {
                session_id: s.id.clone(),
                model: s.model.clone(),
                thinking_level: s.thinking_level,
                preview: s.transcript.iter().find_map(|item| match item {
                    kernel::protocol::TranscriptItem::User(user) => Some(kernel::server::preview(
                        &kernel::client::follow::text_of(&user.content),
                    )),
                    _ => None,
                }),
            })
            .collect()
    }

    pub fn catalog(&self) -> Vec<SessionMetadata> {
        self.sessions
            .values()
            .map(|s| SessionMetadata {
                id: s.id.clone(),
                created_at: s.created_at,
                updated_at: Some(s.updated_at),
                parent_session_id: None,
                session_name: s.name.clone(),
                cwd: Some(s.cwd.clone()),
            })
            .collect()
    }
}
