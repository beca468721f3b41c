//! The session registry: live sessions, their attachments, operations in
//! flight and worker, and every request that touches them.

use super::timers::Timer;
use super::{Acquire, CloseReason, Frame, Output, Server, Waiter, listed_metadata, metadata_of};
use crate::approval::{ApprovalPolicy, Approvals};
use crate::ids::ChannelId;
use crate::ids::{ConnId, OpId, WorkerId};
use crate::protocol::codec::cbor_error;
use crate::protocol::codec::direct::Shown;
use crate::protocol::codec::spliced;
use crate::protocol::worker::SNAPSHOT_REQUEST_VERSION;
use crate::protocol::{
    AssistantStatus, Command, CommandResult, CreateParams, ErrorCode, Gap, LiveState, LiveStatus,
    PackedSnapshot, ProtocolError, Request, Response, SchemaError, ServerEvent, ServerMessage,
    SessionPhase, SessionSnapshot, Transcript,
};
use crate::time::Instant;
use crate::worker::{
    CreateSpec, FromWorker, Operation, ToWorker, Worker, WorkerInput, WorkerOutput, WorkerState,
    WorkerTimeout,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

mod handoff;
mod workers;

/// Where a live session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Its worker is starting; acquires wait.
    Opening,
    /// Serving.
    Ready,
    /// Disposed; waiting for the worker to exit. Acquires wait and re-open.
    Disposing,
    /// Failed; waiting for the worker to exit. Acquires fail `session_locked`.
    Terminal,
}

/// A control operation forwarded to the worker.
#[derive(Debug, Clone)]
pub(crate) struct PendingOp {
    conn: ConnId,
    request_id: String,
    name: &'static str,
    /// A snapshot showed a turn since it went out: for a prompt, its turn
    /// started (and, once the session is idle again, ended).
    turn_seen: bool,
    /// The name a rename on its way takes: no other session may take it.
    claims: Option<String>,
}

/// A removal under way: the requests to answer when it ends, and the
/// version 1 connections it detached without telling them, attached again
/// if it fails ([`Server::restore`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Removal {
    requests: Vec<(ConnId, String)>,
    held: Vec<ConnId>,
}

impl Removal {
    /// No removal was asked for.
    fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub(crate) id: String,
    pub(crate) worker: Worker,
    pub(crate) phase: Phase,
    /// The runtime's latest snapshot (not normalised), with its encodings.
    pub(crate) snapshot: Option<LiveSnapshot>,
    pub(crate) attached: BTreeSet<ConnId>,
    ops: BTreeMap<OpId, PendingOp>,
    waiters: Vec<Waiter>,
    /// Set for a session being created: the id the runtime must report.
    creating: bool,
    /// pi's session states, while a v8 client is attached.
    pub(crate) v8: Option<Box<super::v8::SessionView>>,
    /// A removal waiting for the worker to exit.
    removing: Removal,
    /// Dispose as soon as the worker is ready (shutdown during opening).
    dispose_when_ready: bool,
    /// An adopted session is not disposed for lack of attachments before this.
    pub(crate) hold_until: Option<Instant>,
    /// Adopted from another server and absent from this server's catalog:
    /// listed while live, forgotten when its worker exits.
    foreign: bool,
    /// Until the worker said hello: what its start carries, and (once
    /// spawned) the token it must prove itself with.
    start: Option<PendingStart>,
    /// The worker sends its snapshot when asked ([`ToWorker::Snapshot`],
    /// channel version 2): false for an adopted worker of version 1, whose
    /// transcript the server keeps.
    resends: bool,
    /// A [`ToWorker::Snapshot`] went out and no snapshot came back since:
    /// the waiters of a ready session wait for it.
    snapshot_requested: bool,
    /// Progress came after the latest snapshot: it lags what streamed, so
    /// an attach waits for the next one (a client's snapshot is current as
    /// of the deltas that follow it, and anchors them).
    progressed: bool,
    /// The session's approvals as its worker last told them, with the
    /// policy in force.
    pub(crate) approvals: (Approvals, ApprovalPolicy),
}

/// The start of a spawned worker that has not said hello yet.
#[derive(Debug, Clone)]
struct PendingStart {
    token: Option<String>,
    create: Option<Box<CreateSpec>>,
    revision_floor: u64,
}

impl Live {
    /// The revision of the runtime's latest snapshot.
    pub(crate) fn snapshot_revision(&self) -> Option<u64> {
        self.snapshot.as_ref().map(|s| s.revision)
    }

