//! The client library's session leases: which part of one client owns which
//! remote session, and when the connection has to `attach` or `detach`.
//!
//! Leases are purely client-side (the server knows nothing about them). This
//! machine reproduces the lease rules of the reference v1 `PiClient`
//! (`@earendil-works/pi-client` 0.84, `client.js`) as a sans-IO value: it owns
//! the request id sequence of one connection and the client's view of which
//! sessions it is attached to, and it decides every `attach`/`detach`.
//!
//! # Inputs and outputs
//!
//! [`Leases::step`] takes the time and one [`LeaseInput`] and returns every resulting
//! [`LeaseOutput`], in order:
//!
//! - API calls ([`LeaseInput::Acquire`], [`Create`](LeaseInput::Create),
//!   [`List`](LeaseInput::List), [`Release`](LeaseInput::Release),
//!   [`Command`](LeaseInput::Command)) carry a driver-chosen [`CallId`]. Each
//!   call is answered by exactly one [`LeaseOutput::Complete`] with that id:
//!   in the same step when no I/O is needed (refusals, no-op releases), or in
//!   the step of the response that settles it. Two releases of the same lease
//!   while its `detach` is in flight share that `detach` and complete together,
//!   with the same result.
//! - Connection life: [`LeaseInput::Connected`] (the server hello arrived),
//!   [`LeaseInput::Disconnected`], and [`LeaseInput::DisposeClient`].
//! - Server traffic: [`LeaseInput::Response`] and [`LeaseInput::Event`].
//! - [`LeaseOutput::Send`] asks the driver to send a request (ids `request-1`,
//!   `request-2`, … per machine, as the reference client numbers them), and
//!   [`LeaseOutput::CloseConnection`] asks it to close the transport (client
//!   disposal, or a response that violates the protocol).
//!
//! # The rules
//!
//! - **Ownership.** An exclusive lease is refused while any lease on that
//!   session exists in this client; a shared one is refused while an exclusive
//!   one exists. The refusal is [`LeaseError::Ownership`] and sends nothing. A
//!   lease is reserved in the step of its call, before any I/O, so a second
//!   call in the same instant already sees it.
//! - **Acquiring** first waits for an in-flight `detach` of a release on that
//!   session, then, if the session is marked "cleanup required", sends a
//!   reconciling `detach`, and then sends `attach` unless the client is already
//!   attached (always after a reconciliation). Concurrent acquisitions share one
//!   reconciliation and one `attach`.
//! - **Create** sends `create` and, on success, grants an exclusive lease on
//!   the new session id (the server attached this connection already).
//! - **Release.** `detach` is sent only when the last lease of the session is
//!   released; releasing one of several just drops it. A release that fails
//!   with [`ReleaseKind::Detach`] makes the lease active again; one that fails
//!   with [`ReleaseKind::Dispose`] relinquishes it anyway and marks the session
//!   "cleanup required". Either way the error is the call's result. Releasing
//!   a released or invalidated lease completes at once, sending nothing.
//! - **Invalidation.** `session_removed` for a session, a disconnect and the
//!   client's disposal bump the session's generation: every granted lease on
//!   it becomes invalidated, and its release completes as a no-op (an in-flight
//!   one when its response comes or the connection drops). A disconnect also
//!   clears every cleanup mark and fails every pending request.
//! - **Commands** (prompt, steer, abort, set_model, set_thinking) are sent
//!   only for an active lease on an attached session: otherwise
//!   [`LeaseError::ClientDisposed`], [`LeaseError::Disconnected`] or
//!   [`LeaseError::Detached`], in that order of precedence.
//! - **Disposal of the client** fails every pending call, closes the
//!   connection and invalidates every lease without sending `detach`.
//!
//! # Invariants
//!
//! [`Leases::invariants`] runs at the end of every step and asserts, among
//! others: at most one exclusive holder per session and never mixed with
//! shared ones; a release's `detach` is in flight only while no other lease on
//! that session is granted; every acquisition waits on a request that is in
//! flight; every outstanding call is owned by exactly one waiting place; and
//! while disconnected nothing is pending, held, attached or marked.
//!
//! # Deliberate differences from the reference
//!
//! - An acquisition still waiting for its `attach` keeps its reservation when
//!   the session is invalidated (the reference forgets the count, so a second
//!   exclusive lease could be granted beside it).
//! - The settling of an invalidated lease's `detach` never touches the
//!   reservations of newer leases on the same session.
//! - [`LeaseInput::Forget`] (the driver dropped its handle) has no reference
//!   counterpart: it disposes a still-held lease without a waiter and lets the
//!   machine drop the lease's record, so the lease table stays bounded.

