//! Schemas of the data carried inside messages: snapshots, models, usage,
//! transcript items and progress.

use super::fields::{
    Fields, MapBuilder, discriminator, read_bool, read_enum, read_id, read_json, read_list,
    read_number, read_string, read_uint, read_uint_min, uint_value, unknown_variant,
};
use super::{Path, Schema, SchemaError};
use crate::protocol::types::*;
use crate::wire::Value;

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

fn list<T: Schema>(items: &[T]) -> Value {
    Value::Array(items.iter().map(Schema::to_value).collect())
}

pub(super) fn read_thinking_level(
    value: &Value,
    path: &Path<'_>,
) -> Result<ThinkingLevel, SchemaError> {
    read_enum(value, path, &ThinkingLevel::ALL, ThinkingLevel::as_str)
}

fn read_phase(value: &Value, path: &Path<'_>) -> Result<SessionPhase, SchemaError> {
    read_enum(value, path, &SessionPhase::ALL, SessionPhase::as_str)
}

fn input_kind_name(kind: InputKind) -> &'static str {
    match kind {
        InputKind::Text => "text",
        InputKind::Image => "image",
    }
}

fn stop_reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Stop => "stop",
        StopReason::Length => "length",
        StopReason::ToolUse => "toolUse",
    }
}

fn delta_kind_name(kind: DeltaKind) -> &'static str {
    match kind {
        DeltaKind::Text => "text",
        DeltaKind::Thinking => "thinking",
        DeltaKind::ToolCall => "toolCall",
    }
}

/// Reads the literal protocol version 1 (`version`, `protocolVersion`).
pub(super) fn read_protocol_version(value: &Value, path: &Path<'_>) -> Result<u64, SchemaError> {
    match value {
        Value::Int(n) if u64::try_from(*n) == Ok(PROTOCOL_VERSION) => Ok(PROTOCOL_VERSION),
        Value::Float(x) if *x == PROTOCOL_VERSION as f64 => Ok(PROTOCOL_VERSION),
        Value::Int(n) => Err(SchemaError::at(
            path,
            format_args!("expected {PROTOCOL_VERSION}, got {n}"),
        )),
        Value::Float(x) => Err(SchemaError::at(
            path,
            format_args!("expected {PROTOCOL_VERSION}, got {x}"),
        )),
        other => Err(SchemaError::at(
            path,
            format_args!(
                "expected the integer {PROTOCOL_VERSION}, got {}",
                other.kind()
            ),
        )),
    }
}

impl Schema for ModelRef {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(2)
            .put("provider", text(&self.provider))
            .put("id", text(&self.id))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["provider", "id"])?;
        Ok(Self {
            provider: f.required("provider", read_id)?,
            id: f.required("id", read_id)?,
        })
    }
}

impl Schema for ModelCost {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(4)
            .put("input", Value::number(self.input))
            .put("output", Value::number(self.output))
            .put("cacheRead", Value::number(self.cache_read))
            .put("cacheWrite", Value::number(self.cache_write))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["input", "output", "cacheRead", "cacheWrite"])?;
        Ok(Self {
            input: f.required("input", read_number)?,
            output: f.required("output", read_number)?,
            cache_read: f.required("cacheRead", read_number)?,
            cache_write: f.required("cacheWrite", read_number)?,
        })
    }
}

