//! `pi-server worker` (internal): the process hosting one live session.
//!
//! A thin host of the kernel's [`WorkerHost`], which decides everything: the
//! hello with the token it was spawned with, opening or creating the
//! session, the order of commits, storage faults, and orphan announcements.
//! This file carries its outputs out (the socket, the SQLite store, model
//! calls and tools) and feeds back what happened. A store operation's answer
//! goes back to the host before anything else is carried out, so an item is
//! durable before any frame that mentions it leaves the process.

use crate::duplex::{Duplex, UnixChannel};
use crate::limits::{HOST_EVENTS, MODEL_EVENTS};
use kernel::faux::{self, FauxStream};
use kernel::host::{HostConfig, HostInput, HostOutput, StoreFailure, WorkerHost};
use kernel::limits::WorkerLimits;
use kernel::mcp::{McpInput, McpOutput, OfferedTool, ServerConfig};
use kernel::protocol::worker::{WorkerFrame, decode_worker_frame, frame_worker_message};
use kernel::runtime::{ModelEvent, ModelRequest};
use kernel::time::Instant;
use kernel::wire::frame::DEFAULT_MAX_FRAME_LEN;
use kernel::wire::{CborLimits, FrameDecoder};
use pi_agent::{self as agent, CancellationToken, ModelRegistry};
use pi_store::{SessionStore, StoreError};
use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: `pi-server worker` is started by the server, not by hand")
    })
}

/// The wall clock, in ms since the Unix epoch: a real worker's time.
pub fn wall_now() -> Instant {
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

/// How a worker reaches the server holding it: the first time, and again
/// for each announcement after that server is gone.
pub trait Dial: Clone + Send + Sync + 'static {
    /// The channel's stream.
    type Stream: Duplex;

    /// Connects to the server's worker socket.
    fn dial(&self) -> impl Future<Output = Result<Self::Stream, String>> + Send;

    /// The worker socket's path, which the session lock records so that a
    /// new server with the same id knows this worker will announce itself.
    fn server_path(&self) -> Option<&Path>;
}

/// The real server's worker socket.
#[derive(Clone)]
pub struct UnixDial(pub PathBuf);

impl Dial for UnixDial {
    type Stream = UnixChannel;

    async fn dial(&self) -> Result<UnixChannel, String> {
        UnixStream::connect(&self.0)
            .await
            .and_then(UnixChannel::new)
            .map_err(|e| format!("cannot reach the server at {}: {e}", self.0.display()))
    }

    fn server_path(&self) -> Option<&Path> {
        Some(&self.0)
    }
}

struct Channel<S: Duplex> {
    read: S::Read,
    write: Option<S::Write>,
    decoder: FrameDecoder,
    ready: std::collections::VecDeque<WorkerFrame>,
    buf: Vec<u8>,
}

