//! `pi-server worker` (internal): the process hosting one live session.
//!
//! It connects to its server's worker socket, proves itself with the token it
//! was spawned with, opens (or creates) the session's storage, and then runs
//! the kernel [`Runtime`]: operations from the server and model events go in,
//! storage writes, model calls and frames to the server come out. Storage
//! writes of one step are committed in one transaction before any later
//! output of that step is carried out, so an item is durable before its
//! `item_finished` leaves the process.

use crate::agent::{self, CancellationToken, ModelRegistry};
use crate::store::{SessionStore, StoreError};
use kernel::faux::{self, FauxStream};
use kernel::link::{Link, LinkAction};
use kernel::protocol::SessionPhase;
use kernel::protocol::worker::{
    WORKER_PROTOCOL_VERSION, WorkerFrame, decode_worker_frame, frame_worker_message,
};
use kernel::protocol::{ErrorCode, ProtocolError};
use kernel::runtime::{
    ModelEvent, ModelRequest, Persist, Runtime, RuntimeInput, RuntimeOutput, StorageFault,
    StoredSession,
};
use kernel::time::Instant;
use kernel::wire::frame::DEFAULT_MAX_FRAME_LEN;
use kernel::wire::{CborLimits, FrameDecoder};
use kernel::worker::{FromWorker, ToWorker};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: `pi-server worker` is started by the server, not by hand")
    })
}

fn wall_now() -> Instant {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Instant(ms)
}

/// Delay between faux deltas: `$PI_FAUX_DELAY_MS`, default 30 ms.
pub fn faux_delay() -> Duration {
    let ms = std::env::var("PI_FAUX_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    Duration::from_millis(ms)
}

/// The checkpoint bound of a streaming reply: the default, or
/// `$PI_WORKER_CHECKPOINT_MS` (and then no byte bound), which the bench uses
/// to measure what checkpoints cost.
fn checkpoint() -> kernel::limits::Checkpoint {
    match std::env::var("PI_WORKER_CHECKPOINT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(ms) => kernel::limits::Checkpoint {
            interval: Duration::from_millis(ms),
            bytes: usize::MAX,
        },
        None => kernel::limits::Checkpoint::default(),
    }
}

struct Channel {
    read: OwnedReadHalf,
    write: Option<OwnedWriteHalf>,
    decoder: FrameDecoder,
    ready: std::collections::VecDeque<WorkerFrame>,
    buf: Vec<u8>,
}

impl Channel {
    async fn connect(socket: &Path) -> Result<Self, String> {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("cannot reach the server at {}: {e}", socket.display()))?;
        let (read, write) = stream.into_split();
        Ok(Self {
            read,
            write: Some(write),
            decoder: FrameDecoder::new(DEFAULT_MAX_FRAME_LEN),
            ready: Default::default(),
            buf: vec![0; 64 * 1024],
        })
    }

    async fn send(&mut self, frame: &WorkerFrame) {
        let Some(write) = &mut self.write else { return };
        match frame_worker_message(frame) {
            Ok(bytes) => {
                if write.write_all(&bytes).await.is_err() {
                    tracing::warn!("server channel lost");
                    self.write = None;
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot encode a frame for the server"),
        }
    }

    /// The next frame from the server; `None` when the channel is closed.
    async fn recv(&mut self) -> Option<WorkerFrame> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some(frame);
            }
            let n = self
                .read
                .read(&mut self.buf)
                .await
                .ok()
                .filter(|n| *n > 0)?;
            let mut payloads = Vec::new();
            if let Err(e) = self.decoder.push(&self.buf[..n], &mut payloads) {
                tracing::error!(error = %e, "bad frame from the server");
                return None;
            }
            for p in payloads {
                match decode_worker_frame(&p, &CborLimits::default()) {
                    Ok(frame) => self.ready.push_back(frame),
                    Err(e) => {
                        tracing::error!(error = %e, "bad frame from the server");
                        return None;
                    }
                }
            }
        }
    }
}

