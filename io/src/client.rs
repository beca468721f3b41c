//! An async client for pi protocol v1 over a Unix socket.
//!
//! [`Client::connect`] opens the socket, sends `hello` at once and waits for
//! the server's `hello` (or `hello_error`). [`Client::connect_stream`] does
//! the same over any connected byte stream (the network-fault tests run it
//! over simulated TCP). After that two tasks run beside
//! the [`Client`] value:
//!
//! - a reader that decodes frames, hands each response to the request waiting
//!   for its id, keeps the latest server and session snapshots, and publishes
//!   events to every [`Client::events`] subscriber;
//! - a writer that sends queued frames in order, so a request future that is
//!   dropped halfway never leaves half a frame on the wire.
//!
//! Requests may run concurrently (`prompt` stays pending for a whole turn
//! while `steer` and `abort` complete beside it). Ids are `request-1`,
//! `request-2`, … per client. As in the reference client, a response with an
//! unknown id, or whose `result.command` differs from the request's command,
//! is a protocol failure that closes the connection. When the connection
//! ends, every pending and later request fails with the reason it ended, and
//! event subscribers see [`broadcast::error::RecvError::Closed`] once they
//! have read what was already delivered.

use kernel::protocol::{
    ClientHello, ClientMessage, Command, CommandResult, CreateParams, ModelRef, PROTOCOL_VERSION,
    ProtocolError, Request, ServerEvent, ServerMessage, ServerSnapshot, SessionMetadata,
    SessionSnapshot, ThinkingLevel, decode_server_message, encode_client_message,
};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{CborLimits, FrameDecoder};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub mod leases;

/// Events buffered per subscriber before a slow one starts to lag.
pub const EVENT_CAPACITY: usize = 4096;

/// Frames queued for the writer before `request` waits.
const OUTGOING_CAPACITY: usize = 64;

/// Bytes read from the socket at a time.
const READ_CHUNK_LEN: usize = 64 * 1024;

/// How long [`Client::close`] waits for queued frames to be written.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The two directions of the connection, whatever the transport.
type ReadHalf = Box<dyn AsyncRead + Unpin + Send>;
type WriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

/// Why a client call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket could not be reached, read or written.
    Io(std::io::Error),
    /// The server refused: a `hello_error`, or a response with `ok:false`.
    Server(ProtocolError),
    /// The server sent something the protocol forbids (or a request could
    /// not be encoded); the connection is closed.
    Protocol(String),
    /// The connection is closed; the text says how it ended.
    Disconnected(String),
    /// A lease ([`leases::Sessions`]) was refused because it conflicts with
    /// one this client already holds or is acquiring; nothing was sent.
    Ownership {
        /// The contested session.
        session_id: String,
    },
    /// A command went through a lease that is not active (released,
    /// releasing or invalidated), or its session is not attached.
    Detached {
        /// The lease's session.
        session_id: String,
    },
}

