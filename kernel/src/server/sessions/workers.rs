//! What a session's worker reports: its start, hello, snapshots, answered
//! operations and exit, and how the session's state and its attached
//! connections follow.

use super::*;

impl Server {
    pub(in crate::server) fn session_of(&self, worker: WorkerId) -> Option<String> {
        self.workers.get(&worker).cloned()
    }

    pub(in crate::server) fn on_worker_spawned(&mut self, worker: WorkerId, token: String) {
        let Some(session_id) = self.session_of(worker) else {
            return;
        };
        self.step_worker(&session_id, WorkerInput::Spawned);
        let live = self.sessions.get_mut(&session_id).expect("indexed");
        if let Some(start) = &mut live.start {
            start.token = Some(token);
        }
    }

    /// A worker's hello: the worker of `session_id` that was spawned with
    /// this token and has not started gets its start; anything else is refused.
    pub(in crate::server) fn on_worker_hello(
        &mut self,
        channel: ChannelId,
        session_id: String,
        token: String,
        pid: u64,
    ) {
        let _ = pid; // reported for logs by the driver
        let live = self.sessions.get_mut(&session_id).filter(|live| {
            live.start
                .as_ref()
                .and_then(|s| s.token.as_deref())
                .is_some_and(|expected| token_eq(expected, &token))
        });
        let Some(live) = live else {
            let reason = format!("no worker of session {session_id} was given that token");
            return self.out.push(Output::RejectWorker { channel, reason });
        };
        let start = live.start.take().expect("matched above");
        self.out.push(Output::StartWorker {
            channel,
            worker: live.worker.id(),
            create: start.create,
            revision_floor: start.revision_floor,
        });
    }

    pub(in crate::server) fn on_worker_spawn_failed(&mut self, worker: WorkerId, error: String) {
        let Some(session_id) = self.session_of(worker) else {
            return;
        };
        let error = ProtocolError::new(
            ErrorCode::InternalError,
            format!("Could not start session worker: {error}"),
        );
        self.fail_session(&session_id, error);
        self.on_worker_exited(worker);
    }

    pub(in crate::server) fn on_worker_message(&mut self, worker: WorkerId, message: FromWorker) {
        let Some(session_id) = self.session_of(worker) else {
            return;
        };
        if let Some(revision) = message.snapshot().map(|s| s.head().revision) {
            let shown = self.shown_revisions.entry(session_id.clone()).or_default();
            *shown = (*shown).max(revision);
        }
        match message {
            FromWorker::Ready { snapshot } => self.on_worker_ready(&session_id, snapshot),
            FromWorker::Failed { error } => self.fail_session(&session_id, error),
            FromWorker::Snapshot { snapshot } => {
                if self.update_snapshot(&session_id, snapshot) {
                    self.broadcast_session(&session_id);
                    self.refresh_busy(&session_id);
                    self.maybe_dispose(&session_id);
                }
            }
            FromWorker::Progress { progress } => {
                let live = self.sessions.get_mut(&session_id).expect("indexed");
                live.progressed = true;
                if live.phase == Phase::Ready {
                    if live.v8.is_some() {
                        self.v8_on_progress(&session_id, &progress);
                    }
                    let live = &self.sessions[&session_id];
                    let to: Vec<ConnId> = live
                        .attached
                        .iter()
                        .copied()
                        .filter(|c| self.conns[c].v8.is_none())
                        .collect();
                    if !to.is_empty() {
                        let frame = self.progress_frame(&session_id, &progress);
                        self.broadcast_frame(&to, frame);
                    }
                }
            }
            FromWorker::OpDone { op, outcome } => self.on_op_done(&session_id, op, outcome),
            FromWorker::Approvals { approvals, policy } => {
                let live = self.sessions.get_mut(&session_id).expect("indexed");
                live.approvals = (approvals, policy);
                self.v8_on_approvals(&session_id);
            }
            FromWorker::Fatal { message } => {
                let error = ProtocolError::new(
                    ErrorCode::InternalError,
                    format!("Session runtime failed: {message}"),
                );
                self.fail_session(&session_id, error);
            }
        }
        self.release_transcript(&session_id);
    }

