//! Encoders of the messages that carry the session list — `list` responses,
//! server hellos and server snapshot events — around CBOR of the list (and
//! of the models) encoded earlier, so that a server can keep those bytes
//! instead of rebuilding and re-encoding thousands of entries per message;
//! and of those that carry one session's snapshot — the responses to
//! `create`, `attach` and the control commands, and session snapshot events
//! — around CBOR of the snapshot ([`encode_session_snapshot`], or the pieces
//! around a worker's packed transcript, [`encode_packed_session_snapshot`]),
//! so that a long transcript is encoded once per revision rather than once
//! per message.
//!
//! A message comes out as pieces ([`Spliced`]): the envelope before the
//! list (or snapshot), its shared pieces as given, and the rest; the server
//! frames them without copying the shared pieces
//! ([`crate::wire::frame::frame_shared`]), so a frame costs its envelope, not
//! the length of the list or transcript. A list is kept as an
//! [`EncodedList`]: its header and pieces of whole entries, so that a change
//! re-encodes one piece, not the list. Together the pieces
//! are exactly the bytes [`super::encode_payload`] writes for the same message
//! (keys in the schema order of `messages.rs` and `items.rs`, numbers through
//! the same [`uint_value`] mapping, the same CBOR limits, the same errors);
//! the list comes from [`ListBuilder`], [`encode_item`] and
//! [`direct::encode_session_metadata`], snapshots from [`super::direct`]. Like
//! [`super::encode_trusted_server_message`] in release builds they do not
//! re-check the schema: they are for messages a server builds itself. The
//! server compares them with the normal encoding in debug builds, and
//! `kernel/tests/protocol.rs` does on arbitrary messages.

use super::direct::{self, Shown};
use super::{Schema, SchemaError, cbor_error, uint_value};
use crate::protocol::packed::SESSION_SNAPSHOT_DEPTH;
use crate::protocol::{PackedTranscript, SessionMetadata, SessionSnapshot};
use crate::wire::cbor::{Encoder, check_item_len};
use crate::wire::frame::{Frame, FrameError, frame_shared};
use crate::wire::{CborError, CborLimits, Value};
use std::sync::Arc;

/// A [`crate::protocol::ServerSnapshot`] whose two lists are already encoded.
#[derive(Debug, Clone, Copy)]
pub struct EncodedSnapshot<'a> {
    /// `serverId`.
    pub server_id: &'a str,
    /// `protocolVersion`.
    pub protocol_version: u64,
    /// `revision`.
    pub revision: u64,
    /// CBOR of the `sessions` array of [`crate::protocol::SessionMetadata`].
    pub sessions: &'a EncodedList,
    /// CBOR of the `models` array of [`crate::protocol::ModelMetadata`].
    pub models: &'a [u8],
}

/// CBOR of an array kept as its header and shared pieces, each holding
/// whole items: the server's session list, whose pieces are re-encoded one
/// at a time as entries change, and spliced into messages without a copy.
#[derive(Debug, Clone)]
pub struct EncodedList {
    header: Vec<u8>,
    pieces: Vec<Arc<[u8]>>,
}

impl EncodedList {
    /// The array of `len` items whose CBOR, concatenated, is `pieces`
    /// (made by [`ListBuilder::headless`] or [`encode_item`]).
    pub fn new(len: usize, pieces: Vec<Arc<[u8]>>) -> Result<Self, CborError> {
        let mut header = Vec::new();
        Encoder::new(&mut header, &CborLimits::default()).array_header(len)?;
        Ok(Self { header, pieces })
    }

    /// Appends a piece of whole items.
    pub fn push(&mut self, piece: Arc<[u8]>) {
        self.pieces.push(piece);
    }

    /// The pieces after the header.
    pub fn pieces(&self) -> &[Arc<[u8]>] {
        &self.pieces
    }