impl Schema for ModelMetadata {
    fn to_value(&self) -> Value {
        let input = self
            .input
            .iter()
            .map(|kind| text(input_kind_name(*kind)))
            .collect();
        let levels = self
            .supported_thinking_levels
            .iter()
            .map(|level| text(level.as_str()))
            .collect();
        MapBuilder::with_capacity(11)
            .put("provider", text(&self.provider))
            .put("id", text(&self.id))
            .put("name", text(&self.name))
            .put("api", text(&self.api))
            .put("reasoning", Value::Bool(self.reasoning))
            .put("input", Value::Array(input))
            .put("contextWindow", uint_value(self.context_window))
            .put("maxTokens", uint_value(self.max_tokens))
            .put("cost", self.cost.to_value())
            .put("supportedThinkingLevels", Value::Array(levels))
            .put("authenticated", Value::Bool(self.authenticated))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "provider",
                "id",
                "name",
                "api",
                "reasoning",
                "input",
                "contextWindow",
                "maxTokens",
                "cost",
                "supportedThinkingLevels",
                "authenticated",
            ],
        )?;
        let read_input = |v: &Value, p: &Path<'_>| {
            read_list(v, p, |v, p| {
                read_enum(v, p, &[InputKind::Text, InputKind::Image], input_kind_name)
            })
        };
        let read_levels = |v: &Value, p: &Path<'_>| {
            let levels = read_list(v, p, read_thinking_level)?;
            if levels.is_empty() {
                return Err(SchemaError::at(p, "expected at least 1 item"));
            }
            Ok(levels)
        };
        Ok(Self {
            provider: f.required("provider", read_id)?,
            id: f.required("id", read_id)?,
            name: f.required("name", read_id)?,
            api: f.required("api", read_id)?,
            reasoning: f.required("reasoning", read_bool)?,
            input: f.required("input", read_input)?,
            context_window: f.required("contextWindow", |v, p| read_uint_min(v, p, 1))?,
            max_tokens: f.required("maxTokens", |v, p| read_uint_min(v, p, 1))?,
            cost: f.required("cost", ModelCost::from_value_at)?,
            supported_thinking_levels: f.required("supportedThinkingLevels", read_levels)?,
            authenticated: f.required("authenticated", read_bool)?,
        })
    }
}

impl Schema for UsageCost {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(5)
            .put("input", Value::number(self.input))
            .put("output", Value::number(self.output))
            .put("cacheRead", Value::number(self.cache_read))
            .put("cacheWrite", Value::number(self.cache_write))
            .put("total", Value::number(self.total))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &["input", "output", "cacheRead", "cacheWrite", "total"],
        )?;
        Ok(Self {
            input: f.required("input", read_number)?,
            output: f.required("output", read_number)?,
            cache_read: f.required("cacheRead", read_number)?,
            cache_write: f.required("cacheWrite", read_number)?,
            total: f.required("total", read_number)?,
        })
    }
}

impl Schema for Usage {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(7)
            .put("input", uint_value(self.input))
            .put("output", uint_value(self.output))
            .put("cacheRead", uint_value(self.cache_read))
            .put("cacheWrite", uint_value(self.cache_write))
            .put_opt("reasoning", self.reasoning.map(uint_value))
            .put("totalTokens", uint_value(self.total_tokens))
            .put("cost", self.cost.to_value())
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "input",
                "output",
                "cacheRead",
                "cacheWrite",
                "reasoning",
                "totalTokens",
                "cost",
            ],
        )?;
        Ok(Self {
            input: f.required("input", read_uint)?,
            output: f.required("output", read_uint)?,
            cache_read: f.required("cacheRead", read_uint)?,
            cache_write: f.required("cacheWrite", read_uint)?,
            reasoning: f.optional("reasoning", read_uint)?,
            total_tokens: f.required("totalTokens", read_uint)?,
            cost: f.required("cost", UsageCost::from_value_at)?,
        })
    }
}

/// Content part types allowed in user and tool items.
const USER_CONTENT: &[&str] = &["text", "image"];
/// Content part types allowed in assistant items.
const ASSISTANT_CONTENT: &[&str] = &["text", "thinking", "toolCall"];
/// Every content part type.
const ALL_CONTENT: &[&str] = &["text", "thinking", "image", "toolCall"];

