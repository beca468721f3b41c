//! The server machine: client connections, the session registry, and the
//! workers that host live sessions.
//!
//! [`Server::step`] takes one [`Input`] with the current time and returns the
//! [`Output`]s the driver must carry out, in order. [`Server::next_deadline`]
//! says when to deliver [`Input::Tick`]. Invariants are asserted at the end of
//! every step: all of them in debug builds, and in release builds those of
//! what the step touched, with a full sweep every `FULL_CHECK_INTERVAL` steps
//! (see [`Server::check_invariants`]).
//!
//! Semantics follow pi protocol v1 (`PiServer`): one live runtime per session,
//! many attachments per connection and many connections per session; control
//! commands need an attachment and a live session; every operation's end
//! broadcasts a session snapshot; progress goes only to the connections
//! attached at that moment; a runtime error closes every attached connection;
//! a session is disposed exactly when it has no attachments, no operations in
//! flight and its phase is idle.

mod catalog;
mod connection;
mod display;
mod invariants;
mod list;
mod sessions;
mod snapshots;
mod throttle;
mod timers;
pub(crate) mod v8;

pub use connection::{Stage, network_token_problem};

use crate::ids::{ChannelId, ConnId, OpId, PeerAddr, WorkerId};
use crate::limits::Limits;
use crate::protocol::codec::cbor_error;
use crate::protocol::codec::direct;
use crate::protocol::codec::spliced::{self, EncodedSnapshot, Spliced};
use crate::protocol::v8::PROTOCOL_VERSION_V8;
use crate::protocol::{
    ClientHello, ClientMessage, CommandResult, ErrorCode, ModelMetadata, ModelRef,
    PROTOCOL_VERSION, PackedSnapshot, ProtocolError, Response, SchemaError, ServerEvent,
    ServerHello, ServerMessage, ServerSnapshot, SessionMetadata, SessionSnapshot, ThinkingLevel,
    TranscriptProgress, decode_client_message, encode_trusted_server_message,
};
use crate::rng::Rng;
use crate::time::Instant;
use crate::wire::frame::{FRAME_HEADER_LEN, encode_frame, write_header};
use crate::worker::{CreateSpec, FromWorker, ToWorker};
use catalog::Catalog;
use connection::{Connection, constant_time_eq};
use list::ListCache;
use sessions::Live;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use throttle::AuthThrottle;
use timers::{Timer, Timers};

/// An encoded frame (length header included), shared between recipients:
/// one buffer, or shared pieces (a hello holds the cached session list's).
pub use crate::wire::frame::Frame;

/// Static configuration of a server.
#[derive(Clone)]
pub struct Config {
    /// Reported in every server snapshot.
    pub server_id: String,
    /// When set, a remote client's hello must carry this token (`hello_error
    /// auth` otherwise), and a local one's too with [`Config::local_token`].
    pub token: Option<String>,
    /// Whether local clients (of the Unix socket, whose file permissions
    /// guard it) need the token too: a server whose token guards network
    /// listeners does not lock its own user's terminal out.
    pub local_token: bool,
    /// Seeds connection and session ids. The daemon draws it from the OS.
    pub seed: u64,
    /// Models offered, reported in server snapshots.
    pub models: Vec<ModelMetadata>,
    /// Bounds and deadlines.
    pub limits: Limits,
    /// Retire after this long with no connection and no live session
    /// (servers started on demand by a client); `None` runs until shut down.
    pub idle_exit: Option<std::time::Duration>,
}

/// The token is never printed, and a model by its id: a server's `Debug`
/// text goes to logs, and the model checker hashes it for every state.
impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            server_id,
            token,
            local_token,
            seed,
            models,
            limits,
            idle_exit,
        } = self;
        let models: Vec<String> = models
            .iter()
            .map(|m| format!("{}/{}", m.provider, m.id))
            .collect();
        f.debug_struct("Config")
            .field("server_id", server_id)
            .field("token", &token.as_ref().map(|_| "<set>"))
            .field("local_token", local_token)
            .field("seed", seed)
            .field("models", &models)
            .field("limits", limits)
            .field("idle_exit", idle_exit)
            .finish()
    }
}

/// Everything but the configuration, which is fixed for the server's life
/// (its `Debug` is [`Config`]'s own) and would be most of the text: the
/// model checker hashes this text for every state it reaches.
impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            config,
            now,
            rng,
            conns,
            sessions,
            workers,
            catalog,
            stored_models,
            previews,
            removals,
            timers,
            adoption_waiters,
            shown_revisions,
            revision,
            next_worker,
            next_op,
            shutting_down,
            shutdown_reported,
            idle_since,
            out,
            steps,
            list_cache,
            models_cbor: _,
            auth_throttle,
            directory,
            status_state,
            status_watchers,
            v8_managed,
        } = self;
        f.debug_struct("Server")
            .field("server_id", &config.server_id)
            .field("now", now)
            .field("rng", rng)
            .field("conns", conns)
            .field("sessions", sessions)
            .field("workers", workers)
            .field("catalog", catalog)
            .field("stored_models", stored_models)
            .field("previews", previews)
            .field("removals", removals)
            .field("timers", timers)
            .field("adoption_waiters", adoption_waiters)
            .field("shown_revisions", shown_revisions)
            .field("revision", revision)
            .field("next_worker", next_worker)
            .field("next_op", next_op)
            .field("shutting_down", shutting_down)
            .field("shutdown_reported", shutdown_reported)
            .field("idle_since", idle_since)
            .field("out", out)
            .field("steps", steps)
            .field("list_cache", list_cache)
            .field("auth_throttle", auth_throttle)
            .field("directory", directory)
            .field("status_state", status_state)
            .field("status_watchers", status_watchers)
            .field("v8_managed", v8_managed)
            .finish()
    }
}

