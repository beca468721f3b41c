//! The states of pi's session services, in pi's shapes, made from a
//! session's transcript: `pi.transcript`'s `ConversationView` and
//! `pi.models`' state.
//!
//! - `entries` are the finished items, in order; an entry's id is its
//!   position in the transcript from 1, stable because items are only ever
//!   appended. A user item is `pi.user`, a reply `pi.assistant`, a tool's
//!   run `pi.tool-result`, each with pi-ai's message in `model`.
//! - `docs["pi.live"]` is `{}` while idle; during a turn it holds `run`,
//!   the streaming reply as `generation.message`, and the running tools as
//!   `tools` slots (with their `output` so far); `docs["pi.agent"]` the model, thinking level and cwd.
//!
//! Streaming changes only `pi.live`: a delta is an `a` op on the text it
//! grows, and a finished item one splice at the end of `entries`.

use crate::protocol::{
    AssistantItem, AssistantStatus, Content, DeltaKind, ModelMetadata, SessionPhase,
    SessionSnapshot, StopReason, ToolItem, ToolStatus, TranscriptItem, TranscriptProgress, Usage,
    UserItem,
};
use crate::wire::Value;

fn int(n: u64) -> Value {
    Value::Int(n as i64)
}

fn content(parts: &[Content]) -> Value {
    Value::Array(
        parts
            .iter()
            .map(|part| match part {
                Content::Text { text } => Value::object(vec![
                    ("type", Value::text("text")),
                    ("text", Value::text(text)),
                ]),
                Content::Thinking {
                    thinking, redacted, ..
                } => {
                    let mut pairs = vec![
                        ("type", Value::text("thinking")),
                        ("thinking", Value::text(thinking)),
                    ];
                    if let Some(r) = redacted {
                        pairs.push(("redacted", Value::Bool(*r)));
                    }
                    Value::object(pairs)
                }
                Content::Image { data, mime_type } => Value::object(vec![
                    ("type", Value::text("image")),
                    ("data", Value::text(data)),
                    ("mimeType", Value::text(mime_type)),
                ]),
                Content::ToolCall {
                    tool_call_id,
                    tool_name,
                    input,
                } => Value::object(vec![
                    ("type", Value::text("toolCall")),
                    ("id", Value::text(tool_call_id)),
                    ("name", Value::text(tool_name)),
                    ("arguments", input.clone()),
                ]),
            })
            .collect(),
    )
}

fn usage(u: &Option<Usage>) -> Value {
    let zero = Usage {
        input: 0,
        output: 0,
        cache_read: 0,
        cache_write: 0,
        reasoning: None,
        total_tokens: 0,
        cost: crate::protocol::UsageCost {
            input: 0.0,
            output: 0.0,
            cache_read: 0.0,
            cache_write: 0.0,
            total: 0.0,
        },
    };
    let u = u.as_ref().unwrap_or(&zero);
    Value::object(vec![
        ("input", int(u.input)),
        ("output", int(u.output)),
        ("cacheRead", int(u.cache_read)),
        ("cacheWrite", int(u.cache_write)),
        ("totalTokens", int(u.total_tokens)),
        (
            "cost",
            Value::object(vec![
                ("input", Value::number(u.cost.input)),
                ("output", Value::number(u.cost.output)),
                ("cacheRead", Value::number(u.cost.cache_read)),
                ("cacheWrite", Value::number(u.cost.cache_write)),
                ("total", Value::number(u.cost.total)),
            ]),
        ),
    ])
}

fn user_message(item: &UserItem) -> Value {
    Value::object(vec![
        ("role", Value::text("user")),
        ("content", content(&item.content)),
        ("timestamp", int(item.timestamp)),
    ])
}

/// pi-ai's `AssistantMessage` of a reply (streaming or finished).
fn assistant_message(item: &AssistantItem) -> Value {
    let stop = match item.status {
        AssistantStatus::Streaming => None,
        AssistantStatus::Complete(StopReason::Stop) => Some("stop"),
        AssistantStatus::Complete(StopReason::Length) => Some("length"),
        AssistantStatus::Complete(StopReason::ToolUse) => Some("toolUse"),
        AssistantStatus::Error => Some("error"),
        AssistantStatus::Aborted => Some("aborted"),
    };
    let mut pairs = vec![
        ("role", Value::text("assistant")),
        ("content", content(&item.content)),
        ("provider", Value::text(&item.model.provider)),
        (
            "model",
            Value::text(item.response_model.as_deref().unwrap_or(&item.model.id)),
        ),
        ("usage", usage(&item.usage)),
    ];
    if let Some(stop) = stop {
        pairs.push(("stopReason", Value::text(stop)));
    }
    if let Some(message) = &item.error_message {
        pairs.push(("errorMessage", Value::text(message)));
    }
    pairs.push(("timestamp", int(item.timestamp)));
    Value::object(pairs)
}