/// Reads a content part whose `type` must be one of `allowed`.
fn read_content(
    value: &Value,
    path: &Path<'_>,
    allowed: &[&str],
    owner: &str,
) -> Result<Content, SchemaError> {
    let kind = discriminator(value, path, "type")?;
    if !ALL_CONTENT.contains(&kind) {
        return Err(unknown_variant(path, "content type", kind));
    }
    if !allowed.contains(&kind) {
        return Err(SchemaError::at(
            path,
            format_args!("content type \"{kind}\" is not allowed in {owner}"),
        ));
    }
    match kind {
        "text" => {
            let f = Fields::new(value, path, &["type", "text"])?;
            Ok(Content::Text {
                text: f.required("text", read_string)?,
            })
        }
        "thinking" => {
            let f = Fields::new(value, path, &["type", "thinking", "redacted"])?;
            Ok(Content::Thinking {
                thinking: f.required("thinking", read_string)?,
                redacted: f.optional("redacted", read_bool)?,
                signature: None,
            })
        }
        "image" => {
            let f = Fields::new(value, path, &["type", "data", "mimeType"])?;
            Ok(Content::Image {
                data: f.required("data", read_string)?,
                mime_type: f.required("mimeType", read_id)?,
            })
        }
        _ => {
            let f = Fields::new(value, path, &["type", "toolCallId", "toolName", "input"])?;
            Ok(Content::ToolCall {
                tool_call_id: f.required("toolCallId", read_id)?,
                tool_name: f.required("toolName", read_id)?,
                input: f.required("input", read_json)?,
            })
        }
    }
}

fn read_contents(
    value: &Value,
    path: &Path<'_>,
    allowed: &[&str],
    owner: &str,
) -> Result<Vec<Content>, SchemaError> {
    read_list(value, path, |v, p| read_content(v, p, allowed, owner))
}

/// Any content part; the item schemas restrict the kinds per role.
impl Schema for Content {
    fn to_value(&self) -> Value {
        match self {
            Self::Text { text: t } => MapBuilder::with_capacity(2)
                .put("type", text("text"))
                .put("text", text(t))
                .build(),
            Self::Thinking {
                thinking, redacted, ..
            } => MapBuilder::with_capacity(3)
                .put("type", text("thinking"))
                .put("thinking", text(thinking))
                .put_opt("redacted", redacted.map(Value::Bool))
                .build(),
            Self::Image { data, mime_type } => MapBuilder::with_capacity(3)
                .put("type", text("image"))
                .put("data", text(data))
                .put("mimeType", text(mime_type))
                .build(),
            Self::ToolCall {
                tool_call_id,
                tool_name,
                input,
            } => MapBuilder::with_capacity(4)
                .put("type", text("toolCall"))
                .put("toolCallId", text(tool_call_id))
                .put("toolName", text(tool_name))
                .put("input", input.clone())
                .build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        read_content(value, path, ALL_CONTENT, "a content part")
    }
}

impl Schema for UserItem {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(4)
            .put("id", text(&self.id))
            .put("role", text("user"))
            .put("content", list(&self.content))
            .put("timestamp", uint_value(self.timestamp))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["id", "role", "content", "timestamp"])?;
        f.literal("role", "user")?;
        Ok(Self {
            id: f.required("id", read_id)?,
            content: f.required("content", |v, p| {
                read_contents(v, p, USER_CONTENT, "a user item")
            })?,
            timestamp: f.required("timestamp", read_uint)?,
        })
    }
}

fn assistant_status_name(status: AssistantStatus) -> &'static str {
    match status {
        AssistantStatus::Streaming => "streaming",
        AssistantStatus::Complete(_) => "complete",
        AssistantStatus::Error => "error",
        AssistantStatus::Aborted => "aborted",
    }
}

