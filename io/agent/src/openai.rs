//! OpenAI-compatible Chat Completions with streaming (OpenAI, and local
//! servers such as llama.cpp, vLLM and Ollama, selected by base URL).

use super::model::{ModelEvent, ModelRequest, Purpose};
use super::prompt::{self, Message, Part, Said};
use super::registry::{ProviderConfig, apply_cost};
use super::sse::SseEvent;
use super::text::excerpt;
use super::transport::{Failure, Sink, Stop, Translate, stream};
use kernel::protocol::{DeltaKind, InputKind, StopReason, ThinkingLevel, Usage};
use kernel::wire::Value;
use pi_config::json::{from_json, to_json};
use serde_json::{Value as Json, json};

pub(crate) async fn run(
    p: &ProviderConfig,
    request: &ModelRequest,
    sink: &Sink,
) -> Result<(), Stop> {
    let body = body(p, request);
    let url = format!("{}/chat/completions", p.base_url);
    let mut headers = p.headers.clone();
    if let Some(key) = &p.api_key {
        headers.push(("authorization".into(), format!("Bearer {key}")));
    }
    stream(p, &url, &headers, &body, sink, Translator::new(p)).await
}

/// The request body.
pub(crate) fn body(p: &ProviderConfig, request: &ModelRequest) -> Json {
    let images = p.model.input.contains(&InputKind::Image);
    let mut messages =
        vec![json!({"role": "system", "content": prompt::system_prompt(request, p)})];
    // Images of tool results go in a user message after the tool messages of that turn.
    let mut tool_images: Vec<Json> = Vec::new();
    for m in prompt::messages(request) {
        if !matches!(m, Message::ToolResult { .. }) && !tool_images.is_empty() {
            messages.push(images_message(std::mem::take(&mut tool_images)));
        }
        match m {
            Message::User(parts) => {
                messages.push(json!({"role": "user", "content": user_content(&parts, images)}))
            }
            Message::Assistant(said) => {
                let text: Vec<&str> = said
                    .iter()
                    .filter_map(|s| match s {
                        Said::Text(t) => Some(t.as_str()),
                        _ => None,
                    })
                    .collect();
                let calls: Vec<Json> = said
                    .iter()
                    .filter_map(|s| match s {
                        Said::ToolCall { id, name, input } => Some(json!({
                            "id": id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments(input)},
                        })),
                        _ => None,
                    })
                    .collect();
                if text.is_empty() && calls.is_empty() {
                    continue; // thinking only: nothing this API takes back
                }
                let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Json::Null } else { Json::from(text.join("")) }});
                if !calls.is_empty() {
                    msg["tool_calls"] = Json::Array(calls);
                }
                messages.push(msg);
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
                        Part::Image { mime_type, data } if images => {
                            tool_images.push(image_part(&mime_type, &data))
                        }
                        Part::Image { .. } => {
                            text.push_str("\n(image omitted: the model does not accept images)")
                        }
                    }
                }
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
            }
        }
    }
    if !tool_images.is_empty() {
        messages.push(images_message(tool_images));
    }
    let mut body = json!({
        "model": p.model.id,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if request.purpose == Purpose::Reply && !p.tools.is_empty() {
        let tools: Vec<Json> = p
            .tools
            .iter()
            .map(|s| json!({"type": "function", "function": {"name": s.name, "description": s.description, "parameters": s.parameters}}))
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
            ThinkingLevel::High => "high",
            ThinkingLevel::Xhigh | ThinkingLevel::Max => "xhigh",
        };
        body["reasoning_effort"] = Json::from(effort);
    }
    if let Some(field) = &p.max_tokens_field {
        body[field.as_str()] = Json::from(p.model.max_tokens);
    }
    body
}

pub(crate) fn arguments(input: &Value) -> String {
    match input {
        // Arguments that were not valid JSON are kept as the raw text.
        Value::Text(raw) => raw.clone(),
        other => to_json(other).to_string(),
    }
}

fn user_content(parts: &[Part], images: bool) -> Json {
    if let [Part::Text(text)] = parts {
        return Json::from(text.as_str());
    }
    let list: Vec<Json> = parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => json!({"type": "text", "text": t}),
            Part::Image { mime_type, data } if images => image_part(mime_type, data),
            Part::Image { .. } => {
                json!({"type": "text", "text": "(image omitted: the model does not accept images)"})
            }
        })
        .collect();
    Json::Array(list)
}

