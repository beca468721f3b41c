//! The streaming providers against a local mock HTTP server replaying
//! recorded SSE streams (`tests/fixtures/sse/`). No test touches the network.

use kernel::protocol::{
    AssistantItem, AssistantStatus, Content, DeltaKind, ModelRef, StopReason, ThinkingLevel,
    ToolItem, ToolStatus, TranscriptItem, UserItem,
};
use kernel::wire::Value;
use pi_agent::registry::builtin_models;
use pi_agent::{
    Api, CancellationToken, ModelEvent, ModelRequest, ProviderConfig, Purpose, Timeouts, stream,
};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

mod common;
use common::{Body, Mock, Reply, error, fixture, sse};

// ---- calls ---------------------------------------------------------------------------

fn model(provider: &str, id: &str) -> kernel::protocol::ModelMetadata {
    builtin_models()
        .into_iter()
        .find(|m| m.provider == provider && m.id == id)
        .unwrap()
}

fn openai(mock: &Mock) -> ProviderConfig {
    let mut p = ProviderConfig::new(
        Api::OpenAiCompletions,
        &format!("{}/v1", mock.base),
        model("openai", "gpt-4.1"),
    );
    p.api_key = Some("sk-test".into());
    p.max_tokens_field = Some("max_completion_tokens".into());
    p.cwd = "/home/me/project".into();
    p
}

fn anthropic(mock: &Mock) -> ProviderConfig {
    let meta = model("anthropic", "claude-sonnet-4-5");
    let mut p = ProviderConfig::new(Api::AnthropicMessages, &mock.base, meta);
    p.api_key = Some("sk-ant-test".into());
    p
}

fn user(id: &str, text: &str) -> TranscriptItem {
    TranscriptItem::User(UserItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        timestamp: 0,
    })
}

fn request(p: &ProviderConfig, level: ThinkingLevel, context: Vec<TranscriptItem>) -> ModelRequest {
    ModelRequest {
        model: ModelRef {
            provider: p.model.provider.clone(),
            id: p.model.id.clone(),
        },
        thinking_level: level,
        purpose: Purpose::Reply,
        summary: None,
        instructions: None,
        context: context.into(),
        approvals: Default::default(),
    }
}

async fn call(p: &ProviderConfig, request: &ModelRequest) -> Vec<ModelEvent> {
    let (tx, mut rx) = mpsc::channel(16);
    let p = p.clone();
    let request = request.clone();
    let task =
        tokio::spawn(async move { stream(&p, &request, tx, CancellationToken::new()).await });
    let mut events = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("no hang")
    {
        events.push(e);
    }
    task.await.unwrap();
    events
}

fn joined(events: &[ModelEvent], kind: DeltaKind) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::Delta { kind: k, text } if *k == kind => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn failure(events: &[ModelEvent]) -> (String, bool, Option<u64>) {
    match events.last() {
        Some(ModelEvent::Failed {
            message,
            retryable,
            retry_after_ms,
        }) => (message.clone(), *retryable, *retry_after_ms),
        other => panic!("expected Failed last, got {other:?} in {events:?}"),
    }
}

fn terminal_count(events: &[ModelEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, ModelEvent::Done { .. } | ModelEvent::Failed { .. }))
        .count()
}