#![warn(missing_docs)]

use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::protocol::{
    Command, CommandResult, CreateParams, ModelRef, ProtocolError, Request, Response, ServerEvent,
    SessionMetadata, SessionSnapshot, ThinkingLevel,
};

/// A driver-chosen token naming one API call; its [`LeaseOutput::Complete`]
/// carries it back. It must not be reused while the call is outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId(pub u64);

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// A lease, numbered by the machine when it reserves it (`L1`, `L2`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

/// How a lease shares its session with other leases of this client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseMode {
    /// The only lease on the session.
    Exclusive,
    /// One of any number of shared leases on the session.
    Shared,
}

/// Which release a caller asked for; they differ only when `detach` fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReleaseKind {
    /// On failure the lease becomes active again.
    Detach,
    /// On failure the lease is relinquished anyway and the session is marked
    /// for a reconciling `detach` before its next `attach`.
    Dispose,
}

/// A session command sent on behalf of a lease.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionCommand {
    /// `prompt`: run a turn.
    Prompt {
        /// The user's text.
        text: String,
    },
    /// `steer`: queue text into the running turn.
    Steer {
        /// The user's text.
        text: String,
    },
    /// `abort`: end the running turn.
    Abort,
    /// `set_model`: select a model.
    SetModel {
        /// The model to select.
        model: ModelRef,
    },
    /// `set_thinking`: select a thinking level.
    SetThinking {
        /// The level to select.
        thinking_level: ThinkingLevel,
    },
}

impl SessionCommand {
    /// The protocol command addressing `session_id`.
    fn into_command(self, session_id: String) -> Command {
        match self {
            Self::Prompt { text } => Command::Prompt { session_id, text },
            Self::Steer { text } => Command::Steer { session_id, text },
            Self::Abort => Command::Abort { session_id },
            Self::SetModel { model } => Command::SetModel { session_id, model },
            Self::SetThinking { thinking_level } => Command::SetThinking {
                session_id,
                thinking_level,
            },
        }
    }
}

/// One input to [`Leases::step`].
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseInput {
    /// The connection completed its handshake. Resets the view of attached
    /// sessions. Ignored while connected or after disposal.
    Connected,
    /// The connection closed for good. Ignored while neither connected nor
    /// suspended.
    Disconnected,
    /// The connection closed and the driver is reconnecting: granted leases
    /// keep their reservation, and the next [`LeaseInput::Connected`]
    /// re-attaches every session that a lease holds (or that the client had
    /// attached by a plain request). Requests in flight fail with
    /// [`LeaseError::Disconnected`], except prompts, which are handed back
    /// as [`LeaseOutput::Orphaned`]. Ignored while not connected.
    Suspend,
    /// The application disposed the client. Idempotent.
    DisposeClient,
    /// Acquire a lease on an existing session (`attachSession` is `Shared`).
    Acquire {
        /// Completion token.
        call: CallId,
        /// The session to lease.
        session_id: String,
        /// Exclusive or shared.
        mode: LeaseMode,
    },
    /// Create a session and acquire an exclusive lease on it.
    Create {
        /// Completion token.
        call: CallId,
        /// Options of `create`.
        params: CreateParams,
    },
    /// List stored sessions (the request id sequence is this machine's).
    List {
        /// Completion token.
        call: CallId,
    },
    /// Send any command outside the lease rules (the plain client API); its
    /// result completes as [`Completion::Result`]. Snapshots it returns are
    /// applied like any other.
    Request {
        /// Completion token.
        call: CallId,
        /// The command.
        command: Command,
    },
    /// Release a lease (`detach()` or `dispose()` of the handle).
    Release {
        /// Completion token.
        call: CallId,
        /// The lease to release.
        lease: LeaseId,
        /// What a failure does to the lease.
        kind: ReleaseKind,
    },
    /// Send a session command on behalf of a lease.
    Command {
        /// Completion token.
        call: CallId,
        /// The lease the command acts through.
        lease: LeaseId,
        /// The command.
        command: SessionCommand,
    },
    /// The driver dropped its handle of a lease: a held lease is disposed
    /// without a waiter, and the machine forgets the lease once it has ended.
    Forget {
        /// The lease whose handle was dropped.
        lease: LeaseId,
    },
    /// A response frame from the server. Ignored while not connected.
    Response(Response),
    /// An event frame from the server. Ignored while not connected.
    Event(ServerEvent),
}