    /// The array's length in bytes.
    pub fn encoded_len(&self) -> usize {
        self.header.len() + self.pieces.iter().map(|p| p.len()).sum::<usize>()
    }

    /// The array's CBOR as one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = self.header.clone();
        for piece in &self.pieces {
            out.extend_from_slice(piece);
        }
        out
    }
}

/// One encoded message in three parts: `head`, then `shared` (encoded
/// earlier, shared pieces), then `tail`.
#[derive(Debug, Clone)]
pub struct Spliced<'a> {
    head: Vec<u8>,
    shared: &'a [Arc<[u8]>],
    tail: Vec<u8>,
}

impl Spliced<'_> {
    /// The payload as one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        for piece in self.shared {
            out.extend_from_slice(piece);
        }
        out.extend_from_slice(&self.tail);
        out
    }

    /// The payload framed, holding the shared pieces rather than a copy
    /// ([`frame_shared`]).
    pub fn frame(&self, max_frame_len: u32) -> Result<Frame, FrameError> {
        frame_shared(&self.head, self.shared, &self.tail, max_frame_len)
    }
}

/// CBOR of one schema item, to splice into a list or message later
/// (the whole message's length is checked when it is built).
pub fn encode_item<T: Schema>(item: &T) -> Result<Vec<u8>, CborError> {
    encode_nested(item, 0)
}

/// CBOR of a session snapshot (as sent: normalised), to splice into
/// [`encode_session_response`] and [`encode_session_snapshot_event`]. Its
/// depth is counted from those messages, so that a transcript item's JSON
/// nested too deeply fails here as the normal encoding fails.
pub fn encode_session_snapshot(snapshot: &SessionSnapshot) -> Result<Vec<u8>, CborError> {
    encode_session_snapshot_shown(snapshot, Shown::of(snapshot))
}

/// [`encode_session_snapshot`] with the flags `shown` instead of the
/// snapshot's own (a server's normalisation for an audience), written
/// directly ([`super::direct`]).
pub fn encode_session_snapshot_shown(
    snapshot: &SessionSnapshot,
    shown: Shown,
) -> Result<Vec<u8>, CborError> {
    direct::encode_session_snapshot(snapshot, shown, SESSION_SNAPSHOT_DEPTH)
}

/// CBOR of a session snapshot (as sent: normalised) in three pieces to
/// splice like [`encode_session_snapshot_shown`]'s: the map up to its
/// transcript, the packed transcript itself (shared, not copied), the rest.
pub fn encode_packed_session_snapshot(
    head: &SessionSnapshot,
    transcript: &PackedTranscript,
    shown: Shown,
) -> Result<[Arc<[u8]>; 3], CborError> {
    let limits = CborLimits::default();
    let mut before = Vec::new();
    direct::write_session_snapshot_head(&mut Encoder::new(&mut before, &limits), head, shown)?;
    let mut after = Vec::new();
    let mut e = Encoder::new(&mut after, &limits);
    direct::write_session_snapshot_tail(&mut e, head, SESSION_SNAPSHOT_DEPTH)?;
    check_item_len(
        before.len() + transcript.cbor().len() + after.len(),
        &limits,
    )?;
    Ok([before.into(), transcript.cbor().clone(), after.into()])
}

/// CBOR of one schema item that messages nest `depth` containers deep.
fn encode_nested<T: Schema>(item: &T, depth: usize) -> Result<Vec<u8>, CborError> {
    let mut out = Vec::new();
    Encoder::new(&mut out, &CborLimits::default()).nested_item(&item.to_value(), depth)?;
    Ok(out)
}

/// Builds the CBOR of an array from items encoded now or earlier.
#[derive(Debug, Clone)]
pub struct ListBuilder {
    out: Vec<u8>,
}

impl ListBuilder {
    /// An array that will hold `len` items: exactly `len` must be pushed.
    pub fn new(len: usize) -> Result<Self, CborError> {
        Self::with_capacity(len, 0)
    }

