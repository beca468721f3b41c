//! Every message of pi protocol v1 as typed Rust values.
//!
//! The field order of each struct is the schema order of the reference
//! (`@earendil-works/pi-protocol@0.84.4`, `schemas.ts`); the encoder writes map
//! keys in this order and omits `None` optionals.

use crate::wire::Value;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// Strict JSON carried opaquely (tool input, tool details, error details).
/// Invariant: [`Value::is_json`] holds.
pub type JsonValue = Value;

/// Milliseconds since the Unix epoch (an integer ≥ 0).
pub type Timestamp = u64;

/// A frame a client sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// `{type:"hello", version, token?}`. Must be the first frame.
    Hello(ClientHello),
    /// `{type:"request", id, request}`.
    Request(Request),
}

/// The client's opening frame.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientHello {
    /// The protocol version the client speaks (an integer ≥ 0).
    pub version: u64,
    /// Our extension: a shared secret for servers configured with a token.
    /// The published client never sends it.
    pub token: Option<String>,
}

/// One request envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Client-chosen correlation id (non-empty).
    pub id: String,
    /// What the client asks for.
    pub command: Command,
}

/// The `request` payload, discriminated by its `command` key.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `{command:"list"}`
    List,
    /// `{command:"create", cwd?, name?, model?, thinkingLevel?}`
    Create(CreateParams),
    /// `{command:"attach", sessionId}`
    Attach { session_id: String },
    /// `{command:"detach", sessionId}`
    Detach { session_id: String },
    /// `{command:"prompt", sessionId, text}`
    Prompt { session_id: String, text: String },
    /// `{command:"steer", sessionId, text}`
    Steer { session_id: String, text: String },
    /// `{command:"abort", sessionId}`
    Abort { session_id: String },
    /// `{command:"set_model", sessionId, model}`
    SetModel { session_id: String, model: ModelRef },
    /// `{command:"set_thinking", sessionId, thinkingLevel}`
    SetThinking {
        session_id: String,
        thinking_level: ThinkingLevel,
    },
    /// `{command:"remove", sessionId}`: our extension (not in the v1 schema).
    /// Deletes a stored session; attached connections get `session_removed`.
    Remove { session_id: String },
    /// `{command:"rename", sessionId, name}`: our extension. Names an
    /// attached session; a name is unique among the server's sessions.
    Rename { session_id: String, name: String },
    /// `{command:"set_mcp_servers", sessionId, mcpServers}`: our extension.
    /// Remembers with an attached session the MCP servers its editor
    /// configured (`settings.json`'s shape: an object of named servers),
    /// in place of those it remembered.
    SetMcpServers {
        session_id: String,
        servers: JsonValue,
    },
    /// `{command:"compact", sessionId}`: our extension. Summarises an idle
    /// attached session's older conversation now, as a full context would;
    /// answered when the summary is stored.
    Compact {
        session_id: String,
        instructions: Option<String>,
    },
    /// `{command:"status"}`: our extension. The runtime state of every live
    /// session (v1's `SessionMetadata` is durable metadata only), without
    /// attaching to any or starting a worker.
    Status,
}

impl Command {
    /// The wire name of the command (its `command` key).
    pub fn name(&self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Create(_) => "create",
            Self::Attach { .. } => "attach",
            Self::Detach { .. } => "detach",
            Self::Prompt { .. } => "prompt",
            Self::Steer { .. } => "steer",
            Self::Abort { .. } => "abort",
            Self::SetModel { .. } => "set_model",
            Self::SetThinking { .. } => "set_thinking",
            Self::Remove { .. } => "remove",
            Self::Rename { .. } => "rename",
            Self::SetMcpServers { .. } => "set_mcp_servers",
            Self::Compact { .. } => "compact",
            Self::Status => "status",
        }
    }

    /// The session a command addresses, if any.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Self::List | Self::Create(_) | Self::Status => None,
            Self::Attach { session_id }
            | Self::Detach { session_id }
            | Self::Prompt { session_id, .. }
            | Self::Steer { session_id, .. }
            | Self::Abort { session_id }
            | Self::SetModel { session_id, .. }
            | Self::SetThinking { session_id, .. }
            | Self::Rename { session_id, .. }
            | Self::SetMcpServers { session_id, .. }
            | Self::Compact { session_id, .. }
            | Self::Remove { session_id } => Some(session_id),
        }
    }
}

