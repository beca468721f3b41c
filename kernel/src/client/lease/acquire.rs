//! Acquiring a lease: ownership, reconciliation, one `attach` for
//! concurrent acquisitions.

use super::*;

impl Leases {
    pub(super) fn on_acquire(&mut self, call: CallId, session_id: String, mode: LeaseMode) {
        self.begin_call(call);
        if self.disposed {
            self.complete(call, Err(LeaseError::ClientDisposed));
            return;
        }
        if let Err(error) = self.check_ownership(&session_id, mode) {
            self.complete(call, Err(error));
            return;
        }
        let placeholder = LeaseState::Acquiring {
            call,
            awaiting: Awaiting::Attach,
        };
        let lease = self.reserve(session_id, mode, placeholder);
        self.advance(lease, Resume::Start);
    }

    /// The reference `#reserveSessionLease` checks.
    pub(super) fn check_ownership(
        &self,
        session_id: &str,
        mode: LeaseMode,
    ) -> Result<(), LeaseError> {
        let Some(session) = self.sessions.get(session_id) else {
            return Ok(());
        };
        let refused = match mode {
            LeaseMode::Exclusive => !session.holders.is_empty(),
            LeaseMode::Shared => session
                .holders
                .iter()
                .any(|id| self.leases[id].mode == LeaseMode::Exclusive),
        };
        if refused {
            Err(LeaseError::Ownership {
                session_id: session_id.to_owned(),
            })
        } else {
            Ok(())
        }
    }

    pub(super) fn reserve(
        &mut self,
        session_id: String,
        mode: LeaseMode,
        state: LeaseState,
    ) -> LeaseId {
        assert!(state.holds());
        self.lease_sequence += 1;
        let id = LeaseId(self.lease_sequence);
        let session = self.session_mut(&session_id);
        let generation = session.generation;
        assert!(session.holders.insert(id));
        let lease = Lease {
            session_id,
            mode,
            generation,
            state,
            forgotten: false,
        };
        assert!(self.leases.insert(id, lease).is_none());
        id
    }

    /// Moves an acquisition forward from `resume` until it waits or ends
    /// (reference `acquireSession` after the reservation).
    pub(super) fn advance(&mut self, lease: LeaseId, resume: Resume) {
        let session_id = self.leases[&lease].session_id.clone();
        let session = &self.sessions[&session_id];
        if resume == Resume::Start
            && let Some(request) = session.detaching
        {
            self.set_awaiting(lease, Awaiting::Detach(request));
            return;
        }
        let reconciled = resume == Resume::AfterReconcile;
        if !reconciled && session.cleanup_required {
            if session.reconciling.is_none() {
                let command = Command::Detach {
                    session_id: session_id.clone(),
                };
                let purpose = Purpose::Reconcile {
                    session_id: session_id.clone(),
                };
                match self.send(command, purpose) {
                    Ok(request) => self.session_mut(&session_id).reconciling = Some(request),
                    Err(error) => return self.fail_acquisition(lease, error),
                }
            }
            self.set_awaiting(lease, Awaiting::Reconcile);
            return;
        }
        if reconciled || !session.attached {
            if session.attaching.is_none() {
                let previous_revision = self.session_mut(&session_id).revision.take();
                let command = Command::Attach {
                    session_id: session_id.clone(),
                };
                let purpose = Purpose::Attach {
                    session_id: session_id.clone(),
                };
                match self.send(command, purpose) {
                    Ok(request) => {
                        self.session_mut(&session_id).attaching = Some(Attaching {
                            request,
                            reattach: false,
                            previous_revision,
                        });
                    }
                    Err(error) => {
                        self.session_mut(&session_id).revision = previous_revision;
                        return self.fail_acquisition(lease, error);
                    }
                }
            }
            self.set_awaiting(lease, Awaiting::Attach);
            return;
        }
        self.grant(lease);
    }

    pub(super) fn set_awaiting(&mut self, lease: LeaseId, next: Awaiting) {
        let LeaseState::Acquiring { awaiting, .. } = &mut self.lease_mut(lease).state else {
            unreachable!("only acquisitions wait")
        };
        *awaiting = next;
    }

    pub(super) fn grant(&mut self, lease: LeaseId) {
        let session_id = self.leases[&lease].session_id.clone();
        let generation = self.sessions[&session_id].generation;
        let entry = self.lease_mut(lease);
        let LeaseState::Acquiring { call, .. } = entry.state else {
            unreachable!("only acquisitions are granted")
        };
        entry.state = LeaseState::Active;
        entry.generation = generation;
        self.complete(call, Ok(Completion::Acquired { lease, session_id }));
    }

    pub(super) fn fail_acquisition(&mut self, lease: LeaseId, error: LeaseError) {
        let entry = self.leases.remove(&lease).expect("lease is known");
        let LeaseState::Acquiring { call, .. } = entry.state else {
            unreachable!("only acquisitions fail")
        };
        assert!(self.session_mut(&entry.session_id).holders.remove(&lease));
        self.complete(call, Err(error));
    }

    /// Acquisitions of `session_id` waiting for `awaiting`, in lease order.
    pub(super) fn acquirers(&self, session_id: &str, awaiting: Awaiting) -> Vec<LeaseId> {
        let Some(session) = self.sessions.get(session_id) else {
            return Vec::new();
        };
        session
            .holders
            .iter()
            .copied()
            .filter(|id| {
                matches!(self.leases[id].state, LeaseState::Acquiring { awaiting: a, .. } if a == awaiting)
            })
            .collect()
    }
}
