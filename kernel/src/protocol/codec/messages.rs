//! Schemas of the envelopes: client and server messages, commands, results,
//! events and errors.

use super::fields::{
    Fields, MapBuilder, discriminator, read_bool, read_enum, read_id, read_json, read_object,
    read_string, read_uint, unknown_variant,
};
use super::items::{read_protocol_version, read_thinking_level};
use super::{Path, Schema, SchemaError};
use crate::protocol::types::*;
use crate::wire::Value;

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

/// `{type:"hello", version, token?}`; `token` is our extension.
impl Schema for ClientHello {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(3)
            .put("type", text("hello"))
            .put("version", super::uint_value(self.version))
            .put_opt("token", self.token.as_deref().map(text))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["type", "version", "token"])?;
        f.literal("type", "hello")?;
        Ok(Self {
            version: f.required("version", read_uint)?,
            token: f.optional("token", read_string)?,
        })
    }
}

/// `{type:"request", id, request}`.
impl Schema for Request {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(3)
            .put("type", text("request"))
            .put("id", text(&self.id))
            .put("request", self.command.to_value())
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["type", "id", "request"])?;
        f.literal("type", "request")?;
        Ok(Self {
            id: f.required("id", read_id)?,
            command: f.required("request", Command::from_value_at)?,
        })
    }
}

/// A command map with `command` first and then `sessionId` (when it has one).
fn command_map(name: &str, session_id: Option<&str>, capacity: usize) -> MapBuilder {
    MapBuilder::with_capacity(capacity)
        .put("command", text(name))
        .put_opt("sessionId", session_id.map(text))
}

