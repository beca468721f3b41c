//! What clients are told about a session is consistent.
//!
//! - **Revisions.** Per connection and session, session snapshot revisions
//!   never go back: an event carries a revision strictly above every
//!   snapshot the connection saw before (events and responses); a response
//!   carries one at least as high.
//! - **Attachment.** A response's snapshot says `attached` exactly when the
//!   requester is attached right after the kernel step that answered (per
//!   `Server::attachments`); session events and progress go only to attached
//!   connections; every snapshot says `locked` (a live runtime holds it).
//! - **Committed before broadcast.** Every terminal transcript item a client
//!   is shown (in a snapshot or an `item_finished`) is in the store, identical.

use super::{Check, Violation};
use crate::world::{Fact, World, result_session};
use kernel::ids::ConnId;
use kernel::protocol::{
    ServerEvent, ServerMessage, SessionSnapshot, TranscriptItem, TranscriptProgress,
};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// Highest session snapshot revision each connection saw, per session.
#[derive(Debug, Default, Clone)]
pub struct Snapshots {
    seen: BTreeMap<(ConnId, String), u64>,
}

fn violation(message: String) -> Check {
    Err(Violation::new("snapshots", message))
}

impl Snapshots {
    /// Applies one fact.
    pub fn observe(&mut self, world: &World, fact: &Fact) -> Check {
        let Fact::Emitted {
            conn,
            message,
            attached_after,
            open_after,
            ..
        } = fact
        else {
            return Ok(());
        };
        match message.as_ref() {
            ServerMessage::Response(r) => {
                let Some(snapshot) = r.outcome.as_ref().ok().and_then(result_session) else {
                    return Ok(());
                };
                let what = format!("{conn}: response to {}", r.id);
                if let (true, Some(after)) = (*open_after, attached_after)
                    && snapshot.attached != *after
                {
                    let a = snapshot.attached;
                    return violation(format!("{what} says attached={a}, kernel says {after}"));
                }
                self.revision(*conn, snapshot, false, &what)?;
                check_common(world, snapshot, &what)
            }
            ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => {
                let what = format!(
                    "{conn}: session_snapshot of {} rev {}",
                    snapshot.id, snapshot.revision
                );
                if !snapshot.attached || (*open_after && *attached_after == Some(false)) {
                    return violation(format!("{what} sent to a connection not attached"));
                }
                self.revision(*conn, snapshot, true, &what)?;
                check_common(world, snapshot, &what)
            }
            ServerMessage::Event(ServerEvent::SessionProgress {
                session_id,
                progress,
            }) => {
                if *open_after && *attached_after == Some(false) {
                    return violation(format!(
                        "{conn}: progress of {session_id} while not attached"
                    ));
                }
                match progress {
                    TranscriptProgress::ItemFinished { item } => {
                        committed(world, session_id, None, item)
                    }
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    fn revision(&mut self, conn: ConnId, s: &SessionSnapshot, event: bool, what: &str) -> Check {
        let seen = self.seen.entry((conn, s.id.clone())).or_insert(0);
        let fine = if event {
            s.revision > *seen
        } else {
            s.revision >= *seen
        };
        if !fine && *seen > 0 {
            return violation(format!("{what}: revision {} after {}", s.revision, *seen));
        }
        *seen = (*seen).max(s.revision);
        Ok(())
    }

    /// Folds the revisions into a fingerprint.
    pub fn fingerprint(&self, hasher: &mut impl Hasher) {
        self.seen.hash(hasher);
    }
}

fn check_common(world: &World, snapshot: &SessionSnapshot, what: &str) -> Check {
    if !snapshot.locked {
        return violation(format!(
            "{what}: a live session's snapshot says locked=false"
        ));
    }
    for (index, item) in snapshot.transcript.iter().enumerate() {
        if item.is_terminal() {
            committed(world, &snapshot.id, Some(index), item)?;
        }
    }
    Ok(())
}

/// The store holds `item` identically (looked up at `index` first).
fn committed(
    world: &World,
    session_id: &str,
    index: Option<usize>,
    item: &TranscriptItem,
) -> Check {
    let Some(stored) = world.store.sessions.get(session_id) else {
        return Ok(());
    };
    let at = index
        .and_then(|i| stored.transcript.get(i))
        .filter(|i| i.id() == item.id());
    let found = at.or_else(|| stored.transcript.iter().find(|i| i.id() == item.id()));
    match found {
        Some(stored) if stored == item => Ok(()),
        Some(stored) => violation(format!(
            "{session_id}: item {} shown as {item:?} but stored as {stored:?}",
            item.id()
        )),
        None => violation(format!(
            "{session_id}: item {} shown before it was stored",
            item.id()
        )),
    }
}