impl<S: Duplex> Channel<S> {
    async fn connect<D: Dial<Stream = S>>(dial: &D) -> Result<Self, String> {
        let stream = dial.dial().await?;
        let (read, write) = stream.into_halves();
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

/// `pi-server worker`: a worker process started by the server, configured
/// by its environment. Runs until its host says to exit.
pub async fn run_worker() -> Result<(), String> {
    // Session files (the directory, meta.json, the lock, the database and
    // its log) are the user's alone: 0700 directories, 0600 files.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let setup = WorkerSetup {
        dial: UnixDial(PathBuf::from(env("PI_WORKER_SOCKET")?)),
        token: env("PI_WORKER_TOKEN")?,
        session_id: env("PI_WORKER_SESSION_ID")?,
        session_dir: PathBuf::from(env("PI_WORKER_SESSION_DIR")?),
        agent_dir: pi_config::agent_dir(),
        pid: u64::from(std::process::id()),
        cwd: std::env::current_dir()
            .ok()
            .map(|d| d.display().to_string()),
        clock: wall_now,
        limits: WorkerLimits {
            orphan_grace: crate::server::env_duration_ms(
                "PI_WORKER_ORPHAN_GRACE_MS",
                WorkerLimits::default().orphan_grace,
            ),
            ..WorkerLimits::default()
        },
        policy: kernel::runtime::Policy {
            checkpoint: checkpoint(),
            ..kernel::runtime::Policy::default()
        },
        faux_delay: faux_delay(),
    };
    run(setup).await
}

/// The approval policy and question timeout the settings give the
/// session. Settings that cannot be read ask, with no timeout: a mistyped
/// `"approvals"` must not run tools unasked.
fn approval_settings(
    agent_dir: &Path,
    session: &Path,
) -> (kernel::approval::ApprovalPolicy, Option<Duration>) {
    match pi_agent::settings::session(agent_dir, session) {
        Ok(settings) => (settings.approvals, settings.approval_timeout),
        Err(error) => {
            tracing::warn!(%error, "the settings cannot be read; tools wait for approval");
            (kernel::approval::ApprovalPolicy::Ask, None)
        }
    }
}

/// Everything a worker is started with.
pub struct WorkerSetup<D> {
    /// How it reaches its server.
    pub dial: D,
    /// The secret its hello proves it with.
    pub token: String,
    /// The session it hosts.
    pub session_id: String,
    /// Where sessions are stored.
    pub session_dir: PathBuf,
    /// Models, credentials and settings.
    pub agent_dir: PathBuf,
    /// Its process id, as its hello and announcements say.
    pub pid: u64,
    /// The default working directory of a session created without one.
    pub cwd: Option<String>,
    /// Kernel time: [`wall_now`], or a simulation's clock.
    pub clock: fn() -> Instant,
    /// Its bounds and deadlines.
    pub limits: WorkerLimits,
    /// The runtime's policy (checkpoints, compaction).
    pub policy: kernel::runtime::Policy,
    /// Time between two events of a faux model reply.
    pub faux_delay: Duration,
}

/// Runs a worker until its host says to exit.
pub async fn run<D: Dial>(setup: WorkerSetup<D>) -> Result<(), String> {
    let WorkerSetup {
        dial,
        token,
        session_id,
        session_dir,
        agent_dir,
        pid,
        cwd,
        clock,
        limits,
        policy,
        faux_delay,
    } = setup;
    let channel = Channel::connect(&dial).await?;
    let registry = std::sync::Arc::new(ModelRegistry::load(&agent_dir));
    let mut policy = policy;
    (policy.approvals, policy.approval_timeout) =
        approval_settings(&agent_dir, &session_dir.join(&session_id));
    let config = HostConfig {
        session_id: session_id.clone(),
        token,
        pid,
        models: registry.models().to_vec(),
        default_model: pi_config::settings::default_model(&agent_dir),
        cwd,
        policy,
        limits: limits.clone(),
        observe: false,
    };
    let (mut host, outputs) = WorkerHost::new(config, clock());
    let (events_tx, mut events) = mpsc::channel::<HostInput>(HOST_EVENTS);
    let mut w = Worker {
        registry,
        dial,
        session_dir: session_dir.clone(),
        session_id: session_id.clone(),
        store: None,
        channel: Some(channel),
        announcement: None,
        announce_task: None,
        announce_timeout: limits.announce_timeout,
        cwd: String::new(),
        events: events_tx,
        model_task: None,
        tool_task: None,
        mcp_tasks: Default::default(),
        mcp_peers: Default::default(),
        mcp_specs: (Arc::from([]), Vec::new()),
        agent_dir,
        outputs: session_dir.join(&session_id),
        delay: faux_delay,
        clock,
        exit: None,
    };
    w.apply(&mut host, outputs).await;
    while w.exit.is_none() {
        let sleep = async {
            match host.next_deadline() {
                Some(at) => {
                    let wait = at.as_millis().saturating_sub(clock().as_millis());
                    tokio::time::sleep(Duration::from_millis(wait)).await
                }
                None => std::future::pending().await,
            }
        };
        let announced = async {
            match w.announce_task.as_mut() {
                Some(task) => task.await.unwrap_or((None, None)),
                None => std::future::pending().await,
            }
        };
        let input = tokio::select! {
            frame = recv(&mut w.channel) => match frame {
                Some(frame) => HostInput::Frame(frame),
                None => {
                    w.channel = None;
                    HostInput::ChannelLost
                }
            },
            (channel, answer) = announced => {
                w.announce_task = None;
                w.announcement = channel;
                HostInput::Announced(answer)
            }
            Some(input) = events.recv() => input,
            () = sleep => HostInput::Tick,
        };
        let outputs = host.step(clock(), input);
        w.apply(&mut host, outputs).await;
    }
    w.stop_tasks();
    if let Some(store) = w.store.take() {
        store.close().map_err(|e| e.to_string())?;
        tracing::info!(session = %session_id, "session closed");
    }
    w.exit.unwrap_or(Ok(()))
}

/// The next frame on the channel, if there is one; pending without one.
async fn recv<S: Duplex>(channel: &mut Option<Channel<S>>) -> Option<WorkerFrame> {
    match channel {
        Some(ch) => ch.recv().await,
        None => std::future::pending().await,
    }
}

/// One announcement: connect, say hello, and read the first answer, each
/// within `timeout`.
async fn announce<D: Dial>(
    dial: D,
    hello: WorkerFrame,
    timeout: Duration,
) -> (Option<Channel<D::Stream>>, Option<WorkerFrame>) {
    let Ok(Ok(mut fresh)) = tokio::time::timeout(timeout, Channel::connect(&dial)).await else {
        return (None, None); // nobody there yet
    };
    fresh.send(&hello).await;
    let answer = tokio::time::timeout(timeout, fresh.recv())
        .await
        .ok()
        .flatten();
    (Some(fresh), answer)
}

/// The ready MCP servers' clients, by name and start.
type McpPeers = std::sync::Arc<
    std::sync::Mutex<
        std::collections::HashMap<
            (String, u64),
            agent::rmcp::service::Peer<agent::rmcp::RoleClient>,
        >,
    >,
>;

/// An announcement in flight: the channel it opened, and the first answer.
type Announcing<S> = JoinHandle<(Option<Channel<S>>, Option<WorkerFrame>)>;

struct Worker<D: Dial> {
    /// Models and how to reach them.
    registry: std::sync::Arc<ModelRegistry>,
    /// How to reach the server.
    dial: D,
    session_dir: PathBuf,
    session_id: String,
    store: Option<SessionStore>,
    /// The channel to the server holding this worker.
    channel: Option<Channel<D::Stream>>,
    /// The channel of an answered announcement, until the host says what to do with it.
    announcement: Option<Channel<D::Stream>>,
    announce_task: Option<Announcing<D::Stream>>,
    announce_timeout: Duration,
    /// The session's working directory (the system prompt names it).
    cwd: String,
    /// Model events and tool results come back through here.
    events: mpsc::Sender<HostInput>,
    model_task: Option<(u64, JoinHandle<()>, CancellationToken)>,
    tool_task: Option<(String, JoinHandle<()>, CancellationToken)>,
    /// Each running MCP server's task, by name and start; aborting it ends
    /// the server (its process group is killed).
    mcp_tasks: std::collections::HashMap<(String, u64), JoinHandle<()>>,
    /// How to call each ready MCP server, by name and start.
    mcp_peers: McpPeers,
    /// The MCP tools as the providers describe them, for the host's list
    /// they were made from (it changes only when a server does).
    mcp_specs: (Arc<[OfferedTool]>, Vec<agent::ToolSpec>),
    agent_dir: PathBuf,
    /// The session's directory: its own `settings.json` (tools, context
    /// files), and the whole outputs of cut `bash` commands.
    outputs: PathBuf,
    delay: Duration,
    clock: fn() -> Instant,
    exit: Option<Result<(), String>>,
}

impl<D: Dial> Worker<D> {
    /// Carries out the host's outputs in order; a store operation's answer
    /// goes straight back to the host, and what it says next is carried out too.
    async fn apply(&mut self, host: &mut WorkerHost, outputs: Vec<HostOutput>) {
        let mut queue: VecDeque<HostOutput> = outputs.into();
        while let Some(output) = queue.pop_front() {
            let answer = match output {
                HostOutput::Send(frame) => {
                    if let Some(ch) = &mut self.channel {
                        ch.send(&frame).await;
                    }
                    None
                }
                HostOutput::OpenStore
                | HostOutput::AdoptStore(_)
                | HostOutput::CreateStore(_)
                | HostOutput::RecordServer
                | HostOutput::Commit(_)
                | HostOutput::ReloadStore => self.store(output),
                HostOutput::SaveDefaultModel(model) => {
                    if let Err(e) = pi_config::settings::set_default_model(&self.agent_dir, &model)
                    {
                        tracing::warn!(error = %e, "cannot record the default model");
                    }
                    None
                }
                HostOutput::StartModel {
                    call,
                    request,
                    mcp_tools,
                } => {
                    if !Arc::ptr_eq(&self.mcp_specs.0, &mcp_tools) {
                        let specs = mcp_tools.iter().map(agent::ToolSpec::mcp).collect();
                        self.mcp_specs = (mcp_tools, specs);
                    }
                    self.start_model(call, request);
                    None
                }
                HostOutput::LoadMcp => Some(HostInput::Mcp(McpInput::Configure(
                    pi_config::settings::mcp_layers(&self.agent_dir, &self.outputs),
                ))),
                HostOutput::Mcp(McpOutput::Start { generation, config }) => {
                    self.start_mcp(generation, config);
                    None
                }
                HostOutput::Mcp(McpOutput::Stop { name, generation }) => {
                    let key = (name, generation);
                    if let Some(task) = self.mcp_tasks.remove(&key) {
                        task.abort();
                    }
                    self.peers().remove(&key);
                    None
                }
                HostOutput::Mcp(McpOutput::Notice(_)) => None, // the host tells them
                HostOutput::RecordMcp(status) => {
                    if let Err(e) = agent::mcp::record(&self.outputs, &status) {
                        tracing::warn!(error = %e, "cannot record the MCP servers' state");
                    }
                    None
                }
                HostOutput::CallMcp {
                    id,
                    server,
                    generation,
                    tool,
                    input,
                } => {
                    self.call_mcp(id, (server, generation), tool, input);
                    None
                }
                HostOutput::CancelModel { call } => {
                    self.cancel_model(call);
                    None
                }
                HostOutput::RunTool {
                    id,
                    tool_name,
                    input,
                    cwd,
                } => {
                    self.run_tool(id, tool_name, input, cwd);
                    None
                }
                HostOutput::CancelTool { id } => {
                    self.cancel_tool(&id);
                    None
                }
                HostOutput::Announce(hello) => {
                    tracing::info!("server gone; announcing this worker for adoption");
                    let task = announce(self.dial.clone(), hello, self.announce_timeout);
                    self.announce_task = Some(tokio::spawn(task));
                    None
                }
                HostOutput::SwitchChannel => {
                    tracing::info!("adopted by the new server");
                    self.channel = self.announcement.take();
                    None
                }
                HostOutput::DropAnnouncement => {
                    self.announcement = None;
                    None
                }
                HostOutput::Exit(result) => {
                    if let Err(e) = &result {
                        tracing::error!(error = %e, "worker stops");
                    }
                    self.exit = Some(result);
                    return;
                }
            };
            if let Some(input) = answer {
                queue.extend(host.step((self.clock)(), input));
            }
        }
    }