fn tool_message(item: &ToolItem) -> Value {
    let mut pairs = vec![
        ("role", Value::text("toolResult")),
        ("toolCallId", Value::text(&item.tool_call_id)),
        ("toolName", Value::text(&item.tool_name)),
        ("content", content(&item.content)),
    ];
    if let Some(details) = &item.details {
        pairs.push(("details", details.clone()));
    }
    pairs.push(("isError", Value::Bool(item.status == ToolStatus::Error)));
    pairs.push(("timestamp", int(item.timestamp)));
    Value::object(pairs)
}

/// The `EntryRecord` of a finished item at `index` (0-based) of the transcript.
pub(crate) fn entry(index: usize, item: &TranscriptItem) -> Value {
    let (kind, message) = match item {
        TranscriptItem::User(u) => ("pi.user", user_message(u)),
        TranscriptItem::Assistant(a) => ("pi.assistant", assistant_message(a)),
        TranscriptItem::Tool(t) => ("pi.tool-result", tool_message(t)),
    };
    Value::object(vec![
        ("id", int(index as u64 + 1)),
        ("conversationId", int(1)),
        ("kind", Value::text(kind)),
        ("model", Value::Array(vec![message])),
    ])
}

/// `docs["pi.live"]`: `{}` when idle; else the run, the streaming reply and the running tools.
pub(crate) fn live_doc(busy: bool, streaming: &[TranscriptItem]) -> Value {
    if !busy && streaming.is_empty() {
        return Value::object(vec![]);
    }
    let mut pairs = vec![(
        "run",
        Value::object(vec![("taskId", int(1)), ("inputs", Value::Array(vec![]))]),
    )];
    if let Some(reply) = streaming.iter().rev().find_map(|item| match item {
        TranscriptItem::Assistant(a) if a.status == AssistantStatus::Streaming => Some(a),
        _ => None,
    }) {
        pairs.push((
            "generation",
            Value::object(vec![
                ("attempt", int(1)),
                ("message", assistant_message(reply)),
            ]),
        ));
    }
    let tools: Vec<Value> = streaming
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::Tool(t) => {
                let mut slot = vec![
                    ("callId", Value::text(&t.tool_call_id)),
                    ("name", Value::text(&t.tool_name)),
                    (
                        "status",
                        Value::text(if t.status == ToolStatus::Running {
                            "running"
                        } else {
                            "done"
                        }),
                    ),
                ];
                // Its output so far, as pi's slot carries it.
                let output = crate::client::follow::text_of(&t.content);
                if !output.is_empty() {
                    slot.push(("output", Value::text(output)));
                }
                Some(Value::object(slot))
            }
            _ => None,
        })
        .collect();
    if !tools.is_empty() {
        pairs.push(("tools", Value::Array(tools)));
    }
    Value::object(pairs)
}

pub(crate) fn agent_doc(snapshot: &SessionSnapshot) -> Value {
    Value::object(vec![
        ("cwd", Value::text(&snapshot.cwd)),
        (
            "model",
            Value::object(vec![
                ("provider", Value::text(&snapshot.model.provider)),
                ("modelId", Value::text(&snapshot.model.id)),
            ]),
        ),
        (
            "thinkingLevel",
            Value::text(snapshot.thinking_level.as_str()),
        ),
    ])
}

/// How many items, from the front, are finished: the rest stream.
pub(crate) fn finished_prefix(transcript: &[TranscriptItem]) -> usize {
    transcript
        .iter()
        .position(|item| !item.is_terminal())
        .unwrap_or(transcript.len())
}

/// The whole `ConversationView` of a snapshot whose transcript is here.
pub(crate) fn conversation_view(snapshot: &SessionSnapshot) -> Value {
    let done = finished_prefix(&snapshot.transcript);
    let entries = snapshot.transcript[..done]
        .iter()
        .enumerate()
        .map(|(i, item)| entry(i, item))
        .collect();
    let busy = snapshot.phase != SessionPhase::Idle;
    Value::object(vec![
        ("conversation", Value::object(vec![("id", int(1))])),
        ("entries", Value::Array(entries)),
        (
            "docs",
            Value::object(vec![
                ("pi.agent", agent_doc(snapshot)),
                ("pi.live", live_doc(busy, &snapshot.transcript[done..])),
            ]),
        ),
    ])
}