/// Runs the worker until its runtime exits.
pub async fn run_worker() -> Result<(), String> {
    // Session files (the directory, meta.json, the lock, the database and
    // its log) are the user's alone: 0700 directories, 0600 files.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let socket = PathBuf::from(env("PI_WORKER_SOCKET")?);
    let token = env("PI_WORKER_TOKEN")?;
    let session_id = env("PI_WORKER_SESSION_ID")?;
    let session_dir = PathBuf::from(env("PI_WORKER_SESSION_DIR")?);
    let agent_dir = crate::config::agent_dir();
    let mut ch = Channel::connect(&socket).await?;
    let hello = WorkerFrame::Hello {
        version: WORKER_PROTOCOL_VERSION,
        token: token.clone(),
        session_id: session_id.clone(),
        pid: u64::from(std::process::id()),
        resume: None,
    };
    ch.send(&hello).await;
    let (create, revision_floor) = match ch.recv().await {
        Some(WorkerFrame::Start {
            create,
            revision_floor,
        }) => (create, revision_floor),
        Some(other) => return Err(format!("expected start from the server, got {other:?}")),
        None => return Err("the server closed the channel before start".into()),
    };
    let registry = std::sync::Arc::new(ModelRegistry::load(&agent_dir));
    let models = registry.models().to_vec();
    let now = wall_now();
    let opened = match create {
        Some(spec) => {
            let default = crate::settings::default_model(&agent_dir)
                .filter(|m| {
                    models
                        .iter()
                        .any(|x| x.provider == m.provider && x.id == m.id)
                })
                .unwrap_or_else(faux::default_model);
            Runtime::resolve_create(&spec, &default, &models).and_then(|(model, thinking_level)| {
                let cwd = spec.cwd.clone().unwrap_or_else(|| {
                    std::env::current_dir()
                        .map_or_else(|_| "/".to_string(), |d| d.display().to_string())
                });
                let stored = StoredSession {
                    id: session_id.clone(),
                    name: spec.name.clone(),
                    cwd,
                    created_at: now.as_millis(),
                    updated_at: now.as_millis(),
                    model,
                    thinking_level,
                    revision: 0,
                    transcript: Vec::new(),
                    queued_steer: Vec::new(),
                    summary: None,
                };
                let store = SessionStore::create(&session_dir, &stored).map_err(store_error)?;
                Ok((store, Runtime::create(stored, models.clone(), now)))
            })
        }
        None => SessionStore::open(&session_dir, &session_id)
            .map_err(store_error)
            .map(|(store, mut stored)| {
                // Clients saw this far, even if the store is behind (a full store).
                stored.revision = stored.revision.max(revision_floor);
                (store, Runtime::open(stored, models.clone(), now))
            }),
    };
    let (mut store, (mut runtime, outputs)) = match opened {
        Ok(v) => v,
        Err(error) => {
            tracing::warn!(session = %session_id, error = %error.message, "cannot open session");
            ch.send(&WorkerFrame::FromWorker(FromWorker::Failed { error }))
                .await;
            return Ok(());
        }
    };
    runtime = runtime.with_policy(kernel::runtime::Policy {
        checkpoint: checkpoint(),
        ..kernel::runtime::Policy::default()
    });
    store.record_server(&socket);
    tracing::info!(session = %session_id, "session open");
    let (events_tx, mut events) = mpsc::channel::<RuntimeInput>(1024);
    let mut w = Worker {
        registry,
        cwd: runtime.state().cwd.clone(),
        events: events_tx,
        model_task: None,
        tool_task: None,
        agent_dir,
        outputs: session_dir.join(&session_id),
        delay: faux_delay(),
        exit: false,
    };
    let grace =
        crate::daemon::env_duration_ms("PI_WORKER_ORPHAN_GRACE_MS", Duration::from_secs(30));
    let mut link = Link::new(grace, Duration::from_millis(200));
    w.apply(&mut ch, &mut store, &mut runtime, outputs).await;
    while !w.exit {
        let deadline = [runtime.next_deadline(), link.next_deadline()]
            .into_iter()
            .flatten()
            .min();
        let sleep = async {
            match deadline {
                Some(at) => {
                    let wait = at.as_millis().saturating_sub(wall_now().as_millis());
                    tokio::time::sleep(Duration::from_millis(wait)).await
                }
                None => std::future::pending().await,
            }
        };
        let orphaned = link.is_orphaned();
        let input = tokio::select! {
            frame = ch.recv(), if !orphaned => match frame {
                Some(WorkerFrame::ToWorker(ToWorker::Operation { op, operation })) => RuntimeInput::Operation { op, operation },
                Some(WorkerFrame::ToWorker(ToWorker::Dispose)) => RuntimeInput::Dispose,
                Some(other) => {
                    tracing::warn!(?other, "unexpected frame from the server");
                    continue;
                }
                None => {
                    // The server is gone (replaced, crashed or stopped without disposing us):
                    // an orphan keeps its turn running and announces itself to the next server.
                    ch.write = None;
                    tracing::warn!(grace_ms = grace.as_millis() as u64, "server gone; waiting to be adopted");
                    if link.on_lost(wall_now()) == Some(LinkAction::Announce) {
                        announce(&mut ch, &mut link, &socket, &token, &session_id, &runtime).await;
                    }
                    continue;
                }
            },
            Some(input) = events.recv() => input,
            () = sleep => RuntimeInput::Tick,
        };
        let outputs = runtime.step(wall_now(), input);
        w.apply(&mut ch, &mut store, &mut runtime, outputs).await;
        match link.on_tick(wall_now(), runtime.phase() == SessionPhase::Idle) {
            Some(LinkAction::Announce) => {
                announce(&mut ch, &mut link, &socket, &token, &session_id, &runtime).await
            }
            Some(LinkAction::Retire) if !w.exit => {
                tracing::info!("no server adopted this orphan within its grace; retiring");
                let outputs = runtime.step(wall_now(), RuntimeInput::Dispose);
                w.apply(&mut ch, &mut store, &mut runtime, outputs).await;
            }
            _ => {}
        }
    }
    w.stop_tasks();
    store.close().map_err(|e| e.to_string())?;
    tracing::info!(session = %session_id, "session closed");
    Ok(())
}

