//! Failed tokens back off, per remote peer address.
//!
//! ```text
//!  (unknown) ──wrong token──► failures = 1, locked for base
//!  failures n ──wrong token──► failures n+1, locked for min(base·2ⁿ, max)
//!  locked ──any hello before the lock ends──► refused, token not looked at
//!  any ──right token──► forgotten
//! ```
//!
//! A guesser gets one try per lock window, so a 30 s window after some ten
//! failures caps it at two guesses a minute; the rightful user who mistyped
//! once waits a quarter of a second. Local (Unix socket) clients have no
//! address and are never throttled: the socket's file mode admits them.
//!
//! Invariant: at most `capacity` peers are tracked; when full, the peer whose
//! lock ends first is forgotten (it is the least dangerous to forget).

use crate::ids::PeerAddr;
use crate::time::Instant;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    locked_until: Instant,
}

/// Per-peer failed-token state.
#[derive(Debug, Clone)]
pub(crate) struct AuthThrottle {
    base: Duration,
    max: Duration,
    capacity: usize,
    peers: BTreeMap<PeerAddr, Entry>,
}

impl AuthThrottle {
    pub(crate) fn new(base: Duration, max: Duration, capacity: usize) -> Self {
        Self {
            base,
            max,
            capacity: capacity.max(1),
            peers: BTreeMap::new(),
        }
    }

    /// How long `peer` must still wait before its token is looked at, if at all.
    pub(crate) fn locked(&self, peer: &PeerAddr, now: Instant) -> Option<Duration> {
        let entry = self.peers.get(peer)?;
        (entry.locked_until > now).then(|| entry.locked_until - now)
    }

    /// `peer` sent a wrong or no token at `now`; returns its new lock.
    pub(crate) fn failed(&mut self, peer: PeerAddr, now: Instant) -> Duration {
        if !self.peers.contains_key(&peer) && self.peers.len() >= self.capacity {
            let first_free = self
                .peers
                .iter()
                .min_by_key(|(_, e)| e.locked_until)
                .map(|(p, _)| p.clone());
            if let Some(p) = first_free {
                self.peers.remove(&p);
            }
        }
        let entry = self.peers.entry(peer).or_insert(Entry {
            failures: 0,
            locked_until: now,
        });
        entry.failures = entry.failures.saturating_add(1);
        let lock = self
            .base
            .saturating_mul(1u32 << (entry.failures - 1).min(20))
            .min(self.max);
        entry.locked_until = now + lock;
        lock
    }

    /// `peer` proved the token: its failures are forgotten.
    pub(crate) fn succeeded(&mut self, peer: &PeerAddr) {
        self.peers.remove(peer);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(n: u8) -> PeerAddr {
        PeerAddr(format!("10.0.0.{n}"))
    }

    #[test]
    fn locks_double_up_to_the_cap_and_a_success_forgets() {
        let mut t = AuthThrottle::new(Duration::from_millis(250), Duration::from_secs(30), 8);
        let now = Instant(1_000);
        assert_eq!(t.locked(&peer(1), now), None);
        let locks: Vec<u64> = (0..10)
            .map(|_| t.failed(peer(1), now).as_millis() as u64)
            .collect();
        assert_eq!(
            locks,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(t.locked(&peer(1), now), Some(Duration::from_secs(30)));
        assert_eq!(t.locked(&peer(1), Instant(31_000)), None);
        assert_eq!(
            t.locked(&peer(2), now),
            None,
            "other peers are not affected"
        );
        t.succeeded(&peer(1));
        assert_eq!(t.failed(peer(1), now), Duration::from_millis(250));
    }

    #[test]
    fn a_full_table_forgets_the_lock_that_ends_first() {
        let mut t = AuthThrottle::new(Duration::from_millis(250), Duration::from_secs(30), 2);
        t.failed(peer(1), Instant(0));
        t.failed(peer(2), Instant(100));
        t.failed(peer(3), Instant(200));
        assert_eq!(t.len(), 2);
        assert_eq!(t.locked(&peer(1), Instant(200)), None);
        assert!(t.locked(&peer(2), Instant(200)).is_some());
        assert!(t.locked(&peer(3), Instant(200)).is_some());
    }
}