    /// Asks the session's worker for its snapshot, unless that is under way.
    pub(in crate::server) fn request_snapshot(&mut self, session_id: &str) {
        let live = self.sessions.get_mut(session_id).expect("live");
        debug_assert!(
            live.resends,
            "{session_id}: the transcript of a version 1 worker was let go"
        );
        if live.snapshot_requested {
            return;
        }
        live.snapshot_requested = true;
        let worker = live.worker.id();
        self.out.push(Output::ToWorker {
            worker,
            message: ToWorker::Snapshot,
        });
    }

    /// Admits waiters to a session that just became ready (opened or
    /// adopted) or got its transcript back.
    pub(in crate::server) fn admit_waiters(&mut self, session_id: &str, waiters: Vec<Waiter>) {
        for waiter in waiters {
            if self.sessions[session_id].phase != Phase::Ready {
                // Admitting an earlier waiter closed its connection (output
                // bound) and that disposed the session: the rest wait for the
                // worker to exit and reopen it, like attaches during Disposing.
                self.sessions
                    .get_mut(session_id)
                    .expect("live")
                    .waiters
                    .push(waiter);
                continue;
            }
            self.unpark(&waiter);
            self.admit(session_id, waiter);
        }
    }

    /// Lets go of the session's transcript at the end of the step that
    /// brought it, if it is longer than the server keeps
    /// ([`crate::limits::Limits::kept_transcript_bytes`]) and the worker can
    /// send it again.
    pub(in crate::server) fn release_transcript(&mut self, session_id: &str) {
        let keep = self.config.limits.kept_transcript_bytes;
        let Some(live) = self.sessions.get(session_id) else {
            return;
        };
        // A version 1 client attached, or waiting for an operation's
        // answer, is sent the whole transcript with the next snapshot.
        let v1 = |conn: &ConnId| {
            self.conns
                .get(conn)
                .is_some_and(|c| c.is_ready() && c.v8.is_none())
        };
        let v1_needs = live.attached.iter().any(v1) || live.ops.values().any(|op| v1(&op.conn));
        if let Some(live) = self.sessions.get_mut(session_id)
            && live.resends
            && !v1_needs
            && let Some(snapshot) = &mut live.snapshot
        {
            snapshot.release_transcript(keep);
        }
    }

    /// Takes a runtime snapshot if it is not older than the cached one, and
    /// admits the attaches that waited for its transcript. pi's states
    /// follow it first. Returns false for a snapshot that is stale or from
    /// the wrong phase.
    pub(in crate::server) fn update_snapshot(
        &mut self,
        session_id: &str,
        snapshot: PackedSnapshot,
    ) -> bool {
        let live = self.sessions.get_mut(session_id).expect("indexed");
        let head = snapshot.head();
        if live.phase != Phase::Ready || head.id != live.id {
            return false;
        }
        if live
            .snapshot
            .as_ref()
            .is_some_and(|s| s.revision > head.revision)
        {
            return false;
        }
        if head.phase != SessionPhase::Idle {
            for op in live.ops.values_mut() {
                op.turn_seen = true;
            }
        }
        let whole = snapshot.transcript().from() == 0;
        let tail = live.v8.is_some().then(|| snapshot.transcript().clone());
        let gap = match &mut live.snapshot {
            Some(kept) => kept.apply(snapshot).err(),
            None => LiveSnapshot::new(snapshot)
                .map(|new| live.snapshot = Some(new))
                .err(),
        };
        if let Some(gap) = gap {
            // Not expected: a worker's tails follow each other on its
            // channel. The transcript is asked for whole.
            debug_assert!(false, "{session_id}: a snapshot tail past the end: {gap:?}");
            live.snapshot_requested = false;
            self.request_snapshot(session_id);
            return true;
        }
        live.progressed = false;
        if let Some(tail) = tail {
            self.v8_on_snapshot(session_id, &tail);
        }
        let live = self.sessions.get_mut(session_id).expect("indexed");
        if !whole && !live.snapshot.as_ref().expect("set").has_transcript() {
            // A tail for a transcript let go: the waiters wait on.
            return true;
        }
        // A ready session's waiters wait for this transcript (`admit`).
        live.snapshot_requested = false;
        let waiters = std::mem::take(&mut live.waiters);
        self.admit_waiters(session_id, waiters);
        true
    }

