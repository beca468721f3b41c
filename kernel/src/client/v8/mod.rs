//! The client side of pi protocol v8, sans-IO: what a server sends, parsed
//! strictly ([`Incoming`]), and the replicas of the states a client
//! subscribes to ([`replica::Replica`]), kept by applying the server's ops
//! as the published chord client does.
//!
//! The simulator's v8 clients and its checkers read the server with these,
//! so what they judge is what a client of ours would see.

pub mod approvals;
pub mod calls;
pub mod connection;
pub mod conversation;
pub mod replica;

use crate::chord::call::CallError;
use crate::protocol::v8::PROTOCOL_VERSION_V8;
use crate::wire::{CborLimits, Value, cbor};

/// The op verbs chord 0.85.1 accepts (`#` defines a path id).
pub const VERBS: [&str; 7] = ["r", "s", "d", "a", "t", "p", "#"];
/// The update types chord 0.85.1 accepts.
pub const UPDATE_TYPES: [&str; 5] = ["state", "unavailable", "replaced", "spawned", "closed"];

/// A connection's route: the session it is attached to, under which id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// The session.
    pub session_id: String,
    /// The attachment's id (a fresh one each attach).
    pub attachment_id: String,
}

/// One message a v8 server sent, parsed strictly (exact key sets).
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// `{type:"hello", version:8, serverId}`.
    Hello {
        /// The server's id.
        server_id: String,
    },
    /// `{type:"hello_error", error}` (then the server closes).
    HelloError(CallError),
    /// `{type:"response", id, ok, result?|error}`.
    Response {
        /// The request answered.
        id: String,
        /// `Ok(None)` is a void result (no `result` key).
        outcome: Result<Option<Value>, CallError>,
    },
    /// `{type:"service_update", subscriptionId, update}`.
    Update {
        /// The client's subscription.
        subscription_id: String,
        /// The chord provider update.
        update: Value,
    },
    /// `{type:"attachment", attachment}`: the route now (`None`: detached).
    Attachment(Option<Route>),
    /// Anything else: why it is not a v8 server message.
    Malformed(String),
}

/// A map's keys, sorted (what the strict parsers compare with).
pub fn keys(value: &Value) -> Vec<&str> {
    match value {
        Value::Map(entries) => {
            let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            keys
        }
        _ => Vec::new(),
    }
}

fn text(value: &Value, key: &str) -> Option<String> {
    match value.get(key) {
        Some(Value::Text(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn call_error(value: Option<&Value>) -> Option<CallError> {
    let error = value?;
    let extra = keys(error)
        .into_iter()
        .any(|k| !matches!(k, "code" | "message" | "details"));
    if extra {
        return None;
    }
    let message = match error.get("message") {
        Some(Value::Text(s)) => s.clone(),
        _ => return None,
    };
    Some(CallError::new(&text(error, "code")?, message))
}

impl Incoming {
    /// Parses one payload (a frame without its length header).
    pub fn decode(payload: &[u8]) -> Self {
        match cbor::decode(payload, &CborLimits::default()) {
            Ok(value) => Self::from_value(value),
            Err(e) => Self::Malformed(format!("not CBOR: {e}")),
        }
    }

    /// [`Incoming::parse`] of a value it may take apart: a response's
    /// result and an update are moved into the message, not copied (a
    /// subscription's snapshot may hold a whole transcript).
    pub fn from_value(mut value: Value) -> Self {
        let payload = ["result", "update"].into_iter().find_map(|key| {
            let slot = value.get_mut(key)?;
            Some(std::mem::replace(slot, Value::Null))
        });
        let mut message = Self::parse(&value);
        if let Some(payload) = payload {
            match &mut message {
                Self::Response {
                    outcome: Ok(Some(result)),
                    ..
                } => *result = payload,
                Self::Update { update, .. } => *update = payload,
                _ => {}
            }
        }
        message
    }

    /// Parses one message value, with exact key sets.
    pub fn parse(value: &Value) -> Self {
        let malformed = || Self::Malformed(format!("{value:?}"));
        let Some(Value::Text(kind)) = value.get("type") else {
            return malformed();
        };
        let keys = keys(value);
        match (kind.as_str(), keys.as_slice()) {
            ("hello", ["serverId", "type", "version"]) => {
                match (value.get("version"), text(value, "serverId")) {
                    (Some(Value::Int(v)), Some(server_id)) if *v as u64 == PROTOCOL_VERSION_V8 => {
                        Self::Hello { server_id }
                    }
                    _ => malformed(),
                }
            }
            ("hello_error", ["error", "type"]) => match call_error(value.get("error")) {
                Some(error) => Self::HelloError(error),
                None => malformed(),
            },
            ("response", ["id", "ok", "type"] | ["id", "ok", "result", "type"]) => {
                match (text(value, "id"), value.get("ok")) {
                    (Some(id), Some(Value::Bool(true))) => Self::Response {
                        id,
                        outcome: Ok(value.get("result").cloned()),
                    },
                    _ => malformed(),
                }
            }
            ("response", ["error", "id", "ok", "type"]) => {
                match (
                    text(value, "id"),
                    value.get("ok"),
                    call_error(value.get("error")),
                ) {
                    (Some(id), Some(Value::Bool(false)), Some(error)) => Self::Response {
                        id,
                        outcome: Err(error),
                    },
                    _ => malformed(),
                }
            }
            ("service_update", ["subscriptionId", "type", "update"]) => {
                match text(value, "subscriptionId") {
                    Some(subscription_id) => Self::Update {
                        subscription_id,
                        update: value.get("update").expect("keyed").clone(),
                    },
                    None => malformed(),
                }
            }
            ("attachment", ["attachment", "type"]) => match value.get("attachment") {
                Some(Value::Null) => Self::Attachment(None),
                Some(route @ Value::Map(_))
                    if self::keys(route) == ["attachmentId", "serverId", "sessionId"] =>
                {
                    match (text(route, "sessionId"), text(route, "attachmentId")) {
                        (Some(session_id), Some(attachment_id)) => Self::Attachment(Some(Route {
                            session_id,
                            attachment_id,
                        })),
                        _ => malformed(),
                    }
                }
                _ => malformed(),
            },
            _ => malformed(),
        }
    }
}
