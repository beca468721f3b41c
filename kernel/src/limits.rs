//! Every bound of the kernel in one place.
//!
//! Hitting a limit is never silent growth: it produces an explicit output
//! (an error response, a `hello_error`, or closing the offending connection
//! with a reason).
//!
//! The hosts' own waits and queue bounds are each in their crate's
//! `limits.rs`: `io/client` (the event queue, the close's flush), `io/store`
//! (SQLite's busy wait), `io/agent` (model-call and `bash` timeouts),
//! `io/daemon` (accept retries, read sizes, keep-alives, the worker's and
//! the web listener's queues) and `io/front` (start, probe and poll waits,
//! the front ends' queues). A test (`tests/io_tidy.rs`) keeps every wait
//! written out there, and every io queue bounded. The runtime's retry and
//! compaction policy is `runtime::Policy`.

use crate::wire::{CborLimits, frame::DEFAULT_MAX_FRAME_LEN};
use std::time::Duration;

/// Bounds and deadlines of the server kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Open client connections. One more is answered with `hello_error` and closed.
    pub max_connections: usize,
    /// Sessions one connection may be attached to at once.
    pub max_attachments_per_connection: usize,
    /// Live sessions (worker processes) at once. Opening one more fails `session_locked`.
    pub max_live_sessions: usize,
    /// Requests of one connection awaiting their response at once.
    pub max_requests_in_flight_per_connection: usize,
    /// Requests received before the handshake completed and kept for later.
    pub max_deferred_requests: usize,
    /// Largest frame payload accepted or sent, in bytes (inclusive).
    pub max_frame_len: u32,
    /// A live session's transcript (its CBOR) is kept by the server past
    /// the step that brought it only up to this length; a longer one is let
    /// go once sent, and asked of the worker again when a client attaches.
    /// So the server's memory is bounded by this times the live sessions,
    /// not by their history.
    pub kept_transcript_bytes: usize,
    /// Bytes queued for one connection and not yet written. A connection
    /// that would exceed it is a slow consumer and is closed.
    pub max_output_bytes_per_connection: usize,
    /// Limits of the CBOR decoder.
    pub cbor: CborLimits,
    /// From accept until the server hello is sent.
    pub handshake_timeout: Duration,
    /// From accepting a channel on the worker socket until its first frame
    /// (a worker's hello, an orphan's announcement, a successor's replace).
    pub worker_hello_timeout: Duration,
    /// From spawning a worker until it reports ready.
    pub worker_start_timeout: Duration,
    /// From asking a worker to dispose until it exits; then it is killed.
    pub worker_dispose_timeout: Duration,
    /// From a change of the session directory (a sibling server created,
    /// renamed or removed a session) until it is scanned; later changes
    /// within it share the scan.
    pub catalog_settle: Duration,
    /// How often an unwatched session directory is scanned.
    pub catalog_poll: Duration,
    /// How long a starting server waits for the orphans it expects (found
    /// holding their session locks, or released by its predecessor) to
    /// announce themselves before it opens their sessions anew.
    pub adoption_wait: Duration,
    /// How long an adopted session is kept live without attachments, so the
    /// clients that followed it before the hand-over can re-attach.
    pub adoption_grace: Duration,
    /// How long a starting server waits for the running server with its id
    /// to hand over (release its workers and free its sockets).
    pub handoff_timeout: Duration,
    /// A wrong or missing token from a remote peer locks that address out
    /// for this long, doubling with each further failure...
    pub auth_backoff_base: Duration,
    /// ...up to this long.
    pub auth_backoff_max: Duration,
    /// Remote peers whose failed tokens are remembered at once.
    pub auth_throttle_peers: usize,
    /// Images one prompt may carry (each within the frame).
    pub max_prompt_images: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let max_frame_len = DEFAULT_MAX_FRAME_LEN;
        Self {
            max_connections: 4096,
            max_attachments_per_connection: 256,
            max_live_sessions: 512,
            max_requests_in_flight_per_connection: 1024,
            max_deferred_requests: 64,
            max_frame_len,
            kept_transcript_bytes: 64 * 1024,
            max_output_bytes_per_connection: 4 * max_frame_len as usize,
            cbor: CborLimits {
                max_byte_len: max_frame_len as usize,
                ..CborLimits::default()
            },
            handshake_timeout: Duration::from_secs(5),
            worker_hello_timeout: Duration::from_secs(5),
            worker_start_timeout: Duration::from_secs(15),
            worker_dispose_timeout: Duration::from_secs(10),
            catalog_settle: Duration::from_millis(100),
            catalog_poll: Duration::from_secs(1),
            adoption_wait: Duration::from_secs(10),
            adoption_grace: Duration::from_secs(30),
            handoff_timeout: Duration::from_secs(15),
            auth_backoff_base: Duration::from_millis(250),
            auth_backoff_max: Duration::from_secs(30),
            auth_throttle_peers: 4096,
            max_prompt_images: 16,
        }
    }
}

