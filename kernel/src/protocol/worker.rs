//! The private channel between the server and its worker processes.
//!
//! Framed like the client protocol (u32 length + one strict CBOR item) with
//! its own small message set and version. Every frame is a map discriminated
//! by `type`. Session data inside (snapshots, progress, errors) uses the
//! client protocol's own schemas, so a worker cannot send the server anything
//! a client would reject.
//!
//! Order on a fresh channel: the worker sends [`WorkerFrame::Hello`] with the
//! token it was spawned with; the server answers [`WorkerFrame::Start`];
//! then [`ToWorker`] and [`FromWorker`] frames flow.
//!
//! An orphaned worker (its server was replaced or died) announces itself to
//! the next server with a hello carrying `resume` (its current snapshot); the
//! server answers [`WorkerFrame::Adopted`] or [`WorkerFrame::Rejected`].
//!
//! A new server taking over sends [`WorkerFrame::Replace`] on the old
//! server's worker socket; the old server releases its workers, closes its
//! clients and answers [`WorkerFrame::Released`] just before it exits.

use super::codec::{
    Fields, MapBuilder, Path, Schema, SchemaError, direct, read_id, read_list, read_object,
    read_string, read_uint,
};
use super::packed::{PackedSnapshot, PackedTranscript};
use super::types::{
    AssistantStatus, Content, ModelRef, ProtocolError, SessionSnapshot, ThinkingLevel,
    TranscriptItem, TranscriptProgress,
};
use crate::approval::{ApprovalPolicy, Approvals, Decision, Question};
use crate::ids::OpId;
use crate::wire::{CborLimits, Value, cbor};
use crate::worker::{CreateSpec, FromWorker, Operation, ToWorker};

/// Version of the worker channel. 3: a snapshot's transcript may be a tail
/// (`from`: the items before it are those of the worker's earlier
/// snapshots on the channel); a frame without `from` carries it whole, as
/// every frame of versions 1 and 2 does. 4: `approvals` frames and the
/// `answer` and `set_approvals` operations.
pub const WORKER_PROTOCOL_VERSION: u64 = 4;

/// The first version with [`ToWorker::Snapshot`]: a server sends it only to
/// workers that said hello with this version or a later one.
pub const SNAPSHOT_REQUEST_VERSION: u64 = 2;

/// Every frame of the worker channel.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerFrame {
    /// Worker → server, first: who it is and the token it was given.
    Hello {
        /// [`WORKER_PROTOCOL_VERSION`].
        version: u64,
        /// Secret passed at spawn.
        token: String,
        /// The session it hosts.
        session_id: String,
        /// Its process id.
        pid: u64,
        /// Set by an orphan announcing itself for adoption: its session as it stands.
        resume: Option<Box<PackedSnapshot>>,
    },
    /// Server → orphan: adopted; operations may follow.
    Adopted,
    /// Server → orphan: not adopted.
    Rejected {
        /// Why.
        reason: String,
    },
    /// New server → old server: hand over and exit.
    Replace {
        /// [`WORKER_PROTOCOL_VERSION`].
        version: u64,
    },
    /// Old server → new server: every worker is released; the sockets are free.
    Released {
        /// The sessions whose workers were released (they will announce themselves).
        sessions: Vec<String>,
    },
    /// Server → worker, after a valid hello: open the session (or create it).
    Start {
        /// Set to create a new session.
        create: Option<CreateSpec>,
        /// The highest session revision this server has shown for it: the
        /// worker starts above it, even if its store is behind (a full store
        /// kept the last revision from being written).
        revision_floor: u64,
    },
    /// Server → worker.
    ToWorker(ToWorker),
    /// Worker → server.
    FromWorker(FromWorker),
}

fn text(s: &str) -> Value {
    Value::Text(s.to_string())
}

fn read_thinking(value: &Value, path: &Path<'_>) -> Result<ThinkingLevel, SchemaError> {
    let s = read_string(value, path)?;
    ThinkingLevel::parse(&s)
        .ok_or_else(|| SchemaError::new(format!("{path}: unknown thinking level {s:?}")))
}

fn create_to_value(spec: &CreateSpec) -> Value {
    MapBuilder::with_capacity(4)
        .put_opt("cwd", spec.cwd.as_deref().map(text))
        .put_opt("name", spec.name.as_deref().map(text))
        .put_opt("model", spec.model.as_ref().map(Schema::to_value))
        .put_opt(
            "thinkingLevel",
            spec.thinking_level.map(|l| text(l.as_str())),
        )
        .build()
}

