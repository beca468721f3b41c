//! The v8 vocabulary the simulator's clients, traces and checkers share:
//! the services' ids, a route, the server's messages parsed strictly, what
//! a client asked. The clients themselves are [`crate::world::v8`].

use kernel::chord::call::{CallError, ServiceCall};
use kernel::protocol::v8::{PROTOCOL_VERSION_V8, Target};
use kernel::wire::{CborLimits, Value, cbor};

/// The control service's id.
pub const CONTROL: &str = "$chord.service";
/// Server-scope services.
pub const DIRECTORY: &str = "pi.session-directory";
/// `create`, `attach`, `detach`, `remove`.
pub const MANAGEMENT: &str = "pi.session-management";
/// `prepareSession`, `reload`.
pub const PRESENTATION: &str = "pi.presentation-plugins";
/// `prompt`, `steer`, `abort`, `waitForPrompt`, …
pub const AGENT: &str = "pi.agent-controller";
/// `select`, `selectThinking`, and the models state.
pub const MODELS: &str = "pi.models";
/// The conversation as replicated state.
pub const TRANSCRIPT: &str = "pi.transcript";

/// A session id that never exists (traced as `unknown`).
pub const UNKNOWN_SESSION: &str = "00000000-0000-4000-8000-00000000dead";

/// The attachment id a client addresses its session calls with when it
/// knows no route (they are fenced: `session_not_attached`).
pub const UNKNOWN_ATTACHMENT: &str = "00000000-0000-4000-8000-0000000000aa";

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

/// One message the server sent on a v8 connection, parsed strictly.
#[derive(Debug, Clone, PartialEq)]
pub enum V8Message {
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

pub(crate) fn keys(value: &Value) -> Vec<&str> {
    match value {
        Value::Map(entries) => {
            let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            keys
        }
        _ => Vec::new(),
    }
}

pub(crate) fn text(value: &Value, key: &str) -> Option<String> {
    match value.get(key) {
        Some(Value::Text(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

pub(crate) fn call_error(value: Option<&Value>) -> Option<CallError> {
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

impl V8Message {
    /// Parses one payload (a frame without its length header).
    pub fn decode(payload: &[u8]) -> Self {
        match cbor::decode(payload, &CborLimits::default()) {
            Ok(value) => Self::parse(&value),
            Err(e) => Self::Malformed(format!("not CBOR: {e}")),
        }
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
                    if keys_of(route) == ["attachmentId", "serverId", "sessionId"] =>
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

pub(crate) fn keys_of(value: &Value) -> Vec<&str> {
    keys(value)
}

/// A request as the client remembers it until its answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Asked {
    /// `$chord.service.subscribe`: the subscription, its service, and the
    /// route it was made under (session scope).
    Subscribe {
        /// The subscription id.
        subscription_id: String,
        /// The service.
        service: String,
        /// The route of a session-scope subscription.
        route: Option<Route>,
    },
    /// `$chord.service.unsubscribe`.
    Unsubscribe(String),
    /// `pi.session-management.attach`.
    Attach(String),
    /// `pi.session-management.detach`.
    Detach,
    /// `pi.session-management.remove`.
    Remove(String),
    /// `pi.session-management.create`.
    Create,
    /// `pi.agent-controller.prompt`.
    Prompt,
    /// `pi.agent-controller.waitForPrompt`.
    Wait,
    /// Anything else.
    Other,
}

impl Asked {
    /// What `call` (to `target`) asks.
    pub fn of(target: &Target, call: &ServiceCall) -> Self {
        let arg = |i: usize| match call.args.get(i) {
            Some(Value::Text(s)) => s.clone(),
            _ => String::new(),
        };
        match (call.service_id.as_str(), call.member.as_str()) {
            (CONTROL, "subscribe") => Self::Subscribe {
                subscription_id: arg(0),
                service: arg(1),
                route: route_of(target),
            },
            (CONTROL, "unsubscribe") => Self::Unsubscribe(arg(0)),
            (MANAGEMENT, "attach") if matches!(target, Target::Server { .. }) => {
                Self::Attach(arg(0))
            }
            (MANAGEMENT, "detach") if matches!(target, Target::Server { .. }) => Self::Detach,
            (MANAGEMENT, "remove") if matches!(target, Target::Server { .. }) => {
                Self::Remove(arg(0))
            }
            (MANAGEMENT, "create") if matches!(target, Target::Server { .. }) => Self::Create,
            (AGENT, "prompt") => Self::Prompt,
            (AGENT, "waitForPrompt") => Self::Wait,
            _ => Self::Other,
        }
    }

    /// True for a request that may change the connection's route.
    pub fn routes(&self) -> bool {
        matches!(self, Self::Attach(_) | Self::Detach | Self::Remove(_))
    }

    /// True for `pi.session-management`'s calls, which pi's server runs
    /// one at a time, in order (pi-v8.md §3.2).
    pub fn serialised(&self) -> bool {
        self.routes() || *self == Self::Create
    }
}

/// The route a target names, if it is a session target.
pub fn route_of(target: &Target) -> Option<Route> {
    match target {
        Target::Server { .. } => None,
        Target::Session {
            session_id,
            attachment_id,
            ..
        } => Some(Route {
            session_id: session_id.clone(),
            attachment_id: attachment_id.clone(),
        }),
    }
}