/// A credential: never printed (a server's inputs and state go to logs).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// Why the kernel closes a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer broke the protocol; a `hello_error` was queued before the close.
    Protocol(String),
    /// It did not read its output fast enough (output bound reached).
    SlowConsumer,
    /// Its session's runtime failed (runtime-error semantics); no message is sent.
    RuntimeError,
    /// Over the connection limit; a `hello_error` was queued before the close.
    TooManyConnections,
    /// The server is shutting down.
    Shutdown,
    /// A new server replaces this one; clients reconnect to it.
    Replaced,
}

impl CloseReason {
    /// Whether the driver writes the connection's queued output (the
    /// `hello_error` explaining the close) before it ends the stream. Every
    /// other close ends it at once: a slow consumer would never drain, and a
    /// shutdown or replacement has nothing left to say.
    pub fn flushes_first(&self) -> bool {
        matches!(self, Self::Protocol(_) | Self::TooManyConnections)
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
            Self::SlowConsumer => f.write_str("slow consumer"),
            Self::RuntimeError => f.write_str("session runtime error"),
            Self::TooManyConnections => f.write_str("too many connections"),
            Self::Shutdown => f.write_str("server shutdown"),
            Self::Replaced => f.write_str("server replaced"),
        }
    }
}

/// Everything that can happen to a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Only time passed (see [`Server::next_deadline`]).
    Tick,
    /// The stored session catalog finished loading. Until then hellos wait.
    CatalogLoaded {
        sessions: Vec<SessionMetadata>,
        /// Their models, where their `meta.json` records one.
        models: Vec<StoredDetails>,
    },
    /// Something in the session directory changed (a sibling server sharing
    /// it created, renamed or removed a session): scan it once changes settle.
    CatalogChanged,
    /// The session directory cannot be watched; poll it instead.
    CatalogUnwatched,
    /// The scan asked for by [`Output::ScanCatalog`]: every stored session.
    CatalogScanned {
        scan: u64,
        sessions: Vec<SessionMetadata>,
        /// Their models, where their `meta.json` records one.
        models: Vec<StoredDetails>,
    },
    /// A client connected. `conn` is fresh for this server's lifetime;
    /// `peer` is a remote client's address (failed tokens back off per
    /// address), `None` for a local one.
    Accepted {
        conn: ConnId,
        peer: Option<PeerAddr>,
    },
    /// The transport of `conn` carried a credential before any byte (a
    /// WebSocket's `Authorization: Bearer` at its upgrade): a v8 hello,
    /// which has no token, is checked with it.
    Presented { conn: ConnId, token: Secret },
    /// Bytes arrived from a client, in stream order.
    Received { conn: ConnId, bytes: Vec<u8> },
    /// The driver wrote `bytes` of this connection's queued output.
    Written { conn: ConnId, bytes: usize },
    /// The connection is gone (peer closed, or the driver finished closing it).
    Disconnected { conn: ConnId },
    /// The worker process runs; it was given `token` (a secret the driver
    /// drew) to prove itself with in its hello.
    WorkerSpawned { worker: WorkerId, token: String },
    /// The worker process could not be started.
    WorkerSpawnFailed { worker: WorkerId, error: String },
    /// A worker sent a message.
    FromWorker {
        worker: WorkerId,
        message: Box<FromWorker>,
    },
    /// The worker process exited (for any reason).
    WorkerExited { worker: WorkerId },
    /// The driver finished deleting a stored session (see [`Output::RemoveSession`]).
    SessionRemoved {
        session_id: String,
        result: Result<(), String>,
    },
    /// Close gracefully: stop accepting, close connections, dispose every runtime.
    Shutdown,
    /// A fresh channel on the worker socket said hello: a worker this server
    /// spawned, if the token is the one it was given.
    WorkerHello {
        channel: ChannelId,
        session_id: String,
        token: String,
        pid: u64,
    },
    /// A worker of another (replaced or crashed) server announces itself with
    /// its session's snapshot, asking to be adopted.
    WorkerAnnounced {
        channel: ChannelId,
        session_id: String,
        pid: u64,
        /// The worker channel version of its hello.
        version: u64,
        snapshot: Box<PackedSnapshot>,
    },
    /// A new server with this server's id asks to take over: hand every
    /// worker over without stopping it, close every connection, then finish.
    HandoffRequested,
    /// This server took over from another one, which released the workers of
    /// these sessions: they will announce themselves. Until they do (or
    /// [`Limits::adoption_wait`] passes), attaches to them wait instead of
    /// spawning a second worker that would find the session locked.
    AdoptionsExpected { sessions: Vec<String> },
}