fn create_from_value(value: &Value, path: &Path<'_>) -> Result<CreateSpec, SchemaError> {
    let f = Fields::new(value, path, &["cwd", "name", "model", "thinkingLevel"])?;
    Ok(CreateSpec {
        cwd: f.optional("cwd", read_string)?,
        name: f.optional("name", read_string)?,
        model: f.optional("model", ModelRef::from_value_at)?,
        thinking_level: f.optional("thinkingLevel", read_thinking)?,
    })
}

fn operation_to_value(op: &Operation) -> Value {
    let b = MapBuilder::with_capacity(2).put("kind", text(op.name()));
    match op {
        Operation::Prompt { text: t, images } => {
            let b = b.put("text", text(t));
            match images.is_empty() {
                true => b,
                false => b.put(
                    "images",
                    Value::Array(images.iter().map(Schema::to_value).collect()),
                ),
            }
        }
        Operation::Steer { text: t } => b.put("text", text(t)),
        Operation::Abort => b,
        Operation::Compact { instructions } => {
            b.put_opt("instructions", instructions.as_deref().map(text))
        }
        Operation::SetModel { model } => b.put("model", model.to_value()),
        Operation::SetThinking { level } => b.put("thinkingLevel", text(level.as_str())),
        Operation::Rename { name } => b.put("name", text(name)),
        Operation::SetMcpServers { servers } => b.put("mcpServers", servers.clone()),
        Operation::Answer { id, decision } => b
            .put("id", text(id))
            .put("decision", text(decision.as_str())),
        Operation::SetApprovals { policy } => b.put_opt("policy", policy.map(|p| text(p.as_str()))),
    }
    .build()
}

fn read_policy(value: &Value, path: &Path<'_>) -> Result<ApprovalPolicy, SchemaError> {
    let s = read_string(value, path)?;
    ApprovalPolicy::parse(&s).ok_or_else(|| {
        SchemaError::new(format!(
            "{path}: unknown approval policy {s:?}; the policies are {}",
            ApprovalPolicy::NAMES
        ))
    })
}

fn read_decision(value: &Value, path: &Path<'_>) -> Result<Decision, SchemaError> {
    let s = read_string(value, path)?;
    Decision::parse(&s).ok_or_else(|| {
        SchemaError::new(format!(
            "{path}: unknown decision {s:?}; it is allow, always or deny"
        ))
    })
}

/// A question's tree: `{id, callId, tool, input, askedAt}`.
fn question_to_value(q: &Question) -> Value {
    MapBuilder::with_capacity(5)
        .put("id", text(&q.id))
        .put("callId", text(&q.call_id))
        .put("tool", text(&q.tool))
        .put("input", q.input.clone())
        .put("askedAt", Value::Int(q.asked_at as i64))
        .build()
}

fn question_from_value(value: &Value, path: &Path<'_>) -> Result<Question, SchemaError> {
    let f = Fields::new(value, path, &["id", "callId", "tool", "input", "askedAt"])?;
    Ok(Question {
        id: f.required("id", read_string)?,
        call_id: f.required("callId", read_string)?,
        tool: f.required("tool", read_string)?,
        input: f.required("input", |v, _| Ok(v.clone()))?,
        asked_at: f.required("askedAt", read_uint)?,
    })
}

/// A session's approvals as a tree: `{policy?, always, pending}`, on the
/// worker channel, in the store, and (with the policy in force) in our v8
/// service's state.
impl Schema for Approvals {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(3)
            .put_opt("policy", self.policy.map(|p| text(p.as_str())))
            .put(
                "always",
                Value::Array(self.always.iter().map(|t| text(t)).collect()),
            )
            .put(
                "pending",
                Value::Array(self.pending.iter().map(question_to_value).collect()),
            )
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["policy", "always", "pending"])?;
        Ok(Self {
            policy: f.optional("policy", read_policy)?,
            always: f.required("always", |v, p| read_list(v, p, read_string))?,
            pending: f.required("pending", |v, p| read_list(v, p, question_from_value))?,
        })
    }
}

