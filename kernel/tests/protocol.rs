//! Protocol v1 schema layer: typed messages ↔ `Value` ↔ CBOR bytes.
//!
//! - Byte vectors: messages built here must encode to exactly the bytes the
//!   reference encoder (`@earendil-works/pi-protocol` 0.84.4, `encodeCbor`)
//!   produces for the same object written in schema key order, and those
//!   bytes must decode back to the same typed message. The reference's
//!   `parseServerMessage`/`parseClientMessage` accepted every vector.
//! - Rejections: one test per class of schema violation, on `Value` trees.
//! - Round trip: arbitrary messages of every variant survive
//!   `decode(encode(m))`, through `Value` and through bytes.

use kernel::map;
use kernel::protocol::codec::{self, MAX_ERROR_LEN, Schema};
use kernel::protocol::*;
use kernel::wire::{CborLimits, MAX_SAFE_INTEGER, Value};
use proptest::prelude::*;

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(s: &str) -> Value {
    Value::text(s)
}

// ---------------------------------------------------------------------------
// Fixtures matching the reference vectors.
// ---------------------------------------------------------------------------

fn model_ref() -> ModelRef {
    ModelRef {
        provider: "anthropic".into(),
        id: "claude-sonnet-4".into(),
    }
}

fn tool_input() -> Value {
    map! {
        "command" => text("ls -la"),
        "timeout" => Value::Int(30),
        "env" => Value::Null,
        "flags" => Value::Array(vec![Value::Bool(true), Value::Float(1.5), text("x")]),
    }
}

fn server_hello() -> ServerMessage {
    let models = vec![
        ModelMetadata {
            provider: "anthropic".into(),
            id: "claude-sonnet-4".into(),
            name: "Claude Sonnet 4".into(),
            api: "anthropic-messages".into(),
            reasoning: true,
            input: vec![InputKind::Text, InputKind::Image],
            context_window: 200_000,
            max_tokens: 64_000,
            cost: ModelCost {
                input: 3.0,
                output: 15.0,
                cache_read: 0.3,
                cache_write: 3.75,
            },
            supported_thinking_levels: vec![
                ThinkingLevel::Off,
                ThinkingLevel::Low,
                ThinkingLevel::Medium,
                ThinkingLevel::High,
            ],
            authenticated: true,
        },
        ModelMetadata {
            provider: "openai".into(),
            id: "gpt-5-mini".into(),
            name: "GPT-5 mini".into(),
            api: "openai-responses".into(),
            reasoning: false,
            input: vec![InputKind::Text],
            context_window: 1,
            max_tokens: 1,
            cost: ModelCost::default(),
            supported_thinking_levels: vec![ThinkingLevel::Off],
            authenticated: false,
        },
    ];
    let sessions = vec![
        SessionMetadata {
            id: "s1".into(),
            created_at: 1_700_000_000_000,
            updated_at: None,
            parent_session_id: None,
            session_name: None,
            cwd: None,
        },
        SessionMetadata {
            id: "s2".into(),
            created_at: 1_700_000_000_001,
            updated_at: Some(1_700_000_005_000),
            parent_session_id: Some("s1".into()),
            session_name: Some("fork of s1".into()),
            cwd: Some("/home/u/p".into()),
        },
    ];
    ServerMessage::Hello(ServerHello {
        version: 1,
        connection_id: "c-1".into(),
        snapshot: ServerSnapshot {
            server_id: "srv".into(),
            protocol_version: 1,
            revision: 7,
            sessions,
            models,
        },
    })
}

const SERVER_HELLO_HEX: &str = "a464747970656568656c6c6f6776657273696f6e016c636f6e6e656374696f6e496463632d3168736e617073686f74a5687365727665724964637372766f70726f746f636f6c56657273696f6e01687265766973696f6e076873657373696f6e7382a2626964627331696372656174656441741b0000018bcfe56800a6626964627332696372656174656441741b0000018bcfe56801697570646174656441741b0000018bcfe57b886f706172656e7453657373696f6e49646273316b73657373696f6e4e616d656a666f726b206f6620733163637764692f686f6d652f752f70666d6f64656c7382ab6870726f766964657269616e7468726f7069636269646f636c617564652d736f6e6e65742d34646e616d656f436c6175646520536f6e6e657420346361706972616e7468726f7069632d6d6573736167657369726561736f6e696e67f565696e70757482647465787465696d6167656d636f6e7465787457696e646f771a00030d40696d6178546f6b656e7319fa0064636f7374a465696e70757403666f75747075740f69636163686552656164fb3fd33333333333336a63616368655772697465fb400e00000000000077737570706f727465645468696e6b696e674c6576656c7384636f6666636c6f77666d656469756d64686967686d61757468656e74696361746564f5ab6870726f7669646572666f70656e61696269646a6770742d352d6d696e69646e616d656a4750542d35206d696e6963617069706f70656e61692d726573706f6e73657369726561736f6e696e67f465696e7075748164746578746d636f6e7465787457696e646f7701696d6178546f6b656e730164636f7374a465696e70757400666f75747075740069636163686552656164006a636163686557726974650077737570706f727465645468696e6b696e674c6576656c7381636f66666d61757468656e74696361746564f4";

fn snapshot_with_transcript() -> SessionSnapshot {
    let user = UserItem {
        id: "u1".into(),
        content: vec![
            Content::Text {
                text: "list files".into(),
            },
            Content::Image {
                data: "iVBORw0KGgo=".into(),
                mime_type: "image/png".into(),
            },
        ],
        timestamp: 1_700_000_001_000,
    };
    let assistant = AssistantItem {
        id: "a1".into(),
        content: vec![
            Content::Thinking {
                thinking: "need ls".into(),
                redacted: Some(false),
                signature: None,
            },
            Content::Text {
                text: "Running ls.".into(),
            },
            Content::ToolCall {
                tool_call_id: "call_1".into(),
                tool_name: "bash".into(),
                input: tool_input(),
            },
        ],
        model: model_ref(),
        response_model: Some("claude-sonnet-4-20250514".into()),
        usage: Some(Usage {
            input: 1200,
            output: 345,
            cache_read: 0,
            cache_write: 100_000,
            reasoning: Some(20),
            total_tokens: 101_565,
            cost: UsageCost {
                input: 0.0036,
                output: 0.005175,
                cache_read: 0.0,
                cache_write: 0.375,
                total: 0.383775,
            },
        }),
        timestamp: 1_700_000_002_000,
        status: AssistantStatus::Complete(StopReason::ToolUse),
        error_message: None,
    };
    let tool = ToolItem {
        id: "t1".into(),
        tool_call_id: "call_1".into(),
        tool_name: "bash".into(),
        input: tool_input(),
        content: vec![Content::Text {
            text: "a.txt\nb.txt".into(),
        }],
        details: Some(map! { "exitCode" => Value::Int(2), "truncated" => Value::Bool(false) }),
        usage: None,
        timestamp: 1_700_000_003_000,
        status: ToolStatus::Error,
    };
    let steer = UserItem {
        id: "u2".into(),
        content: vec![Content::Text {
            text: "also show hidden".into(),
        }],
        timestamp: 1_700_000_004_000,
    };
    SessionSnapshot {
        id: "s2".into(),
        name: Some("demo".into()),
        cwd: "/home/u/p".into(),
        created_at: 1_700_000_000_001,
        updated_at: 1_700_000_005_000,
        phase: SessionPhase::Turn,
        model: model_ref(),
        thinking_level: ThinkingLevel::Medium,
        attached: true,
        locked: true,
        revision: 42,
        transcript: vec![
            TranscriptItem::User(user),
            TranscriptItem::Assistant(assistant),
            TranscriptItem::Tool(tool),
        ],
        queued_steer: vec![steer],
        queued_steer_count: 1,
    }
}

fn prompt_response() -> ServerMessage {
    ServerMessage::Response(Response {
        id: "req-9".into(),
        outcome: Ok(CommandResult::Prompt {
            session: snapshot_with_transcript(),
        }),
    })
}

const PROMPT_RESPONSE_HEX: &str = "a4647479706568726573706f6e7365626964657265712d39626f6bf566726573756c74a267636f6d6d616e646670726f6d70746773657373696f6eae626964627332646e616d656464656d6f63637764692f686f6d652f752f70696372656174656441741b0000018bcfe56801697570646174656441741b0000018bcfe57b88657068617365647475726e656d6f64656ca26870726f766964657269616e7468726f7069636269646f636c617564652d736f6e6e65742d346d7468696e6b696e674c6576656c666d656469756d686174746163686564f5666c6f636b6564f5687265766973696f6e182a6a7472616e73637269707483a462696462753164726f6c65647573657267636f6e74656e7482a26474797065647465787464746578746a6c6973742066696c6573a3647479706565696d61676564646174616c6956424f5277304b47676f3d686d696d655479706569696d6167652f706e676974696d657374616d701b0000018bcfe56be8a962696462613164726f6c6569617373697374616e7467636f6e74656e7483a36474797065687468696e6b696e67687468696e6b696e67676e656564206c73687265646163746564f4a26474797065647465787464746578746b52756e6e696e67206c732ea4647479706568746f6f6c43616c6c6a746f6f6c43616c6c49646663616c6c5f3168746f6f6c4e616d65646261736865696e707574a467636f6d6d616e64666c73202d6c616774696d656f7574181e63656e76f665666c61677383f5fb3ff80000000000006178656d6f64656ca26870726f766964657269616e7468726f7069636269646f636c617564652d736f6e6e65742d346d726573706f6e73654d6f64656c7818636c617564652d736f6e6e65742d342d3230323530353134657573616765a765696e7075741904b0666f757470757419015969636163686552656164006a636163686557726974651a000186a069726561736f6e696e67146b746f74616c546f6b656e731a00018cbd64636f7374a565696e707574fb3f6d7dbf487fcb92666f7574707574fb3f7532617c1bda5169636163686552656164006a63616368655772697465fb3fd800000000000065746f74616cfb3fd88fc504816f006974696d657374616d701b0000018bcfe56fd06673746174757368636f6d706c6574656a73746f70526561736f6e67746f6f6c557365aa62696462743164726f6c6564746f6f6c6a746f6f6c43616c6c49646663616c6c5f3168746f6f6c4e616d65646261736865696e707574a467636f6d6d616e64666c73202d6c616774696d656f7574181e63656e76f665666c61677383f5fb3ff8000000000000617867636f6e74656e7481a26474797065647465787464746578746b612e7478740a622e7478746764657461696c73a26865786974436f646502697472756e6361746564f46974696d657374616d701b0000018bcfe573b866737461747573656572726f726769734572726f72f56b717565756564537465657281a462696462753264726f6c65647573657267636f6e74656e7481a264747970656474657874647465787470616c736f2073686f772068696464656e6974696d657374616d701b0000018bcfe577a0707175657565645374656572436f756e7401";

fn assistant_delta() -> ServerMessage {
    ServerMessage::Event(ServerEvent::SessionProgress {
        session_id: "s2".into(),
        progress: TranscriptProgress::AssistantDelta {
            message_id: "a1".into(),
            content_index: 1,
            kind: DeltaKind::Text,
            delta: "Hé ✓".into(),
        },
    })
}