/// Options of `create`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreateParams {
    /// Working directory (non-empty when present).
    pub cwd: Option<String>,
    /// Display name.
    pub name: Option<String>,
    /// Model to start with.
    pub model: Option<ModelRef>,
    /// Thinking level to start with.
    pub thinking_level: Option<ThinkingLevel>,
}

/// A frame the server sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    /// `{type:"hello", version:1, connectionId, snapshot}`
    Hello(ServerHello),
    /// `{type:"hello_error", error}`: always the last frame before close.
    HelloError(ProtocolError),
    /// `{type:"response", id, ok, result | error}`
    Response(Response),
    /// `{type:"event", event}`
    Event(ServerEvent),
}

/// The server's answer to a valid hello.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerHello {
    /// Always [`PROTOCOL_VERSION`].
    pub version: u64,
    /// Server-assigned id of this connection.
    pub connection_id: String,
    /// The server state at the moment of the hello.
    pub snapshot: ServerSnapshot,
}

/// A response envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The request id it answers.
    pub id: String,
    /// `ok:true` with a result, or `ok:false` with an error.
    pub outcome: Result<CommandResult, ProtocolError>,
}

/// The success payload of a response, discriminated by `command`.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandResult {
    /// `{command:"list", sessions}`
    List { sessions: Vec<SessionMetadata> },
    /// `{command:"create", session}`
    Create { session: SessionSnapshot },
    /// `{command:"attach", session}`
    Attach { session: SessionSnapshot },
    /// `{command:"detach", sessionId}`
    Detach { session_id: String },
    /// `{command:"prompt", session}`
    Prompt { session: SessionSnapshot },
    /// `{command:"steer", session}`
    Steer { session: SessionSnapshot },
    /// `{command:"abort", session}`
    Abort { session: SessionSnapshot },
    /// `{command:"set_model", session}`
    SetModel { session: SessionSnapshot },
    /// `{command:"set_thinking", session}`
    SetThinking { session: SessionSnapshot },
    /// `{command:"remove", sessionId}`: our extension.
    Remove { session_id: String },
    /// `{command:"rename", session}`: our extension.
    Rename { session: SessionSnapshot },
    /// `{command:"set_mcp_servers", session}`: our extension.
    SetMcpServers { session: SessionSnapshot },
    /// `{command:"compact", session}`: our extension.
    Compact { session: SessionSnapshot },
    /// `{command:"status", sessions}`: our extension; one entry per live
    /// session, in id order. A stored session that is not live has none.
    Status { sessions: Vec<LiveStatus> },
}

/// What a session is doing and with which model (our `status`
/// extension): every session the server lists, live or stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveStatus {
    /// The session.
    pub session_id: String,
    /// Its state.
    pub state: LiveState,
    /// How many connections are attached to it.
    pub clients: u64,
    /// Its model, where the server knows it (not for pi's own sessions
    /// before they first run here).
    pub model: Option<ModelRef>,
    /// Its thinking level, with the model.
    pub thinking_level: Option<ThinkingLevel>,
    /// Its first prompt, cut (`kernel::server::preview`), once it has one
    /// and the server has read it from the session's `meta.json`.
    pub preview: Option<String>,
}

/// The state of a session, as `status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LiveState {
    /// `stored`: not live; no worker runs it.
    Stored,
    /// `opening`: its worker is starting.
    Opening,
    /// `idle`, `turn`, `compaction`, `branch_summary` or `retry`: the
    /// runtime's phase.
    Phase(SessionPhase),
    /// `error`: idle after a reply that ended in an error, or failed.
    Error,
    /// `closing`: being disposed; its worker is exiting.
    Closing,
}

