//! Every bound and wait of the daemon's hosts, in one place (named in
//! `kernel::limits`, whose `Limits` and `WorkerLimits` hold the machines'
//! own). Each says why it is what it is.

use std::time::Duration;

/// Events (accepts, worker frames, exits, jobs) queued for the loop before
/// their senders wait.
pub(crate) const LOOP_EVENTS: usize = 4096;

/// After a failed `accept` (out of descriptors, say), the wait before the next.
pub(crate) const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The most events handled before the output they cause is written.
pub(crate) const EVENT_BATCH: usize = 64;

/// The most reads of one client connection in one turn of the loop; a
/// connection with more to read goes to the back of the queue, behind the
/// others that are ready.
pub(crate) const READS_PER_TURN: usize = 4;

/// The most a connection's reader takes from its socket at once.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// The most frames given to one vectored write (below every `IOV_MAX`).
pub(crate) const MAX_SLICES: usize = 512;

/// How long a remote connection may be silent before the OS probes it, how
/// often it probes, and how many unanswered probes end it: a peer that
/// vanished (a laptop closed, a network partition) is noticed within about a
/// minute even when the connection is idle, and its attachments end like
/// any disconnect. Protocol v1 has no keep-alive message of its own.
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// How often an unanswered keep-alive probe is sent again.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered keep-alive probes that end a connection.
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

/// Written data a remote peer has not acknowledged for this long ends the
/// connection (covers a peer that vanished while we were sending).
pub(crate) const TCP_USER_TIMEOUT_MS: u32 = 60_000;

/// Frames queued for one WebSocket before a write takes nothing.
pub(crate) const OUT_FRAMES: usize = 256;

/// Messages received and not yet read by the loop.
pub(crate) const IN_MESSAGES: usize = 64;

/// Upgraded sockets not yet taken by the loop.
pub(crate) const ACCEPT_BACKLOG: usize = 64;

/// Inputs (frames, store results, model events, tool results) queued for
/// the host before their senders wait: the channel reader waits too, so the
/// server's writes back up rather than the worker's memory.
pub(crate) const HOST_EVENTS: usize = 1024;

/// Events of one model call queued before the provider's stream waits.
pub(crate) const MODEL_EVENTS: usize = 256;