impl Schema for Command {
    fn to_value(&self) -> Value {
        let name = self.name();
        let session_id = self.session_id();
        match self {
            Self::List | Self::Status => command_map(name, None, 1).build(),
            Self::Create(params) => command_map(name, None, 5)
                .put_opt("cwd", params.cwd.as_deref().map(text))
                .put_opt("name", params.name.as_deref().map(text))
                .put_opt("model", params.model.as_ref().map(Schema::to_value))
                .put_opt(
                    "thinkingLevel",
                    params.thinking_level.map(|level| text(level.as_str())),
                )
                .build(),
            Self::Attach { .. }
            | Self::Detach { .. }
            | Self::Abort { .. }
            | Self::Remove { .. } => command_map(name, session_id, 2).build(),
            Self::Compact { instructions, .. } => command_map(name, session_id, 3)
                .put_opt("instructions", instructions.as_deref().map(text))
                .build(),
            Self::Prompt { text: t, .. } | Self::Steer { text: t, .. } => {
                command_map(name, session_id, 3)
                    .put("text", text(t))
                    .build()
            }
            Self::SetModel { model, .. } => command_map(name, session_id, 3)
                .put("model", model.to_value())
                .build(),
            Self::SetThinking { thinking_level, .. } => command_map(name, session_id, 3)
                .put("thinkingLevel", text(thinking_level.as_str()))
                .build(),
            Self::Rename { name: n, .. } => command_map(name, session_id, 3)
                .put("name", text(n))
                .build(),
            Self::SetMcpServers { servers, .. } => command_map(name, session_id, 3)
                .put("mcpServers", servers.clone())
                .build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let name = discriminator(value, path, "command")?;
        let session = |f: &Fields<'_, '_>| f.required("sessionId", read_id);
        match name {
            "list" | "status" => {
                Fields::new(value, path, &["command"])?;
                Ok(if name == "list" {
                    Self::List
                } else {
                    Self::Status
                })
            }
            "create" => {
                let f = Fields::new(
                    value,
                    path,
                    &["command", "cwd", "name", "model", "thinkingLevel"],
                )?;
                Ok(Self::Create(CreateParams {
                    cwd: f.optional("cwd", read_id)?,
                    name: f.optional("name", read_string)?,
                    model: f.optional("model", ModelRef::from_value_at)?,
                    thinking_level: f.optional("thinkingLevel", read_thinking_level)?,
                }))
            }
            "attach" | "detach" | "abort" | "remove" => {
                let f = Fields::new(value, path, &["command", "sessionId"])?;
                let session_id = session(&f)?;
                Ok(match name {
                    "attach" => Self::Attach { session_id },
                    "detach" => Self::Detach { session_id },
                    "abort" => Self::Abort { session_id },
                    _ => Self::Remove { session_id },
                })
            }
            "compact" => {
                let f = Fields::new(value, path, &["command", "sessionId", "instructions"])?;
                Ok(Self::Compact {
                    session_id: session(&f)?,
                    instructions: f.optional("instructions", read_string)?,
                })
            }
            "prompt" | "steer" => {
                let f = Fields::new(value, path, &["command", "sessionId", "text"])?;
                let session_id = session(&f)?;
                let text = f.required("text", read_string)?;
                Ok(if name == "prompt" {
                    Self::Prompt { session_id, text }
                } else {
                    Self::Steer { session_id, text }
                })
            }
            "set_model" => {
                let f = Fields::new(value, path, &["command", "sessionId", "model"])?;
                Ok(Self::SetModel {
                    session_id: session(&f)?,
                    model: f.required("model", ModelRef::from_value_at)?,
                })
            }
            "set_thinking" => {
                let f = Fields::new(value, path, &["command", "sessionId", "thinkingLevel"])?;
                Ok(Self::SetThinking {
                    session_id: session(&f)?,
                    thinking_level: f.required("thinkingLevel", read_thinking_level)?,
                })
            }
            "rename" => {
                let f = Fields::new(value, path, &["command", "sessionId", "name"])?;
                Ok(Self::Rename {
                    session_id: session(&f)?,
                    name: f.required("name", read_string)?,
                })
            }
            "set_mcp_servers" => {
                let f = Fields::new(value, path, &["command", "sessionId", "mcpServers"])?;
                Ok(Self::SetMcpServers {
                    session_id: session(&f)?,
                    servers: f.required("mcpServers", read_object)?,
                })
            }
            other => Err(unknown_variant(path, "command", other)),
        }
    }
}

impl Schema for ClientMessage {
    fn to_value(&self) -> Value {
        match self {
            Self::Hello(hello) => hello.to_value(),
            Self::Request(request) => request.to_value(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        match discriminator(value, path, "type")? {
            "hello" => ClientHello::from_value_at(value, &path.key("hello")).map(Self::Hello),
            "request" => Request::from_value_at(value, &path.key("request")).map(Self::Request),
            other => Err(unknown_variant(path, "type", other)),
        }
    }
}

/// `{code, message, details?}`; `auth` is accepted as a code (our extension).
impl Schema for ProtocolError {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(3)
            .put("code", text(self.code.as_str()))
            .put("message", text(&self.message))
            .put_opt("details", self.details.clone())
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(value, path, &["code", "message", "details"])?;
        Ok(Self {
            code: f.required("code", |v, p| {
                read_enum(v, p, &ErrorCode::ALL, ErrorCode::as_str)
            })?,
            message: f.required("message", read_string)?,
            details: f.optional("details", read_json)?,
        })
    }
}

impl Schema for CommandResult {
    fn to_value(&self) -> Value {
        let map = MapBuilder::with_capacity(2).put("command", text(self.name()));
        match self {
            Self::List { sessions } => map
                .put(
                    "sessions",
                    Value::Array(sessions.iter().map(Schema::to_value).collect()),
                )
                .build(),
            Self::Detach { session_id } | Self::Remove { session_id } => {
                map.put("sessionId", text(session_id)).build()
            }
            Self::Status { sessions } => map
                .put(
                    "sessions",
                    Value::Array(sessions.iter().map(Schema::to_value).collect()),
                )
                .build(),
            Self::Create { session }
            | Self::Attach { session }
            | Self::Prompt { session }
            | Self::Steer { session }
            | Self::Abort { session }
            | Self::SetModel { session }
            | Self::SetThinking { session }
            | Self::Rename { session }
            | Self::SetMcpServers { session }
            | Self::Compact { session } => map.put("session", session.to_value()).build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let name = discriminator(value, path, "command")?;
        match name {
            "list" => {
                let f = Fields::new(value, path, &["command", "sessions"])?;
                let sessions = f.required("sessions", |v, p| {
                    super::read_list(v, p, SessionMetadata::from_value_at)
                })?;
                Ok(Self::List { sessions })
            }
            "status" => {
                let f = Fields::new(value, path, &["command", "sessions"])?;
                let sessions = f.required("sessions", |v, p| {
                    super::read_list(v, p, LiveStatus::from_value_at)
                })?;
                Ok(Self::Status { sessions })
            }
            "detach" | "remove" => {
                let f = Fields::new(value, path, &["command", "sessionId"])?;
                let session_id = f.required("sessionId", read_id)?;
                Ok(if name == "detach" {
                    Self::Detach { session_id }
                } else {
                    Self::Remove { session_id }
                })
            }
            "create" | "attach" | "prompt" | "steer" | "abort" | "set_model" | "set_thinking"
            | "rename" | "set_mcp_servers" | "compact" => {
                let f = Fields::new(value, path, &["command", "session"])?;
                let session = f.required("session", SessionSnapshot::from_value_at)?;
                Ok(Self::with_session(name, session).expect("a command with a session"))
            }
            other => Err(unknown_variant(path, "command", other)),
        }
    }
}

/// `{sessionId, state, clients, model?, thinkingLevel?}`: one entry of our
/// `status` extension.
impl Schema for LiveStatus {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(6)
            .put("sessionId", text(&self.session_id))
            .put("state", text(self.state.as_str()))
            .put("clients", super::uint_value(self.clients))
            .put_opt("model", self.model.as_ref().map(Schema::to_value))
            .put_opt(
                "thinkingLevel",
                self.thinking_level.map(|l| text(l.as_str())),
            )
            .put_opt("preview", self.preview.as_deref().map(text))
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &[
                "sessionId",
                "state",
                "clients",
                "model",
                "thinkingLevel",
                "preview",
            ],
        )?;
        Ok(Self {
            session_id: f.required("sessionId", read_id)?,
            state: f.required("state", |v, p| {
                read_enum(v, p, &LiveState::ALL, LiveState::as_str)
            })?,
            clients: f.required("clients", read_uint)?,
            model: f.optional("model", ModelRef::from_value_at)?,
            thinking_level: f.optional("thinkingLevel", read_thinking_level)?,
            preview: f.optional("preview", read_string)?,
        })
    }
}

/// An event payload (the `event` of an event envelope).
impl Schema for ServerEvent {
    fn to_value(&self) -> Value {
        match self {
            Self::ServerSnapshot { snapshot } => MapBuilder::with_capacity(2)
                .put("type", text("server_snapshot"))
                .put("snapshot", snapshot.to_value())
                .build(),
            Self::SessionSnapshot { snapshot } => MapBuilder::with_capacity(2)
                .put("type", text("session_snapshot"))
                .put("snapshot", snapshot.to_value())
                .build(),
            Self::SessionProgress {
                session_id,
                progress,
            } => MapBuilder::with_capacity(3)
                .put("type", text("session_progress"))
                .put("sessionId", text(session_id))
                .put("progress", progress.to_value())
                .build(),
            Self::SessionRemoved { session_id } => MapBuilder::with_capacity(2)
                .put("type", text("session_removed"))
                .put("sessionId", text(session_id))
                .build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        match discriminator(value, path, "type")? {
            "server_snapshot" => {
                let f = Fields::new(value, path, &["type", "snapshot"])?;
                Ok(Self::ServerSnapshot {
                    snapshot: f.required("snapshot", ServerSnapshot::from_value_at)?,
                })
            }
            "session_snapshot" => {
                let f = Fields::new(value, path, &["type", "snapshot"])?;
                Ok(Self::SessionSnapshot {
                    snapshot: f.required("snapshot", SessionSnapshot::from_value_at)?,
                })
            }
            "session_progress" => {
                let f = Fields::new(value, path, &["type", "sessionId", "progress"])?;
                Ok(Self::SessionProgress {
                    session_id: f.required("sessionId", read_id)?,
                    progress: f.required("progress", TranscriptProgress::from_value_at)?,
                })
            }
            "session_removed" => {
                let f = Fields::new(value, path, &["type", "sessionId"])?;
                Ok(Self::SessionRemoved {
                    session_id: f.required("sessionId", read_id)?,
                })
            }
            other => Err(unknown_variant(path, "event type", other)),
        }
    }
}

/// `{type:"hello", version:1, connectionId, snapshot}`.
impl Schema for ServerHello {
    fn to_value(&self) -> Value {
        MapBuilder::with_capacity(4)
            .put("type", text("hello"))
            .put("version", super::uint_value(self.version))
            .put("connectionId", text(&self.connection_id))
            .put("snapshot", self.snapshot.to_value())
            .build()
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let f = Fields::new(
            value,
            path,
            &["type", "version", "connectionId", "snapshot"],
        )?;
        f.literal("type", "hello")?;
        Ok(Self {
            version: f.required("version", read_protocol_version)?,
            connection_id: f.required("connectionId", read_id)?,
            snapshot: f.required("snapshot", ServerSnapshot::from_value_at)?,
        })
    }
}

/// `{type:"response", id, ok:true, result}` or `{type:"response", id, ok:false, error}`.
impl Schema for Response {
    fn to_value(&self) -> Value {
        let map = MapBuilder::with_capacity(4)
            .put("type", text("response"))
            .put("id", text(&self.id));
        match &self.outcome {
            Ok(result) => map
                .put("ok", Value::Bool(true))
                .put("result", result.to_value())
                .build(),
            Err(error) => map
                .put("ok", Value::Bool(false))
                .put("error", error.to_value())
                .build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        let ok = match value.get("ok") {
            Some(ok) => read_bool(ok, &path.key("ok"))?,
            None => {
                // Reports a non-map or the missing key with the usual wording.
                Fields::new(value, path, &["type", "id", "ok", "result", "error"])?
                    .required("ok", read_bool)?
            }
        };
        let allowed: &[&str] = if ok {
            &["type", "id", "ok", "result"]
        } else {
            &["type", "id", "ok", "error"]
        };
        let f = Fields::new(value, path, allowed)?;
        f.literal("type", "response")?;
        let id = f.required("id", read_id)?;
        let outcome = if ok {
            Ok(f.required("result", CommandResult::from_value_at)?)
        } else {
            Err(f.required("error", ProtocolError::from_value_at)?)
        };
        Ok(Self { id, outcome })
    }
}

impl Schema for ServerMessage {
    fn to_value(&self) -> Value {
        match self {
            Self::Hello(hello) => hello.to_value(),
            Self::HelloError(error) => MapBuilder::with_capacity(2)
                .put("type", text("hello_error"))
                .put("error", error.to_value())
                .build(),
            Self::Response(response) => response.to_value(),
            Self::Event(event) => MapBuilder::with_capacity(2)
                .put("type", text("event"))
                .put("event", event.to_value())
                .build(),
        }
    }

    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError> {
        match discriminator(value, path, "type")? {
            "hello" => ServerHello::from_value_at(value, &path.key("hello")).map(Self::Hello),
            "hello_error" => {
                let path = path.key("hello_error");
                let f = Fields::new(value, &path, &["type", "error"])?;
                Ok(Self::HelloError(
                    f.required("error", ProtocolError::from_value_at)?,
                ))
            }
            "response" => Response::from_value_at(value, &path.key("response")).map(Self::Response),
            "event" => {
                let path = path.key("event");
                let f = Fields::new(value, &path, &["type", "event"])?;
                Ok(Self::Event(
                    f.required("event", ServerEvent::from_value_at)?,
                ))
            }
            other => Err(unknown_variant(path, "type", other)),
        }
    }
}