fn image_part(mime_type: &str, data: &str) -> Json {
    json!({"type": "image_url", "image_url": {"url": format!("data:{mime_type};base64,{data}")}})
}

fn images_message(mut parts: Vec<Json>) -> Json {
    parts.insert(
        0,
        json!({"type": "text", "text": "Images from the tool results above:"}),
    );
    json!({"role": "user", "content": parts})
}

#[derive(Debug)]
struct Call {
    key: u64,
    id: String,
    name: String,
    args: String,
    announced: bool,
    closed: bool,
}

/// Turns Chat Completions chunks into model events.
pub(crate) struct Translator {
    cost: kernel::protocol::ModelCost,
    calls: Vec<Call>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    response_model: Option<String>,
    done_seen: bool,
}

impl Translator {
    pub(crate) fn new(p: &ProviderConfig) -> Self {
        Self {
            cost: p.model.cost,
            calls: Vec::new(),
            finish_reason: None,
            usage: None,
            response_model: None,
            done_seen: false,
        }
    }

    fn on_tool_call(&mut self, call: &Json, out: &mut Vec<ModelEvent>) -> Result<(), Failure> {
        let id = call
            .get("id")
            .and_then(Json::as_str)
            .filter(|s| !s.is_empty());
        let key = match call.get("index").and_then(Json::as_u64) {
            Some(index) => index,
            // No index: a new id starts a new call, otherwise it continues the latest.
            None => match (self.calls.last(), id) {
                (Some(last), Some(id)) if last.id != id => last.key + 1,
                (Some(last), _) => last.key,
                (None, _) => 0,
            },
        };
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Json::as_str)
            .unwrap_or("");
        let args = function
            .and_then(|f| f.get("arguments"))
            .and_then(Json::as_str)
            .unwrap_or("");
        match self.calls.iter().position(|c| c.key == key) {
            Some(i) if i + 1 == self.calls.len() => {}
            Some(_) => {
                let latest = self.calls.last().map_or(0, |c| c.key);
                return Err(Failure::malformed(format!(
                    "tool call {key} continued after tool call {latest} started"
                )));
            }
            None => {
                self.close_call(out);
                let id = id.map_or_else(|| format!("call_{key}"), str::to_string);
                self.calls.push(Call {
                    key,
                    id,
                    name: String::new(),
                    args: String::new(),
                    announced: false,
                    closed: false,
                });
            }
        }
        let current = self.calls.last_mut().expect("a call exists");
        if !current.announced {
            current.name.push_str(name);
        }
        current.args.push_str(args);
        if !current.announced && !current.name.is_empty() {
            current.announced = true;
            out.push(ModelEvent::ToolCall {
                tool_call_id: current.id.clone(),
                tool_name: current.name.clone(),
            });
            if !current.args.is_empty() {
                out.push(ModelEvent::Delta {
                    kind: DeltaKind::ToolCall,
                    text: current.args.clone(),
                });
            }
        } else if current.announced && !args.is_empty() {
            out.push(ModelEvent::Delta {
                kind: DeltaKind::ToolCall,
                text: args.to_string(),
            });
        }
        Ok(())
    }

    /// Emits the complete input of the latest call, once.
    fn close_call(&mut self, out: &mut Vec<ModelEvent>) {
        if let Some(call) = self.calls.last_mut()
            && call.announced
            && !call.closed
        {
            call.closed = true;
            out.push(ModelEvent::ToolInput {
                input: parse_arguments(&call.args),
            });
        }
    }
}