fn store_error(e: StoreError) -> ProtocolError {
    let code = match &e {
        StoreError::Locked(_) => ErrorCode::SessionLocked,
        StoreError::NotFound(_) => ErrorCode::NotFound,
        StoreError::InvalidId(_) | StoreError::Exists(_) => ErrorCode::InvalidRequest,
        _ => ErrorCode::InternalError,
    };
    ProtocolError::new(code, e.to_string())
}

/// One attempt of an orphan to be adopted by the server now at `socket`.
async fn announce(
    ch: &mut Channel,
    link: &mut Link,
    socket: &Path,
    token: &str,
    session_id: &str,
    runtime: &Runtime,
) {
    let Ok(Ok(mut fresh)) =
        tokio::time::timeout(Duration::from_secs(1), Channel::connect(socket)).await
    else {
        return; // nobody there yet
    };
    let hello = WorkerFrame::Hello {
        version: WORKER_PROTOCOL_VERSION,
        token: token.to_string(),
        session_id: session_id.to_string(),
        pid: u64::from(std::process::id()),
        resume: Some(Box::new(runtime.snapshot())),
    };
    fresh.send(&hello).await;
    match tokio::time::timeout(Duration::from_secs(5), fresh.recv()).await {
        Ok(Some(WorkerFrame::Adopted)) => {
            tracing::info!("adopted by the new server");
            link.on_adopted();
            *ch = fresh;
        }
        Ok(Some(WorkerFrame::Rejected { reason })) => {
            tracing::warn!(%reason, "the server refused to adopt this worker")
        }
        other => tracing::warn!(?other, "no adoption answer"),
    }
}

struct Worker {
    /// Models and how to reach them.
    registry: std::sync::Arc<ModelRegistry>,
    /// The session's working directory (the system prompt names it).
    cwd: String,
    /// Model events and tool results come back through here.
    events: mpsc::Sender<RuntimeInput>,
    model_task: Option<(u64, JoinHandle<()>, CancellationToken)>,
    tool_task: Option<(String, JoinHandle<()>, CancellationToken)>,
    agent_dir: PathBuf,
    /// The session's directory: whole outputs of cut `bash` commands go there.
    outputs: PathBuf,
    delay: Duration,
    exit: bool,
}