    /// What `status` reports of this session.
    fn status(&self) -> LiveStatus {
        let snapshot = self.snapshot.as_ref();
        let state = match self.phase {
            Phase::Opening => LiveState::Opening,
            Phase::Disposing => LiveState::Closing,
            Phase::Terminal => LiveState::Error,
            Phase::Ready => match snapshot.map(|s| s.phase) {
                None => LiveState::Opening,
                Some(SessionPhase::Idle)
                    if snapshot.is_some_and(LiveSnapshot::last_reply_failed) =>
                {
                    LiveState::Error
                }
                Some(phase) => LiveState::Phase(phase),
            },
        };
        LiveStatus {
            session_id: self.id.clone(),
            state,
            clients: self.attached.len() as u64,
            model: snapshot.map(|s| s.model.clone()),
            thinking_level: snapshot.map(|s| s.thinking_level),
            preview: None,
        }
    }

    fn new(id: String, worker: Worker, creating: bool) -> Self {
        Self {
            id,
            worker,
            phase: Phase::Opening,
            snapshot: None,
            attached: BTreeSet::new(),
            ops: BTreeMap::new(),
            waiters: Vec::new(),
            creating,
            removing: Removal::default(),
            dispose_when_ready: false,
            hold_until: None,
            foreign: false,
            start: None,
            resends: true,
            snapshot_requested: false,
            progressed: false,
            approvals: Default::default(),
            v8: None,
        }
    }

    /// A prompt (v1's or v8's) or a compaction is on its way to the runtime and its turn
    /// not seen yet. One whose turn a snapshot showed no longer counts: a
    /// turn ends with its idle snapshot, then the prompt's answer, and a
    /// prompt between the two is not refused.
    pub(crate) fn prompt_on_its_way(&self) -> bool {
        self.ops.values().any(|op| {
            matches!(op.name, "prompt" | "v8.prompt" | "compact" | "v8.compact") && !op.turn_seen
        })
    }

    pub(crate) fn runtime_phase(&self) -> SessionPhase {
        self.snapshot
            .as_ref()
            .map_or(SessionPhase::Idle, |s| s.phase)
    }

    pub(crate) fn is_busy(&self) -> bool {
        !self.ops.is_empty() || self.runtime_phase() != SessionPhase::Idle
    }

    pub(crate) fn check_invariants(&self) {
        match self.phase {
            Phase::Opening => {
                assert!(
                    self.attached.is_empty() && self.ops.is_empty(),
                    "{}: opening with users",
                    self.id
                );
                assert!(
                    matches!(
                        self.worker.state(),
                        WorkerState::Spawning | WorkerState::Starting
                    ),
                    "{}: opening with worker {:?}",
                    self.id,
                    self.worker.state()
                );
            }
            Phase::Ready => {
                assert!(
                    self.snapshot.is_some(),
                    "{}: ready without snapshot",
                    self.id
                );
                assert!(
                    self.worker.is_ready(),
                    "{}: ready with worker {:?}",
                    self.id,
                    self.worker.state()
                );
                assert!(
                    self.waiters.is_empty() || self.snapshot_requested,
                    "{}: waiters while ready, with no snapshot asked for",
                    self.id
                );
                assert_eq!(
                    self.worker.state() == WorkerState::Busy,
                    self.is_busy(),
                    "{}: busy",
                    self.id
                );
            }
            Phase::Disposing | Phase::Terminal => {
                assert!(
                    self.attached.is_empty(),
                    "{}: attached while {:?}",
                    self.id,
                    self.phase
                );
            }
        }
        if self.phase != Phase::Disposing {
            assert!(
                self.removing.is_empty(),
                "{}: removal outside disposing",
                self.id
            );
        }
        if let Some(snap) = &self.snapshot {
            assert_eq!(snap.id, self.id, "cached snapshot of another session");
        }
        assert!(
            !self.snapshot_requested || (self.resends && self.phase != Phase::Opening),
            "{}: a snapshot asked of a worker that cannot send it",
            self.id
        );
    }
}

/// Normalises a runtime snapshot for clients: a live runtime holds the lock,
/// and `attached` is relative to the audience. The encodings write these
/// flags directly ([`Shown`]); debug builds compare them with this.
fn normalised(snapshot: &SessionSnapshot, attached: bool) -> SessionSnapshot {
    let mut s = snapshot.clone();
    s.locked = true;
    s.attached = attached;
    s
}