fn operation_from_value(value: &Value, path: &Path<'_>) -> Result<Operation, SchemaError> {
    let kind = value.get("kind").and_then(|k| match k {
        Value::Text(s) => Some(s.as_str()),
        _ => None,
    });
    let op = match kind {
        Some("prompt") => {
            let f = Fields::new(value, path, &["kind", "text", "images"])?;
            let images = f
                .optional("images", |v, p| read_list(v, p, Content::from_value_at))?
                .unwrap_or_default();
            if let Some(i) = images
                .iter()
                .position(|c| !matches!(c, Content::Image { .. }))
            {
                return Err(SchemaError::at(
                    path,
                    format!("images[{i}] is not an image part"),
                ));
            }
            Operation::Prompt {
                text: f.required("text", read_string)?,
                images,
            }
        }
        Some("steer") => {
            let f = Fields::new(value, path, &["kind", "text"])?;
            Operation::Steer {
                text: f.required("text", read_string)?,
            }
        }
        Some("abort") => {
            Fields::new(value, path, &["kind"])?;
            Operation::Abort
        }
        Some("compact") => {
            let f = Fields::new(value, path, &["kind", "instructions"])?;
            Operation::Compact {
                instructions: f.optional("instructions", read_string)?,
            }
        }
        Some("set_model") => {
            let f = Fields::new(value, path, &["kind", "model"])?;
            Operation::SetModel {
                model: f.required("model", ModelRef::from_value_at)?,
            }
        }
        Some("set_thinking") => {
            let f = Fields::new(value, path, &["kind", "thinkingLevel"])?;
            Operation::SetThinking {
                level: f.required("thinkingLevel", read_thinking)?,
            }
        }
        Some("rename") => {
            let f = Fields::new(value, path, &["kind", "name"])?;
            Operation::Rename {
                name: f.required("name", read_string)?,
            }
        }
        Some("answer") => {
            let f = Fields::new(value, path, &["kind", "id", "decision"])?;
            Operation::Answer {
                id: f.required("id", read_string)?,
                decision: f.required("decision", read_decision)?,
            }
        }
        Some("set_approvals") => {
            let f = Fields::new(value, path, &["kind", "policy"])?;
            Operation::SetApprovals {
                policy: f.optional("policy", read_policy)?,
            }
        }
        Some("set_mcp_servers") => {
            let f = Fields::new(value, path, &["kind", "mcpServers"])?;
            Operation::SetMcpServers {
                servers: f.required("mcpServers", read_object)?,
            }
        }
        other => {
            return Err(SchemaError::new(format!(
                "{path}: unknown operation kind {other:?}"
            )));
        }
    };
    Ok(op)
}