    /// [`ListBuilder::new`] with room for `bytes` of items.
    pub fn with_capacity(len: usize, bytes: usize) -> Result<Self, CborError> {
        /// The longest array header.
        const HEADER_LEN: usize = 9;
        let mut out = Vec::with_capacity(HEADER_LEN + bytes);
        Encoder::new(&mut out, &CborLimits::default()).array_header(len)?;
        Ok(Self { out })
    }

    /// Items without the array's header, with room for `bytes` of them: a
    /// piece of an [`EncodedList`].
    pub fn headless(bytes: usize) -> Self {
        Self {
            out: Vec::with_capacity(bytes),
        }
    }

    /// Appends an item, encoding it now.
    pub fn push<T: Schema>(&mut self, item: &T) -> Result<(), CborError> {
        Encoder::new(&mut self.out, &CborLimits::default()).item(&item.to_value())
    }

    /// Appends a session list entry, written directly ([`super::direct`]).
    pub fn push_metadata(&mut self, meta: &SessionMetadata) -> Result<(), CborError> {
        direct::write_session_metadata(
            &mut Encoder::new(&mut self.out, &CborLimits::default()),
            meta,
        )
    }

    /// Appends an item encoded by [`encode_item`] or
    /// [`direct::encode_session_metadata`].
    pub fn push_encoded(&mut self, item: &[u8]) {
        self.out.extend_from_slice(item);
    }

    /// Bytes written so far.
    pub fn encoded_len(&self) -> usize {
        self.out.len()
    }

    /// The array's CBOR.
    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

/// CBOR of `items` as one array (for example a snapshot's `models`).
pub fn encode_list<T: Schema>(items: &[T]) -> Result<Vec<u8>, CborError> {
    let mut list = ListBuilder::new(items.len())?;
    for item in items {
        list.push(item)?;
    }
    Ok(list.finish())
}

/// `{type:"hello", version, connectionId, snapshot}`: a
/// [`crate::protocol::ServerMessage::Hello`] payload.
pub fn encode_hello<'a>(
    version: u64,
    connection_id: &str,
    snapshot: &EncodedSnapshot<'a>,
) -> Result<Spliced<'a>, SchemaError> {
    splice(
        snapshot.sessions.pieces(),
        |e| {
            e.map_header(4)?;
            e.text("type")?;
            e.text("hello")?;
            e.text("version")?;
            e.item(&uint_value(version))?;
            e.text("connectionId")?;
            e.text(connection_id)?;
            e.text("snapshot")?;
            snapshot_head(e, snapshot)
        },
        |e| snapshot_tail(e, snapshot),
    )
}

/// `{type:"event", event:{type:"server_snapshot", snapshot}}`: a
/// [`crate::protocol::ServerEvent::ServerSnapshot`] payload.
pub fn encode_server_snapshot_event<'a>(
    snapshot: &EncodedSnapshot<'a>,
) -> Result<Spliced<'a>, SchemaError> {
    splice(
        snapshot.sessions.pieces(),
        |e| {
            event_head(e, "server_snapshot")?;
            snapshot_head(e, snapshot)
        },
        |e| snapshot_tail(e, snapshot),
    )
}

/// `{type:"event", event:{type:"session_snapshot", snapshot}}`: a
/// [`crate::protocol::ServerEvent::SessionSnapshot`] payload, with
/// `snapshot` from [`encode_session_snapshot`].
pub fn encode_session_snapshot_event(snapshot: &[Arc<[u8]>]) -> Result<Spliced<'_>, SchemaError> {
    splice(snapshot, |e| event_head(e, "session_snapshot"), |_| Ok(()))
}

/// `{type:"response", id, ok:true, result:{command:"list", sessions}}`: the
/// response to `list`, with `sessions` the CBOR of the array.
pub fn encode_list_response<'a>(
    request_id: &str,
    sessions: &'a EncodedList,
) -> Result<Spliced<'a>, SchemaError> {
    response(
        request_id,
        "list",
        "sessions",
        &sessions.header,
        sessions.pieces(),
    )
}

