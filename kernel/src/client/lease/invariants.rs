//! The lease machine's invariants, asserted at the end of every step.

use super::*;

impl Leases {
    /// Asserts the machine's invariants; [`step`](Self::step) runs it last.
    ///
    /// # Panics
    ///
    /// If an invariant does not hold.
    pub fn invariants(&self) {
        if self.disposed {
            assert!(!self.connected, "a disposed client is not connected");
        }
        if !self.connected {
            assert!(
                self.pending.is_empty() && self.held.is_empty(),
                "requests pending while disconnected"
            );
        }
        for (session_id, ..) in &self.held {
            assert!(
                self.sessions
                    .get(session_id)
                    .and_then(|s| s.attaching)
                    .is_some_and(|a| a.reattach),
                "{session_id}: a request is held with no re-attachment in flight"
            );
        }
        if self.suspended {
            assert!(!self.connected && !self.disposed, "suspended means neither");
        }
        assert!(
            self.pending
                .keys()
                .all(|&id| id >= 1 && id <= self.request_sequence)
        );
        assert!(
            self.leases
                .keys()
                .all(|id| id.0 >= 1 && id.0 <= self.lease_sequence)
        );
        self.lease_invariants();
        self.session_invariants();
        self.pending_invariants();
        self.call_invariants();
    }

    pub(super) fn lease_invariants(&self) {
        for (id, lease) in &self.leases {
            let session = self.sessions.get(&lease.session_id);
            let held = session.is_some_and(|s| s.holders.contains(id));
            assert_eq!(
                held,
                lease.state.holds(),
                "{id}: holders disagree with {:?}",
                lease.state
            );
            match &lease.state {
                LeaseState::Acquiring { awaiting, .. } => {
                    let session = session.expect("held");
                    match awaiting {
                        Awaiting::Detach(request) => assert!(matches!(
                            self.pending.get(request),
                            Some(Pending {
                                purpose: Purpose::ReleaseDetach { .. },
                                ..
                            })
                        )),
                        Awaiting::Reconcile => assert!(session.reconciling.is_some()),
                        Awaiting::Attach => assert!(session.attaching.is_some()),
                    }
                }
                LeaseState::Active
                | LeaseState::Releasing {
                    invalidated: false, ..
                } => {
                    assert!(
                        self.connected || self.suspended,
                        "{id}: granted while disconnected"
                    );
                    let session = session.expect("held");
                    assert_eq!(
                        lease.generation, session.generation,
                        "{id}: stale generation"
                    );
                }
                LeaseState::Releasing {
                    invalidated: true, ..
                }
                | LeaseState::Released
                | LeaseState::Invalidated => {}
            }
            if let LeaseState::Releasing { request, .. } = &lease.state {
                let pending = self
                    .pending
                    .get(request)
                    .expect("a releasing lease awaits detach");
                assert_eq!(pending.purpose, Purpose::ReleaseDetach { lease: *id });
            }
        }
    }

    pub(super) fn session_invariants(&self) {
        for (session_id, session) in &self.sessions {
            assert!(!session.is_idle(), "idle session {session_id} kept");
            if !self.connected {
                assert!(!session.attached && !session.cleanup_required);
            }
            if !self.connected && !self.suspended {
                assert!(
                    session.holders.is_empty(),
                    "{session_id}: held while disconnected"
                );
                assert!(
                    !session.reattach,
                    "{session_id}: re-attach while disconnected"
                );
            }
            if self.suspended {
                let all_active = session
                    .holders
                    .iter()
                    .all(|id| self.leases[id].state == LeaseState::Active);
                assert!(all_active, "{session_id}: a suspended lease is not active");
            }
            let holders: Vec<&Lease> = session.holders.iter().map(|id| &self.leases[id]).collect();
            assert!(holders.iter().all(|l| &l.session_id == session_id));
            let exclusive = holders
                .iter()
                .filter(|l| l.mode == LeaseMode::Exclusive)
                .count();
            assert!(exclusive <= 1, "{session_id}: two exclusive leases");
            assert!(
                exclusive == 0 || holders.len() == 1,
                "{session_id}: exclusive and shared"
            );
            if let Some(attaching) = session.attaching {
                let purpose = &self.pending[&attaching.request].purpose;
                assert_eq!(
                    purpose,
                    &Purpose::Attach {
                        session_id: session_id.clone()
                    }
                );
            }
            if let Some(request) = session.reconciling {
                let purpose = &self.pending[&request].purpose;
                assert_eq!(
                    purpose,
                    &Purpose::Reconcile {
                        session_id: session_id.clone()
                    }
                );
            }
            if let Some(request) = session.detaching {
                let Purpose::ReleaseDetach { lease } = self.pending[&request].purpose else {
                    panic!("{session_id}: detaching is not a release")
                };
                // Detach only for the last lease: while it holds, every other
                // holder is an acquisition waiting for that detach.
                if session.holders.contains(&lease) {
                    let others_wait = session.holders.iter().filter(|&&id| id != lease).all(|id| {
                        matches!(self.leases[id].state,
                            LeaseState::Acquiring { awaiting: Awaiting::Detach(r), .. } if r == request)
                    });
                    assert!(
                        others_wait,
                        "{session_id}: detach sent while other leases hold"
                    );
                }
            }
        }
    }

    pub(super) fn pending_invariants(&self) {
        for (request, pending) in &self.pending {
            match &pending.purpose {
                Purpose::Attach { session_id } => {
                    assert_eq!(pending.command, "attach");
                    let attaching = self.sessions[session_id].attaching.expect("attaching");
                    assert_eq!(attaching.request, *request);
                }
                Purpose::Reconcile { session_id } => {
                    assert_eq!(pending.command, "detach");
                    assert_eq!(self.sessions[session_id].reconciling, Some(*request));
                }
                Purpose::ReleaseDetach { lease } => {
                    assert_eq!(pending.command, "detach");
                    let state = &self.leases[lease].state;
                    assert!(
                        matches!(state, LeaseState::Releasing { request: r, .. } if r == request)
                    );
                }
                Purpose::Create { .. } => assert_eq!(pending.command, "create"),
                Purpose::List { .. } => assert_eq!(pending.command, "list"),
                Purpose::Command { .. } | Purpose::Call { .. } => {}
            }
        }
    }

    /// Every outstanding call waits in exactly one place (held requests included).
    pub(super) fn call_invariants(&self) {
        let mut waiting = Vec::new();
        for lease in self.leases.values() {
            match &lease.state {
                LeaseState::Acquiring { call, .. } => waiting.push(*call),
                LeaseState::Releasing { waiters, .. } => waiting.extend(waiters.iter().copied()),
                _ => {}
            }
        }
        let purposes = self
            .pending
            .values()
            .map(|p| &p.purpose)
            .chain(self.held.iter().map(|(_, _, _, purpose)| purpose));
        for purpose in purposes {
            match purpose {
                Purpose::Create { call }
                | Purpose::List { call }
                | Purpose::Command { call }
                | Purpose::Call { call } => {
                    waiting.push(*call);
                }
                _ => {}
            }
        }
        let unique: BTreeSet<CallId> = waiting.iter().copied().collect();
        assert_eq!(unique.len(), waiting.len(), "a call waits in two places");
        assert_eq!(
            unique, self.outstanding,
            "outstanding calls and waiters disagree"
        );
    }
}