const ASSISTANT_DELTA_HEX: &str = "a26474797065656576656e74656576656e74a364747970657073657373696f6e5f70726f67726573736973657373696f6e49646273326870726f6772657373a564747970656f617373697374616e745f64656c7461696d65737361676549646261316c636f6e74656e74496e64657801646b696e6464746578746564656c74616748c3a920e29c93";

fn error_response() -> ServerMessage {
    let details = map! {
        "phase" => text("turn"),
        "retryAfterMs" => Value::Int(250),
        "nested" => Value::Array(vec![Value::Int(1), Value::Int(-2), Value::Float(0.5), map! { "k" => text("v") }]),
    };
    ServerMessage::Response(Response {
        id: "req-10".into(),
        outcome: Err(ProtocolError {
            code: ErrorCode::Busy,
            message: "Session is busy".into(),
            details: Some(details),
        }),
    })
}

const ERROR_RESPONSE_HEX: &str = "a4647479706568726573706f6e7365626964667265712d3130626f6bf4656572726f72a364636f64656462757379676d6573736167656f53657373696f6e20697320627573796764657461696c73a3657068617365647475726e6c726574727941667465724d7318fa666e6573746564840121fb3fe0000000000000a1616b6176";

fn aborted_finished() -> ServerMessage {
    ServerMessage::Event(ServerEvent::SessionProgress {
        session_id: "s2".into(),
        progress: TranscriptProgress::ItemFinished {
            item: TranscriptItem::Assistant(AssistantItem {
                id: "a2".into(),
                content: vec![],
                model: model_ref(),
                response_model: None,
                usage: None,
                timestamp: 0,
                status: AssistantStatus::Aborted,
                error_message: Some(String::new()),
            }),
        },
    })
}

const ABORTED_FINISHED_HEX: &str = "a26474797065656576656e74656576656e74a364747970657073657373696f6e5f70726f67726573736973657373696f6e49646273326870726f6772657373a264747970656d6974656d5f66696e6973686564646974656da862696462613264726f6c6569617373697374616e7467636f6e74656e7480656d6f64656ca26870726f766964657269616e7468726f7069636269646f636c617564652d736f6e6e65742d346974696d657374616d7000667374617475736761626f727465646a73746f70526561736f6e6761626f727465646c6572726f724d65737361676560";

fn hello_error() -> ServerMessage {
    ServerMessage::HelloError(ProtocolError::new(
        ErrorCode::Version,
        "Unsupported protocol version 2; expected 1",
    ))
}

const HELLO_ERROR_HEX: &str = "a264747970656b68656c6c6f5f6572726f72656572726f72a264636f64656776657273696f6e676d657373616765782a556e737570706f727465642070726f746f636f6c2076657273696f6e20323b2065787065637465642031";

fn create_request() -> ClientMessage {
    ClientMessage::Request(Request {
        id: "r1".into(),
        command: Command::Create(CreateParams {
            cwd: Some("/tmp".into()),
            name: Some(String::new()),
            model: Some(model_ref()),
            thinking_level: Some(ThinkingLevel::Xhigh),
        }),
    })
}

const CREATE_REQUEST_HEX: &str = "a3647479706567726571756573746269646272316772657175657374a567636f6d6d616e646663726561746563637764642f746d70646e616d6560656d6f64656ca26870726f766964657269616e7468726f7069636269646f636c617564652d736f6e6e65742d346d7468696e6b696e674c6576656c657868696768";

/// From the reference notes (§a test vectors), without the frame header.
const CLIENT_HELLO_HEX: &str = "a264747970656568656c6c6f6776657273696f6e01";

fn server_vectors() -> Vec<(&'static str, ServerMessage, &'static str)> {
    vec![
        ("server hello", server_hello(), SERVER_HELLO_HEX),
        ("prompt response", prompt_response(), PROMPT_RESPONSE_HEX),
        ("assistant delta", assistant_delta(), ASSISTANT_DELTA_HEX),
        ("error response", error_response(), ERROR_RESPONSE_HEX),
        (
            "aborted item_finished",
            aborted_finished(),
            ABORTED_FINISHED_HEX,
        ),
        ("hello_error", hello_error(), HELLO_ERROR_HEX),
    ]
}

fn client_vectors() -> Vec<(&'static str, ClientMessage, &'static str)> {
    vec![
        ("create request", create_request(), CREATE_REQUEST_HEX),
        (
            "client hello",
            ClientMessage::Hello(ClientHello {
                version: 1,
                token: None,
            }),
            CLIENT_HELLO_HEX,
        ),
    ]
}

// ---------------------------------------------------------------------------
// Byte-exact vectors.
// ---------------------------------------------------------------------------

#[test]
fn server_messages_encode_to_reference_bytes() {
    for (name, message, expected) in server_vectors() {
        let bytes = encode_server_message(&message).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(hex(&bytes), expected, "{name}");
    }
}

#[test]
fn reference_bytes_decode_to_server_messages() {
    for (name, message, bytes) in server_vectors() {
        let decoded = decode_server_message(&unhex(bytes), &CborLimits::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, message, "{name}");
    }
}

#[test]
fn client_messages_match_reference_bytes() {
    for (name, message, expected) in client_vectors() {
        let bytes = encode_client_message(&message).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(hex(&bytes), expected, "{name}");
        let decoded = decode_client_message(&bytes, &CborLimits::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, message, "{name}");
    }
}

/// The key order of a session snapshot, checked on the `Value` tree without
/// going through CBOR.
#[test]
fn session_snapshot_keys_are_in_schema_order() {
    fn keys(value: &Value) -> Vec<&str> {
        match value {
            Value::Map(entries) => entries.iter().map(|(k, _)| k.as_str()).collect(),
            other => panic!("not a map: {other:?}"),
        }
    }
    let value = snapshot_with_transcript().to_value();
    assert_eq!(
        keys(&value),
        [
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
            "queuedSteerCount"
        ]
    );
    let Some(Value::Array(transcript)) = value.get("transcript") else {
        panic!("transcript")
    };
    assert_eq!(keys(&transcript[0]), ["id", "role", "content", "timestamp"]);
    assert_eq!(
        keys(&transcript[1]),
        [
            "id",
            "role",
            "content",
            "model",
            "responseModel",
            "usage",
            "timestamp",
            "status",
            "stopReason"
        ]
    );
    assert_eq!(
        keys(&transcript[2]),
        [
            "id",
            "role",
            "toolCallId",
            "toolName",
            "input",
            "content",
            "details",
            "timestamp",
            "status",
            "isError"
        ]
    );
    let usage = transcript[1].get("usage").unwrap();
    assert_eq!(
        keys(usage),
        [
            "input",
            "output",
            "cacheRead",
            "cacheWrite",
            "reasoning",
            "totalTokens",
            "cost"
        ]
    );
    assert_eq!(
        keys(usage.get("cost").unwrap()),
        ["input", "output", "cacheRead", "cacheWrite", "total"]
    );
}

#[test]
fn error_item_puts_error_message_last() {
    let item = AssistantItem {
        id: "a".into(),
        content: vec![],
        model: model_ref(),
        response_model: None,
        usage: None,
        timestamp: 5,
        status: AssistantStatus::Error,
        error_message: Some("boom".into()),
    };
    let value = item.to_value();
    let Value::Map(entries) = &value else {
        panic!()
    };
    let tail: Vec<(&str, &Value)> = entries[entries.len() - 4..]
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    assert_eq!(
        tail,
        [
            ("timestamp", &Value::Int(5)),
            ("status", &text("error")),
            ("stopReason", &text("error")),
            ("errorMessage", &text("boom"))
        ]
    );
    assert_eq!(AssistantItem::from_value(&value, "item").unwrap(), item);
}

#[test]
fn client_hello_token_is_optional_extension() {
    let with = ClientMessage::Hello(ClientHello {
        version: 1,
        token: Some("s3cret".into()),
    });
    let value = with.to_value();
    assert_eq!(
        value,
        map! { "type" => text("hello"), "version" => Value::Int(1), "token" => text("s3cret") }
    );
    assert_eq!(ClientMessage::from_value(&value, "").unwrap(), with);
    let without = ClientMessage::Hello(ClientHello {
        version: 0,
        token: None,
    });
    assert_eq!(
        without.to_value(),
        map! { "type" => text("hello"), "version" => Value::Int(0) }
    );
    let bad =
        map! { "type" => text("hello"), "version" => Value::Int(1), "token" => Value::Int(1) };
    assert_err(
        ClientMessage::from_value(&bad, ""),
        "hello.token: expected a string",
    );
}

// ---------------------------------------------------------------------------
// Rejections.
// ---------------------------------------------------------------------------

#[track_caller]
fn assert_err<T: std::fmt::Debug>(result: Result<T, SchemaError>, needle: &str) {
    match result {
        Ok(value) => panic!("expected an error containing {needle:?}, decoded {value:?}"),
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.contains(needle),
                "error {message:?} does not contain {needle:?}"
            );
            assert!(message.len() <= MAX_ERROR_LEN);
        }
    }
}

fn client(value: &Value) -> Result<ClientMessage, SchemaError> {
    ClientMessage::from_value(value, "")
}

fn server(value: &Value) -> Result<ServerMessage, SchemaError> {
    ServerMessage::from_value(value, "")
}

fn request(command: Value) -> Value {
    map! { "type" => text("request"), "id" => text("r1"), "request" => command }
}

/// Replaces (or appends) `key` in a map value.
fn with(mut value: Value, key: &str, new: Value) -> Value {
    let Value::Map(entries) = &mut value else {
        panic!("not a map")
    };
    match entries.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = new,
        None => entries.push((key.to_owned(), new)),
    }
    value
}

/// Removes `key` from a map value.
fn without(mut value: Value, key: &str) -> Value {
    let Value::Map(entries) = &mut value else {
        panic!("not a map")
    };
    entries.retain(|(k, _)| k != key);
    value
}

/// A session progress event around `progress`.
fn progress_event(progress: Value) -> Value {
    map! {
        "type" => text("event"),
        "event" => map! { "type" => text("session_progress"), "sessionId" => text("s"), "progress" => progress },
    }
}

fn assistant_value(status: AssistantStatus, error_message: Option<&str>) -> Value {
    AssistantItem {
        id: "a".into(),
        content: vec![],
        model: model_ref(),
        response_model: None,
        usage: None,
        timestamp: 1,
        status,
        error_message: error_message.map(Into::into),
    }
    .to_value()
}

fn tool_value(status: ToolStatus) -> Value {
    ToolItem {
        id: "t".into(),
        tool_call_id: "c".into(),
        tool_name: "bash".into(),
        input: Value::Null,
        content: vec![],
        details: None,
        usage: None,
        timestamp: 1,
        status,
    }
    .to_value()
}

fn user_value() -> Value {
    UserItem {
        id: "u".into(),
        content: vec![Content::Text { text: "hi".into() }],
        timestamp: 1,
    }
    .to_value()
}

fn snapshot_value() -> Value {
    snapshot_with_transcript().to_value()
}

fn session_snapshot_event(snapshot: Value) -> Value {
    map! { "type" => text("event"), "event" => map! { "type" => text("session_snapshot"), "snapshot" => snapshot } }
}