    pub(in crate::server) fn on_worker_ready(
        &mut self,
        session_id: &str,
        snapshot: PackedSnapshot,
    ) {
        if self.sessions[session_id].phase != Phase::Opening
            || self.step_worker(session_id, WorkerInput::Ready) != Some(WorkerOutput::Started)
        {
            return;
        }
        let live = self.sessions.get_mut(session_id).expect("indexed");
        if snapshot.head().id != live.id {
            let message = format!(
                "Session runtime reported id {} for session {}",
                snapshot.head().id,
                live.id
            );
            return self.fail_session(
                session_id,
                ProtocolError::new(ErrorCode::InvalidRequest, message),
            );
        }
        live.phase = Phase::Ready;
        live.progressed = false;
        let tail = snapshot.transcript().clone();
        match LiveSnapshot::new(snapshot) {
            Ok(snapshot) => live.snapshot = Some(snapshot),
            Err(gap) => {
                let message =
                    format!("Session runtime started with a partial transcript ({gap:?})");
                return self.fail_session(
                    session_id,
                    ProtocolError::new(ErrorCode::InternalError, message),
                );
            }
        }
        if self.sessions[session_id].v8.is_some() {
            self.v8_on_snapshot(session_id, &tail);
        }
        let live = self.sessions.get_mut(session_id).expect("indexed");
        let waiters = std::mem::take(&mut live.waiters);
        let created = live.creating;
        live.creating = false;
        if created {
            let meta = metadata_of(self.sessions[session_id].snapshot.as_ref().expect("set"));
            self.catalog.insert(meta);
        }
        self.admit_waiters(session_id, waiters);
        if self.sessions[session_id].dispose_when_ready || self.shutting_down {
            self.dispose(session_id);
            return;
        }
        self.broadcast_session(session_id);
        self.refresh_busy(session_id);
        self.maybe_dispose(session_id);
        self.publish_server_snapshot();
    }

    pub(in crate::server) fn on_op_done(
        &mut self,
        session_id: &str,
        op: OpId,
        outcome: Result<PackedSnapshot, ProtocolError>,
    ) {
        let live = self.sessions.get_mut(session_id).expect("indexed");
        let Some(pending) = live.ops.remove(&op) else {
            return;
        };
        if !pending.request_id.is_empty() {
            self.finish_pending(pending.conn);
        }
        if pending.name.starts_with("v8.") {
            let outcome = match outcome {
                Ok(snapshot) => {
                    // pi's states follow it before the answer reads them.
                    self.update_snapshot(session_id, snapshot);
                    Ok(())
                }
                Err(e) => Err(e),
            };
            let (conn, name) = (pending.conn, pending.name);
            self.v8_op_done(session_id, conn, &pending.request_id, name, op, outcome);
        } else {
            self.answer_op(session_id, pending, outcome);
        }
        self.broadcast_session(session_id);
        self.refresh_busy(session_id);
        self.maybe_dispose(session_id);
    }

    /// Answers a v1 operation's request with the session as it stands.
    pub(in crate::server) fn answer_op(
        &mut self,
        session_id: &str,
        pending: PendingOp,
        outcome: Result<PackedSnapshot, ProtocolError>,
    ) {
        match outcome {
            Ok(snapshot) => {
                // Attaches waiting for the transcript are admitted first
                // (`update_snapshot`): the answer then says whether its
                // requester is attached as it stands.
                self.update_snapshot(session_id, snapshot);
                let live = &self.sessions[session_id];
                let attached = live.attached.contains(&pending.conn);
                let revision = live.snapshot.as_ref().expect("ready").revision;
                if let Some(c) = self.conns.get_mut(&pending.conn)
                    && attached
                {
                    c.take_revision(session_id, revision);
                }
                let (conn, request_id) = (pending.conn, pending.request_id);
                self.respond_with_session(conn, request_id, pending.name, session_id, attached);
            }
            Err(error) => self.respond(pending.conn, pending.request_id, Err(error)),
        }
    }

