//! The server's invariants, checked after every step: all of them in debug
//! builds, what a step touched in release ones (fully every
//! `FULL_CHECK_INTERVAL` steps).

use super::*;

/// `assert!` as a value: returns the message as `Err` when `cond` fails.
macro_rules! ensure {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(format!($($message)+));
        }
    };
}

/// `assert_eq!` as a value.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($message:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            return Err(format!("{}: {left:?} != {right:?}", format!($($message)+)));
        }
    }};
}

impl Server {
    /// What `input` concerns, for the invariant check after its step (see
    /// [`FULL_CHECK_INTERVAL`]). Call before the step: a worker's session is
    /// looked up while the worker is still indexed.
    pub(super) fn scope_of(&self, input: &Input) -> Scope {
        match input {
            Input::Accepted { conn, .. }
            | Input::Presented { conn, .. }
            | Input::Received { conn, .. }
            | Input::Written { conn, .. }
            | Input::Disconnected { conn } => Scope::Touched {
                conn: Some(*conn),
                session: None,
            },
            Input::WorkerSpawned { worker, .. }
            | Input::WorkerSpawnFailed { worker, .. }
            | Input::FromWorker { worker, .. }
            | Input::WorkerExited { worker } => Scope::Touched {
                conn: None,
                session: self.workers.get(worker).cloned(),
            },
            Input::SessionRemoved { session_id, .. }
            | Input::WorkerHello { session_id, .. }
            | Input::WorkerAnnounced { session_id, .. } => Scope::Touched {
                conn: None,
                session: Some(session_id.clone()),
            },
            // These steps walk every connection or session anyway.
            Input::CatalogChanged | Input::CatalogUnwatched => Scope::Touched {
                conn: None,
                session: None,
            },
            Input::Tick
            | Input::CatalogLoaded { .. }
            | Input::CatalogScanned { .. }
            | Input::Shutdown
            | Input::HandoffRequested
            | Input::AdoptionsExpected { .. } => Scope::All,
        }
    }

    /// The invariant check at the end of a step: the full sweep in debug
    /// builds, after inputs that concern everything and every
    /// [`FULL_CHECK_INTERVAL`] steps; otherwise only what the input touched.
    pub(super) fn check_step(&self, scope: &Scope) {
        match scope {
            Scope::Touched { conn, session } if !self.steps.is_multiple_of(FULL_CHECK_INTERVAL) => {
                self.check_touched(*conn, session.as_deref());
            }
            _ => self.check_invariants(),
        }
    }

    /// Asserts the cross-machine invariants of every connection and live
    /// session. Runs at the end of every step in debug builds (every test and
    /// the simulator); in release builds every `FULL_CHECK_INTERVAL` (1,024)
    /// steps and after inputs that concern everything, with a check of only
    /// what each step touched in between.
    pub fn check_invariants(&self) {
        if let Err(broken) = self.invariants() {
            panic!("{broken}");
        }
    }

    /// [`Server::check_invariants`], as a value: the first broken one.
    pub(super) fn invariants(&self) -> Result<(), String> {
        let limits = &self.config.limits;
        for conn in self.conns.values() {
            self.check_connection(conn)?;
        }
        // Refused and failed connections stay (Closing) until the driver
        // reports them gone, so only the open ones are bounded.
        let open = self
            .conns
            .values()
            .filter(|c| c.stage != Stage::Closing)
            .count();
        ensure!(open <= limits.max_connections, "connection bound");
        self.check_counts()?;
        // With as many workers as sessions, each session's worker mapping
        // back to it makes the worker index exact.
        for live in self.sessions.values() {
            self.check_session(live)?;
        }
        for session in self.adoption_waiters.keys() {
            self.check_adoption(session)?;
        }
        self.check_timers()
    }

    /// The timer table holds exactly the deadlines of what the server holds:
    /// every connection awaiting hello has its handshake timer, and every
    /// live session's worker deadline and hold are mirrored.
    pub(super) fn check_timers(&self) -> Result<(), String> {
        ensure!(self.timers.is_consistent(), "timer indexes disagree");
        let (mut workers, mut holds) = (0, 0);
        for (timer, at) in self.timers.iter() {
            match timer {
                Timer::Handshake(conn) => {
                    let stage = self.conns.get(conn).map(|c| c.stage);
                    ensure!(
                        matches!(stage, Some(Stage::AwaitingHello | Stage::Handshaking)),
                        "{conn}: handshake timer while {stage:?}"
                    );
                }
                Timer::Worker(session) => {
                    workers += 1;
                    let due = self
                        .sessions
                        .get(session)
                        .and_then(|l| l.worker.next_deadline());
                    ensure_eq!(due, Some(at), "{session}: worker timer");
                }
                Timer::Hold(session) => {
                    holds += 1;
                    let due = self.sessions.get(session).and_then(|l| l.hold_until);
                    ensure_eq!(due, Some(at), "{session}: hold timer");
                }
                Timer::Expected(_) => {}
            }
        }
        let lives = self.sessions.values();
        let due_workers = lives.clone().filter(|l| l.worker.next_deadline().is_some());
        ensure_eq!(due_workers.count(), workers, "worker timers");
        ensure_eq!(
            lives.filter(|l| l.hold_until.is_some()).count(),
            holds,
            "hold timers"
        );
        for conn in self.conns.values() {
            if conn.stage == Stage::AwaitingHello {
                let timer = Timer::Handshake(conn.id);
                ensure!(
                    self.timers.contains(&timer),
                    "{}: no handshake timer",
                    conn.id
                );
            }
        }
        Ok(())
    }