/// One output of [`Leases::step`], to be carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseOutput {
    /// Send this request on the connection.
    Send(Request),
    /// An API call finished.
    Complete {
        /// The call's token.
        call: CallId,
        /// What it produced.
        result: Result<Completion, LeaseError>,
    },
    /// Close the transport; the machine already treats the connection as gone.
    CloseConnection {
        /// Why: [`LeaseError::ClientDisposed`] or [`LeaseError::Protocol`].
        error: LeaseError,
    },
    /// [`LeaseInput::Suspend`] found this prompt in flight. Whether the
    /// server ran it cannot be known from here: the call is handed to the
    /// driver, which completes it (the machine no longer counts it).
    Orphaned {
        /// The prompt's call.
        call: CallId,
        /// The request as it was sent.
        request: Request,
    },
}

/// The successful result of an API call.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// `Acquire` or `Create` granted a lease.
    Acquired {
        /// The new lease.
        lease: LeaseId,
        /// The session it holds (for `Create`, the id the server assigned).
        session_id: String,
    },
    /// `Release` finished (or had nothing to do).
    Released,
    /// A session command's resulting snapshot.
    Session(Box<SessionSnapshot>),
    /// `List`'s sessions.
    Sessions(Vec<SessionMetadata>),
    /// A plain [`LeaseInput::Request`]'s result.
    Result(Box<CommandResult>),
}

/// Why an API call failed. Mirrors the reference client's error classes.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseError {
    /// `PiSessionOwnershipError`: the requested lease conflicts with one this
    /// client already holds or is acquiring. Nothing was sent.
    Ownership {
        /// The contested session.
        session_id: String,
    },
    /// `PiSessionDetachedError`: the lease is not active or the session is not
    /// attached.
    Detached {
        /// The lease's session.
        session_id: String,
    },
    /// `PiDisconnectedError`: the client is not connected, or the connection
    /// closed while the call was pending.
    Disconnected,
    /// `PiClientDisposedError`: the client has been disposed.
    ClientDisposed,
    /// `PiServerError`: the server answered `ok:false`.
    Server(ProtocolError),
    /// `ProtocolValidationError`: the server broke the protocol, and the
    /// connection was failed.
    Protocol {
        /// What was wrong.
        reason: String,
    },
    /// Host misuse: the lease id was never granted or has been forgotten.
    UnknownLease {
        /// The id the driver passed.
        lease: LeaseId,
    },
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ownership { session_id } => {
                write!(f, "session {session_id} is already leased in this client")
            }
            Self::Detached { session_id } => write!(f, "session {session_id} is not attached"),
            Self::Disconnected => f.write_str("client is disconnected"),
            Self::ClientDisposed => f.write_str("client is disposed"),
            Self::Server(error) => {
                write!(f, "server error {}: {}", error.code.as_str(), error.message)
            }
            Self::Protocol { reason } => write!(f, "protocol violation: {reason}"),
            Self::UnknownLease { lease } => write!(f, "unknown lease {lease}"),
        }
    }
}

impl std::error::Error for LeaseError {}

/// The life stage of a lease, as [`Leases::status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseStatus {
    /// Reserved; waiting for a `detach`, a reconciliation or an `attach`.
    Acquiring,
    /// Granted and not being released.
    Active,
    /// Its `detach` is in flight.
    Releasing,
    /// Released by this client.
    Released,
    /// Invalidated by `session_removed`, a disconnect or the client's disposal.
    Invalidated,
}

/// What an acquisition waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    /// The `detach` (this request) of a release on the same session.
    Detach(u64),
    /// The session's reconciling `detach`.
    Reconcile,
    /// The session's `attach`.
    Attach,
}

/// Where an acquisition resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    /// Just reserved.
    Start,
    /// The awaited release `detach` settled (either way).
    AfterDetach,
    /// The reconciling `detach` succeeded: `attach` unconditionally.
    AfterReconcile,
}

#[derive(Debug, Clone, PartialEq)]
enum LeaseState {
    Acquiring {
        call: CallId,
        awaiting: Awaiting,
    },
    Active,
    /// `invalidated`: the lease no longer holds; its waiters still complete
    /// (as no-ops) when `request` settles.
    Releasing {
        kind: ReleaseKind,
        request: u64,
        waiters: Vec<CallId>,
        invalidated: bool,
    },
    Released,
    Invalidated,
}

impl LeaseState {
    /// True while the lease counts against ownership.
    fn holds(&self) -> bool {
        matches!(
            self,
            Self::Acquiring { .. }
                | Self::Active
                | Self::Releasing {
                    invalidated: false,
                    ..
                }
        )
    }