impl Schema for WorkerFrame {
    fn to_value(&self) -> Value {
        match self {
            Self::Hello {
                version,
                token,
                session_id,
                pid,
                resume,
            } => MapBuilder::with_capacity(6)
                .put("type", text("hello"))
                .put("version", Value::Int(*version as i64))
                .put("token", text(token))
                .put("sessionId", text(session_id))
                .put("pid", Value::Int(*pid as i64))
                .put_opt("resume", resume.as_deref().map(packed_to_value))
                .build(),
            Self::Adopted => MapBuilder::with_capacity(1)
                .put("type", text("adopted"))
                .build(),
            Self::Rejected { reason } => MapBuilder::with_capacity(2)
                .put("type", text("rejected"))
                .put("reason", text(reason))
                .build(),
            Self::Replace { version } => MapBuilder::with_capacity(2)
                .put("type", text("replace"))
                .put("version", Value::Int(*version as i64))
                .build(),
            Self::Released { sessions } => MapBuilder::with_capacity(2)
                .put("type", text("released"))
                .put(
                    "sessions",
                    Value::Array(sessions.iter().map(|s| text(s)).collect()),
                )
                .build(),
            Self::Start {
                create,
                revision_floor,
            } => MapBuilder::with_capacity(3)
                .put("type", text("start"))
                .put_opt("create", create.as_ref().map(create_to_value))
                .put_opt(
                    "revisionFloor",
                    (*revision_floor > 0).then_some(Value::Int(*revision_floor as i64)),
                )
                .build(),
            Self::ToWorker(ToWorker::Operation { op, operation }) => MapBuilder::with_capacity(3)
                .put("type", text("operation"))
                .put("op", Value::Int(op.0 as i64))
                .put("operation", operation_to_value(operation))
                .build(),
            Self::ToWorker(ToWorker::Dispose) => MapBuilder::with_capacity(1)
                .put("type", text("dispose"))
                .build(),
            Self::ToWorker(ToWorker::Snapshot) => MapBuilder::with_capacity(1)
                .put("type", text("send_snapshot"))
                .build(),
            Self::FromWorker(m) => from_worker_to_value(m),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let kind = match value.get("type") {
            Some(Value::Text(s)) => s.as_str(),
            _ => return Err(SchemaError::new(format!("{path}: missing frame type"))),
        };
        let frame = match kind {
            "hello" => {
                let f = Fields::new(
                    value,
                    path,
                    &["type", "version", "token", "sessionId", "pid", "resume"],
                )?;
                Self::Hello {
                    version: f.required("version", read_uint)?,
                    token: f.required("token", read_string)?,
                    session_id: f.required("sessionId", read_id)?,
                    pid: f.required("pid", read_uint)?,
                    resume: f.optional("resume", packed_from_value)?.map(Box::new),
                }
            }
            "adopted" => {
                Fields::new(value, path, &["type"])?;
                Self::Adopted
            }
            "rejected" => {
                let f = Fields::new(value, path, &["type", "reason"])?;
                Self::Rejected {
                    reason: f.required("reason", read_string)?,
                }
            }
            "replace" => {
                let f = Fields::new(value, path, &["type", "version"])?;
                Self::Replace {
                    version: f.required("version", read_uint)?,
                }
            }
            "released" => {
                let f = Fields::new(value, path, &["type", "sessions"])?;
                // Optional on the wire: a server that released nothing may omit it.
                let sessions = f.optional("sessions", |v, p| read_list(v, p, read_id))?;
                Self::Released {
                    sessions: sessions.unwrap_or_default(),
                }
            }
            "start" => {
                let f = Fields::new(value, path, &["type", "create", "revisionFloor"])?;
                Self::Start {
                    create: f.optional("create", create_from_value)?,
                    revision_floor: f.optional("revisionFloor", read_uint)?.unwrap_or(0),
                }
            }
            "operation" => {
                let f = Fields::new(value, path, &["type", "op", "operation"])?;
                Self::ToWorker(ToWorker::Operation {
                    op: OpId(f.required("op", read_uint)?),
                    operation: f.required("operation", operation_from_value)?,
                })
            }
            "dispose" => {
                Fields::new(value, path, &["type"])?;
                Self::ToWorker(ToWorker::Dispose)
            }
            "send_snapshot" => {
                Fields::new(value, path, &["type"])?;
                Self::ToWorker(ToWorker::Snapshot)
            }
            _ => Self::FromWorker(from_worker_from_value(kind, value, path)?),
        };
        Ok(frame)
    }
}

/// The tree of a packed snapshot: that of the typed one.
fn packed_to_value(snapshot: &PackedSnapshot) -> Value {
    match snapshot.unpack() {
        Ok(snapshot) => snapshot.to_value(),
        // Packed by this kernel or checked when decoded: it unpacks.
        Err(error) => unreachable!("a packed transcript that does not decode: {error}"),
    }
}

fn packed_from_value(value: &Value, path: &Path<'_>) -> Result<PackedSnapshot, SchemaError> {
    tail_from_value(value, path, 0)
}

/// A snapshot whose transcript holds the session's items from `from` on.
fn tail_from_value(
    value: &Value,
    path: &Path<'_>,
    from: u64,
) -> Result<PackedSnapshot, SchemaError> {
    let snapshot = SessionSnapshot::from_value_at(value, path)?;
    let from = usize::try_from(from)
        .map_err(|_| SchemaError::new(format!("{path}: transcript position out of range")))?;
    PackedSnapshot::pack_tail(snapshot, from).map_err(|e| SchemaError::new(format!("{path}: {e}")))
}

/// A frame's `from`: where its snapshot's transcript starts, if not at the beginning.
fn tail_from(snapshot: &PackedSnapshot) -> Option<Value> {
    let from = snapshot.transcript().from();
    (from > 0).then_some(Value::Int(from as i64))
}

fn from_worker_to_value(m: &FromWorker) -> Value {
    match m {
        FromWorker::Ready { snapshot } => MapBuilder::with_capacity(2)
            .put("type", text("ready"))
            .put("snapshot", packed_to_value(snapshot)),
        FromWorker::Failed { error } => MapBuilder::with_capacity(2)
            .put("type", text("failed"))
            .put("error", error.to_value()),
        FromWorker::Snapshot { snapshot } => MapBuilder::with_capacity(3)
            .put("type", text("snapshot"))
            .put_opt("from", tail_from(snapshot))
            .put("snapshot", packed_to_value(snapshot)),
        FromWorker::Progress { progress } => MapBuilder::with_capacity(2)
            .put("type", text("progress"))
            .put("progress", progress.to_value()),
        FromWorker::OpDone { op, outcome } => {
            let b = MapBuilder::with_capacity(4)
                .put("type", text("op_done"))
                .put("op", Value::Int(op.0 as i64));
            match outcome {
                Ok(snapshot) => b
                    .put_opt("from", tail_from(snapshot))
                    .put("session", packed_to_value(snapshot)),
                Err(error) => b.put("error", error.to_value()),
            }
        }
        FromWorker::Fatal { message } => MapBuilder::with_capacity(2)
            .put("type", text("fatal"))
            .put("message", text(message)),
        FromWorker::Approvals { approvals, policy } => MapBuilder::with_capacity(3)
            .put("type", text("approvals"))
            .put("approvals", approvals.to_value())
            .put("policy", text(policy.as_str())),
    }
    .build()
}

fn from_worker_from_value(
    kind: &str,
    value: &Value,
    path: &Path<'_>,
) -> Result<FromWorker, SchemaError> {
    let m = match kind {
        "ready" => {
            let f = Fields::new(value, path, &["type", "snapshot"])?;
            FromWorker::Ready {
                snapshot: f.required("snapshot", packed_from_value)?,
            }
        }
        "failed" => {
            let f = Fields::new(value, path, &["type", "error"])?;
            FromWorker::Failed {
                error: f.required("error", ProtocolError::from_value_at)?,
            }
        }
        "snapshot" => {
            let f = Fields::new(value, path, &["type", "from", "snapshot"])?;
            let from = f.optional("from", read_uint)?.unwrap_or(0);
            FromWorker::Snapshot {
                snapshot: f.required("snapshot", |v, p| tail_from_value(v, p, from))?,
            }
        }
        "progress" => {
            let f = Fields::new(value, path, &["type", "progress"])?;
            FromWorker::Progress {
                progress: f.required("progress", TranscriptProgress::from_value_at)?,
            }
        }
        "op_done" => {
            let f = Fields::new(value, path, &["type", "op", "from", "session", "error"])?;
            let op = OpId(f.required("op", read_uint)?);
            let from = f.optional("from", read_uint)?.unwrap_or(0);
            let session = f.optional("session", |v, p| tail_from_value(v, p, from))?;
            let error = f.optional("error", ProtocolError::from_value_at)?;
            let outcome = match (session, error) {
                (Some(s), None) => Ok(s),
                (None, Some(e)) => Err(e),
                _ => {
                    return Err(SchemaError::new(format!(
                        "{path}: op_done needs exactly one of session and error"
                    )));
                }
            };
            FromWorker::OpDone { op, outcome }
        }
        "fatal" => {
            let f = Fields::new(value, path, &["type", "message"])?;
            FromWorker::Fatal {
                message: f.required("message", read_string)?,
            }
        }
        "approvals" => {
            let f = Fields::new(value, path, &["type", "approvals", "policy"])?;
            FromWorker::Approvals {
                approvals: f.required("approvals", Approvals::from_value_at)?,
                policy: f.required("policy", read_policy)?,
            }
        }
        other => {
            return Err(SchemaError::new(format!(
                "{path}: unknown worker frame type {other:?}"
            )));
        }
    };
    Ok(m)
}

/// Encodes a worker-channel frame payload (no length header).
///
/// A frame carrying a snapshot from the worker (`ready`, `snapshot`, a
/// successful `op_done`) is written directly ([`direct::write_session_snapshot`]),
/// the same bytes as the tree path without building the tree: the worker
/// sends its whole snapshot a few times each turn.
pub fn encode_worker_frame(frame: &WorkerFrame) -> Result<Vec<u8>, SchemaError> {
    if let Some(snapshot) = SnapshotFrame::of(frame) {
        let mut out = Vec::new();
        let limits = CborLimits::default();
        let mut e = cbor::Encoder::new(&mut out, &limits);
        snapshot
            .write(&mut e)
            .and_then(|()| e.finish())
            .map_err(|e| SchemaError::new(e.to_string()))?;
        return Ok(out);
    }
    let mut out = Vec::new();
    cbor::encode(&frame.to_value(), &mut out).map_err(|e| SchemaError::new(e.to_string()))?;
    Ok(out)
}

/// A worker frame whose last field is a session snapshot.
struct SnapshotFrame<'f> {
    kind: &'static str,
    op: Option<OpId>,
    key: &'static str,
    snapshot: &'f PackedSnapshot,
}