    /// Carries out a store output; the store's answer goes back to the host.
    fn store(&mut self, output: HostOutput) -> Option<HostInput> {
        match output {
            HostOutput::OpenStore => {
                match SessionStore::open(&self.session_dir, &self.session_id) {
                    Err(StoreError::Unopened {
                        created_at, cwd, ..
                    }) => Some(HostInput::StoreUnopened { created_at, cwd }),
                    opened => Some(HostInput::StoreOpened(
                        opened
                            .map(|(store, stored)| {
                                self.opened(store, &stored.cwd);
                                stored
                            })
                            .map_err(|e| self.store_failed("cannot open the session", &e)),
                    )),
                }
            }
            HostOutput::AdoptStore(stored) => {
                let adopted = SessionStore::adopt(&self.session_dir, &stored);
                Some(HostInput::StoreOpened(
                    adopted
                        .map(|store| {
                            self.opened(store, &stored.cwd);
                            stored
                        })
                        .map_err(|e| self.store_failed("cannot open pi's session", &e)),
                ))
            }
            HostOutput::CreateStore(stored) => {
                let created = SessionStore::create(&self.session_dir, &stored);
                Some(HostInput::StoreOpened(
                    created
                        .map(|store| {
                            self.opened(store, &stored.cwd);
                            stored
                        })
                        .map_err(|e| self.store_failed("cannot create the session", &e)),
                ))
            }
            HostOutput::RecordServer => {
                if let (Some(store), Some(path)) = (&mut self.store, self.dial.server_path()) {
                    store.record_server(path);
                }
                None
            }
            HostOutput::Commit(batch) => {
                let store = self.store.as_mut().expect("a commit follows the open");
                let result = store.apply(&batch);
                Some(HostInput::Committed(
                    result.map_err(|e| self.store_failed("storage write failed", &e)),
                ))
            }
            HostOutput::ReloadStore => {
                let store = self.store.as_ref().expect("a reload follows the open");
                let result = store.reload();
                Some(HostInput::Reloaded(result.map_err(|e| {
                    self.store_failed("cannot read the session back", &e)
                })))
            }
            _ => unreachable!("not a store output"),
        }
    }

