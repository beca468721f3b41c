//! A session snapshot whose transcript is kept as its CBOR: what a worker
//! sends its server, and what the server keeps of a live session.
//!
//! The transcript is most of a snapshot and grows with every turn, while
//! the server only passes it on: it splices the bytes into the messages
//! that carry the snapshot ([`super::codec::spliced`]) and never reads an
//! item. So the server holds no typed transcript, and can let go of the
//! bytes once they are sent (DESIGN.md, the server keeps no transcript).
//! The worker packs the transcript once per snapshot, for the deepest
//! message that carries it, so the same bytes are valid in every one.

use super::codec::{Path, Schema, SchemaError, direct};
use super::types::{AssistantStatus, SessionSnapshot, TranscriptItem};
use crate::wire::{CborError, CborLimits, Value, cbor};
use std::fmt;
use std::sync::Arc;

/// How deep the messages that carry a session snapshot nest it:
/// `result.session` of a response, `event.snapshot` of an event. A worker
/// frame nests it one level deep, so a transcript packed for this depth
/// fits both.
pub(crate) const SESSION_SNAPSHOT_DEPTH: usize = 2;

/// A transcript as its CBOR array, with the one fact the server reads of it.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedTranscript {
    cbor: Arc<[u8]>,
    len: usize,
    last_reply: Option<AssistantStatus>,
}

impl PackedTranscript {
    /// Encodes `items` for a snapshot as deep as the client messages nest
    /// it (two levels).
    pub fn pack(items: &[TranscriptItem]) -> Result<Self, CborError> {
        let mut out = Vec::new();
        let limits = CborLimits::default();
        let mut e = cbor::Encoder::new(&mut out, &limits);
        direct::write_transcript(&mut e, items, SESSION_SNAPSHOT_DEPTH)?;
        e.finish()?;
        Ok(Self {
            cbor: Arc::from(out),
            len: items.len(),
            last_reply: last_reply(items.iter()),
        })
    }

    /// The transcript decoded from a frame: `cbor` is the array, checked
    /// item by item while it was decoded.
    pub(crate) fn decoded(
        cbor: Arc<[u8]>,
        len: usize,
        last_reply: Option<AssistantStatus>,
    ) -> Self {
        Self {
            cbor,
            len,
            last_reply,
        }
    }

    /// The items, decoded and checked against the schema.
    pub fn unpack(&self) -> Result<Vec<TranscriptItem>, SchemaError> {
        let value = cbor::decode(&self.cbor, &CborLimits::default())
            .map_err(|e| SchemaError::new(format!("transcript: {e}")))?;
        let Value::Array(items) = value else {
            return Err(SchemaError::new("transcript: not an array"));
        };
        let root = Path::Root("transcript");
        items
            .iter()
            .enumerate()
            .map(|(i, item)| TranscriptItem::from_value_at(item, &root.index(i)))
            .collect()
    }

    /// The CBOR array.
    pub fn cbor(&self) -> &Arc<[u8]> {
        &self.cbor
    }

    /// How many items it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no item.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The status of the newest assistant item, if there is one.
    pub fn last_reply(&self) -> Option<AssistantStatus> {
        self.last_reply
    }
}

/// The status of the newest assistant item among `items` (oldest first).
fn last_reply<'a>(
    items: impl DoubleEndedIterator<Item = &'a TranscriptItem>,
) -> Option<AssistantStatus> {
    items.rev().find_map(|item| match item {
        TranscriptItem::Assistant(a) => Some(a.status),
        _ => None,
    })
}

/// The items, as [`fmt::Debug`] shows a typed transcript (traces and the
/// model checker's fingerprints are unchanged by the packing).
impl fmt::Debug for PackedTranscript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unpack() {
            Ok(items) => items.fmt(f),
            Err(error) => write!(f, "<{} bytes: {error}>", self.cbor.len()),
        }
    }
}

/// A session snapshot with its transcript packed.
#[derive(Clone, PartialEq)]
pub struct PackedSnapshot {
    /// Every field but the transcript, which is empty here.
    head: SessionSnapshot,
    transcript: PackedTranscript,
}