impl<'f> SnapshotFrame<'f> {
    fn of(frame: &'f WorkerFrame) -> Option<Self> {
        let (kind, op, key, snapshot) = match frame {
            WorkerFrame::FromWorker(FromWorker::Ready { snapshot }) => {
                ("ready", None, "snapshot", snapshot)
            }
            WorkerFrame::FromWorker(FromWorker::Snapshot { snapshot }) => {
                ("snapshot", None, "snapshot", snapshot)
            }
            WorkerFrame::FromWorker(FromWorker::OpDone {
                op,
                outcome: Ok(snapshot),
            }) => ("op_done", Some(*op), "session", snapshot),
            _ => return None,
        };
        Some(Self {
            kind,
            op,
            key,
            snapshot,
        })
    }

    /// The frame's map, keys in [`from_worker_to_value`]'s order; the
    /// snapshot one container deep.
    fn write(&self, e: &mut cbor::Encoder<'_, '_>) -> Result<(), cbor::CborError> {
        let from = self.snapshot.transcript().from();
        e.map_header(2 + usize::from(self.op.is_some()) + usize::from(from > 0))?;
        e.text("type")?;
        e.text(self.kind)?;
        if let Some(op) = self.op {
            e.text("op")?;
            e.uint(op.0)?;
        }
        if from > 0 {
            e.text("from")?;
            e.uint(from as u64)?;
        }
        e.text(self.key)?;
        let head = self.snapshot.head();
        let transcript = self.snapshot.transcript().cbor();
        direct::write_packed_session_snapshot(e, head, transcript, direct::Shown::of(head), 1)
    }
}

