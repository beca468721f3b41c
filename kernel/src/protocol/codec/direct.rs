//! Direct CBOR writers of the hot server messages: `session_progress`
//! events, session snapshots (of responses and snapshot events) and the
//! entries of the session list. They write the typed value straight to
//! bytes, without building the [`crate::wire::Value`] tree of
//! [`super::Schema::to_value`], and the bytes are exactly those the tree
//! path writes: keys in the same schema order (that of `items.rs` and
//! `messages.rs`), absent optionals omitted, numbers as [`super::uint_value`]
//! and [`crate::wire::Value::number`] map them, the same CBOR limits and the
//! same errors.
//!
//! The constant runs of a message (map headers, keys, discriminators) are
//! encoded at compile time ([`Run`]), so writing one is a single copy; only
//! the fields' values are encoded at run time.
//!
//! Like [`super::encode_trusted_server_message`] in release builds, the
//! writers do not check the schema: they are for messages a server builds
//! from validated parts. The server compares their output with the checked
//! tree path in debug builds, and `kernel/tests/protocol.rs` does on
//! arbitrary messages.

use crate::protocol::types::*;
use crate::wire::cbor::Encoder;
use crate::wire::{CborError, CborLimits};

/// The longest constant run.
const RUN_LEN_MAX: usize = 64;