    /// Sends the current snapshot to every attached connection that has not seen it.
    pub(in crate::server) fn broadcast_session(&mut self, session_id: &str) {
        let Some(live) = self.sessions.get(session_id) else {
            return;
        };
        if live.phase != Phase::Ready {
            return;
        }
        let snapshot = live.snapshot.as_ref().expect("ready");
        let revision = snapshot.revision;
        let to: Vec<ConnId> = live
            .attached
            .iter()
            .copied()
            .filter(|c| self.conns[c].v8.is_none() && self.conns[c].is_news(session_id, revision))
            .collect();
        if to.is_empty() {
            return;
        }
        if !snapshot.has_transcript() {
            // Every attached connection is sent each snapshot in the step
            // that brings it, so this is not expected; ask again all the same.
            return self.request_snapshot(session_id);
        }
        for c in &to {
            let conn = self.conns.get_mut(c).expect("attached");
            conn.take_revision(session_id, revision);
        }
        let frame = self.session_snapshot_frame(session_id);
        self.broadcast_frame(&to, frame);
    }

    /// Answers a request with the session's snapshot (`command` names the
    /// result), normalised for a requester that is (or is not) attached.
    pub(in crate::server) fn respond_with_session(
        &mut self,
        conn: ConnId,
        request_id: String,
        command: &'static str,
        session_id: &str,
        attached: bool,
    ) {
        if self.conns.get(&conn).is_some_and(|c| c.is_ready()) {
            let frame = self.session_response_frame(&request_id, command, session_id, attached);
            self.send_encoded(conn, frame);
        }
    }

    /// The CBOR of a live session's snapshot normalised for an audience that
    /// is (or is not) attached, encoded once per snapshot (see [`LiveSnapshot`]).
    pub(in crate::server) fn session_cbor(
        &mut self,
        session_id: &str,
        attached: bool,
    ) -> Result<SnapshotPieces, String> {
        let live = self.sessions.get_mut(session_id).expect("live");
        let snapshot = live.snapshot.as_mut().expect("ready");
        snapshot.encoded(attached).map_err(|e| e.to_string())
    }

    /// The normal form of what [`Self::session_cbor`] encodes, for the
    /// comparison of debug builds.
    pub(in crate::server) fn session_normalised(
        &self,
        session_id: &str,
        attached: bool,
    ) -> SessionSnapshot {
        let snapshot = self.sessions[session_id].snapshot.as_ref();
        normalised(&snapshot.expect("ready").unpacked(), attached)
    }

    /// The response to `command` carrying the session's snapshot, built
    /// around its cached CBOR.
    pub(in crate::server) fn session_response_frame(
        &mut self,
        request_id: &str,
        command: &'static str,
        session_id: &str,
        attached: bool,
    ) -> Result<Frame, String> {
        let frame = self.session_cbor(session_id, attached).and_then(|cbor| {
            self.spliced_frame(spliced::encode_session_response(request_id, command, &cbor))
        });
        self.checked(frame, || {
            ServerMessage::Response(Response {
                id: request_id.to_string(),
                outcome: Ok(result_for(
                    command,
                    self.session_normalised(session_id, attached),
                )),
            })
        })
    }

    /// The session snapshot event of a session (to attached connections),
    /// built around its cached CBOR.
    pub(in crate::server) fn session_snapshot_frame(
        &mut self,
        session_id: &str,
    ) -> Result<Frame, String> {
        let frame = self
            .session_cbor(session_id, true)
            .and_then(|cbor| self.spliced_frame(spliced::encode_session_snapshot_event(&cbor)));
        self.checked(frame, || {
            ServerMessage::Event(ServerEvent::SessionSnapshot {
                snapshot: self.session_normalised(session_id, true),
            })
        })
    }

    pub(in crate::server) fn refresh_busy(&mut self, session_id: &str) {
        if let Some(live) = self.sessions.get(session_id) {
            let busy = live.is_busy();
            self.step_worker(session_id, WorkerInput::Busy(busy));
        }
    }

    /// Steps the session's worker machine and mirrors its deadline into the
    /// timer table.
    pub(in crate::server) fn step_worker(
        &mut self,
        session_id: &str,
        input: WorkerInput,
    ) -> Option<WorkerOutput> {
        let live = self.sessions.get_mut(session_id)?;
        let before = live.worker.next_deadline();
        let output = live.worker.step(self.now, input);
        let after = live.worker.next_deadline();
        if after != before {
            self.timers.set(Timer::Worker(session_id.to_owned()), after);
        }
        output
    }

