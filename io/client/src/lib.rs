//! The async client for pi protocol v1: a thin tokio host of the kernel's
//! client-connection machine ([`kernel::client::Client`]).
//!
//! The machine decides everything: the hello (with the token) and its
//! deadline, request ids and response matching, the snapshot cache, the
//! session leases ([`leases`]) and the reconnect policy. This host owns the
//! transport and a clock: one driver task reads the socket, writes what the
//! machine transmits, opens a new socket when the machine asks
//! ([`kernel::client::ClientOutput::Connect`]) and wakes it at its deadline.
//! API calls step the machine under one lock and wait for their completion.
//!
//! [`Client::connect`] connects to a Unix socket or a TCP address; when the connection is
//! lost after its handshake (the server was replaced, crashed or restarted)
//! the machine reconnects, re-attaches the sessions it was attached to and
//! settles what was in flight (see the machine's documentation).
//! [`Client::connect_stream`] runs over any connected byte stream and does not
//! reconnect (there is no address to reconnect to).
//!
//! Requests may run concurrently (`prompt` stays pending for a whole turn
//! while `steer` and `abort` complete beside it). When the client closes,
//! every pending and later request fails with the reason, and event
//! subscribers see [`broadcast::error::RecvError::Closed`] once they have read
//! what was already delivered.

use kernel::client::{self as machine, Call, CallId, ClientConfig, ClientInput, ClientOutput};
use kernel::limits::ClientLimits;
use kernel::protocol::{
    Command, CommandResult, CreateParams, LiveStatus, ModelRef, ServerEvent, ServerSnapshot,
    SessionMetadata, SessionSnapshot, ThinkingLevel,
};
use kernel::wire::frame::DEFAULT_MAX_FRAME_LEN;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub mod leases;
pub mod limits;
pub mod v8;

pub use limits::EVENT_CAPACITY;

pub use kernel::client::Status;

/// The two directions of the connection, whatever the transport.
type ReadHalf = Box<dyn AsyncRead + Unpin + Send>;
type WriteHalf = Box<dyn AsyncWrite + Unpin + Send>;

use crate::limits::{CLOSE_FLUSH_TIMEOUT, READ_CHUNK_LEN};
/// Why a client call failed: the kernel client's own errors, one type for
/// the machine and its host.
pub use kernel::client::{ClientError, TransportFailure};

/// A socket error as the client machine knows it.
pub fn transport_error(error: &std::io::Error) -> ClientError {
    use std::io::ErrorKind;
    let failure = match error.kind() {
        ErrorKind::NotFound => TransportFailure::Absent,
        ErrorKind::ConnectionRefused => TransportFailure::Refused,
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof => {
            TransportFailure::CutOff
        }
        _ => TransportFailure::Other,
    };
    ClientError::Transport {
        failure,
        message: error.to_string(),
    }
}

/// Connection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// Largest frame payload accepted or sent (the peers must agree).
    pub max_frame_len: u32,
    /// How long to wait for the server's hello.
    pub handshake_timeout: Duration,
    /// Reconnect when the connection is lost after its handshake (only
    /// where there is an address to reconnect to).
    pub reconnect: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            handshake_timeout: ClientLimits::default().handshake_timeout,
            reconnect: true,
        }
    }
}

impl ClientOptions {
    fn config(&self, token: Option<&str>, reconnect: bool) -> ClientConfig {
        let mut limits = ClientLimits {
            max_frame_len: self.max_frame_len,
            handshake_timeout: self.handshake_timeout,
            ..ClientLimits::default()
        };
        limits.cbor.max_byte_len = self.max_frame_len as usize;
        ClientConfig {
            token: token.map(str::to_owned),
            reconnect: reconnect && self.reconnect,
            launch: false,
            limits,
        }
    }
}

/// One connection to a pi server (cheap to clone: clones share it). See the
/// module documentation.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// Room in the driver's queue: a frame for each request the machine may
/// have in flight ([`ClientLimits::max_requests_in_flight`]), the hello,
/// and the transport commands of one connection (connect, launch, close).
/// The frames of a lost connection are all taken before the next
/// connection's are asked for: its hello waits for the `Connect` behind them.
fn control_capacity(limits: &kernel::limits::ClientLimits) -> usize {
    limits.max_requests_in_flight() + 4
}

