//! The OpenAI Responses API with streaming (`openai-responses`: GPT-5-class
//! and Codex models are served best there).
//!
//! Stateless: every call replays the conversation as `input` items (messages,
//! `function_call`, `function_call_output`) with `store: false`, so nothing
//! lives on the provider's side and a restarted worker, a compaction or an
//! edited transcript need no `previous_response_id` bookkeeping. Reasoning
//! comes back as summary text and streams as thinking; like Chat Completions,
//! it is not sent back.

use super::model::{ModelEvent, ModelRequest, Purpose};
use super::openai::{arguments, parse_arguments, stream_error};
use super::prompt::{self, Message, Part, Said};
use super::registry::{ProviderConfig, apply_cost};
use super::sse::SseEvent;
use super::text::excerpt;
use super::transport::{Failure, Sink, Stop, Translate, stream};
use kernel::protocol::{DeltaKind, InputKind, ModelCost, StopReason, ThinkingLevel, Usage};
use serde_json::{Value as Json, json};

pub(crate) async fn run(
    p: &ProviderConfig,
    request: &ModelRequest,
    sink: &Sink,
) -> Result<(), Stop> {
    let body = body(p, request);
    let url = format!("{}/responses", p.base_url);
    let mut headers = p.headers.clone();
    if let Some(key) = &p.api_key {
        headers.push(("authorization".into(), format!("Bearer {key}")));
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

/// The request body.
pub(crate) fn body(p: &ProviderConfig, request: &ModelRequest) -> Json {
    let images = p.model.input.contains(&InputKind::Image);
    let mut input: Vec<Json> = Vec::new();
    // Images of tool results go in a user message after that turn's outputs
    // (a `function_call_output` carries text).
    let mut tool_images: Vec<Json> = Vec::new();
    for m in prompt::messages(request) {
        if !matches!(m, Message::ToolResult { .. }) && !tool_images.is_empty() {
            input.push(images_message(std::mem::take(&mut tool_images)));
        }
        match m {
            Message::User(parts) => {
                let content: Vec<Json> = parts.iter().map(|p| input_part(p, images)).collect();
                input.push(json!({"role": "user", "content": content}));
            }
            Message::Assistant(said) => {
                for s in said {
                    match s {
                        Said::Text(text) => input.push(json!({
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": text}],
                        })),
                        Said::ToolCall {
                            id,
                            name,
                            input: args,
                        } => input.push(json!({
                            "type": "function_call",
                            "call_id": id,
                            "name": name,
                            "arguments": arguments(&args),
                        })),
                        // Reasoning goes back only as encrypted content,
                        // which is not stored: it is left out.
                        Said::Thinking { .. } => {}
                    }
                }
            }
            Message::ToolResult {
                call_id, content, ..
            } => {
                let mut text = String::new();
                for part in content {
                    match part {
                        Part::Text(t) => {
                            if !text.is_empty() {
                                text.push('\n');
                            }
                            text.push_str(&t);
                        }
                        Part::Image { .. } if images => tool_images.push(input_part(&part, true)),
                        Part::Image { .. } => {
                            text.push_str("\n(image omitted: the model does not accept images)")
                        }
                    }
                }
                input.push(
                    json!({"type": "function_call_output", "call_id": call_id, "output": text}),
                );
            }
        }
    }
    if !tool_images.is_empty() {
        input.push(images_message(tool_images));
    }
    let mut body = json!({
        "model": p.model.id,
        "instructions": prompt::system_prompt(request, p),
        "input": input,
        "stream": true,
        "store": false,
    });
    if request.purpose == Purpose::Reply && !p.tools.is_empty() {
        let tools: Vec<Json> = p
            .tools
            .iter()
            .map(|s| json!({"type": "function", "name": s.name, "description": s.description, "parameters": s.parameters, "strict": false}))
            .collect();
        body["tools"] = Json::Array(tools);
    }
    if p.model.reasoning
        && request.thinking_level != ThinkingLevel::Off
        && request.purpose == Purpose::Reply
    {
        let effort = match request.thinking_level {
            ThinkingLevel::Off | ThinkingLevel::Minimal => "minimal",
            ThinkingLevel::Low => "low",
            ThinkingLevel::Medium => "medium",
            ThinkingLevel::High | ThinkingLevel::Xhigh | ThinkingLevel::Max => "high",
        };
        body["reasoning"] = json!({"effort": effort, "summary": "auto"});
    }
    if p.max_tokens_field.is_some() {
        body["max_output_tokens"] = Json::from(p.model.max_tokens);
    }
    body
}

fn input_part(part: &Part, images: bool) -> Json {
    match part {
        Part::Text(t) => json!({"type": "input_text", "text": t}),
        Part::Image { mime_type, data } if images => {
            json!({"type": "input_image", "image_url": format!("data:{mime_type};base64,{data}")})
        }
        Part::Image { .. } => {
            json!({"type": "input_text", "text": "(image omitted: the model does not accept images)"})
        }
    }
}

fn images_message(mut parts: Vec<Json>) -> Json {
    parts.insert(
        0,
        json!({"type": "input_text", "text": "Images from the tool results above:"}),
    );
    json!({"role": "user", "content": parts})
}

/// The function call being streamed.
#[derive(Debug)]
struct Call {
    item_id: String,
    args: String,
    closed: bool,
}

/// Turns Responses stream events into model events.
pub(crate) struct Translator {
    cost: ModelCost,
    call: Option<Call>,
    used_tools: bool,
    response_model: Option<String>,
    /// The stop of a finished response (`response.completed` or `.incomplete`).
    stop: Option<StopReason>,
    usage: Option<Usage>,
    ended: bool,
}

impl Translator {
    pub(crate) fn new(cost: ModelCost) -> Self {
        Self {
            cost,
            call: None,
            used_tools: false,
            response_model: None,
            stop: None,
            usage: None,
            ended: false,
        }
    }

    fn read_response(&mut self, data: &Json) {
        if let Some(model) = data
            .pointer("/response/model")
            .and_then(Json::as_str)
            .filter(|m| !m.is_empty())
        {
            self.response_model = Some(model.to_string());
        }
    }

    /// Emits the complete input of the streaming call, once; `args` are the
    /// complete arguments when the provider repeats them.
    fn close_call(&mut self, args: Option<&str>, out: &mut Vec<ModelEvent>) {
        if let Some(call) = self.call.as_mut().filter(|c| !c.closed) {
            call.closed = true;
            let args = args.unwrap_or(&call.args);
            out.push(ModelEvent::ToolInput {
                input: parse_arguments(args),
            });
        }
    }
}

impl Translate for Translator {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, Failure> {
        let mut out = Vec::new();
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(out);
        }
        let data: Json = serde_json::from_str(data).map_err(|e| {
            Failure::malformed(format!(
                "invalid JSON in an event ({e}): {}",
                excerpt(data, 200)
            ))
        })?;
        let kind = data
            .get("type")
            .and_then(Json::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        let text = |field: &str| {
            data.get(field)
                .and_then(Json::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
        };
        match kind {
            "response.created" | "response.in_progress" => self.read_response(&data),
            "response.output_text.delta" | "response.refusal.delta" => {
                if let Some(text) = text("delta") {
                    out.push(ModelEvent::Delta {
                        kind: DeltaKind::Text,
                        text,
                    });
                }
            }
            // Summaries of OpenAI's models; full reasoning text of open
            // models served behind the same API.
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                if let Some(text) = text("delta") {
                    out.push(ModelEvent::Delta {
                        kind: DeltaKind::Thinking,
                        text,
                    });
                }
            }
            // Summary parts are paragraphs.
            "response.reasoning_summary_part.added"
                if data.get("summary_index").and_then(Json::as_u64) > Some(0) =>
            {
                out.push(ModelEvent::Delta {
                    kind: DeltaKind::Thinking,
                    text: "\n\n".into(),
                });
            }
            "response.output_item.added" => {
                let item = data.get("item").unwrap_or(&Json::Null);
                if item.get("type").and_then(Json::as_str) == Some("function_call") {
                    self.close_call(None, &mut out);
                    let call_id = item.get("call_id").and_then(Json::as_str).unwrap_or("");
                    let name = item.get("name").and_then(Json::as_str).unwrap_or("");
                    if call_id.is_empty() || name.is_empty() {
                        return Err(Failure::malformed(
                            "a function_call without call_id or name",
                        ));
                    }
                    self.used_tools = true;
                    out.push(ModelEvent::ToolCall {
                        tool_call_id: call_id.to_string(),
                        tool_name: name.to_string(),
                    });
                    let args = item.get("arguments").and_then(Json::as_str).unwrap_or("");
                    if !args.is_empty() {
                        out.push(ModelEvent::Delta {
                            kind: DeltaKind::ToolCall,
                            text: args.to_string(),
                        });
                    }
                    self.call = Some(Call {
                        item_id: item.get("id").and_then(Json::as_str).unwrap_or("").into(),
                        args: args.to_string(),
                        closed: false,
                    });
                }
            }
            "response.function_call_arguments.delta" => {
                let Some(call) = self.call.as_mut().filter(|c| !c.closed) else {
                    return Err(Failure::malformed(
                        "function call arguments outside a function call",
                    ));
                };
                let item_id = data.get("item_id").and_then(Json::as_str).unwrap_or("");
                if !item_id.is_empty() && !call.item_id.is_empty() && item_id != call.item_id {
                    return Err(Failure::malformed(format!(
                        "arguments for function call {item_id} while {} streams",
                        call.item_id
                    )));
                }
                if let Some(delta) = text("delta") {
                    call.args.push_str(&delta);
                    out.push(ModelEvent::Delta {
                        kind: DeltaKind::ToolCall,
                        text: delta,
                    });
                }
            }
            "response.output_item.done" => {
                let item = data.get("item").unwrap_or(&Json::Null);
                if item.get("type").and_then(Json::as_str) == Some("function_call") {
                    let args = item.get("arguments").and_then(Json::as_str);
                    self.close_call(args, &mut out);
                }
            }
            "response.completed" | "response.incomplete" => {
                self.close_call(None, &mut out);
                self.read_response(&data);
                let response = data.get("response").unwrap_or(&Json::Null);
                if let Some(usage) = response.get("usage").filter(|u| u.is_object()) {
                    self.usage = Some(parse_usage(usage));
                }
                let reason = response
                    .pointer("/incomplete_details/reason")
                    .and_then(Json::as_str);
                self.stop = Some(match (kind, reason) {
                    ("response.incomplete", Some("content_filter")) => {
                        return Err(Failure::permanent(
                            "the provider's content filter stopped the reply (incomplete: content_filter)",
                        ));
                    }
                    ("response.incomplete", _) => StopReason::Length,
                    _ if self.used_tools => StopReason::ToolUse,
                    _ => StopReason::Stop,
                });
                self.ended = true;
            }
            "response.failed" => {
                let error = data.pointer("/response/error").unwrap_or(&Json::Null);
                return Err(if error.is_object() {
                    stream_error(error)
                } else {
                    Failure::permanent("the provider reported an error: the response failed")
                });
            }
            "error" => {
                // `{"type":"error","code","message","param"}`: the code, not
                // the event type, classifies it.
                let error = data.get("error").unwrap_or(&data);
                let mut error = error.clone();
                if let Some(map) = error.as_object_mut()
                    && map.get("type").and_then(Json::as_str) == Some("error")
                {
                    map.remove("type");
                }
                return Err(stream_error(&error));
            }
            _ => {} // item and part boundaries, `.done` events, future events
        }
        Ok(out)
    }

    fn ended(&self) -> bool {
        self.ended
    }

    /// The stream ended.
    fn finish(mut self) -> Result<Vec<ModelEvent>, Failure> {
        let Some(stop) = self.stop else {
            return Err(Failure::transient(
                "stream ended unexpectedly (no response.completed)",
            ));
        };
        let usage = self.usage.take().map(|mut u| {
            apply_cost(&self.cost, &mut u);
            u
        });
        Ok(vec![ModelEvent::Done {
            stop,
            usage,
            response_model: self.response_model.take(),
        }])
    }
}

fn parse_usage(u: &Json) -> Usage {
    let n = |v: Option<&Json>| v.and_then(Json::as_u64).unwrap_or(0);
    let input = n(u.get("input_tokens"));
    let output = n(u.get("output_tokens"));
    let cached = n(u.pointer("/input_tokens_details/cached_tokens")).min(input);
    Usage {
        input: input - cached,
        output,
        cache_read: cached,
        cache_write: 0,
        reasoning: u
            .pointer("/output_tokens_details/reasoning_tokens")
            .and_then(Json::as_u64),
        total_tokens: u
            .get("total_tokens")
            .and_then(Json::as_u64)
            .unwrap_or(input + output),
        ..Usage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::tests::{assistant, call, req, text, tool, user};
    use crate::registry::{Api, builtin_models};
    use kernel::protocol::{AssistantStatus, Content, ToolStatus};
    use kernel::wire::Value;

    fn provider() -> ProviderConfig {
        let meta = builtin_models()
            .into_iter()
            .find(|m| m.id == "gpt-5")
            .unwrap();
        ProviderConfig::new(Api::OpenAiResponses, "http://127.0.0.1:1/v1", meta)
    }

    #[test]
    fn the_transcript_is_replayed_as_input_items() {
        let context = vec![
            user("item-1", vec![text("list it")]),
            assistant(
                "item-2",
                AssistantStatus::Complete(StopReason::ToolUse),
                vec![
                    Content::Thinking {
                        thinking: "not sent back".into(),
                        redacted: None,
                        signature: None,
                    },
                    text("Looking."),
                    call("c1", Value::Map(vec![("path".into(), Value::text("."))])),
                ],
            ),
            tool(
                "item-3",
                "c1",
                ToolStatus::Complete,
                vec![
                    text("a.png"),
                    Content::Image {
                        data: "AAAA".into(),
                        mime_type: "image/png".into(),
                    },
                ],
            ),
        ];
        let body = body(&provider(), &req(context, Some("before")));
        let input = body["input"].as_array().unwrap();
        assert_eq!(input.len(), 6, "{input:#?}");
        assert_eq!(input[0]["role"], "user");
        assert!(
            input[0]["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("before")
        );
        assert_eq!(
            input[1],
            json!({"role": "user", "content": [{"type": "input_text", "text": "list it"}]})
        );
        assert_eq!(
            input[2],
            json!({"role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]})
        );
        assert_eq!(
            input[3],
            json!({"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{\"path\":\".\"}"})
        );
        assert_eq!(
            input[4],
            json!({"type": "function_call_output", "call_id": "c1", "output": "a.png"})
        );
        assert_eq!(input[5]["content"][1]["type"], "input_image");
    }

    #[test]
    fn reasoning_follows_the_thinking_level_and_summaries_carry_no_tools() {
        let p = provider();
        let mut r = req(vec![user("item-1", vec![text("hi")])], None);
        r.thinking_level = ThinkingLevel::High;
        let b = body(&p, &r);
        assert_eq!(b["reasoning"], json!({"effort": "high", "summary": "auto"}));
        assert_eq!(b["store"], false);
        assert_eq!(b["tools"][0]["type"], "function");
        r.purpose = Purpose::Summarize;
        let b = body(&p, &r);
        assert!(b.get("reasoning").is_none() && b.get("tools").is_none());
    }

    #[test]
    fn failed_and_error_events_are_classified() {
        let ev = |data: &str| SseEvent {
            event: None,
            data: data.into(),
        };
        let mut t = Translator::new(ModelCost::default());
        let e = t
            .on_event(&ev(
                r#"{"type":"error","code":"rate_limit_exceeded","message":"Slow down","param":null}"#,
            ))
            .unwrap_err();
        assert!(e.retryable, "{e:?}");
        assert_eq!(
            e.message,
            "the provider reported an error: Slow down (rate_limit_exceeded)"
        );
        let e = t
            .on_event(&ev(
                r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"invalid_prompt","message":"Bad prompt"}}}"#,
            ))
            .unwrap_err();
        assert!(!e.retryable, "{e:?}");
        let mut t = Translator::new(ModelCost::default());
        t.on_event(&ev(
            r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#,
        ))
        .unwrap();
        assert!(matches!(
            t.finish().unwrap()[..],
            [ModelEvent::Done {
                stop: StopReason::Length,
                ..
            }]
        ));
        let t = Translator::new(ModelCost::default());
        assert!(t.finish().unwrap_err().retryable, "a cut stream is retried");
    }
}