/// `pi.models`' state: the catalogue offered, the session's configuration,
/// and no refresh under way.
pub(crate) fn models_state(snapshot: &SessionSnapshot, models: &[ModelMetadata]) -> Value {
    let mut available: Vec<Value> = models
        .iter()
        .filter(|m| m.authenticated)
        .map(|m| model_entry(&m.provider, &m.id, &m.name, m.reasoning))
        .collect();
    let selected = &snapshot.model;
    if !models
        .iter()
        .any(|m| m.authenticated && m.provider == selected.provider && m.id == selected.id)
    {
        let known = models
            .iter()
            .find(|m| m.provider == selected.provider && m.id == selected.id);
        available.push(model_entry(
            &selected.provider,
            &selected.id,
            known.map_or(&selected.id, |m| &m.name),
            known.is_some_and(|m| m.reasoning),
        ));
    }
    Value::object(vec![
        (
            "catalog",
            Value::object(vec![
                ("revision", int(1)),
                ("availableModels", Value::Array(available)),
            ]),
        ),
        (
            "configuration",
            Value::object(vec![
                (
                    "model",
                    Value::object(vec![
                        ("provider", Value::text(&selected.provider)),
                        ("modelId", Value::text(&selected.id)),
                    ]),
                ),
                (
                    "thinkingLevel",
                    Value::text(snapshot.thinking_level.as_str()),
                ),
            ]),
        ),
        (
            "refresh",
            Value::object(vec![("status", Value::text("idle"))]),
        ),
    ])
}

fn model_entry(provider: &str, id: &str, name: &str, reasoning: bool) -> Value {
    Value::object(vec![
        ("provider", Value::text(provider)),
        ("modelId", Value::text(id)),
        ("name", Value::text(name)),
        ("reasoning", Value::Bool(reasoning)),
    ])
}

/// Applies one progress event to the items still streaming. Returns false
/// when it names an item that is not there (the view then waits for the
/// next snapshot, which is authoritative).
pub(crate) fn advance(streaming: &mut Vec<TranscriptItem>, progress: &TranscriptProgress) -> bool {
    match progress {
        TranscriptProgress::ItemStarted { item }
        | TranscriptProgress::ItemUpdated { item }
        | TranscriptProgress::ItemFinished { item } => {
            match streaming.iter_mut().find(|i| i.id() == item.id()) {
                Some(slot) => *slot = item.clone(),
                None => streaming.push(item.clone()),
            }
            true
        }
        TranscriptProgress::AssistantDelta {
            message_id,
            content_index,
            kind,
            delta,
        } => {
            let Some(TranscriptItem::Assistant(reply)) =
                streaming.iter_mut().find(|i| i.id() == message_id)
            else {
                return false;
            };
            let index = *content_index as usize;
            if index == reply.content.len() {
                reply.content.push(match kind {
                    DeltaKind::Text => Content::Text {
                        text: String::new(),
                    },
                    DeltaKind::Thinking => Content::Thinking {
                        thinking: String::new(),
                        redacted: None,
                        signature: None,
                    },
                    // A tool call's arguments arrive whole in its item update.
                    DeltaKind::ToolCall => return true,
                });
            }
            match (reply.content.get_mut(index), kind) {
                (Some(Content::Text { text }), DeltaKind::Text)
                | (Some(Content::Thinking { thinking: text, .. }), DeltaKind::Thinking) => {
                    text.push_str(delta);
                    true
                }
                (_, DeltaKind::ToolCall) => true,
                _ => false,
            }
        }
    }
}

/// The text an answering reply gave: its text parts, joined.
pub(crate) fn reply_text(item: &AssistantItem) -> String {
    crate::client::follow::text_of(&item.content)
}

/// `pi-server.approvals`' state: the policy in force, whether the session
/// set it itself (`own`), the tools allowed always, and the questions
/// waiting, each `{id, callId, tool, input, askedAt}`.
pub(crate) fn approvals_state(
    approvals: &crate::approval::Approvals,
    policy: crate::approval::ApprovalPolicy,
) -> Value {
    use crate::protocol::codec::Schema as _;
    let tree = approvals.to_value();
    Value::object(vec![
        ("policy", Value::text(policy.as_str())),
        ("own", Value::Bool(approvals.policy.is_some())),
        ("always", tree.get("always").cloned().unwrap_or(Value::Null)),
        (
            "pending",
            tree.get("pending").cloned().unwrap_or(Value::Null),
        ),
    ])
}