impl Schema for AssistantItem {
    fn to_value(&self) -> Value {
        let stop_reason = match self.status {
            AssistantStatus::Streaming => None,
            AssistantStatus::Complete(reason) => Some(stop_reason_name(reason)),
            AssistantStatus::Error => Some("error"),
            AssistantStatus::Aborted => Some("aborted"),
        };
        MapBuilder::with_capacity(10)
            .put("id", text(&self.id))
            .put("role", text("assistant"))
            .put("content", list(&self.content))
            .put("model", self.model.to_value())
            .put_opt("responseModel", self.response_model.as_deref().map(text))
            .put_opt("usage", self.usage.as_ref().map(Schema::to_value))
            .put("timestamp", uint_value(self.timestamp))
            .put("status", text(assistant_status_name(self.status)))
            .put_opt("stopReason", stop_reason.map(text))
            .put_opt("errorMessage", self.error_message.as_deref().map(text))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        const STREAMING: &[&str] = &[
            "id",
            "role",
            "content",
            "model",
            "responseModel",
            "usage",
            "timestamp",
            "status",
        ];
        const COMPLETE: &[&str] = &[
            "id",
            "role",
            "content",
            "model",
            "responseModel",
            "usage",
            "timestamp",
            "status",
            "stopReason",
        ];
        const FAILED: &[&str] = &[
            "id",
            "role",
            "content",
            "model",
            "responseModel",
            "usage",
            "timestamp",
            "status",
            "stopReason",
            "errorMessage",
        ];
        let status = discriminator(value, path, "status")?;
        let allowed = match status {
            "streaming" => STREAMING,
            "complete" => COMPLETE,
            "error" | "aborted" => FAILED,
            other => return Err(unknown_variant(path, "assistant status", other)),
        };
        let f = Fields::new(value, path, allowed)?;
        f.literal("role", "assistant")?;
        let status = match status {
            "streaming" => AssistantStatus::Streaming,
            "complete" => AssistantStatus::Complete(f.required("stopReason", |v, p| {
                read_enum(
                    v,
                    p,
                    &[StopReason::Stop, StopReason::Length, StopReason::ToolUse],
                    stop_reason_name,
                )
            })?),
            "error" => {
                f.literal("stopReason", "error")?;
                AssistantStatus::Error
            }
            _ => {
                f.literal("stopReason", "aborted")?;
                AssistantStatus::Aborted
            }
        };
        let error_message = if status == AssistantStatus::Error {
            f.optional("errorMessage", read_id)?
        } else {
            f.optional("errorMessage", read_string)?
        };
        Ok(Self {
            id: f.required("id", read_id)?,
            content: f.required("content", |v, p| {
                read_contents(v, p, ASSISTANT_CONTENT, "an assistant item")
            })?,
            model: f.required("model", ModelRef::from_value_at)?,
            response_model: f.optional("responseModel", read_id)?,
            usage: f.optional("usage", Usage::from_value_at)?,
            timestamp: f.required("timestamp", read_uint)?,
            status,
            error_message,
        })
    }
}

fn tool_status_name(status: ToolStatus) -> &'static str {
    match status {
        ToolStatus::Running => "running",
        ToolStatus::Complete => "complete",
        ToolStatus::Error => "error",
    }
}

impl Schema for ToolItem {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(11)
            .put("id", text(&self.id))
            .put("role", text("tool"))
            .put("toolCallId", text(&self.tool_call_id))
            .put("toolName", text(&self.tool_name))
            .put("input", self.input.clone())
            .put("content", list(&self.content))
            .put_opt("details", self.details.clone())
            .put_opt("usage", self.usage.as_ref().map(Schema::to_value))
            .put("timestamp", uint_value(self.timestamp))
            .put("status", text(tool_status_name(self.status)))
            .put("isError", Value::Bool(self.status == ToolStatus::Error))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "id",
                "role",
                "toolCallId",
                "toolName",
                "input",
                "content",
                "details",
                "usage",
                "timestamp",
                "status",
                "isError",
            ],
        )?;
        f.literal("role", "tool")?;
        let status = f.required("status", |v, p| {
            read_enum(
                v,
                p,
                &[ToolStatus::Running, ToolStatus::Complete, ToolStatus::Error],
                tool_status_name,
            )
        })?;
        let is_error = status == ToolStatus::Error;
        f.required("isError", |v, p| match v {
            Value::Bool(b) if *b == is_error => Ok(()),
            _ => Err(SchemaError::at(
                p,
                format_args!(
                    "expected {is_error} for status \"{}\"",
                    tool_status_name(status)
                ),
            )),
        })?;
        Ok(Self {
            id: f.required("id", read_id)?,
            tool_call_id: f.required("toolCallId", read_id)?,
            tool_name: f.required("toolName", read_id)?,
            input: f.required("input", read_json)?,
            content: f.required("content", |v, p| {
                read_contents(v, p, USER_CONTENT, "a tool item")
            })?,
            details: f.optional("details", read_json)?,
            usage: f.optional("usage", Usage::from_value_at)?,
            timestamp: f.required("timestamp", read_uint)?,
            status,
        })
    }
}

