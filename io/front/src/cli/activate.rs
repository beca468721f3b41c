//! Finding the server a client command talks to, and starting one when
//! none answers ("cold activation").
//!
//! A [`Target`] is one server: `<serverDir>/<serverId>.sock`, or the socket
//! `--connect` names. [`connect`] reaches it:
//!
//! - a server answers: use it. A global `--model` is then an error, since a
//!   default model can only be chosen for a server this client starts;
//! - nothing listens (or only a stale socket is left) and the target may be
//!   started (not `--connect`): cold activation, below;
//! - the server answers the hello with `hello_error` code `version` (another
//!   build, older or newer): replace it by cold-activating this build with
//!   the same id. The new `serve` asks the old server to hand its workers
//!   over (see `daemon::request_handoff`), so live sessions survive.
//!
//! Cold activation:
//!
//! 1. take the exclusive lock `<serverDir>/launcher-<serverId>.lock`, which
//!    serialises racing clients (the kernel releases it if we die);
//! 2. connect again, since the client that held the lock before us may have
//!    started (or replaced) the server meanwhile;
//! 3. with a global `--model`, write it to `<agentDir>/settings.json` as
//!    `defaultProvider`/`defaultModel`, so new sessions start with it;
//! 4. spawn `pi-server serve … --idle-exit-ms <grace>` detached in its own
//!    process group, logging to `<serverDir>/server-<serverId>.log`;
//! 5. poll the socket every 10 ms until the new server answers (while it
//!    replaces an old one, the old one's version errors mean "not yet"),
//!    then release the lock.
//!
//! Such a server retires `grace` after its last client left and no worker is
//! busy (default 1000 ms, `$PI_SERVER_IDLE_EXIT_MS` overrides).

use super::args::{GlobalArgs, absolute};
use crate::limits::{DEFAULT_IDLE_EXIT_MS, REPLACE_TIMEOUT, START_POLL_INTERVAL, START_TIMEOUT};
use kernel::protocol::{ErrorCode, ModelRef};
use pi_client::{Address, Client, ClientError, TransportFailure};
use pi_config as config;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Instant;

/// The error for a global `--model` when no new server is started.
pub(super) const MODEL_ONLY_AT_ACTIVATION: &str =
    "Model selection is only valid when automatically activating a new server";

/// Where a client command connects, and how to start a server there.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) address: Address,
    pub(super) token: Option<String>,
    /// `None` with `--connect`: an explicit socket is never started.
    pub(super) launch: Option<Launch>,
    /// The server was chosen (`--connect`, `--server-id`, `$PI_SERVER_ID`):
    /// commands use it alone, without discovering the others.
    pub(super) explicit: bool,
    /// The global `--model`: the default model of a server this client starts.
    pub(super) model: Option<ModelRef>,
}

/// Everything needed to start a server in the background.
#[derive(Debug, Clone)]
pub(super) struct Launch {
    pub(super) server_dir: PathBuf,
    pub(super) server_id: String,
    pub(super) session_dir: PathBuf,
    pub(super) token_file: Option<PathBuf>,
    pub(super) idle_exit_ms: u64,
}

impl Target {
    /// The same settings aimed at server `server_id` of the same server dir.
    pub(super) fn for_server(&self, server_id: &str) -> Option<Self> {
        let launch = self.launch.as_ref()?;
        Some(Self {
            address: Address::Unix(config::socket_path(&launch.server_dir, server_id)),
            token: self.token.clone(),
            launch: Some(Launch {
                server_id: server_id.to_owned(),
                ..launch.clone()
            }),
            explicit: true,
            model: self.model.clone(),
        })
    }
}

/// The environment variable naming a client's token file.
pub(super) const TOKEN_FILE_VAR: &str = "PI_SERVER_TOKEN_FILE";

