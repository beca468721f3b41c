//! A reply a client rebuilds from what it was sent has no hole.
//!
//! A v1 client knows a reply's text from a snapshot (an `attach`'s answer,
//! a `session_snapshot`) or a live item event, then appends the deltas that
//! follow. The server promises that a snapshot is current as of the deltas
//! after it, so for every connection and reply part, the text so rebuilt is
//! always a prefix of the part's text in the next snapshot or item event
//! the connection is sent. The one exception is a worker that died
//! mid-reply: the next worker's aborted item keeps what was checkpointed,
//! so the new text may be a prefix of the rebuilt one ([`super::shown`]
//! bounds how much shorter).
//!
//! A hole (a delta the client never got, while its snapshot predates it)
//! or a repeat (a delta already in its snapshot) breaks the prefix.

use super::{Check, Violation};
use crate::world::{Fact, result_session};
use kernel::ids::ConnId;
use kernel::protocol::{
    AssistantItem, Content, DeltaKind, ServerEvent, ServerMessage, TranscriptItem,
    TranscriptProgress,
};
use std::collections::BTreeMap;

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Streams {
    /// (connection, session, item, content index) → the text rebuilt.
    rebuilt: BTreeMap<(ConnId, String, String, u64), String>,
}

impl Streams {
    /// Applies one fact.
    pub fn observe(&mut self, fact: &Fact) -> Check {
        let (conn, message) = match fact {
            Fact::Emitted { conn, message, .. } => (*conn, message),
            Fact::ConnClosed { conn } => {
                self.rebuilt.retain(|(c, ..), _| c != conn);
                return Ok(());
            }
            _ => return Ok(()),
        };
        match message.as_ref() {
            ServerMessage::Response(r) => match r.outcome.as_ref().ok().and_then(result_session) {
                Some(snapshot) => snapshot
                    .transcript
                    .iter()
                    .try_for_each(|item| self.item(conn, &snapshot.id, item, "an answer")),
                None => Ok(()),
            },
            ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => snapshot
                .transcript
                .iter()
                .try_for_each(|item| self.item(conn, &snapshot.id, item, "a session_snapshot")),
            ServerMessage::Event(ServerEvent::SessionProgress {
                session_id,
                progress,
            }) => match progress {
                TranscriptProgress::ItemStarted { item }
                | TranscriptProgress::ItemUpdated { item }
                | TranscriptProgress::ItemFinished { item } => {
                    self.item(conn, session_id, item, "an item event")
                }
                TranscriptProgress::AssistantDelta {
                    message_id,
                    content_index,
                    kind,
                    delta,
                } => {
                    // Tool-call arguments are JSON fragments, not shown text.
                    if *kind != DeltaKind::ToolCall {
                        let key = (conn, session_id.clone(), message_id.clone(), *content_index);
                        if let Some(text) = self.rebuilt.get_mut(&key) {
                            text.push_str(delta);
                        }
                    }
                    Ok(())
                }
            },
            _ => Ok(()),
        }
    }

    /// Judges the rebuilt text of each of `item`'s parts against it, then
    /// takes the item's text as the new base.
    fn item(&mut self, conn: ConnId, session_id: &str, item: &TranscriptItem, what: &str) -> Check {
        let TranscriptItem::Assistant(AssistantItem { id, content, .. }) = item else {
            return Ok(());
        };
        for (index, part) in content.iter().enumerate() {
            let (Content::Text { text } | Content::Thinking { thinking: text, .. }) = part else {
                continue;
            };
            let key = (conn, session_id.to_owned(), id.clone(), index as u64);
            if let Some(rebuilt) = self.rebuilt.get(&key)
                && !text.starts_with(rebuilt.as_str())
                && !rebuilt.starts_with(text.as_str())
            {
                let at = common_prefix(rebuilt, text);
                return Err(Violation::new(
                    "streams",
                    format!(
                        "{conn}: part {index} of reply {id} in {session_id}, rebuilt from what \
                         it was sent, is not a prefix of {what}'s: they part at byte {at} \
                         (rebuilt {:?}…, sent {:?}…)",
                        excerpt(rebuilt, at),
                        excerpt(text, at),
                    ),
                ));
            }
            self.rebuilt.insert(key, text.clone());
        }
        Ok(())
    }
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// Up to 24 characters of `text` from byte `at` (or the character it falls in).
fn excerpt(text: &str, at: usize) -> String {
    let start = (0..=at)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    text[start..].chars().take(24).collect()
}