/// A live session's latest runtime snapshot: every field but the
/// transcript typed (`Deref`; its `transcript` is empty), and the
/// transcript as CBOR ([`Transcript`]), while it is kept.
///
/// A worker sends its transcript whole once, then tails: the items from
/// where it changed ([`PackedTranscript::from`]), which replace the kept
/// copy's from there. The server reads nothing of the transcript but its
/// length and the status of its newest reply, kept apart. It keeps the
/// items only while a version 1 client needs them (one is attached or
/// waits for an answer: its protocol sends the transcript whole) or they
/// are at most [`Limits::kept_transcript_bytes`] (or the worker cannot
/// send them again: [`Live::resends`]), so its memory does not grow with
/// history; a client that needs them later waits for the worker to send
/// them whole ([`ToWorker::Snapshot`]).
///
/// The normalised forms ([`normalised`]) are encoded at their first use, in
/// pieces around the shared transcript: the responses and session snapshot
/// events that carry it are written around those pieces, so a long
/// transcript is copied once per snapshot, not once per message. A new
/// snapshot drops the encodings, so no encoding outlives the snapshot it
/// was made from — not even for a snapshot replaced by another with the
/// same revision, which [`Server::update_snapshot`] accepts. The rest of
/// what determines the bytes (`locked` is always true) is the audience's
/// `attached`, which indexes the encodings.
///
/// [`Limits::kept_transcript_bytes`]: crate::limits::Limits::kept_transcript_bytes
#[derive(Clone)]
pub(crate) struct LiveSnapshot {
    head: SessionSnapshot,
    /// How many items the transcript has.
    len: usize,
    last_reply: Option<AssistantStatus>,
    transcript: Option<Transcript>,
    /// The pieces of `normalised(snapshot, attached)` at index `attached as
    /// usize` (or why it cannot be encoded), once made.
    encoded: [Option<Result<SnapshotPieces, SchemaError>>; 2],
}

/// A session snapshot's CBOR: the map up to its transcript, the transcript,
/// the rest.
type SnapshotPieces = [Arc<[u8]>; 3];

impl LiveSnapshot {
    /// A session's first snapshot, which is whole.
    pub(crate) fn new(snapshot: PackedSnapshot) -> Result<Self, Gap> {
        let mut live = Self {
            head: snapshot.head().clone(),
            len: 0,
            last_reply: None,
            transcript: Some(Transcript::default()),
            encoded: [None, None],
        };
        live.apply(snapshot)?;
        Ok(live)
    }

    /// Moves to the next snapshot: its transcript's tail replaces the
    /// items from where it starts. A tail that starts past the end leaves
    /// the transcript unknown but for its length (it is let go).
    fn apply(&mut self, snapshot: PackedSnapshot) -> Result<(), Gap> {
        let (head, tail) = snapshot.into_parts();
        self.head = head;
        self.encoded = [None, None];
        let from = tail.from();
        if from > self.len {
            self.transcript = None;
            return Err(Gap {
                from,
                len: self.len,
            });
        }
        if from == 0 && self.transcript.is_none() {
            self.transcript = Some(Transcript::default());
        }
        if let Some(transcript) = &mut self.transcript {
            transcript.apply(&tail)?;
        }
        self.len = from + tail.len();
        self.last_reply = match tail.last_reply() {
            Some(status) => Some(status),
            None if from == 0 => None,
            None => self.last_reply,
        };
        Ok(())
    }

    /// Whether the transcript is here to send.
    pub(super) fn has_transcript(&self) -> bool {
        self.transcript.is_some()
    }

    /// Lets go of a transcript longer than `keep` bytes, and its encodings.
    fn release_transcript(&mut self, keep: usize) {
        if self.transcript.as_ref().is_some_and(|t| t.bytes() > keep) {
            self.transcript = None;
            self.encoded = [None, None];
        }
    }

    /// The session's last reply ended in an error.
    fn last_reply_failed(&self) -> bool {
        self.last_reply == Some(AssistantStatus::Error)
    }

    /// The pieces of the snapshot normalised for an audience that is (or is
    /// not) attached, encoded now if they were not yet.
    fn encoded(&mut self, attached: bool) -> Result<SnapshotPieces, SchemaError> {
        let Some(transcript) = &mut self.transcript else {
            return Err(SchemaError::new("the session's transcript is not here"));
        };
        let head = &self.head;
        self.encoded[usize::from(attached)]
            .get_or_insert_with(|| {
                let shown = Shown {
                    attached,
                    locked: true,
                };
                let transcript = transcript.packed().map_err(cbor_error)?;
                spliced::encode_packed_session_snapshot(head, &transcript, shown)
                    .map_err(cbor_error)
            })
            .clone()
    }

    /// The snapshot with its transcript decoded, for debug builds'
    /// comparisons.
    pub(super) fn unpacked(&self) -> SessionSnapshot {
        let mut snapshot = self.head.clone();
        if let Some(transcript) = &self.transcript {
            snapshot.transcript = transcript.unpack().expect("checked when it arrived");
        }
        snapshot
    }
}

#[cfg(test)]
impl LiveSnapshot {
    /// The encoding for an audience that is (or is not) attached, if made.
    pub(super) fn cached(&self, attached: bool) -> Option<SnapshotPieces> {
        self.encoded[usize::from(attached)]
            .as_ref()
            .map(|e| e.clone().expect("encodes"))
    }
}

/// Every field but the transcript.
impl Deref for LiveSnapshot {
    type Target = SessionSnapshot;