    fn status(&self) -> LeaseStatus {
        match self {
            Self::Acquiring { .. } => LeaseStatus::Acquiring,
            Self::Active => LeaseStatus::Active,
            Self::Releasing {
                invalidated: false, ..
            } => LeaseStatus::Releasing,
            Self::Releasing {
                invalidated: true, ..
            }
            | Self::Invalidated => LeaseStatus::Invalidated,
            Self::Released => LeaseStatus::Released,
        }
    }
}

#[derive(Debug, Clone)]
struct Lease {
    session_id: String,
    mode: LeaseMode,
    /// The session generation when the lease was granted.
    generation: u64,
    state: LeaseState,
    /// The driver dropped its handle: drop the record once the lease ended.
    forgotten: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Attaching {
    request: u64,
    /// Sent by a reconnection on behalf of the leases already granted: if
    /// it fails, they are invalidated.
    reattach: bool,
    /// The snapshot revision forgotten when the `attach` was sent, restored
    /// if it fails and nothing newer arrived (reference `#attachSession`).
    previous_revision: Option<u64>,
}

/// Everything the client knows about one session id.
#[derive(Debug, Clone, Default)]
struct Session {
    /// Bumped by every invalidation.
    generation: u64,
    /// Leases that count against ownership (acquiring, active, releasing).
    holders: BTreeSet<LeaseId>,
    /// The client's view: the last applied snapshot said `attached`.
    attached: bool,
    /// Revision of the last applied session snapshot.
    revision: Option<u64>,
    /// A dispose failed: reconcile with `detach` before the next `attach`.
    cleanup_required: bool,
    attaching: Option<Attaching>,
    reconciling: Option<u64>,
    /// The `detach` of the latest release on this session.
    detaching: Option<u64>,
    /// Attached by plain requests (no lease) when the connection was
    /// suspended: re-attach on reconnection.
    reattach: bool,
}

impl Session {
    fn is_idle(&self) -> bool {
        self.holders.is_empty()
            && !self.attached
            && self.revision.is_none()
            && !self.cleanup_required
            && self.attaching.is_none()
            && self.reconciling.is_none()
            && self.detaching.is_none()
            && !self.reattach
    }
}

/// Why a request was sent: who its response settles.
#[derive(Debug, Clone, PartialEq)]
enum Purpose {
    Attach { session_id: String },
    Reconcile { session_id: String },
    ReleaseDetach { lease: LeaseId },
    Create { call: CallId },
    List { call: CallId },
    Command { call: CallId },
    Call { call: CallId },
}

#[derive(Debug, Clone)]
struct Pending {
    /// `Command::name()` of the request, checked against the result.
    command: &'static str,
    /// The session the command addresses, if any.
    session_id: Option<String>,
    /// The text of a `prompt` (kept to hand it back on suspension).
    prompt: Option<String>,
    purpose: Purpose,
}

/// The lease machine of one client connection. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct Leases {
    connected: bool,
    /// Between [`LeaseInput::Suspend`] and the next `Connected` (or the
    /// final `Disconnected`).
    suspended: bool,
    disposed: bool,
    request_sequence: u64,
    lease_sequence: u64,
    pending: BTreeMap<u64, Pending>,
    sessions: BTreeMap<String, Session>,
    leases: BTreeMap<LeaseId, Lease>,
    /// Calls taken in and not yet completed.
    outstanding: BTreeSet<CallId>,
    /// Requests about a session being re-attached after a reconnection,
    /// held until that `attach` is answered: sent before it, the server
    /// would judge them on a connection not attached yet.
    held: Vec<(String, CallId, Command, Purpose)>,
    /// The time of the latest step (the machine has no timers of its own:
    /// reconnect timing is the client machine's).
    now: Instant,
    /// Outputs of the current step.
    outputs: Vec<LeaseOutput>,
}

/// The wire id of request number `sequence`.
fn request_id(sequence: u64) -> String {
    format!("request-{sequence}")
}

/// The inverse of [`request_id`], strict (no sign, no leading zeros).
fn parse_request_id(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("request-")?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if canonical { digits.parse().ok() } else { None }
}

