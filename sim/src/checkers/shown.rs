//! Streamed text a client was shown is stored, within the checkpoint bound.
//!
//! For every reply part a connection was sent deltas of, the stored text of
//! that part (in the store, whatever the item's status) is never shorter
//! than what was shown minus [`Checkpoint::bytes`], nor shorter than what
//! was shown more than [`Checkpoint::interval`] before the last moment a
//! live runtime was streaming the reply. So a worker that dies mid-reply
//! loses at most that much of what its clients saw: the aborted item the
//! next worker makes keeps the rest.

use super::{Check, Violation};
use crate::world::{Fact, World};
use kernel::ids::ConnId;
use kernel::limits::Checkpoint;
use kernel::protocol::{Content, ServerEvent, ServerMessage, TranscriptItem, TranscriptProgress};
use kernel::time::Instant;
use std::collections::{BTreeMap, VecDeque};

/// A reply part as one connection saw it stream.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// Bytes shown so far.
    shown: usize,
    /// (when, bytes shown by then), oldest first, not yet past the interval.
    recent: VecDeque<(Instant, usize)>,
    /// Bytes shown longer ago than the interval (must be stored).
    settled: usize,
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Shown {
    /// (connection, session, item, content index) → what it saw.
    seen: BTreeMap<(ConnId, String, String, u64), Seen>,
}

fn violation(message: String) -> Check {
    Err(Violation::new("shown", message))
}

/// Bytes of part `index` of stored item `item_id`, and whether the item is final.
fn stored(world: &World, session_id: &str, item_id: &str, index: u64) -> Option<(usize, bool)> {
    let session = world.store.sessions.get(session_id)?;
    let item = session.transcript.iter().find(|i| i.id() == item_id)?;
    let TranscriptItem::Assistant(a) = item else {
        return None;
    };
    let bytes = match a.content.get(index as usize) {
        Some(Content::Text { text }) => text.len(),
        Some(Content::Thinking { thinking, .. }) => thinking.len(),
        // A tool call's arguments are not shown as streamed text.
        Some(_) | None => 0,
    };
    Some((bytes, item.is_terminal()))
}

impl Shown {
    /// Records the deltas `fact` shows a connection.
    pub fn observe(&mut self, world: &World, fact: &Fact) {
        // What a closed connection was shown stays shown: only emissions count.
        let Fact::Emitted { conn, message, .. } = fact else {
            return;
        };
        if let ServerMessage::Event(ServerEvent::SessionProgress {
            session_id,
            progress:
                TranscriptProgress::AssistantDelta {
                    message_id,
                    content_index,
                    delta,
                    ..
                },
        }) = message.as_ref()
        {
            let key = (
                *conn,
                session_id.clone(),
                message_id.clone(),
                *content_index,
            );
            let seen = self.seen.entry(key).or_default();
            seen.shown += delta.len();
            seen.recent.push_back((world.now, seen.shown));
        }
    }

    /// Checks every part seen against the store. Call after every step.
    pub fn check(&mut self, world: &World) -> Check {
        let bound = Checkpoint::default();
        let streaming = world.streaming_replies();
        let mut done = Vec::new();
        for (key, seen) in &mut self.seen {
            let (_, session_id, item_id, index) = key;
            // Time counts only while a live runtime streams the reply; once
            // it died, the bound is judged as of its last moment.
            if streaming.contains(&(session_id.clone(), item_id.clone())) {
                while let Some(&(at, bytes)) = seen.recent.front() {
                    if at + bound.interval < world.now {
                        seen.settled = bytes;
                        seen.recent.pop_front();
                    } else {
                        break;
                    }
                }
            }
            let Some((stored, terminal)) = stored(world, session_id, item_id, *index) else {
                // The session or the item is gone (removed): nothing to keep.
                done.push(key.clone());
                continue;
            };
            let what = format!("{session_id}: reply {item_id} part {index}");
            if stored + bound.bytes < seen.shown {
                return violation(format!(
                    "{what}: {} bytes shown, {stored} stored (more than {} behind)",
                    seen.shown, bound.bytes
                ));
            }
            if stored < seen.settled {
                return violation(format!(
                    "{what}: {} bytes shown over {:?} ago, only {stored} stored",
                    seen.settled, bound.interval
                ));
            }
            if terminal {
                done.push(key.clone());
            }
        }
        for key in done {
            self.seen.remove(&key);
        }
        Ok(())
    }
}