    fn deref(&self) -> &SessionSnapshot {
        &self.head
    }
}

/// The snapshot's identity, whether its transcript is kept and the lengths
/// of its encodings, not its bytes.
impl fmt::Debug for LiveSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lens = self.encoded.each_ref().map(|e| {
            e.as_ref()
                .map(|e| e.as_ref().map(|p| p.iter().map(|p| p.len()).sum::<usize>()))
        });
        f.debug_struct("LiveSnapshot")
            .field("id", &self.head.id)
            .field("revision", &self.head.revision)
            .field("len", &self.len)
            .field("transcript", &self.transcript.as_ref().map(|t| t.len()))
            .field("encoded_lens", &lens)
            .finish()
    }
}

fn result_for(name: &str, session: SessionSnapshot) -> CommandResult {
    CommandResult::with_session(name, session)
        .unwrap_or_else(|| unreachable!("no snapshot result for {name}"))
}

/// The longest session name, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 128;

fn not_live(session: &str) -> String {
    format!("Session is not live: {session}")
}

impl Server {
    pub(super) fn on_request(&mut self, conn: ConnId, request: Request) {
        let Request {
            id: request_id,
            command,
        } = request;
        let limit = self.config.limits.max_requests_in_flight_per_connection;
        if self.conns[&conn].in_flight >= limit {
            let message = format!("More than {limit} requests in flight on this connection");
            return self.respond_error(conn, request_id, ErrorCode::InvalidRequest, message);
        }
        match command {
            Command::List => {
                if self.conns.get(&conn).is_some_and(|c| c.is_ready()) {
                    let frame = self.list_frame(&request_id);
                    self.send_encoded(conn, frame);
                }
            }
            Command::Create(params) => self.on_create(conn, request_id, params),
            Command::Attach { session_id } => self.on_attach(conn, request_id, session_id),
            Command::Detach { session_id } => self.on_detach(conn, request_id, session_id),
            Command::Remove { session_id } => self.on_remove(conn, request_id, session_id),
            Command::Rename { session_id, name } => match self.check_name(&name, &session_id) {
                Ok(()) => {
                    self.on_operation(conn, request_id, session_id, Operation::Rename { name })
                }
                Err(message) => {
                    self.respond_error(conn, request_id, ErrorCode::InvalidRequest, message)
                }
            },
            Command::SetMcpServers {
                session_id,
                servers,
            } => self.on_operation(
                conn,
                request_id,
                session_id,
                Operation::SetMcpServers { servers },
            ),
            Command::Compact {
                session_id,
                instructions,
            } => {
                let compact = Operation::Compact { instructions };
                self.on_operation(conn, request_id, session_id, compact)
            }
            Command::Status => {
                let sessions = self.status();
                self.respond(conn, request_id, Ok(CommandResult::Status { sessions }));
            }
            Command::Prompt { session_id, text } => {
                self.on_operation(conn, request_id, session_id, Operation::prompt(text))
            }
            Command::Steer { session_id, text } => {
                self.on_operation(conn, request_id, session_id, Operation::Steer { text })
            }
            Command::Abort { session_id } => {
                self.on_operation(conn, request_id, session_id, Operation::Abort)
            }
            Command::SetModel { session_id, model } => {
                self.on_operation(conn, request_id, session_id, Operation::SetModel { model })
            }
            Command::SetThinking {
                session_id,
                thinking_level,
            } => self.on_operation(
                conn,
                request_id,
                session_id,
                Operation::SetThinking {
                    level: thinking_level,
                },
            ),
        }
    }

    // ---- opening -----------------------------------------------------------

    fn on_create(&mut self, conn: ConnId, request_id: String, params: CreateParams) {
        if let Some(error) = self.live_capacity_error() {
            return self.respond(conn, request_id, Err(error));
        }
        if let Some(name) = &params.name
            && let Err(message) = self.check_name(name, "")
        {
            return self.respond_error(conn, request_id, ErrorCode::InvalidRequest, message);
        }
        let session_id = loop {
            let id = self.rng.uuid_v4();
            let taken = self.sessions.contains_key(&id) || self.catalog.contains(&id);
            if !taken {
                break id;
            }
        };
        let spec = CreateSpec {
            cwd: params.cwd,
            name: params.name,
            model: params.model,
            thinking_level: params.thinking_level,
        };
        self.conns.get_mut(&conn).expect("ready").in_flight += 1;
        let waiter = Waiter {
            conn,
            request_id,
            kind: Acquire::Create,
        };
        self.open(session_id, Some(spec), vec![waiter]);
    }