/// What the driver task does for the machine, in the order it asked.
#[derive(Debug)]
enum Control {
    Transmit(Vec<u8>),
    Connect,
    Launch,
    Close,
}

type Waiter = oneshot::Sender<Result<machine::Completion, ClientError>>;

/// A client machine's host, shared by its handles and its driver task:
/// the machine's state `S` under one lock, the driver's queue, the clock's
/// epoch, and the status the machine last said.
#[derive(Debug)]
struct Host<S> {
    state: Mutex<S>,
    control: mpsc::Sender<Control>,
    epoch: tokio::time::Instant,
    status: watch::Sender<Status>,
}

impl<S> Host<S> {
    fn new(state: S, control: mpsc::Sender<Control>, status: watch::Sender<Status>) -> Self {
        Self {
            state: Mutex::new(state),
            control,
            epoch: tokio::time::Instant::now(),
            status,
        }
    }

    fn lock(&self) -> MutexGuard<'_, S> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The machine's clock: milliseconds since the host began.
    fn now(&self) -> kernel::time::Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.epoch);
        kernel::time::Instant(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }

    fn instant(&self, at: kernel::time::Instant) -> tokio::time::Instant {
        self.epoch + Duration::from_millis(at.as_millis())
    }

    fn order(&self, control: Control) {
        order(&self.control, control);
    }
}

/// The v1 client's host.
type Inner = Host<State>;

#[derive(Debug)]
struct State {
    machine: machine::Client,
    waiters: HashMap<CallId, Waiter>,
    next_call: u64,
    /// Dropped when the client closes, which ends every subscription.
    events: Option<broadcast::Sender<ServerEvent>>,
}

impl Inner {
    /// Steps the machine and carries out its outputs, all under the lock, so
    /// that they happen in the machine's order.
    fn step(&self, input: ClientInput) {
        let mut state = self.lock();
        self.step_locked(&mut state, input);
    }

    fn step_locked(&self, state: &mut State, input: ClientInput) {
        let now = self.now();
        for output in state.machine.step(now, input) {
            match output {
                ClientOutput::Connect => {
                    self.order(Control::Connect);
                }
                ClientOutput::Launch => {
                    self.order(Control::Launch);
                }
                ClientOutput::Transmit(bytes) => {
                    self.order(Control::Transmit(bytes));
                }
                ClientOutput::CloseTransport => {
                    self.order(Control::Close);
                }
                ClientOutput::Complete { call, result } => {
                    if let Some(waiter) = state.waiters.remove(&call) {
                        let _ = waiter.send(result);
                    }
                }
                ClientOutput::Event(event) => {
                    if let Some(events) = &state.events {
                        // No subscriber is fine: events are optional to follow.
                        let _ = events.send(event);
                    }
                }
                ClientOutput::Status(status) => {
                    match &status {
                        Status::Ready {
                            reconnected: true, ..
                        } => {
                            tracing::info!("reconnected to the server");
                        }
                        Status::Reconnecting { reason } => {
                            tracing::info!(%reason, "lost the server; reconnecting");
                        }
                        Status::Closed { error } => {
                            tracing::debug!(%error, "client connection ended");
                            state.events = None;
                        }
                        Status::Ready { .. } => {}
                    }
                    self.status.send_replace(status);
                }
            }
        }
    }

    /// Makes one API call and waits for its completion.
    async fn call(&self, kind: Call) -> Result<machine::Completion, ClientError> {
        let answer = {
            let mut state = self.lock();
            state.next_call += 1;
            let call = CallId(state.next_call);
            let (reply, answer) = oneshot::channel();
            state.waiters.insert(call, reply);
            self.step_locked(
                &mut state,
                ClientInput::Call {
                    call,
                    call_kind: kind,
                },
            );
            answer
        };
        answer
            .await
            .unwrap_or_else(|_| Err(ClientError::Disconnected("the connection is closed".into())))
    }
}

/// Where a server listens: its Unix socket, or a TCP address (`serve
/// --listen`), which needs the server's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// `HOST:PORT`.
    Tcp(String),
}

impl fmt::Display for Address {
    /// As the command line writes it: `unix:///path` or `tcp://host:port`
    /// (a socket path is shown as is, not percent-escaped).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "{}", path.display()),
            Self::Tcp(addr) => write!(f, "tcp://{addr}"),
        }
    }
}

impl From<&Path> for Address {
    fn from(path: &Path) -> Self {
        Self::Unix(path.to_owned())
    }
}