/// Encodes a worker-channel frame with its length prefix, ready to write.
pub fn frame_worker_message(frame: &WorkerFrame) -> Result<Vec<u8>, SchemaError> {
    let payload = encode_worker_frame(frame)?;
    crate::wire::frame::encode_frame(&payload, crate::wire::frame::DEFAULT_MAX_FRAME_LEN)
        .map_err(|e| SchemaError::new(e.to_string()))
}

/// Decodes a worker-channel frame payload.
///
/// A snapshot's transcript (under `snapshot`, `session` or `resume`) is
/// checked item by item as the CBOR is decoded ([`cbor::decode_streaming`])
/// and kept as its bytes ([`PackedTranscript`]): the frame is never one
/// [`Value`] tree, and no typed transcript is built. The checks and the
/// error texts are the tree's, one level of nesting stricter (so that every
/// part can go on to clients); a frame with errors both inside and outside
/// its transcript reports the one outside.
pub fn decode_worker_frame(
    payload: &[u8],
    limits: &CborLimits,
) -> Result<WorkerFrame, SchemaError> {
    // A frame nests its snapshot (and its progress) one level less deep
    // than the client messages that carry them on: what decodes here must
    // fit there too.
    let limits = &CborLimits {
        max_depth: limits.max_depth.saturating_sub(1),
        ..*limits
    };
    let outer = std::cell::Cell::new("");
    let at = |key: &str, inner: &str| {
        let snapshot = match key {
            "snapshot" => "snapshot",
            "session" => "session",
            "resume" => "resume",
            _ => return false,
        };
        outer.set(snapshot);
        inner == "transcript"
    };
    let mut items = 0;
    let mut span: Option<std::ops::Range<usize>> = None;
    let mut ends = Vec::new();
    let mut newest_reply: Option<AssistantStatus> = None;
    let mut item_error = None;
    let mut element = |index: usize, _: usize, value: Value, bytes: std::ops::Range<usize>| {
        if item_error.is_some() {
            return;
        }
        let root = Path::Root("");
        let snapshot = root.key(outer.get());
        let transcript = snapshot.key("transcript");
        match TranscriptItem::from_value_at(&value, &transcript.index(index)) {
            Ok(item) => {
                if let TranscriptItem::Assistant(reply) = &item {
                    newest_reply = Some(reply.status);
                }
                items += 1;
                span.get_or_insert(bytes.start..bytes.start).end = bytes.end;
                ends.push(bytes.end);
            }
            Err(error) => item_error = Some(error),
        }
    };
    let value = cbor::decode_streaming(payload, limits, &at, &mut element)
        .map_err(|e| SchemaError::new(e.to_string()))?;
    let mut frame = WorkerFrame::from_value(&value, "")?;
    drop(value);
    if let Some(error) = item_error {
        return Err(error);
    }
    match frame_snapshot(&mut frame) {
        Some(snapshot) => {
            let mut header = Vec::new();
            cbor::Encoder::new(&mut header, limits)
                .array_header(items)
                .map_err(|e| SchemaError::new(e.to_string()))?;
            let span = span.unwrap_or_default();
            // Where each item ends in the array below.
            let ends = ends
                .into_iter()
                .map(|end| header.len() + end - span.start)
                .collect();
            // One allocation of the exact size, no intermediate buffer.
            let cbor = header.iter().chain(&payload[span]).copied().collect();
            let from = snapshot.transcript().from();
            snapshot.set_transcript(PackedTranscript::decoded(cbor, from, ends, newest_reply));
        }
        None => debug_assert!(items == 0, "a transcript outside a snapshot"),
    }
    Ok(frame)
}