/// Everything the driver must do for a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Queue `frame` on the connection's byte stream.
    Send { conn: ConnId, frame: Frame },
    /// Close the connection once its queued output is written (or at once if
    /// it cannot be); then report [`Input::Disconnected`].
    Close { conn: ConnId, reason: CloseReason },
    /// Start a worker process for `session_id`, and report
    /// [`Input::WorkerSpawned`] with the token it was given. `create` and
    /// `revision_floor` say what it is for (its start carries them).
    SpawnWorker {
        worker: WorkerId,
        session_id: String,
        create: Option<Box<CreateSpec>>,
        revision_floor: u64,
    },
    /// The hello on `channel` is `worker`'s: bind the channel to it and send
    /// it its start, with these.
    StartWorker {
        channel: ChannelId,
        worker: WorkerId,
        create: Option<Box<CreateSpec>>,
        /// The highest revision shown so far: the worker starts above it.
        revision_floor: u64,
    },
    /// Deliver a message to a worker.
    ToWorker { worker: WorkerId, message: ToWorker },
    /// Kill the worker process (it missed a deadline).
    KillWorker { worker: WorkerId },
    /// Delete the stored session; report [`Input::SessionRemoved`].
    RemoveSession { session_id: String },
    /// Read the stored sessions as a catalog load does; report
    /// [`Input::CatalogScanned`] with this `scan`.
    ScanCatalog { scan: u64 },
    /// Stop accepting connections.
    StopAccepting,
    /// Every connection is closed and every worker exited (or, after a
    /// hand-off, was released): the server may exit.
    ShutdownComplete,
    /// Bind the announcing worker's channel to `worker`: it is adopted.
    AdoptWorker {
        channel: ChannelId,
        worker: WorkerId,
        session_id: String,
    },
    /// Refuse the worker that said hello or announced itself on `channel`;
    /// close the channel.
    RejectWorker { channel: ChannelId, reason: String },
    /// Hand-off: let go of this worker without stopping it (close its
    /// channel, forget it); it will announce itself to the next server.
    ReleaseWorker { worker: WorkerId },
}

/// What a stored session's `meta.json` records beyond v1's metadata: its
/// model and thinking level, and a preview of its first prompt (pi's own
/// sessions record none of it).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredDetails {
    /// The session.
    pub session_id: String,
    /// Its model.
    pub model: ModelRef,
    /// Its thinking level.
    pub thinking_level: ThinkingLevel,
    /// Its first prompt, cut ([`preview`]), once it has one.
    pub preview: Option<String>,
}

impl StoredDetails {
    fn maps(
        details: Vec<Self>,
    ) -> (
        BTreeMap<String, (ModelRef, ThinkingLevel)>,
        BTreeMap<String, String>,
    ) {
        let mut models = BTreeMap::new();
        let mut previews = BTreeMap::new();
        for d in details {
            if let Some(preview) = d.preview {
                previews.insert(d.session_id.clone(), preview);
            }
            models.insert(d.session_id, (d.model, d.thinking_level));
        }
        (models, previews)
    }
}

/// The longest preview of a first prompt, in characters.
pub const PREVIEW_CHARS: usize = 60;

/// How `list` shows an unnamed session: its first prompt on one line, its
/// runs of white space made one space, cut to [`PREVIEW_CHARS`] with `…`.
pub fn preview(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(PREVIEW_CHARS) {
        Some((at, _)) => format!("{}…", line[..at].trim_end()),
        None => line,
    }
}

/// The server state machine. See the module documentation.
#[derive(Clone)]
pub struct Server {
    config: Config,
    now: Instant,
    rng: Rng,
    conns: BTreeMap<ConnId, Connection>,
    sessions: BTreeMap<String, Live>,
    workers: BTreeMap<WorkerId, String>,
    catalog: Catalog,
    /// The model and thinking level of each stored session, as its
    /// `meta.json` records it (from the catalog's scans) or its last worker
    /// reported it: what `status` says of a session that is not live.
    stored_models: BTreeMap<String, (ModelRef, ThinkingLevel)>,
    /// Each stored session's first prompt, cut, from its `meta.json`.
    previews: BTreeMap<String, String>,
    /// Removals of sessions whose worker has exited, waiting for the store.
    removals: BTreeMap<String, sessions::Removal>,
    /// Every deadline but the catalog's and the idle exit's: handshakes,
    /// workers, holds, and the released workers expected to announce
    /// themselves ([`Timer::Expected`]).
    timers: Timers,
    /// Attaches waiting for an expected adoption.
    adoption_waiters: BTreeMap<String, Vec<Waiter>>,
    /// The highest revision any worker reported for each session, kept
    /// across workers: the next worker starts above it.
    shown_revisions: BTreeMap<String, u64>,
    revision: u64,
    next_worker: u64,
    next_op: u64,
    shutting_down: bool,
    shutdown_reported: bool,
    idle_since: Option<Instant>,
    out: Vec<Output>,
    /// Steps taken, for the periodic full invariant check.
    steps: u64,
    /// The session list of `list` and server snapshots, encoded (see [`ListCache`]).
    list_cache: Option<ListCache>,
    /// CBOR of the models array of server snapshots (the models never change).
    models_cbor: Result<Cbor, SchemaError>,
    /// Failed tokens, per remote address.
    auth_throttle: AuthThrottle,
    /// `pi.session-directory`'s state, while v8 clients subscribe to it.
    directory: Option<crate::chord::State>,
    /// `pi-server.session-status`'s state, and the connections that may
    /// subscribe to it (pruned when it is published).
    status_state: Option<crate::chord::State>,
    status_watchers: BTreeSet<ConnId>,
    /// v8 connections whose management call ended in this step, with more
    /// waiting ([`Server::v8_run_management`]).
    v8_managed: std::collections::BTreeSet<ConnId>,
}