impl LiveState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Opening => "opening",
            Self::Phase(phase) => phase.as_str(),
            Self::Error => "error",
            Self::Closing => "closing",
        }
    }

    /// Every state, in the order `status` documents them.
    pub const ALL: [Self; 9] = [
        Self::Stored,
        Self::Opening,
        Self::Phase(SessionPhase::Idle),
        Self::Phase(SessionPhase::Turn),
        Self::Phase(SessionPhase::Compaction),
        Self::Phase(SessionPhase::BranchSummary),
        Self::Phase(SessionPhase::Retry),
        Self::Error,
        Self::Closing,
    ];
}

impl CommandResult {
    /// The session snapshot the result carries, if any.
    pub fn session(&self) -> Option<&SessionSnapshot> {
        match self {
            Self::Create { session }
            | Self::Attach { session }
            | Self::Prompt { session }
            | Self::Steer { session }
            | Self::Abort { session }
            | Self::SetModel { session }
            | Self::SetThinking { session }
            | Self::Rename { session }
            | Self::SetMcpServers { session }
            | Self::Compact { session } => Some(session),
            Self::List { .. } | Self::Detach { .. } | Self::Remove { .. } | Self::Status { .. } => {
                None
            }
        }
    }

    /// [`CommandResult::session`], by value; the result's name when it
    /// carries none.
    pub fn into_session(self) -> Result<SessionSnapshot, &'static str> {
        match self {
            Self::Create { session }
            | Self::Attach { session }
            | Self::Prompt { session }
            | Self::Steer { session }
            | Self::Abort { session }
            | Self::SetModel { session }
            | Self::SetThinking { session }
            | Self::Rename { session }
            | Self::SetMcpServers { session }
            | Self::Compact { session } => Ok(session),
            other => Err(other.name()),
        }
    }

    /// The wire name of the command this result answers.
    pub fn name(&self) -> &'static str {
        match self {
            Self::List { .. } => "list",
            Self::Create { .. } => "create",
            Self::Attach { .. } => "attach",
            Self::Detach { .. } => "detach",
            Self::Prompt { .. } => "prompt",
            Self::Steer { .. } => "steer",
            Self::Abort { .. } => "abort",
            Self::SetModel { .. } => "set_model",
            Self::SetThinking { .. } => "set_thinking",
            Self::Remove { .. } => "remove",
            Self::Rename { .. } => "rename",
            Self::SetMcpServers { .. } => "set_mcp_servers",
            Self::Compact { .. } => "compact",
            Self::Status { .. } => "status",
        }
    }

    /// The result of `command` (its wire name) when it carries a session
    /// snapshot: `create`, `attach` and the control commands; `None` for the
    /// others.
    pub fn with_session(command: &str, session: SessionSnapshot) -> Option<Self> {
        Some(match command {
            "create" => Self::Create { session },
            "attach" => Self::Attach { session },
            "prompt" => Self::Prompt { session },
            "steer" => Self::Steer { session },
            "abort" => Self::Abort { session },
            "set_model" => Self::SetModel { session },
            "set_thinking" => Self::SetThinking { session },
            "rename" => Self::Rename { session },
            "set_mcp_servers" => Self::SetMcpServers { session },
            "compact" => Self::Compact { session },
            _ => return None,
        })
    }
}

/// An event envelope's payload, discriminated by `type`.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// `{type:"server_snapshot", snapshot}`
    ServerSnapshot { snapshot: ServerSnapshot },
    /// `{type:"session_snapshot", snapshot}`
    SessionSnapshot { snapshot: SessionSnapshot },
    /// `{type:"session_progress", sessionId, progress}`
    SessionProgress {
        session_id: String,
        progress: TranscriptProgress,
    },
    /// `{type:"session_removed", sessionId}`: emitted by our `remove` extension.
    SessionRemoved { session_id: String },
}

