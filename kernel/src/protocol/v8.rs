//! pi protocol v8: the envelope around chord service calls.
//!
//! The framing and the strict CBOR are v1's. A client sends `hello{version}`
//! (read by v1's decoder, which picks the protocol), then `request{id,
//! target, call}` and `cancel{id, target}`; the server sends `hello{version:
//! 8, serverId}`, `hello_error{error}`, `response{id, ok, result?|error}`,
//! `service_update{subscriptionId, update}` and `attachment{attachment}`.
//! Every semantic lives in the chord services the calls address.

use crate::chord::call::CallError;
use crate::wire::{CborLimits, Value, cbor};

/// The protocol version this module speaks.
pub const PROTOCOL_VERSION_V8: u64 = 8;

/// Where a request goes: the server, or the session this connection is attached to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// `{serverId}`
    Server {
        /// Must be this server's id.
        server_id: String,
    },
    /// `{serverId, sessionId, attachmentId}`
    Session {
        /// Must be this server's id.
        server_id: String,
        /// The attached session.
        session_id: String,
        /// The attachment's id, as the `attachment` envelope announced it.
        attachment_id: String,
    },
}

impl Target {
    /// The server the target names.
    pub fn server_id(&self) -> &str {
        match self {
            Self::Server { server_id } | Self::Session { server_id, .. } => server_id,
        }
    }

    fn parse(v: &Value) -> Result<Self, String> {
        let Value::Map(entries) = v else {
            return Err("target must be an object".into());
        };
        let field = |name: &str| -> Result<String, String> {
            match v.get(name) {
                Some(Value::Text(s)) if !s.is_empty() => Ok(s.clone()),
                Some(_) => Err(format!("target.{name} must be a non-empty string")),
                None => Err(format!("target.{name} is missing")),
            }
        };
        let server_id = field("serverId")?;
        if !is_server_id(&server_id) {
            return Err("target.serverId must be a lowercase UUIDv4".into());
        }
        match entries.len() {
            1 => Ok(Self::Server { server_id }),
            3 => Ok(Self::Session {
                server_id,
                session_id: field("sessionId")?,
                attachment_id: field("attachmentId")?,
            }),
            _ => Err("target has unknown keys".into()),
        }
    }
}

/// Whether `s` is a canonical lowercase UUIDv4, as v8's `ServerId` is.
pub fn is_server_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            14 => *c == b'4',
            19 => matches!(c, b'8' | b'9' | b'a' | b'b'),
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

/// A client message after the hello.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// A second hello (a protocol error).
    Hello,
    /// `{type:"request", id, target, call}`; `call` is parsed by the service layer.
    Request {
        /// Unique among this connection's active requests.
        id: String,
        /// Where it goes.
        target: Target,
        /// The service call, still as a value.
        call: Value,
    },
    /// `{type:"cancel", id, target}`.
    Cancel {
        /// The request to cancel.
        id: String,
        /// Its target, which must match.
        target: Target,
    },
}

/// Decodes one client payload of a v8 connection, strictly: exact key sets.
/// The message's parts are moved out of the decoded tree, not copied.
pub fn decode_client_message(payload: &[u8], limits: &CborLimits) -> Result<ClientMessage, String> {
    // Most messages are requests every client encodes alike: read straight
    // from the bytes, the tree path judging anything else.
    if let Some(fast) = fast_request(payload, limits) {
        debug_assert_eq!(Ok(&fast), decode_tree(payload, limits).as_ref());
        return Ok(fast);
    }
    decode_tree(payload, limits)
}

/// A request read by [`super::codec::read::v8_request`], checked as the tree
/// path checks it; `None` for anything the tree path must judge.
fn fast_request(payload: &[u8], limits: &CborLimits) -> Option<ClientMessage> {
    let r = super::codec::read::v8_request(payload, limits)?;
    if r.id.is_empty() || !is_server_id(r.server_id) || !r.call.is_json() {
        return None;
    }
    let server_id = r.server_id.to_owned();
    let target = match r.session {
        None => Target::Server { server_id },
        Some((session, attachment)) if !session.is_empty() && !attachment.is_empty() => {
            Target::Session {
                server_id,
                session_id: session.to_owned(),
                attachment_id: attachment.to_owned(),
            }
        }
        Some(_) => return None,
    };
    Some(ClientMessage::Request {
        id: r.id.to_owned(),
        target,
        call: r.call,
    })
}

