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

/// A transcript, or its tail, as its CBOR array, with the facts the server
/// reads of it: where it starts in the session's transcript, where each
/// item ends, and the status of its newest reply.
///
/// A worker sends the whole transcript once per channel and then, with
/// each snapshot, its tail: the items from the first one that changed
/// since its previous snapshot (`from`). Those before are the ones the
/// server already has ([`Transcript`]).
#[derive(Clone, PartialEq, Eq)]
pub struct PackedTranscript {
    cbor: Arc<[u8]>,
    /// Position of its first item in the session's transcript: 0 for a whole one.
    from: usize,
    /// Where each item ends in `cbor`.
    ends: Arc<[usize]>,
    last_reply: Option<AssistantStatus>,
}

impl PackedTranscript {
    /// Encodes `items` for a snapshot as deep as the client messages nest
    /// it (two levels).
    pub fn pack(items: &[TranscriptItem]) -> Result<Self, CborError> {
        Self::pack_tail(0, items)
    }

    /// Encodes `items`, the session's transcript from position `from` on.
    pub fn pack_tail(from: usize, items: &[TranscriptItem]) -> Result<Self, CborError> {
        let mut out = Vec::new();
        let limits = CborLimits::default();
        let mut e = cbor::Encoder::new(&mut out, &limits);
        e.array_header(items.len())?;
        let mut ends = Vec::with_capacity(items.len());
        for item in items {
            direct::write_item(&mut e, item, SESSION_SNAPSHOT_DEPTH + 2)?;
            ends.push(e.written());
        }
        e.finish()?;
        Ok(Self {
            cbor: Arc::from(out),
            from,
            ends: ends.into(),
            last_reply: last_reply(items.iter()),
        })
    }

    /// The transcript decoded from a frame: `cbor` is the array, checked
    /// item by item while it was decoded, its items ending at `ends`.
    pub(crate) fn decoded(
        cbor: Arc<[u8]>,
        from: usize,
        ends: Vec<usize>,
        last_reply: Option<AssistantStatus>,
    ) -> Self {
        Self {
            cbor,
            from,
            ends: ends.into(),
            last_reply,
        }
    }

    /// Position of its first item in the session's transcript: 0 when it is whole.
    pub fn from(&self) -> usize {
        self.from
    }

    /// The CBOR of its items, without the array's header.
    pub(crate) fn body(&self) -> &[u8] {
        &self.cbor[array_head_len(self.ends.len())..]
    }

    /// Where each item ends in [`Self::body`].
    pub(crate) fn body_ends(&self) -> impl Iterator<Item = usize> + '_ {
        let head = array_head_len(self.ends.len());
        self.ends.iter().map(move |end| end - head)
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
        self.ends.len()
    }

    /// Whether it holds no item.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The status of the newest assistant item, if there is one.
    pub fn last_reply(&self) -> Option<AssistantStatus> {
        self.last_reply
    }
}

/// The length of a CBOR array's head for `len` items.
pub(crate) fn array_head_len(len: usize) -> usize {
    match len {
        0..24 => 1,
        24..256 => 2,
        256..65536 => 3,
        _ if len as u64 <= u64::from(u32::MAX) => 5,
        _ => 9,
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
        if self.from > 0 {
            write!(f, "[..{}] + ", self.from)?;
        }
        match self.unpack() {
            Ok(items) => items.fmt(f),
            Err(error) => write!(f, "<{} bytes: {error}>", self.cbor.len()),
        }
    }
}

/// A session's whole transcript as the server keeps it: the CBOR of its
/// items, where each ends, and the status of its newest reply. A tail
/// ([`PackedTranscript::from`]) replaces the items from its start, so a
/// snapshot costs what changed; the array a client's snapshot carries is
/// made when one is sent ([`Self::packed`]).
#[derive(Clone, Default)]
pub struct Transcript {
    body: Vec<u8>,
    ends: Vec<usize>,
    last_reply: Option<AssistantStatus>,
    /// The array, made at its first use since the last change.
    packed: Option<PackedTranscript>,
}

/// A tail starts past the end of the transcript it would extend: some
/// snapshot between them was not seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// Where the tail starts.
    pub from: usize,
    /// How many items the transcript has.
    pub len: usize,
}

impl Transcript {
    /// How many items it holds.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether it holds no item.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The length of its items' CBOR.
    pub fn bytes(&self) -> usize {
        self.body.len()
    }

    /// The status of the newest assistant item.
    pub fn last_reply(&self) -> Option<AssistantStatus> {
        self.last_reply
    }

    /// Replaces the items from `tail.from()` on with the tail's.
    pub fn apply(&mut self, tail: &PackedTranscript) -> Result<(), Gap> {
        let from = tail.from();
        if from > self.len() {
            return Err(Gap {
                from,
                len: self.len(),
            });
        }
        let cut = from.checked_sub(1).map_or(0, |i| self.ends[i]);
        self.body.truncate(cut);
        self.ends.truncate(from);
        self.body.extend_from_slice(tail.body());
        self.ends.extend(tail.body_ends().map(|end| cut + end));
        self.last_reply = match tail.last_reply() {
            Some(status) => Some(status),
            // Items are only ever appended after the first: a tail without
            // a reply leaves the newest one where it was, unless it is whole.
            None if from == 0 => None,
            None => self.last_reply,
        };
        self.packed = None;
        Ok(())
    }

    /// The whole transcript as a client's snapshot carries it.
    pub fn packed(&mut self) -> Result<PackedTranscript, CborError> {
        if let Some(packed) = &self.packed {
            return Ok(packed.clone());
        }
        let packed = self.pack()?;
        self.packed = Some(packed.clone());
        Ok(packed)
    }

    /// The items, decoded.
    pub fn unpack(&self) -> Result<Vec<TranscriptItem>, SchemaError> {
        match &self.packed {
            Some(packed) => packed.unpack(),
            None => self
                .pack()
                .map_err(|e| SchemaError::new(format!("transcript: {e}")))?
                .unpack(),
        }
    }

    fn pack(&self) -> Result<PackedTranscript, CborError> {
        let mut out = Vec::with_capacity(self.body.len() + 9);
        let limits = CborLimits::default();
        cbor::Encoder::new(&mut out, &limits).array_header(self.len())?;
        let head = out.len();
        out.extend_from_slice(&self.body);
        let packed = PackedTranscript {
            cbor: Arc::from(out),
            from: 0,
            ends: self.ends.iter().map(|end| head + end).collect(),
            last_reply: self.last_reply,
        };
        Ok(packed)
    }
}

/// Its length, not its bytes.
impl fmt::Debug for Transcript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Transcript({} items, {} bytes)",
            self.len(),
            self.bytes()
        )
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

    /// Packs `snapshot`, whose transcript holds the session's items from
    /// position `from` on.
    pub fn pack_tail(mut snapshot: SessionSnapshot, from: usize) -> Result<Self, CborError> {
        let items = std::mem::take(&mut snapshot.transcript);
        let transcript = PackedTranscript::pack_tail(from, &items)?;
        Ok(Self {
            head: snapshot,
            transcript,
        })
    }

    /// Replaces the transcript.
    pub(crate) fn set_transcript(&mut self, transcript: PackedTranscript) {
        self.transcript = transcript;
    }

    /// The snapshot with its transcript decoded: the items from
    /// [`PackedTranscript::from`] on.
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