    /// Whether session `session` (empty for a new one) may take `name`: a
    /// name is a line of at most [`MAX_NAME_CHARS`] characters, not blank,
    /// and no other session of this server has it or is being given it.
    pub(super) fn check_name(&self, name: &str, session: &str) -> Result<(), String> {
        if name.trim().is_empty() {
            return Err("A session name must not be blank".into());
        }
        if name.chars().any(char::is_control) {
            return Err("A session name must not hold control characters".into());
        }
        if name.chars().count() > MAX_NAME_CHARS {
            return Err(format!(
                "A session name has at most {MAX_NAME_CHARS} characters"
            ));
        }
        match self.name_holder(name, session) {
            Some(holder) => Err(format!("Name {name:?} is taken by session {holder}")),
            None => Ok(()),
        }
    }

    /// The session other than `except` that has `name`, or is being created
    /// or renamed with it.
    fn name_holder(&self, name: &str, except: &str) -> Option<String> {
        let has = |n: Option<&str>| n == Some(name);
        for (id, live) in &self.sessions {
            if id == except {
                continue;
            }
            let claimed = live.ops.values().any(|op| has(op.claims.as_deref()));
            let creating = live.start.as_ref().and_then(|s| s.create.as_deref());
            let named = match (&live.snapshot, creating) {
                (Some(snapshot), _) => has(snapshot.name.as_deref()),
                (None, Some(create)) => has(create.name.as_deref()),
                (None, None) => self
                    .catalog
                    .get(id)
                    .is_some_and(|m| has(m.session_name.as_deref())),
            };
            if claimed || named {
                return Some(id.clone());
            }
        }
        self.catalog
            .iter()
            .find(|(id, stored)| {
                *id != except
                    && !self.sessions.contains_key(*id)
                    && has(stored.meta.session_name.as_deref())
            })
            .map(|(id, _)| id.clone())
    }

    pub(super) fn on_attach(&mut self, conn: ConnId, request_id: String, session_id: String) {
        let waiter = Waiter {
            conn,
            request_id,
            kind: Acquire::Attach,
        };
        if self.conns[&conn].attached.contains(&session_id) {
            return self.admit(&session_id, waiter);
        }
        let max = self.config.limits.max_attachments_per_connection;
        // A v8 connection's one route is replaced when the attach is admitted.
        if !self.is_v8(conn) && self.conns[&conn].attached.len() >= max {
            let message = format!("A connection may attach to at most {max} sessions");
            return self.respond_error(conn, waiter.request_id, ErrorCode::InvalidRequest, message);
        }
        match self
            .sessions
            .get(&session_id)
            .map(|s| (s.phase, s.removing.is_empty()))
        {
            Some((Phase::Ready, _)) => self.admit(&session_id, waiter),
            Some((Phase::Opening, _)) | Some((Phase::Disposing, true)) => {
                self.park(&session_id, waiter)
            }
            Some((Phase::Disposing, false)) => {
                let message = format!("Session is being removed: {session_id}");
                self.respond_error(conn, waiter.request_id, ErrorCode::NotFound, message);
            }
            Some((Phase::Terminal, _)) => {
                let message = format!("Session runtime is terminating: {session_id}");
                self.respond_error(conn, waiter.request_id, ErrorCode::SessionLocked, message);
            }
            None if self.timers.contains(&Timer::Expected(session_id.clone())) => {
                // Its worker was released by the server we replaced and will announce itself.
                self.conns.get_mut(&conn).expect("ready").in_flight += 1;
                self.adoption_waiters
                    .entry(session_id)
                    .or_default()
                    .push(waiter);
            }
            None => {
                let stored = self.catalog.contains(&session_id);
                if !stored || self.removals.contains_key(&session_id) {
                    let message = format!("Session not found: {session_id}");
                    return self.respond_error(
                        conn,
                        waiter.request_id,
                        ErrorCode::NotFound,
                        message,
                    );
                }
                if let Some(error) = self.live_capacity_error() {
                    return self.respond(conn, waiter.request_id, Err(error));
                }
                self.conns.get_mut(&conn).expect("ready").in_flight += 1;
                self.open(session_id, None, vec![waiter]);
            }
        }
    }

    pub(super) fn live_capacity_error(&self) -> Option<ProtocolError> {
        let max = self.config.limits.max_live_sessions;
        (self.sessions.len() >= max).then(|| {
            ProtocolError::new(
                ErrorCode::Busy,
                format!("The server is at its limit of {max} live sessions"),
            )
        })
    }