#[test]
fn rejects_unknown_field() {
    let value = with(
        request(map! { "command" => text("list") }),
        "foo",
        Value::Int(1),
    );
    assert_err(client(&value), "unknown field \"foo\" in request");
    let nested = request(map! { "command" => text("list"), "sessionId" => text("s") });
    assert_err(
        client(&nested),
        "unknown field \"sessionId\" in request.request",
    );
    let deep = request(map! {
        "command" => text("set_model"),
        "sessionId" => text("s"),
        "model" => map! { "provider" => text("p"), "id" => text("m"), "x" => Value::Null },
    });
    assert_err(
        client(&deep),
        "unknown field \"x\" in request.request.model",
    );
}

#[test]
fn rejects_missing_field() {
    let value = without(request(map! { "command" => text("list") }), "id");
    assert_err(client(&value), "missing field \"id\" in request");
    let command = request(map! { "command" => text("prompt"), "sessionId" => text("s") });
    assert_err(
        client(&command),
        "missing field \"text\" in request.request",
    );
    assert_err(
        client(&map! { "version" => Value::Int(1) }),
        "missing field \"type\" in message",
    );
    let snapshot = session_snapshot_event(without(snapshot_value(), "queuedSteerCount"));
    assert_err(
        server(&snapshot),
        "missing field \"queuedSteerCount\" in event.event.snapshot",
    );
}

#[test]
fn rejects_empty_ids() {
    let value = request(map! { "command" => text("attach"), "sessionId" => text("") });
    assert_err(
        client(&value),
        "request.request.sessionId: expected a non-empty string",
    );
    let value = with(request(map! { "command" => text("list") }), "id", text(""));
    assert_err(client(&value), "request.id: expected a non-empty string");
    let snapshot = session_snapshot_event(with(snapshot_value(), "id", text("")));
    assert_err(
        server(&snapshot),
        "event.event.snapshot.id: expected a non-empty string",
    );
}

#[test]
fn rejects_wrong_kinds() {
    let value = request(
        map! { "command" => text("prompt"), "sessionId" => text("s"), "text" => Value::Int(3) },
    );
    assert_err(
        client(&value),
        "request.request.text: expected a string, got integer",
    );
    let value = session_snapshot_event(with(snapshot_value(), "attached", text("yes")));
    assert_err(
        server(&value),
        "event.event.snapshot.attached: expected a boolean, got string",
    );
    let value = session_snapshot_event(with(snapshot_value(), "transcript", Value::Null));
    assert_err(
        server(&value),
        "event.event.snapshot.transcript: expected an array, got null",
    );
    assert_err(
        client(&Value::Array(vec![])),
        "message: expected a map, got array",
    );
    let value = request(text("list"));
    assert_err(
        client(&value),
        "request.request: expected a map, got string",
    );
    let value = map! { "type" => Value::Int(1) };
    assert_err(client(&value), "type: expected a string, got integer");
}

#[test]
fn rejects_bad_enum_strings() {
    let value = request(map! {
        "command" => text("set_thinking"),
        "sessionId" => text("s"),
        "thinkingLevel" => text("extreme"),
    });
    assert_err(
        client(&value),
        "request.request.thinkingLevel: expected one of \"off\"",
    );
    assert_err(client(&value), "got \"extreme\"");
    assert_err(
        client(&request(map! { "command" => text("fly") })),
        "request.request: unknown command \"fly\"",
    );
    assert_err(
        client(&map! { "type" => text("bye") }),
        "message: unknown type \"bye\"",
    );
    let value = session_snapshot_event(with(snapshot_value(), "phase", text("sleeping")));
    assert_err(
        server(&value),
        "event.event.snapshot.phase: expected one of",
    );
    let value = map! {
        "type" => text("hello_error"),
        "error" => map! { "code" => text("teapot"), "message" => text("m") },
    };
    assert_err(server(&value), "hello_error.error.code: expected one of");
    let value = map! { "type" => text("event"), "event" => map! { "type" => text("party") } };
    assert_err(server(&value), "event.event: unknown event type \"party\"");
    let item = with(
        assistant_value(AssistantStatus::Streaming, None),
        "status",
        text("paused"),
    );
    let value = progress_event(map! { "type" => text("item_started"), "item" => item });
    assert_err(
        server(&value),
        "event.event.progress.item: unknown assistant status \"paused\"",
    );
}

#[test]
fn rejects_negative_and_non_integral_integers() {
    let value = map! { "type" => text("hello"), "version" => Value::Int(-1) };
    assert_err(
        client(&value),
        "hello.version: expected an integer ≥ 0, got -1",
    );
    let value = map! { "type" => text("hello"), "version" => Value::Float(1.5) };
    assert_err(
        client(&value),
        "hello.version: expected an integer, got a non-integral number",
    );
    let value = session_snapshot_event(with(snapshot_value(), "revision", Value::Int(-3)));
    assert_err(
        server(&value),
        "event.event.snapshot.revision: expected an integer ≥ 0",
    );
    let value = session_snapshot_event(with(
        snapshot_value(),
        "createdAt",
        Value::Int(MAX_SAFE_INTEGER + 1),
    ));
    assert_err(
        server(&value),
        "event.event.snapshot.createdAt: expected an integer ≤",
    );
    let delta = map! {
        "type" => text("assistant_delta"),
        "messageId" => text("m"),
        "contentIndex" => Value::Int(-1),
        "kind" => text("text"),
        "delta" => text(""),
    };
    assert_err(
        server(&progress_event(delta)),
        "event.event.progress.contentIndex: expected an integer ≥ 0",
    );
}

#[test]
fn rejects_string_version() {
    let value = map! { "type" => text("hello"), "version" => text("1") };
    assert_err(
        client(&value),
        "hello.version: expected an integer, got string",
    );
    let mut hello = server_hello().to_value();
    hello = with(hello, "version", text("1"));
    assert_err(
        server(&hello),
        "hello.version: expected the integer 1, got string",
    );
}

#[test]
fn server_versions_are_literal_one() {
    let hello = with(server_hello().to_value(), "version", Value::Int(2));
    assert_err(server(&hello), "hello.version: expected 1, got 2");
    let Some(snapshot) = server_hello().to_value().get("snapshot").cloned() else {
        panic!()
    };
    let hello = with(
        server_hello().to_value(),
        "snapshot",
        with(snapshot, "protocolVersion", Value::Int(0)),
    );
    assert_err(
        server(&hello),
        "hello.snapshot.protocolVersion: expected 1, got 0",
    );
    // The client hello accepts any version ≥ 0; the server answers `version` errors.
    let value = map! { "type" => text("hello"), "version" => Value::Int(8) };
    assert_eq!(
        client(&value).unwrap(),
        ClientMessage::Hello(ClientHello {
            version: 8,
            token: None
        })
    );
}

#[test]
fn rejects_byte_strings_inside_json() {
    let input = map! { "path" => Value::Array(vec![Value::Bytes(vec![1, 2])]) };
    let mut tool = tool_value(ToolStatus::Running);
    tool = with(tool, "input", input);
    assert_err(
        server(&progress_event(
            map! { "type" => text("item_started"), "item" => tool },
        )),
        "event.event.progress.item.input.path[0]: expected strict JSON, found a byte string",
    );
    let value = map! {
        "type" => text("response"),
        "id" => text("r"),
        "ok" => Value::Bool(false),
        "error" => map! { "code" => text("busy"), "message" => text("m"), "details" => Value::Bytes(vec![]) },
    };
    assert_err(
        server(&value),
        "response.error.details: expected strict JSON, found a byte string",
    );
    // A byte string where a string is expected is a kind error.
    let value =
        request(map! { "command" => text("attach"), "sessionId" => Value::Bytes(b"s".to_vec()) });
    assert_err(
        client(&value),
        "request.request.sessionId: expected a non-empty string, got byte string",
    );
}

#[test]
fn item_finished_accepts_only_terminal_assistant_and_tool_items() {
    let finished = |item: Value| {
        server(&progress_event(
            map! { "type" => text("item_finished"), "item" => item },
        ))
    };
    assert_err(
        finished(assistant_value(AssistantStatus::Streaming, None)),
        "event.event.progress.item: expected a finished item, got status \"streaming\"",
    );
    assert_err(
        finished(tool_value(ToolStatus::Running)),
        "expected a finished item, got status \"running\"",
    );
    assert_err(
        finished(user_value()),
        "event.event.progress.item: expected an assistant or tool item",
    );
    for status in [
        AssistantStatus::Complete(StopReason::Stop),
        AssistantStatus::Complete(StopReason::Length),
        AssistantStatus::Error,
        AssistantStatus::Aborted,
    ] {
        finished(assistant_value(status, None)).unwrap();
    }
    finished(tool_value(ToolStatus::Complete)).unwrap();
    finished(tool_value(ToolStatus::Error)).unwrap();
}

#[test]
fn item_updated_accepts_only_assistant_and_tool_items() {
    let updated = |item: Value| {
        server(&progress_event(
            map! { "type" => text("item_updated"), "item" => item },
        ))
    };
    assert_err(
        updated(user_value()),
        "event.event.progress.item: expected an assistant or tool item, got a user item",
    );
    updated(assistant_value(AssistantStatus::Streaming, None)).unwrap();
    updated(tool_value(ToolStatus::Running)).unwrap();
    let started = map! { "type" => text("item_started"), "item" => user_value() };
    server(&progress_event(started)).unwrap();
}

#[test]
fn queued_steer_accepts_only_user_items() {
    let queued = Value::Array(vec![
        user_value(),
        assistant_value(AssistantStatus::Streaming, None),
    ]);
    let value = session_snapshot_event(with(snapshot_value(), "queuedSteer", queued));
    assert_err(
        server(&value),
        "event.event.snapshot.queuedSteer[1]: expected a user item, got role \"assistant\"",
    );
}

#[test]
fn rejects_empty_strings_where_min_length_is_one() {
    let value = request(map! { "command" => text("create"), "cwd" => text("") });
    assert_err(
        client(&value),
        "request.request.cwd: expected a non-empty string",
    );
    let value = request(map! { "command" => text("create"), "name" => text("") });
    client(&value).unwrap();

    let value = session_snapshot_event(with(snapshot_value(), "cwd", text("")));
    assert_err(
        server(&value),
        "event.event.snapshot.cwd: expected a non-empty string",
    );

    let image = map! { "type" => text("image"), "data" => text(""), "mimeType" => text("") };
    let user = with(user_value(), "content", Value::Array(vec![image]));
    let value = progress_event(map! { "type" => text("item_started"), "item" => user });
    assert_err(
        server(&value),
        "event.event.progress.item.content[0].mimeType: expected a non-empty string",
    );

    let item = with(
        assistant_value(AssistantStatus::Streaming, None),
        "responseModel",
        text(""),
    );
    let value = progress_event(map! { "type" => text("item_started"), "item" => item });
    assert_err(
        server(&value),
        "event.event.progress.item.responseModel: expected a non-empty string",
    );

    let item = assistant_value(AssistantStatus::Error, Some(""));
    let value = progress_event(map! { "type" => text("item_finished"), "item" => item });
    assert_err(
        server(&value),
        "event.event.progress.item.errorMessage: expected a non-empty string",
    );
    // `aborted` allows an empty errorMessage.
    let item = assistant_value(AssistantStatus::Aborted, Some(""));
    server(&progress_event(
        map! { "type" => text("item_finished"), "item" => item },
    ))
    .unwrap();
}