impl Leases {
    /// A disconnected client with no leases.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one input at `now` and returns everything it causes, in order.
    ///
    /// # Panics
    ///
    /// If time goes back or an API call reuses a [`CallId`] that is still
    /// outstanding (host misuse), or if an invariant breaks (a bug in this
    /// machine).
    pub fn step(&mut self, now: Instant, input: LeaseInput) -> Vec<LeaseOutput> {
        assert!(self.outputs.is_empty());
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        self.now = now;
        match input {
            LeaseInput::Connected => self.on_connected(),
            LeaseInput::Disconnected => self.on_disconnected(),
            LeaseInput::Suspend => self.on_suspend(),
            LeaseInput::DisposeClient => self.on_dispose_client(),
            LeaseInput::Acquire {
                call,
                session_id,
                mode,
            } => {
                self.on_acquire(call, session_id, mode);
            }
            LeaseInput::Create { call, params } => {
                self.begin_call(call);
                self.request_for_call(call, Command::Create(params), Purpose::Create { call });
            }
            LeaseInput::List { call } => {
                self.begin_call(call);
                self.request_for_call(call, Command::List, Purpose::List { call });
            }
            LeaseInput::Request { call, command } => {
                self.begin_call(call);
                self.request_for_call(call, command, Purpose::Call { call });
            }
            LeaseInput::Release { call, lease, kind } => self.on_release(call, lease, kind),
            LeaseInput::Command {
                call,
                lease,
                command,
            } => self.on_command(call, lease, command),
            LeaseInput::Forget { lease } => self.on_forget(lease),
            LeaseInput::Response(response) => self.on_response(response),
            LeaseInput::Event(event) => self.on_event(event),
        }
        self.collect_garbage();
        self.invariants();
        std::mem::take(&mut self.outputs)
    }

    /// True between [`LeaseInput::Connected`] and the connection's end.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// True between [`LeaseInput::Suspend`] and the reconnection.
    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// True after [`LeaseInput::DisposeClient`].
    pub fn is_disposed(&self) -> bool {
        self.disposed
    }

    /// The stage of a lease; `None` for unknown (or forgotten) ids.
    pub fn status(&self, lease: LeaseId) -> Option<LeaseStatus> {
        self.leases.get(&lease).map(|l| l.state.status())
    }

    /// The reference handle's `active`: granted, not being released, and the
    /// client is attached to its session.
    pub fn is_active(&self, lease: LeaseId) -> bool {
        self.leases
            .get(&lease)
            .is_some_and(|l| l.state == LeaseState::Active && self.is_attached(&l.session_id))
    }

    /// The session a lease holds (or held).
    pub fn session_of(&self, lease: LeaseId) -> Option<&str> {
        self.leases.get(&lease).map(|l| l.session_id.as_str())
    }

    /// How many leases count against ownership of `session_id` (acquiring,
    /// active or releasing).
    pub fn holder_count(&self, session_id: &str) -> usize {
        self.sessions.get(session_id).map_or(0, |s| s.holders.len())
    }

    /// True if the last session snapshot the client applied says attached.
    pub fn is_attached(&self, session_id: &str) -> bool {
        self.sessions.get(session_id).is_some_and(|s| s.attached)
    }

    /// True if the next acquisition of `session_id` first sends a
    /// reconciling `detach`.
    pub fn cleanup_required(&self, session_id: &str) -> bool {
        self.sessions
            .get(session_id)
            .is_some_and(|s| s.cleanup_required)
    }

    /// Number of requests sent and not yet answered.
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Calls taken and not yet completed.
    pub fn outstanding_calls(&self) -> usize {
        self.outstanding.len()
    }

    /// Sessions held: attached, being attached or released, or to be
    /// re-attached or reconciled.
    pub fn sessions_held(&self) -> usize {
        self.sessions.len()
    }

    // ---- connection life ----