impl Server {
    /// A server with no connections, waiting for [`Input::CatalogLoaded`].
    pub fn new(config: Config) -> Self {
        assert!(
            config.limits.validate().is_ok(),
            "invalid limits: {:?}",
            config.limits.validate()
        );
        let rng = Rng::new(config.seed);
        let models_cbor = spliced::encode_list(&config.models)
            .map(Cbor)
            .map_err(cbor_error);
        let limits = &config.limits;
        let auth_throttle = AuthThrottle::new(
            limits.auth_backoff_base,
            limits.auth_backoff_max,
            limits.auth_throttle_peers,
        );
        Self {
            auth_throttle,
            config,
            now: Instant(0),
            rng,
            conns: BTreeMap::new(),
            sessions: BTreeMap::new(),
            workers: BTreeMap::new(),
            catalog: Catalog::default(),
            stored_models: BTreeMap::new(),
            previews: BTreeMap::new(),
            removals: BTreeMap::new(),
            timers: Timers::default(),
            adoption_waiters: BTreeMap::new(),
            shown_revisions: BTreeMap::new(),
            revision: 0,
            next_worker: 1,
            next_op: 1,
            shutting_down: false,
            shutdown_reported: false,
            idle_since: Some(Instant(0)),
            out: Vec::new(),
            steps: 0,
            list_cache: None,
            models_cbor,
            directory: None,
            status_state: None,
            status_watchers: BTreeSet::new(),
            v8_managed: std::collections::BTreeSet::new(),
        }
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Feeds one input at time `now` (never earlier than the previous step's).
    /// Returns every output, in the order the driver must carry them out.
    pub fn step(&mut self, now: Instant, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        self.step_into(now, input, &mut out);
        out
    }

    /// [`Server::step`], appending the outputs to `out`: a driver that keeps
    /// one buffer for them allocates none per step.
    pub fn step_into(&mut self, now: Instant, input: Input, out: &mut Vec<Output>) {
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        self.now = now;
        self.steps += 1;
        let scope = if cfg!(debug_assertions) {
            Scope::All
        } else {
            self.scope_of(&input)
        };
        // What a session's status shows changes with anything but a reply's
        // progress and a socket's writes: those leave it alone.
        let quiet = match &input {
            Input::Written { .. } => true,
            Input::FromWorker { message, .. } => {
                matches!(**message, crate::worker::FromWorker::Progress { .. })
            }
            _ => false,
        };
        match input {
            Input::Tick => self.on_tick(),
            Input::CatalogLoaded { sessions, models } => self.on_catalog_loaded(sessions, models),
            Input::CatalogChanged => {
                let settle = self.config.limits.catalog_settle;
                self.catalog.changed(self.now, settle);
            }
            Input::CatalogUnwatched => {
                let poll = self.config.limits.catalog_poll;
                self.catalog.unwatched(self.now, poll);
            }
            Input::CatalogScanned {
                scan,
                sessions,
                models,
            } => self.on_catalog_scanned(scan, sessions, models),
            Input::Accepted { conn, peer } => self.on_accepted(conn, peer),
            Input::Presented { conn, token } => {
                if let Some(c) = self.conns.get_mut(&conn)
                    && c.stage == Stage::AwaitingHello
                {
                    c.presented = Some(token);
                }
            }
            Input::Received { conn, bytes } => self.on_received(conn, &bytes),
            Input::Written { conn, bytes } => self.on_written(conn, bytes),
            Input::Disconnected { conn } => self.on_disconnected(conn),
            Input::WorkerSpawned { worker, token } => self.on_worker_spawned(worker, token),
            Input::WorkerHello {
                channel,
                session_id,
                token,
                pid,
            } => self.on_worker_hello(channel, session_id, token, pid),
            Input::WorkerSpawnFailed { worker, error } => {
                self.on_worker_spawn_failed(worker, error)
            }
            Input::FromWorker { worker, message } => self.on_worker_message(worker, *message),
            Input::WorkerExited { worker } => self.on_worker_exited(worker),
            Input::SessionRemoved { session_id, result } => {
                self.on_session_removed(session_id, result)
            }
            Input::Shutdown => self.on_shutdown(),
            Input::WorkerAnnounced {
                channel,
                session_id,
                pid,
                version,
                snapshot,
            } => self.on_worker_announced(channel, session_id, pid, version, *snapshot),
            Input::HandoffRequested => self.on_handoff(),
            Input::AdoptionsExpected { sessions } => self.on_adoptions_expected(sessions),
        }
        self.v8_run_management();
        if !quiet && !self.status_watchers.is_empty() {
            self.v8_publish_status();
        }
        self.track_idle();
        self.maybe_report_shutdown();
        self.check_step(&scope);
        out.append(&mut self.out);
    }

    /// The earliest time at which [`Input::Tick`] has work to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        // A shutting-down server starts no scan (see `on_tick`): a due scan
        // reported here would be a deadline in the past for good, and the
        // driver's loop would spin until the shutdown completed.
        let scan = match self.shutting_down {
            true => None,
            false => self.catalog.scan_deadline(),
        };
        [self.timers.next(), self.idle_deadline(), scan]
            .into_iter()
            .flatten()
            .min()
    }

    /// When an idle server started on demand retires.
    fn idle_deadline(&self) -> Option<Instant> {
        let grace = self.config.idle_exit?;
        if self.shutting_down {
            return None;
        }
        self.idle_since.map(|since| since + grace)
    }

    fn track_idle(&mut self) {
        let idle = self.conns.is_empty() && self.sessions.is_empty();
        match (idle, self.idle_since) {
            (true, None) => self.idle_since = Some(self.now),
            (false, Some(_)) => self.idle_since = None,
            _ => {}
        }
    }

    /// The server snapshot revision (increments only when a broadcast goes out).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Whether the peer closing its side of `conn` ends the connection now
    /// (report [`Input::Disconnected`]). A closing connection is still
    /// writing the output of its close (see [`CloseReason::flushes_first`]);
    /// its end is reported when that is done.
    pub fn ends_on_read_close(&self, conn: ConnId) -> bool {
        self.connection_stage(conn) != Some(Stage::Closing)
    }

    /// Stage of a connection, if the server still knows it.
    pub fn connection_stage(&self, conn: ConnId) -> Option<Stage> {
        self.conns.get(&conn).map(|c| c.stage)
    }

    /// Number of connections the server tracks (any stage).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Sessions a connection is attached to.
    pub fn attachments(&self, conn: ConnId) -> Vec<String> {
        self.conns
            .get(&conn)
            .map(|c| c.attached.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The revision of a live session's latest snapshot, once it has one.
    pub fn session_revision(&self, session_id: &str) -> Option<u64> {
        self.sessions.get(session_id)?.snapshot_revision()
    }

    /// Live sessions and their worker, in id order.
    pub fn live_sessions(&self) -> Vec<(String, WorkerId, crate::worker::WorkerState)> {
        self.sessions
            .values()
            .map(|s| (s.id.clone(), s.worker.id(), s.worker.state()))
            .collect()
    }

    /// Bytes queued for a connection and not yet written.
    pub fn queued_bytes(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, |c| c.queued_bytes)
    }

    /// True once shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    // ---- connections -------------------------------------------------------

    fn on_accepted(&mut self, id: ConnId, peer: Option<PeerAddr>) {
        assert!(!self.conns.contains_key(&id), "connection id {id} reused");
        let limits = &self.config.limits;
        let conn = Connection::new(id, limits.max_frame_len, peer);
        if self.shutting_down || self.conns.len() >= limits.max_connections {
            self.conns.insert(id, conn);
            let (code, message, reason) = if self.shutting_down {
                (
                    ErrorCode::InvalidRequest,
                    "Server is shutting down".to_string(),
                    CloseReason::Shutdown,
                )
            } else {
                (
                    ErrorCode::InternalError,
                    format!(
                        "Server is at its connection limit ({})",
                        limits.max_connections
                    ),
                    CloseReason::TooManyConnections,
                )
            };
            self.send(
                id,
                &ServerMessage::HelloError(ProtocolError::new(code, message)),
            );
            self.close(id, reason);
            return;
        }
        let deadline = self.now + limits.handshake_timeout;
        self.conns.insert(id, conn);
        self.timers.set(Timer::Handshake(id), Some(deadline));
    }

    fn on_received(&mut self, id: ConnId, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.stage == Stage::Closing {
            return;
        }
        let mut payloads = Vec::new();
        let framing = conn.decoder.push(bytes, &mut payloads);
        for payload in payloads {
            if self
                .conns
                .get(&id)
                .is_none_or(|c| c.stage == Stage::Closing)
            {
                return;
            }
            if self.is_v8(id) {
                self.on_v8_payload(id, &payload);
                continue;
            }
            match decode_client_message(&payload, &self.config.limits.cbor) {
                Ok(message) => self.on_message(id, message),
                Err(e) => return self.fail_protocol(id, ErrorCode::InvalidRequest, e.to_string()),
            }
        }
        if let Err(e) = framing {
            self.fail_protocol(id, ErrorCode::InvalidRequest, e.to_string());
        }
    }

    fn on_message(&mut self, id: ConnId, message: ClientMessage) {
        let stage = self.conns[&id].stage;
        match (stage, message) {
            (Stage::AwaitingHello, ClientMessage::Hello(hello)) => self.on_hello(id, hello),
            (Stage::AwaitingHello, ClientMessage::Request(_)) => self.fail_protocol(
                id,
                ErrorCode::InvalidRequest,
                "The first client message must be hello".into(),
            ),
            (_, ClientMessage::Hello(_)) => self.fail_protocol(
                id,
                ErrorCode::InvalidRequest,
                "hello may only be sent as the first message".into(),
            ),
            (Stage::Handshaking, ClientMessage::Request(request)) => {
                let max = self.config.limits.max_deferred_requests;
                let conn = self.conns.get_mut(&id).expect("checked");
                if conn.deferred.len() >= max {
                    let message =
                        format!("More than {max} requests sent before the handshake completed");
                    return self.fail_protocol(id, ErrorCode::InvalidRequest, message);
                }
                conn.deferred.push_back(request);
            }
            (Stage::Ready, ClientMessage::Request(request)) => self.on_request(id, request),
            (Stage::Closing, _) => {}
        }
    }

    fn on_hello(&mut self, id: ConnId, hello: ClientHello) {
        if hello.version == PROTOCOL_VERSION_V8 {
            return self.on_hello_v8(id);
        }
        if !self.authenticate(id, hello.token.as_deref(), "A token is required") {
            return;
        }
        if hello.version != PROTOCOL_VERSION {
            let message = format!(
                "Unsupported protocol version {}; expected {PROTOCOL_VERSION}",
                hello.version
            );
            return self.fail_protocol(id, ErrorCode::Version, message);
        }
        self.conns.get_mut(&id).expect("checked").stage = Stage::Handshaking;
        if self.catalog.is_loaded() {
            self.complete_handshake(id);
        }
    }

    /// Checks the token a client gave (in its v1 hello, or at its transport
    /// for v8) against the configured one, in constant time, with failures
    /// backing off per remote address. With no token configured anything
    /// passes, and so does a local client unless [`Config::local_token`]. A failure ends the connection with `hello_error auth`
    /// (`missing` when no token was given) and returns false.
    fn authenticate(&mut self, id: ConnId, given: Option<&str>, missing: &str) -> bool {
        let Some(expected) = &self.config.token else {
            return true;
        };
        let peer = self.conns.get(&id).expect("checked").peer.clone();
        if peer.is_none() && !self.config.local_token {
            return true;
        }
        if let Some(wait) = peer
            .as_ref()
            .and_then(|p| self.auth_throttle.locked(p, self.now))
        {
            let message = format!(
                "Too many failed tokens from this address; retry in {} s",
                wait.as_millis().div_ceil(1000)
            );
            self.fail_protocol(id, ErrorCode::Auth, message);
            return false;
        }
        if !constant_time_eq(given.unwrap_or("").as_bytes(), expected.as_bytes()) {
            let message = match given {
                None => missing,
                Some(_) => "Invalid token",
            };
            if let Some(p) = peer {
                self.auth_throttle.failed(p, self.now);
            }
            self.fail_protocol(id, ErrorCode::Auth, message.into());
            return false;
        }
        if let Some(p) = &peer {
            self.auth_throttle.succeeded(p);
        }
        true
    }

    /// A v8 hello. v8 carries no token: over the Unix socket its
    /// permissions are the check, as pi's server prescribes; a remote
    /// client presents the token at its transport (the WebSocket upgrade's
    /// `Authorization: Bearer`, [`Input::Presented`]).
    fn on_hello_v8(&mut self, id: ConnId) {
        let conn = &self.conns[&id];
        if conn.peer.is_some() {
            let presented = conn.presented.as_ref().map(|s| s.0.clone());
            let missing = "Protocol v8 carries no token: present it at the transport \
                 (Authorization: Bearer, or a page's pi.token. subprotocol, on the \
                 WebSocket upgrade), or use protocol v1";
            if !self.authenticate(id, presented.as_deref(), missing) {
                return;
            }
        }
        let conn = self.conns.get_mut(&id).expect("checked");
        conn.v8 = Some(Box::default());
        conn.stage = Stage::Handshaking;
        if self.catalog.is_loaded() {
            self.complete_handshake(id);
        }
    }

    fn complete_handshake(&mut self, id: ConnId) {
        let frame = match self.is_v8(id) {
            true => self.v8_hello_frame(),
            false => {
                let connection_id = self.rng.uuid_v4();
                self.hello_frame(&connection_id)
            }
        };
        self.send_encoded(id, frame);
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.stage != Stage::Handshaking {
            return; // the hello could not be queued (output bound); already closing
        }
        conn.stage = Stage::Ready;
        self.timers.set(Timer::Handshake(id), None);
        self.v8_run_deferred(id);
        while let Some(request) = self.conns.get_mut(&id).and_then(|c| c.deferred.pop_front()) {
            if !self.conns.get(&id).is_some_and(Connection::is_ready) {
                break;
            }
            self.on_request(id, request);
        }
    }

    fn on_catalog_loaded(&mut self, sessions: Vec<SessionMetadata>, models: Vec<StoredDetails>) {
        self.stored_on_disk(&sessions);
        self.catalog.load(sessions);
        (self.stored_models, self.previews) = StoredDetails::maps(models);
        let waiting: Vec<ConnId> = self
            .conns
            .values()
            .filter(|c| c.stage == Stage::Handshaking)
            .map(|c| c.id)
            .collect();
        for id in waiting {
            self.complete_handshake(id);
        }
    }

    fn on_catalog_scanned(
        &mut self,
        scan: u64,
        sessions: Vec<SessionMetadata>,
        models: Vec<StoredDetails>,
    ) {
        self.stored_on_disk(&sessions);
        let sessions_live = &self.sessions;
        let changed = self.catalog.reconcile(self.now, scan, sessions, |id| {
            sessions_live.contains_key(id)
        });
        if changed.is_some() {
            (self.stored_models, self.previews) = StoredDetails::maps(models);
        }
        if changed == Some(true) {
            self.publish_server_snapshot();
        }
    }

    fn on_written(&mut self, id: ConnId, bytes: usize) {
        if let Some(conn) = self.conns.get_mut(&id) {
            assert!(
                bytes <= conn.queued_bytes,
                "{id}: wrote {bytes} of {} queued",
                conn.queued_bytes
            );
            conn.queued_bytes -= bytes;
        }
    }

    fn on_disconnected(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let was_ready = conn.stage == Stage::Ready;
        if conn.stage != Stage::Closing {
            self.detach_everywhere(id);
        }
        self.conns.remove(&id);
        self.timers.set(Timer::Handshake(id), None);
        if was_ready {
            self.publish_server_snapshot();
        }
    }

    fn on_tick(&mut self) {
        let now = self.now;
        let expired = self.timers.expired(now, |timer| match timer {
            Timer::Handshake(conn) => Some(*conn),
            _ => None,
        });
        for id in expired {
            self.timers.set(Timer::Handshake(id), None);
            self.fail_protocol(id, ErrorCode::InvalidRequest, "Handshake timeout".into());
        }
        self.on_worker_deadlines();
        self.on_hold_deadlines();
        self.on_expected_deadlines();
        if !self.shutting_down
            && let Some(scan) = self.catalog.start_scan(now)
        {
            self.out.push(Output::ScanCatalog { scan });
        }
        if self.idle_deadline().is_some_and(|d| d <= now) {
            self.on_shutdown();
        }
    }

    /// Sends `hello_error` and closes: the end of a connection that broke the protocol.
    fn fail_protocol(&mut self, id: ConnId, code: ErrorCode, message: String) {
        let error = ProtocolError::new(code, message.clone());
        self.send(id, &ServerMessage::HelloError(error));
        self.close(id, CloseReason::Protocol(message));
    }

    /// Detaches the connection from everything and asks the driver to close it.
    fn close(&mut self, id: ConnId, reason: CloseReason) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if conn.stage == Stage::Closing {
            return;
        }
        let was_ready = conn.stage == Stage::Ready;
        self.detach_everywhere(id);
        let conn = self.conns.get_mut(&id).expect("checked");
        conn.stage = Stage::Closing;
        conn.deferred.clear();
        self.timers.set(Timer::Handshake(id), None);
        self.out.push(Output::Close { conn: id, reason });
        if was_ready {
            self.publish_server_snapshot();
        }
    }

    // ---- sending -----------------------------------------------------------

    fn encode(&self, message: &ServerMessage) -> Result<Frame, String> {
        let payload = encode_trusted_server_message(message).map_err(|e| e.to_string())?;
        let frame =
            encode_frame(&payload, self.config.limits.max_frame_len).map_err(|e| e.to_string())?;
        Ok(Frame::from(frame))
    }

    /// The `session_progress` event of a session, written directly into its
    /// frame ([`direct`]); debug builds compare it with the checked tree
    /// path ([`Self::checked`]).
    fn progress_frame(
        &self,
        session_id: &str,
        progress: &TranscriptProgress,
    ) -> Result<Frame, String> {
        let capacity = direct::progress_event_capacity(session_id, progress);
        let frame = self.direct_frame(capacity, |out| {
            direct::encode_progress_event(session_id, progress, out)
        });
        self.checked(frame, || {
            ServerMessage::Event(ServerEvent::SessionProgress {
                session_id: session_id.to_string(),
                progress: progress.clone(),
            })
        })
    }

    /// A frame whose payload `write` appends ([`direct`]), with room for
    /// `capacity` bytes of it.
    fn direct_frame(
        &self,
        capacity: usize,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), crate::wire::CborError>,
    ) -> Result<Frame, String> {
        let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + capacity);
        frame.extend_from_slice(&[0; FRAME_HEADER_LEN]);
        write(&mut frame).map_err(|e| cbor_error(e).to_string())?;
        write_header(&mut frame, self.config.limits.max_frame_len).map_err(|e| e.to_string())?;
        Ok(Frame::from(frame))
    }

    /// Encodes and queues one message; an unencodable message closes the connection.
    fn send(&mut self, id: ConnId, message: &ServerMessage) {
        let frame = self.encode(message);
        self.send_encoded(id, frame);
    }

    /// Queues an encoded message; one that could not be encoded closes the connection.
    fn send_encoded(&mut self, id: ConnId, frame: Result<Frame, String>) {
        match frame {
            Ok(frame) => self.send_frame(id, frame),
            Err(e) => self.close(id, CloseReason::Protocol(format!("cannot send: {e}"))),
        }
    }

    /// Queues a frame, enforcing the output bound.
    fn send_frame(&mut self, id: ConnId, frame: Frame) {
        let max = self.config.limits.max_output_bytes_per_connection;
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.stage == Stage::Closing {
            return;
        }
        if conn.queued_bytes + frame.len() > max {
            return self.close(id, CloseReason::SlowConsumer);
        }
        conn.queued_bytes += frame.len();
        self.out.push(Output::Send { conn: id, frame });
    }

    fn respond(
        &mut self,
        id: ConnId,
        request_id: String,
        outcome: Result<CommandResult, ProtocolError>,
    ) {
        if !self.conns.get(&id).is_some_and(Connection::is_ready) {
            return;
        }
        if self.is_v8(id) {
            return self.v8_respond(id, &request_id, outcome);
        }
        let frame = match &outcome {
            // The answers to `detach` and `remove`, which name only the
            // session: written directly.
            Ok(
                result @ (CommandResult::Detach { session_id }
                | CommandResult::Remove { session_id }),
            ) => {
                let capacity = direct::session_id_response_capacity(&request_id, session_id);
                let frame = self.direct_frame(capacity, |out| {
                    direct::encode_session_id_response(&request_id, result.name(), session_id, out)
                });
                self.checked(frame, || {
                    ServerMessage::Response(Response {
                        id: request_id.clone(),
                        outcome: outcome.clone(),
                    })
                })
            }
            _ => self.encode(&ServerMessage::Response(Response {
                id: request_id,
                outcome,
            })),
        };
        self.send_encoded(id, frame);
    }

    fn respond_error(&mut self, id: ConnId, request_id: String, code: ErrorCode, message: String) {
        self.respond(id, request_id, Err(ProtocolError::new(code, message)));
    }

    /// A pending request's response is owed no more.
    fn finish_pending(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            assert!(conn.in_flight > 0, "{id}: no request in flight");
            conn.in_flight -= 1;
        }
    }

    // ---- shutdown ----------------------------------------------------------

    fn on_shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.out.push(Output::StopAccepting);
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(id, CloseReason::Shutdown);
        }
        // A stop keeps turns: a session with work under way is released, as
        // to a successor, and its worker goes on as an orphan (adopted by
        // the next server, or retiring once idle); the rest are disposed.
        let live: Vec<String> = self.sessions.keys().cloned().collect();
        for session in live {
            if self.has_work(&session) {
                self.release(&session);
            } else {
                self.dispose(&session);
            }
        }
    }

    fn maybe_report_shutdown(&mut self) {
        if self.shutting_down
            && !self.shutdown_reported
            && self.conns.is_empty()
            && self.sessions.is_empty()
        {
            self.shutdown_reported = true;
            self.out.push(Output::ShutdownComplete);
        }
    }

    fn fresh_worker_id(&mut self) -> WorkerId {
        let id = WorkerId(self.next_worker);
        self.next_worker += 1;
        id
    }

    fn fresh_op_id(&mut self) -> OpId {
        let id = OpId(self.next_op);
        self.next_op += 1;
        id
    }
}