fn hello_with_model(edit: impl FnOnce(Value) -> Value) -> Value {
    let hello = server_hello().to_value();
    let snapshot = hello.get("snapshot").unwrap().clone();
    let Some(Value::Array(models)) = snapshot.get("models") else {
        panic!()
    };
    let model = edit(models[0].clone());
    let snapshot = with(snapshot, "models", Value::Array(vec![model]));
    with(hello, "snapshot", snapshot)
}

#[test]
fn rejects_model_metadata_violations() {
    let value = hello_with_model(|m| with(m, "supportedThinkingLevels", Value::Array(vec![])));
    assert_err(
        server(&value),
        "hello.snapshot.models[0].supportedThinkingLevels: expected at least 1 item",
    );
    let value = hello_with_model(|m| with(m, "contextWindow", Value::Int(0)));
    assert_err(
        server(&value),
        "hello.snapshot.models[0].contextWindow: expected an integer ≥ 1, got 0",
    );
    let value = hello_with_model(|m| with(m, "name", text("")));
    assert_err(
        server(&value),
        "hello.snapshot.models[0].name: expected a non-empty string",
    );
    let value = hello_with_model(|m| with(m, "input", Value::Array(vec![text("audio")])));
    assert_err(
        server(&value),
        "hello.snapshot.models[0].input[0]: expected one of \"text\", \"image\"",
    );
    let cost = map! {
        "input" => Value::Float(-0.5),
        "output" => Value::Int(0),
        "cacheRead" => Value::Int(0),
        "cacheWrite" => Value::Int(0),
    };
    let value = hello_with_model(|m| with(m, "cost", cost));
    assert_err(
        server(&value),
        "hello.snapshot.models[0].cost.input: expected a finite number ≥ 0",
    );
    let cost = map! {
        "input" => text("1"),
        "output" => Value::Int(0),
        "cacheRead" => Value::Int(0),
        "cacheWrite" => Value::Int(0),
    };
    let value = hello_with_model(|m| with(m, "cost", cost));
    assert_err(
        server(&value),
        "hello.snapshot.models[0].cost.input: expected a number, got string",
    );
}

#[test]
fn rejects_status_field_mismatches() {
    let item_started = |item: Value| {
        server(&progress_event(
            map! { "type" => text("item_started"), "item" => item },
        ))
    };
    let complete = assistant_value(AssistantStatus::Complete(StopReason::Stop), None);
    assert_err(
        item_started(without(complete.clone(), "stopReason")),
        "missing field \"stopReason\"",
    );
    assert_err(
        item_started(with(complete.clone(), "stopReason", text("error"))),
        "item.stopReason: expected one of",
    );
    assert_err(
        item_started(with(complete, "errorMessage", text("x"))),
        "unknown field \"errorMessage\"",
    );
    let streaming = assistant_value(AssistantStatus::Streaming, None);
    assert_err(
        item_started(with(streaming, "stopReason", text("stop"))),
        "unknown field \"stopReason\"",
    );
    let error = assistant_value(AssistantStatus::Error, None);
    assert_err(
        item_started(with(error, "stopReason", text("stop"))),
        "item.stopReason: expected \"error\"",
    );
    let tool = tool_value(ToolStatus::Running);
    assert_err(
        item_started(with(tool, "isError", Value::Bool(true))),
        "item.isError: expected false for status",
    );
    let tool = tool_value(ToolStatus::Error);
    assert_err(
        item_started(with(tool, "isError", Value::Bool(false))),
        "item.isError: expected true for status",
    );
    let user = with(user_value(), "role", text("robot"));
    assert_err(
        item_started(user),
        "event.event.progress.item: unknown role \"robot\"",
    );
}

#[test]
fn rejects_content_not_allowed_for_role() {
    let item_started = |item: Value| {
        server(&progress_event(
            map! { "type" => text("item_started"), "item" => item },
        ))
    };
    let thinking = map! { "type" => text("thinking"), "thinking" => text("t") };
    let user = with(user_value(), "content", Value::Array(vec![thinking]));
    assert_err(
        item_started(user),
        "item.content[0]: content type \"thinking\" is not allowed in a user item",
    );
    let image =
        map! { "type" => text("image"), "data" => text(""), "mimeType" => text("image/png") };
    let assistant = with(
        assistant_value(AssistantStatus::Streaming, None),
        "content",
        Value::Array(vec![image]),
    );
    assert_err(
        item_started(assistant),
        "content type \"image\" is not allowed in an assistant item",
    );
    let call = map! { "type" => text("toolCall"), "toolCallId" => text("c"), "toolName" => text("t"), "input" => Value::Null };
    let tool = with(
        tool_value(ToolStatus::Running),
        "content",
        Value::Array(vec![call]),
    );
    assert_err(
        item_started(tool),
        "content type \"toolCall\" is not allowed in a tool item",
    );
    let video = map! { "type" => text("video") };
    let user = with(user_value(), "content", Value::Array(vec![video]));
    assert_err(
        item_started(user),
        "item.content[0]: unknown content type \"video\"",
    );
}

#[test]
fn rejects_response_shape_violations() {
    let base = map! { "type" => text("response"), "id" => text("r"), "ok" => Value::Bool(true) };
    let error = map! { "code" => text("busy"), "message" => text("m") };
    assert_err(
        server(&with(base.clone(), "error", error.clone())),
        "unknown field \"error\" in response",
    );
    let failed = with(with(base.clone(), "ok", Value::Bool(false)), "error", error);
    server(&failed).unwrap();
    assert_err(
        server(&with(failed, "result", Value::Null)),
        "unknown field \"result\" in response",
    );
    assert_err(server(&base), "missing field \"result\" in response");
    assert_err(
        server(&with(base.clone(), "ok", text("true"))),
        "response.ok: expected a boolean, got string",
    );
    assert_err(
        server(&without(base, "ok")),
        "missing field \"ok\" in response",
    );
}

#[test]
fn rejects_duplicate_keys_in_hand_built_values() {
    let value = Value::Map(vec![
        ("type".into(), text("hello")),
        ("version".into(), Value::Int(1)),
        ("version".into(), Value::Int(1)),
    ]);
    assert_err(client(&value), "duplicate field \"version\" in hello");
}

#[test]
fn error_messages_are_bounded() {
    let key = "k".repeat(10_000);
    let value = with(
        request(map! { "command" => text("list") }),
        &key,
        Value::Null,
    );
    let error = client(&value).unwrap_err();
    assert!(
        error.to_string().len() <= MAX_ERROR_LEN,
        "{}",
        error.to_string().len()
    );
    assert!(error.to_string().starts_with("unknown field \"kkk"));
    let long = "é".repeat(1000);
    let error = SchemaError::new(long);
    assert!(error.message().len() <= MAX_ERROR_LEN);
    assert!(error.message().ends_with("..."));
}

#[test]
fn cbor_errors_are_wrapped() {
    let error = decode_client_message(&[], &CborLimits::default()).unwrap_err();
    assert!(error.to_string().starts_with("invalid CBOR: "), "{error}");
    // A valid CBOR item that is not a message is a schema error.
    let error = decode_client_message(&[0x01], &CborLimits::default()).unwrap_err();
    assert_eq!(error.to_string(), "message: expected a map, got integer");
}

#[test]
fn encoding_validates_typed_values() {
    let empty_id = ClientMessage::Request(Request {
        id: String::new(),
        command: Command::List,
    });
    assert_err(
        encode_client_message(&empty_id),
        "request.id: expected a non-empty string",
    );
    let Ok(CommandResult::Prompt { session }) = (match prompt_response() {
        ServerMessage::Response(response) => response.outcome,
        _ => unreachable!(),
    }) else {
        unreachable!()
    };
    let mut streaming_with_error = session.clone();
    if let TranscriptItem::Assistant(item) = &mut streaming_with_error.transcript[1] {
        item.status = AssistantStatus::Streaming;
        item.error_message = Some("nope".into());
    }
    let message = ServerMessage::Event(ServerEvent::SessionSnapshot {
        snapshot: streaming_with_error,
    });
    assert_err(
        encode_server_message(&message),
        "unknown field \"errorMessage\" in event.event.snapshot.transcript[1]",
    );
    let mut nan_cost = session.clone();
    if let TranscriptItem::Assistant(item) = &mut nan_cost.transcript[1] {
        item.usage.as_mut().unwrap().cost.total = f64::NAN;
    }
    let message = ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot: nan_cost });
    assert_err(
        encode_server_message(&message),
        "transcript[1].usage.cost.total: expected a finite number ≥ 0",
    );
    let mut huge = session;
    huge.revision = u64::MAX;
    let message = ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot: huge });
    assert_err(
        encode_server_message(&message),
        "event.event.snapshot.revision: expected an integer",
    );
    let bad_version = ServerMessage::Hello(ServerHello {
        version: 2,
        ..match server_hello() {
            ServerMessage::Hello(hello) => hello,
            _ => unreachable!(),
        }
    });
    assert_err(
        encode_server_message(&bad_version),
        "hello.version: expected 1, got 2",
    );
}

#[test]
fn extensions_round_trip() {
    let remove = ClientMessage::Request(Request {
        id: "r".into(),
        command: Command::Remove {
            session_id: "s".into(),
        },
    });
    let expected = map! {
        "type" => text("request"),
        "id" => text("r"),
        "request" => map! { "command" => text("remove"), "sessionId" => text("s") },
    };
    assert_eq!(remove.to_value(), expected);
    assert_eq!(client(&remove.to_value()).unwrap(), remove);
    let auth = ServerMessage::HelloError(ProtocolError::new(ErrorCode::Auth, "bad token"));
    assert_eq!(server(&auth.to_value()).unwrap(), auth);
    let removed = ServerMessage::Response(Response {
        id: "r".into(),
        outcome: Ok(CommandResult::Remove {
            session_id: "s".into(),
        }),
    });
    assert_eq!(server(&removed.to_value()).unwrap(), removed);

    let status = ClientMessage::Request(Request {
        id: "q".into(),
        command: Command::Status,
    });
    let expected = map! {
        "type" => text("request"),
        "id" => text("q"),
        "request" => map! { "command" => text("status") },
    };
    assert_eq!(status.to_value(), expected);
    assert_eq!(client(&status.to_value()).unwrap(), status);
    let answered = ServerMessage::Response(Response {
        id: "q".into(),
        outcome: Ok(CommandResult::Status {
            sessions: vec![LiveStatus {
                session_id: "s".into(),
                state: LiveState::Phase(SessionPhase::Retry),
                clients: 2,
                model: None,
                thinking_level: None,
                preview: None,
            }],
        }),
    });
    let result = |state: &str| {
        map! {
            "type" => text("response"),
            "id" => text("q"),
            "ok" => Value::Bool(true),
            "result" => map! {
                "command" => text("status"),
                "sessions" => Value::Array(vec![map! {
                    "sessionId" => text("s"),
                    "state" => text(state),
                    "clients" => Value::Int(2),
                }]),
            },
        }
    };
    assert_eq!(answered.to_value(), result("retry"));
    assert_eq!(server(&answered.to_value()).unwrap(), answered);
    assert!(
        server(&result("busy")).is_err(),
        "an unknown state is refused"
    );
}

