//! Releasing a lease: `detach` at the last release of a session, and what
//! a failed one leaves.

use super::*;

impl Leases {
    pub(super) fn on_release(&mut self, call: CallId, lease: LeaseId, kind: ReleaseKind) {
        self.begin_call(call);
        let Some(entry) = self.leases.get_mut(&lease) else {
            return self.complete(call, Err(LeaseError::UnknownLease { lease }));
        };
        match &mut entry.state {
            LeaseState::Acquiring { .. } => {
                self.complete(call, Err(LeaseError::UnknownLease { lease }));
            }
            LeaseState::Released
            | LeaseState::Invalidated
            | LeaseState::Releasing {
                invalidated: true, ..
            } => {
                self.complete(call, Ok(Completion::Released));
            }
            LeaseState::Releasing { waiters, .. } => waiters.push(call),
            LeaseState::Active => match self.check_active(lease) {
                Ok(()) => self.start_release(lease, kind, vec![call]),
                Err(error) => self.complete(call, Err(error)),
            },
        }
    }

    /// The reference `assertActive`.
    pub(super) fn check_active(&self, lease: LeaseId) -> Result<(), LeaseError> {
        if self.disposed {
            return Err(LeaseError::ClientDisposed);
        }
        if !self.connected {
            return Err(LeaseError::Disconnected);
        }
        if self.is_active(lease) {
            Ok(())
        } else {
            let session_id = self.leases[&lease].session_id.clone();
            Err(LeaseError::Detached { session_id })
        }
    }

    /// Releases an active lease: `detach` if it is the last holder.
    pub(super) fn start_release(
        &mut self,
        lease: LeaseId,
        kind: ReleaseKind,
        waiters: Vec<CallId>,
    ) {
        assert_eq!(self.leases[&lease].state, LeaseState::Active);
        let session_id = self.leases[&lease].session_id.clone();
        let holders = self.sessions[&session_id].holders.len();
        assert!(holders >= 1);
        if holders > 1 {
            self.lease_mut(lease).state = LeaseState::Released;
            assert!(self.session_mut(&session_id).holders.remove(&lease));
            for call in waiters {
                self.complete(call, Ok(Completion::Released));
            }
            return;
        }
        let command = Command::Detach {
            session_id: session_id.clone(),
        };
        let Ok(request) = self.send(command, Purpose::ReleaseDetach { lease }) else {
            unreachable!("an active lease implies a connected client")
        };
        self.lease_mut(lease).state = LeaseState::Releasing {
            kind,
            request,
            waiters,
            invalidated: false,
        };
        self.session_mut(&session_id).detaching = Some(request);
    }

    /// A release's `detach` settled.
    pub(super) fn release_settled(&mut self, lease: LeaseId, result: Result<(), LeaseError>) {
        let entry = self.lease_mut(lease);
        let LeaseState::Releasing {
            kind,
            request,
            waiters,
            invalidated,
        } = std::mem::replace(&mut entry.state, LeaseState::Released)
        else {
            unreachable!("only releasing leases have a detach in flight")
        };
        let session_id = entry.session_id.clone();
        let session = self.session_mut(&session_id);
        if session.detaching == Some(request) {
            session.detaching = None;
        }
        let (state, outcome) = match (invalidated, result, kind) {
            (true, _, _) => (LeaseState::Invalidated, Ok(Completion::Released)),
            (false, Ok(()), _) => (LeaseState::Released, Ok(Completion::Released)),
            (false, Err(error), ReleaseKind::Detach) => (LeaseState::Active, Err(error)),
            (false, Err(error), ReleaseKind::Dispose) => {
                session.cleanup_required = true;
                (LeaseState::Released, Err(error))
            }
        };
        if !invalidated && state != LeaseState::Active {
            assert!(session.holders.remove(&lease));
        }
        self.lease_mut(lease).state = state;
        for call in waiters {
            self.complete(call, outcome.clone());
        }
        if self.leases[&lease].forgotten && self.leases[&lease].state == LeaseState::Active {
            self.dispose_forgotten(lease);
        }
        for waiting in self.acquirers(&session_id, Awaiting::Detach(request)) {
            self.advance(waiting, Resume::AfterDetach);
        }
    }

    pub(super) fn on_forget(&mut self, lease: LeaseId) {
        let Some(entry) = self.leases.get_mut(&lease) else {
            return;
        };
        match entry.state {
            LeaseState::Acquiring { .. } => {}
            LeaseState::Released | LeaseState::Invalidated => {
                self.leases.remove(&lease);
            }
            LeaseState::Releasing { .. } => entry.forgotten = true,
            LeaseState::Active => {
                entry.forgotten = true;
                self.dispose_forgotten(lease);
            }
        }
    }

    /// Disposes an active lease nobody waits for; if it cannot send (the
    /// session is not attached), it relinquishes the lease without a request.
    pub(super) fn dispose_forgotten(&mut self, lease: LeaseId) {
        if self.check_active(lease).is_ok() {
            self.start_release(lease, ReleaseKind::Dispose, Vec::new());
        } else {
            let session_id = self.leases[&lease].session_id.clone();
            self.lease_mut(lease).state = LeaseState::Released;
            assert!(self.session_mut(&session_id).holders.remove(&lease));
        }
    }
}