/// `{type:"response", id, ok:true, result:{command, session}}`: the response
/// to `command` (`create`, `attach` or a control command, see
/// [`crate::protocol::CommandResult::name`]), with `session` from
/// [`encode_session_snapshot`].
pub fn encode_session_response<'a>(
    request_id: &str,
    command: &str,
    session: &'a [Arc<[u8]>],
) -> Result<Spliced<'a>, SchemaError> {
    response(request_id, command, "session", &[], session)
}

/// `{type:"response", id, ok:true, result:{command, <key>: item}}`, with the
/// item's CBOR `item_head` and then the `item` pieces.
fn response<'a>(
    request_id: &str,
    command: &str,
    key: &str,
    item_head: &[u8],
    item: &'a [Arc<[u8]>],
) -> Result<Spliced<'a>, SchemaError> {
    splice(
        item,
        |e| {
            e.map_header(4)?;
            e.text("type")?;
            e.text("response")?;
            e.text("id")?;
            e.text(request_id)?;
            e.text("ok")?;
            e.item(&Value::Bool(true))?;
            e.text("result")?;
            e.map_header(2)?;
            e.text("command")?;
            e.text(command)?;
            e.text(key)?;
            e.raw(item_head);
            Ok(())
        },
        |_| Ok(()),
    )
}

/// Writes `head` and `tail` around the `shared` pieces under the default
/// limits, and checks the whole length, as [`crate::wire::cbor::encode`] does.
fn splice<'a>(
    shared: &'a [Arc<[u8]>],
    head: impl FnOnce(&mut Encoder<'_, '_>) -> Result<(), CborError>,
    tail: impl FnOnce(&mut Encoder<'_, '_>) -> Result<(), CborError>,
) -> Result<Spliced<'a>, SchemaError> {
    /// Room for an envelope's keys and small values.
    const ENVELOPE_LEN: usize = 128;
    let limits = CborLimits::default();
    let mut spliced = Spliced {
        head: Vec::with_capacity(ENVELOPE_LEN),
        shared,
        tail: Vec::new(),
    };
    head(&mut Encoder::new(&mut spliced.head, &limits)).map_err(cbor_error)?;
    tail(&mut Encoder::new(&mut spliced.tail, &limits)).map_err(cbor_error)?;
    let shared_len: usize = shared.iter().map(|p| p.len()).sum();
    let len = spliced.head.len() + shared_len + spliced.tail.len();
    check_item_len(len, &limits).map_err(cbor_error)?;
    Ok(spliced)
}

/// `{type:"event", event:{type:<kind>, snapshot:` — the snapshot follows.
fn event_head(e: &mut Encoder<'_, '_>, kind: &str) -> Result<(), CborError> {
    e.map_header(2)?;
    e.text("type")?;
    e.text("event")?;
    e.text("event")?;
    e.map_header(2)?;
    e.text("type")?;
    e.text(kind)?;
    e.text("snapshot")
}

/// `{serverId, protocolVersion, revision, sessions:` — the sessions follow.
fn snapshot_head(e: &mut Encoder<'_, '_>, snapshot: &EncodedSnapshot<'_>) -> Result<(), CborError> {
    e.map_header(5)?;
    e.text("serverId")?;
    e.text(snapshot.server_id)?;
    e.text("protocolVersion")?;
    e.item(&uint_value(snapshot.protocol_version))?;
    e.text("revision")?;
    e.item(&uint_value(snapshot.revision))?;
    e.text("sessions")?;
    e.raw(&snapshot.sessions.header);
    Ok(())
}

/// `models}` — after the sessions.
fn snapshot_tail(e: &mut Encoder<'_, '_>, snapshot: &EncodedSnapshot<'_>) -> Result<(), CborError> {
    e.text("models")?;
    e.raw(snapshot.models);
    Ok(())
}