    fn on_connected(&mut self) {
        if self.disposed || self.connected {
            return;
        }
        self.connected = true;
        let resumed = std::mem::take(&mut self.suspended);
        for session in self.sessions.values_mut() {
            session.attached = false;
            session.revision = None;
        }
        if !resumed {
            return;
        }
        let ids: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.reattach || !s.holders.is_empty())
            .map(|(id, _)| id.clone())
            .collect();
        for session_id in ids {
            self.session_mut(&session_id).reattach = false;
            let command = Command::Attach {
                session_id: session_id.clone(),
            };
            let purpose = Purpose::Attach {
                session_id: session_id.clone(),
            };
            let request = self.send(command, purpose).expect("connected");
            self.session_mut(&session_id).attaching = Some(Attaching {
                request,
                reattach: true,
                previous_revision: None,
            });
        }
    }

    fn on_disconnected(&mut self) {
        if self.connected {
            self.disconnect(&LeaseError::Disconnected, None);
        } else if self.suspended {
            self.suspended = false;
            for session in self.sessions.values_mut() {
                session.reattach = false;
            }
            self.invalidate_all();
        }
    }

    /// The connection is gone and the driver reconnects: settle what was in
    /// flight, keep the granted leases (see [`LeaseInput::Suspend`]).
    fn on_suspend(&mut self) {
        if !self.connected {
            return;
        }
        self.connected = false;
        self.suspended = true;
        // Plain attachments are re-established unless a plain detach or
        // remove of that session was in flight.
        let leaving: BTreeSet<String> = self
            .pending
            .values()
            .filter(|p| matches!(p.command, "detach" | "remove"))
            .filter_map(|p| p.session_id.clone())
            .collect();
        for (session_id, session) in &mut self.sessions {
            let attaching = session.attached || session.attaching.is_some_and(|a| a.reattach);
            session.reattach =
                attaching && session.holders.is_empty() && !leaving.contains(session_id);
            session.attached = false;
            session.cleanup_required = false;
        }
        self.fail_held(&LeaseError::Disconnected);
        let pending = std::mem::take(&mut self.pending);
        for (sequence, request) in pending {
            match (&request.purpose, request.prompt) {
                (Purpose::Command { call } | Purpose::Call { call }, Some(text)) => {
                    let call = *call;
                    assert!(self.outstanding.remove(&call));
                    let session_id = request.session_id.expect("a prompt names its session");
                    let request = Request {
                        id: request_id(sequence),
                        command: Command::Prompt { session_id, text },
                    };
                    self.outputs.push(LeaseOutput::Orphaned { call, request });
                }
                // The new connection is not attached: the release is done.
                (Purpose::ReleaseDetach { lease }, _) => {
                    let lease = *lease;
                    self.release_settled(lease, Ok(()));
                }
                _ => self.request_failed(request.purpose, &LeaseError::Disconnected),
            }
        }
        assert!(self.pending.is_empty());
    }

    fn on_dispose_client(&mut self) {
        if self.disposed {
            return;
        }
        self.disposed = true;
        if self.connected || self.suspended {
            self.outputs.push(LeaseOutput::CloseConnection {
                error: LeaseError::ClientDisposed,
            });
        }
        self.connected = false;
        self.suspended = false;
        for session in self.sessions.values_mut() {
            session.attached = false;
            session.revision = None;
            session.reattach = false;
        }
        self.invalidate_all();
        let pending = std::mem::take(&mut self.pending);
        for (_, request) in pending {
            self.request_failed(request.purpose, &LeaseError::ClientDisposed);
        }
        assert!(self.sessions.values().all(|s| s.holders.is_empty()));
    }

    /// The connection is gone: state first (attachments, invalidation), then
    /// the continuations of the failed requests, `first` before the others
    /// (as the reference's promise rejections run after its synchronous
    /// disconnect handling).
    fn disconnect(&mut self, error: &LeaseError, first: Option<Purpose>) {
        assert!(self.connected);
        self.connected = false;
        for session in self.sessions.values_mut() {
            session.attached = false;
            session.reattach = false;
        }
        self.invalidate_all();
        self.fail_held(error);
        let pending = std::mem::take(&mut self.pending);
        if let Some(purpose) = first {
            self.request_failed(purpose, error);
        }
        for (_, request) in pending {
            self.request_failed(request.purpose, error);
        }
        assert!(self.pending.is_empty());
    }

    fn fail_connection(&mut self, error: LeaseError, first: Option<Purpose>) {
        self.outputs.push(LeaseOutput::CloseConnection {
            error: error.clone(),
        });
        self.disconnect(&error, first);
    }

    /// Bumps the generation of every session and clears every cleanup mark.
    fn invalidate_all(&mut self) {
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        for session_id in ids {
            self.invalidate_session(&session_id);
        }
        assert!(self.sessions.values().all(|s| !s.cleanup_required));
    }

    /// Bumps the session's generation: granted leases become invalidated
    /// (acquisitions keep their reservation), and the cleanup mark goes.
    fn invalidate_session(&mut self, session_id: &str) {
        let Some(session) = self.sessions.get_mut(session_id) else {
            return;
        };
        session.generation += 1;
        session.cleanup_required = false;
        let holders: Vec<LeaseId> = session.holders.iter().copied().collect();
        for id in holders {
            let lease = self.leases.get_mut(&id).expect("holders are known leases");
            match &mut lease.state {
                LeaseState::Acquiring { .. } => continue,
                LeaseState::Active => lease.state = LeaseState::Invalidated,
                LeaseState::Releasing { invalidated, .. } => *invalidated = true,
                LeaseState::Released | LeaseState::Invalidated => {
                    unreachable!("ended leases do not hold")
                }
            }
            session.holders.remove(&id);
        }
    }

    // ---- calls and requests ----

    fn begin_call(&mut self, call: CallId) {
        assert!(
            self.outstanding.insert(call),
            "call {call} is still outstanding"
        );
    }

    fn complete(&mut self, call: CallId, result: Result<Completion, LeaseError>) {
        assert!(
            self.outstanding.remove(&call),
            "call {call} completed twice"
        );
        self.outputs.push(LeaseOutput::Complete { call, result });
    }

    /// Sends a request, or says why it cannot be sent (reference `#request`).
    fn send(&mut self, command: Command, purpose: Purpose) -> Result<u64, LeaseError> {
        if self.disposed {
            return Err(LeaseError::ClientDisposed);
        }
        if !self.connected {
            return Err(LeaseError::Disconnected);
        }
        self.request_sequence += 1;
        let sequence = self.request_sequence;
        let prompt = match &command {
            Command::Prompt { text, .. } => Some(text.clone()),
            _ => None,
        };
        let previous = self.pending.insert(
            sequence,
            Pending {
                command: command.name(),
                session_id: command.session_id().map(str::to_owned),
                prompt,
                purpose,
            },
        );
        assert!(previous.is_none());
        self.outputs.push(LeaseOutput::Send(Request {
            id: request_id(sequence),
            command,
        }));
        Ok(sequence)
    }

    fn request_for_call(&mut self, call: CallId, command: Command, purpose: Purpose) {
        if let Some(session_id) = command.session_id()
            && self
                .sessions
                .get(session_id)
                .and_then(|s| s.attaching)
                .is_some_and(|a| a.reattach)
        {
            let session_id = session_id.to_owned();
            self.held.push((session_id, call, command, purpose));
            return;
        }
        if let Err(error) = self.send(command, purpose) {
            self.complete(call, Err(error));
        }
    }

    /// Sends the requests held for `session_id`'s re-attachment, in order.
    fn release_held(&mut self, session_id: &str) {
        let (ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(s, ..)| s == session_id);
        self.held = rest;
        for (_, call, command, purpose) in ready {
            self.request_for_call(call, command, purpose);
        }
    }

    /// Held requests never reached the server: they fail with `error`.
    fn fail_held(&mut self, error: &LeaseError) {
        for (_, _, _, purpose) in std::mem::take(&mut self.held) {
            self.request_failed(purpose, error);
        }
    }

    fn session_mut(&mut self, session_id: &str) -> &mut Session {
        self.sessions.entry(session_id.to_owned()).or_default()
    }

    fn lease_mut(&mut self, lease: LeaseId) -> &mut Lease {
        self.leases.get_mut(&lease).expect("lease is known")
    }

    // ---- commands ----

    fn on_command(&mut self, call: CallId, lease: LeaseId, command: SessionCommand) {
        self.begin_call(call);
        let known = self
            .leases
            .get(&lease)
            .is_some_and(|l| !matches!(l.state, LeaseState::Acquiring { .. }));
        if !known {
            return self.complete(call, Err(LeaseError::UnknownLease { lease }));
        }
        if let Err(error) = self.check_active(lease) {
            return self.complete(call, Err(error));
        }
        let session_id = self.leases[&lease].session_id.clone();
        self.request_for_call(
            call,
            command.into_command(session_id),
            Purpose::Command { call },
        );
    }
}

