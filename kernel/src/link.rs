//! A worker's link to its server, as the worker sees it.
//!
//! A worker outlives its server: when the server is replaced or dies, the
//! worker becomes an **orphan** and keeps trying to announce itself at the
//! server's worker socket, so that the next server with the same id adopts
//! it (its in-flight turn continues). An orphan that no server reclaims
//! within the grace period retires — once it is idle: a busy orphan first
//! finishes its turn and commits it.
//!
//! ```text
//!   Linked ──lost──► Orphaned{since} ──adopted──► Linked
//!                        │ idle and since + grace ≤ now
//!                        ▼
//!                     Retired
//! ```

use crate::time::Instant;
use std::time::Duration;

/// What the worker must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkAction {
    /// Try to connect to the server's worker socket and announce itself.
    Announce,
    /// Give up: dispose the session and exit.
    Retire,
}

/// What the worker host learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkInput {
    /// The server link was lost (the server died, was replaced, or released it).
    Lost,
    /// A server adopted the worker.
    Adopted,
    /// Time passed; `idle` says whether the session has no turn running (a
    /// busy orphan finishes its turn before it retires).
    Tick { idle: bool },
}

/// Where the link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// A server holds this worker.
    Linked,
    /// No server: announcing itself every retry interval since `since`.
    Orphaned {
        /// When the link was lost.
        since: Instant,
        /// Next announcement attempt.
        next_try: Instant,
    },
    /// Retired (terminal).
    Retired,
}

/// The link machine. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    state: LinkState,
    grace: Duration,
    retry: Duration,
}

impl Link {
    /// A linked worker whose orphan grace is `grace`, retrying every `retry`.
    pub fn new(grace: Duration, retry: Duration) -> Self {
        assert!(!retry.is_zero(), "a zero retry interval would spin");
        Self {
            state: LinkState::Linked,
            grace,
            retry,
        }
    }

    /// Current state.
    pub fn state(&self) -> LinkState {
        self.state
    }

    /// True while no server holds the worker.
    pub fn is_orphaned(&self) -> bool {
        matches!(self.state, LinkState::Orphaned { .. })
    }

    /// Feeds one input at `now`; returns what the worker must do, if anything.
    pub fn step(&mut self, now: Instant, input: LinkInput) -> Option<LinkAction> {
        let action = match input {
            LinkInput::Lost => self.on_lost(now),
            LinkInput::Adopted => {
                if self.is_orphaned() {
                    self.state = LinkState::Linked;
                }
                None
            }
            LinkInput::Tick { idle } => self.on_tick(now, idle),
        };
        debug_assert_eq!(self.invariants(), Ok(()));
        action
    }

    /// An orphan's next announcement is at least a retry interval after
    /// its loss: announcements never come faster than `retry`.
    pub fn invariants(&self) -> Result<(), String> {
        if let LinkState::Orphaned { since, next_try } = self.state
            && next_try < since + self.retry
        {
            return Err(format!(
                "next announcement at {next_try}, within a retry of the loss at {since}"
            ));
        }
        Ok(())
    }

    fn on_lost(&mut self, now: Instant) -> Option<LinkAction> {
        match self.state {
            LinkState::Linked => {
                self.state = LinkState::Orphaned {
                    since: now,
                    next_try: now + self.retry,
                };
                Some(LinkAction::Announce)
            }
            LinkState::Orphaned { .. } | LinkState::Retired => None,
        }
    }

    fn on_tick(&mut self, now: Instant, idle: bool) -> Option<LinkAction> {
        let LinkState::Orphaned { since, next_try } = self.state else {
            return None;
        };
        if idle && now >= since + self.grace {
            self.state = LinkState::Retired;
            return Some(LinkAction::Retire);
        }
        if now >= next_try {
            self.state = LinkState::Orphaned {
                since,
                next_try: now + self.retry,
            };
            return Some(LinkAction::Announce);
        }
        None
    }

    /// When [`LinkInput::Tick`] has something to do.
    ///
    /// That is the next announcement: the grace is checked on every tick, so
    /// it is honoured to within one retry interval, and a busy orphan past its
    /// grace never yields a deadline in the past (which would make a driver spin).
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.state {
            LinkState::Orphaned { next_try, .. } => Some(next_try),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LinkInput::*;

    #[test]
    fn an_idle_orphan_retires_after_its_grace() {
        let mut l = Link::new(Duration::from_millis(1000), Duration::from_millis(100));
        assert_eq!(
            l.step(Instant(5), Tick { idle: true }),
            None,
            "linked: nothing to do"
        );
        assert_eq!(l.step(Instant(0), Lost), Some(LinkAction::Announce));
        assert_eq!(l.step(Instant(1), Lost), None, "lost once");
        assert_eq!(l.next_deadline(), Some(Instant(100)));
        assert_eq!(l.step(Instant(50), Tick { idle: true }), None);
        assert_eq!(
            l.step(Instant(100), Tick { idle: true }),
            Some(LinkAction::Announce)
        );
        assert_eq!(
            l.step(Instant(999), Tick { idle: true }),
            Some(LinkAction::Announce)
        );
        assert_eq!(
            l.step(Instant(1000), Tick { idle: true }),
            Some(LinkAction::Retire)
        );
        assert_eq!(l.state(), LinkState::Retired);
        assert_eq!(l.step(Instant(2000), Tick { idle: true }), None);
    }

    #[test]
    fn a_busy_orphan_finishes_first_and_adoption_relinks() {
        let mut l = Link::new(Duration::from_millis(1000), Duration::from_millis(100));
        l.step(Instant(0), Lost);
        assert_eq!(
            l.step(Instant(5000), Tick { idle: false }),
            Some(LinkAction::Announce),
            "busy: keep trying"
        );
        assert_eq!(
            l.next_deadline(),
            Some(Instant(5100)),
            "past the grace: never a deadline in the past"
        );
        assert_eq!(
            l.step(Instant(5001), Tick { idle: true }),
            Some(LinkAction::Retire),
            "idle after the grace: retire"
        );
        let mut l = Link::new(Duration::from_millis(1000), Duration::from_millis(100));
        l.step(Instant(0), Lost);
        l.step(Instant(5), Adopted);
        assert_eq!(l.state(), LinkState::Linked);
        assert_eq!(l.next_deadline(), None);
        assert_eq!(
            l.step(Instant(10), Lost),
            Some(LinkAction::Announce),
            "a second server can be lost too"
        );
    }
}