// ---------------------------------------------------------------------------
// Property: decode(encode(m)) == m.
// ---------------------------------------------------------------------------

fn id() -> BoxedStrategy<String> {
    "[a-zA-Z0-9_-]{1,8}".boxed()
}

fn any_text() -> BoxedStrategy<String> {
    "\\PC{0,8}".boxed()
}

fn uint() -> BoxedStrategy<u64> {
    prop_oneof![0..100u64, 0..=MAX_SAFE_INTEGER as u64].boxed()
}

fn cost() -> BoxedStrategy<f64> {
    prop_oneof![Just(0.0), (0..1000u32).prop_map(f64::from), 0.0..1.0e9f64].boxed()
}

fn json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).prop_map(Value::Int),
        any::<f64>()
            .prop_filter("representable", |x| x.is_finite()
                && (x.fract() != 0.0 || x.abs() <= MAX_SAFE_INTEGER as f64))
            .prop_map(Value::number),
        any_text().prop_map(Value::Text),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(any_text(), inner, 0..4)
                .prop_map(|m| Value::Map(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn thinking_level() -> BoxedStrategy<ThinkingLevel> {
    prop::sample::select(ThinkingLevel::ALL.to_vec()).boxed()
}

fn model_ref_strategy() -> BoxedStrategy<ModelRef> {
    (id(), id())
        .prop_map(|(provider, id)| ModelRef { provider, id })
        .boxed()
}

fn usage() -> BoxedStrategy<Usage> {
    (
        (
            uint(),
            uint(),
            uint(),
            uint(),
            prop::option::of(uint()),
            uint(),
        ),
        (cost(), cost(), cost(), cost(), cost()),
    )
        .prop_map(
            |((input, output, cache_read, cache_write, reasoning, total_tokens), c)| Usage {
                input,
                output,
                cache_read,
                cache_write,
                reasoning,
                total_tokens,
                cost: UsageCost {
                    input: c.0,
                    output: c.1,
                    cache_read: c.2,
                    cache_write: c.3,
                    total: c.4,
                },
            },
        )
        .boxed()
}

fn user_content() -> BoxedStrategy<Content> {
    prop_oneof![
        any_text().prop_map(|text| Content::Text { text }),
        (any_text(), id()).prop_map(|(data, mime_type)| Content::Image { data, mime_type }),
    ]
    .boxed()
}

fn assistant_content() -> BoxedStrategy<Content> {
    prop_oneof![
        any_text().prop_map(|text| Content::Text { text }),
        (any_text(), prop::option::of(any::<bool>())).prop_map(|(thinking, redacted)| {
            Content::Thinking {
                thinking,
                redacted,
                signature: None,
            }
        }),
        (id(), id(), json()).prop_map(|(tool_call_id, tool_name, input)| Content::ToolCall {
            tool_call_id,
            tool_name,
            input
        }),
    ]
    .boxed()
}

fn user_item() -> BoxedStrategy<UserItem> {
    (id(), prop::collection::vec(user_content(), 0..3), uint())
        .prop_map(|(id, content, timestamp)| UserItem {
            id,
            content,
            timestamp,
        })
        .boxed()
}

fn assistant_item(terminal: bool) -> BoxedStrategy<AssistantItem> {
    let status = prop_oneof![
        Just(AssistantStatus::Streaming),
        Just(AssistantStatus::Complete(StopReason::Stop)),
        Just(AssistantStatus::Complete(StopReason::Length)),
        Just(AssistantStatus::Complete(StopReason::ToolUse)),
        Just(AssistantStatus::Error),
        Just(AssistantStatus::Aborted),
    ]
    .prop_filter("terminal", move |s| {
        !terminal || *s != AssistantStatus::Streaming
    });
    (
        id(),
        prop::collection::vec(assistant_content(), 0..3),
        model_ref_strategy(),
        prop::option::of(id()),
        prop::option::of(usage()),
        uint(),
        status,
        prop::option::of(id()),
        any_text(),
    )
        .prop_map(
            |(id, content, model, response_model, usage, timestamp, status, error, aborted)| {
                let error_message = match status {
                    AssistantStatus::Error => error,
                    AssistantStatus::Aborted => error.map(|_| aborted),
                    _ => None,
                };
                AssistantItem {
                    id,
                    content,
                    model,
                    response_model,
                    usage,
                    timestamp,
                    status,
                    error_message,
                }
            },
        )
        .boxed()
}

fn tool_item(terminal: bool) -> BoxedStrategy<ToolItem> {
    let status = prop::sample::select(vec![
        ToolStatus::Running,
        ToolStatus::Complete,
        ToolStatus::Error,
    ])
    .prop_filter("terminal", move |s| !terminal || *s != ToolStatus::Running);
    (
        (id(), id(), id(), json()),
        prop::collection::vec(user_content(), 0..3),
        prop::option::of(json()),
        prop::option::of(usage()),
        uint(),
        status,
    )
        .prop_map(
            |((id, tool_call_id, tool_name, input), content, details, usage, timestamp, status)| {
                ToolItem {
                    id,
                    tool_call_id,
                    tool_name,
                    input,
                    content,
                    details,
                    usage,
                    timestamp,
                    status,
                }
            },
        )
        .boxed()
}

fn transcript_item() -> BoxedStrategy<TranscriptItem> {
    prop_oneof![
        user_item().prop_map(TranscriptItem::User),
        assistant_item(false).prop_map(TranscriptItem::Assistant),
        tool_item(false).prop_map(TranscriptItem::Tool),
    ]
    .boxed()
}

fn progress() -> BoxedStrategy<TranscriptProgress> {
    prop_oneof![
        transcript_item().prop_map(|item| TranscriptProgress::ItemStarted { item }),
        (
            id(),
            uint(),
            prop::sample::select(vec![
                DeltaKind::Text,
                DeltaKind::Thinking,
                DeltaKind::ToolCall
            ]),
            any_text()
        )
            .prop_map(|(message_id, content_index, kind, delta)| {
                TranscriptProgress::AssistantDelta {
                    message_id,
                    content_index,
                    kind,
                    delta,
                }
            }),
        prop_oneof![
            assistant_item(false).prop_map(TranscriptItem::Assistant),
            tool_item(false).prop_map(TranscriptItem::Tool),
        ]
        .prop_map(|item| TranscriptProgress::ItemUpdated { item }),
        prop_oneof![
            assistant_item(true).prop_map(TranscriptItem::Assistant),
            tool_item(true).prop_map(TranscriptItem::Tool),
        ]
        .prop_map(|item| TranscriptProgress::ItemFinished { item }),
    ]
    .boxed()
}

fn session_metadata() -> BoxedStrategy<SessionMetadata> {
    (
        id(),
        uint(),
        prop::option::of(uint()),
        prop::option::of(id()),
        prop::option::of(any_text()),
        prop::option::of(id()),
    )
        .prop_map(
            |(id, created_at, updated_at, parent_session_id, session_name, cwd)| SessionMetadata {
                id,
                created_at,
                updated_at,
                parent_session_id,
                session_name,
                cwd,
            },
        )
        .boxed()
}

fn session_snapshot() -> BoxedStrategy<SessionSnapshot> {
    (
        (id(), prop::option::of(any_text()), id(), uint(), uint()),
        (
            prop::sample::select(SessionPhase::ALL.to_vec()),
            model_ref_strategy(),
            thinking_level(),
        ),
        (any::<bool>(), any::<bool>(), uint()),
        (
            prop::collection::vec(transcript_item(), 0..4),
            prop::collection::vec(user_item(), 0..2),
            uint(),
        ),
    )
        .prop_map(
            |(
                (id, name, cwd, created_at, updated_at),
                (phase, model, thinking_level),
                (attached, locked, revision),
                (transcript, queued_steer, queued_steer_count),
            )| SessionSnapshot {
                id,
                name,
                cwd,
                created_at,
                updated_at,
                phase,
                model,
                thinking_level,
                attached,
                locked,
                revision,
                transcript,
                queued_steer,
                queued_steer_count,
            },
        )
        .boxed()
}

fn model_metadata() -> BoxedStrategy<ModelMetadata> {
    (
        (id(), id(), id(), id(), any::<bool>()),
        prop::collection::vec(
            prop::sample::select(vec![InputKind::Text, InputKind::Image]),
            0..3,
        ),
        (1..=MAX_SAFE_INTEGER as u64, 1..1_000_000u64),
        (cost(), cost(), cost(), cost()),
        prop::collection::vec(thinking_level(), 1..4),
        any::<bool>(),
    )
        .prop_map(
            |(
                (provider, id, name, api, reasoning),
                input,
                (context_window, max_tokens),
                c,
                levels,
                authenticated,
            )| {
                ModelMetadata {
                    provider,
                    id,
                    name,
                    api,
                    reasoning,
                    input,
                    context_window,
                    max_tokens,
                    cost: ModelCost {
                        input: c.0,
                        output: c.1,
                        cache_read: c.2,
                        cache_write: c.3,
                    },
                    supported_thinking_levels: levels,
                    authenticated,
                }
            },
        )
        .boxed()
}

fn server_snapshot() -> BoxedStrategy<ServerSnapshot> {
    (
        id(),
        uint(),
        prop::collection::vec(session_metadata(), 0..3),
        prop::collection::vec(model_metadata(), 0..3),
    )
        .prop_map(|(server_id, revision, sessions, models)| ServerSnapshot {
            server_id,
            protocol_version: 1,
            revision,
            sessions,
            models,
        })
        .boxed()
}

fn protocol_error() -> BoxedStrategy<ProtocolError> {
    (
        prop::sample::select(ErrorCode::ALL.to_vec()),
        any_text(),
        prop::option::of(json()),
    )
        .prop_map(|(code, message, details)| ProtocolError {
            code,
            message,
            details,
        })
        .boxed()
}

fn command() -> BoxedStrategy<Command> {
    prop_oneof![
        Just(Command::List),
        (
            prop::option::of(id()),
            prop::option::of(any_text()),
            prop::option::of(model_ref_strategy()),
            prop::option::of(thinking_level())
        )
            .prop_map(
                |(cwd, name, model, thinking_level)| Command::Create(CreateParams {
                    cwd,
                    name,
                    model,
                    thinking_level
                })
            ),
        id().prop_map(|session_id| Command::Attach { session_id }),
        id().prop_map(|session_id| Command::Detach { session_id }),
        (id(), any_text()).prop_map(|(session_id, text)| Command::Prompt { session_id, text }),
        (id(), any_text()).prop_map(|(session_id, text)| Command::Steer { session_id, text }),
        id().prop_map(|session_id| Command::Abort { session_id }),
        (id(), model_ref_strategy())
            .prop_map(|(session_id, model)| Command::SetModel { session_id, model }),
        (id(), thinking_level()).prop_map(|(session_id, thinking_level)| Command::SetThinking {
            session_id,
            thinking_level
        }),
        id().prop_map(|session_id| Command::Remove { session_id }),
        (id(), prop::option::of(any_text())).prop_map(|(session_id, instructions)| {
            Command::Compact {
                session_id,
                instructions,
            }
        }),
        Just(Command::Status),
    ]
    .boxed()
}

fn command_result() -> BoxedStrategy<CommandResult> {
    prop_oneof![
        prop::collection::vec(session_metadata(), 0..3)
            .prop_map(|sessions| CommandResult::List { sessions }),
        session_snapshot().prop_map(|session| CommandResult::Create { session }),
        session_snapshot().prop_map(|session| CommandResult::Attach { session }),
        id().prop_map(|session_id| CommandResult::Detach { session_id }),
        session_snapshot().prop_map(|session| CommandResult::Prompt { session }),
        session_snapshot().prop_map(|session| CommandResult::Steer { session }),
        session_snapshot().prop_map(|session| CommandResult::Abort { session }),
        session_snapshot().prop_map(|session| CommandResult::SetModel { session }),
        session_snapshot().prop_map(|session| CommandResult::SetThinking { session }),
        id().prop_map(|session_id| CommandResult::Remove { session_id }),
        session_snapshot().prop_map(|session| CommandResult::Compact { session }),
        prop::collection::vec(
            (
                id(),
                prop::sample::select(LiveState::ALL.to_vec()),
                0..100u64
            ),
            0..3
        )
        .prop_map(|entries| CommandResult::Status {
            sessions: entries
                .into_iter()
                .map(|(session_id, state, clients)| LiveStatus {
                    session_id,
                    state,
                    clients,
                    model: None,
                    thinking_level: None,
                    preview: None,
                })
                .collect()
        }),
    ]
    .boxed()
}

fn client_message() -> BoxedStrategy<ClientMessage> {
    prop_oneof![
        (0..=MAX_SAFE_INTEGER as u64, prop::option::of(any_text()))
            .prop_map(|(version, token)| ClientMessage::Hello(ClientHello { version, token })),
        (id(), command()).prop_map(|(id, command)| ClientMessage::Request(Request { id, command })),
    ]
    .boxed()
}

fn server_event() -> BoxedStrategy<ServerEvent> {
    prop_oneof![
        server_snapshot().prop_map(|snapshot| ServerEvent::ServerSnapshot { snapshot }),
        session_snapshot().prop_map(|snapshot| ServerEvent::SessionSnapshot { snapshot }),
        (id(), progress()).prop_map(|(session_id, progress)| ServerEvent::SessionProgress {
            session_id,
            progress
        }),
        id().prop_map(|session_id| ServerEvent::SessionRemoved { session_id }),
    ]
    .boxed()
}

fn server_message() -> BoxedStrategy<ServerMessage> {
    prop_oneof![
        (id(), server_snapshot()).prop_map(|(connection_id, snapshot)| ServerMessage::Hello(
            ServerHello {
                version: 1,
                connection_id,
                snapshot
            }
        )),
        protocol_error().prop_map(ServerMessage::HelloError),
        (
            id(),
            prop_oneof![
                command_result().prop_map(Ok),
                protocol_error().prop_map(Err)
            ]
        )
            .prop_map(|(id, outcome)| ServerMessage::Response(Response { id, outcome })),
        server_event().prop_map(ServerMessage::Event),
    ]
    .boxed()
}

proptest! {
    #[test]
    fn client_messages_round_trip_through_values(message in client_message()) {
        prop_assert_eq!(ClientMessage::from_value(&message.to_value(), "")?, message);
    }

    #[test]
    fn server_messages_round_trip_through_values(message in server_message()) {
        prop_assert_eq!(ServerMessage::from_value(&message.to_value(), "")?, message);
    }

    #[test]
    fn client_messages_round_trip_through_bytes(message in client_message()) {
        let bytes = encode_client_message(&message)?;
        prop_assert_eq!(decode_client_message(&bytes, &CborLimits::default())?, message);
    }

    #[test]
    fn server_messages_round_trip_through_bytes(message in server_message()) {
        let bytes = encode_server_message(&message)?;
        prop_assert_eq!(decode_server_message(&bytes, &CborLimits::default())?, message);
    }
}

// ---------------------------------------------------------------------------
// Property: the direct request reader agrees with the tree path.
// ---------------------------------------------------------------------------

/// Whether the direct reader must take `message` (the commands it reads).
fn read_directly(message: &ClientMessage) -> bool {
    matches!(
        message,
        ClientMessage::Request(Request {
            command: Command::List
                | Command::Status
                | Command::Attach { .. }
                | Command::Detach { .. }
                | Command::Abort { .. }
                | Command::Remove { .. }
                | Command::Prompt { .. }
                | Command::Steer { .. },
            ..
        })
    )
}

/// One change to an encoded message: overwrite a byte, cut the tail, or
/// insert a byte.
#[derive(Debug, Clone)]
enum Corruption {
    Set(usize, u8),
    Cut(usize),
    Insert(usize, u8),
}

fn corruption() -> BoxedStrategy<Corruption> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Corruption::Set(at, byte)),
        any::<usize>().prop_map(Corruption::Cut),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Corruption::Insert(at, byte)),
    ]
    .boxed()
}