fn obj(pairs: &[(&str, Value)]) -> Value {
    Value::Map(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

// ---- OpenAI-compatible ------------------------------------------------------------------

#[tokio::test]
async fn openai_text_stream_with_usage_cost_and_request_shape() {
    let mock = Mock::start(sse("openai-text.sse")).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(
        joined(&events, DeltaKind::Text),
        "Hello, wörld — ready when you are."
    );
    assert_eq!(terminal_count(&events), 1);
    let ModelEvent::Done {
        stop,
        usage,
        response_model,
    } = events.last().unwrap()
    else {
        panic!("{events:?}")
    };
    assert_eq!(*stop, StopReason::Stop);
    assert_eq!(response_model.as_deref(), Some("gpt-4.1-2025-04-14"));
    let usage = usage.clone().expect("usage");
    assert_eq!(
        (
            usage.input,
            usage.cache_read,
            usage.output,
            usage.total_tokens
        ),
        (200, 1000, 9, 1209)
    );
    // gpt-4.1: $2 in, $8 out, $0.50 cached, per million tokens.
    let want = 200.0 * 2.0 / 1e6 + 9.0 * 8.0 / 1e6 + 1000.0 * 0.5 / 1e6;
    assert!((usage.cost.total - want).abs() < 1e-12, "{:?}", usage.cost);

    let req = mock.request();
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(req.header("authorization"), Some("Bearer sk-test"));
    let body = &req.body;
    assert_eq!(body["model"], "gpt-4.1");
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(body["max_completion_tokens"], 32768);
    assert_eq!(body["messages"][0]["role"], "system");
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("/home/me/project") && system.contains("- bash:"),
        "{system}"
    );
    assert_eq!(
        body["messages"][1],
        serde_json::json!({"role": "user", "content": "hi"})
    );
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["read", "write", "edit", "bash", "grep", "find", "ls"]
    );
    assert!(body.get("reasoning_effort").is_none());
}

#[tokio::test]
async fn openai_reasoning_content_streams_as_thinking() {
    let mock = Mock::start(sse("openai-thinking.sse")).await;
    let mut p = openai(&mock);
    p.api_key = None; // a local server without a key
    p.max_tokens_field = None;
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hello")]),
    )
    .await;
    assert_eq!(
        joined(&events, DeltaKind::Thinking),
        "The user greets me. I should answer briefly. (vLLM spelling)"
    );
    assert_eq!(joined(&events, DeltaKind::Text), "Hi!");
    assert!(matches!(
        &events[0],
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            ..
        }
    ));
    let ModelEvent::Done {
        stop,
        usage,
        response_model,
    } = events.last().unwrap()
    else {
        panic!()
    };
    assert_eq!(*stop, StopReason::Length);
    assert_eq!(usage.as_ref().unwrap().output, 14);
    assert_eq!(response_model.as_deref(), Some("qwen3-8b"));
    let req = mock.request();
    assert_eq!(req.header("authorization"), None);
    assert!(
        req.body.get("max_completion_tokens").is_none() && req.body.get("max_tokens").is_none()
    );
}

#[tokio::test]
async fn openai_tool_calls_stream_fragments_then_parsed_inputs() {
    let mock = Mock::start(sse("openai-tools.sse")).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "look")]),
    )
    .await;
    // In the model's key order (serde_json's `preserve_order`).
    let path = obj(&[
        ("path", Value::text("src/main.rs")),
        ("limit", Value::Int(20)),
    ]);
    let want = vec![
        ModelEvent::Delta {
            kind: DeltaKind::Text,
            text: "Let me look.".into(),
        },
        ModelEvent::ToolCall {
            tool_call_id: "call_aaa111".into(),
            tool_name: "read".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "{\"pa".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "th\": \"src/m".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "ain.rs\", \"limit\": 20}".into(),
        },
        ModelEvent::ToolInput { input: path },
        ModelEvent::ToolCall {
            tool_call_id: "call_bbb222".into(),
            tool_name: "bash".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "{\"command\": \"ls -la\"}".into(),
        },
        ModelEvent::ToolInput {
            input: obj(&[("command", Value::text("ls -la"))]),
        },
    ];
    assert_eq!(events[..want.len()], want[..]);
    assert!(matches!(
        events[want.len()..],
        [ModelEvent::Done {
            stop: StopReason::ToolUse,
            usage: Some(_),
            ..
        }]
    ));
}

