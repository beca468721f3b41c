//! Anthropic Messages with streaming, including thinking blocks.

use super::model::{ModelEvent, ModelRequest, Purpose};
use super::prompt::{self, Message, Part, Said};
use super::registry::{ProviderConfig, apply_cost};
use super::sse::SseEvent;
use super::text::excerpt;
use super::transport::{Failure, Sink, Stop, Translate, stream};
use kernel::protocol::{DeltaKind, InputKind, ModelCost, StopReason, ThinkingLevel, Usage};
use kernel::wire::Value;
use pi_config::json::{from_json, to_json};
use serde_json::{Value as Json, json};

/// The `anthropic-version` header we speak.
const VERSION: &str = "2023-06-01";

pub(crate) async fn run(
    p: &ProviderConfig,
    request: &ModelRequest,
    sink: &Sink,
) -> Result<(), Stop> {
    let body = body(p, request);
    let url = format!("{}/v1/messages", p.base_url);
    let mut headers = p.headers.clone();
    headers.push(("anthropic-version".into(), VERSION.into()));
    if let Some(key) = &p.api_key {
        headers.push(("x-api-key".into(), key.clone()));
    }
    stream(
        p,
        &url,
        &headers,
        &body,
        sink,
        Translator::new(p.model.cost),
    )
    .await
}

/// Thinking budget (tokens) for a level.
fn budget(level: ThinkingLevel) -> u64 {
    match level {
        ThinkingLevel::Off => 0,
        ThinkingLevel::Minimal => 1024,
        ThinkingLevel::Low => 4096,
        ThinkingLevel::Medium => 10_240,
        ThinkingLevel::High => 20_480,
        ThinkingLevel::Xhigh => 32_768,
        ThinkingLevel::Max => 65_536,
    }
}

/// The request body.
pub(crate) fn body(p: &ProviderConfig, request: &ModelRequest) -> Json {
    let images = p.model.input.contains(&InputKind::Image);
    let conversation = prompt::messages(request);
    let max_tokens = p.model.max_tokens;
    let mut thinking = None;
    if p.model.reasoning
        && request.purpose == Purpose::Reply
        && request.thinking_level != ThinkingLevel::Off
        && max_tokens > 2048
    {
        thinking = Some(budget(request.thinking_level).clamp(1024, max_tokens - 1024));
    }
    // In a tool loop the API needs the last assistant message's signed thinking
    // block back; if it has no signature (another provider's reply), this
    // request goes without thinking.
    if thinking.is_some() && !tool_loop_is_signed(&conversation) {
        thinking = None;
    }
    let mut messages: Vec<Json> = Vec::new();
    for m in conversation {
        let (role, blocks) = match m {
            Message::User(parts) => (
                "user",
                parts
                    .iter()
                    .map(|p| part_block(p, images))
                    .collect::<Vec<_>>(),
            ),
            Message::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                let content: Vec<Json> = content.iter().map(|p| part_block(p, images)).collect();
                (
                    "user",
                    vec![
                        json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}),
                    ],
                )
            }
            Message::Assistant(said) => {
                let mut blocks = Vec::new();
                for s in said {
                    match s {
                        Said::Text(text) => blocks.push(json!({"type": "text", "text": text})),
                        Said::Thinking { text, signature } => {
                            // Unsigned thinking cannot be sent back; it is left out.
                            if let Some(signature) = signature {
                                blocks.push(json!({"type": "thinking", "thinking": text, "signature": signature}));
                            }
                        }
                        Said::ToolCall { id, name, input } => {
                            let input = match input {
                                Value::Map(_) => to_json(&input),
                                _ => json!({}),
                            };
                            blocks.push(
                                json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                            );
                        }
                    }
                }
                ("assistant", blocks)
            }
        };
        if blocks.is_empty() {
            continue;
        }
        // Consecutive messages of one role become one message.
        match messages.last_mut() {
            Some(last) if last["role"] == role => {
                last["content"]
                    .as_array_mut()
                    .expect("content is a list")
                    .extend(blocks);
            }
            _ => messages.push(json!({"role": role, "content": blocks})),
        }
    }
    if messages.first().is_some_and(|m| m["role"] != "user") {
        messages.insert(0, json!({"role": "user", "content": [{"type": "text", "text": "(conversation continues)"}]}));
    }
    // Prompt caching, as pi marks it: the system prompt (with the tools
    // before it, the stable prefix) and the last user message (a prompt or
    // tool results), so each call reads the conversation so far from the
    // cache and writes only what is new.
    let cached = json!({"type": "ephemeral"});
    if let Some(block) = messages
        .iter_mut()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|blocks| blocks.last_mut())
    {
        block["cache_control"] = cached.clone();
    }
    let system = prompt::system_prompt(request, p);
    let mut body = json!({
        "model": p.model.id,
        "max_tokens": max_tokens,
        "system": [{"type": "text", "text": system, "cache_control": cached}],
        "messages": messages,
        "stream": true,
    });
    if request.purpose == Purpose::Reply && !p.tools.is_empty() {
        let tools: Vec<Json> = p
            .tools
            .iter()
            .map(|s| json!({"name": s.name, "description": s.description, "input_schema": s.parameters}))
            .collect();
        body["tools"] = Json::Array(tools);
    }
    if let Some(budget_tokens) = thinking {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget_tokens});
    }
    body
}