    /// Sets or clears the adoption hold of a live session.
    pub(in crate::server) fn set_hold(&mut self, session_id: &str, until: Option<Instant>) {
        if let Some(live) = self.sessions.get_mut(session_id) {
            live.hold_until = until;
            self.timers.set(Timer::Hold(session_id.to_owned()), until);
        }
    }

    /// Forgets a live session and every timer of it.
    pub(in crate::server) fn remove_live(&mut self, session_id: &str) -> Live {
        let mut live = self.sessions.remove(session_id).expect("live");
        self.timers.set(Timer::Worker(session_id.to_owned()), None);
        self.timers.set(Timer::Hold(session_id.to_owned()), None);
        self.v8_session_gone(live.v8.take());
        live
    }

    /// Idle disposal: no attachments, nothing in flight, phase idle.
    pub(in crate::server) fn maybe_dispose(&mut self, session_id: &str) {
        let Some(live) = self.sessions.get(session_id) else {
            return;
        };
        let held = live.hold_until.is_some_and(|until| until > self.now);
        if self.shutting_down
            || live.phase != Phase::Ready
            || !live.attached.is_empty()
            || live.is_busy()
            || held
        {
            return;
        }
        self.dispose(session_id);
    }

    /// Retires the session's worker, whatever it is doing.
    pub(in crate::server) fn dispose(&mut self, session_id: &str) {
        let Some(live) = self.sessions.get_mut(session_id) else {
            return;
        };
        match live.phase {
            Phase::Opening => {
                live.dispose_when_ready = true;
                return;
            }
            Phase::Ready => live.phase = Phase::Disposing,
            Phase::Disposing | Phase::Terminal => {}
        }
        let attached: Vec<ConnId> = live.attached.iter().copied().collect();
        let worker = live.worker.id();
        let send =
            self.step_worker(session_id, WorkerInput::Retire) == Some(WorkerOutput::SendDispose);
        for conn in attached {
            self.detach(conn, session_id);
        }
        self.fail_ops(
            session_id,
            ProtocolError::new(ErrorCode::NotFound, not_live(session_id)),
        );
        if send {
            self.out.push(Output::ToWorker {
                worker,
                message: ToWorker::Dispose,
            });
        }
    }

    /// Runtime-error semantics: the session becomes terminal, every attached
    /// connection is closed, waiters and operations fail, the worker is retired.
    pub(in crate::server) fn fail_session(&mut self, session_id: &str, error: ProtocolError) {
        let Some(live) = self.sessions.get_mut(session_id) else {
            return;
        };
        if live.phase == Phase::Terminal {
            return;
        }
        let was_ready = live.phase == Phase::Ready;
        live.phase = Phase::Terminal;
        let waiters = std::mem::take(&mut live.waiters);
        let removing = std::mem::take(&mut live.removing);
        let (v8, attached): (Vec<ConnId>, Vec<ConnId>) = live
            .attached
            .iter()
            .partition(|c| self.conns[c].v8.is_some());
        for conn in attached {
            self.close(conn, CloseReason::RuntimeError);
        }
        for waiter in waiters {
            self.unpark(&waiter);
            self.refuse(waiter, error.clone());
        }
        for conn in removing.held {
            self.end_held(conn);
        }
        for (conn, request_id) in removing.requests {
            self.finish_pending(conn);
            self.respond(conn, request_id, Err(error.clone()));
        }
        let masked = if was_ready {
            ProtocolError::new(ErrorCode::InternalError, "Internal server error")
        } else {
            error
        };
        self.fail_ops(session_id, masked);
        // pi's worker-exit order for v8 clients: their calls fail, then
        // they hear that the route is gone; the connection stays.
        for conn in v8 {
            self.detach(conn, session_id);
        }
        if self.step_worker(session_id, WorkerInput::Retire) == Some(WorkerOutput::SendDispose) {
            let worker = self.sessions[session_id].worker.id();
            self.out.push(Output::ToWorker {
                worker,
                message: ToWorker::Dispose,
            });
        }
    }

