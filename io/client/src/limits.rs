//! Every bound and wait of the client library's host, in one place (named
//! in `kernel::limits`, whose `ClientLimits` hold the client machine's own,
//! and bound the driver's queue).

use std::time::Duration;

/// Events buffered per subscriber before a slow one starts to lag.
pub const EVENT_CAPACITY: usize = 4096;

/// Bytes read from the socket at a time.
pub(crate) const READ_CHUNK_LEN: usize = 64 * 1024;

/// How long [`Client::close`] waits for queued frames to be written.
pub(crate) const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
