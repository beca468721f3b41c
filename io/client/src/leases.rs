//! Session leases over a [`Client`], driven by the kernel's lease machine
//! ([`kernel::client::lease::Leases`]) inside the client-connection machine.
//!
//! [`Sessions::new`] takes a connected [`Client`]. Leases are calls of the
//! same client-connection machine as plain requests: one id space, one
//! pending table, and leases survive a reconnection (their sessions are
//! re-attached). So:
//!
//! - [`Sessions::acquire`] with [`LeaseMode::Exclusive`] or
//!   [`LeaseMode::Shared`], and [`Sessions::create`] (exclusive), refuse a
//!   conflicting lease with [`ClientError::Ownership`] without sending
//!   anything; concurrent shared acquisitions share one `attach`.
//! - [`SessionLease::release`] and [`SessionLease::dispose`] send `detach`
//!   only when the last lease on the session goes; `dispose` is idempotent
//!   (every call returns the first one's result).
//! - Commands through a lease that is not active fail with
//!   [`ClientError::Detached`]; while the client reconnects they fail with
//!   [`ClientError::Disconnected`]; after the client closes every lease is
//!   invalidated.
//! - Dropping a [`SessionLease`] disposes it (without waiting).

use super::{Client, ClientError, Inner};
use kernel::client::{
    Call, ClientInput, Completion, LeaseId, LeaseStatus, ReleaseKind, SessionCommand,
};
use kernel::protocol::{
    CreateParams, ModelRef, ServerEvent, SessionMetadata, SessionSnapshot, ThinkingLevel,
};
use std::sync::Arc;
use tokio::sync::{OnceCell, broadcast};

pub use kernel::client::LeaseMode;

/// A client connection with session leases. See the module documentation.
#[derive(Clone)]
pub struct Sessions {
    client: Client,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("connection_id", &self.client.connection_id())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Leases over a connected client (sharing its connection).
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.client.inner
    }

    /// The underlying connection (snapshots, `closed_reason`, raw requests).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A new subscription to the server's events from now on.
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        self.client.events()
    }

    /// `list`: the stored sessions.
    pub async fn list(&self) -> Result<Vec<SessionMetadata>, ClientError> {
        self.client.list().await
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
            .inner()
            .call(Call::Acquire { session_id, mode })
            .await?;
        self.granted(completion)
    }

    /// `create`: a new session, held by an exclusive lease.
    pub async fn create(&self, params: CreateParams) -> Result<SessionLease, ClientError> {
        let completion = self.inner().call(Call::Create(params)).await?;
        self.granted(completion)
    }

    /// Disposes the client: fails every pending call, invalidates every lease
    /// (sending no `detach`) and closes the connection.
    pub fn dispose(&self) {
        self.inner().step(ClientInput::Dispose);
    }

    fn granted(&self, completion: Completion) -> Result<SessionLease, ClientError> {
        match completion {
            Completion::Acquired { lease, session_id } => Ok(SessionLease {
                inner: Arc::clone(self.inner()),
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
        self.inner.lock().machine.leases().status(self.id)
    }

    /// True while commands may go through this lease.
    pub fn is_active(&self) -> bool {
        self.inner.lock().machine.leases().is_active(self.id)
    }

    /// The latest snapshot of the session seen on the connection.
    pub fn snapshot(&self) -> Option<SessionSnapshot> {
        let state = self.inner.lock();
        state.machine.session_snapshot(&self.session_id).cloned()
    }

    async fn command(&self, command: SessionCommand) -> Result<SessionSnapshot, ClientError> {
        let lease = self.id;
        let completion = self.inner.call(Call::Command { lease, command }).await?;
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
            .call(Call::Release { lease, kind })
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
        self.inner.step(ClientInput::Forget { lease: self.id });
    }
}

fn unexpected(completion: &Completion) -> ClientError {
    ClientError::Protocol(format!("unexpected lease completion {completion:?}"))
}