/// [`decode_client_message`] through the value tree.
fn decode_tree(payload: &[u8], limits: &CborLimits) -> Result<ClientMessage, String> {
    let value = cbor::decode(payload, limits).map_err(|e| e.to_string())?;
    let Value::Map(entries) = value else {
        return Err("a message must be an object".into());
    };
    let kind = match entries.iter().find(|(k, _)| k == "type") {
        Some((_, Value::Text(t))) => t.as_str(),
        _ => return Err("unknown message type".into()),
    };
    let expected: &[&str] = match kind {
        "hello" => return Ok(ClientMessage::Hello),
        "request" => &["type", "id", "target", "call"],
        "cancel" => &["type", "id", "target"],
        _ => return Err("unknown message type".into()),
    };
    // Keys are unique (the decoder refuses a repeated one).
    if entries.len() != expected.len()
        || !entries.iter().all(|(k, _)| expected.contains(&k.as_str()))
    {
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        return Err(format!("unexpected keys {keys:?}"));
    }
    let request = kind == "request";
    let (mut id, mut target, mut call) = (None, None, None);
    for (key, value) in entries {
        match key.as_str() {
            "id" => id = Some(value),
            "target" => target = Some(value),
            "call" => call = Some(value),
            _ => {}
        }
    }
    let id = match id {
        Some(Value::Text(s)) if !s.is_empty() => s,
        _ => return Err("id must be a non-empty string".to_string()),
    };
    let target = Target::parse(&target.ok_or("target is missing")?)?;
    if !request {
        return Ok(ClientMessage::Cancel { id, target });
    }
    let call = call.expect("checked");
    if !call.is_json() {
        return Err("call must be JSON".into());
    }
    Ok(ClientMessage::Request { id, target, call })
}

fn error_value(error: &CallError) -> Value {
    Value::object(vec![
        ("code", Value::text(&error.code)),
        ("message", Value::text(&error.message)),
    ])
}

/// A message the server sends on a v8 connection.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    /// `{type:"hello", version:8, serverId}`
    Hello {
        /// This server.
        server_id: String,
    },
    /// `{type:"response", id, ok:true, result?}`; `None` is a void result.
    Ok {
        /// The request answered.
        id: String,
        /// Its result.
        result: Option<Value>,
    },
    /// `{type:"response", id, ok:false, error}`
    Err {
        /// The request answered.
        id: String,
        /// Why it failed.
        error: CallError,
    },
    /// `{type:"service_update", subscriptionId, update}`
    ServiceUpdate {
        /// The client's subscription.
        subscription_id: String,
        /// A chord provider update.
        update: Value,
    },
    /// `{type:"attachment", attachment}`: the connection's route now.
    Attachment(Option<Target>),
}

impl ServerMessage {
    /// The message as its wire value, keys in the published server's order.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Hello { server_id } => Value::object(vec![
                ("type", Value::text("hello")),
                ("version", Value::Int(PROTOCOL_VERSION_V8 as i64)),
                ("serverId", Value::text(server_id)),
            ]),
            Self::Ok { id, result } => {
                let mut pairs = vec![
                    ("type", Value::text("response")),
                    ("id", Value::text(id)),
                    ("ok", Value::Bool(true)),
                ];
                if let Some(result) = result {
                    pairs.push(("result", result.clone()));
                }
                Value::object(pairs)
            }
            Self::Err { id, error } => Value::object(vec![
                ("type", Value::text("response")),
                ("id", Value::text(id)),
                ("ok", Value::Bool(false)),
                ("error", error_value(error)),
            ]),
            Self::ServiceUpdate {
                subscription_id,
                update,
            } => Value::object(vec![
                ("type", Value::text("service_update")),
                ("subscriptionId", Value::text(subscription_id)),
                ("update", update.clone()),
            ]),
            Self::Attachment(route) => {
                let route = match route {
                    None | Some(Target::Server { .. }) => Value::Null,
                    Some(Target::Session {
                        server_id,
                        session_id,
                        attachment_id,
                    }) => Value::object(vec![
                        ("serverId", Value::text(server_id)),
                        ("sessionId", Value::text(session_id)),
                        ("attachmentId", Value::text(attachment_id)),
                    ]),
                };
                Value::object(vec![
                    ("type", Value::text("attachment")),
                    ("attachment", route),
                ])
            }
        }
    }
}