/// The session snapshot a frame carries, if any.
fn frame_snapshot(frame: &mut WorkerFrame) -> Option<&mut PackedSnapshot> {
    match frame {
        WorkerFrame::Hello {
            resume: Some(snapshot),
            ..
        } => Some(snapshot),
        WorkerFrame::FromWorker(
            FromWorker::Ready { snapshot }
            | FromWorker::Snapshot { snapshot }
            | FromWorker::OpDone {
                outcome: Ok(snapshot),
                ..
            },
        ) => Some(snapshot),
        _ => None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::protocol::{ErrorCode, SessionPhase};

    /// A snapshot with no transcript (`packed.rs`'s tests build on it).
    pub(in crate::protocol) fn snapshot() -> SessionSnapshot {
        SessionSnapshot {
            id: "s".into(),
            name: None,
            cwd: "/w".into(),
            created_at: 1,
            updated_at: 2,
            phase: SessionPhase::Idle,
            model: ModelRef {
                provider: "faux".into(),
                id: "faux-1".into(),
            },
            thinking_level: ThinkingLevel::Off,
            attached: false,
            locked: true,
            revision: 3,
            transcript: vec![],
            queued_steer: vec![],
            queued_steer_count: 0,
        }
    }

    fn packed(snapshot: SessionSnapshot) -> PackedSnapshot {
        PackedSnapshot::pack(snapshot).expect("packs")
    }

    #[test]
    fn every_frame_round_trips() {
        let frames = vec![
            WorkerFrame::Hello {
                version: 1,
                token: "t".into(),
                session_id: "s".into(),
                pid: 42,
                resume: None,
            },
            WorkerFrame::Hello {
                version: 1,
                token: String::new(),
                session_id: "s".into(),
                pid: 42,
                resume: Some(Box::new(packed(snapshot()))),
            },
            WorkerFrame::Adopted,
            WorkerFrame::Rejected {
                reason: "already live".into(),
            },
            WorkerFrame::Replace { version: 1 },
            WorkerFrame::Released {
                sessions: vec!["s1".into(), "s2".into()],
            },
            WorkerFrame::Start {
                create: None,
                revision_floor: 0,
            },
            WorkerFrame::Start {
                create: None,
                revision_floor: 41,
            },
            WorkerFrame::Start {
                revision_floor: 0,
                create: Some(CreateSpec {
                    cwd: Some("/w".into()),
                    name: Some("n".into()),
                    model: Some(ModelRef {
                        provider: "p".into(),
                        id: "m".into(),
                    }),
                    thinking_level: Some(ThinkingLevel::High),
                }),
            },
            WorkerFrame::ToWorker(ToWorker::Dispose),
            WorkerFrame::ToWorker(ToWorker::Snapshot),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(7),
                operation: Operation::prompt("hi"),
            }),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(7),
                operation: Operation::Prompt {
                    text: "see".into(),
                    images: vec![Content::Image {
                        data: "iVBORw0KGgo=".into(),
                        mime_type: "image/png".into(),
                    }],
                },
            }),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(8),
                operation: Operation::Steer { text: "s".into() },
            }),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(9),
                operation: Operation::Abort,
            }),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(9),
                operation: Operation::Compact {
                    instructions: Some("keep the paths".into()),
                },
            }),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(10),
                operation: Operation::SetModel {
                    model: ModelRef {
                        provider: "p".into(),
                        id: "m".into(),
                    },
                },
            }),
            WorkerFrame::ToWorker(ToWorker::Operation {
                op: OpId(11),
                operation: Operation::SetThinking {
                    level: ThinkingLevel::Low,
                },
            }),
            WorkerFrame::FromWorker(FromWorker::Ready {
                snapshot: packed(snapshot()),
            }),
            WorkerFrame::FromWorker(FromWorker::Snapshot {
                snapshot: packed(snapshot()),
            }),
            WorkerFrame::FromWorker(FromWorker::Failed {
                error: ProtocolError::new(ErrorCode::SessionLocked, "x"),
            }),
            WorkerFrame::FromWorker(FromWorker::OpDone {
                op: OpId(1),
                outcome: Ok(packed(snapshot())),
            }),
            WorkerFrame::FromWorker(FromWorker::OpDone {
                op: OpId(2),
                outcome: Err(ProtocolError::new(ErrorCode::Busy, "b")),
            }),
            WorkerFrame::FromWorker(FromWorker::Progress {
                progress: TranscriptProgress::AssistantDelta {
                    message_id: "m".into(),
                    content_index: 0,
                    kind: crate::protocol::DeltaKind::Text,
                    delta: "d".into(),
                },
            }),
            WorkerFrame::FromWorker(FromWorker::Fatal {
                message: "disk full".into(),
            }),
        ];
        for frame in frames {
            let bytes = encode_worker_frame(&frame).expect("encodes");
            assert_eq!(bytes, cbor::to_vec(&frame.to_value()).expect("encodes"));
            assert_eq!(
                decode_worker_frame(&bytes, &CborLimits::default()).expect("decodes"),
                frame
            );
        }
    }

    /// A frame with a transcript decodes item by item to what the tree path
    /// gives, and a bad item fails with the tree path's error.
    #[test]
    fn transcripts_decode_item_by_item_as_the_tree_does() {
        let user = |id: &str| {
            TranscriptItem::User(crate::protocol::UserItem {
                id: id.into(),
                content: vec![crate::protocol::Content::Text { text: "hi".into() }],
                timestamp: 1,
            })
        };
        let failed = TranscriptItem::Assistant(crate::protocol::AssistantItem {
            id: "r".into(),
            content: vec![],
            model: snapshot().model,
            response_model: None,
            usage: None,
            timestamp: 2,
            status: AssistantStatus::Error,
            error_message: Some("boom".into()),
        });
        let full = SessionSnapshot {
            transcript: vec![user("a"), failed, user("b"), user("c")],
            ..snapshot()
        };
        let frames = [
            WorkerFrame::FromWorker(FromWorker::Snapshot {
                snapshot: packed(full.clone()),
            }),
            WorkerFrame::FromWorker(FromWorker::OpDone {
                op: OpId(7),
                outcome: Ok(packed(full.clone())),
            }),
            WorkerFrame::FromWorker(FromWorker::Ready {
                snapshot: packed(full.clone()),
            }),
            WorkerFrame::Hello {
                version: 1,
                token: "t".into(),
                session_id: "s".into(),
                pid: 1,
                resume: Some(Box::new(packed(full.clone()))),
            },
        ];
        let limits = CborLimits::default();
        let tree = |bytes: &[u8]| {
            WorkerFrame::from_value(&cbor::decode(bytes, &limits).expect("cbor"), "")
        };
        for frame in frames {
            let bytes = encode_worker_frame(&frame).expect("encodes");
            // Written directly or not, the bytes are the tree's.
            assert_eq!(bytes, cbor::to_vec(&frame.to_value()).expect("encodes"));
            assert_eq!(
                decode_worker_frame(&bytes, &limits).expect("decodes"),
                frame
            );
            assert_eq!(tree(&bytes).expect("decodes"), frame);
            // The second item loses its id: both paths name it.
            let mut value = cbor::decode(&bytes, &limits).expect("cbor");
            let Value::Map(entries) = &mut value else {
                unreachable!()
            };
            let (_, Value::Map(snapshot)) = entries.last_mut().expect("snapshot") else {
                unreachable!()
            };
            let (_, Value::Array(items)) = snapshot
                .iter_mut()
                .find(|(k, _)| k == "transcript")
                .expect("transcript")
            else {
                unreachable!()
            };
            let Value::Map(item) = &mut items[1] else {
                unreachable!()
            };
            item.retain(|(k, _)| k != "id");
            let bad = cbor::to_vec(&value).expect("encodes");
            let streamed = decode_worker_frame(&bad, &limits).unwrap_err().to_string();
            assert_eq!(streamed, tree(&bad).unwrap_err().to_string());
            assert!(streamed.contains("transcript[1]"), "{streamed}");
        }
        // A transcript under any other key is decoded as a whole.
        let progress = WorkerFrame::FromWorker(FromWorker::Progress {
            progress: TranscriptProgress::ItemStarted { item: user("a") },
        });
        let bytes = encode_worker_frame(&progress).expect("encodes");
        assert_eq!(
            decode_worker_frame(&bytes, &limits).expect("decodes"),
            progress
        );
    }

    #[test]
    fn rejects_unknown_and_ambiguous_frames() {
        let bad = crate::map! { "type" => Value::text("teleport") };
        assert!(WorkerFrame::from_value(&bad, "").is_err());
        let both = crate::map! {
            "type" => Value::text("op_done"), "op" => Value::Int(1),
            "session" => snapshot().to_value(),
            "error" => ProtocolError::new(ErrorCode::Busy, "b").to_value(),
        };
        assert!(
            WorkerFrame::from_value(&both, "")
                .unwrap_err()
                .to_string()
                .contains("exactly one")
        );
    }
}