#[tokio::test]
async fn openai_http_400_is_permanent_with_the_provider_message() {
    let mock = Mock::start(error(400, "openai-error-400.json", vec![])).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, after) = failure(&events);
    assert_eq!(events.len(), 1);
    assert!(!retryable && after.is_none());
    assert!(
        message.starts_with("openai: HTTP 400 Bad Request: The model `gpt-nope` does not exist"),
        "{message}"
    );
}

#[tokio::test]
async fn http_429_is_retryable_with_retry_after_seconds_or_date() {
    let mock = Mock::start(error(
        429,
        "openai-error-429.json",
        vec![("retry-after", "7".into())],
    ))
    .await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, after) = failure(&events);
    assert!(retryable, "{message}");
    assert_eq!(after, Some(7000));
    assert!(
        message.contains("HTTP 429") && message.contains("Rate limit reached"),
        "{message}"
    );

    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
    let mock = Mock::start(error(
        429,
        "openai-error-429.json",
        vec![("retry-after", date)],
    ))
    .await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (_, retryable, after) = failure(&events);
    assert!(retryable);
    let after = after.expect("retry-after date");
    assert!((100_000..=121_000).contains(&after), "{after}");
}

#[tokio::test]
async fn http_500_and_anthropic_529_are_retryable() {
    let reply = Reply::Respond {
        status: 500,
        headers: vec![],
        body: Body::UntilClose(b"upstream exploded".to_vec()),
    };
    let mock = Mock::start(reply).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(retryable);
    assert_eq!(
        message,
        "openai: HTTP 500 Internal Server Error: upstream exploded"
    );

    let mock = Mock::start(error(529, "anthropic-error-529.json", vec![])).await;
    let p = anthropic(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(
        retryable && message.contains("HTTP 529") && message.contains("Overloaded"),
        "{message}"
    );
}

#[tokio::test]
async fn malformed_sse_is_permanent() {
    let mock = Mock::start(sse("openai-malformed.sse")).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "Hel");
    let (message, retryable, _) = failure(&events);
    assert!(!retryable);
    assert!(
        message.starts_with("openai: malformed stream: invalid JSON"),
        "{message}"
    );
}

#[tokio::test]
async fn a_stream_that_ends_without_a_stop_is_retryable() {
    let reply = Reply::Respond {
        status: 200,
        headers: vec![],
        body: Body::UntilClose(fixture("openai-truncated.sse")),
    };
    let mock = Mock::start(reply).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "This reply stops half");
    let (message, retryable, _) = failure(&events);
    assert!(retryable);
    assert!(message.contains("stream ended unexpectedly"), "{message}");
}

/// A stream whose server closed it cleanly in the middle of an event's line
/// (no blank line after it): the unfinished event is discarded, as the SSE
/// standard says, so this is a stream that ended early (retryable), not a
/// malformed one.
#[tokio::test]
async fn a_stream_cut_mid_line_is_retryable_not_malformed() {
    let mut bytes = fixture("openai-truncated.sse");
    bytes.extend_from_slice(b"data: {\"id\":\"chatcmpl-cut\",\"choices\":[{\"delta\":{\"cont");
    let reply = Reply::Respond {
        status: 200,
        headers: vec![],
        body: Body::UntilClose(bytes),
    };
    let mock = Mock::start(reply).await;
    let p = openai(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "This reply stops half");
    let (message, retryable, _) = failure(&events);
    assert!(retryable, "{message}");
    assert!(message.contains("stream ended unexpectedly"), "{message}");
}