fn corrupt(mut bytes: Vec<u8>, corruptions: &[Corruption]) -> Vec<u8> {
    for corruption in corruptions {
        let len = bytes.len().max(1);
        match *corruption {
            Corruption::Set(at, byte) => {
                if let Some(b) = bytes.get_mut(at % len) {
                    *b = byte;
                }
            }
            Corruption::Cut(at) => bytes.truncate(at % len),
            Corruption::Insert(at, byte) => bytes.insert(at % (bytes.len() + 1), byte),
        }
    }
    bytes
}

proptest! {
    #[test]
    fn direct_session_id_responses_equal_the_tree_path(
        request_id in id(),
        session_id in id(),
        remove in any::<bool>(),
    ) {
        let result = if remove {
            CommandResult::Remove { session_id: session_id.clone() }
        } else {
            CommandResult::Detach { session_id: session_id.clone() }
        };
        let mut direct = Vec::new();
        codec::direct::encode_session_id_response(&request_id, result.name(), &session_id, &mut direct)?;
        prop_assert!(direct.len() <= codec::direct::session_id_response_capacity(&request_id, &session_id));
        let tree = encode_server_message(&ServerMessage::Response(Response {
            id: request_id,
            outcome: Ok(result),
        }))?;
        prop_assert_eq!(hex(&direct), hex(&tree));
    }

    #[test]
    fn the_direct_reader_reads_what_the_tree_reads(message in client_message()) {
        let bytes = encode_client_message(&message)?;
        let read = codec::read::client_request(&bytes, &CborLimits::default());
        if read_directly(&message) {
            prop_assert_eq!(read, Some(message));
        } else {
            prop_assert_eq!(read, None);
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn the_direct_reader_takes_only_what_the_tree_accepts(
        message in client_message(),
        corruptions in prop::collection::vec(corruption(), 1..4),
    ) {
        let bytes = corrupt(encode_client_message(&message)?, &corruptions);
        let limits = CborLimits::default();
        if let Some(read) = codec::read::client_request(&bytes, &limits) {
            let tree = codec::decode_payload::<ClientMessage>(&bytes, &limits);
            prop_assert_eq!(tree, Ok(read));
        }
    }
}

#[test]
fn the_direct_reader_leaves_the_unusual_to_the_tree() {
    let limits = CborLimits::default();
    let encode = |entries: Vec<(&str, Value)>| {
        let map = entries.into_iter().map(|(k, v)| (k.to_owned(), v));
        kernel::wire::cbor::to_vec(&Value::Map(map.collect())).unwrap()
    };
    let command = |entries: Vec<(&str, Value)>| {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        )
    };
    let request = |id: Value, command: Value| {
        encode(vec![
            ("type", text("request")),
            ("id", id),
            ("request", command),
        ])
    };
    let attach = || command(vec![("command", text("attach")), ("sessionId", text("s1"))]);
    let normal = request(text("r1"), attach());
    let read = codec::read::client_request(&normal, &limits).expect("read directly");

    // Keys in another order, and a head longer than it needs: read directly,
    // as the tree reads them.
    let reordered = encode(vec![
        ("request", attach()),
        ("id", text("r1")),
        ("type", text("request")),
    ]);
    let mut long_head = normal.clone();
    let at = long_head
        .iter()
        .position(|&b| b == 0x62)
        .expect("the id's head");
    long_head.splice(at..=at, [0x78, 0x02]);
    for bytes in [&normal, &reordered, &long_head] {
        assert_eq!(
            codec::read::client_request(bytes, &limits).as_ref(),
            Some(&read)
        );
        assert_eq!(decode_client_message(bytes, &limits).as_ref(), Ok(&read));
    }

    // Each of these goes to the tree, which rejects it with its usual error.
    let session =
        |name: &str, session: Value| command(vec![("command", text(name)), ("sessionId", session)]);
    let extra = encode(vec![
        ("type", text("request")),
        ("id", text("r1")),
        ("request", attach()),
        ("extra", Value::Null),
    ]);
    let mut repeated = normal.clone();
    repeated[0] = 0xa4;
    repeated.extend_from_slice(&[0x62, b'i', b'd', 0x62, b'r', b'2']);
    let mut trailing = normal.clone();
    trailing.push(0xf6);
    let unusual = [
        request(text(""), attach()),
        request(Value::Int(1), attach()),
        request(text("r1"), command(vec![("command", text("attach"))])),
        request(text("r1"), session("attach", text(""))),
        request(text("r1"), session("detach", Value::Null)),
        request(text("r1"), session("list", text("s1"))),
        request(text("r1"), session("launch", text("s1"))),
        request(text("r1"), session("prompt", text("s1"))),
        request(
            text("r1"),
            command(vec![
                ("command", text("attach")),
                ("sessionId", text("s1")),
                ("text", text("hi")),
            ]),
        ),
        request(text("r1"), command(vec![("command", Value::Int(3))])),
        request(text("r1"), Value::Array(Vec::new())),
        encode(vec![
            ("type", text("hello")),
            ("id", text("r1")),
            ("request", attach()),
        ]),
        extra,
        repeated,
        trailing,
        normal[..normal.len() - 1].to_vec(),
    ];
    for bytes in unusual {
        assert_eq!(
            codec::read::client_request(&bytes, &limits),
            None,
            "{}",
            hex(&bytes)
        );
        assert!(
            decode_client_message(&bytes, &limits).is_err(),
            "{}",
            hex(&bytes)
        );
    }

    // Within a stricter bound than the message needs: the tree decides.
    for strict in [
        CborLimits {
            max_depth: 0,
            ..limits
        },
        CborLimits {
            max_container_len: 2,
            ..limits
        },
        CborLimits {
            max_byte_len: normal.len() - 1,
            ..limits
        },
    ] {
        assert_eq!(
            codec::read::client_request(&normal, &strict),
            None,
            "{strict:?}"
        );
        assert!(
            decode_client_message(&normal, &strict).is_err(),
            "{strict:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// Property: the encoders around pre-encoded lists write the normal bytes.
// ---------------------------------------------------------------------------

/// A server snapshot with lists long enough for one- and two-byte array headers.
fn long_server_snapshot() -> BoxedStrategy<ServerSnapshot> {
    (
        server_snapshot(),
        prop::collection::vec(session_metadata(), 0..300),
        prop::collection::vec(model_metadata(), 0..30),
    )
        .prop_map(|(snapshot, sessions, models)| ServerSnapshot {
            sessions,
            models,
            ..snapshot
        })
        .boxed()
}

/// The CBOR of `sessions` kept as a server's cache keeps it: in pieces of
/// one to four entries (some empty), some entries encoded on their own
/// beforehand, the others while building the piece.
fn spliced_sessions(sessions: &[SessionMetadata]) -> codec::spliced::EncodedList {
    use codec::spliced::{EncodedList, ListBuilder, encode_item};
    let mut list = EncodedList::new(sessions.len(), Vec::new()).unwrap();
    let mut piece = ListBuilder::headless(0);
    for (i, meta) in sessions.iter().enumerate() {
        if i % 2 == 0 {
            piece.push_encoded(&encode_item(meta).unwrap());
        } else {
            piece.push_metadata(meta).unwrap();
        }
        if i % 4 == 1 || i % 7 == 3 {
            list.push(
                std::mem::replace(&mut piece, ListBuilder::headless(0))
                    .finish()
                    .into(),
            );
        }
        if i % 5 == 0 {
            list.push(Vec::new().into());
        }
    }
    list.push(piece.finish().into());
    list
}

/// A message encoded in pieces, framed from them (the frame holds the
/// shared pieces), as one buffer.
fn framed_pieces(spliced: codec::spliced::Spliced<'_>) -> Result<Vec<u8>, TestCaseError> {
    use kernel::wire::frame::DEFAULT_MAX_FRAME_LEN;
    let frame = spliced
        .frame(DEFAULT_MAX_FRAME_LEN)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(
        frame.pieces().iter().map(|p| p.len()).sum::<usize>(),
        frame.len()
    );
    Ok(frame.bytes().to_vec())
}

fn framed(message: &ServerMessage) -> Result<Vec<u8>, TestCaseError> {
    use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
    let payload = encode_server_message(message)?;
    encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).map_err(|e| TestCaseError::fail(e.to_string()))
}

proptest! {
    // Each case encodes up to 300 sessions four ways.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn spliced_encodings_equal_the_normal_ones(
        snapshot in long_server_snapshot(),
        connection_id in id(),
        request_id in id(),
    ) {
        use codec::spliced::{EncodedSnapshot, encode_list};
        let sessions = spliced_sessions(&snapshot.sessions);
        let models = encode_list(&snapshot.models).unwrap();
        let encoded = EncodedSnapshot {
            server_id: &snapshot.server_id,
            protocol_version: snapshot.protocol_version,
            revision: snapshot.revision,
            sessions: &sessions,
            models: &models,
        };

        let hello = ServerMessage::Hello(ServerHello {
            version: PROTOCOL_VERSION,
            connection_id: connection_id.clone(),
            snapshot: snapshot.clone(),
        });
        let spliced = framed_pieces(codec::spliced::encode_hello(
            PROTOCOL_VERSION,
            &connection_id,
            &encoded,
        )?)?;
        prop_assert_eq!(hex(&spliced), hex(&framed(&hello)?));

        let event = ServerMessage::Event(ServerEvent::ServerSnapshot {
            snapshot: snapshot.clone(),
        });
        let spliced = framed_pieces(codec::spliced::encode_server_snapshot_event(&encoded)?)?;
        prop_assert_eq!(hex(&spliced), hex(&framed(&event)?));

        let list = ServerMessage::Response(Response {
            id: request_id.clone(),
            outcome: Ok(CommandResult::List {
                sessions: snapshot.sessions.clone(),
            }),
        });
        let spliced =
            framed_pieces(codec::spliced::encode_list_response(&request_id, &sessions)?)?;
        prop_assert_eq!(
            hex(&spliced[4..]),
            hex(&codec::spliced::encode_list_response(&request_id, &sessions)?.to_vec())
        );
        prop_assert_eq!(hex(&spliced), hex(&framed(&list)?));
    }
}

/// Past the CBOR length limit, the encoders around pre-encoded lists fail
/// as the normal encoder does.
#[test]
fn spliced_encodings_fail_like_the_normal_ones() {
    let big = SessionMetadata {
        id: "s".into(),
        created_at: 1,
        updated_at: None,
        parent_session_id: None,
        session_name: Some("x".repeat(9 * 1024 * 1024)),
        cwd: None,
    };
    let sessions = vec![
        big.clone(),
        SessionMetadata {
            id: "t".into(),
            ..big
        },
    ];
    let message = ServerMessage::Response(Response {
        id: "l".into(),
        outcome: Ok(CommandResult::List {
            sessions: sessions.clone(),
        }),
    });
    let normal = encode_server_message(&message).unwrap_err();
    let spliced =
        codec::spliced::encode_list_response("l", &spliced_sessions(&sessions)).unwrap_err();
    assert_eq!(spliced, normal);
    assert!(
        normal.message().contains("CBOR byte length exceeds"),
        "{normal}"
    );
}

// ---------------------------------------------------------------------------
// Property: the encoders around a pre-encoded session snapshot write the
// normal bytes.
// ---------------------------------------------------------------------------

/// The commands answered with a session snapshot.
const SNAPSHOT_COMMANDS: [&str; 7] = [
    "create",
    "attach",
    "prompt",
    "steer",
    "abort",
    "set_model",
    "set_thinking",
];

proptest! {
    #[test]
    fn spliced_session_snapshots_equal_the_normal_ones(
        snapshot in session_snapshot(),
        request_id in id(),
        command in prop::sample::select(SNAPSHOT_COMMANDS.to_vec()),
    ) {
        use codec::spliced::{
            encode_session_response, encode_session_snapshot, encode_session_snapshot_event,
        };
        let cbor: std::sync::Arc<[u8]> = encode_session_snapshot(&snapshot)?.into();
        let cbor = [cbor];
        // The same snapshot in the server's pieces: its transcript packed.
        let packed = kernel::protocol::PackedSnapshot::pack(snapshot.clone())?;
        let pieces = codec::spliced::encode_packed_session_snapshot(
            packed.head(),
            packed.transcript(),
            codec::direct::Shown::of(&snapshot),
        )?;
        prop_assert_eq!(hex(&pieces.concat()), hex(&cbor[0]));

        let event = ServerMessage::Event(ServerEvent::SessionSnapshot {
            snapshot: snapshot.clone(),
        });
        let spliced = framed_pieces(encode_session_snapshot_event(&cbor)?)?;
        prop_assert_eq!(hex(&spliced), hex(&framed(&event)?));
        let spliced = framed_pieces(encode_session_snapshot_event(&pieces)?)?;
        prop_assert_eq!(hex(&spliced), hex(&framed(&event)?));

        let result = CommandResult::with_session(command, snapshot).unwrap();
        prop_assert_eq!(result.name(), command);
        let response = ServerMessage::Response(Response {
            id: request_id.clone(),
            outcome: Ok(result),
        });
        let spliced = framed_pieces(encode_session_response(&request_id, command, &cbor)?)?;
        prop_assert_eq!(hex(&spliced), hex(&framed(&response)?));
    }
}

/// JSON nested `depth` arrays deep.
fn nested_json(depth: usize) -> Value {
    (0..depth).fold(Value::Null, |inner, _| Value::Array(vec![inner]))
}

/// A session snapshot is encoded on its own, but its depth counts from the
/// messages that carry it: a tool input nested past the CBOR depth limit
/// fails (or passes) exactly as in the normal encoding.
#[test]
fn spliced_session_snapshots_nest_like_the_normal_ones() {
    use codec::spliced::{encode_session_response, encode_session_snapshot};
    let mut failed = 0;
    for depth in 55..=62 {
        let mut snapshot = snapshot_with_transcript();
        if let TranscriptItem::Tool(tool) = &mut snapshot.transcript[2] {
            tool.input = nested_json(depth);
        }
        let response = ServerMessage::Response(Response {
            id: "r".into(),
            outcome: Ok(CommandResult::Attach {
                session: snapshot.clone(),
            }),
        });
        let normal = encode_server_message(&response).map_err(|e| e.to_string());
        let spliced = encode_session_snapshot(&snapshot)
            .map_err(|e| format!("cannot encode CBOR: {e}"))
            .and_then(|cbor| {
                encode_session_response("r", "attach", &[cbor.into()])
                    .map(|s| s.to_vec())
                    .map_err(|e| e.to_string())
            });
        assert_eq!(spliced, normal, "depth {depth}");
        // A worker packs a transcript for the deepest message that carries it.
        let packed = kernel::protocol::PackedSnapshot::pack(snapshot.clone());
        assert_eq!(packed.is_ok(), normal.is_ok(), "depth {depth}");
        // A server takes from a worker only what it can pass on: a frame
        // nests the snapshot one level less deep than a client message.
        let frame = map! {
            "type" => Value::text("snapshot"),
            "snapshot" => snapshot.to_value(),
        };
        let mut bytes = Vec::new();
        let deep = CborLimits {
            max_depth: 128,
            ..CborLimits::default()
        };
        kernel::wire::cbor::encode_with_limits(&frame, &mut bytes, &deep).expect("encodes");
        let decoded = worker::decode_worker_frame(&bytes, &CborLimits::default());
        assert_eq!(
            decoded.is_ok(),
            normal.is_ok(),
            "depth {depth}: {decoded:?}"
        );
        failed += usize::from(normal.is_err());
    }
    assert!(failed > 0 && failed < 8, "the limit lies within: {failed}");
}

// ---------------------------------------------------------------------------
// Property: the direct writers (`codec::direct`) write the tree path's bytes,
// and fail where it fails, with the same error.
// ---------------------------------------------------------------------------

/// The tree path without the schema check (what a release server used to
/// write), so that values the schema forbids but CBOR carries compare too.
fn tree_payload(message: &ServerMessage) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    kernel::wire::cbor::encode(&message.to_value(), &mut out)
        .map_err(|e| format!("cannot encode CBOR: {e}"))?;
    Ok(out)
}

fn direct_progress(session_id: &str, progress: &TranscriptProgress) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    codec::direct::encode_progress_event(session_id, progress, &mut out)
        .map_err(|e| format!("cannot encode CBOR: {e}"))?;
    Ok(out)
}