    /// Stops model call `call`, if it is the one running: the HTTP stream
    /// is dropped.
    fn cancel_model(&mut self, call: u64) {
        if let Some((c, task, cancel)) = self.model_task.take() {
            if c == call {
                cancel.cancel();
                task.abort();
            } else {
                self.model_task = Some((c, task, cancel));
            }
        }
    }

    /// Stops tool `id`, if it is the one running: a cancelled `bash` has its
    /// process group killed.
    fn cancel_tool(&mut self, id: &str) {
        if let Some((i, task, cancel)) = self.tool_task.take() {
            if i == id {
                cancel.cancel();
                task.abort();
            } else {
                self.tool_task = Some((i, task, cancel));
            }
        }
    }

    fn opened(&mut self, store: SessionStore, cwd: &str) {
        tracing::info!(session = %self.session_id, "session open");
        // Holding the session's lock: what a killed worker's tools left
        // running dies before the session runs again.
        let reaped = agent::reap_tool_groups(&self.session_dir.join(&self.session_id));
        if reaped > 0 {
            tracing::warn!(session = %self.session_id, groups = reaped, "killed the processes of tools a dead worker left running");
        }
        self.store = Some(store);
        self.cwd = cwd.to_string();
    }

    fn store_failed(&self, what: &str, e: &StoreError) -> StoreFailure {
        tracing::warn!(session = %self.session_id, error = %e, "{what}");
        e.failure()
    }

