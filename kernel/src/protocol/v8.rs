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
pub fn decode_client_message(payload: &[u8], limits: &CborLimits) -> Result<ClientMessage, String> {
    let value = cbor::decode(payload, limits).map_err(|e| e.to_string())?;
    let Value::Map(entries) = &value else {
        return Err("a message must be an object".into());
    };
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    let id = || match value.get("id") {
        Some(Value::Text(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err("id must be a non-empty string".to_string()),
    };
    let target = || Target::parse(value.get("target").ok_or("target is missing")?);
    let exactly = |expected: &[&str]| {
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        let mut want = expected.to_vec();
        want.sort_unstable();
        if sorted == want {
            Ok(())
        } else {
            Err(format!("unexpected keys {keys:?}"))
        }
    };
    match value.get("type") {
        Some(Value::Text(t)) if t == "hello" => Ok(ClientMessage::Hello),
        Some(Value::Text(t)) if t == "request" => {
            exactly(&["type", "id", "target", "call"])?;
            let call = value.get("call").expect("checked").clone();
            if !call.is_json() {
                return Err("call must be JSON".into());
            }
            Ok(ClientMessage::Request {
                id: id()?,
                target: target()?,
                call,
            })
        }
        Some(Value::Text(t)) if t == "cancel" => {
            exactly(&["type", "id", "target"])?;
            Ok(ClientMessage::Cancel {
                id: id()?,
                target: target()?,
            })
        }
        _ => Err("unknown message type".into()),
    }
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

/// The payload of a server message, within `limits`.
pub fn encode(message: &Value, limits: &CborLimits) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    cbor::encode_with_limits(message, &mut out, limits).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
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