/// In release builds, [`Server::step`] checks only what its input touched
/// and sweeps every connection and session once every this many steps.
///
/// The full sweep ([`Server::check_invariants`]) is O(connections + live
/// sessions): 65 µs per step with 1,000 connections, and every write
/// acknowledgement ([`Input::Written`]) is a step, so sweeping after each one
/// made a broadcast to N connections cost O(N²). Checking the touched
/// connection and session (not the session's whole audience) keeps the
/// per-step cost independent of the number of connections; the periodic
/// sweep still catches corruption anywhere, within 1,024 steps, at an
/// amortised cost below 0.1 µs per step at 1,000 connections. Debug builds
/// (every test and the simulator) sweep after every step.
const FULL_CHECK_INTERVAL: u64 = 1024;

/// Encoded CBOR. Its `Debug` is its length: the bytes say nothing to a
/// reader, and the model checker hashes the server's `Debug` text.
#[derive(Clone)]
struct Cbor(Vec<u8>);

impl fmt::Debug for Cbor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cbor({} bytes)", self.0.len())
    }
}

/// What one input concerns, for the invariant check after its step.
#[derive(Debug, Clone)]
enum Scope {
    /// The step may have touched any connection or session: sweep everything.
    All,
    /// The step concerns this connection and/or this session.
    Touched {
        conn: Option<ConnId>,
        session: Option<String>,
    },
}