/// One piece of a constant run.
#[derive(Clone, Copy)]
enum Piece {
    /// A map header of this many entries (fewer than 24).
    Map(usize),
    /// A text string shorter than 24 bytes.
    Text(&'static str),
}

/// Pre-encoded CBOR of a constant run of pieces.
struct Run {
    bytes: [u8; RUN_LEN_MAX],
    len: usize,
}

impl Run {
    fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Encodes `pieces` at compile time, in the shortest form (each head is one
/// byte, as every length is below 24).
const fn run(pieces: &[Piece]) -> Run {
    let mut bytes = [0u8; RUN_LEN_MAX];
    let mut len = 0;
    let mut i = 0;
    while i < pieces.len() {
        match pieces[i] {
            Piece::Map(entries) => {
                assert!(entries < 24, "a short map");
                bytes[len] = 0xa0 | entries as u8;
                len += 1;
            }
            Piece::Text(text) => {
                let text = text.as_bytes();
                assert!(text.len() < 24, "a short text");
                assert!(len + 1 + text.len() <= RUN_LEN_MAX, "a short run");
                bytes[len] = 0x60 | text.len() as u8;
                len += 1;
                let mut j = 0;
                while j < text.len() {
                    bytes[len] = text[j];
                    len += 1;
                    j += 1;
                }
            }
        }
        i += 1;
    }
    Run { bytes, len }
}

use Piece::{Map, Text};

/// Defines constant runs: `NAME = [pieces];`.
macro_rules! runs {
    ($($(#[$doc:meta])* $name:ident = [$($piece:expr),* $(,)?];)*) => {
        $($(#[$doc])* const $name: Run = run(&[$($piece),*]);)*
    };
}

runs! {
    /// `{type:"event", event:{type:"session_progress", sessionId:`
    PROGRESS_EVENT = [
        Map(2), Text("type"), Text("event"), Text("event"),
        Map(3), Text("type"), Text("session_progress"), Text("sessionId"),
    ];
    /// `progress:{type:"assistant_delta", messageId:`
    DELTA = [
        Text("progress"), Map(5), Text("type"), Text("assistant_delta"), Text("messageId"),
    ];
    /// `progress:{type:"item_started", item:`
    ITEM_STARTED = [Text("progress"), Map(2), Text("type"), Text("item_started"), Text("item")];
    /// `progress:{type:"item_updated", item:`
    ITEM_UPDATED = [Text("progress"), Map(2), Text("type"), Text("item_updated"), Text("item")];
    /// `progress:{type:"item_finished", item:`
    ITEM_FINISHED = [Text("progress"), Map(2), Text("type"), Text("item_finished"), Text("item")];
    CONTENT_INDEX = [Text("contentIndex")];
    KIND_TEXT = [Text("kind"), Text("text"), Text("delta")];
    KIND_THINKING = [Text("kind"), Text("thinking"), Text("delta")];
    KIND_TOOL_CALL = [Text("kind"), Text("toolCall"), Text("delta")];
    /// `{type:"text", text:`
    CONTENT_TEXT = [Map(2), Text("type"), Text("text"), Text("text")];
    CONTENT_THINKING = [Text("type"), Text("thinking"), Text("thinking")];
    CONTENT_IMAGE = [Map(3), Text("type"), Text("image"), Text("data")];
    CONTENT_TOOL_CALL = [Map(4), Text("type"), Text("toolCall"), Text("toolCallId")];
    REDACTED = [Text("redacted")];
    MIME_TYPE = [Text("mimeType")];
    TOOL_NAME = [Text("toolName")];
    INPUT = [Text("input")];
    ID = [Text("id")];
    ROLE_USER = [Text("role"), Text("user"), Text("content")];
    ROLE_ASSISTANT = [Text("role"), Text("assistant"), Text("content")];
    ROLE_TOOL = [Text("role"), Text("tool"), Text("toolCallId")];
    TIMESTAMP = [Text("timestamp")];
    MODEL = [Text("model")];
    RESPONSE_MODEL = [Text("responseModel")];
    USAGE = [Text("usage")];
    STATUS = [Text("status")];
    STOP_REASON = [Text("stopReason")];
    ERROR_MESSAGE = [Text("errorMessage")];
    CONTENT = [Text("content")];
    DETAILS = [Text("details")];
    IS_ERROR = [Text("isError")];
    /// `{provider:`
    MODEL_REF = [Map(2), Text("provider")];
    USAGE_INPUT = [Text("input")];
    USAGE_OUTPUT = [Text("output")];
    CACHE_READ = [Text("cacheRead")];
    CACHE_WRITE = [Text("cacheWrite")];
    REASONING = [Text("reasoning")];
    TOTAL_TOKENS = [Text("totalTokens")];
    /// `cost:{input:`
    USAGE_COST = [Text("cost"), Map(5), Text("input")];
    TOTAL = [Text("total")];
    CREATED_AT = [Text("createdAt")];
    UPDATED_AT = [Text("updatedAt")];
    PARENT_SESSION_ID = [Text("parentSessionId")];
    SESSION_NAME = [Text("sessionName")];
    CWD = [Text("cwd")];
    NAME = [Text("name")];
    PHASE = [Text("phase")];
    THINKING_LEVEL = [Text("thinkingLevel")];
    ATTACHED = [Text("attached")];
    LOCKED = [Text("locked")];
    REVISION = [Text("revision")];
    TRANSCRIPT = [Text("transcript")];
    QUEUED_STEER = [Text("queuedSteer")];
    QUEUED_STEER_COUNT = [Text("queuedSteerCount")];
    /// `{type:"response", id:`
    RESPONSE_ID = [Map(4), Text("type"), Text("response"), Text("id")];
    OK = [Text("ok")];
    /// `result:{command:`
    RESULT_COMMAND = [Text("result"), Map(2), Text("command")];
    SESSION_ID = [Text("sessionId")];
}

/// The longest head of a text or integer.
const HEAD_LEN_MAX: usize = 9;

/// How deep a `session_progress` event nests its progress map.
const PROGRESS_DEPTH: usize = 2;

/// Appends the payload of `{type:"event", event:{type:"session_progress",
/// sessionId, progress}}` (a [`ServerEvent::SessionProgress`] in a
/// [`ServerMessage::Event`]) to `out`, under the default [`CborLimits`].
///
/// On error `out` may hold part of the message: the caller discards it.
pub fn encode_progress_event(
    session_id: &str,
    progress: &TranscriptProgress,
    out: &mut Vec<u8>,
) -> Result<(), CborError> {
    out.reserve(progress_event_capacity(session_id, progress));
    let limits = CborLimits::default();
    let mut e = Encoder::new(out, &limits);
    e.raw(PROGRESS_EVENT.bytes());
    e.text(session_id)?;
    write_progress(&mut e, progress, PROGRESS_DEPTH)?;
    e.finish()
}

/// Appends the payload of a successful response whose result names only
/// a session, `{type:"response", id, ok:true, result:{command, sessionId}}`
/// (`detach` and `remove`: a [`CommandResult::Detach`] or
/// [`CommandResult::Remove`] in a [`ServerMessage::Response`]).
pub fn encode_session_id_response(
    request_id: &str,
    command: &str,
    session_id: &str,
    out: &mut Vec<u8>,
) -> Result<(), CborError> {
    let limits = CborLimits::default();
    let mut e = Encoder::new(out, &limits);
    e.raw(RESPONSE_ID.bytes());
    e.text(request_id)?;
    e.raw(OK.bytes());
    e.boolean(true);
    e.raw(RESULT_COMMAND.bytes());
    e.text(command)?;
    e.raw(SESSION_ID.bytes());
    e.text(session_id)?;
    e.finish()
}

/// Room for the payload of [`encode_session_id_response`].
pub fn session_id_response_capacity(request_id: &str, session_id: &str) -> usize {
    /// The constant runs, `true`, and the heads of the three texts (the
    /// command's name is short).
    const FIXED_LEN: usize = RESPONSE_ID.len
        + OK.len
        + 1
        + RESULT_COMMAND.len
        + SESSION_ID.len
        + "detach".len()
        + 3 * HEAD_LEN_MAX;
    FIXED_LEN + request_id.len() + session_id.len()
}

/// Room for the payload of [`encode_progress_event`]: enough for an
/// assistant delta (at most 36 bytes over), a first guess for an item.
pub fn progress_event_capacity(session_id: &str, progress: &TranscriptProgress) -> usize {
    /// The constant runs of an assistant delta event (the longest kind), the
    /// heads of its three texts and its content index.
    const DELTA_EVENT_LEN: usize =
        PROGRESS_EVENT.len + DELTA.len + CONTENT_INDEX.len + KIND_THINKING.len + 4 * HEAD_LEN_MAX;
    /// A first guess for an event carrying a transcript item.
    const ITEM_EVENT_LEN: usize = 512;
    match progress {
        TranscriptProgress::AssistantDelta {
            message_id, delta, ..
        } => DELTA_EVENT_LEN + session_id.len() + message_id.len() + delta.len(),
        _ => ITEM_EVENT_LEN + session_id.len(),
    }
}

/// `progress:` and the progress map at `depth`.
fn write_progress(
    e: &mut Encoder<'_, '_>,
    progress: &TranscriptProgress,
    depth: usize,
) -> Result<(), CborError> {
    let (head, item) = match progress {
        TranscriptProgress::AssistantDelta {
            message_id,
            content_index,
            kind,
            delta,
        } => {
            e.raw(DELTA.bytes());
            e.text(message_id)?;
            e.raw(CONTENT_INDEX.bytes());
            e.uint(*content_index)?;
            e.raw(match kind {
                DeltaKind::Text => KIND_TEXT.bytes(),
                DeltaKind::Thinking => KIND_THINKING.bytes(),
                DeltaKind::ToolCall => KIND_TOOL_CALL.bytes(),
            });
            return e.text(delta);
        }
        TranscriptProgress::ItemStarted { item } => (&ITEM_STARTED, item),
        TranscriptProgress::ItemUpdated { item } => (&ITEM_UPDATED, item),
        TranscriptProgress::ItemFinished { item } => (&ITEM_FINISHED, item),
    };
    e.raw(head.bytes());
    write_item(e, item, depth + 1)
}

/// The flags of a session snapshot as sent: a server shows a live session
/// `locked`, and `attached` relative to the audience.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// `attached` as sent.
    pub attached: bool,
    /// `locked` as sent.
    pub locked: bool,
}

impl Shown {
    /// The snapshot's own flags.
    pub fn of(snapshot: &SessionSnapshot) -> Self {
        Self {
            attached: snapshot.attached,
            locked: snapshot.locked,
        }
    }
}

/// CBOR of a session snapshot with its flags replaced by `shown`, that
/// messages nest `depth` containers deep (so that JSON nested too deeply
/// inside a transcript item fails as the whole message's encoding fails).
pub fn encode_session_snapshot(
    snapshot: &SessionSnapshot,
    shown: Shown,
    depth: usize,
) -> Result<Vec<u8>, CborError> {
    let mut out = Vec::new();
    let limits = CborLimits::default();
    let mut e = Encoder::new(&mut out, &limits);
    write_session_snapshot(&mut e, snapshot, shown, depth)?;
    e.finish()?;
    Ok(out)
}

/// Writes a session snapshot map at `depth`.
pub fn write_session_snapshot(
    e: &mut Encoder<'_, '_>,
    s: &SessionSnapshot,
    shown: Shown,
    depth: usize,
) -> Result<(), CborError> {
    write_session_snapshot_head(e, s, shown)?;
    write_transcript(e, &s.transcript, depth)?;
    write_session_snapshot_tail(e, s, depth)
}

/// Writes a session snapshot map at `depth` whose transcript is `transcript`,
/// the CBOR array [`write_transcript`] wrote for the same depth or a deeper
/// one; `head`'s own transcript is not written.
pub fn write_packed_session_snapshot(
    e: &mut Encoder<'_, '_>,
    head: &SessionSnapshot,
    transcript: &[u8],
    shown: Shown,
    depth: usize,
) -> Result<(), CborError> {
    write_session_snapshot_head(e, head, shown)?;
    e.raw(transcript);
    write_session_snapshot_tail(e, head, depth)
}

/// A session snapshot's map up to its `transcript` key (the array follows).
pub fn write_session_snapshot_head(
    e: &mut Encoder<'_, '_>,
    s: &SessionSnapshot,
    shown: Shown,
) -> Result<(), CborError> {
    e.map_header(13 + usize::from(s.name.is_some()))?;
    e.raw(ID.bytes());
    e.text(&s.id)?;
    optional_text(e, &NAME, s.name.as_deref())?;
    e.raw(CWD.bytes());
    e.text(&s.cwd)?;
    e.raw(CREATED_AT.bytes());
    e.uint(s.created_at)?;
    e.raw(UPDATED_AT.bytes());
    e.uint(s.updated_at)?;
    e.raw(PHASE.bytes());
    e.text(s.phase.as_str())?;
    e.raw(MODEL.bytes());
    write_model_ref(e, &s.model)?;
    e.raw(THINKING_LEVEL.bytes());
    e.text(s.thinking_level.as_str())?;
    e.raw(ATTACHED.bytes());
    e.boolean(shown.attached);
    e.raw(LOCKED.bytes());
    e.boolean(shown.locked);
    e.raw(REVISION.bytes());
    e.uint(s.revision)?;
    e.raw(TRANSCRIPT.bytes());
    Ok(())
}

/// A session snapshot's transcript array, for a snapshot at `depth`.
pub fn write_transcript(
    e: &mut Encoder<'_, '_>,
    transcript: &[TranscriptItem],
    depth: usize,
) -> Result<(), CborError> {
    e.array_header(transcript.len())?;
    for item in transcript {
        write_item(e, item, depth + 2)?;
    }
    Ok(())
}

/// A session snapshot's map after its transcript.
pub fn write_session_snapshot_tail(
    e: &mut Encoder<'_, '_>,
    s: &SessionSnapshot,
    depth: usize,
) -> Result<(), CborError> {
    e.raw(QUEUED_STEER.bytes());
    e.array_header(s.queued_steer.len())?;
    for item in &s.queued_steer {
        write_user_item(e, item, depth + 2)?;
    }
    e.raw(QUEUED_STEER_COUNT.bytes());
    e.uint(s.queued_steer_count)
}

/// CBOR of one entry of the session list, on its own.
pub fn encode_session_metadata(meta: &SessionMetadata) -> Result<Vec<u8>, CborError> {
    let mut out = Vec::new();
    let limits = CborLimits::default();
    let mut e = Encoder::new(&mut out, &limits);
    write_session_metadata(&mut e, meta)?;
    e.finish()?;
    Ok(out)
}

/// Writes one entry of the session list.
pub fn write_session_metadata(
    e: &mut Encoder<'_, '_>,
    meta: &SessionMetadata,
) -> Result<(), CborError> {
    let optionals = usize::from(meta.updated_at.is_some())
        + usize::from(meta.parent_session_id.is_some())
        + usize::from(meta.session_name.is_some())
        + usize::from(meta.cwd.is_some());
    e.map_header(2 + optionals)?;
    e.raw(ID.bytes());
    e.text(&meta.id)?;
    e.raw(CREATED_AT.bytes());
    e.uint(meta.created_at)?;
    if let Some(updated_at) = meta.updated_at {
        e.raw(UPDATED_AT.bytes());
        e.uint(updated_at)?;
    }
    optional_text(e, &PARENT_SESSION_ID, meta.parent_session_id.as_deref())?;
    optional_text(e, &SESSION_NAME, meta.session_name.as_deref())?;
    optional_text(e, &CWD, meta.cwd.as_deref())?;
    Ok(())
}

/// Writes a transcript item map at `depth`.
pub fn write_item(
    e: &mut Encoder<'_, '_>,
    item: &TranscriptItem,
    depth: usize,
) -> Result<(), CborError> {
    match item {
        TranscriptItem::User(item) => write_user_item(e, item, depth),
        TranscriptItem::Assistant(item) => write_assistant_item(e, item, depth),
        TranscriptItem::Tool(item) => write_tool_item(e, item, depth),
    }
}

fn write_user_item(
    e: &mut Encoder<'_, '_>,
    item: &UserItem,
    depth: usize,
) -> Result<(), CborError> {
    e.map_header(4)?;
    e.raw(ID.bytes());
    e.text(&item.id)?;
    e.raw(ROLE_USER.bytes());
    write_contents(e, &item.content, depth + 1)?;
    e.raw(TIMESTAMP.bytes());
    e.uint(item.timestamp)
}

fn write_assistant_item(
    e: &mut Encoder<'_, '_>,
    item: &AssistantItem,
    depth: usize,
) -> Result<(), CborError> {
    let stop_reason = match item.status {
        AssistantStatus::Streaming => None,
        AssistantStatus::Complete(StopReason::Stop) => Some("stop"),
        AssistantStatus::Complete(StopReason::Length) => Some("length"),
        AssistantStatus::Complete(StopReason::ToolUse) => Some("toolUse"),
        AssistantStatus::Error => Some("error"),
        AssistantStatus::Aborted => Some("aborted"),
    };
    let status = match item.status {
        AssistantStatus::Streaming => "streaming",
        AssistantStatus::Complete(_) => "complete",
        AssistantStatus::Error => "error",
        AssistantStatus::Aborted => "aborted",
    };
    let optionals = usize::from(item.response_model.is_some())
        + usize::from(item.usage.is_some())
        + usize::from(stop_reason.is_some())
        + usize::from(item.error_message.is_some());
    e.map_header(6 + optionals)?;
    e.raw(ID.bytes());
    e.text(&item.id)?;
    e.raw(ROLE_ASSISTANT.bytes());
    write_contents(e, &item.content, depth + 1)?;
    e.raw(MODEL.bytes());
    write_model_ref(e, &item.model)?;
    optional_text(e, &RESPONSE_MODEL, item.response_model.as_deref())?;
    if let Some(usage) = &item.usage {
        e.raw(USAGE.bytes());
        write_usage(e, usage)?;
    }
    e.raw(TIMESTAMP.bytes());
    e.uint(item.timestamp)?;
    e.raw(STATUS.bytes());
    e.text(status)?;
    if let Some(reason) = stop_reason {
        e.raw(STOP_REASON.bytes());
        e.text(reason)?;
    }
    optional_text(e, &ERROR_MESSAGE, item.error_message.as_deref())?;
    Ok(())
}

fn write_tool_item(
    e: &mut Encoder<'_, '_>,
    item: &ToolItem,
    depth: usize,
) -> Result<(), CborError> {
    let optionals = usize::from(item.details.is_some()) + usize::from(item.usage.is_some());
    e.map_header(9 + optionals)?;
    e.raw(ID.bytes());
    e.text(&item.id)?;
    e.raw(ROLE_TOOL.bytes());
    e.text(&item.tool_call_id)?;
    e.raw(TOOL_NAME.bytes());
    e.text(&item.tool_name)?;
    e.raw(INPUT.bytes());
    e.nested_item(&item.input, depth + 1)?;
    e.raw(CONTENT.bytes());
    write_contents(e, &item.content, depth + 1)?;
    if let Some(details) = &item.details {
        e.raw(DETAILS.bytes());
        e.nested_item(details, depth + 1)?;
    }
    if let Some(usage) = &item.usage {
        e.raw(USAGE.bytes());
        write_usage(e, usage)?;
    }
    e.raw(TIMESTAMP.bytes());
    e.uint(item.timestamp)?;
    e.raw(STATUS.bytes());
    e.text(match item.status {
        ToolStatus::Running => "running",
        ToolStatus::Complete => "complete",
        ToolStatus::Error => "error",
    })?;
    e.raw(IS_ERROR.bytes());
    e.boolean(item.status == ToolStatus::Error);
    Ok(())
}

/// Writes a content array at `depth`.
fn write_contents(
    e: &mut Encoder<'_, '_>,
    content: &[Content],
    depth: usize,
) -> Result<(), CborError> {
    e.array_header(content.len())?;
    for part in content {
        write_content(e, part, depth + 1)?;
    }
    Ok(())
}

/// Writes a content part map at `depth`.
fn write_content(e: &mut Encoder<'_, '_>, part: &Content, depth: usize) -> Result<(), CborError> {
    match part {
        Content::Text { text } => {
            e.raw(CONTENT_TEXT.bytes());
            e.text(text)
        }
        Content::Thinking {
            thinking, redacted, ..
        } => {
            e.map_header(2 + usize::from(redacted.is_some()))?;
            e.raw(CONTENT_THINKING.bytes());
            e.text(thinking)?;
            if let Some(redacted) = redacted {
                e.raw(REDACTED.bytes());
                e.boolean(*redacted);
            }
            Ok(())
        }
        Content::Image { data, mime_type } => {
            e.raw(CONTENT_IMAGE.bytes());
            e.text(data)?;
            e.raw(MIME_TYPE.bytes());
            e.text(mime_type)
        }
        Content::ToolCall {
            tool_call_id,
            tool_name,
            input,
        } => {
            e.raw(CONTENT_TOOL_CALL.bytes());
            e.text(tool_call_id)?;
            e.raw(TOOL_NAME.bytes());
            e.text(tool_name)?;
            e.raw(INPUT.bytes());
            e.nested_item(input, depth + 1)
        }
    }
}

/// Writes `key` and `value`'s text, when there is a value.
fn optional_text(e: &mut Encoder<'_, '_>, key: &Run, value: Option<&str>) -> Result<(), CborError> {
    if let Some(value) = value {
        e.raw(key.bytes());
        e.text(value)?;
    }
    Ok(())
}

fn write_model_ref(e: &mut Encoder<'_, '_>, model: &ModelRef) -> Result<(), CborError> {
    e.raw(MODEL_REF.bytes());
    e.text(&model.provider)?;
    e.raw(ID.bytes());
    e.text(&model.id)
}

fn write_usage(e: &mut Encoder<'_, '_>, usage: &Usage) -> Result<(), CborError> {
    e.map_header(6 + usize::from(usage.reasoning.is_some()))?;
    e.raw(USAGE_INPUT.bytes());
    e.uint(usage.input)?;
    e.raw(USAGE_OUTPUT.bytes());
    e.uint(usage.output)?;
    e.raw(CACHE_READ.bytes());
    e.uint(usage.cache_read)?;
    e.raw(CACHE_WRITE.bytes());
    e.uint(usage.cache_write)?;
    if let Some(reasoning) = usage.reasoning {
        e.raw(REASONING.bytes());
        e.uint(reasoning)?;
    }
    e.raw(TOTAL_TOKENS.bytes());
    e.uint(usage.total_tokens)?;
    let cost = &usage.cost;
    e.raw(USAGE_COST.bytes());
    e.number(cost.input)?;
    e.raw(USAGE_OUTPUT.bytes());
    e.number(cost.output)?;
    e.raw(CACHE_READ.bytes());
    e.number(cost.cache_read)?;
    e.raw(CACHE_WRITE.bytes());
    e.number(cost.cache_write)?;
    e.raw(TOTAL.bytes());
    e.number(cost.total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Value;

    /// A delta event fits the room reserved for it: one allocation.
    #[test]
    fn delta_events_fit_their_capacity() {
        for kind in [DeltaKind::Text, DeltaKind::Thinking, DeltaKind::ToolCall] {
            for len in [0, 23, 24, 255, 256, 70_000] {
                let progress = TranscriptProgress::AssistantDelta {
                    message_id: "m".repeat(len),
                    content_index: u64::MAX >> 12,
                    kind,
                    delta: "d".repeat(len),
                };
                let session_id = "s".repeat(len + 1);
                let mut out = Vec::new();
                encode_progress_event(&session_id, &progress, &mut out).unwrap();
                assert!(out.len() <= progress_event_capacity(&session_id, &progress));
            }
        }
    }

    /// A constant run is what the encoder writes for the same pieces.
    #[test]
    fn runs_are_the_encoders_bytes() {
        let value = Value::Map(vec![(
            "type".into(),
            Value::Map(vec![("session_progress".into(), Value::Text("x".into()))]),
        )]);
        let mut out = Vec::new();
        crate::wire::cbor::encode(&value, &mut out).unwrap();
        let head = run(&[
            Map(1),
            Text("type"),
            Map(1),
            Text("session_progress"),
            Text("x"),
        ]);
        assert_eq!(head.bytes(), &out[..]);
    }
}