/// `{code, message, details?}`
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolError {
    /// Machine-readable class.
    pub code: ErrorCode,
    /// Human-readable text.
    pub message: String,
    /// Optional strict-JSON details.
    pub details: Option<JsonValue>,
}

impl ProtocolError {
    /// An error without details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
        }
    }
}

/// The closed set of v1 error codes, plus `auth` (our token extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorCode {
    /// Wrong or missing token (only when the server is configured with one).
    Auth,
    /// Unsupported protocol version.
    Version,
    /// A conflicting operation was rejected; nothing queues.
    Busy,
    /// The session is held elsewhere or its runtime is terminating.
    SessionLocked,
    /// The session does not exist or is not live.
    NotFound,
    /// Malformed or disallowed request.
    InvalidRequest,
    /// The operation exists in the schema but is not implemented.
    NotImplemented,
    /// Anything else; the cause is only logged locally.
    InternalError,
}

impl ErrorCode {
    /// All codes, in wire-name order of the schema.
    pub const ALL: [Self; 8] = [
        Self::Auth,
        Self::Version,
        Self::Busy,
        Self::SessionLocked,
        Self::NotFound,
        Self::InvalidRequest,
        Self::NotImplemented,
        Self::InternalError,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Version => "version",
            Self::Busy => "busy",
            Self::SessionLocked => "session_locked",
            Self::NotFound => "not_found",
            Self::InvalidRequest => "invalid_request",
            Self::NotImplemented => "not_implemented",
            Self::InternalError => "internal_error",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// `{serverId, protocolVersion:1, revision, sessions, models}`
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSnapshot {
    /// This server's id.
    pub server_id: String,
    /// Always [`PROTOCOL_VERSION`].
    pub protocol_version: u64,
    /// Increments only when a server snapshot broadcast actually goes out.
    pub revision: u64,
    /// Stored sessions merged with live ones.
    pub sessions: Vec<SessionMetadata>,
    /// Models the agent runtime offers.
    pub models: Vec<ModelMetadata>,
}

/// Durable metadata of one session (no runtime state).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionMetadata {
    /// Session id.
    pub id: String,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Option<Timestamp>,
    /// Session it was forked from.
    pub parent_session_id: Option<String>,
    /// Display name.
    pub session_name: Option<String>,
    /// Working directory (non-empty when present).
    pub cwd: Option<String>,
}

/// The authoritative state of one session as clients see it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSnapshot {
    /// Session id.
    pub id: String,
    /// Display name.
    pub name: Option<String>,
    /// Working directory (non-empty).
    pub cwd: String,
    /// Creation time.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
    /// What the agent is doing.
    pub phase: SessionPhase,
    /// Selected model.
    pub model: ModelRef,
    /// Selected thinking level.
    pub thinking_level: ThinkingLevel,
    /// In broadcasts: any connection attached; in responses: the requester attached.
    pub attached: bool,
    /// True while a live runtime holds the session.
    pub locked: bool,
    /// Increases with every change of the runtime state.
    pub revision: u64,
    /// Committed and streaming items, oldest first.
    pub transcript: Vec<TranscriptItem>,
    /// Steer messages not yet taken into the turn.
    pub queued_steer: Vec<UserItem>,
    /// Number of steer messages accepted and not yet consumed.
    pub queued_steer_count: u64,
}

/// `off | minimal | low | medium | high | xhigh | max`
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThinkingLevel {
    /// `off`
    Off,
    /// `minimal`
    Minimal,
    /// `low`
    Low,
    /// `medium`
    Medium,
    /// `high`
    High,
    /// `xhigh`
    Xhigh,
    /// `max`
    Max,
}