/// Bounds of a worker process ([`crate::host::WorkerHost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLimits {
    /// An orphan no server adopted this long retires once idle.
    pub orphan_grace: Duration,
    /// An orphan announces itself this often.
    pub announce_retry: Duration,
    /// Connecting to announce, and then the server's answer, each take at most this long.
    pub announce_timeout: Duration,
    /// The session's MCP servers.
    pub mcp: McpLimits,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        Self {
            orphan_grace: Duration::from_secs(30),
            announce_retry: Duration::from_millis(200),
            announce_timeout: Duration::from_secs(5),
            mcp: McpLimits::default(),
        }
    }
}

/// Bounds of a session's MCP servers ([`crate::mcp::McpServers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpLimits {
    /// A server that has not listed its tools this long after its start
    /// is stopped and failed; a turn waits for its servers at most this long.
    pub start_timeout: Duration,
    /// A failed server is started again by a turn this long after it failed.
    pub retry_after: Duration,
    /// A call of an MCP tool fails after this long.
    pub call_timeout: Duration,
    /// The most MCP tools a session offers.
    pub max_tools: usize,
}

impl Default for McpLimits {
    fn default() -> Self {
        Self {
            start_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(60),
            call_timeout: Duration::from_secs(120),
            max_tools: 128,
        }
    }
}

/// How much of a streaming reply may be shown to clients and not yet
/// stored: after a crash its aborted item keeps everything up to the last
/// checkpoint ([`crate::runtime::Runtime`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// A streamed delta is stored at most this long after it was shown.
    pub interval: Duration,
    /// At most this many streamed bytes are shown and not stored.
    pub bytes: usize,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            bytes: 4096,
        }
    }
}

/// Bounds and deadlines of the client-connection machine
/// ([`crate::client::Client`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// Largest frame payload accepted or sent, in bytes (the peers must agree).
    pub max_frame_len: u32,
    /// Limits of the CBOR decoder.
    pub cbor: CborLimits,
    /// From the client hello until the server's.
    pub handshake_timeout: Duration,
    /// The first reconnection waits this long; each further one twice as long.
    pub reconnect_backoff_initial: Duration,
    /// The longest wait between reconnection attempts.
    pub reconnect_backoff_max: Duration,
    /// A reconnection that has not completed a handshake this long after the
    /// transport was lost gives up: the client closes.
    pub reconnect_window: Duration,
    /// Calls outstanding at once; one more is refused at once
    /// ([`crate::client::ClientError::TooMany`]), nothing sent.
    pub max_calls_in_flight: usize,
    /// Sessions held (attached, being attached or released) at once; one
    /// more attaching call is refused at once. The server's own default
    /// bound per connection.
    pub max_sessions: usize,
}

impl ClientLimits {
    /// The most requests a client has in flight: each outstanding call has
    /// at most one, a plain `attach` or `create` may add a session beyond
    /// [`Self::max_sessions`] until answered, and a reconnection re-attaches
    /// each session held. A host's queue of frames to write needs no more
    /// room than this, the hello and its few transport commands.
    pub fn max_requests_in_flight(&self) -> usize {
        2 * self.max_calls_in_flight + self.max_sessions
    }
}

impl Default for ClientLimits {
    fn default() -> Self {
        let max_frame_len = DEFAULT_MAX_FRAME_LEN;
        Self {
            max_frame_len,
            cbor: CborLimits {
                max_byte_len: max_frame_len as usize,
                ..CborLimits::default()
            },
            handshake_timeout: Duration::from_secs(10),
            reconnect_backoff_initial: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(1),
            reconnect_window: Duration::from_secs(30),
            max_calls_in_flight: 1024,
            max_sessions: 256,
        }
    }
}

impl Limits {
    /// Checks the relationships between limits; the server refuses to start otherwise.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_frame_len == 0 {
            return Err("max_frame_len must be at least 1".into());
        }
        if self.max_output_bytes_per_connection < self.max_frame_len as usize + 4 {
            return Err(format!(
                "max_output_bytes_per_connection ({}) must hold one full frame ({} bytes)",
                self.max_output_bytes_per_connection,
                self.max_frame_len as u64 + 4
            ));
        }
        if self.max_connections == 0 || self.max_live_sessions == 0 {
            return Err("max_connections and max_live_sessions must be at least 1".into());
        }
        if self.catalog_poll.is_zero() {
            return Err("catalog_poll must be positive".into());
        }
        if self.cbor.max_depth > 512 {
            return Err("cbor.max_depth must be at most 512".into());
        }
        Ok(())
    }
}

const _: () = assert!(DEFAULT_MAX_FRAME_LEN as u64 * 4 <= usize::MAX as u64);