impl Translate for Translator {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, Failure> {
        let mut out = Vec::new();
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done_seen = true;
            return Ok(out);
        }
        if data.is_empty() {
            return Ok(out);
        }
        let chunk: Json = serde_json::from_str(data).map_err(|e| {
            Failure::malformed(format!(
                "invalid JSON in an event ({e}): {}",
                excerpt(data, 200)
            ))
        })?;
        if let Some(error) = chunk.get("error") {
            return Err(stream_error(error));
        }
        if let Some(model) = chunk
            .get("model")
            .and_then(Json::as_str)
            .filter(|m| !m.is_empty())
        {
            self.response_model = Some(model.to_string());
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(usage));
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return Ok(out);
        };
        if let Some(delta) = choice.get("delta") {
            let thinking = ["reasoning_content", "reasoning"].iter().find_map(|k| {
                delta
                    .get(*k)
                    .and_then(Json::as_str)
                    .filter(|t| !t.is_empty())
            });
            if let Some(text) = thinking {
                out.push(ModelEvent::Delta {
                    kind: DeltaKind::Thinking,
                    text: text.to_string(),
                });
            }
            if let Some(text) = delta
                .get("content")
                .and_then(Json::as_str)
                .filter(|t| !t.is_empty())
            {
                out.push(ModelEvent::Delta {
                    kind: DeltaKind::Text,
                    text: text.to_string(),
                });
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Json::as_array) {
                for call in calls {
                    self.on_tool_call(call, &mut out)?;
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Json::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        Ok(out)
    }

    fn ended(&self) -> bool {
        self.done_seen
    }

    /// The stream ended (`[DONE]` or the end of the body).
    fn finish(mut self) -> Result<Vec<ModelEvent>, Failure> {
        let mut out = Vec::new();
        if let Some(call) = self.calls.last().filter(|c| !c.announced) {
            return Err(Failure::malformed(format!(
                "tool call {} has no function name",
                call.key
            )));
        }
        let reason = match self.finish_reason.take() {
            Some(reason) => reason,
            None if self.done_seen => "stop".to_string(),
            None => {
                return Err(Failure::transient(
                    "stream ended unexpectedly (no finish_reason)",
                ));
            }
        };
        self.close_call(&mut out);
        let used_tools = !self.calls.is_empty();
        let stop = match reason.as_str() {
            "length" => StopReason::Length,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "content_filter" => {
                return Err(Failure::permanent(
                    "the provider's content filter stopped the reply (finish_reason content_filter)",
                ));
            }
            _ if used_tools => StopReason::ToolUse,
            _ => StopReason::Stop,
        };
        let usage = self.usage.take().map(|mut u| {
            apply_cost(&self.cost, &mut u);
            u
        });
        out.push(ModelEvent::Done {
            stop,
            usage,
            response_model: self.response_model.take(),
        });
        Ok(out)
    }
}

pub(crate) fn parse_arguments(args: &str) -> Value {
    if args.trim().is_empty() {
        return Value::Map(Vec::new());
    }
    match serde_json::from_str::<Json>(args) {
        Ok(json) => from_json(&json),
        Err(_) => Value::Text(args.to_string()),
    }
}

fn parse_usage(u: &Json) -> Usage {
    let n = |v: Option<&Json>| v.and_then(Json::as_u64).unwrap_or(0);
    let prompt = n(u.get("prompt_tokens"));
    let completion = n(u.get("completion_tokens"));
    let cached = n(u.pointer("/prompt_tokens_details/cached_tokens")).min(prompt);
    let reasoning = u
        .pointer("/completion_tokens_details/reasoning_tokens")
        .and_then(Json::as_u64);
    let total = u
        .get("total_tokens")
        .and_then(Json::as_u64)
        .unwrap_or(prompt + completion);
    Usage {
        input: prompt - cached,
        output: completion,
        cache_read: cached,
        cache_write: 0,
        reasoning,
        total_tokens: total,
        ..Usage::default()
    }
}

/// An `{"error": ...}` chunk in the middle of a stream (also the
/// Responses API's error events).
pub(crate) fn stream_error(error: &Json) -> Failure {
    let message = error
        .get("message")
        .and_then(Json::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("unknown error")
        .to_string();
    let kind = [error.get("type"), error.get("code")]
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v.as_str()
                .map(str::to_string)
                .or_else(|| v.as_u64().map(|c| c.to_string()))
        })
        .collect::<Vec<_>>()
        .join(" ");
    let transient = [
        "server_error",
        "overloaded",
        "rate_limit",
        "timeout",
        "500",
        "502",
        "503",
        "504",
        "429",
    ]
    .iter()
    .any(|k| kind.contains(k));
    let text = if kind.is_empty() {
        format!("the provider reported an error: {message}")
    } else {
        format!("the provider reported an error: {message} ({kind})")
    };
    if transient {
        Failure::transient(text)
    } else {
        Failure::permanent(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::tests::{assistant, call, req, text, tool, user};
    use crate::registry::{Api, builtin_models};
    use kernel::protocol::{AssistantStatus, Content, ToolStatus};

    fn provider(id: &str) -> ProviderConfig {
        let meta = builtin_models().into_iter().find(|m| m.id == id).unwrap();
        ProviderConfig::new(Api::OpenAiCompletions, "http://127.0.0.1:1/v1", meta)
    }

    fn image() -> Content {
        Content::Image {
            data: "AAAA".into(),
            mime_type: "image/png".into(),
        }
    }

    #[test]
    fn images_tool_calls_and_results_in_chat_completions_shape() {
        let context = vec![
            user("item-1", vec![text("what is this?"), image()]),
            assistant(
                "item-2",
                AssistantStatus::Complete(StopReason::ToolUse),
                vec![
                    Content::Thinking {
                        thinking: "hidden".into(),
                        redacted: None,
                        signature: None,
                    },
                    call(
                        "c1",
                        Value::Map(vec![("path".into(), Value::text("a.png"))]),
                    ),
                    call("c2", Value::text("{\"path\": ")),
                ],
            ),
            tool(
                "item-3",
                "c1",
                ToolStatus::Complete,
                vec![text("Read image file a.png"), image()],
            ),
            tool(
                "item-4",
                "c2",
                ToolStatus::Error,
                vec![text("bad arguments")],
            ),
        ];
        let body = body(&provider("gpt-4.1"), &req(context.clone(), None));
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6, "{m:#?}");
        assert_eq!(
            m[1]["content"][0],
            json!({"type": "text", "text": "what is this?"})
        );
        assert_eq!(
            m[1]["content"][1],
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
        );
        assert_eq!(m[2]["content"], Json::Null);
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"path\":\"a.png\"}"
        );
        assert_eq!(
            m[2]["tool_calls"][1]["function"]["arguments"],
            "{\"path\": "
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "Read image file a.png"})
        );
        assert_eq!(
            m[4],
            json!({"role": "tool", "tool_call_id": "c2", "content": "bad arguments"})
        );
        assert_eq!(m[5]["role"], "user");
        assert_eq!(m[5]["content"][1]["type"], "image_url");

        // A text-only model gets a note instead of the image.
        let mut p = provider("gpt-4.1");
        p.model.input = vec![kernel::protocol::InputKind::Text];
        let body = body_of(&p, context);
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5);
        assert!(
            m[1]["content"][1]["text"]
                .as_str()
                .unwrap()
                .contains("image omitted")
        );
        assert!(m[3]["content"].as_str().unwrap().contains("image omitted"));
    }

    fn body_of(p: &ProviderConfig, context: Vec<kernel::protocol::TranscriptItem>) -> Json {
        body(p, &req(context, None))
    }

    #[test]
    fn reasoning_effort_follows_the_thinking_level() {
        let p = provider("gpt-5");
        let mut r = req(vec![user("item-1", vec![text("hi")])], None);
        r.thinking_level = ThinkingLevel::High;
        assert_eq!(body(&p, &r)["reasoning_effort"], "high");
        r.thinking_level = ThinkingLevel::Minimal;
        assert_eq!(body(&p, &r)["reasoning_effort"], "minimal");
        r.purpose = Purpose::Summarize;
        let b = body(&p, &r);
        assert!(b.get("reasoning_effort").is_none() && b.get("tools").is_none());
    }

    #[test]
    fn tool_calls_without_index_and_invalid_arguments() {
        let p = provider("gpt-4.1");
        let mut t = Translator::new(&p);
        let ev = |data: &str| SseEvent {
            event: None,
            data: data.into(),
        };
        let mut out = Vec::new();
        for data in [
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"bash","arguments":"{\"comm"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"and\": 1"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"read","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        ] {
            out.extend(t.on_event(&ev(data)).unwrap());
        }
        out.extend(t.finish().unwrap());
        let inputs: Vec<&Value> = out
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ToolInput { input } => Some(input),
                _ => None,
            })
            .collect();
        assert_eq!(
            inputs,
            [&Value::text("{\"command\": 1"), &Value::Map(vec![])]
        );
        assert!(matches!(
            out.last(),
            Some(ModelEvent::Done {
                stop: StopReason::ToolUse,
                usage: None,
                ..
            })
        ));
    }

    #[test]
    fn content_filter_and_mid_stream_errors_fail() {
        let p = provider("gpt-4.1");
        let ev = |data: &str| SseEvent {
            event: None,
            data: data.into(),
        };
        let mut t = Translator::new(&p);
        t.on_event(&ev(
            r#"{"choices":[{"delta":{},"finish_reason":"content_filter"}]}"#,
        ))
        .unwrap();
        assert!(!t.finish().unwrap_err().retryable);
        let mut t = Translator::new(&p);
        let e = t
            .on_event(&ev(
                r#"{"error":{"message":"The server had an error","type":"server_error"}}"#,
            ))
            .unwrap_err();
        assert!(
            e.retryable && e.message.contains("The server had an error"),
            "{e:?}"
        );
    }
}