/// `{type:"hello_error", error:{code, message}}` (v8 has no `details`).
pub fn hello_error(error: &CallError) -> Value {
    Value::object(vec![
        ("type", Value::text("hello_error")),
        ("error", error_value(error)),
    ])
}

/// `{type:"response", id, ok:true, result}` whose result is a singleton's
/// subscription snapshot of `members`, written without copying their
/// states ([`crate::chord::write_singleton_snapshot`]).
pub fn encode_snapshot_response(
    id: &str,
    service_id: &str,
    members: &[crate::chord::Member<'_>],
    limits: &CborLimits,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(64);
    let mut e = cbor::Encoder::new(&mut out, limits);
    (|| {
        e.map_header(4)?;
        e.text("type")?;
        e.text("response")?;
        e.text("id")?;
        e.text(id)?;
        e.text("ok")?;
        e.boolean(true);
        e.text("result")?;
        crate::chord::write_singleton_snapshot(&mut e, service_id, members, 1)?;
        e.finish()
    })()
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// The payload of a `response`, written straight from its parts: the bytes
/// of [`ServerMessage::Ok`] or [`ServerMessage::Err`] encoded, without
/// building (and copying the result into) their tree.
pub fn encode_response(
    id: &str,
    result: Result<Option<&Value>, &CallError>,
    limits: &CborLimits,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(64);
    let mut e = cbor::Encoder::new(&mut out, limits);
    (|| {
        e.map_header(if matches!(result, Ok(None)) { 3 } else { 4 })?;
        e.text("type")?;
        e.text("response")?;
        e.text("id")?;
        e.text(id)?;
        e.text("ok")?;
        e.boolean(result.is_ok());
        match result {
            Ok(Some(value)) => {
                e.text("result")?;
                e.nested_item(value, 1)?;
            }
            Ok(None) => {}
            Err(error) => {
                e.text("error")?;
                e.map_header(2)?;
                e.text("code")?;
                e.text(&error.code)?;
                e.text("message")?;
                e.text(&error.message)?;
            }
        }
        e.finish()
    })()
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// The payload of a server message, within `limits`.
pub fn encode(message: &Value, limits: &CborLimits) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    cbor::encode_with_limits(message, &mut out, limits).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// A subscription's answer written from the state in place has the
    /// bytes of the same answer built as a tree.
    #[test]
    fn a_snapshot_answer_is_the_tree_s_bytes() {
        use crate::chord::{Member, State, singleton_snapshot};
        let state = State::new(Value::object(vec![
            (
                "entries",
                Value::Array(vec![Value::text("a"), Value::Int(7)]),
            ),
            (
                "docs",
                Value::object(vec![("pi.live", Value::object(vec![]))]),
            ),
        ]));
        let members = [
            Member::Method("select"),
            Member::State("state", &state),
            Member::Method("refresh"),
        ];
        let limits = CborLimits::default();
        let tree = singleton_snapshot("pi.models", &members);
        let built = encode_response("r1", Ok(Some(&tree)), &limits).unwrap();
        let written = encode_snapshot_response("r1", "pi.models", &members, &limits).unwrap();
        assert_eq!(written, built);
    }

    use super::*;
    use crate::wire::frame::encode_frame;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn framed(message: &ServerMessage) -> String {
        let payload = encode(&message.to_value(), &CborLimits::default()).unwrap();
        hex(&encode_frame(&payload, u32::MAX).unwrap())
    }

    /// Byte vectors the published `pi-protocol` 0.85.1 encoder produced
    /// (pi-v8.md §6.3).
    #[test]
    fn server_messages_match_the_published_encoder() {
        assert_eq!(
            framed(&ServerMessage::Attachment(None)),
            "0000001da264747970656a6174746163686d656e746a6174746163686d656e74f6"
        );
        let ops = Value::Array(vec![
            Value::Array(vec![
                Value::text("#"),
                Value::Int(0),
                Value::Array(vec![Value::text("entries")]),
            ]),
            Value::Array(vec![
                Value::text("p"),
                Value::Int(0),
                Value::Int(1),
                Value::Int(0),
                Value::Array(vec![Value::object(vec![("id", Value::Int(3))])]),
            ]),
        ]);
        assert_eq!(
            framed(&ServerMessage::ServiceUpdate {
                subscription_id: "service-5".into(),
                update: crate::chord::state_update("state", 2, ops),
            }),
            "00000076a364747970656e736572766963655f7570646174656e737562736372697074696f6e496469736572766963652d3566757064617465a46474797065657374617465666d656d6265726573746174656873657175656e636502636f707382836123008167656e747269657385617000010081a162696403"
        );
        let catalogue = crate::chord::catalogue(&[(
            "pi.session-directory",
            crate::chord::call::Mode::Singleton,
        )]);
        assert_eq!(
            framed(&ServerMessage::Ok {
                id: "request-1".into(),
                result: Some(catalogue),
            }),
            "00000057a4647479706568726573706f6e736562696469726571756573742d31626f6bf566726573756c7481a2697365727669636549647470692e73657373696f6e2d6469726563746f7279646d6f64656973696e676c65746f6e"
        );
    }

    #[test]
    fn a_response_written_directly_is_the_trees_bytes() {
        let limits = CborLimits::default();
        let result = Value::object(vec![("accepted", Value::Bool(true)), ("n", Value::Int(3))]);
        let error = CallError {
            code: "session_not_found".into(),
            message: "Session not found: x".into(),
        };
        let cases: [(Result<Option<&Value>, &CallError>, ServerMessage); 3] = [
            (
                Ok(Some(&result)),
                ServerMessage::Ok {
                    id: "r1".into(),
                    result: Some(result.clone()),
                },
            ),
            (
                Ok(None),
                ServerMessage::Ok {
                    id: "r1".into(),
                    result: None,
                },
            ),
            (
                Err(&error),
                ServerMessage::Err {
                    id: "r1".into(),
                    error: error.clone(),
                },
            ),
        ];
        for (parts, message) in cases {
            assert_eq!(
                encode_response("r1", parts, &limits).unwrap(),
                encode(&message.to_value(), &limits).unwrap()
            );
        }
    }

    #[test]
    fn requests_decode_strictly() {
        let server = "00000000-0000-4000-8000-000000000001";
        let request = |pairs: Vec<(&str, Value)>| {
            encode(&Value::object(pairs), &CborLimits::default()).unwrap()
        };
        let target = Value::object(vec![("serverId", Value::text(server))]);
        let ok = request(vec![
            ("type", Value::text("request")),
            ("id", Value::text("r1")),
            ("target", target.clone()),
            ("call", Value::Null),
        ]);
        assert!(matches!(
            decode_client_message(&ok, &CborLimits::default()),
            Ok(ClientMessage::Request { .. })
        ));
        let bad = [
            request(vec![
                ("type", Value::text("request")),
                ("id", Value::text("")),
                ("target", target.clone()),
                ("call", Value::Null),
            ]),
            request(vec![
                ("type", Value::text("request")),
                ("id", Value::text("r1")),
                (
                    "target",
                    Value::object(vec![("serverId", Value::text("not-a-uuid"))]),
                ),
                ("call", Value::Null),
            ]),
            request(vec![
                ("type", Value::text("request")),
                ("id", Value::text("r1")),
                ("target", target.clone()),
            ]),
            request(vec![
                ("type", Value::text("cancel")),
                ("id", Value::text("r1")),
                ("target", target.clone()),
                ("extra", Value::Null),
            ]),
            request(vec![("type", Value::text("list"))]),
        ];
        for payload in bad {
            assert!(decode_client_message(&payload, &CborLimits::default()).is_err());
        }
        assert!(is_server_id(server));
        assert!(!is_server_id("00000000-0000-4000-c000-000000000001"));
        assert!(!is_server_id("00000000-0000-4000-8000-00000000000A"));
    }
}