// ---- trace formatting ----

fn fmt_command(f: &mut fmt::Formatter<'_>, command: &Command) -> fmt::Result {
    f.write_str(command.name())?;
    match command {
        Command::Prompt { session_id, text } | Command::Steer { session_id, text } => {
            write!(f, " {session_id} {text:?}")
        }
        Command::SetModel { session_id, model } => {
            write!(f, " {session_id} {}/{}", model.provider, model.id)
        }
        Command::SetThinking {
            session_id,
            thinking_level,
        } => {
            write!(f, " {session_id} {}", thinking_level.as_str())
        }
        other => match other.session_id() {
            Some(session_id) => write!(f, " {session_id}"),
            None => Ok(()),
        },
    }
}

fn fmt_snapshot(f: &mut fmt::Formatter<'_>, snapshot: &SessionSnapshot) -> fmt::Result {
    let attached = if snapshot.attached {
        "attached"
    } else {
        "not attached"
    };
    write!(f, "{} rev {} {attached}", snapshot.id, snapshot.revision)
}

fn fmt_result(f: &mut fmt::Formatter<'_>, result: &CommandResult) -> fmt::Result {
    write!(f, "{} ", result.name())?;
    match result {
        CommandResult::List { sessions } => write!(f, "({} sessions)", sessions.len()),
        CommandResult::Detach { session_id } => f.write_str(session_id),
        other => match other.session() {
            Some(snapshot) => fmt_snapshot(f, snapshot),
            None => write!(f, "{other:?}"),
        },
    }
}