impl From<&PathBuf> for Address {
    fn from(path: &PathBuf) -> Self {
        Self::Unix(path.clone())
    }
}

impl From<&Address> for Address {
    fn from(address: &Address) -> Self {
        address.clone()
    }
}

/// Starts the server at a client's address when none runs there (the
/// CLI's cold activation), so that a client can bring back a server that
/// crashed or retired; the reconnection finds it at a later attempt. The
/// kernel's client decides when ([`machine::ClientOutput::Launch`]).
pub type Launcher = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Where to open a new transport.
#[derive(Clone)]
enum Connector {
    At(Address, Option<Launcher>),
    None,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::At(address, launcher) => f
                .debug_tuple("At")
                .field(address)
                .field(&launcher.as_ref().map(|_| "<launcher>"))
                .finish(),
            Self::None => f.write_str("None"),
        }
    }
}

impl Connector {
    async fn connect(&self) -> std::io::Result<(ReadHalf, WriteHalf)> {
        match self {
            Self::At(Address::Unix(path), _) => {
                let (read, write) = UnixStream::connect(path).await?.into_split();
                Ok((Box::new(read), Box::new(write)))
            }
            Self::At(Address::Tcp(addr), _) => {
                let stream = tokio::net::TcpStream::connect(addr.as_str()).await?;
                // Deltas are small frames that must not wait for an ACK.
                stream.set_nodelay(true)?;
                let (read, write) = stream.into_split();
                Ok((Box::new(read), Box::new(write)))
            }
            Self::None => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "no address to reconnect to",
            )),
        }
    }
}

impl Client {
    /// Connects to the server listening at `address` (a socket path or an
    /// [`Address`]) with default options, sending `token` in the hello if
    /// given.
    pub async fn connect(
        address: impl Into<Address>,
        token: Option<&str>,
    ) -> Result<Self, ClientError> {
        Self::connect_with(address, token, ClientOptions::default()).await
    }

    /// [`Client::connect`] with explicit options.
    pub async fn connect_with(
        address: impl Into<Address>,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        Self::connect_launching(address, token, options, None).await
    }

    /// [`Client::connect_with`], starting the server with `launcher` when a
    /// reconnection finds none running.
    pub async fn connect_launching(
        address: impl Into<Address>,
        token: Option<&str>,
        options: ClientOptions,
        launcher: Option<Launcher>,
    ) -> Result<Self, ClientError> {
        let connector = Connector::At(address.into(), launcher);
        let transport = connector.connect().await.map_err(|e| transport_error(&e))?;
        Self::start(transport, connector, token, options).await
    }

    /// Runs the handshake over an already connected stream (no reconnection).
    pub async fn handshake(
        stream: UnixStream,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let (read, write) = stream.into_split();
        let transport: (ReadHalf, WriteHalf) = (Box::new(read), Box::new(write));
        Self::start(transport, Connector::None, token, options).await
    }

    /// Runs the handshake over any connected byte stream (TCP, an in-memory
    /// duplex, a simulated network's stream), then serves it like a socket.
    /// It does not reconnect.
    pub async fn connect_stream<S>(
        stream: S,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        let transport: (ReadHalf, WriteHalf) = (Box::new(read), Box::new(write));
        Self::start(transport, Connector::None, token, options).await
    }

    async fn start(
        transport: (ReadHalf, WriteHalf),
        connector: Connector,
        token: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let reconnect = matches!(connector, Connector::At(..));
        let mut config = options.config(token, reconnect);
        config.launch = config.reconnect && matches!(connector, Connector::At(_, Some(_)));
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let (control, control_rx) = mpsc::channel(control_capacity(&config.limits));
        let (status, mut status_rx) = watch::channel(Status::Reconnecting {
            reason: "connecting".into(),
        });
        let state = State {
            machine: machine::Client::new(config),
            waiters: HashMap::new(),
            next_call: 0,
            events: Some(events),
        };
        let inner = Arc::new(Inner::new(state, control, status));
        inner.step(ClientInput::TransportUp);
        tokio::spawn(drive(
            Arc::downgrade(&inner),
            Some(transport),
            connector,
            control_rx,
        ));
        handshaken(&mut status_rx).await.map(|()| Self { inner })
    }

