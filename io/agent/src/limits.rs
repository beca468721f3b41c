//! Every wait of the agent back-ends (model calls and tools), in one place
//! (named in `kernel::limits`). The tools' output caps are their contract
//! with the model, pi's own numbers, and stay beside them (`tools`).

use std::time::Duration;

/// TCP (and TLS) connect of a model call ([`crate::Timeouts`]'s default).
pub const MODEL_CONNECT: Duration = Duration::from_secs(10);
/// From a model call's request to its response headers.
pub const MODEL_FIRST_BYTE: Duration = Duration::from_secs(60);
/// Between two reads of a model call's response body.
pub const MODEL_IDLE: Duration = Duration::from_secs(60);
/// An idle pooled connection to a provider is closed after this long.
pub const POOL_IDLE: Duration = Duration::from_secs(60);

/// `bash`'s timeout when the model gives none.
pub const BASH_DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest timeout the model may give `bash` (a day).
pub const BASH_MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
/// After the shell exits, how long its background processes may still
/// write to the output pipe before it is read no more.
pub const BASH_PIPE_GRACE: Duration = Duration::from_millis(200);
/// After a timed-out or cancelled command's group is killed, how long to
/// wait for the shell to be reaped.
pub const BASH_REAP: Duration = Duration::from_secs(5);