fn progress_message(session_id: &str, progress: &TranscriptProgress) -> ServerMessage {
    ServerMessage::Event(ServerEvent::SessionProgress {
        session_id: session_id.into(),
        progress: progress.clone(),
    })
}

/// Every progress variant, every item kind and status, every content kind,
/// with and without each optional field.
fn every_progress() -> Vec<TranscriptProgress> {
    let snapshot = snapshot_with_transcript();
    let mut items = snapshot.transcript.clone();
    let TranscriptItem::Assistant(complete) = &items[1] else {
        unreachable!("the fixture's second item is the assistant's")
    };
    let TranscriptItem::Tool(tool) = &items[2] else {
        unreachable!("the fixture's third item is the tool's")
    };
    let (complete, tool) = (complete.clone(), tool.clone());
    for (status, error_message) in [
        (AssistantStatus::Streaming, None),
        (AssistantStatus::Complete(StopReason::Stop), None),
        (AssistantStatus::Complete(StopReason::Length), None),
        (AssistantStatus::Error, Some("overloaded")),
        (AssistantStatus::Error, None),
        (AssistantStatus::Aborted, Some("")),
    ] {
        items.push(TranscriptItem::Assistant(AssistantItem {
            status,
            error_message: error_message.map(String::from),
            response_model: None,
            usage: Some(Usage {
                reasoning: None,
                ..Usage::default()
            }),
            ..complete.clone()
        }));
    }
    items.push(TranscriptItem::Assistant(AssistantItem {
        content: vec![Content::Thinking {
            thinking: "…".into(),
            redacted: None,
            signature: None,
        }],
        usage: None,
        ..complete
    }));
    for status in [ToolStatus::Running, ToolStatus::Complete] {
        items.push(TranscriptItem::Tool(ToolItem {
            status,
            details: None,
            usage: Some(Usage::default()),
            ..tool.clone()
        }));
    }
    let mut progress: Vec<TranscriptProgress> = items
        .into_iter()
        .flat_map(|item| {
            [
                TranscriptProgress::ItemStarted { item: item.clone() },
                TranscriptProgress::ItemUpdated { item: item.clone() },
                TranscriptProgress::ItemFinished { item },
            ]
        })
        .collect();
    for kind in [DeltaKind::Text, DeltaKind::Thinking, DeltaKind::ToolCall] {
        for delta in ["", "w", "Hé ✓", &"x".repeat(300)] {
            progress.push(TranscriptProgress::AssistantDelta {
                message_id: "a1".into(),
                content_index: 70_000,
                kind,
                delta: delta.into(),
            });
        }
    }
    progress
}