impl Schema for TranscriptItem {
    fn to_value(&self) -> Value {
        match self {
            Self::User(item) => item.to_value(),
            Self::Assistant(item) => item.to_value(),
            Self::Tool(item) => item.to_value(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        match discriminator(value, path, "role")? {
            "user" => UserItem::from_value_at(value, path).map(Self::User),
            "assistant" => AssistantItem::from_value_at(value, path).map(Self::Assistant),
            "tool" => ToolItem::from_value_at(value, path).map(Self::Tool),
            other => Err(unknown_variant(path, "role", other)),
        }
    }
}

/// Reads the item of `item_updated`: an assistant or tool item.
fn read_updated_item(value: &Value, path: &Path<'_>) -> Result<TranscriptItem, SchemaError> {
    let item = TranscriptItem::from_value_at(value, path)?;
    if let TranscriptItem::User(_) = item {
        return Err(SchemaError::at(
            path,
            "expected an assistant or tool item, got a user item",
        ));
    }
    Ok(item)
}

/// Reads the item of `item_finished`: a terminal assistant or tool item.
fn read_finished_item(value: &Value, path: &Path<'_>) -> Result<TranscriptItem, SchemaError> {
    let item = read_updated_item(value, path)?;
    let status = match &item {
        TranscriptItem::Assistant(AssistantItem {
            status: AssistantStatus::Streaming,
            ..
        }) => "streaming",
        TranscriptItem::Tool(ToolItem {
            status: ToolStatus::Running,
            ..
        }) => "running",
        _ => return Ok(item),
    };
    Err(SchemaError::at(
        path,
        format_args!("expected a finished item, got status \"{status}\""),
    ))
}

impl Schema for TranscriptProgress {
    fn to_value(&self) -> Value {
        match self {
            Self::ItemStarted { item } => MapBuilder::with_capacity(2)
                .put("type", text("item_started"))
                .put("item", item.to_value())
                .build(),
            Self::AssistantDelta {
                message_id,
                content_index,
                kind,
                delta,
            } => MapBuilder::with_capacity(5)
                .put("type", text("assistant_delta"))
                .put("messageId", text(message_id))
                .put("contentIndex", uint_value(*content_index))
                .put("kind", text(delta_kind_name(*kind)))
                .put("delta", text(delta))
                .build(),
            Self::ItemUpdated { item } => MapBuilder::with_capacity(2)
                .put("type", text("item_updated"))
                .put("item", item.to_value())
                .build(),
            Self::ItemFinished { item } => MapBuilder::with_capacity(2)
                .put("type", text("item_finished"))
                .put("item", item.to_value())
                .build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        match discriminator(value, path, "type")? {
            "item_started" => {
                let f = Fields::new(value, path, &["type", "item"])?;
                Ok(Self::ItemStarted {
                    item: f.required("item", TranscriptItem::from_value_at)?,
                })
            }
            "assistant_delta" => {
                let f = Fields::new(
                    value,
                    path,
                    &["type", "messageId", "contentIndex", "kind", "delta"],
                )?;
                Ok(Self::AssistantDelta {
                    message_id: f.required("messageId", read_id)?,
                    content_index: f.required("contentIndex", read_uint)?,
                    kind: f.required("kind", |v, p| {
                        read_enum(
                            v,
                            p,
                            &[DeltaKind::Text, DeltaKind::Thinking, DeltaKind::ToolCall],
                            delta_kind_name,
                        )
                    })?,
                    delta: f.required("delta", read_string)?,
                })
            }
            "item_updated" => {
                let f = Fields::new(value, path, &["type", "item"])?;
                Ok(Self::ItemUpdated {
                    item: f.required("item", read_updated_item)?,
                })
            }
            "item_finished" => {
                let f = Fields::new(value, path, &["type", "item"])?;
                Ok(Self::ItemFinished {
                    item: f.required("item", read_finished_item)?,
                })
            }
            other => Err(unknown_variant(path, "progress type", other)),
        }
    }
}

impl Schema for SessionMetadata {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(6)
            .put("id", text(&self.id))
            .put("createdAt", uint_value(self.created_at))
            .put_opt("updatedAt", self.updated_at.map(uint_value))
            .put_opt(
                "parentSessionId",
                self.parent_session_id.as_deref().map(text),
            )
            .put_opt("sessionName", self.session_name.as_deref().map(text))
            .put_opt("cwd", self.cwd.as_deref().map(text))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "id",
                "createdAt",
                "updatedAt",
                "parentSessionId",
                "sessionName",
                "cwd",
            ],
        )?;
        Ok(Self {
            id: f.required("id", read_id)?,
            created_at: f.required("createdAt", read_uint)?,
            updated_at: f.optional("updatedAt", read_uint)?,
            parent_session_id: f.optional("parentSessionId", read_id)?,
            session_name: f.optional("sessionName", read_string)?,
            cwd: f.optional("cwd", read_id)?,
        })
    }
}