    fn peers(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<
            (String, u64),
            agent::rmcp::service::Peer<agent::rmcp::RoleClient>,
        >,
    > {
        self.mcp_peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts an MCP server; its task answers the host when it is up (or
    /// not), and again when it ends.
    fn start_mcp(&mut self, generation: u64, config: ServerConfig) {
        let events = self.events.clone();
        let peers = std::sync::Arc::clone(&self.mcp_peers);
        let cwd = PathBuf::from(&self.cwd);
        let session = self.outputs.clone();
        let key = (config.name.clone(), generation);
        let task_key = key.clone();
        let task = tokio::spawn(async move {
            let name = config.name.clone();
            let failed = |reason: String| {
                HostInput::Mcp(McpInput::Failed {
                    name: name.clone(),
                    generation,
                    reason,
                })
            };
            match agent::mcp::start(&config, &cwd, Some(&session)).await {
                Err(reason) => {
                    let _ = events.send(failed(reason)).await;
                }
                Ok((started, tools)) => {
                    tracing::info!(server = %name, tools = tools.len(), "MCP server ready");
                    peers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(task_key.clone(), started.peer());
                    let started_input = HostInput::Mcp(McpInput::Started {
                        name: name.clone(),
                        generation,
                        tools,
                    });
                    if events.send(started_input).await.is_err() {
                        return;
                    }
                    let reason = started.ended().await;
                    peers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&task_key);
                    let _ = events.send(failed(reason)).await;
                }
            }
        });
        if let Some(old) = self.mcp_tasks.insert(key, task) {
            old.abort();
        }
    }

    /// Calls an MCP server's tool like a built-in one: one at a time, and
    /// cancelled the same way.
    fn call_mcp(
        &mut self,
        id: String,
        server: (String, u64),
        tool: String,
        input: kernel::wire::Value,
    ) {
        let peer = self.peers().get(&server).cloned();
        let outputs = self.outputs.clone();
        self.spawn_tool(id, CancellationToken::new(), async move {
            match peer {
                Some(peer) => agent::mcp::call(&peer, &tool, &input, Some(&outputs)).await,
                None => {
                    agent::ToolOutcome::error(format!("{tool}: MCP server {:?} is gone", server.0))
                }
            }
        });
    }

    /// Runs a tool call (built-in or MCP) as the one tool task: its outcome
    /// goes to the host; a tool task still running is cancelled.
    fn spawn_tool(
        &mut self,
        id: String,
        cancel: CancellationToken,
        run: impl Future<Output = agent::ToolOutcome> + Send + 'static,
    ) {
        let events = self.events.clone();
        let task_id = id.clone();
        let task = tokio::spawn(async move {
            let done = run.await;
            let _ = events
                .send(HostInput::ToolDone {
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

    fn start_model(&mut self, call: u64, request: ModelRequest) {
        let events = self.events.clone();
        let (delay, clock) = (self.delay, self.clock);
        let cancel = CancellationToken::new();
        let provider = if request.model.provider == faux::PROVIDER {
            None
        } else {
            // Context files are read again for every call: edits take effect.
            let date = kernel::time::format_utc(clock().as_millis());
            let date = date.split(' ').next().unwrap_or_default().to_owned();
            Some(
                self.registry
                    .call_config(
                        &request.model,
                        &self.cwd,
                        &self.agent_dir,
                        &self.outputs,
                        &date,
                    )
                    .map(|mut config| {
                        config.tools.extend_from_slice(&self.mcp_specs.1);
                        config.tools.retain(|t| request.approvals.offers(&t.name));
                        config
                    }),
            )
        };
        let token = cancel.clone();
        let task = tokio::spawn(async move {
            match provider {
                None => {
                    let mut stream = FauxStream::start(&request, clock(), delay);
                    while let Some(at) = stream.next_deadline() {
                        let wait = at.as_millis().saturating_sub(clock().as_millis());
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        for event in stream.step(clock()) {
                            if events.send(HostInput::Model { call, event }).await.is_err() {
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
                    let _ = events.send(HostInput::Model { call, event }).await;
                }
                Some(Ok(provider)) => {
                    let (tx, mut rx) = mpsc::channel(MODEL_EVENTS);
                    let call_task =
                        tokio::spawn(
                            async move { agent::stream(&provider, &request, tx, token).await },
                        );
                    while let Some(event) = rx.recv().await {
                        if events.send(HostInput::Model { call, event }).await.is_err() {
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
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let outputs = self.outputs.clone();
        // A tool the session does not offer is not run, even when a model names it.
        let offered = pi_agent::settings::session(&self.agent_dir, &self.outputs).and_then(|s| {
            if s.tools.contains(&tool_name) {
                Ok(())
            } else {
                Err(format!(
                    "{tool_name}: this session does not offer the tool (its tools are {})",
                    s.tools.join(", ")
                ))
            }
        });
        self.spawn_tool(id, cancel, async move {
            let cwd = std::path::Path::new(&cwd);
            match offered {
                Ok(()) => agent::run_tool_in(&tool_name, &input, cwd, Some(&outputs), token).await,
                Err(message) => agent::ToolOutcome::error(message),
            }
        });
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
        for (_, task) in self.mcp_tasks.drain() {
            task.abort();
        }
    }
}