#[test]
fn direct_progress_events_equal_the_tree_path() {
    assert_eq!(
        hex(&direct_progress(
            "s2",
            &TranscriptProgress::AssistantDelta {
                message_id: "a1".into(),
                content_index: 1,
                kind: DeltaKind::Text,
                delta: "Hé ✓".into(),
            }
        )
        .unwrap()),
        ASSISTANT_DELTA_HEX
    );
    for progress in every_progress() {
        let message = progress_message("s2", &progress);
        let direct = direct_progress("s2", &progress);
        assert_eq!(direct, tree_payload(&message), "{progress:?}");
        // Item schemas differ by variant (a finished item is terminal): compare
        // the strict decode where the message is valid.
        if let Ok(checked) = encode_server_message(&message) {
            let direct = direct.unwrap();
            assert_eq!(direct, checked);
            let limits = CborLimits::default();
            assert_eq!(decode_server_message(&direct, &limits).unwrap(), message);
        }
    }
}

#[test]
fn direct_snapshots_and_list_entries_equal_the_tree_path() {
    use codec::direct::{Shown, encode_session_metadata, encode_session_snapshot};
    let snapshot = snapshot_with_transcript();
    for (attached, locked) in [(false, false), (false, true), (true, false), (true, true)] {
        let shown = Shown { attached, locked };
        let mut normalised = snapshot.clone();
        normalised.attached = attached;
        normalised.locked = locked;
        for depth in [0, 2] {
            let mut tree = Vec::new();
            kernel::wire::cbor::Encoder::new(&mut tree, &CborLimits::default())
                .nested_item(&normalised.to_value(), depth)
                .unwrap();
            assert_eq!(
                hex(&encode_session_snapshot(&snapshot, shown, depth).unwrap()),
                hex(&tree)
            );
        }
    }
    let meta = SessionMetadata {
        id: "s1".into(),
        created_at: 1,
        updated_at: Some(2),
        parent_session_id: Some("s0".into()),
        session_name: Some("a name".into()),
        cwd: Some("/p".into()),
    };
    assert_eq!(
        encode_session_metadata(&meta).unwrap(),
        codec::spliced::encode_item(&meta).unwrap()
    );
}

/// Values CBOR cannot carry fail in the direct writer with the tree path's
/// error: an integer beyond 2^53 − 1, a non-finite cost, JSON nested past
/// the depth limit, a text past the length limit, a whole item past it.
#[test]
fn direct_writers_fail_like_the_tree_path() {
    let delta = |content_index: u64, delta: String| TranscriptProgress::AssistantDelta {
        message_id: "a1".into(),
        content_index,
        kind: DeltaKind::Text,
        delta,
    };
    let TranscriptItem::Assistant(assistant) = snapshot_with_transcript().transcript[1].clone()
    else {
        unreachable!("the fixture's second item is the assistant's")
    };
    let mut nan_cost = assistant.clone();
    nan_cost.usage.as_mut().unwrap().cost.total = f64::NAN;
    let mut huge_usage = assistant.clone();
    huge_usage.usage.as_mut().unwrap().total_tokens = u64::MAX;
    let mut cases = vec![
        delta(MAX_SAFE_INTEGER as u64 + 1, "x".into()),
        delta(1, "x".repeat(16 * 1024 * 1024 + 1)),
        delta(1, "x".repeat(16 * 1024 * 1024 - 100)),
        TranscriptProgress::ItemUpdated {
            item: TranscriptItem::Assistant(nan_cost),
        },
        TranscriptProgress::ItemUpdated {
            item: TranscriptItem::Assistant(huge_usage),
        },
    ];
    let mut failed_depths = 0;
    for depth in 55..=62 {
        let mut nested = assistant.clone();
        nested.content[2] = Content::ToolCall {
            tool_call_id: "c".into(),
            tool_name: "t".into(),
            input: nested_json(depth),
        };
        cases.push(TranscriptProgress::ItemUpdated {
            item: TranscriptItem::Assistant(nested),
        });
        let TranscriptItem::Tool(mut tool) = snapshot_with_transcript().transcript[2].clone()
        else {
            unreachable!("the fixture's third item is the tool's")
        };
        tool.details = Some(nested_json(depth));
        cases.push(TranscriptProgress::ItemFinished {
            item: TranscriptItem::Tool(tool),
        });
    }
    for progress in &cases {
        let tree = tree_payload(&progress_message("s", progress));
        let direct = direct_progress("s", progress);
        assert_eq!(direct.is_ok(), tree.is_ok());
        match (direct, tree) {
            (Ok(direct), Ok(tree)) => assert!(direct == tree, "same bytes"),
            (Err(direct), Err(tree)) => {
                assert_eq!(direct, tree);
                failed_depths += usize::from(direct.contains("depth"));
            }
            _ => unreachable!("compared above"),
        }
    }
    assert!(
        failed_depths > 0 && failed_depths < 16,
        "the depth limit lies within: {failed_depths}"
    );
}

proptest! {
    #[test]
    fn direct_progress_events_equal_the_tree_path_on_arbitrary_messages(
        session_id in id(),
        progress in progress(),
    ) {
        let message = progress_message(&session_id, &progress);
        let direct = direct_progress(&session_id, &progress).map_err(TestCaseError::fail)?;
        prop_assert_eq!(hex(&direct), hex(&encode_server_message(&message)?));
        let decoded = decode_server_message(&direct, &CborLimits::default())?;
        prop_assert_eq!(decoded, message);
    }

    #[test]
    fn direct_snapshots_and_list_entries_equal_the_tree_path_on_arbitrary_values(
        snapshot in session_snapshot(),
        attached in any::<bool>(),
        sessions in prop::collection::vec(session_metadata(), 0..8),
    ) {
        use codec::direct::{Shown, encode_session_metadata};
        use codec::spliced::{ListBuilder, encode_item, encode_session_snapshot_shown};
        let mut normalised = snapshot.clone();
        normalised.attached = attached;
        normalised.locked = true;
        let shown = Shown { attached, locked: true };
        let mut tree = Vec::new();
        kernel::wire::cbor::Encoder::new(&mut tree, &CborLimits::default())
            .nested_item(&normalised.to_value(), 2)?;
        prop_assert_eq!(hex(&encode_session_snapshot_shown(&snapshot, shown)?), hex(&tree));
        let event = ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot: normalised });
        let cbor = [encode_session_snapshot_shown(&snapshot, shown)?.into()];
        let spliced = codec::spliced::encode_session_snapshot_event(&cbor)?.to_vec();
        prop_assert_eq!(hex(&spliced), hex(&encode_server_message(&event)?));

        let mut direct = ListBuilder::new(sessions.len())?;
        let mut tree = ListBuilder::new(sessions.len())?;
        let mut piece = ListBuilder::headless(0);
        for meta in &sessions {
            prop_assert_eq!(encode_session_metadata(meta)?, encode_item(meta)?);
            direct.push_metadata(meta)?;
            tree.push(meta)?;
            piece.push_metadata(meta)?;
        }
        let entries = sessions.len();
        let list = ServerMessage::Response(Response {
            id: "l".into(),
            outcome: Ok(CommandResult::List { sessions }),
        });
        let direct = direct.finish();
        prop_assert_eq!(&direct, &tree.finish());
        let pieces = codec::spliced::EncodedList::new(entries, vec![piece.finish().into()])?;
        prop_assert_eq!(&pieces.to_vec(), &direct);
        let spliced = codec::spliced::encode_list_response("l", &pieces)?.to_vec();
        prop_assert_eq!(hex(&spliced), hex(&encode_server_message(&list)?));
    }
}

/// A v8 request envelope as a client encodes it (the call last).
fn v8_request_bytes(id: &str, session: Option<(&str, &str)>, method: &str) -> Vec<u8> {
    let server = (
        "serverId".to_owned(),
        text("00000000-0000-4000-8000-000000000001"),
    );
    let target = match session {
        None => Value::Map(vec![server]),
        Some((s, a)) => Value::Map(vec![
            server,
            ("sessionId".to_owned(), text(s)),
            ("attachmentId".to_owned(), text(a)),
        ]),
    };
    let call = Value::Map(vec![
        ("kind".to_owned(), text("call")),
        ("service".to_owned(), text("pi.session-management")),
        ("method".to_owned(), text(method)),
        (
            "args".to_owned(),
            Value::Array(vec![Value::Map(vec![("sessionId".to_owned(), text("s1"))])]),
        ),
    ]);
    let envelope = Value::Map(vec![
        ("type".to_owned(), text("request")),
        ("id".to_owned(), text(id)),
        ("target".to_owned(), target),
        ("call".to_owned(), call),
    ]);
    kernel::wire::cbor::to_vec(&envelope).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// The v8 envelope's direct reader yields what the tree path does
    /// (`decode_client_message` asserts it in debug builds, as these are),
    /// on well-formed and on corrupted requests.
    #[test]
    fn the_v8_direct_reader_takes_only_what_the_tree_accepts(
        request_id in id(),
        session in prop::option::of((id(), id())),
        corruptions in prop::collection::vec(corruption(), 0..4),
    ) {
        let session = session.as_ref().map(|(s, a)| (s.as_str(), a.as_str()));
        let bytes = corrupt(v8_request_bytes(&request_id, session, "detach"), &corruptions);
        let decoded = kernel::protocol::v8::decode_client_message(&bytes, &CborLimits::default());
        if corruptions.is_empty() {
            prop_assert!(decoded.is_ok(), "{decoded:?}");
        }
    }
}