/// A live session's list entry: its stored metadata (if it has any) updated
/// from its snapshot.
fn listed_metadata(stored: Option<&SessionMetadata>, snap: &SessionSnapshot) -> SessionMetadata {
    let mut meta = stored.cloned().unwrap_or_else(|| metadata_of(snap));
    meta.created_at = snap.created_at;
    meta.updated_at = Some(snap.updated_at);
    meta.session_name = snap.name.clone();
    meta.cwd = Some(snap.cwd.clone());
    meta
}

/// Durable metadata of a session, from its snapshot.
fn metadata_of(snap: &SessionSnapshot) -> SessionMetadata {
    SessionMetadata {
        id: snap.id.clone(),
        created_at: snap.created_at,
        updated_at: Some(snap.updated_at),
        parent_session_id: None,
        session_name: snap.name.clone(),
        cwd: Some(snap.cwd.clone()),
    }
}

/// A request waiting for a session to open (or its transcript to come).
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub(crate) conn: ConnId,
    pub(crate) request_id: String,
    pub(crate) kind: Acquire,
}

impl Waiter {
    pub(crate) fn new(conn: ConnId, request_id: String, kind: Acquire) -> Self {
        Self {
            conn,
            request_id,
            kind,
        }
    }

    /// Whether a request waits here, counted in flight until it is
    /// admitted or refused; a restored attachment has no request.
    fn counted(&self) -> bool {
        self.kind != Acquire::Restore
    }
}

/// Request shapes accepted by [`Server`] that open a session.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Acquire {
    Create,
    Attach,
    /// A v8 `create`: stored and answered with its summary, not attached.
    Create8,
    /// A version 1 connection that a failed removal had detached without
    /// telling it, attached again: it has no request to answer, and is sent
    /// the session's snapshot as an event if it is news.
    Restore,
}

#[cfg(test)]
mod tests;