impl Clone for ClientError {
    fn clone(&self) -> Self {
        match self {
            Self::Io(e) => Self::Io(std::io::Error::new(e.kind(), e.to_string())),
            Self::Server(e) => Self::Server(e.clone()),
            Self::Protocol(m) => Self::Protocol(m.clone()),
            Self::Disconnected(m) => Self::Disconnected(m.clone()),
            Self::Ownership { session_id } => Self::Ownership {
                session_id: session_id.clone(),
            },
            Self::Detached { session_id } => Self::Detached {
                session_id: session_id.clone(),
            },
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Server(e) => write!(f, "{} ({})", e.message, e.code.as_str()),
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
            Self::Disconnected(m) => write!(f, "disconnected: {m}"),
            Self::Ownership { session_id } => {
                write!(f, "session {session_id} is already leased in this client")
            }
            Self::Detached { session_id } => {
                write!(f, "session {session_id} is not attached through this lease")
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Connection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// Largest frame payload accepted or sent (the peers must agree).
    pub max_frame_len: u32,
    /// How long to wait for the server's hello.
    pub handshake_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// One connection to a pi server. See the module documentation.
#[derive(Debug)]
pub struct Client {
    shared: Arc<Shared>,
    connection_id: String,
    max_frame_len: u32,
    next_request: AtomicU64,
    events: broadcast::WeakSender<ServerEvent>,
    /// `None` once [`Client::close`] has begun.
    outgoing: Option<mpsc::Sender<Vec<u8>>>,
    reader: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
}

impl Client {
    /// Connects to the server listening at `path` with default options,
    /// sending `token` in the hello if given.
    pub async fn connect(path: &Path, token: Option<&str>) -> Result<Self, ClientError> {
        Self::connect_with(path, token, ClientOptions::default()).await
    }

    /// [`Client::connect`] with explicit options.
    pub async fn connect_with(
        path: &Path,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).await.map_err(ClientError::Io)?;
        Self::handshake(stream, token, options).await
    }

    /// Runs the handshake over an already connected stream.
    pub async fn handshake(
        stream: UnixStream,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let (read, write) = stream.into_split();
        Self::handshake_halves(Box::new(read), Box::new(write), token, options).await
    }

    /// Runs the handshake over any connected byte stream (TCP, an in-memory
    /// duplex, a simulated network's stream), then serves it like a socket.
    pub async fn connect_stream<S>(
        stream: S,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        Self::handshake_halves(Box::new(read), Box::new(write), token, options).await
    }

    async fn handshake_halves(
        read: ReadHalf,
        mut write: WriteHalf,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let hello = ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: token.map(str::to_owned),
        });
        let frame = encode_message(&hello, options.max_frame_len)?;
        write.write_all(&frame).await.map_err(ClientError::Io)?;

        let mut incoming = Incoming::new(read, options.max_frame_len);
        let first = tokio::time::timeout(options.handshake_timeout, incoming.next())
            .await
            .map_err(|_| {
                ClientError::Protocol(format!(
                    "no hello from the server within {} ms",
                    options.handshake_timeout.as_millis()
                ))
            })??;
        let hello = match first {
            Some(ServerMessage::Hello(hello)) => hello,
            Some(ServerMessage::HelloError(error)) => return Err(ClientError::Server(error)),
            Some(other) => {
                return Err(ClientError::Protocol(format!(
                    "expected hello from the server, got {}",
                    message_kind(&other)
                )));
            }
            None => {
                return Err(ClientError::Disconnected(
                    "the server closed the connection during the handshake".into(),
                ));
            }
        };
        if hello.version != PROTOCOL_VERSION {
            return Err(ClientError::Protocol(format!(
                "the server speaks protocol version {}, this client speaks {PROTOCOL_VERSION}",
                hello.version
            )));
        }

        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                closed: None,
                pending: HashMap::new(),
                server: hello.snapshot,
                sessions: HashMap::new(),
                tap: None,
            }),
            stop: stop_tx,
        });
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let weak_events = events.downgrade();
        let (outgoing, outgoing_rx) = mpsc::channel(OUTGOING_CAPACITY);
        let reader = tokio::spawn(read_loop(incoming, Arc::clone(&shared), events));
        let writer = tokio::spawn(write_loop(write, outgoing_rx, stop_rx, Arc::clone(&shared)));
        Ok(Self {
            shared,
            connection_id: hello.connection_id,
            max_frame_len: options.max_frame_len,
            next_request: AtomicU64::new(1),
            events: weak_events,
            outgoing: Some(outgoing),
            reader: Some(reader),
            writer: Some(writer),
        })
    }

    /// The id the server gave this connection.
    pub fn connection_id(&self) -> &str {
        &self.connection_id
    }

    /// The latest server snapshot (from the hello or a later `server_snapshot`
    /// event; an event with a lower revision is ignored).
    pub fn server_snapshot(&self) -> ServerSnapshot {
        self.shared.lock().server.clone()
    }

    /// The latest snapshot of a session seen on this connection (from events
    /// and command results), if any.
    pub fn session_snapshot(&self, session_id: &str) -> Option<SessionSnapshot> {
        self.shared.lock().sessions.get(session_id).cloned()
    }

    /// A new subscription to the server's events from now on. After the
    /// connection ends, `recv` yields what was delivered, then `Closed`.
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        match self.events.upgrade() {
            Some(sender) => sender.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Why the connection ended, or `None` while it is up.
    pub fn closed_reason(&self) -> Option<ClientError> {
        self.shared.lock().closed.clone()
    }

    /// Sends `command` and waits for its response.
    pub async fn request(&self, command: Command) -> Result<CommandResult, ClientError> {
        let number = self.next_request.fetch_add(1, Ordering::Relaxed);
        let id = format!("request-{number}");
        let name = command.name();
        let request = ClientMessage::Request(Request {
            id: id.clone(),
            command,
        });
        let frame = encode_message(&request, self.max_frame_len)?;
        let (reply, answer) = oneshot::channel();
        {
            let mut state = self.shared.lock();
            if let Some(reason) = &state.closed {
                return Err(reason.clone());
            }
            state.pending.insert(
                id.clone(),
                Pending {
                    command: name,
                    reply: Reply::Call(reply),
                },
            );
        }
        let sent = match &self.outgoing {
            Some(outgoing) => outgoing.send(frame).await.is_ok(),
            None => false,
        };
        if !sent {
            self.shared.lock().pending.remove(&id);
            return Err(self.closed_error());
        }
        match answer.await {
            Ok(outcome) => outcome,
            Err(_) => Err(self.closed_error()),
        }
    }

    /// `list`: the stored sessions.
    pub async fn list(&self) -> Result<Vec<SessionMetadata>, ClientError> {
        match self.request(Command::List).await? {
            CommandResult::List { sessions } => Ok(sessions),
            other => Err(unexpected(&other)),
        }
    }

    /// `create`: a new session, attached to this connection.
    pub async fn create(&self, params: CreateParams) -> Result<SessionSnapshot, ClientError> {
        session_of(self.request(Command::Create(params)).await?)
    }

    /// `attach`: follow a session's snapshots and progress.
    pub async fn attach(&self, session_id: &str) -> Result<SessionSnapshot, ClientError> {
        let session_id = session_id.to_owned();
        session_of(self.request(Command::Attach { session_id }).await?)
    }

    /// `detach`: stop following a session (a no-op when not attached).
    pub async fn detach(&self, session_id: &str) -> Result<(), ClientError> {
        let session_id = session_id.to_owned();
        self.request(Command::Detach { session_id }).await.map(drop)
    }

    /// `prompt`: resolves when the turn ends, with the final snapshot.
    pub async fn prompt(
        &self,
        session_id: &str,
        text: &str,
    ) -> Result<SessionSnapshot, ClientError> {
        let (session_id, text) = (session_id.to_owned(), text.to_owned());
        session_of(self.request(Command::Prompt { session_id, text }).await?)
    }

    /// `steer`: queue a message into the running turn.
    pub async fn steer(
        &self,
        session_id: &str,
        text: &str,
    ) -> Result<SessionSnapshot, ClientError> {
        let (session_id, text) = (session_id.to_owned(), text.to_owned());
        session_of(self.request(Command::Steer { session_id, text }).await?)
    }

    /// `abort`: stop the running turn.
    pub async fn abort(&self, session_id: &str) -> Result<SessionSnapshot, ClientError> {
        let session_id = session_id.to_owned();
        session_of(self.request(Command::Abort { session_id }).await?)
    }

    /// `set_model` (only while idle).
    pub async fn set_model(
        &self,
        session_id: &str,
        model: ModelRef,
    ) -> Result<SessionSnapshot, ClientError> {
        let session_id = session_id.to_owned();
        session_of(
            self.request(Command::SetModel { session_id, model })
                .await?,
        )
    }

    /// `set_thinking` (only while idle).
    pub async fn set_thinking(
        &self,
        session_id: &str,
        thinking_level: ThinkingLevel,
    ) -> Result<SessionSnapshot, ClientError> {
        let session_id = session_id.to_owned();
        let command = Command::SetThinking {
            session_id,
            thinking_level,
        };
        session_of(self.request(command).await?)
    }

    /// `remove` (our extension): delete a stored session.
    pub async fn remove(&self, session_id: &str) -> Result<(), ClientError> {
        let session_id = session_id.to_owned();
        self.request(Command::Remove { session_id }).await.map(drop)
    }

    /// Writes what is queued, closes the connection and fails anything still
    /// pending with [`ClientError::Disconnected`]. The server detaches this
    /// connection from its sessions.
    pub async fn close(mut self) {
        drop(self.outgoing.take());
        if let Some(writer) = self.writer.take() {
            let abort = writer.abort_handle();
            if tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, writer)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        self.shared.fail(ClientError::Disconnected(
            "the client closed the connection".into(),
        ));
    }

    /// Starts routing, in wire order, every event, every response to a
    /// request sent with [`Client::send_routed`] and the connection's end to
    /// the returned channel. Replaces an earlier tap.
    fn tap(&self) -> mpsc::UnboundedReceiver<Tapped> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.shared.lock();
        if state.closed.is_some() {
            let _ = tx.send(Tapped::Closed);
        } else {
            state.tap = Some(tx);
        }
        rx
    }

    /// Sends `request` under a fresh client id; its response goes to the tap
    /// carrying `request.id` again (so the lease machine keeps its own ids).
    /// Returns false when the connection is closed.
    async fn send_routed(&self, request: Request) -> bool {
        let number = self.next_request.fetch_add(1, Ordering::Relaxed);
        let id = format!("request-{number}");
        let name = request.command.name();
        let message = ClientMessage::Request(Request {
            id: id.clone(),
            command: request.command,
        });
        let Ok(frame) = encode_message(&message, self.max_frame_len) else {
            self.shared.fail(ClientError::Protocol(format!(
                "cannot encode the {name} request"
            )));
            return false;
        };
        {
            let mut state = self.shared.lock();
            if state.closed.is_some() {
                return false;
            }
            state.pending.insert(
                id.clone(),
                Pending {
                    command: name,
                    reply: Reply::Routed(request.id),
                },
            );
        }
        let sent = match &self.outgoing {
            Some(outgoing) => outgoing.send(frame).await.is_ok(),
            None => false,
        };
        if !sent {
            self.shared.lock().pending.remove(&id);
        }
        sent
    }

    fn closed_error(&self) -> ClientError {
        self.closed_reason()
            .unwrap_or_else(|| ClientError::Disconnected("the connection is closed".into()))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The writer ends by itself once `outgoing` is dropped, after writing
        // what was queued; the reader would wait for the server to hang up.
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

fn session_of(result: CommandResult) -> Result<SessionSnapshot, ClientError> {
    match result {
        CommandResult::Create { session }
        | CommandResult::Attach { session }
        | CommandResult::Prompt { session }
        | CommandResult::Steer { session }
        | CommandResult::Abort { session }
        | CommandResult::SetModel { session }
        | CommandResult::SetThinking { session } => Ok(session),
        other => Err(unexpected(&other)),
    }
}

/// Unreachable in practice: `request` already checked the result's command.
fn unexpected(result: &CommandResult) -> ClientError {
    ClientError::Protocol(format!("unexpected {} result", result.name()))
}

fn encode_message(message: &ClientMessage, max_frame_len: u32) -> Result<Vec<u8>, ClientError> {
    let payload = encode_client_message(message)
        .map_err(|e| ClientError::Protocol(format!("cannot encode the request: {e}")))?;
    encode_frame(&payload, max_frame_len)
        .map_err(|e| ClientError::Protocol(format!("cannot frame the request: {e}")))
}

fn message_kind(message: &ServerMessage) -> &'static str {
    match message {
        ServerMessage::Hello(_) => "hello",
        ServerMessage::HelloError(_) => "hello_error",
        ServerMessage::Response(_) => "a response",
        ServerMessage::Event(_) => "an event",
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Set to `true` when the connection has failed, to stop the writer.
    stop: watch::Sender<bool>,
}

#[derive(Debug)]
struct State {
    /// Why the connection ended; `None` while it is up.
    closed: Option<ClientError>,
    pending: HashMap<String, Pending>,
    server: ServerSnapshot,
    sessions: HashMap<String, SessionSnapshot>,
    /// Where routed responses, events and the end go (see [`Client::tap`]).
    tap: Option<mpsc::UnboundedSender<Tapped>>,
}

#[derive(Debug)]
struct Pending {
    command: &'static str,
    reply: Reply,
}

/// Where a response goes.
#[derive(Debug)]
enum Reply {
    /// To the [`Client::request`] call waiting for it.
    Call(oneshot::Sender<Result<CommandResult, ClientError>>),
    /// To the tap, under this (the lease machine's) request id.
    Routed(String),
}

impl Reply {
    fn send(
        self,
        tap: Option<&mpsc::UnboundedSender<Tapped>>,
        outcome: Result<CommandResult, ClientError>,
    ) {
        match self {
            Self::Call(reply) => {
                let _ = reply.send(outcome);
            }
            Self::Routed(id) => {
                // A protocol failure ends the connection, which the tap hears.
                let outcome = match outcome {
                    Ok(result) => Ok(result),
                    Err(ClientError::Server(error)) => Err(error),
                    Err(_) => return,
                };
                if let Some(tap) = tap {
                    let _ = tap.send(Tapped::Response(kernel::protocol::Response { id, outcome }));
                }
            }
        }
    }
}

/// What the reader routes to the tap (see [`Client::tap`]), in wire order.
#[derive(Debug)]
enum Tapped {
    /// A response to a routed request, under the router's id.
    Response(kernel::protocol::Response),
    /// A server event.
    Event(ServerEvent),
    /// The connection ended.
    Closed,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records why the connection ended (the first reason wins) and fails
    /// every pending request with it.
    fn fail(&self, reason: ClientError) {
        let (pending, tap) = {
            let mut state = self.lock();
            let reason = state.closed.get_or_insert(reason).clone();
            let pending = std::mem::take(&mut state.pending)
                .into_values()
                .map(move |p| (p, reason.clone()))
                .collect::<Vec<_>>();
            (pending, state.tap.take())
        };
        for (p, reason) in pending {
            p.reply.send(None, Err(reason));
        }
        if let Some(tap) = tap {
            let _ = tap.send(Tapped::Closed);
        }
        self.stop.send_replace(true);
    }
}

impl State {
    fn observe_session(&mut self, snapshot: &SessionSnapshot) {
        let newer = self
            .sessions
            .get(&snapshot.id)
            .is_none_or(|known| known.revision <= snapshot.revision);
        if newer {
            self.sessions.insert(snapshot.id.clone(), snapshot.clone());
        }
    }

    fn observe_event(&mut self, event: &ServerEvent) {
        match event {
            ServerEvent::ServerSnapshot { snapshot } => {
                if snapshot.revision >= self.server.revision {
                    self.server = snapshot.clone();
                }
            }
            ServerEvent::SessionSnapshot { snapshot } => self.observe_session(snapshot),
            ServerEvent::SessionProgress { .. } => {}
            ServerEvent::SessionRemoved { session_id } => {
                self.sessions.remove(session_id);
            }
        }
    }

    fn observe_result(&mut self, result: &CommandResult) {
        match result {
            CommandResult::Create { session }
            | CommandResult::Attach { session }
            | CommandResult::Prompt { session }
            | CommandResult::Steer { session }
            | CommandResult::Abort { session }
            | CommandResult::SetModel { session }
            | CommandResult::SetThinking { session } => self.observe_session(session),
            CommandResult::Remove { session_id } => {
                self.sessions.remove(session_id);
            }
            CommandResult::List { .. } | CommandResult::Detach { .. } => {}
        }
    }
}

/// The read side: frames in, messages out.
struct Incoming {
    read: ReadHalf,
    decoder: FrameDecoder,
    limits: CborLimits,
    ready: VecDeque<Vec<u8>>,
    /// A framing error met after the payloads in `ready`.
    failed: Option<ClientError>,
    buf: Vec<u8>,
}

impl Incoming {
    fn new(read: ReadHalf, max_frame_len: u32) -> Self {
        let limits = CborLimits {
            max_byte_len: max_frame_len as usize,
            ..CborLimits::default()
        };
        Self {
            read,
            decoder: FrameDecoder::new(max_frame_len),
            limits,
            ready: VecDeque::new(),
            failed: None,
            buf: vec![0; READ_CHUNK_LEN],
        }
    }

    /// The next message, or `None` when the server closed the connection
    /// cleanly between frames.
    async fn next(&mut self) -> Result<Option<ServerMessage>, ClientError> {
        loop {
            if let Some(payload) = self.ready.pop_front() {
                return decode_server_message(&payload, &self.limits)
                    .map(Some)
                    .map_err(|e| {
                        ClientError::Protocol(format!("bad message from the server: {e}"))
                    });
            }
            if let Some(error) = self.failed.take() {
                return Err(error);
            }
            let read = self
                .read
                .read(&mut self.buf)
                .await
                .map_err(ClientError::Io)?;
            if read == 0 {
                self.decoder
                    .end()
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                return Ok(None);
            }
            let mut payloads = Vec::new();
            let pushed = self.decoder.push(&self.buf[..read], &mut payloads);
            self.ready.extend(payloads);
            if let Err(e) = pushed {
                self.failed = Some(ClientError::Protocol(e.to_string()));
            }
        }
    }
}

async fn read_loop(
    mut incoming: Incoming,
    shared: Arc<Shared>,
    events: broadcast::Sender<ServerEvent>,
) {
    let reason = loop {
        let message = match incoming.next().await {
            Ok(Some(message)) => message,
            Ok(None) => {
                break ClientError::Disconnected("the server closed the connection".into());
            }
            Err(error) => break error,
        };
        if let Err(error) = dispatch(&shared, &events, message) {
            break error;
        }
    };
    tracing::debug!(%reason, "client connection ended");
    shared.fail(reason);
    // Dropping `events` (the only strong sender) ends every subscription.
}

/// Routes one message after the handshake. An error ends the connection.
fn dispatch(
    shared: &Shared,
    events: &broadcast::Sender<ServerEvent>,
    message: ServerMessage,
) -> Result<(), ClientError> {
    match message {
        ServerMessage::Hello(_) => Err(ClientError::Protocol(
            "the server sent a second hello".into(),
        )),
        ServerMessage::HelloError(error) => Err(ClientError::Server(error)),
        ServerMessage::Response(response) => {
            let mut state = shared.lock();
            let Some(pending) = state.pending.remove(&response.id) else {
                return Err(ClientError::Protocol(format!(
                    "response to unknown request id {:?}",
                    response.id
                )));
            };
            match response.outcome {
                Ok(result) if result.name() != pending.command => {
                    let error = ClientError::Protocol(format!(
                        "the response to {} ({}) carries a {} result",
                        response.id,
                        pending.command,
                        result.name()
                    ));
                    pending.reply.send(None, Err(error.clone()));
                    Err(error)
                }
                Ok(result) => {
                    state.observe_result(&result);
                    // Sent under the lock, so the tap keeps the wire order.
                    pending.reply.send(state.tap.as_ref(), Ok(result));
                    Ok(())
                }
                Err(error) => {
                    pending
                        .reply
                        .send(state.tap.as_ref(), Err(ClientError::Server(error)));
                    Ok(())
                }
            }
        }
        ServerMessage::Event(event) => {
            {
                let mut state = shared.lock();
                state.observe_event(&event);
                if let Some(tap) = &state.tap {
                    let _ = tap.send(Tapped::Event(event.clone()));
                }
            }
            // No subscriber is fine: events are optional to follow.
            let _ = events.send(event);
            Ok(())
        }
    }
}

async fn write_loop(
    mut write: WriteHalf,
    mut outgoing: mpsc::Receiver<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
    shared: Arc<Shared>,
) {
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            frame = outgoing.recv() => frame,
        };
        let Some(frame) = frame else { break };
        if let Err(error) = write.write_all(&frame).await {
            shared.fail(ClientError::Io(error));
            break;
        }
    }
    let _ = write.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel::faux;
    use kernel::protocol::{
        AssistantItem, AssistantStatus, Content, DeltaKind, ErrorCode, Response, ServerHello,
        SessionPhase, StopReason, TranscriptItem, TranscriptProgress, UserItem,
        decode_client_message, encode_server_message,
    };

    /// The server end of a socket pair, speaking frames with the kernel codec.
    struct FakeServer {
        stream: UnixStream,
        decoder: FrameDecoder,
        ready: VecDeque<Vec<u8>>,
    }

    impl FakeServer {
        fn new(stream: UnixStream) -> Self {
            Self {
                stream,
                decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_LEN),
                ready: VecDeque::new(),
            }
        }

        async fn recv(&mut self) -> ClientMessage {
            loop {
                if let Some(payload) = self.ready.pop_front() {
                    return decode_client_message(&payload, &CborLimits::default()).unwrap();
                }
                let mut buf = [0u8; 4096];
                let n = self.stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "client hung up");
                let mut out = Vec::new();
                self.decoder.push(&buf[..n], &mut out).unwrap();
                self.ready.extend(out);
            }
        }

        async fn recv_request(&mut self) -> Request {
            match self.recv().await {
                ClientMessage::Request(request) => request,
                other => panic!("expected a request, got {other:?}"),
            }
        }

        /// Answers a prompt of "hi" to session s1: one text delta
        /// ("hello"), then the response with the idle snapshot at revision
        /// 3. Returns the request's id.
        async fn answer_prompt(&mut self) -> String {
            let request = self.recv_request().await;
            assert_eq!(
                request.command,
                Command::Prompt {
                    session_id: "s1".into(),
                    text: "hi".into()
                }
            );
            let progress = TranscriptProgress::AssistantDelta {
                message_id: "item-2".into(),
                content_index: 0,
                kind: DeltaKind::Text,
                delta: "hello".into(),
            };
            self.send(ServerMessage::Event(ServerEvent::SessionProgress {
                session_id: "s1".into(),
                progress,
            }))
            .await;
            self.send(ServerMessage::Response(Response {
                id: request.id.clone(),
                outcome: Ok(CommandResult::Prompt {
                    session: session(3, SessionPhase::Idle),
                }),
            }))
            .await;
            request.id
        }

        async fn send(&mut self, message: ServerMessage) {
            let payload = encode_server_message(&message).unwrap();
            let frame = encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).unwrap();
            self.stream.write_all(&frame).await.unwrap();
        }

        /// Reads the client hello and answers it.
        async fn accept(&mut self, expected_token: Option<&str>) {
            let hello = self.recv().await;
            assert_eq!(
                hello,
                ClientMessage::Hello(ClientHello {
                    version: 1,
                    token: expected_token.map(str::to_owned),
                })
            );
            self.send(ServerMessage::Hello(ServerHello {
                version: 1,
                connection_id: "conn-1".into(),
                snapshot: server_snapshot(0),
            }))
            .await;
        }
    }

    fn server_snapshot(revision: u64) -> ServerSnapshot {
        ServerSnapshot {
            server_id: "01234567-89ab-4def-8123-456789abcdef".into(),
            protocol_version: 1,
            revision,
            sessions: Vec::new(),
            models: faux::models(),
        }
    }

    fn session(revision: u64, phase: SessionPhase) -> SessionSnapshot {
        let user = UserItem {
            id: "item-1".into(),
            content: vec![Content::Text { text: "hi".into() }],
            timestamp: 1,
        };
        let assistant = AssistantItem {
            id: "item-2".into(),
            content: vec![Content::Text {
                text: "hello".into(),
            }],
            model: faux::default_model(),
            response_model: None,
            usage: None,
            timestamp: 2,
            status: AssistantStatus::Complete(StopReason::Stop),
            error_message: None,
        };
        SessionSnapshot {
            id: "s1".into(),
            name: None,
            cwd: "/tmp".into(),
            created_at: 1,
            updated_at: 2,
            phase,
            model: faux::default_model(),
            thinking_level: ThinkingLevel::Off,
            attached: true,
            locked: true,
            revision,
            transcript: vec![
                TranscriptItem::User(user),
                TranscriptItem::Assistant(assistant),
            ],
            queued_steer: Vec::new(),
            queued_steer_count: 0,
        }
    }

    async fn pair(token: Option<&str>) -> (Client, FakeServer) {
        let (client_end, server_end) = UnixStream::pair().unwrap();
        let mut server = FakeServer::new(server_end);
        let owned = token.map(str::to_owned);
        let accept = async {
            server.accept(owned.as_deref()).await;
        };
        let (client, ()) = tokio::join!(
            Client::handshake(client_end, token, ClientOptions::default()),
            accept
        );
        (client.unwrap(), server)
    }

    #[tokio::test]
    async fn hello_then_one_event_and_one_response() {
        let (client, mut server) = pair(Some("secret")).await;
        assert_eq!(client.connection_id(), "conn-1");
        assert_eq!(client.server_snapshot().models.len(), faux::models().len());
        let mut events = client.events();

        let answer = server.answer_prompt();
        let (snapshot, request_id) = tokio::join!(client.prompt("s1", "hi"), answer);
        assert_eq!(request_id, "request-1");
        let snapshot = snapshot.unwrap();
        assert_eq!(snapshot.revision, 3);
        assert_eq!(client.session_snapshot("s1").unwrap().revision, 3);
        match events.try_recv().unwrap() {
            ServerEvent::SessionProgress {
                progress: TranscriptProgress::AssistantDelta { delta, .. },
                ..
            } => assert_eq!(delta, "hello"),
            other => panic!("unexpected event {other:?}"),
        }
        client.close().await;
    }

    #[tokio::test]
    async fn concurrent_requests_are_matched_by_id() {
        let (client, mut server) = pair(None).await;
        let answer = async {
            let first = server.recv_request().await;
            let second = server.recv_request().await;
            // Answer out of order, with an error for the first.
            server
                .send(ServerMessage::Response(Response {
                    id: second.id,
                    outcome: Ok(CommandResult::List {
                        sessions: Vec::new(),
                    }),
                }))
                .await;
            server
                .send(ServerMessage::Response(Response {
                    id: first.id,
                    outcome: Err(ProtocolError::new(
                        ErrorCode::Busy,
                        "A prompt is already running",
                    )),
                }))
                .await;
        };
        let (first, second, ()) = tokio::join!(client.prompt("s1", "x"), client.list(), answer);
        match first {
            Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Busy),
            other => panic!("expected busy, got {other:?}"),
        }
        assert!(second.unwrap().is_empty());
    }

    #[tokio::test]
    async fn mismatched_result_fails_the_connection() {
        let (client, mut server) = pair(None).await;
        let mut events = client.events();
        let answer = async {
            let request = server.recv_request().await;
            server
                .send(ServerMessage::Response(Response {
                    id: request.id,
                    outcome: Ok(CommandResult::List {
                        sessions: Vec::new(),
                    }),
                }))
                .await;
        };
        let (result, ()) = tokio::join!(client.attach("s1"), answer);
        assert!(
            matches!(result, Err(ClientError::Protocol(m)) if m.contains("carries a list result"))
        );
        assert!(matches!(
            events.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        assert!(matches!(client.list().await, Err(ClientError::Protocol(_))));
    }

    #[tokio::test]
    async fn hello_error_is_a_server_error() {
        let (client_end, server_end) = UnixStream::pair().unwrap();
        let mut server = FakeServer::new(server_end);
        let refuse = async {
            let _ = server.recv().await;
            server
                .send(ServerMessage::HelloError(ProtocolError::new(
                    ErrorCode::Auth,
                    "bad token",
                )))
                .await;
        };
        let (client, ()) = tokio::join!(
            Client::handshake(client_end, Some("wrong"), ClientOptions::default()),
            refuse
        );
        match client {
            Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Auth),
            other => panic!("expected auth error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn disconnect_fails_pending_requests() {
        let (client, mut server) = pair(None).await;
        let hang_up = async {
            let _ = server.recv_request().await;
            drop(server);
        };
        let (result, ()) = tokio::join!(client.list(), hang_up);
        assert!(
            matches!(result, Err(ClientError::Disconnected(_))),
            "{result:?}"
        );
        assert!(client.closed_reason().is_some());
    }

    #[tokio::test]
    async fn missing_socket_is_an_io_not_found() {
        let path = std::env::temp_dir().join(format!("pi-no-such-{}.sock", std::process::id()));
        match Client::connect(&path, None).await {
            Err(ClientError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    // ---- leases (client::leases over kernel::lease) ----

    use kernel::lease::LeaseStatus;
    use leases::{LeaseMode, Sessions};

    async fn lease_pair() -> (Sessions, FakeServer) {
        let (client, server) = pair(None).await;
        (Sessions::new(client), server)
    }

    /// Answers the next request, which must be `name`, with `result`.
    async fn answer(
        server: &mut FakeServer,
        name: &str,
        result: Result<CommandResult, ProtocolError>,
    ) {
        let request = server.recv_request().await;
        assert_eq!(request.command.name(), name, "{request:?}");
        server
            .send(ServerMessage::Response(Response {
                id: request.id,
                outcome: result,
            }))
            .await;
    }

    fn attached() -> Result<CommandResult, ProtocolError> {
        Ok(CommandResult::Attach {
            session: session(1, SessionPhase::Idle),
        })
    }

    fn detached() -> Result<CommandResult, ProtocolError> {
        Ok(CommandResult::Detach {
            session_id: "s1".into(),
        })
    }

    fn listed() -> Result<CommandResult, ProtocolError> {
        Ok(CommandResult::List {
            sessions: Vec::new(),
        })
    }

    #[tokio::test]
    async fn lease_exclusive_is_refused_while_shared_is_held_without_a_request() {
        let (sessions, mut server) = lease_pair().await;
        let (shared, ()) = tokio::join!(
            sessions.acquire("s1", LeaseMode::Shared),
            answer(&mut server, "attach", attached())
        );
        let shared = shared.unwrap();
        assert!(shared.is_active());
        match sessions.acquire("s1", LeaseMode::Exclusive).await {
            Err(ClientError::Ownership { session_id }) => assert_eq!(session_id, "s1"),
            other => panic!("expected ownership, got {other:?}"),
        }
        // Nothing went out for the refusal: the next request is the list.
        let (list, ()) = tokio::join!(sessions.list(), answer(&mut server, "list", listed()));
        assert!(list.unwrap().is_empty());
        assert!(
            ClientError::Ownership {
                session_id: "s1".into()
            }
            .to_string()
            .contains("already leased")
        );
    }

    #[tokio::test]
    async fn lease_two_shared_share_one_attach_and_detach_after_both() {
        let (sessions, mut server) = lease_pair().await;
        let (a, b, ()) = tokio::join!(
            sessions.acquire("s1", LeaseMode::Shared),
            sessions.acquire("s1", LeaseMode::Shared),
            answer(&mut server, "attach", attached())
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        // Releasing one of two sends nothing.
        a.release().await.unwrap();
        assert_eq!(a.status(), Some(LeaseStatus::Released));
        assert!(b.is_active());
        match a.prompt("x").await {
            Err(ClientError::Detached { session_id }) => assert_eq!(session_id, "s1"),
            other => panic!("expected detached, got {other:?}"),
        }
        let (released, ()) = tokio::join!(b.release(), answer(&mut server, "detach", detached()));
        released.unwrap();
        assert!(matches!(
            b.steer("x").await,
            Err(ClientError::Detached { .. })
        ));
        assert!(matches!(b.abort().await, Err(ClientError::Detached { .. })));
        let model = faux::default_model();
        assert!(matches!(
            b.set_model(ModelRef {
                provider: model.provider.clone(),
                id: model.id.clone()
            })
            .await,
            Err(ClientError::Detached { .. })
        ));
        assert!(matches!(
            b.set_thinking(ThinkingLevel::High).await,
            Err(ClientError::Detached { .. })
        ));
        // Releasing again is a no-op: the next request is the list.
        a.release().await.unwrap();
        let (list, ()) = tokio::join!(sessions.list(), answer(&mut server, "list", listed()));
        list.unwrap();
    }

    #[tokio::test]
    async fn lease_second_dispose_returns_the_same_result() {
        let (sessions, mut server) = lease_pair().await;
        let (lease, ()) = tokio::join!(
            sessions.acquire("s1", LeaseMode::Exclusive),
            answer(&mut server, "attach", attached())
        );
        let lease = lease.unwrap();
        let busy = Err(ProtocolError::new(ErrorCode::Busy, "no"));
        let (first, ()) = tokio::join!(lease.dispose(), answer(&mut server, "detach", busy));
        match &first {
            Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Busy),
            other => panic!("expected busy, got {other:?}"),
        }
        match lease.dispose().await {
            Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Busy),
            other => panic!("expected the same busy, got {other:?}"),
        }
        assert!(matches!(
            lease.prompt("x").await,
            Err(ClientError::Detached { .. })
        ));
        // A successful dispose also repeats.
        let (other, ()) = tokio::join!(sessions.acquire("s1", LeaseMode::Exclusive), async {
            // The failed dispose marked the session: reconcile, then attach.
            answer(&mut server, "detach", detached()).await;
            answer(&mut server, "attach", attached()).await;
        });
        let other = other.unwrap();
        let (first, ()) = tokio::join!(other.dispose(), answer(&mut server, "detach", detached()));
        first.unwrap();
        other.dispose().await.unwrap();
    }

    #[tokio::test]
    async fn lease_disconnect_invalidates_leases() {
        let (sessions, mut server) = lease_pair().await;
        let (lease, ()) = tokio::join!(
            sessions.acquire("s1", LeaseMode::Exclusive),
            answer(&mut server, "attach", attached())
        );
        let lease = lease.unwrap();
        let (pending, ()) = tokio::join!(lease.prompt("x"), async {
            let _ = server.recv_request().await;
            drop(server);
        });
        assert!(
            matches!(pending, Err(ClientError::Disconnected(_))),
            "{pending:?}"
        );
        // The machine hears the end through the tap, after the pending call failed.
        for _ in 0..100 {
            if lease.status() == Some(LeaseStatus::Invalidated) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(lease.status(), Some(LeaseStatus::Invalidated));
        assert!(matches!(
            lease.prompt("y").await,
            Err(ClientError::Disconnected(_))
        ));
        assert!(matches!(
            sessions.acquire("s2", LeaseMode::Shared).await,
            Err(ClientError::Disconnected(_))
        ));
        lease.dispose().await.unwrap();
    }

    #[tokio::test]
    async fn lease_prompt_streams_and_completes() {
        let (sessions, mut server) = lease_pair().await;
        let mut events = sessions.events();
        let (lease, ()) = tokio::join!(
            sessions.create(CreateParams::default()),
            answer(
                &mut server,
                "create",
                Ok(CommandResult::Create {
                    session: session(1, SessionPhase::Idle)
                })
            )
        );
        let lease = lease.unwrap();
        assert_eq!(lease.session_id(), "s1");
        assert!(matches!(
            sessions.acquire("s1", LeaseMode::Shared).await,
            Err(ClientError::Ownership { .. })
        ));
        let (snapshot, _) = tokio::join!(lease.prompt("hi"), server.answer_prompt());
        assert_eq!(snapshot.unwrap().revision, 3);
        assert_eq!(lease.snapshot().unwrap().revision, 3);
        match events.try_recv().unwrap() {
            ServerEvent::SessionProgress {
                progress: TranscriptProgress::AssistantDelta { delta, .. },
                ..
            } => assert_eq!(delta, "hello"),
            other => panic!("unexpected event {other:?}"),
        }
        // Dropping the lease disposes it: its detach goes out.
        drop(lease);
        let request = server.recv_request().await;
        assert_eq!(
            request.command,
            Command::Detach {
                session_id: "s1".into()
            }
        );
        sessions.dispose();
        assert!(sessions.client().closed_reason().is_some());
    }
}
