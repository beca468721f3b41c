//! Every bound and wait of the store, in one place (named in
//! `kernel::limits`).

use std::time::Duration;

/// How long a statement waits for a lock held by another connection.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