    pub(in crate::server) fn fail_ops(&mut self, session_id: &str, error: ProtocolError) {
        let live = self.sessions.get_mut(session_id).expect("live");
        let ops = std::mem::take(&mut live.ops);
        for (op, pending) in ops {
            if !pending.request_id.is_empty() {
                self.finish_pending(pending.conn);
            }
            if pending.name.starts_with("v8.") {
                let (conn, name) = (pending.conn, pending.name);
                self.v8_op_done(
                    session_id,
                    conn,
                    &pending.request_id,
                    name,
                    op,
                    Err(error.clone()),
                );
            } else {
                self.respond(pending.conn, pending.request_id, Err(error.clone()));
            }
        }
    }

    pub(in crate::server) fn on_worker_exited(&mut self, worker: WorkerId) {
        let Some(session_id) = self.session_of(worker) else {
            return;
        };
        self.step_worker(&session_id, WorkerInput::Exited); // nothing more can be sent to it
        let phase = self.sessions[&session_id].phase;
        match phase {
            Phase::Opening => {
                let message = "Session worker exited before it was ready".to_string();
                self.fail_session(
                    &session_id,
                    ProtocolError::new(ErrorCode::InternalError, message),
                );
            }
            Phase::Ready => {
                let message = "Session worker exited unexpectedly".to_string();
                self.fail_session(
                    &session_id,
                    ProtocolError::new(ErrorCode::InternalError, message),
                );
            }
            Phase::Disposing | Phase::Terminal => {}
        }
        let mut live = self.remove_live(&session_id);
        self.workers.remove(&worker);
        if live.creating {
            // It may have stored the session before it failed: the directory
            // says whether it did, and a stored session is listed.
            let settle = self.config.limits.catalog_settle;
            self.catalog.changed(self.now, settle);
        }
        if live.foreign {
            self.catalog.remove(&session_id);
        } else if live.removing.is_empty()
            && let Some(snap) = &live.snapshot
            && let Some(stored) = self.catalog.get(&session_id)
        {
            let model = (snap.model.clone(), snap.thinking_level);
            self.stored_models.insert(session_id.clone(), model);
            // The list keeps showing what the session last reported (its
            // name, its last update), not what was stored when we started.
            let listed = listed_metadata(Some(stored), snap);
            if *stored != listed {
                self.catalog.insert(listed);
            }
        }
        if !live.removing.is_empty() {
            // Attaches that waited for this worker to exit cannot reopen a session being removed.
            for waiter in std::mem::take(&mut live.waiters) {
                self.unpark(&waiter);
                let message = format!("Session is being removed: {session_id}");
                self.refuse(waiter, ProtocolError::new(ErrorCode::NotFound, message));
            }
            self.removals
                .insert(session_id.clone(), std::mem::take(&mut live.removing));
            self.out.push(Output::RemoveSession { session_id });
        } else if !live.waiters.is_empty() && !self.shutting_down {
            self.open(session_id, None, live.waiters);
        } else {
            for waiter in live.waiters {
                self.unpark(&waiter);
                let message = "Server is shutting down".to_string();
                self.refuse(waiter, ProtocolError::new(ErrorCode::NotFound, message));
            }
            self.publish_server_snapshot();
        }
    }

    pub(in crate::server) fn on_worker_deadlines(&mut self) {
        let due = self.timers.expired(self.now, |timer| match timer {
            Timer::Worker(session) => Some(session.clone()),
            _ => None,
        });
        let mut expired = Vec::new();
        for session_id in due {
            if let Some(WorkerOutput::Expired(timeout)) =
                self.step_worker(&session_id, WorkerInput::Tick)
            {
                let worker = self.sessions[&session_id].worker.id();
                expired.push((session_id, worker, timeout));
            }
        }
        for (session_id, worker, timeout) in expired {
            self.out.push(Output::KillWorker { worker });
            if timeout == WorkerTimeout::Start {
                let secs = self.config.limits.worker_start_timeout.as_secs();
                let message = format!("Session worker did not start within {secs} s");
                self.fail_session(
                    &session_id,
                    ProtocolError::new(ErrorCode::InternalError, message),
                );
            }
        }
    }
}