/// False when the conversation ends in a tool loop whose assistant message
/// has thinking we cannot send back signed.
fn tool_loop_is_signed(conversation: &[Message]) -> bool {
    if !matches!(conversation.last(), Some(Message::ToolResult { .. })) {
        return true;
    }
    let Some(said) = conversation.iter().rev().find_map(|m| match m {
        Message::Assistant(said) => Some(said),
        _ => None,
    }) else {
        return true;
    };
    said.iter().any(|s| {
        matches!(
            s,
            Said::Thinking {
                signature: Some(_),
                ..
            }
        )
    })
}

fn part_block(part: &Part, images: bool) -> Json {
    match part {
        Part::Text(text) => json!({"type": "text", "text": text}),
        Part::Image { mime_type, data } if images => {
            json!({"type": "image", "source": {"type": "base64", "media_type": mime_type, "data": data}})
        }
        Part::Image { .. } => {
            json!({"type": "text", "text": "(image omitted: the model does not accept images)"})
        }
    }
}

#[derive(Debug)]
enum Block {
    Text,
    Thinking { signature: String },
    ToolUse { json: String },
    Other,
}

/// Turns Messages stream events into model events.
pub(crate) struct Translator {
    cost: ModelCost,
    blocks: Vec<(u64, Block)>,
    used_tools: bool,
    stop_reason: Option<String>,
    usage: Usage,
    usage_seen: bool,
    response_model: Option<String>,
    started: bool,
    stopped: bool,
}

impl Translator {
    pub(crate) fn new(cost: ModelCost) -> Self {
        Self {
            cost,
            blocks: Vec::new(),
            used_tools: false,
            stop_reason: None,
            usage: Usage::default(),
            usage_seen: false,
            response_model: None,
            started: false,
            stopped: false,
        }
    }

    fn read_usage(&mut self, u: &Json) {
        let mut set = |field: &str, slot: &mut u64| {
            if let Some(n) = u.get(field).and_then(Json::as_u64) {
                *slot = n;
                self.usage_seen = true;
            }
        };
        set("input_tokens", &mut self.usage.input);
        set("output_tokens", &mut self.usage.output);
        set("cache_read_input_tokens", &mut self.usage.cache_read);
        set("cache_creation_input_tokens", &mut self.usage.cache_write);
    }
}