impl ThinkingLevel {
    /// All levels, lowest first.
    pub const ALL: [Self; 7] = [
        Self::Off,
        Self::Minimal,
        Self::Low,
        Self::Medium,
        Self::High,
        Self::Xhigh,
        Self::Max,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Xhigh => "xhigh",
            Self::Max => "max",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

/// `idle | turn | compaction | branch_summary | retry`
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SessionPhase {
    /// Nothing running; prompts are accepted.
    Idle,
    /// A prompt's turn is running.
    Turn,
    /// Older items are being summarised.
    Compaction,
    /// A branch summary is being produced.
    BranchSummary,
    /// Waiting to retry a transient model error.
    Retry,
}

impl SessionPhase {
    /// All phases.
    pub const ALL: [Self; 5] = [
        Self::Idle,
        Self::Turn,
        Self::Compaction,
        Self::BranchSummary,
        Self::Retry,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Turn => "turn",
            Self::Compaction => "compaction",
            Self::BranchSummary => "branch_summary",
            Self::Retry => "retry",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// `{provider, id}`
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelRef {
    /// Provider id (non-empty).
    pub provider: String,
    /// Model id (non-empty).
    pub id: String,
}

/// Everything a client needs to know about one model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMetadata {
    /// Provider id.
    pub provider: String,
    /// Model id.
    pub id: String,
    /// Display name (non-empty).
    pub name: String,
    /// Wire API the provider speaks.
    pub api: String,
    /// Whether the model reasons.
    pub reasoning: bool,
    /// Accepted input kinds.
    pub input: Vec<InputKind>,
    /// Context window in tokens (≥ 1).
    pub context_window: u64,
    /// Output limit in tokens (≥ 1).
    pub max_tokens: u64,
    /// Price per million tokens.
    pub cost: ModelCost,
    /// At least one level.
    pub supported_thinking_levels: Vec<ThinkingLevel>,
    /// Whether a key is present.
    pub authenticated: bool,
}

/// `text | image`
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InputKind {
    /// `text`
    Text,
    /// `image`
    Image,
}

/// `{input, output, cacheRead, cacheWrite}` (numbers ≥ 0).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ModelCost {
    /// Input price.
    pub input: f64,
    /// Output price.
    pub output: f64,
    /// Cache read price.
    pub cache_read: f64,
    /// Cache write price.
    pub cache_write: f64,
}

/// Token counts and cost of one assistant or tool item.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Usage {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cache read tokens.
    pub cache_read: u64,
    /// Cache write tokens.
    pub cache_write: u64,
    /// Reasoning tokens.
    pub reasoning: Option<u64>,
    /// Total tokens.
    pub total_tokens: u64,
    /// Cost of this usage.
    pub cost: UsageCost,
}

/// `{input, output, cacheRead, cacheWrite, total}` (numbers ≥ 0).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct UsageCost {
    /// Input cost.
    pub input: f64,
    /// Output cost.
    pub output: f64,
    /// Cache read cost.
    pub cache_read: f64,
    /// Cache write cost.
    pub cache_write: f64,
    /// Total cost.
    pub total: f64,
}

/// A content part of a transcript item, discriminated by `type`.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// `{type:"text", text}` (user, assistant, tool)
    Text { text: String },
    /// `{type:"thinking", thinking, redacted?}` (assistant only)
    Thinking {
        thinking: String,
        redacted: Option<bool>,
        /// The provider's signature of the thinking (Anthropic's), which a
        /// tool loop must send back. Kept by the worker and its store,
        /// never on the wire: pi's bridge drops `thinkingSignature` too.
        signature: Option<String>,
    },
    /// `{type:"image", data, mimeType}` (user, tool)
    Image { data: String, mime_type: String },
    /// `{type:"toolCall", toolCallId, toolName, input}` (assistant only)
    ToolCall {
        tool_call_id: String,
        tool_name: String,
        input: JsonValue,
    },
}

