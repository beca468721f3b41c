//! The async client for pi protocol v8: a thin tokio host of the kernel's
//! v8 connection machine ([`kernel::client::v8::connection::Connection`]).
//!
//! The machine decides everything (the hello, request ids, the states
//! followed and their replicas, the attachment, the reconnection); this
//! host owns the socket and a clock, through the same driver task as the
//! v1 client. Calls step the machine under one lock and wait for their
//! completion. What changed is broadcast ([`V8Client::changes`]); the
//! replicas are read in place under the lock ([`V8Client::read`]), never
//! copied whole.

use super::{
    Address, Connector, Control, Driven, Host, Launcher, ReadHalf, WriteHalf, control_capacity,
    drive, handshaken, transport_error,
};
use kernel::chord::call::ServiceCall;
use kernel::client::v8::connection::{Changed, Config, Connection, Input, Output, Request};
use kernel::client::{CallId, ClientError, Status};
use kernel::limits::ClientLimits;
use kernel::wire::Value;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::limits::EVENT_CAPACITY;

type Waiter = oneshot::Sender<Result<Option<Value>, ClientError>>;

/// The v8 client's host.
type Inner = Host<State>;

#[derive(Debug)]
struct State {
    machine: Connection,
    waiters: HashMap<CallId, Waiter>,
    next_call: u64,
    /// Dropped when the client closes, which ends every subscription.
    changes: Option<broadcast::Sender<Changed>>,
}

impl Inner {
    fn step(&self, input: Input) {
        let mut state = self.lock();
        self.step_locked(&mut state, input);
    }

    fn step_locked(&self, state: &mut State, input: Input) {
        let now = self.now();
        for output in state.machine.step(now, input) {
            match output {
                Output::Connect => self.order(Control::Connect),
                Output::Launch => self.order(Control::Launch),
                Output::Transmit(bytes) => self.order(Control::Transmit(bytes)),
                Output::CloseTransport => self.order(Control::Close),
                Output::Complete { call, result } => {
                    if let Some(waiter) = state.waiters.remove(&call) {
                        let _ = waiter.send(result);
                    }
                }
                Output::Changed(changed) => {
                    if let Some(changes) = &state.changes {
                        let _ = changes.send(changed);
                    }
                }
                Output::Status(status) => {
                    match &status {
                        Status::Reconnecting { reason } => {
                            tracing::info!(%reason, "lost the server; reconnecting");
                        }
                        Status::Closed { error } => {
                            tracing::debug!(%error, "v8 connection ended");
                            state.changes = None;
                        }
                        Status::Ready { .. } => {}
                    }
                    self.status.send_replace(status);
                }
            }
        }
    }

    async fn call(&self, request: Request) -> Result<Option<Value>, ClientError> {
        let answer = {
            let mut state = self.lock();
            state.next_call += 1;
            let call = CallId(state.next_call);
            let (reply, answer) = oneshot::channel();
            state.waiters.insert(call, reply);
            self.step_locked(&mut state, Input::Call { call, request });
            answer
        };
        answer
            .await
            .unwrap_or_else(|_| Err(ClientError::Disconnected("the connection is closed".into())))
    }
}

impl Driven for Inner {
    fn transport_up(&self) {
        self.step(Input::TransportUp);
    }
    fn transport_closed(&self, message: String) {
        self.step(Input::TransportClosed { message });
    }
    fn connect_failed(&self, error: &std::io::Error) {
        let (failure, message) = match transport_error(error) {
            ClientError::Transport { failure, message } => (failure, message),
            other => (kernel::client::TransportFailure::Other, other.to_string()),
        };
        self.step(Input::ConnectFailed { failure, message });
    }
    fn received(&self, bytes: &[u8]) {
        self.step(Input::Received(bytes.to_vec()));
    }
    fn tick(&self) {
        self.step(Input::Tick);
    }
    fn deadline(&self) -> Option<tokio::time::Instant> {
        let at = self.lock().machine.next_deadline();
        at.map(|at| self.instant(at))
    }
    fn is_closed(&self) -> bool {
        self.lock().machine.closed().is_some()
    }
}

/// One v8 connection to a pi server (cheap to clone: clones share it).
#[derive(Debug, Clone)]
pub struct V8Client {
    inner: Arc<Inner>,
}

impl V8Client {
    /// Connects to logical server `server_id` at `address`, following the
    /// server-scope states `follow`; starts the server with `launcher`
    /// when a reconnection finds none running.
    pub async fn connect(
        address: impl Into<Address>,
        server_id: &str,
        follow: Vec<&'static str>,
        launcher: Option<Launcher>,
    ) -> Result<Self, ClientError> {
        let connector = Connector::At(address.into(), launcher);
        let transport = connector.connect().await.map_err(|e| transport_error(&e))?;
        let config = Config {
            server_id: server_id.to_owned(),
            follow,
            reconnect: true,
            launch: matches!(connector, Connector::At(_, Some(_))),
            limits: ClientLimits::default(),
        };
        Self::start(transport, connector, config).await
    }

    async fn start(
        transport: (ReadHalf, WriteHalf),
        connector: Connector,
        config: Config,
    ) -> Result<Self, ClientError> {
        let (changes, _) = broadcast::channel(EVENT_CAPACITY);
        let (control, control_rx) = mpsc::channel(control_capacity(&config.limits));
        let (status, mut status_rx) = watch::channel(Status::Reconnecting {
            reason: "connecting".into(),
        });
        let state = State {
            machine: Connection::new(config),
            waiters: HashMap::new(),
            next_call: 0,
            changes: Some(changes),
        };
        let inner = Arc::new(Inner::new(state, control, status));
        inner.step(Input::TransportUp);
        tokio::spawn(drive(
            Arc::downgrade(&inner),
            Some(transport),
            connector,
            control_rx,
        ));
        handshaken(&mut status_rx).await.map(|()| Self { inner })
    }

    /// What changed, from now on (lagging readers look again at the whole).
    pub fn changes(&self) -> broadcast::Receiver<Changed> {
        match &self.inner.lock().changes {
            Some(changes) => changes.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// The connection's status, as it changes.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.inner.status.subscribe()
    }

    /// Reads the connection (its replicas and route) in place.
    pub fn read<R>(&self, f: impl FnOnce(&Connection) -> R) -> R {
        f(&self.inner.lock().machine)
    }

    /// A server-scope method call.
    pub async fn server(&self, call: ServiceCall) -> Result<Option<Value>, ClientError> {
        self.inner.call(Request::Server(call)).await
    }

    /// A method of the attached session's services.
    pub async fn session(&self, call: ServiceCall) -> Result<Option<Value>, ClientError> {
        self.inner.call(Request::Session(call)).await
    }

    /// Any request of the machine.
    pub async fn request(&self, request: Request) -> Result<Option<Value>, ClientError> {
        self.inner.call(request).await
    }

    /// Attaches `session_id`; answered once its transcript and models are in.
    pub async fn attach(&self, session_id: &str) -> Result<(), ClientError> {
        self.inner
            .call(Request::Attach(session_id.to_owned()))
            .await
            .map(|_| ())
    }

    /// Detaches the session attached.
    pub async fn detach(&self) -> Result<(), ClientError> {
        self.inner.call(Request::Detach).await.map(|_| ())
    }
}