impl Translate for Translator {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, Failure> {
        let mut out = Vec::new();
        let data: Json = serde_json::from_str(&event.data).map_err(|e| {
            Failure::malformed(format!(
                "invalid JSON in an event ({e}): {}",
                excerpt(&event.data, 200)
            ))
        })?;
        let kind = data
            .get("type")
            .and_then(Json::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        match kind {
            "message_start" => {
                self.started = true;
                let message = data.get("message").unwrap_or(&Json::Null);
                if let Some(model) = message
                    .get("model")
                    .and_then(Json::as_str)
                    .filter(|m| !m.is_empty())
                {
                    self.response_model = Some(model.to_string());
                }
                if let Some(usage) = message.get("usage") {
                    self.read_usage(usage);
                }
            }
            "content_block_start" => {
                let index = index(&data)?;
                let block = data.get("content_block").unwrap_or(&Json::Null);
                let block = match block.get("type").and_then(Json::as_str) {
                    Some("text") => {
                        if let Some(text) = block
                            .get("text")
                            .and_then(Json::as_str)
                            .filter(|t| !t.is_empty())
                        {
                            out.push(ModelEvent::Delta {
                                kind: DeltaKind::Text,
                                text: text.to_string(),
                            });
                        }
                        Block::Text
                    }
                    Some("thinking") => {
                        let text = block
                            .get("thinking")
                            .and_then(Json::as_str)
                            .unwrap_or("")
                            .to_string();
                        if !text.is_empty() {
                            out.push(ModelEvent::Delta {
                                kind: DeltaKind::Thinking,
                                text: text.clone(),
                            });
                        }
                        Block::Thinking {
                            signature: String::new(),
                        }
                    }
                    Some("tool_use") => {
                        let id = block.get("id").and_then(Json::as_str).unwrap_or("");
                        let name = block.get("name").and_then(Json::as_str).unwrap_or("");
                        if id.is_empty() || name.is_empty() {
                            return Err(Failure::malformed("a tool_use block without id or name"));
                        }
                        self.used_tools = true;
                        out.push(ModelEvent::ToolCall {
                            tool_call_id: id.to_string(),
                            tool_name: name.to_string(),
                        });
                        Block::ToolUse {
                            json: String::new(),
                        }
                    }
                    _ => Block::Other, // redacted_thinking and future block types
                };
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let index = index(&data)?;
                let delta = data.get("delta").unwrap_or(&Json::Null);
                let Some((_, block)) = self.blocks.iter_mut().rev().find(|(i, _)| *i == index)
                else {
                    return Err(Failure::malformed(format!(
                        "a delta for block {index}, which never started"
                    )));
                };
                let text = |field: &str| {
                    delta
                        .get(field)
                        .and_then(Json::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                match (delta.get("type").and_then(Json::as_str), block) {
                    (Some("text_delta"), Block::Text) => {
                        let t = text("text");
                        if !t.is_empty() {
                            out.push(ModelEvent::Delta {
                                kind: DeltaKind::Text,
                                text: t,
                            });
                        }
                    }
                    (Some("thinking_delta"), Block::Thinking { .. }) => {
                        let t = text("thinking");
                        if !t.is_empty() {
                            out.push(ModelEvent::Delta {
                                kind: DeltaKind::Thinking,
                                text: t,
                            });
                        }
                    }
                    (Some("signature_delta"), Block::Thinking { signature, .. }) => {
                        signature.push_str(&text("signature"))
                    }
                    (Some("input_json_delta"), Block::ToolUse { json }) => {
                        let t = text("partial_json");
                        if !t.is_empty() {
                            json.push_str(&t);
                            out.push(ModelEvent::Delta {
                                kind: DeltaKind::ToolCall,
                                text: t,
                            });
                        }
                    }
                    (Some(other), block)
                        if !matches!(block, Block::Other) && is_known_delta(other) =>
                    {
                        return Err(Failure::malformed(format!(
                            "a {other} for a {block:?} block"
                        )));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = index(&data)?;
                if let Some((_, block)) = self.blocks.iter().rev().find(|(i, _)| *i == index) {
                    match block {
                        Block::ToolUse { json } => out.push(ModelEvent::ToolInput {
                            input: parse_input(json),
                        }),
                        Block::Thinking { signature } if !signature.is_empty() => {
                            out.push(ModelEvent::Signature {
                                signature: signature.clone(),
                            })
                        }
                        _ => {}
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Json::as_str) {
                    self.stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = data.get("usage") {
                    self.read_usage(usage);
                }
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(stream_error(data.get("error").unwrap_or(&data))),
            _ => {} // ping and future events
        }
        Ok(out)
    }

    fn ended(&self) -> bool {
        self.stopped
    }

    /// The stream ended.
    fn finish(mut self) -> Result<Vec<ModelEvent>, Failure> {
        if !self.stopped {
            let what = if self.started {
                "no message_stop"
            } else {
                "no message_start"
            };
            return Err(Failure::transient(format!(
                "stream ended unexpectedly ({what})"
            )));
        }
        let stop = match self.stop_reason.as_deref() {
            Some("max_tokens" | "model_context_window_exceeded") => StopReason::Length,
            Some("tool_use") => StopReason::ToolUse,
            Some("refusal") => {
                return Err(Failure::permanent(
                    "the model declined to answer (stop_reason refusal)",
                ));
            }
            _ if self.used_tools => StopReason::ToolUse,
            _ => StopReason::Stop,
        };
        let usage = self.usage_seen.then(|| {
            let u = &mut self.usage;
            u.total_tokens = u.input + u.output + u.cache_read + u.cache_write;
            apply_cost(&self.cost, u);
            u.clone()
        });
        Ok(vec![ModelEvent::Done {
            stop,
            usage,
            response_model: self.response_model.take(),
        }])
    }
}

fn is_known_delta(kind: &str) -> bool {
    matches!(
        kind,
        "text_delta" | "thinking_delta" | "signature_delta" | "input_json_delta"
    )
}

fn index(data: &Json) -> Result<u64, Failure> {
    data.get("index")
        .and_then(Json::as_u64)
        .ok_or_else(|| Failure::malformed("a content block event without an index"))
}

fn parse_input(json: &str) -> Value {
    if json.trim().is_empty() {
        return Value::Map(Vec::new());
    }
    match serde_json::from_str::<Json>(json) {
        Ok(v) => from_json(&v),
        Err(_) => Value::Text(json.to_string()),
    }
}

/// An `error` event in the middle of a stream.
fn stream_error(error: &Json) -> Failure {
    let kind = error.get("type").and_then(Json::as_str).unwrap_or("error");
    let message = error
        .get("message")
        .and_then(Json::as_str)
        .unwrap_or("unknown error");
    let text = format!("the provider reported an error: {message} ({kind})");
    match kind {
        "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error" => {
            Failure::transient(text)
        }
        _ => Failure::permanent(text),
    }
}