/// The target of a client command, from the global options.
pub(super) fn client_target(
    global: &GlobalArgs,
    model: Option<ModelRef>,
) -> Result<Target, String> {
    // A client takes its token from --token-file, else $PI_SERVER_TOKEN_FILE.
    let token_file = global.token_file.clone().or_else(|| {
        std::env::var_os(TOKEN_FILE_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let token = token_file
        .as_deref()
        .map(config::read_token_file)
        .transpose()?;
    if let Some(address) = &global.connect {
        if model.is_some() {
            // --connect never starts a server, so no default can be chosen.
            return Err(MODEL_ONLY_AT_ACTIVATION.into());
        }
        if matches!(address, Address::Tcp(_)) && token.is_none() {
            return Err(format!(
                "--connect {address} needs --token-file (or {TOKEN_FILE_VAR}): a server \
                 accepts TCP clients only with its token"
            ));
        }
        return Ok(Target {
            address: address.clone(),
            token,
            launch: None,
            explicit: true,
            model: None,
        });
    }
    let server_dir = absolute(&config::server_dir(global.server_dir.clone()))?;
    config::ensure_private_dir(&server_dir)?;
    let explicit =
        global.server_id.is_some() || std::env::var("PI_SERVER_ID").is_ok_and(|id| !id.is_empty());
    let server_id = config::server_id(global.server_id.clone(), &server_dir)?;
    let session_dir = absolute(&config::session_dir(global.session_dir.clone()))?;
    let token_file = token_file.as_deref().map(absolute).transpose()?;
    Ok(Target {
        address: Address::Unix(config::socket_path(&server_dir, &server_id)),
        token,
        launch: Some(Launch {
            server_dir,
            server_id,
            session_dir,
            token_file,
            idle_exit_ms: idle_exit_ms()?,
        }),
        explicit,
        model,
    })
}

fn idle_exit_ms() -> Result<u64, String> {
    match std::env::var("PI_SERVER_IDLE_EXIT_MS") {
        Ok(value) if !value.trim().is_empty() => value.trim().parse().map_err(|_| {
            format!("PI_SERVER_IDLE_EXIT_MS must be a whole number of milliseconds, not {value:?}")
        }),
        _ => Ok(DEFAULT_IDLE_EXIT_MS),
    }
}

/// True when nothing listens at the socket (so one may be started).
pub(super) fn no_server(error: &ClientError) -> bool {
    matches!(error, ClientError::Transport { failure, .. } if failure.nothing_listening())
}

/// True when the connection broke before the hello completed (a server
/// closing its listener drops the connections it had not accepted).
fn cut_off(error: &ClientError) -> bool {
    match error {
        ClientError::Transport { failure, .. } => *failure == TransportFailure::CutOff,
        ClientError::Disconnected(_) => true,
        _ => false,
    }
}

/// The server's message when it refused our hello for its protocol version.
pub(super) fn version_refusal(error: &ClientError) -> Option<&str> {
    match error {
        ClientError::Server(e) if e.code == ErrorCode::Version => Some(&e.message),
        _ => None,
    }
}

pub(super) fn connect_error(at: impl Into<Address>, error: ClientError) -> String {
    let at = at.into();
    match error {
        ClientError::Transport {
            failure: TransportFailure::Absent,
            ..
        } => {
            format!("no server at {at} (no such socket); start one with `pi-server serve`")
        }
        ClientError::Transport {
            failure: TransportFailure::Refused,
            ..
        } => {
            format!("no server is listening at {at} (connection refused)")
        }
        ClientError::Server(e) if e.code == ErrorCode::Auth => format!(
            "the server at {at} refused the token: {} (pass the right --token-file)",
            e.message
        ),
        ClientError::Server(e) if e.code == ErrorCode::Version => format!(
            "the server at {at} speaks another protocol version: {}",
            e.message
        ),
        ClientError::Server(e) => {
            format!("the server at {at} refused the connection: {}", e.message)
        }
        other => format!("cannot connect to {at}: {other}"),
    }
}

/// Connects to the target's server, starting one first if none answers, or
/// replacing one that speaks another protocol version.
pub(super) async fn connect(target: &Target) -> Result<Client, String> {
    match open(target).await {
        Ok(client) => already_running(target, client).await,
        Err(e) => match &target.launch {
            Some(launch) if no_server(&e) || version_refusal(&e).is_some() => {
                activate(target, launch).await
            }
            _ => Err(connect_error(&target.address, e)),
        },
    }
}

/// A client of the target's server, which starts it again should a
/// reconnection find none ([`launcher`]).
async fn open(target: &Target) -> Result<Client, ClientError> {
    Client::connect_launching(
        &target.address,
        target.token.as_deref(),
        pi_client::ClientOptions::default(),
        launcher(target),
    )
    .await
}

/// A server answered without being started by us: a global `--model` is an error.
async fn already_running(target: &Target, client: Client) -> Result<Client, String> {
    if target.model.is_some() {
        client.close().await;
        return Err(MODEL_ONLY_AT_ACTIVATION.into());
    }
    Ok(client)
}

/// Starts the target's server (or replaces it) under the launcher lock.
pub(super) async fn activate(target: &Target, launch: &Launch) -> Result<Client, String> {
    let lock_path = launch
        .server_dir
        .join(format!("launcher-{}.lock", launch.server_id));
    let lock = tokio::task::spawn_blocking(move || lock_file(&lock_path))
        .await
        .map_err(|e| format!("cannot take the launcher lock: {e}"))??;
    // Whoever held the lock before us may have started or replaced the server.
    let outcome = match open(target).await {
        Ok(client) => already_running(target, client).await,
        Err(e) if no_server(&e) => start_server(target, launch, None).await,
        Err(e) => match version_refusal(&e) {
            Some(message) => start_server(target, launch, Some(message)).await,
            None => Err(connect_error(&target.address, e)),
        },
    };
    drop(lock);
    outcome
}

/// Opens and exclusively locks `path`, waiting for other holders.
fn lock_file(path: &Path) -> Result<fs::File, String> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    Ok(file)
}

/// Spawns a detached, idle-exiting server and waits until it answers.
/// `replacing` is the version error of the server it replaces, if any.
async fn start_server(
    target: &Target,
    launch: &Launch,
    replacing: Option<&str>,
) -> Result<Client, String> {
    let at = &target.address;
    if let Some(message) = replacing {
        eprintln!(
            "pi-server: the server at {at} speaks another protocol version ({message}); \
             replacing it with this build"
        );
    }
    if let Some(model) = &target.model {
        let agent_dir = config::agent_dir();
        pi_config::settings::set_default_model(&agent_dir, model)?;
        tracing::info!(model = %format!("{}/{}", model.provider, model.id), agent_dir = %agent_dir.display(), "recorded the default model");
    }
    let (child, log_path) = spawn_server(launch)?;
    tracing::info!(pid = child.id(), socket = %at, "started a background server");
    let mut child = Some(child);
    let outcome = wait_for_server(target, &mut child, &log_path, replacing.is_some()).await;
    if let Some(mut child) = child {
        if outcome.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        } else {
            // Reap it whenever it retires, so it never lingers as a zombie.
            std::thread::spawn(move || child.wait());
        }
    }
    let client = match (outcome, replacing) {
        (Ok(client), _) => client,
        (Err(e), None) => return Err(e),
        (Err(e), Some(message)) => {
            return Err(format!(
                "cannot replace the server at {at}, which speaks another protocol version \
                 ({message}): {e}"
            ));
        }
    };
    if let Some(model) = &target.model
        && !client
            .server_snapshot()
            .models
            .iter()
            .any(|m| m.provider == model.provider && m.id == model.id)
    {
        eprintln!(
            "pi-server: warning: the server does not offer {}/{} (see `pi-server models`); \
             new sessions start with its default model",
            model.provider, model.id
        );
    }
    Ok(client)
}

/// Spawns a detached, idle-exiting server for `launch`, its output going
/// to its log; returns it and the log's path.
fn spawn_server(launch: &Launch) -> Result<(Child, PathBuf), String> {
    let log_path = launch
        .server_dir
        .join(format!("server-{}.log", launch.server_id));
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| format!("cannot open the server log {}: {e}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot open the server log {}: {e}", log_path.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("serve")
        .arg("--server-dir")
        .arg(&launch.server_dir)
        .arg("--server-id")
        .arg(&launch.server_id)
        .arg("--session-dir")
        .arg(&launch.session_dir)
        .arg("--idle-exit-ms")
        .arg(launch.idle_exit_ms.to_string());
    if let Some(token_file) = &launch.token_file {
        command.arg("--token-file").arg(token_file);
    }
    command
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start a server: {e}"))?;
    Ok((child, log_path))
}

/// Starts the target's server again when a client's reconnection finds none
/// (it crashed, or retired while the client was away): under the launcher
/// lock, unless one answers by then. The reconnection finds it.
pub(super) fn launcher(target: &Target) -> Option<pi_client::Launcher> {
    let launch = target.launch.clone()?;
    let Address::Unix(socket) = target.address.clone() else {
        return None;
    };
    Some(std::sync::Arc::new(move || {
        let lock_path = launch
            .server_dir
            .join(format!("launcher-{}.lock", launch.server_id));
        let _lock = lock_file(&lock_path)?;
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Ok(());
        }
        let (mut child, _) = spawn_server(&launch)?;
        // Reap it whenever it retires, so it never lingers as a zombie.
        std::thread::spawn(move || child.wait());
        Ok(())
    }))
}

/// Polls the socket until the server answers, it exits, or time runs out.
/// Leaves `child` as `None` once it has been reaped. While `replacing`, the
/// old server's version errors mean the new one is not there yet.
async fn wait_for_server(
    target: &Target,
    child: &mut Option<Child>,
    log_path: &Path,
    replacing: bool,
) -> Result<Client, String> {
    let timeout = if replacing {
        REPLACE_TIMEOUT
    } else {
        START_TIMEOUT
    };
    let deadline = Instant::now() + timeout;
    loop {
        tokio::time::sleep(START_POLL_INTERVAL).await;
        match open(target).await {
            Ok(client) => return Ok(client),
            Err(e) if no_server(&e) => {}
            // The old server still answers, or drops what it had not accepted yet.
            Err(e) if replacing && (version_refusal(&e).is_some() || cut_off(&e)) => {}
            Err(e) => return Err(connect_error(&target.address, e)),
        }
        if let Some(process) = child.as_mut()
            && let Ok(Some(status)) = process.try_wait()
        {
            *child = None;
            let what = if replacing {
                "the new server exited before it took over"
            } else {
                "the server exited during startup"
            };
            return Err(format!(
                "{what} ({status}); see {}{}",
                log_path.display(),
                log_tail(log_path)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the server did not answer at {} within {} s; see {}",
                target.address,
                timeout.as_secs(),
                log_path.display()
            ));
        }
    }
}

/// The last lines of a log, indented, for an error message.
pub(super) fn log_tail(path: &Path) -> String {
    let Ok(text) = fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(10);
    lines[start..]
        .iter()
        .map(|line| format!("\n  {line}"))
        .collect()
}
