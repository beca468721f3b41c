//! The server's timer table: every per-connection and per-session deadline,
//! kept in deadline order, so that [`Server::next_deadline`] is a lookup and
//! a tick visits only what expired.
//!
//! [`Server::next_deadline`]: super::Server::next_deadline
//!
//! The table is the only store of the handshake, hold and adoption-wait
//! deadlines. A worker's own start or dispose deadline lives in its
//! [`Worker`](crate::worker::Worker) machine and is mirrored here after every
//! step of it.
//!
//! Invariant: every timer names a connection or session the server holds
//! (checked by the server's sweep), and `order` holds exactly the pairs of
//! `due`.

use crate::ids::ConnId;
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet};

/// What a deadline is for. The variant order is the order a tick handles
/// them in, and within a variant, id order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// A connection that has not said hello.
    Handshake(ConnId),
    /// The session's worker must start, or exit after dispose, by then.
    Worker(String),
    /// An adopted session stays live without attachments until then.
    Hold(String),
    /// A released worker of this session is expected to announce itself.
    Expected(String),
}

/// The table. See the module documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timers {
    due: BTreeMap<Timer, Instant>,
    order: BTreeSet<(Instant, Timer)>,
}

impl Timers {
    /// Sets `timer` to fire at `at`, or cancels it (`None`).
    pub(crate) fn set(&mut self, timer: Timer, at: Option<Instant>) {
        match at {
            Some(at) => {
                if let Some(old) = self.due.insert(timer.clone(), at) {
                    self.order.remove(&(old, timer.clone()));
                }
                self.order.insert((at, timer));
            }
            None => {
                if let Some(old) = self.due.remove(&timer) {
                    self.order.remove(&(old, timer));
                }
            }
        }
    }

    /// True when `timer` is set.
    pub(crate) fn contains(&self, timer: &Timer) -> bool {
        self.due.contains_key(timer)
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.order.first().map(|(at, _)| *at)
    }

    /// The timers due at `now` that `pick` selects, in id order (the order
    /// a tick handles them in, whatever their deadlines).
    pub(crate) fn expired<T: Ord>(
        &self,
        now: Instant,
        pick: impl Fn(&Timer) -> Option<T>,
    ) -> Vec<T> {
        let mut due: Vec<T> = self
            .order
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter_map(|(_, timer)| pick(timer))
            .collect();
        due.sort();
        due
    }

    /// Every set timer, in timer order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Timer, Instant)> {
        self.due.iter().map(|(timer, at)| (timer, *at))
    }

    /// Both indexes agree.
    pub(crate) fn is_consistent(&self) -> bool {
        self.due.len() == self.order.len()
            && self
                .order
                .iter()
                .all(|(at, timer)| self.due.get(timer) == Some(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_are_kept_in_order_and_replaced() {
        let mut t = Timers::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Hold("b".into()), Some(Instant(30)));
        t.set(Timer::Handshake(ConnId(2)), Some(Instant(10)));
        t.set(Timer::Handshake(ConnId(1)), Some(Instant(20)));
        assert_eq!(t.next(), Some(Instant(10)));
        t.set(Timer::Handshake(ConnId(2)), Some(Instant(40)));
        assert_eq!(t.next(), Some(Instant(20)), "replaced, not added");
        t.set(Timer::Handshake(ConnId(1)), None);
        assert_eq!(t.next(), Some(Instant(30)));
        assert!(t.is_consistent());
        assert_eq!(t.iter().count(), 2);
    }

    #[test]
    fn expired_timers_come_in_id_order() {
        let mut t = Timers::default();
        t.set(Timer::Handshake(ConnId(3)), Some(Instant(1)));
        t.set(Timer::Handshake(ConnId(1)), Some(Instant(5)));
        t.set(Timer::Handshake(ConnId(2)), Some(Instant(9)));
        t.set(Timer::Hold("a".into()), Some(Instant(2)));
        let conns = |timer: &Timer| match timer {
            Timer::Handshake(c) => Some(*c),
            _ => None,
        };
        assert_eq!(t.expired(Instant(5), conns), vec![ConnId(1), ConnId(3)]);
        assert_eq!(t.expired(Instant(0), conns), vec![]);
    }
}