    /// The id the server gave this connection (the latest, after a
    /// reconnection).
    pub fn connection_id(&self) -> String {
        let state = self.inner.lock();
        state.machine.connection_id().unwrap_or_default().to_owned()
    }

    /// The latest server snapshot (from the hello or a later `server_snapshot`
    /// event; an event with a lower revision is ignored).
    pub fn server_snapshot(&self) -> ServerSnapshot {
        let state = self.inner.lock();
        state
            .machine
            .server_snapshot()
            .cloned()
            .expect("a handshaken client has a server snapshot")
    }

    /// The latest snapshot of a session seen on this connection (from events
    /// and command results), if any.
    pub fn session_snapshot(&self, session_id: &str) -> Option<SessionSnapshot> {
        self.inner
            .lock()
            .machine
            .session_snapshot(session_id)
            .cloned()
    }

    /// A new subscription to the server's events from now on. After the
    /// client closes, `recv` yields what was delivered, then `Closed`.
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        match &self.inner.lock().events {
            Some(sender) => sender.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// The connection's status as it changes (ready, reconnecting, closed).
    pub fn status(&self) -> watch::Receiver<Status> {
        self.inner.status.subscribe()
    }

    /// Why the client closed, or `None` while it is up or reconnecting.
    pub fn closed_reason(&self) -> Option<ClientError> {
        let state = self.inner.lock();
        state.machine.closed().cloned()
    }

    /// Sends `command` and waits for its response.
    pub async fn request(&self, command: Command) -> Result<CommandResult, ClientError> {
        match self.inner.call(Call::Request(command)).await? {
            machine::Completion::Result(result) => Ok(*result),
            machine::Completion::Session(snapshot) => Ok(resumed_result(*snapshot)),
            other => Err(ClientError::Protocol(format!(
                "unexpected completion {other:?}"
            ))),
        }
    }

    /// `list`: the stored sessions.
    pub async fn list(&self) -> Result<Vec<SessionMetadata>, ClientError> {
        match self.request(Command::List).await? {
            CommandResult::List { sessions } => Ok(sessions),
            other => Err(unexpected(&other)),
        }
    }

    /// `status` (our extension): what each live session is doing, and how
    /// many clients it has, without attaching to any.
    pub async fn session_status(&self) -> Result<Vec<LiveStatus>, ClientError> {
        match self.request(Command::Status).await? {
            CommandResult::Status { sessions } => Ok(sessions),
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

    /// `prompt`: resolves when the turn ends, with the final snapshot (also
    /// across a reconnection, when the turn went on).
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

    /// `rename` (our extension): name an attached session; refused when
    /// another session has the name.
    pub async fn rename(
        &self,
        session_id: &str,
        name: &str,
    ) -> Result<SessionSnapshot, ClientError> {
        let (session_id, name) = (session_id.to_owned(), name.to_owned());
        session_of(self.request(Command::Rename { session_id, name }).await?)
    }

    /// `compact` (our extension): summarise an idle session's older
    /// conversation now, as `instructions` ask if given; answered once the
    /// summary is stored.
    pub async fn compact(
        &self,
        session_id: &str,
        instructions: Option<&str>,
    ) -> Result<SessionSnapshot, ClientError> {
        let command = Command::Compact {
            session_id: session_id.to_owned(),
            instructions: instructions.map(str::to_owned),
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
    /// connection from its sessions. Clones of this client close with it.
    pub async fn close(self) {
        self.inner.step(ClientInput::Dispose);
        let mut status = self.inner.status.subscribe();
        let _ = tokio::time::timeout(
            CLOSE_FLUSH_TIMEOUT,
            status.wait_for(|s| matches!(s, Status::Closed { .. })),
        )
        .await;
        // The driver writes what was queued before the close, then exits.
        let _ = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, self.inner.control.closed()).await;
    }
}

/// A prompt resumed across a reconnection completes with its session's
/// final snapshot, as its response would have.
fn resumed_result(session: SessionSnapshot) -> CommandResult {
    CommandResult::Prompt { session }
}

impl Client {
    /// Carries out a request of a session's [`machine::front::Front`] and
    /// returns its answer for the machine, with the answer's snapshot (a
    /// prompt's is its turn's end, for the front end to show).
    pub async fn front_request(
        &self,
        session_id: &str,
        request: &machine::front::Request,
    ) -> (
        Result<machine::front::Answer, machine::ClientError>,
        Option<SessionSnapshot>,
    ) {
        use machine::front::{Answer, Request};
        let result = match request {
            Request::Prompt(text) => self.prompt(session_id, text).await,
            Request::Steer(text) => self.steer(session_id, text).await,
            Request::Abort => self.abort(session_id).await,
            Request::SetModel(model) => self.set_model(session_id, model.clone()).await,
            Request::SetThinking(level) => self.set_thinking(session_id, *level).await,
            Request::Rename(name) => self.rename(session_id, name).await,
            Request::Compact(instructions) => {
                self.compact(session_id, instructions.as_deref()).await
            }
            // Protocol v1 has no approvals: its clients see a running turn.
            Request::Answer { .. } | Request::SetApprovals(_) => Err(machine::ClientError::Server(
                kernel::protocol::ProtocolError::new(
                    kernel::protocol::ErrorCode::InvalidRequest,
                    "approvals are answered and set over protocol v8; this connection speaks v1",
                ),
            )),
        };
        match result {
            Err(e) => (Err(e), None),
            Ok(snapshot) => {
                let answer = match request {
                    Request::Prompt(_) => Answer::Prompt {
                        phase: snapshot.phase,
                    },
                    Request::Steer(_) => Answer::Steer,
                    Request::Abort => Answer::Abort {
                        withdrawn: snapshot
                            .queued_steer
                            .iter()
                            .map(|u| machine::follow::text_of(&u.content))
                            .collect(),
                    },
                    Request::SetModel(_)
                    | Request::SetThinking(_)
                    | Request::Rename(_)
                    | Request::Compact(_)
                    | Request::Answer { .. }
                    | Request::SetApprovals(_) => Answer::Applied,
                };
                (Ok(answer), Some(snapshot))
            }
        }
    }
}

fn session_of(result: CommandResult) -> Result<SessionSnapshot, ClientError> {
    result
        .into_session()
        .map_err(|name| ClientError::Protocol(format!("unexpected {name} result")))
}

/// Unreachable in practice: the machine already checked the result's command.
fn unexpected(result: &CommandResult) -> ClientError {
    ClientError::Protocol(format!("unexpected {} result", result.name()))
}

/// The driver task: owns the transport, carries out the machine's transport
/// outputs in order, feeds back what the transport does, and ticks the
/// machine at its deadline. Ends when the client is closed or dropped.
/// Waits for a connection's first handshake: `Ok` once ready, else why not.
async fn handshaken(status: &mut watch::Receiver<Status>) -> Result<(), ClientError> {
    let outcome = status
        .wait_for(|s| !matches!(s, Status::Reconnecting { .. }))
        .await
        .map(|s| s.clone());
    match outcome {
        Ok(Status::Ready { .. }) => Ok(()),
        Ok(Status::Closed { error }) => Err(error),
        _ => Err(ClientError::Disconnected(
            "the client stopped during the handshake".into(),
        )),
    }
}

/// Hands a driver task what a machine asked, in order. The queue has room
/// for every frame of one connection the machine can have asked for and the
/// driver not yet written ([`control_capacity`]); a closed one means the
/// driver is gone, and the client with it.
fn order(queue: &mpsc::Sender<Control>, control: Control) {
    match queue.try_send(control) {
        Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
        Err(mpsc::error::TrySendError::Full(_)) => {
            unreachable!("the client machines keep their requests within the control queue")
        }
    }
}

/// A kernel machine under its host's lock, as the driver task feeds it:
/// what the transport did, and the clock.
trait Driven: Send + Sync + 'static {
    /// A transport is open.
    fn transport_up(&self);
    /// The transport ended.
    fn transport_closed(&self, reason: String);
    /// A new transport could not be opened.
    fn connect_failed(&self, error: &std::io::Error);
    /// Bytes read.
    fn received(&self, bytes: &[u8]);
    /// A deadline passed.
    fn tick(&self);
    /// When the machine wants its next tick.
    fn deadline(&self) -> Option<tokio::time::Instant>;
    /// The machine closed for good.
    fn is_closed(&self) -> bool;
}

impl Driven for Inner {
    fn transport_up(&self) {
        self.step(ClientInput::TransportUp);
    }
    fn transport_closed(&self, reason: String) {
        self.step(ClientInput::TransportClosed { reason });
    }
    fn connect_failed(&self, error: &std::io::Error) {
        let absent = matches!(
            transport_error(error),
            ClientError::Transport { failure, .. } if failure.nothing_listening()
        );
        self.step(ClientInput::ConnectFailed {
            reason: error.to_string(),
            absent,
        });
    }
    fn received(&self, bytes: &[u8]) {
        self.step(ClientInput::Received(bytes.to_vec()));
    }
    fn tick(&self) {
        self.step(ClientInput::Tick);
    }
    fn deadline(&self) -> Option<tokio::time::Instant> {
        let at = self.lock().machine.next_deadline();
        at.map(|at| self.instant(at))
    }
    fn is_closed(&self) -> bool {
        self.lock().machine.closed().is_some()
    }
}

async fn drive<D: Driven>(
    inner: std::sync::Weak<D>,
    mut transport: Option<(ReadHalf, WriteHalf)>,
    connector: Connector,
    mut control: mpsc::Receiver<Control>,
) {
    enum Woke {
        Control(Option<Control>),
        Read(std::io::Result<usize>),
        Tick,
    }
    let mut buf = vec![0u8; READ_CHUNK_LEN];
    loop {
        let deadline = match inner.upgrade() {
            Some(client) => client.deadline(),
            // Dropped: write what was queued (a lease's last detach), then stop.
            None => None,
        };
        let woke = {
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let reading = async {
                match transport.as_mut() {
                    Some((read, _)) => read.read(&mut buf).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                c = control.recv() => Woke::Control(c),
                r = reading => Woke::Read(r),
                () = sleep => Woke::Tick,
            }
        };
        if let Woke::Control(Some(Control::Transmit(bytes))) = &woke {
            if let Some((_, write)) = transport.as_mut()
                && let Err(e) = write.write_all(bytes).await
            {
                transport = None;
                if let Some(client) = inner.upgrade() {
                    client.transport_closed(format!("cannot write to the server: {e}"));
                }
            }
            continue;
        }
        let Some(client) = inner.upgrade() else {
            if let Woke::Control(Some(_)) = woke {
                continue;
            }
            break;
        };
        match woke {
            Woke::Control(None) => break,
            Woke::Control(Some(Control::Transmit(_))) => unreachable!("handled above"),
            Woke::Control(Some(Control::Connect)) => {
                transport = None;
                match connector.connect().await {
                    Ok(opened) => {
                        transport = Some(opened);
                        client.transport_up();
                    }
                    Err(e) => client.connect_failed(&e),
                }
            }
            Woke::Control(Some(Control::Launch)) => {
                if let Connector::At(address, Some(launcher)) = &connector {
                    let launcher = Arc::clone(launcher);
                    let address = address.clone();
                    // It may wait for a lock another starter holds.
                    tokio::task::spawn_blocking(move || match launcher() {
                        Ok(()) => tracing::info!(%address, "started a server"),
                        Err(e) => tracing::warn!(%address, error = %e, "cannot start a server"),
                    });
                }
            }
            Woke::Control(Some(Control::Close)) => {
                if let Some((_, mut write)) = transport.take() {
                    let _ = write.shutdown().await;
                }
                if client.is_closed() {
                    break;
                }
            }
            Woke::Read(Ok(0)) => {
                transport = None;
                client.transport_closed("the server closed the connection".into());
            }
            Woke::Read(Ok(n)) => client.received(&buf[..n]),
            Woke::Read(Err(e)) => {
                transport = None;
                client.transport_closed(format!("cannot read from the server: {e}"));
            }
            Woke::Tick => client.tick(),
        }
    }
    control.close();
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel::faux;
    use kernel::protocol::{
        AssistantItem, AssistantStatus, Content, DeltaKind, ErrorCode, ProtocolError, Response,
        ServerHello, SessionPhase, StopReason, TranscriptItem, TranscriptProgress, UserItem,
        decode_client_message, encode_server_message,
    };
    use kernel::protocol::{ClientHello, ClientMessage, Request, ServerMessage};
    use kernel::wire::frame::encode_frame;
    use kernel::wire::{CborLimits, FrameDecoder};
    use std::collections::VecDeque;

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
            matches!(result, Err(ClientError::Protocol(m)) if m.contains("Response command list does not match attach"))
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
            Err(ClientError::Transport { failure, .. }) => {
                assert_eq!(failure, TransportFailure::Absent)
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    // ---- leases (client::leases over kernel::client::lease) ----

    use kernel::client::LeaseStatus;
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