impl fmt::Display for LeaseInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connected => f.write_str("connected"),
            Self::Disconnected => f.write_str("disconnected"),
            Self::Suspend => f.write_str("suspend"),
            Self::DisposeClient => f.write_str("dispose client"),
            Self::Acquire {
                call,
                session_id,
                mode,
            } => {
                let mode = match mode {
                    LeaseMode::Exclusive => "exclusive",
                    LeaseMode::Shared => "shared",
                };
                write!(f, "acquire {call} {session_id} {mode}")
            }
            Self::Create { call, .. } => write!(f, "create {call}"),
            Self::List { call } => write!(f, "list {call}"),
            Self::Request { call, command } => {
                write!(f, "request {call} ")?;
                fmt_command(f, command)
            }
            Self::Release { call, lease, kind } => {
                let kind = match kind {
                    ReleaseKind::Detach => "detach",
                    ReleaseKind::Dispose => "dispose",
                };
                write!(f, "{kind} {call} {lease}")
            }
            Self::Command {
                call,
                lease,
                command,
            } => match command {
                SessionCommand::Prompt { text } => write!(f, "prompt {call} {lease} {text:?}"),
                SessionCommand::Steer { text } => write!(f, "steer {call} {lease} {text:?}"),
                SessionCommand::Abort => write!(f, "abort {call} {lease}"),
                SessionCommand::SetModel { model } => {
                    write!(
                        f,
                        "set_model {call} {lease} {}/{}",
                        model.provider, model.id
                    )
                }
                SessionCommand::SetThinking { thinking_level } => {
                    write!(f, "set_thinking {call} {lease} {}", thinking_level.as_str())
                }
            },
            Self::Forget { lease } => write!(f, "forget {lease}"),
            Self::Response(response) => {
                write!(f, "response {} ", response.id)?;
                match &response.outcome {
                    Ok(result) => {
                        f.write_str("ok ")?;
                        fmt_result(f, result)
                    }
                    Err(error) => {
                        write!(f, "err {} {:?}", error.code.as_str(), error.message)
                    }
                }
            }
            Self::Event(event) => match event {
                ServerEvent::ServerSnapshot { snapshot } => {
                    write!(f, "event server_snapshot rev {}", snapshot.revision)
                }
                ServerEvent::SessionSnapshot { snapshot } => {
                    f.write_str("event session_snapshot ")?;
                    fmt_snapshot(f, snapshot)
                }
                ServerEvent::SessionProgress { session_id, .. } => {
                    write!(f, "event session_progress {session_id}")
                }
                ServerEvent::SessionRemoved { session_id } => {
                    write!(f, "event session_removed {session_id}")
                }
            },
        }
    }
}

impl fmt::Display for LeaseOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Send(request) => {
                write!(f, "send {} ", request.id)?;
                fmt_command(f, &request.command)
            }
            Self::Complete { call, result } => {
                write!(f, "complete {call} ")?;
                match result {
                    Ok(Completion::Acquired { lease, session_id }) => {
                        write!(f, "ok acquired {lease} {session_id}")
                    }
                    Ok(Completion::Released) => f.write_str("ok released"),
                    Ok(Completion::Session(snapshot)) => {
                        f.write_str("ok session ")?;
                        fmt_snapshot(f, snapshot)
                    }
                    Ok(Completion::Sessions(sessions)) => {
                        write!(f, "ok sessions ({})", sessions.len())
                    }
                    Ok(Completion::Result(result)) => {
                        f.write_str("ok ")?;
                        fmt_result(f, result)
                    }
                    Err(error) => write!(f, "err {error}"),
                }
            }
            Self::CloseConnection { error } => write!(f, "close connection: {error}"),
            Self::Orphaned { call, request } => {
                write!(f, "orphaned {call} {} ", request.id)?;
                fmt_command(f, &request.command)
            }
        }
    }
}

mod acquire;
mod invariants;
mod release;
mod traffic;

#[cfg(test)]
mod tests;