/// One transcript entry, discriminated by `role`.
#[derive(Debug, Clone, PartialEq)]
pub enum TranscriptItem {
    /// A user message.
    User(UserItem),
    /// A model reply.
    Assistant(AssistantItem),
    /// A tool call's execution.
    Tool(ToolItem),
}

impl TranscriptItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            Self::User(i) => &i.id,
            Self::Assistant(i) => &i.id,
            Self::Tool(i) => &i.id,
        }
    }

    /// True for items that can no longer change (user items, finished assistant and tool items).
    pub fn is_terminal(&self) -> bool {
        match self {
            Self::User(_) => true,
            Self::Assistant(i) => i.status != AssistantStatus::Streaming,
            Self::Tool(i) => i.status != ToolStatus::Running,
        }
    }
}

/// `{id, role:"user", content, timestamp}`
#[derive(Debug, Clone, PartialEq)]
pub struct UserItem {
    /// Item id.
    pub id: String,
    /// Text and image parts.
    pub content: Vec<Content>,
    /// When it was submitted.
    pub timestamp: Timestamp,
}

/// `{id, role:"assistant", content, model, responseModel?, usage?, timestamp, status, stopReason?, errorMessage?}`
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantItem {
    /// Item id.
    pub id: String,
    /// Text, thinking and tool-call parts.
    pub content: Vec<Content>,
    /// Model asked.
    pub model: ModelRef,
    /// Model that actually answered (non-empty when present).
    pub response_model: Option<String>,
    /// Token usage.
    pub usage: Option<Usage>,
    /// When it started.
    pub timestamp: Timestamp,
    /// Lifecycle; determines `stopReason` on the wire.
    pub status: AssistantStatus,
    /// For `error` (non-empty when present) and `aborted`.
    pub error_message: Option<String>,
}

/// Assistant item status with its stop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssistantStatus {
    /// `status:"streaming"`, no stopReason.
    Streaming,
    /// `status:"complete"` with `stopReason` stop | length | toolUse.
    Complete(StopReason),
    /// `status:"error", stopReason:"error"`.
    Error,
    /// `status:"aborted", stopReason:"aborted"`.
    Aborted,
}

/// Why a complete assistant item stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// `stop`
    Stop,
    /// `length`
    Length,
    /// `toolUse`
    ToolUse,
}

/// `{id, role:"tool", toolCallId, toolName, input, content, details?, usage?, timestamp, status, isError}`
#[derive(Debug, Clone, PartialEq)]
pub struct ToolItem {
    /// Item id.
    pub id: String,
    /// The tool call it executes.
    pub tool_call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Tool input (strict JSON).
    pub input: JsonValue,
    /// Text and image parts.
    pub content: Vec<Content>,
    /// Tool-specific details (strict JSON).
    pub details: Option<JsonValue>,
    /// Token usage.
    pub usage: Option<Usage>,
    /// When it started.
    pub timestamp: Timestamp,
    /// Lifecycle; `isError` is true exactly for `Error`.
    pub status: ToolStatus,
}

/// Tool item status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolStatus {
    /// `running`, isError false.
    Running,
    /// `complete`, isError false.
    Complete,
    /// `error`, isError true.
    Error,
}

/// A transient streaming hint. Snapshots stay authoritative.
#[derive(Debug, Clone, PartialEq)]
pub enum TranscriptProgress {
    /// `{type:"item_started", item}`
    ItemStarted { item: TranscriptItem },
    /// `{type:"assistant_delta", messageId, contentIndex, kind, delta}`
    AssistantDelta {
        message_id: String,
        content_index: u64,
        kind: DeltaKind,
        delta: String,
    },
    /// `{type:"item_updated", item}` (assistant or tool item)
    ItemUpdated { item: TranscriptItem },
    /// `{type:"item_finished", item}` (terminal assistant or tool item)
    ItemFinished { item: TranscriptItem },
}

/// `text | thinking | toolCall`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeltaKind {
    /// `text`
    Text,
    /// `thinking`
    Thinking,
    /// `toolCall`
    ToolCall,
}