impl PackedSnapshot {
    /// Packs `snapshot`'s transcript.
    pub fn pack(mut snapshot: SessionSnapshot) -> Result<Self, CborError> {
        let items = std::mem::take(&mut snapshot.transcript);
        let transcript = PackedTranscript::pack(&items)?;
        Ok(Self {
            head: snapshot,
            transcript,
        })
    }

    /// Replaces the transcript.
    pub(crate) fn set_transcript(&mut self, transcript: PackedTranscript) {
        self.transcript = transcript;
    }

    /// The snapshot with its transcript decoded.
    pub fn unpack(&self) -> Result<SessionSnapshot, SchemaError> {
        let mut snapshot = self.head.clone();
        snapshot.transcript = self.transcript.unpack()?;
        Ok(snapshot)
    }

    /// Every field but the transcript (its `transcript` is empty).
    pub fn head(&self) -> &SessionSnapshot {
        &self.head
    }

    /// Every field but the transcript, to change (its `transcript` is
    /// ignored).
    pub fn head_mut(&mut self) -> &mut SessionSnapshot {
        &mut self.head
    }

    /// The packed transcript.
    pub fn transcript(&self) -> &PackedTranscript {
        &self.transcript
    }

    /// The head and the transcript.
    pub fn into_parts(self) -> (SessionSnapshot, PackedTranscript) {
        (self.head, self.transcript)
    }
}

/// As the unpacked snapshot.
impl fmt::Debug for PackedSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unpack() {
            Ok(snapshot) => snapshot.fmt(f),
            Err(error) => write!(f, "{:?} <transcript: {error}>", self.head),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::direct::Shown;
    use super::*;
    use crate::protocol::codec::spliced;
    use crate::protocol::types::*;

    fn snapshot(transcript: Vec<TranscriptItem>) -> SessionSnapshot {
        SessionSnapshot {
            name: Some("n".into()),
            transcript,
            ..crate::protocol::worker::tests::snapshot()
        }
    }

    fn reply(status: AssistantStatus) -> TranscriptItem {
        TranscriptItem::Assistant(AssistantItem {
            id: "a".into(),
            content: vec![Content::Text { text: "hi".into() }],
            model: ModelRef {
                provider: "faux".into(),
                id: "faux-1".into(),
            },
            response_model: None,
            usage: None,
            timestamp: 5,
            status,
            error_message: (status == AssistantStatus::Error).then(|| "boom".into()),
        })
    }

    fn user() -> TranscriptItem {
        TranscriptItem::User(UserItem {
            id: "u".into(),
            content: vec![Content::Text { text: "q".into() }],
            timestamp: 4,
        })
    }

    #[test]
    fn packing_round_trips_and_keeps_the_newest_reply() {
        let items = vec![user(), reply(AssistantStatus::Error), user()];
        let packed = PackedSnapshot::pack(snapshot(items.clone())).unwrap();
        assert_eq!(packed.unpack().unwrap(), snapshot(items));
        assert_eq!(packed.transcript().len(), 3);
        assert_eq!(
            packed.transcript().last_reply(),
            Some(AssistantStatus::Error)
        );
        assert!(packed.head().transcript.is_empty());
        let empty = PackedSnapshot::pack(snapshot(vec![])).unwrap();
        assert_eq!(empty.transcript().last_reply(), None);
        assert_eq!(&**empty.transcript().cbor(), &[0x80]);
    }

    #[test]
    fn a_packed_snapshot_writes_the_typed_snapshots_bytes() {
        let typed = snapshot(vec![user(), reply(AssistantStatus::Aborted)]);
        let packed = PackedSnapshot::pack(typed.clone()).unwrap();
        for attached in [false, true] {
            let shown = Shown {
                attached,
                locked: true,
            };
            let mut out = Vec::new();
            let limits = CborLimits::default();
            let mut e = cbor::Encoder::new(&mut out, &limits);
            direct::write_packed_session_snapshot(
                &mut e,
                packed.head(),
                packed.transcript().cbor(),
                shown,
                SESSION_SNAPSHOT_DEPTH,
            )
            .unwrap();
            let expected = spliced::encode_session_snapshot_shown(&typed, shown).unwrap();
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn debug_shows_the_items() {
        let typed = snapshot(vec![user()]);
        let packed = PackedSnapshot::pack(typed.clone()).unwrap();
        assert_eq!(format!("{packed:?}"), format!("{typed:?}"));
    }
}