#[tokio::test]
async fn a_disconnect_mid_stream_is_a_retryable_network_error() {
    let bytes = fixture("anthropic-text.sse");
    let cut = bytes.len() / 2;
    let body = Body::Chunked {
        bytes: bytes[..cut].to_vec(),
        piece: 64,
        delay: Duration::ZERO,
        complete: false,
    };
    let mock = Mock::start(Reply::Respond {
        status: 200,
        headers: vec![],
        body,
    })
    .await;
    let p = anthropic(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(retryable, "{message}");
    assert!(
        message.starts_with("anthropic: network error while streaming"),
        "{message}"
    );
    assert_eq!(terminal_count(&events), 1);
}

#[tokio::test]
async fn connection_refused_is_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let meta = model("openai", "gpt-4.1");
    let p = ProviderConfig::new(Api::OpenAiCompletions, &format!("http://{addr}/v1"), meta);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(retryable);
    assert!(
        message.starts_with(&format!(
            "openai: cannot connect to http://{addr}/v1/chat/completions"
        )),
        "{message}"
    );
}

#[tokio::test]
async fn no_answer_hits_the_first_byte_timeout() {
    let mock = Mock::start(Reply::Hang).await;
    let mut p = openai(&mock);
    p.timeouts = Timeouts {
        first_byte: Duration::from_millis(300),
        ..Timeouts::default()
    };
    let started = Instant::now();
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(
        retryable && message.contains("first-byte timeout"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_stalled_stream_hits_the_idle_timeout() {
    let first = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n".to_vec();
    let mock = Mock::start(Reply::Respond {
        status: 200,
        headers: vec![],
        body: Body::Stall(first),
    })
    .await;
    let mut p = openai(&mock);
    p.timeouts = Timeouts {
        idle: Duration::from_millis(300),
        ..Timeouts::default()
    };
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "Hi");
    let (message, retryable, _) = failure(&events);
    assert!(retryable && message.contains("idle timeout"), "{message}");
}

#[tokio::test]
async fn cancelling_drops_the_http_stream_promptly() {
    // A long stream: a delta every 50 ms for ~10 s.
    let mut bytes = Vec::new();
    for i in 0..200 {
        bytes.extend_from_slice(
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}}}}]}}\n\n"
            )
            .as_bytes(),
        );
    }
    let piece = bytes.len() / 200;
    let body = Body::Chunked {
        bytes,
        piece,
        delay: Duration::from_millis(50),
        complete: true,
    };
    let mock = Mock::start(Reply::Respond {
        status: 200,
        headers: vec![],
        body,
    })
    .await;
    let p = openai(&mock);
    let req = request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]);
    let (tx, mut rx) = mpsc::channel(16);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move { stream(&p, &req, tx, cancel).await }
    });
    let first = rx.recv().await.expect("a first delta");
    assert!(matches!(first, ModelEvent::Delta { .. }));
    let cancelled_at = Instant::now();
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("returns promptly")
        .unwrap();
    // Nothing after the cancellation: no Done, no Failed.
    let mut rest = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
        rest.push(e);
    }
    assert_eq!(terminal_count(&rest), 0, "{rest:?}");
    // The server sees the connection closed.
    for _ in 0..100 {
        if mock.closed_at.lock().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let closed = mock
        .closed_at
        .lock()
        .unwrap()
        .expect("the client closed the connection");
    assert!(closed.duration_since(cancelled_at) < Duration::from_secs(2));
}

// ---- Anthropic -----------------------------------------------------------------------------