    /// Spawns a worker for the session; the waiters are admitted when it is ready.
    pub(super) fn open(
        &mut self,
        session_id: String,
        create: Option<CreateSpec>,
        waiters: Vec<Waiter>,
    ) {
        assert!(
            !self.sessions.contains_key(&session_id),
            "{session_id}: already live"
        );
        // Boxed: outputs are moved once per step, and most are small.
        let create = create.map(Box::new);
        let worker_id = self.fresh_worker_id();
        let deadline = self.now + self.config.limits.worker_start_timeout;
        let dispose_timeout = self.config.limits.worker_dispose_timeout;
        let mut live = Live::new(
            session_id.clone(),
            Worker::spawning(worker_id, deadline, dispose_timeout),
            create.is_some(),
        );
        live.waiters = waiters;
        let revision_floor = self.shown_revisions.get(&session_id).copied().unwrap_or(0);
        live.start = Some(PendingStart {
            token: None,
            create: create.clone(),
            revision_floor,
        });
        self.sessions.insert(session_id.clone(), live);
        self.timers
            .set(Timer::Worker(session_id.clone()), Some(deadline));
        self.workers.insert(worker_id, session_id.clone());
        self.out.push(Output::SpawnWorker {
            worker: worker_id,
            session_id,
            create,
            revision_floor,
        });
    }

    /// Keeps a request of a ready connection waiting on a live session: it
    /// counts as in flight until it is admitted or fails.
    fn park(&mut self, session_id: &str, waiter: Waiter) {
        if waiter.counted() {
            self.conns.get_mut(&waiter.conn).expect("ready").in_flight += 1;
        }
        let live = self.sessions.get_mut(session_id).expect("live");
        live.waiters.push(waiter);
    }

    /// Attaches a waiter's connection to a ready session and answers it, or,
    /// if the server let go of the transcript, asks the worker for it and
    /// keeps the waiter until it comes.
    fn admit(&mut self, session_id: &str, waiter: Waiter) {
        let ready = self.conns.get(&waiter.conn).is_some_and(|c| c.is_ready());
        if !ready {
            return; // closed while the session opened; maybe_dispose runs after admission
        }
        let live = &self.sessions[session_id];
        // A v8 client is told from the session's view, current as of every
        // delta, once there is one; one made now is made from the snapshot,
        // which lags what streamed since.
        let viewed = self.is_v8(waiter.conn) && live.v8.is_some();
        let stale = live.progressed && live.resends && !viewed;
        if stale || !live.snapshot.as_ref().expect("ready").has_transcript() {
            self.park(session_id, waiter);
            return self.request_snapshot(session_id);
        }
        let Waiter {
            conn,
            request_id,
            kind,
        } = waiter;
        if self.is_v8(conn) {
            return self.v8_admit(session_id, conn, request_id, kind);
        }
        let max = self.config.limits.max_attachments_per_connection;
        let c = self.conns.get_mut(&conn).expect("ready");
        if c.attached.len() >= max && !c.attached.contains(session_id) {
            let message = format!("A connection may attach to at most {max} sessions");
            let error = ProtocolError::new(ErrorCode::InvalidRequest, message);
            return self.refuse(Waiter::new(conn, request_id, kind), error);
        }
        c.attached.insert(session_id.to_string());
        let live = self.sessions.get_mut(session_id).expect("ready");
        live.attached.insert(conn);
        let revision = live.snapshot.as_ref().expect("ready").revision;
        let news = self
            .conns
            .get_mut(&conn)
            .expect("ready")
            .take_revision(session_id, revision);
        let name = match kind {
            Acquire::Create | Acquire::Create8 => "create",
            Acquire::Attach => "attach",
            Acquire::Restore => {
                if news {
                    let frame = self.session_snapshot_frame(session_id);
                    self.send_encoded(conn, frame);
                }
                return;
            }
        };
        self.respond_with_session(conn, request_id, name, session_id, true);
    }

    /// A waiter that cannot be admitted. A request is answered with
    /// `error`; a restored attachment has no request ([`Self::end_held`]).
    fn refuse(&mut self, waiter: Waiter, error: ProtocolError) {
        if waiter.counted() {
            self.respond(waiter.conn, waiter.request_id, Err(error));
        } else {
            self.end_held(waiter.conn);
        }
    }

    /// An attachment a removal held cannot come back: its client believes
    /// itself attached and cannot be told otherwise, so its connection is
    /// closed, as a failed session's attached connections are.
    fn end_held(&mut self, conn: ConnId) {
        if self.conns.get(&conn).is_some_and(|c| c.is_ready()) {
            self.close(conn, CloseReason::RuntimeError);
        }
    }

    /// A waiter stops waiting: its request no longer counts in flight.
    fn unpark(&mut self, waiter: &Waiter) {
        if waiter.counted() {
            self.finish_pending(waiter.conn);
        }
    }

    /// The client of `conn` detached from `session_id` while a removal held
    /// its attachment: a failed removal does not attach it again.
    fn unhold(&mut self, conn: ConnId, session_id: &str) {
        if let Some(live) = self.sessions.get_mut(session_id) {
            live.removing.held.retain(|c| *c != conn);
            live.waiters
                .retain(|w| w.conn != conn || w.kind != Acquire::Restore);
        } else if let Some(removal) = self.removals.get_mut(session_id) {
            removal.held.retain(|c| *c != conn);
        }
    }

