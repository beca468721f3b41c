//! The reconnection policy every client machine of ours runs (`Client` for
//! v1, `v8::connection::Connection`): after a loss, attempts with
//! exponential backoff within a window; a server started at most once per
//! reconnection when nothing listens. One decision, for both protocols.

use std::time::Duration;

use super::ClientError;
use crate::limits::ClientLimits;
use crate::time::Instant;

/// A reconnection under way: when it began and how many attempts it made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reconnection {
    since: Instant,
    attempts: u32,
    /// A server was started during it (the machine's `Launch` output).
    launched: bool,
}

impl Reconnection {
    /// A reconnection that begins at `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            since: now,
            attempts: 0,
            launched: false,
        }
    }

    /// After a loss (`reason`) at `now`: when to try again, or, once the
    /// window has passed, the error that ends the client.
    pub(crate) fn next_attempt(
        &self,
        now: Instant,
        limits: &ClientLimits,
        reason: &str,
    ) -> Result<Instant, ClientError> {
        if now.saturating_since(self.since) >= limits.reconnect_window {
            let window = limits.reconnect_window.as_secs();
            return Err(ClientError::Disconnected(format!(
                "the server went away and did not come back within {window} s ({reason})"
            )));
        }
        Ok(now + backoff(limits, self.attempts))
    }

    /// An attempt starts (a new transport is asked for).
    pub(crate) fn attempt(&mut self) {
        self.attempts += 1;
    }

    /// A connect found nothing listening: whether to start the server,
    /// which the client may (`allowed`) once per reconnection.
    pub(crate) fn launches(&mut self, nothing_listening: bool, allowed: bool) -> bool {
        let launch = nothing_listening && allowed && !self.launched;
        self.launched |= launch;
        launch
    }
}

/// The delay before reconnection attempt `attempt` (0-based): doubling from
/// the initial backoff, capped.
fn backoff(limits: &ClientLimits, attempt: u32) -> Duration {
    let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
    limits
        .reconnect_backoff_initial
        .saturating_mul(factor)
        .min(limits.reconnect_backoff_max)
}