#[tokio::test]
async fn anthropic_text_stream_with_usage_and_request_shape() {
    let mock = Mock::start(sse("anthropic-text.sse")).await;
    let p = anthropic(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "Hello, wörld — ready.");
    let ModelEvent::Done {
        stop,
        usage,
        response_model,
    } = events.last().unwrap()
    else {
        panic!()
    };
    assert_eq!(*stop, StopReason::Stop);
    assert_eq!(
        response_model.as_deref(),
        Some("claude-sonnet-4-5-20250929")
    );
    let u = usage.clone().unwrap();
    assert_eq!(
        (
            u.input,
            u.output,
            u.cache_read,
            u.cache_write,
            u.total_tokens
        ),
        (472, 15, 2000, 100, 2587)
    );
    let want = (472.0 * 3.0 + 15.0 * 15.0 + 2000.0 * 0.3 + 100.0 * 3.75) / 1e6;
    assert!((u.cost.total - want).abs() < 1e-12);

    let req = mock.request();
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(req.body["model"], "claude-sonnet-4-5");
    assert_eq!(req.body["max_tokens"], 64000);
    assert_eq!(req.body["stream"], true);
    assert!(
        req.body["system"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Available tools")
    );
    assert_eq!(
        req.body["system"][0]["cache_control"],
        serde_json::json!({"type": "ephemeral"}),
        "the system prompt is cached"
    );
    assert_eq!(
        req.body["messages"],
        serde_json::json!([{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]),
        "the last user message is the cache breakpoint"
    );
    assert_eq!(req.body["tools"][0]["name"], "read");
    assert!(req.body["tools"][0]["input_schema"]["properties"]["path"].is_object());
    assert!(req.body.get("thinking").is_none());
}

#[tokio::test]
async fn anthropic_thinking_then_tool_use_and_the_signature_is_sent_back() {
    let mock = Mock::start(sse("anthropic-thinking-tools.sse")).await;
    let p = anthropic(&mock);
    let events = call(
        &p,
        &request(
            &p,
            ThinkingLevel::Medium,
            vec![user("item-1", "fix lib.rs")],
        ),
    )
    .await;
    // The model's key order is kept (serde_json's `preserve_order`, as a
    // JavaScript object keeps it).
    let input = obj(&[
        ("path", Value::text("src/lib.rs")),
        ("offset", Value::Int(10)),
    ]);
    let want = [
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            text: "I need to see the file".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            text: " before editing it.".into(),
        },
        ModelEvent::Signature {
            signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::Text,
            text: "Reading it now.".into(),
        },
        ModelEvent::ToolCall {
            tool_call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
            tool_name: "read".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "{\"path\": \"src/li".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "b.rs\", \"offset\": 10}".into(),
        },
        ModelEvent::ToolInput {
            input: input.clone(),
        },
    ];
    assert_eq!(events[..want.len()], want[..]);
    assert!(matches!(
        events[want.len()..],
        [ModelEvent::Done {
            stop: StopReason::ToolUse,
            ..
        }]
    ));
    assert_eq!(
        mock.request().body["thinking"],
        serde_json::json!({"type": "enabled", "budget_tokens": 10240})
    );

    // The next call of the tool loop sends the signed thinking block back, with thinking on.
    let reply = AssistantItem {
        id: "item-2".into(),
        content: vec![
            Content::Thinking {
                thinking: "I need to see the file before editing it.".into(),
                redacted: None,
                signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds".into()),
            },
            Content::Text {
                text: "Reading it now.".into(),
            },
            Content::ToolCall {
                tool_call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                tool_name: "read".into(),
                input,
            },
        ],
        model: ModelRef {
            provider: "anthropic".into(),
            id: "claude-sonnet-4-5".into(),
        },
        response_model: None,
        usage: None,
        timestamp: 0,
        status: AssistantStatus::Complete(StopReason::ToolUse),
        error_message: None,
    };
    let tool = ToolItem {
        id: "item-3".into(),
        tool_call_id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
        tool_name: "read".into(),
        input: Value::Map(vec![]),
        content: vec![Content::Text {
            text: "fn main() {}".into(),
        }],
        details: None,
        usage: None,
        timestamp: 0,
        status: ToolStatus::Complete,
    };
    let context = vec![
        user("item-1", "fix lib.rs"),
        TranscriptItem::Assistant(reply),
        TranscriptItem::Tool(tool),
    ];
    let mock2 = Mock::start(sse("anthropic-text.sse")).await;
    let p2 = anthropic(&mock2);
    call(&p2, &request(&p2, ThinkingLevel::Medium, context.clone())).await;
    let body = mock2.request().body;
    assert_eq!(body["thinking"]["type"], "enabled");
    let assistant = &body["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"][0]["type"], "thinking");
    assert_eq!(
        assistant["content"][0]["signature"],
        "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    );
    assert_eq!(assistant["content"][2]["type"], "tool_use");
    assert_eq!(
        assistant["content"][2]["input"],
        serde_json::json!({"offset": 10, "path": "src/lib.rs"})
    );
    let results = &body["messages"][2];
    assert_eq!(results["role"], "user");
    assert_eq!(results["content"][0]["type"], "tool_result");
    assert_eq!(
        results["content"][0]["tool_use_id"],
        "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
    );
    assert_eq!(results["content"][0]["is_error"], false);
    // Two cache breakpoints: the system prompt and the tool results, the
    // last user message; the first prompt is no longer marked.
    assert_eq!(
        results["content"][0]["cache_control"],
        serde_json::json!({"type": "ephemeral"})
    );
    assert!(
        body["messages"][0]["content"][0]
            .get("cache_control")
            .is_none()
    );
    assert_eq!(body.to_string().matches("cache_control").count(), 2);

    // Without the signature (thinking another provider wrote), the thinking
    // block is left out and thinking is off.
    let mut context = context;
    if let TranscriptItem::Assistant(reply) = &mut context[1]
        && let Content::Thinking { signature, .. } = &mut reply.content[0]
    {
        *signature = None;
    }
    let mock3 = Mock::start(sse("anthropic-text.sse")).await;
    let p3 = anthropic(&mock3);
    call(&p3, &request(&p3, ThinkingLevel::Medium, context)).await;
    let body = mock3.request().body;
    assert!(body.get("thinking").is_none());
    assert_eq!(body["messages"][1]["content"][0]["type"], "text");
}

#[tokio::test]
async fn anthropic_error_event_mid_stream_is_retryable_when_overloaded() {
    let mock = Mock::start(sse("anthropic-overloaded.sse")).await;
    let p = anthropic(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "Partial");
    let (message, retryable, _) = failure(&events);
    assert!(retryable);
    assert_eq!(
        message,
        "anthropic: the provider reported an error: Overloaded (overloaded_error)"
    );
}

#[tokio::test]
async fn anthropic_http_400_is_permanent_with_the_provider_message() {
    let mock = Mock::start(error(400, "anthropic-error-400.json", vec![])).await;
    let p = anthropic(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(!retryable);
    assert!(
        message.starts_with("anthropic: HTTP 400 Bad Request: max_tokens: 100000 > 64000"),
        "{message}"
    );
    assert!(message.ends_with("(invalid_request_error)"), "{message}");
}

#[tokio::test]
async fn summarize_requests_carry_no_tools_and_the_serialised_conversation() {
    let mock = Mock::start(sse("anthropic-text.sse")).await;
    let p = anthropic(&mock);
    let mut req = request(
        &p,
        ThinkingLevel::High,
        vec![
            user("item-1", "build the parser"),
            user("item-2", "and test it"),
        ],
    );
    req.purpose = Purpose::Summarize;
    req.summary = Some("Earlier: set up the crate.".into());
    let events = call(&p, &req).await;
    assert!(matches!(events.last(), Some(ModelEvent::Done { .. })));
    let body = mock.request().body;
    assert!(body.get("tools").is_none() && body.get("thinking").is_none());
    assert!(
        body["system"][0]["text"]
            .as_str()
            .unwrap()
            .contains("summary")
    );
    let text = body["messages"][0]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("<previous-summary>\nEarlier: set up the crate.")
            && text.contains("[user]: and test it"),
        "{text}"
    );
}

// ---- OpenAI Responses ----------------------------------------------------------------------

fn responses(mock: &Mock) -> ProviderConfig {
    let mut p = ProviderConfig::new(
        Api::OpenAiResponses,
        &format!("{}/v1", mock.base),
        model("openai", "gpt-5"),
    );
    p.api_key = Some("sk-test".into());
    p
}

#[tokio::test]
async fn responses_text_stream_with_cached_usage_and_request_shape() {
    let mock = Mock::start(sse("openai-responses-text.sse")).await;
    let p = responses(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "Hello, wörld — ready.");
    assert_eq!(terminal_count(&events), 1);
    let Some(ModelEvent::Done {
        stop,
        usage,
        response_model,
    }) = events.last()
    else {
        panic!("{events:?}")
    };
    assert_eq!(*stop, StopReason::Stop);
    assert_eq!(response_model.as_deref(), Some("gpt-5-2025-08-07"));
    let u = usage.clone().expect("usage");
    assert_eq!(
        (u.input, u.cache_read, u.output, u.total_tokens),
        (300, 1200, 12, 1512)
    );
    // gpt-5: $1.25 in, $10 out, $0.125 cached, per million tokens.
    let want = (300.0 * 1.25 + 12.0 * 10.0 + 1200.0 * 0.125) / 1e6;
    assert!((u.cost.total - want).abs() < 1e-12, "{:?}", u.cost);

    let req = mock.request();
    assert_eq!(req.path, "/v1/responses");
    assert_eq!(req.header("authorization"), Some("Bearer sk-test"));
    let body = &req.body;
    assert_eq!(body["model"], "gpt-5");
    assert_eq!(
        (body["stream"].clone(), body["store"].clone()),
        (true.into(), false.into())
    );
    assert!(
        body["instructions"]
            .as_str()
            .unwrap()
            .contains("Available tools")
    );
    assert_eq!(
        body["input"],
        serde_json::json!([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    );
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["name"], "read");
    assert!(body["tools"][0]["parameters"]["properties"]["path"].is_object());
    assert!(body.get("reasoning").is_none() && body.get("previous_response_id").is_none());
}

#[tokio::test]
async fn responses_reasoning_then_a_tool_call_then_the_result_and_the_answer() {
    let mock = Mock::sequence(vec![
        sse("openai-responses-reasoning-tools.sse"),
        sse("openai-responses-text.sse"),
    ])
    .await;
    let p = responses(&mock);
    let events = call(
        &p,
        &request(
            &p,
            ThinkingLevel::Medium,
            vec![user("item-1", "fix lib.rs")],
        ),
    )
    .await;
    let input = obj(&[
        ("path", Value::text("src/lib.rs")),
        ("offset", Value::Int(10)),
    ]);
    let want = [
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            text: "**Reading the file**".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            text: " before changing it.".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            text: "\n\n".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::Thinking,
            text: "Then edit.".into(),
        },
        ModelEvent::ToolCall {
            tool_call_id: "call_R3adF1le".into(),
            tool_name: "read".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "{\"path\": \"src/li".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "b.rs\", \"offset\": 10}".into(),
        },
        ModelEvent::ToolInput {
            input: input.clone(),
        },
    ];
    assert_eq!(events[..want.len()], want[..]);
    let [
        ModelEvent::Done {
            stop: StopReason::ToolUse,
            usage: Some(u),
            ..
        },
    ] = &events[want.len()..]
    else {
        panic!("{events:?}")
    };
    assert_eq!(u.reasoning, Some(128));
    assert_eq!(
        mock.request().body["reasoning"],
        serde_json::json!({"effort": "medium", "summary": "auto"})
    );

    // The tool ran; the next call replays the whole turn, statelessly.
    let reply = AssistantItem {
        id: "item-2".into(),
        content: vec![
            Content::Thinking {
                thinking: "**Reading the file** before changing it.".into(),
                redacted: None,
                signature: None,
            },
            Content::ToolCall {
                tool_call_id: "call_R3adF1le".into(),
                tool_name: "read".into(),
                input,
            },
        ],
        model: ModelRef {
            provider: "openai".into(),
            id: "gpt-5".into(),
        },
        response_model: None,
        usage: None,
        timestamp: 0,
        status: AssistantStatus::Complete(StopReason::ToolUse),
        error_message: None,
    };
    let tool = ToolItem {
        id: "item-3".into(),
        tool_call_id: "call_R3adF1le".into(),
        tool_name: "read".into(),
        input: Value::Map(vec![]),
        content: vec![Content::Text {
            text: "pub fn lib() {}".into(),
        }],
        details: None,
        usage: None,
        timestamp: 0,
        status: ToolStatus::Complete,
    };
    let context = vec![
        user("item-1", "fix lib.rs"),
        TranscriptItem::Assistant(reply),
        TranscriptItem::Tool(tool),
    ];
    let events = call(&p, &request(&p, ThinkingLevel::Medium, context)).await;
    assert_eq!(joined(&events, DeltaKind::Text), "Hello, wörld — ready.");
    assert!(matches!(
        events.last(),
        Some(ModelEvent::Done {
            stop: StopReason::Stop,
            ..
        })
    ));
    let second = &mock.requests()[1].body;
    assert_eq!(second["store"], false);
    assert_eq!(
        second["input"],
        serde_json::json!([
            {"role": "user", "content": [{"type": "input_text", "text": "fix lib.rs"}]},
            {"type": "function_call", "call_id": "call_R3adF1le", "name": "read",
             "arguments": "{\"path\":\"src/lib.rs\",\"offset\":10}"},
            {"type": "function_call_output", "call_id": "call_R3adF1le", "output": "pub fn lib() {}"},
        ])
    );
}

#[tokio::test]
async fn responses_failed_mid_stream_is_retryable_for_a_server_error() {
    let mock = Mock::start(sse("openai-responses-failed.sse")).await;
    let p = responses(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    assert_eq!(joined(&events, DeltaKind::Text), "Partial");
    let (message, retryable, _) = failure(&events);
    assert!(retryable, "{message}");
    assert_eq!(
        message,
        "openai: the provider reported an error: The server had an error while processing \
         your request. (server_error)"
    );
    assert_eq!(terminal_count(&events), 1);
}

#[tokio::test]
async fn responses_context_overflow_is_recognised_for_recovery() {
    let mock = Mock::start(error(400, "openai-responses-overflow-400.json", vec![])).await;
    let p = responses(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(!retryable, "{message}");
    assert!(
        message.starts_with("openai: HTTP 400 Bad Request: Your input exceeds the context window"),
        "{message}"
    );
    assert!(
        kernel::runtime::is_context_overflow(&message),
        "the runtime compacts and retries on it: {message}"
    );

    // The same error inside the stream.
    let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":\
        {\"status\":\"failed\",\"error\":{\"code\":\"context_length_exceeded\",\
        \"message\":\"Your input exceeds the context window of this model.\"}}}\n\n";
    let mock = Mock::start(Reply::Respond {
        status: 200,
        headers: vec![],
        body: Body::UntilClose(failed.as_bytes().to_vec()),
    })
    .await;
    let p = responses(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(
        !retryable && kernel::runtime::is_context_overflow(&message),
        "{message}"
    );
}

#[tokio::test]
async fn responses_stream_without_completed_is_retryable() {
    let cut: Vec<u8> = fixture("openai-responses-text.sse")
        .split(|b| *b == b'\n')
        .take(12)
        .flat_map(|l| l.iter().copied().chain([b'\n']))
        .collect();
    let mock = Mock::start(Reply::Respond {
        status: 200,
        headers: vec![],
        body: Body::UntilClose(cut),
    })
    .await;
    let p = responses(&mock);
    let events = call(
        &p,
        &request(&p, ThinkingLevel::Off, vec![user("item-1", "hi")]),
    )
    .await;
    let (message, retryable, _) = failure(&events);
    assert!(retryable, "{message}");
    assert!(message.contains("no response.completed"), "{message}");
}
