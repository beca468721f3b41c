//! Responses and events from the server: settling calls, following
//! attachment, invalidating leases of removed sessions.

use super::*;

impl Leases {
    pub(super) fn on_response(&mut self, response: Response) {
        if !self.connected {
            return;
        }
        let pending = parse_request_id(&response.id).and_then(|id| self.pending.remove(&id));
        let Some(pending) = pending else {
            let reason = "Response has no matching request".to_owned();
            return self.fail_connection(LeaseError::Protocol { reason }, None);
        };
        match response.outcome {
            Err(error) => self.request_failed(pending.purpose, &LeaseError::Server(error)),
            Ok(result) if result.name() != pending.command => {
                let reason = format!(
                    "Response command {} does not match {}",
                    result.name(),
                    pending.command
                );
                self.fail_connection(LeaseError::Protocol { reason }, Some(pending.purpose));
            }
            Ok(result) => {
                self.apply_result(&result);
                self.request_succeeded(pending.purpose, result);
            }
        }
    }

    pub(super) fn on_event(&mut self, event: ServerEvent) {
        if !self.connected {
            return;
        }
        match event {
            ServerEvent::SessionSnapshot { snapshot } => self.apply_snapshot(&snapshot),
            ServerEvent::SessionRemoved { session_id } => {
                self.invalidate_session(&session_id);
                if let Some(session) = self.sessions.get_mut(&session_id) {
                    session.attached = false;
                    session.revision = None;
                }
            }
            ServerEvent::ServerSnapshot { .. } | ServerEvent::SessionProgress { .. } => {}
        }
    }

    /// The reference `ClientState.applyResult`.
    pub(super) fn apply_result(&mut self, result: &CommandResult) {
        if let CommandResult::Detach { session_id } = result {
            if let Some(session) = self.sessions.get_mut(session_id) {
                session.attached = false;
            }
        } else if let Some(snapshot) = result.session() {
            self.apply_snapshot(snapshot);
        }
    }

    /// Applies a session snapshot unless it is older than the one applied.
    pub(super) fn apply_snapshot(&mut self, snapshot: &SessionSnapshot) {
        let session = self.session_mut(&snapshot.id);
        if session
            .revision
            .is_some_and(|revision| snapshot.revision < revision)
        {
            return;
        }
        session.revision = Some(snapshot.revision);
        session.attached = snapshot.attached;
    }

    pub(super) fn request_succeeded(&mut self, purpose: Purpose, result: CommandResult) {
        match purpose {
            Purpose::Attach { session_id } => {
                self.session_mut(&session_id).attaching = None;
                for lease in self.acquirers(&session_id, Awaiting::Attach) {
                    self.grant(lease);
                }
                self.release_held(&session_id);
            }
            Purpose::Reconcile { session_id } => {
                let session = self.session_mut(&session_id);
                session.reconciling = None;
                session.cleanup_required = false;
                for lease in self.acquirers(&session_id, Awaiting::Reconcile) {
                    self.advance(lease, Resume::AfterReconcile);
                }
            }
            Purpose::ReleaseDetach { lease } => self.release_settled(lease, Ok(())),
            Purpose::Create { call } => self.on_created(call, &result),
            Purpose::List { call } => {
                let sessions = match result {
                    CommandResult::List { sessions } => sessions,
                    _ => unreachable!("the command name was checked"),
                };
                self.complete(call, Ok(Completion::Sessions(sessions)));
            }
            Purpose::Command { call } => {
                let snapshot = result.session().expect("the command name was checked");
                self.complete(call, Ok(Completion::Session(Box::new(snapshot.clone()))));
            }
            Purpose::Call { call } => self.complete(call, Ok(Completion::Result(Box::new(result)))),
        }
    }

    /// `create` succeeded: reserve and grant an exclusive lease on the new id.
    pub(super) fn on_created(&mut self, call: CallId, result: &CommandResult) {
        let session_id = result
            .session()
            .expect("the command name was checked")
            .id
            .clone();
        if let Err(error) = self.check_ownership(&session_id, LeaseMode::Exclusive) {
            return self.complete(call, Err(error));
        }
        let lease = self.reserve(session_id.clone(), LeaseMode::Exclusive, LeaseState::Active);
        self.complete(call, Ok(Completion::Acquired { lease, session_id }));
    }

    pub(super) fn request_failed(&mut self, purpose: Purpose, error: &LeaseError) {
        match purpose {
            Purpose::Attach { session_id } => {
                let session = self.session_mut(&session_id);
                let attaching = session.attaching.take().expect("an attach is in flight");
                if session.revision.is_none() {
                    session.revision = attaching.previous_revision;
                }
                for lease in self.acquirers(&session_id, Awaiting::Attach) {
                    self.fail_acquisition(lease, error.clone());
                }
                // The session could not be re-attached after a reconnection
                // (removed meanwhile, say): its leases no longer hold.
                if attaching.reattach && *error != LeaseError::Disconnected {
                    self.invalidate_session(&session_id);
                }
                // The server answers them now (not attached, most likely).
                self.release_held(&session_id);
            }
            Purpose::Reconcile { session_id } => {
                self.session_mut(&session_id).reconciling = None;
                for lease in self.acquirers(&session_id, Awaiting::Reconcile) {
                    self.fail_acquisition(lease, error.clone());
                }
            }
            Purpose::ReleaseDetach { lease } => self.release_settled(lease, Err(error.clone())),
            Purpose::Create { call }
            | Purpose::List { call }
            | Purpose::Command { call }
            | Purpose::Call { call } => {
                self.complete(call, Err(error.clone()));
            }
        }
    }

    pub(super) fn collect_garbage(&mut self) {
        self.leases.retain(|_, lease| {
            !(lease.forgotten
                && matches!(lease.state, LeaseState::Released | LeaseState::Invalidated))
        });
        self.sessions.retain(|_, session| !session.is_idle());
    }
}