    /// Whether the client of `conn` believes itself attached to
    /// `session_id` while a removal holds its attachment, or a failed
    /// removal's restore has not given it back yet.
    fn holds(&self, conn: ConnId, session_id: &str) -> bool {
        match self.sessions.get(session_id) {
            Some(live) => {
                live.removing.held.contains(&conn)
                    || live
                        .waiters
                        .iter()
                        .any(|w| w.conn == conn && w.kind == Acquire::Restore)
            }
            None => self
                .removals
                .get(session_id)
                .is_some_and(|r| r.held.contains(&conn)),
        }
    }

    // ---- detach and remove -------------------------------------------------

    fn on_detach(&mut self, conn: ConnId, request_id: String, session_id: String) {
        self.unhold(conn, &session_id);
        let changed = self.detach(conn, &session_id);
        self.respond(
            conn,
            request_id,
            Ok(CommandResult::Detach {
                session_id: session_id.clone(),
            }),
        );
        if changed {
            self.broadcast_session(&session_id);
            self.maybe_dispose(&session_id);
            self.publish_server_snapshot();
        }
    }

    /// Removes one attachment. Returns whether there was one.
    pub(super) fn detach(&mut self, conn: ConnId, session_id: &str) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        if !c.attached.remove(session_id) {
            return false;
        }
        if let Some(live) = self.sessions.get_mut(session_id) {
            live.attached.remove(&conn);
        }
        self.v8_release(conn, true);
        self.release_transcript(session_id);
        true
    }

    /// Disconnect cleanup: drop every attachment of the connection.
    pub(super) fn detach_everywhere(&mut self, conn: ConnId) {
        let sessions: Vec<String> = self
            .conns
            .get(&conn)
            .map(|c| c.attached.iter().cloned().collect())
            .unwrap_or_default();
        for session_id in sessions {
            self.detach(conn, &session_id);
            self.maybe_dispose(&session_id);
        }
    }

    pub(super) fn on_remove(&mut self, conn: ConnId, request_id: String, session_id: String) {
        let stored = self.catalog.contains(&session_id);
        if self.removals.contains_key(&session_id)
            || (!stored && !self.sessions.contains_key(&session_id))
        {
            let message = format!("Session not found: {session_id}");
            return self.respond_error(conn, request_id, ErrorCode::NotFound, message);
        }
        let Some(live) = self.sessions.get(&session_id) else {
            self.conns.get_mut(&conn).expect("ready").in_flight += 1;
            let removal = Removal {
                requests: vec![(conn, request_id)],
                held: Vec::new(),
            };
            self.removals.insert(session_id.clone(), removal);
            self.out.push(Output::RemoveSession { session_id });
            return;
        };
        match live.phase {
            Phase::Ready if live.is_busy() => {
                let message =
                    format!("Session {session_id} is running a turn; abort it before removing");
                self.respond_error(conn, request_id, ErrorCode::Busy, message)
            }
            Phase::Ready | Phase::Disposing => {
                self.conns.get_mut(&conn).expect("ready").in_flight += 1;
                let attached: Vec<ConnId> = live.attached.iter().copied().collect();
                // A v8 client hears `attachment: null` before the answer, as
                // in pi. A version 1 client is told nothing until the
                // outcome: `session_removed`, or its attachment back.
                let held: Vec<ConnId> = attached
                    .iter()
                    .copied()
                    .filter(|c| !self.is_v8(*c))
                    .collect();
                for c in attached {
                    self.detach(c, &session_id);
                }
                self.dispose(&session_id);
                let removing = &mut self.sessions.get_mut(&session_id).expect("live").removing;
                removing.requests.push((conn, request_id));
                removing.held.extend(held);
            }
            Phase::Opening | Phase::Terminal => {
                let message = format!("Session {session_id} is opening or terminating; try again");
                self.respond_error(conn, request_id, ErrorCode::SessionLocked, message)
            }
        }
    }

    /// `status`: every live session, then every stored one, by id.
    pub(super) fn status(&self) -> Vec<LiveStatus> {
        let mut sessions: Vec<LiveStatus> = self.sessions.values().map(Live::status).collect();
        for (id, _) in self.catalog.iter() {
            if !self.sessions.contains_key(id) {
                sessions.push(LiveStatus {
                    session_id: id.clone(),
                    state: LiveState::Stored,
                    clients: 0,
                    model: None,
                    thinking_level: None,
                    preview: None,
                });
            }
        }
        for status in &mut sessions {
            status.preview = self.previews.get(&status.session_id).cloned();
            if status.model.is_none()
                && let Some((model, level)) = self.stored_models.get(&status.session_id)
            {
                status.model = Some(model.clone());
                status.thinking_level = Some(*level);
            }
        }
        sessions.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        sessions
    }

    /// The directory holds these sessions: an adopted session among them is
    /// stored, not foreign, and stays listed when its worker exits (an
    /// orphan may announce itself before the catalog has loaded).
    pub(super) fn stored_on_disk(&mut self, stored: &[crate::protocol::SessionMetadata]) {
        for meta in stored {
            if let Some(live) = self.sessions.get_mut(&meta.id) {
                live.foreign = false;
            }
        }
    }

    pub(super) fn on_session_removed(&mut self, session_id: String, result: Result<(), String>) {
        let Some(removal) = self.removals.remove(&session_id) else {
            return;
        };
        let outcome = match &result {
            Ok(()) => {
                self.catalog.remove(&session_id);
                self.stored_models.remove(&session_id);
                self.shown_revisions.remove(&session_id);
                Ok(CommandResult::Remove {
                    session_id: session_id.clone(),
                })
            }
            Err(e) => Err(ProtocolError::new(
                ErrorCode::InternalError,
                format!("Could not remove session: {e}"),
            )),
        };
        for (conn, request_id) in removal.requests {
            self.finish_pending(conn);
            self.respond(conn, request_id, outcome.clone());
        }
        if result.is_err() {
            return self.restore(session_id, removal.held);
        }
        let ready = self.ready_v1();
        for &c in &ready {
            self.conns
                .get_mut(&c)
                .expect("ready")
                .revisions
                .remove(&session_id);
        }
        let event = ServerMessage::Event(ServerEvent::SessionRemoved { session_id });
        self.broadcast(&ready, &event);
        self.publish_server_snapshot();
    }

    /// A removal failed, so nothing changed for the version 1 connections
    /// it detached: the session opens again and they are attached again,
    /// sent its snapshot only if it is news to them.
    fn restore(&mut self, session_id: String, held: Vec<ConnId>) {
        let waiters: Vec<Waiter> = held
            .into_iter()
            .filter(|c| self.conns.get(c).is_some_and(|c| c.is_ready()))
            .map(|conn| Waiter::new(conn, String::new(), Acquire::Restore))
            .collect();
        if waiters.is_empty() {
            return;
        }
        let refusal = if self.shutting_down || self.sessions.contains_key(&session_id) {
            Some(ProtocolError::new(
                ErrorCode::NotFound,
                not_live(&session_id),
            ))
        } else {
            self.live_capacity_error()
        };
        match refusal {
            Some(error) => {
                for waiter in waiters {
                    self.refuse(waiter, error.clone());
                }
            }
            None => self.open(session_id, None, waiters),
        }
    }

    // ---- control operations -------------------------------------------------

    fn on_operation(
        &mut self,
        conn: ConnId,
        request_id: String,
        session_id: String,
        operation: Operation,
    ) {
        let attached = self.conns[&conn].attached.contains(&session_id);
        // A client whose attachment a removal holds believes itself
        // attached: it hears that the session is not live, as it would
        // while the session was disposing.
        if !attached && !self.holds(conn, &session_id) {
            let message = format!("Connection is not attached to session {session_id}");
            return self.respond_error(conn, request_id, ErrorCode::InvalidRequest, message);
        }
        let ready = attached
            && self
                .sessions
                .get(&session_id)
                .is_some_and(|s| s.phase == Phase::Ready);
        if !ready {
            return self.respond_error(
                conn,
                request_id,
                ErrorCode::NotFound,
                not_live(&session_id),
            );
        }
        let name = operation.name();
        self.start_op(conn, &request_id, &session_id, name, operation);
    }

    /// Sends an operation to a ready session's worker, to be answered to
    /// `request_id` under `name` when it ends. An operation with no request
    /// id (a v8 prompt, answered at once) is not counted in flight.
    pub(super) fn start_op(
        &mut self,
        conn: ConnId,
        request_id: &str,
        session_id: &str,
        name: &'static str,
        operation: Operation,
    ) -> OpId {
        let op = self.fresh_op_id();
        if !request_id.is_empty() {
            self.conns.get_mut(&conn).expect("ready").in_flight += 1;
        }
        let live = self.sessions.get_mut(session_id).expect("ready");
        assert_eq!(
            live.phase,
            Phase::Ready,
            "{session_id}: an operation while not ready"
        );
        live.ops.insert(
            op,
            PendingOp {
                conn,
                request_id: request_id.to_string(),
                name,
                turn_seen: false,
                claims: match &operation {
                    Operation::Rename { name } => Some(name.clone()),
                    _ => None,
                },
            },
        );
        let worker = live.worker.id();
        self.step_worker(session_id, WorkerInput::Busy(true));
        self.out.push(Output::ToWorker {
            worker,
            message: ToWorker::Operation { op, operation },
        });
        op
    }
}

/// Compares secrets in time that depends only on their lengths.
fn token_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}