impl Schema for SessionSnapshot {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(14)
            .put("id", text(&self.id))
            .put_opt("name", self.name.as_deref().map(text))
            .put("cwd", text(&self.cwd))
            .put("createdAt", uint_value(self.created_at))
            .put("updatedAt", uint_value(self.updated_at))
            .put("phase", text(self.phase.as_str()))
            .put("model", self.model.to_value())
            .put("thinkingLevel", text(self.thinking_level.as_str()))
            .put("attached", Value::Bool(self.attached))
            .put("locked", Value::Bool(self.locked))
            .put("revision", uint_value(self.revision))
            .put("transcript", list(&self.transcript))
            .put("queuedSteer", list(&self.queued_steer))
            .put("queuedSteerCount", uint_value(self.queued_steer_count))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "id",
                "name",
                "cwd",
                "createdAt",
                "updatedAt",
                "phase",
                "model",
                "thinkingLevel",
                "attached",
                "locked",
                "revision",
                "transcript",
                "queuedSteer",
                "queuedSteerCount",
            ],
        )?;
        Ok(Self {
            id: f.required("id", read_id)?,
            name: f.optional("name", read_string)?,
            cwd: f.required("cwd", read_id)?,
            created_at: f.required("createdAt", read_uint)?,
            updated_at: f.required("updatedAt", read_uint)?,
            phase: f.required("phase", read_phase)?,
            model: f.required("model", ModelRef::from_value_at)?,
            thinking_level: f.required("thinkingLevel", read_thinking_level)?,
            attached: f.required("attached", read_bool)?,
            locked: f.required("locked", read_bool)?,
            revision: f.required("revision", read_uint)?,
            transcript: f.required("transcript", |v, p| {
                read_list(v, p, TranscriptItem::from_value_at)
            })?,
            queued_steer: f.required("queuedSteer", |v, p| read_list(v, p, read_queued_steer))?,
            queued_steer_count: f.required("queuedSteerCount", read_uint)?,
        })
    }
}

/// Reads a `queuedSteer` entry: a user item only.
fn read_queued_steer(value: &Value, path: &Path<'_>) -> Result<UserItem, SchemaError> {
    match discriminator(value, path, "role")? {
        "user" => UserItem::from_value_at(value, path),
        other => Err(SchemaError::at(
            path,
            format_args!(
                "expected a user item, got role {}",
                super::fields::quote(other)
            ),
        )),
    }
}

impl Schema for ServerSnapshot {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(5)
            .put("serverId", text(&self.server_id))
            .put("protocolVersion", uint_value(self.protocol_version))
            .put("revision", uint_value(self.revision))
            .put("sessions", list(&self.sessions))
            .put("models", list(&self.models))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "serverId",
                "protocolVersion",
                "revision",
                "sessions",
                "models",
            ],
        )?;
        Ok(Self {
            server_id: f.required("serverId", read_id)?,
            protocol_version: f.required("protocolVersion", read_protocol_version)?,
            revision: f.required("revision", read_uint)?,
            sessions: f.required("sessions", |v, p| {
                read_list(v, p, SessionMetadata::from_value_at)
            })?,
            models: f.required("models", |v, p| {
                read_list(v, p, ModelMetadata::from_value_at)
            })?,
        })
    }
}