impl Worker {
    /// Carries out runtime outputs in order; consecutive writes commit together.
    async fn apply(
        &mut self,
        ch: &mut Channel,
        store: &mut SessionStore,
        runtime: &mut Runtime,
        outputs: Vec<RuntimeOutput>,
    ) {
        let mut queue: VecDeque<RuntimeOutput> = outputs.into();
        let mut batch: Vec<Persist> = Vec::new();
        while let Some(output) = queue.pop_front() {
            if let RuntimeOutput::Persist(p) = output {
                if let Persist::DefaultModel(model) = &p
                    && let Err(e) = crate::settings::set_default_model(&self.agent_dir, model)
                {
                    tracing::warn!(error = %e, "cannot record the default model");
                }
                batch.push(p);
                if !matches!(queue.front(), Some(RuntimeOutput::Persist(_))) {
                    if let Err(e) = store.apply(&batch) {
                        tracing::error!(error = %e, "storage write failed");
                        let message = format!("storage write failed: {e}");
                        let (fault, stored) = if e.is_out_of_space() {
                            match store.reload() {
                                Ok(stored) => (StorageFault::Full, Some(Box::new(stored))),
                                Err(e) => {
                                    tracing::error!(error = %e, "cannot read the session back");
                                    (StorageFault::Fatal, None)
                                }
                            }
                        } else {
                            (StorageFault::Fatal, None)
                        };
                        let failed = RuntimeInput::StorageFailed {
                            message,
                            fault,
                            dropped: std::mem::take(&mut queue).into(),
                            stored,
                        };
                        queue = runtime.step(wall_now(), failed).into();
                    }
                    batch.clear();
                }
                continue;
            }
            match output {
                RuntimeOutput::Persist(_) => unreachable!("handled above"),
                RuntimeOutput::Send(message) => ch.send(&WorkerFrame::FromWorker(message)).await,
                RuntimeOutput::StartModel { call, request } => self.start_model(call, request),
                RuntimeOutput::CancelModel { call } => {
                    if let Some((c, task, cancel)) = self.model_task.take() {
                        if c == call {
                            cancel.cancel(); // drops the HTTP stream
                            task.abort();
                        } else {
                            self.model_task = Some((c, task, cancel));
                        }
                    }
                }
                RuntimeOutput::RunTool {
                    id,
                    tool_name,
                    input,
                    cwd,
                } => self.run_tool(id, tool_name, input, cwd),
                RuntimeOutput::CancelTool { id } => {
                    if let Some((i, task, cancel)) = self.tool_task.take() {
                        if i == id {
                            cancel.cancel(); // a cancelled bash has its process group killed
                            task.abort();
                        } else {
                            self.tool_task = Some((i, task, cancel));
                        }
                    }
                }
                RuntimeOutput::Exit => {
                    self.exit = true;
                    return;
                }
            }
        }
    }

    fn start_model(&mut self, call: u64, request: ModelRequest) {
        let events = self.events.clone();
        let delay = self.delay;
        let cancel = CancellationToken::new();
        let provider = if request.model.provider == faux::PROVIDER {
            None
        } else {
            // Context files are read again for every call: edits take effect.
            let date = crate::cli::format_utc(wall_now().as_millis());
            let date = date.split(' ').next().unwrap_or_default().to_owned();
            Some(
                self.registry
                    .call_config(&request.model, &self.cwd, &self.agent_dir, &date),
            )
        };
        let token = cancel.clone();
        let task = tokio::spawn(async move {
            match provider {
                None => {
                    let mut stream = FauxStream::start(&request, wall_now(), delay);
                    while let Some(at) = stream.next_deadline() {
                        let wait = at.as_millis().saturating_sub(wall_now().as_millis());
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        for event in stream.poll(wall_now()) {
                            if events
                                .send(RuntimeInput::Model { call, event })
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                }
                Some(Err(message)) => {
                    let event = ModelEvent::Failed {
                        message,
                        retryable: false,
                        retry_after_ms: None,
                    };
                    let _ = events.send(RuntimeInput::Model { call, event }).await;
                }
                Some(Ok(provider)) => {
                    let (tx, mut rx) = mpsc::channel(256);
                    let call_task =
                        tokio::spawn(
                            async move { agent::stream(&provider, &request, tx, token).await },
                        );
                    while let Some(event) = rx.recv().await {
                        if events
                            .send(RuntimeInput::Model { call, event })
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    let _ = call_task.await;
                }
            }
        });
        if let Some((_, old, old_cancel)) = self.model_task.replace((call, task, cancel)) {
            old_cancel.cancel();
            old.abort();
        }
    }

    fn run_tool(&mut self, id: String, tool_name: String, input: kernel::wire::Value, cwd: String) {
        let events = self.events.clone();
        let task_id = id.clone();
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let outputs = self.outputs.clone();
        let task = tokio::spawn(async move {
            let cwd = std::path::Path::new(&cwd);
            let done = agent::run_tool_in(&tool_name, &input, cwd, Some(&outputs), token).await;
            let _ = events
                .send(RuntimeInput::ToolDone {
                    id,
                    content: done.content,
                    details: done.details,
                    is_error: done.is_error,
                })
                .await;
        });
        if let Some((_, old, old_cancel)) = self.tool_task.replace((task_id, task, cancel)) {
            old_cancel.cancel();
            old.abort();
        }
    }

    fn stop_tasks(&mut self) {
        if let Some((_, t, cancel)) = self.model_task.take() {
            cancel.cancel();
            t.abort();
        }
        if let Some((_, t, cancel)) = self.tool_task.take() {
            cancel.cancel();
            t.abort();
        }
    }
}
