//! Session leases over a [`Client`], driven by the kernel's lease machine
//! ([`kernel::lease::Leases`]).
//!
//! [`Sessions::new`] takes a connected [`Client`] and owns it. Every lease
//! call steps the machine under one lock; the machine's requests go out in
//! order through a single sender task, each under a fresh client request id
//! (the machine's own `request-N` ids never reach the wire), and the client's
//! reader routes their responses, every event and the connection's end back
//! to the machine, in wire order, through the client's tap. So:
//!
//! - [`Sessions::acquire`] with [`LeaseMode::Exclusive`] or
//!   [`LeaseMode::Shared`], and [`Sessions::create`] (exclusive), refuse a
//!   conflicting lease with [`ClientError::Ownership`] without sending
//!   anything; concurrent shared acquisitions share one `attach`.
//! - [`SessionLease::release`] and [`SessionLease::dispose`] send `detach`
//!   only when the last lease on the session goes; `dispose` is idempotent
//!   (every call returns the first one's result).
//! - Commands through a lease that is not active fail with
//!   [`ClientError::Detached`]; after the connection ends every lease is
//!   invalidated and commands fail with [`ClientError::Disconnected`].
//! - Dropping a [`SessionLease`] disposes it (without waiting).

use super::{Client, ClientError, Tapped};
use kernel::lease::{
    CallId, Completion, LeaseError, LeaseId, LeaseInput, LeaseOutput, LeaseStatus, Leases,
    ReleaseKind, SessionCommand,
};
use kernel::protocol::{
    CreateParams, ModelRef, Request, ServerEvent, SessionMetadata, SessionSnapshot, ThinkingLevel,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::{OnceCell, broadcast, mpsc, oneshot};

pub use kernel::lease::LeaseMode;

type Waiter = oneshot::Sender<Result<Completion, LeaseError>>;

struct Inner {
    client: Client,
    machine: Mutex<Machine>,
    next_call: AtomicU64,
    /// The machine's requests, in the order it emitted them.
    sends: mpsc::UnboundedSender<Request>,
}

struct Machine {
    leases: Leases,
    waiters: HashMap<CallId, Waiter>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Machine> {
        self.machine
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Steps the machine and carries out its outputs, all under the lock so
    /// that requests are queued in the machine's order.
    fn step(&self, input: LeaseInput, waiter: Option<(CallId, Waiter)>) {
        let mut machine = self.lock();
        if let Some((call, waiter)) = waiter {
            machine.waiters.insert(call, waiter);
        }
        for output in machine.leases.step(input) {
            match output {
                LeaseOutput::Send(request) => {
                    let _ = self.sends.send(request);
                }
                LeaseOutput::Complete { call, result } => {
                    if let Some(waiter) = machine.waiters.remove(&call) {
                        let _ = waiter.send(result);
                    }
                }
                LeaseOutput::CloseConnection { error } => {
                    let reason = match error {
                        LeaseError::Protocol { reason } => ClientError::Protocol(reason),
                        other => ClientError::Disconnected(other.to_string()),
                    };
                    self.client.shared.fail(reason);
                }
            }
        }
    }

    async fn call(
        &self,
        input: impl FnOnce(CallId) -> LeaseInput,
    ) -> Result<Completion, ClientError> {
        let call = CallId(self.next_call.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.step(input(call), Some((call, tx)));
        match rx.await {
            Ok(Ok(completion)) => Ok(completion),
            Ok(Err(error)) => Err(self.error(error)),
            Err(_) => Err(self.error(LeaseError::Disconnected)),
        }
    }

    fn error(&self, error: LeaseError) -> ClientError {
        match error {
            LeaseError::Ownership { session_id } => ClientError::Ownership { session_id },
            LeaseError::Detached { session_id } => ClientError::Detached { session_id },
            LeaseError::Disconnected => match self.client.closed_reason() {
                Some(ClientError::Disconnected(reason)) => ClientError::Disconnected(reason),
                Some(other) => ClientError::Disconnected(other.to_string()),
                None => ClientError::Disconnected("the connection is closed".into()),
            },
            LeaseError::ClientDisposed => {
                ClientError::Disconnected("the client has been disposed".into())
            }
            LeaseError::Server(error) => ClientError::Server(error),
            LeaseError::Protocol { reason } => ClientError::Protocol(reason),
            LeaseError::UnknownLease { lease } => {
                ClientError::Protocol(format!("unknown lease {lease}"))
            }
        }
    }
}

/// A client connection with session leases. See the module documentation.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("connection_id", &self.inner.client.connection_id())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Takes over a connected client. Must run inside a Tokio runtime.
    pub fn new(client: Client) -> Self {
        let tap = client.tap();
        let (sends, sends_rx) = mpsc::unbounded_channel();
        let mut leases = Leases::new();
        let connected = leases.step(LeaseInput::Connected);
        debug_assert!(connected.is_empty());
        let inner = Arc::new(Inner {
            client,
            machine: Mutex::new(Machine {
                leases,
                waiters: HashMap::new(),
            }),
            next_call: AtomicU64::new(1),
            sends,
        });
        tokio::spawn(send_loop(Arc::downgrade(&inner), sends_rx));
        tokio::spawn(tap_loop(Arc::downgrade(&inner), tap));
        Self { inner }
    }

    /// The underlying connection (snapshots, `closed_reason`, raw requests).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// A new subscription to the server's events from now on.
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        self.inner.client.events()
    }

    /// `list`: the stored sessions.
    pub async fn list(&self) -> Result<Vec<SessionMetadata>, ClientError> {
        match self.inner.call(|call| LeaseInput::List { call }).await? {
            Completion::Sessions(sessions) => Ok(sessions),
            other => Err(unexpected(&other)),
        }
    }

    /// Leases an existing session, attaching the connection unless it
    /// already is. A conflicting lease is [`ClientError::Ownership`].
    pub async fn acquire(
        &self,
        session_id: &str,
        mode: LeaseMode,
    ) -> Result<SessionLease, ClientError> {
        let session_id = session_id.to_owned();
        let completion = self
            .inner
            .call(|call| LeaseInput::Acquire {
                call,
                session_id,
                mode,
            })
            .await?;
        self.granted(completion)
    }

    /// `create`: a new session, held by an exclusive lease.
    pub async fn create(&self, params: CreateParams) -> Result<SessionLease, ClientError> {
        let completion = self
            .inner
            .call(|call| LeaseInput::Create { call, params })
            .await?;
        self.granted(completion)
    }

    /// Disposes the client: fails every pending call, invalidates every lease
    /// (sending no `detach`) and closes the connection.
    pub fn dispose(&self) {
        self.inner.step(LeaseInput::DisposeClient, None);
    }

    fn granted(&self, completion: Completion) -> Result<SessionLease, ClientError> {
        match completion {
            Completion::Acquired { lease, session_id } => Ok(SessionLease {
                inner: Arc::clone(&self.inner),
                id: lease,
                session_id,
                disposed: OnceCell::new(),
            }),
            other => Err(unexpected(&other)),
        }
    }
}

/// One lease on a session. Dropping it disposes it.
pub struct SessionLease {
    inner: Arc<Inner>,
    id: LeaseId,
    session_id: String,
    disposed: OnceCell<Result<(), ClientError>>,
}

impl std::fmt::Debug for SessionLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLease")
            .field("id", &self.id)
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

impl SessionLease {
    /// The leased session.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The machine's name for this lease.
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// Where the lease is in its life (`None` once forgotten).
    pub fn status(&self) -> Option<LeaseStatus> {
        self.inner.lock().leases.status(self.id)
    }

    /// True while commands may go through this lease.
    pub fn is_active(&self) -> bool {
        self.inner.lock().leases.is_active(self.id)
    }

    /// The latest snapshot of the session seen on the connection.
    pub fn snapshot(&self) -> Option<SessionSnapshot> {
        self.inner.client.session_snapshot(&self.session_id)
    }

    async fn command(&self, command: SessionCommand) -> Result<SessionSnapshot, ClientError> {
        let lease = self.id;
        let completion = self
            .inner
            .call(|call| LeaseInput::Command {
                call,
                lease,
                command,
            })
            .await?;
        match completion {
            Completion::Session(snapshot) => Ok(*snapshot),
            other => Err(unexpected(&other)),
        }
    }

    /// `prompt`: resolves when the turn ends, with the final snapshot.
    pub async fn prompt(&self, text: &str) -> Result<SessionSnapshot, ClientError> {
        let text = text.to_owned();
        self.command(SessionCommand::Prompt { text }).await
    }

    /// `steer`: queue a message into the running turn.
    pub async fn steer(&self, text: &str) -> Result<SessionSnapshot, ClientError> {
        let text = text.to_owned();
        self.command(SessionCommand::Steer { text }).await
    }

    /// `abort`: stop the running turn.
    pub async fn abort(&self) -> Result<SessionSnapshot, ClientError> {
        self.command(SessionCommand::Abort).await
    }

    /// `set_model` (only while idle).
    pub async fn set_model(&self, model: ModelRef) -> Result<SessionSnapshot, ClientError> {
        self.command(SessionCommand::SetModel { model }).await
    }

    /// `set_thinking` (only while idle).
    pub async fn set_thinking(
        &self,
        thinking_level: ThinkingLevel,
    ) -> Result<SessionSnapshot, ClientError> {
        self.command(SessionCommand::SetThinking { thinking_level })
            .await
    }

    async fn release_with(&self, kind: ReleaseKind) -> Result<(), ClientError> {
        let lease = self.id;
        self.inner
            .call(|call| LeaseInput::Release { call, lease, kind })
            .await
            .map(drop)
    }

    /// Releases the lease (`detach` once no other lease holds the session).
    /// If the `detach` fails the lease stays active and the error is
    /// returned. Releasing a released or invalidated lease does nothing.
    pub async fn release(&self) -> Result<(), ClientError> {
        self.release_with(ReleaseKind::Detach).await
    }

    /// Relinquishes the lease even if its `detach` fails (the session is
    /// then reconciled before its next `attach`). Idempotent: every call
    /// returns the first call's result.
    pub async fn dispose(&self) -> Result<(), ClientError> {
        self.disposed
            .get_or_init(|| self.release_with(ReleaseKind::Dispose))
            .await
            .clone()
    }
}

impl Drop for SessionLease {
    fn drop(&mut self) {
        self.inner.step(LeaseInput::Forget { lease: self.id }, None);
    }
}

fn unexpected(completion: &Completion) -> ClientError {
    ClientError::Protocol(format!("unexpected lease completion {completion:?}"))
}

/// Sends the machine's requests in order.
async fn send_loop(inner: Weak<Inner>, mut sends: mpsc::UnboundedReceiver<Request>) {
    while let Some(request) = sends.recv().await {
        let Some(inner) = inner.upgrade() else { break };
        // A failed send means the connection ended; the tap reports that.
        inner.client.send_routed(request).await;
    }
}

/// Feeds routed responses, events and the connection's end to the machine.
async fn tap_loop(inner: Weak<Inner>, mut tap: mpsc::UnboundedReceiver<Tapped>) {
    loop {
        let tapped = tap.recv().await.unwrap_or(Tapped::Closed);
        let Some(inner) = inner.upgrade() else { break };
        match tapped {
            Tapped::Response(response) => inner.step(LeaseInput::Response(response), None),
            Tapped::Event(event) => inner.step(LeaseInput::Event(event), None),
            Tapped::Closed => {
                inner.step(LeaseInput::Disconnected, None);
                break;
            }
        }
    }
}