    /// Asserts the invariants of what one step touched: the connection (with
    /// the back-references of its attachments and the state of the sessions
    /// it is attached to), the session, and the global counts. Its cost does
    /// not depend on how many connections the server has.
    pub(super) fn check_touched(&self, conn: Option<ConnId>, session: Option<&str>) {
        if let Err(broken) = self.touched_invariants(conn, session) {
            panic!("{broken}");
        }
    }

    /// [`Server::check_touched`], as a value: the first broken invariant.
    pub(super) fn touched_invariants(
        &self,
        conn: Option<ConnId>,
        session: Option<&str>,
    ) -> Result<(), String> {
        self.check_counts()?;
        if let Some(c) = conn.and_then(|id| self.conns.get(&id)) {
            self.check_connection(c)?;
            for id in &c.attached {
                if let Some(live) = self.sessions.get(id) {
                    live.check_invariants();
                }
            }
        }
        // A session's audience is checked from each connection's side (above,
        // on every step that touches the connection) and whole by the sweep:
        // walking it on each of the session's steps made every progress event
        // O(audience) twice, once to deliver and once to check.
        if let Some(id) = session {
            if let Some(live) = self.sessions.get(id) {
                self.check_session_state(live)?;
            }
            self.check_adoption(id)?;
        }
        Ok(())
    }

    /// Global bounds that cost O(1) to check.
    pub(super) fn check_counts(&self) -> Result<(), String> {
        ensure!(
            self.sessions.len() <= self.config.limits.max_live_sessions,
            "live session bound"
        );
        ensure_eq!(
            self.workers.len(),
            self.sessions.len(),
            "one worker per live session"
        );
        Ok(())
    }

    /// One connection: its bounds, its stage, and that every session it is
    /// attached to is live and attached to it.
    pub(super) fn check_connection(&self, conn: &Connection) -> Result<(), String> {
        let limits = &self.config.limits;
        ensure!(
            conn.queued_bytes <= limits.max_output_bytes_per_connection,
            "{}: output bound",
            conn.id
        );
        ensure!(
            conn.in_flight <= limits.max_requests_in_flight_per_connection,
            "{}: in flight",
            conn.id
        );
        ensure!(
            conn.attached.len() <= limits.max_attachments_per_connection,
            "{}: attachments",
            conn.id
        );
        ensure!(
            conn.deferred.len() <= limits.max_deferred_requests,
            "{}: deferred",
            conn.id
        );
        if let Some(v8) = &conn.v8 {
            ensure!(
                v8.active_len() <= limits.max_requests_in_flight_per_connection,
                "{}: v8 requests in flight",
                conn.id
            );
            let routed: Vec<&String> = v8.route.iter().map(|r| &r.session_id).collect();
            let attached: Vec<&String> = conn.attached.iter().collect();
            ensure_eq!(
                routed,
                attached,
                "{}: a v8 route is its one attachment",
                conn.id
            );
        }
        if conn.stage != Stage::Ready {
            ensure!(
                conn.attached.is_empty(),
                "{}: attached while {:?}",
                conn.id,
                conn.stage
            );
        }
        if matches!(conn.stage, Stage::Ready | Stage::Closing) {
            ensure!(
                !self.timers.contains(&Timer::Handshake(conn.id)),
                "{}: deadline after handshake",
                conn.id
            );
        }
        if self.shutting_down {
            ensure!(
                conn.stage == Stage::Closing,
                "{}: open connection during shutdown",
                conn.id
            );
        }
        for session in &conn.attached {
            let live = self.sessions.get(session);
            ensure!(
                live.is_some_and(|s| s.attached.contains(&conn.id)),
                "{}: dangling {session}",
                conn.id
            );
        }
        Ok(())
    }

    /// One live session: its own state, its entry in the worker index, and
    /// that every connection attached to it exists and is attached back.
    pub(super) fn check_session(&self, live: &Live) -> Result<(), String> {
        self.check_session_state(live)?;
        for conn in &live.attached {
            let c = self
                .conns
                .get(conn)
                .ok_or_else(|| format!("{}: attached {conn} does not exist", live.id))?;
            ensure!(
                c.attached.contains(&live.id),
                "{}: {conn} missing back-reference",
                live.id
            );
        }
        Ok(())
    }

    /// A live session's own state and its entry in the worker index: O(1)
    /// in its audience.
    pub(super) fn check_session_state(&self, live: &Live) -> Result<(), String> {
        live.check_invariants();
        ensure_eq!(
            self.workers.get(&live.worker.id()),
            Some(&live.id),
            "{}: worker index",
            live.id
        );
        Ok(())
    }

    /// Attaches waiting for an adoption of `session` wait for an expected,
    /// not yet live, session.
    pub(super) fn check_adoption(&self, session: &str) -> Result<(), String> {
        if self.adoption_waiters.contains_key(session) {
            ensure!(
                self.timers.contains(&Timer::Expected(session.to_owned())),
                "{session}: waiting for an adoption nobody expects"
            );
            ensure!(
                !self.sessions.contains_key(session),
                "{session}: live and still waiting for adoption"
            );
        }
        Ok(())
    }
}
