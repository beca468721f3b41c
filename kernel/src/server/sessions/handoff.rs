//! Hand-offs: a server that replaces this one takes its workers as they
//! are, and this one adopts the orphans of the one it replaced, holding
//! their sessions for the clients that followed them.

use super::*;

impl Server {
    /// A worker of a replaced or crashed server asks to be adopted.
    pub(in crate::server) fn on_worker_announced(
        &mut self,
        channel: ChannelId,
        session_id: String,
        pid: u64,
        version: u64,
        snapshot: PackedSnapshot,
    ) {
        let refusal = if self.shutting_down {
            Some("the server is shutting down".to_string())
        } else if snapshot.head().id != session_id {
            Some(format!(
                "its snapshot is of session {}, not {session_id}",
                snapshot.head().id
            ))
        } else if self.sessions.contains_key(&session_id) {
            Some(format!("session {session_id} is already live here"))
        } else {
            self.live_capacity_error().map(|e| e.message)
        };
        if let Some(reason) = refusal {
            return self.out.push(Output::RejectWorker { channel, reason });
        }
        let worker = self.fresh_worker_id();
        let dispose_timeout = self.config.limits.worker_dispose_timeout;
        let mut live = Live::new(
            session_id.clone(),
            Worker::adopted(worker, dispose_timeout),
            false,
        );
        live.phase = Phase::Ready;
        live.resends = version >= SNAPSHOT_REQUEST_VERSION;
        // A busy orphan streamed on while its hello travelled: a v1 attach
        // waits for a snapshot current as of the deltas that follow.
        live.progressed = snapshot.head().phase != SessionPhase::Idle;
        let stored = self.catalog.contains(&session_id);
        live.foreign = !stored;
        if live.foreign {
            self.catalog.insert(metadata_of(snapshot.head()));
        }
        live.snapshot = Some(LiveSnapshot::new(snapshot).expect("a hello's snapshot is whole"));
        self.sessions.insert(session_id.clone(), live);
        self.set_hold(
            &session_id,
            Some(self.now + self.config.limits.adoption_grace),
        );
        self.workers.insert(worker, session_id.clone());
        let _ = pid; // reported for logs by the driver; the kernel needs only the channel
        self.out.push(Output::AdoptWorker {
            channel,
            worker,
            session_id: session_id.clone(),
        });
        self.timers.set(Timer::Expected(session_id.clone()), None);
        let waiters = self
            .adoption_waiters
            .remove(&session_id)
            .unwrap_or_default();
        self.admit_waiters(&session_id, waiters);
        self.refresh_busy(&session_id);
        self.publish_server_snapshot();
        self.release_transcript(&session_id);
    }

    /// The workers of these sessions were released to us and will announce themselves.
    pub(in crate::server) fn on_adoptions_expected(&mut self, sessions: Vec<String>) {
        let until = self.now + self.config.limits.adoption_wait;
        for session_id in sessions {
            if !self.sessions.contains_key(&session_id) {
                self.timers.set(Timer::Expected(session_id), Some(until));
            }
        }
    }

    /// Expected workers that never announced themselves: open those sessions the usual way.
    pub(in crate::server) fn on_expected_deadlines(&mut self) {
        let now = self.now;
        let expired = self.timers.expired(now, |timer| match timer {
            Timer::Expected(session) => Some(session.clone()),
            _ => None,
        });
        for session_id in expired {
            self.timers.set(Timer::Expected(session_id.clone()), None);
            let waiters = self
                .adoption_waiters
                .remove(&session_id)
                .unwrap_or_default();
            let (ready, gone): (Vec<Waiter>, Vec<Waiter>) = waiters
                .into_iter()
                .partition(|w| self.conns.get(&w.conn).is_some_and(|c| c.is_ready()));
            for waiter in gone {
                self.finish_pending(waiter.conn);
            }
            if ready.is_empty() {
                continue;
            }
            if self.shutting_down || self.live_capacity_error().is_some() {
                for waiter in ready {
                    self.finish_pending(waiter.conn);
                    let message =
                        format!("Session {session_id} could not be opened now; try again");
                    self.respond_error(
                        waiter.conn,
                        waiter.request_id,
                        ErrorCode::SessionLocked,
                        message,
                    );
                }
                continue;
            }
            self.open(session_id, None, ready);
        }
    }

    /// A new server takes over: release every worker without stopping it.
    pub(in crate::server) fn on_handoff(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.out.push(Output::StopAccepting);
        let conns: Vec<ConnId> = self.conns.keys().copied().collect();
        for conn in conns {
            self.close(conn, CloseReason::Replaced);
        }
        let sessions: Vec<String> = self.sessions.keys().cloned().collect();
        for session_id in sessions {
            self.release(&session_id);
        }
    }

    /// Whether a ready session has work under way: a turn (or a compaction,
    /// a retry) its snapshot shows, or an operation on its way that may
    /// start one. A stop leaves such a session's worker running.
    pub(in crate::server) fn has_work(&self, session_id: &str) -> bool {
        self.sessions.get(session_id).is_some_and(|live| {
            live.phase == Phase::Ready
                && (!live.ops.is_empty()
                    || live
                        .snapshot
                        .as_ref()
                        .is_some_and(|s| s.phase != SessionPhase::Idle))
        })
    }

    /// Lets a live session's worker go on without this server: it becomes
    /// an orphan that the next server adopts (or that retires once idle).
    /// One still opening cannot be adopted: it is stopped.
    pub(in crate::server) fn release(&mut self, session_id: &str) {
        let live = self.remove_live(session_id);
        let worker = live.worker.id();
        self.workers.remove(&worker);
        for pending in live.ops.into_values() {
            if pending.request_id.is_empty() {
                continue; // a v8 prompt, answered at once: never counted in flight
            }
            self.finish_pending(pending.conn);
        }
        for waiter in &live.waiters {
            self.unpark(waiter);
        }
        match live.phase {
            // Not ready yet: nobody could adopt it; stop it.
            Phase::Opening => self.out.push(Output::KillWorker { worker }),
            _ => self.out.push(Output::ReleaseWorker { worker }),
        }
    }

    /// Adoption holds that ran out: those sessions may now be disposed when idle.
    pub(in crate::server) fn on_hold_deadlines(&mut self) {
        let now = self.now;
        let expired = self.timers.expired(now, |timer| match timer {
            Timer::Hold(session) => Some(session.clone()),
            _ => None,
        });
        for session_id in expired {
            self.set_hold(&session_id, None);
            self.maybe_dispose(&session_id);
        }
    }
}
