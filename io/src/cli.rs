//! The `pi-server` command line: the server (`serve`), its internal worker
//! (`worker`), and client commands that talk pi protocol v1 to a server
//! through [`crate::client::Client`].
//!
//! Client commands reach a server as [`activate`] describes: the server
//! `<serverDir>/<serverId>.sock` (see [`crate::config`]) or the socket
//! `--connect` names, started in the background when none answers ("cold
//! activation") and replaced when it speaks another protocol version.
//! Several servers (different ids) may share a server dir: `list` shows the
//! sessions of all of them, and commands taking a session id find the
//! server that holds it ([`discover`]).

mod activate;
mod attach;
mod demo;
mod discover;

use self::activate::{
    MODEL_ONLY_AT_ACTIVATION, START_POLL_INTERVAL, START_TIMEOUT, Target, client_target, connect,
    connect_error, log_tail, no_server,
};
use self::discover::{Found, close_all, servers, session_server};
use crate::client::{Address, Client, Status};
use crate::config;
use clap::{Args, Parser, Subcommand};
use kernel::client::follow::{self, Follower, TurnOutcome, Update};
use kernel::protocol::{
    CreateParams, ModelMetadata, ModelRef, ServerEvent, SessionMetadata, SessionSnapshot,
    ThinkingLevel, TranscriptItem,
};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::broadcast;

/// A durable multi-client server for coding-agent sessions (pi protocol v1).
///
/// Client commands (list, create, prompt, attach, rm, models) talk to the
/// server of the selected server directory and id, and start one in the
/// background when none is running. Several servers (different ids) may
/// share a server directory: `list` shows the sessions of all of them, and
/// `prompt`, `attach` and `rm` find the server holding the session. Run
/// `pi-server demo` for a tour.
#[derive(Debug, Parser)]
#[command(name = "pi-server", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    /// Default model for new sessions, as PROVIDER/MODEL; only valid when
    /// this command automatically activates a new server.
    ///
    /// Valid only when no server is running and the command starts one: the
    /// model is then written to
    /// <agentDir>/settings.json (defaultProvider, defaultModel) before the
    /// server starts, and new sessions use it. With a server already
    /// running (or with --connect) it is an error. Give it before the
    /// command: `pi-server --model faux/faux-reasoner create`. For the model
    /// of one session, use `create --model`.
    #[arg(long = "model", value_name = "PROVIDER/MODEL", value_parser = parse_model)]
    default_model: Option<ModelRef>,

    #[command(subcommand)]
    command: Commands,
}

/// Options every command accepts.
#[derive(Debug, Args)]
struct GlobalArgs {
    /// Directory of server sockets, ids and logs [default: $PI_SERVER_DIR, else ~/.pi/server]
    #[arg(long, global = true, value_name = "DIR")]
    server_dir: Option<PathBuf>,

    /// Logical server id, a lowercase UUIDv4; when given (or set in $PI_SERVER_ID), `list`,
    /// `prompt`, `attach` and `rm` use this server alone instead of every server in the
    /// server dir [default: $PI_SERVER_ID, else <DIR>/default-server-id]
    #[arg(long, global = true, value_name = "UUID")]
    server_id: Option<String>,

    /// Where sessions are stored [default: $PI_CODING_AGENT_DIR/sessions, else ~/.pi/agent/sessions]
    #[arg(long, global = true, value_name = "DIR")]
    session_dir: Option<PathBuf>,

    /// Use the server at this address alone and never start one: its socket, or
    /// the `serve --listen` address, which needs --token-file
    #[arg(long, global = true, value_name = "unix:///PATH|tcp://HOST:PORT", value_parser = parse_connect)]
    connect: Option<Address>,

    /// File holding a shared secret: clients send it in hello, `serve` requires it
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

impl GlobalArgs {
    fn any(&self) -> bool {
        self.server_dir.is_some()
            || self.server_id.is_some()
            || self.session_dir.is_some()
            || self.connect.is_some()
            || self.token_file.is_some()
    }
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run a server in the foreground until SIGINT or SIGTERM.
    ///
    /// It listens at <server-dir>/<server-id>.sock (mode 0600) and stores
    /// sessions in the session directory. With --token-file, clients must
    /// send that token in their hello.
    Serve(ServeArgs),

    /// Internal: run one session worker (started by the server).
    #[command(hide = true)]
    Worker,

    /// List the sessions of every server running in the server dir: server id,
    /// session id, creation and last activity time (UTC), model, working
    /// directory, name.
    ///
    /// Newest activity first. The model (and thinking level) is read from the
    /// session directory where this client can read it, else `-`. When no server runs, the default one is
    /// started. With --server-id or --connect, that server only.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Print session ids only, one per line.
        #[arg(short, long, conflicts_with = "json")]
        quiet: bool,
    },

    /// Print a shell completion script: `pi-server completions bash > ...`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },

    /// Create a session and print its id.
    Create(CreateArgs),

    /// Send one prompt to a session and stream the reply to stdout.
    ///
    /// Exits 0 when the turn completes; non-zero when the server refuses the
    /// prompt (for example `busy` during another turn) or the reply ends in
    /// an error. Ctrl-C aborts the turn.
    Prompt {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// The prompt; several words are joined with spaces. `-` alone reads
        /// the prompt from standard input.
        #[arg(required = true, num_args = 1.., value_name = "TEXT")]
        text: Vec<String>,
    },

    /// Follow a session interactively.
    ///
    /// On a terminal this is a full-screen UI: the transcript (history,
    /// streamed replies, thinking, tool calls, other clients' messages), a
    /// status line, and an input box. Enter sends a prompt when the session
    /// is idle and a steering message while a turn runs; Alt-Enter or Ctrl-J
    /// adds a newline; a paste is one message. Ctrl-C aborts the running
    /// turn (again, or when idle, it clears the input); Ctrl-D detaches.
    /// Ctrl-T shows thinking; PageUp/PageDown scroll.
    ///
    /// Without a terminal, each line read from stdin is sent as a prompt
    /// when the session is idle and as a steering message while a turn
    /// runs, and replies stream to stdout.
    Attach {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// How many of the latest turns to show on attach, or `all`.
        #[arg(long, default_value = "10", value_name = "N|all")]
        history: crate::tui::History,
        /// Without a terminal: print every event as a JSON line (the
        /// protocol's own field names) instead of plain text.
        #[arg(long)]
        json: bool,
    },

    /// Print a stored session's transcript: user messages, replies, tool
    /// calls with their first output lines, and errors.
    Log {
        /// Session id, a unique prefix of one, or a session name.
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// One JSON object per transcript item instead of plain text.
        #[arg(long)]
        json: bool,
    },

    /// Delete a stored session.
    Rm {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
    },

    /// List the models the server offers.
    Models {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },

    /// Serve the Agent Client Protocol on stdin/stdout, for editors.
    ///
    /// An editor (Zed, a JetBrains IDE, Neovim, Emacs) starts this as its
    /// agent. Sessions live in the server, so a turn goes on when the editor
    /// closes, and a terminal (`pi-server attach`) or another editor can
    /// share it. Logs go to stderr; stdout carries protocol lines only.
    Acp,

    /// A one-command tour: a throwaway server, a session, a streamed reply,
    /// and a second client sharing the session.
    ///
    /// Everything lives in a fresh temporary directory that is removed at
    /// the end; no network or API key is needed (the embedded faux model
    /// answers).
    Demo,
}

/// Options of `serve`.
#[derive(Debug, Args)]
struct ServeArgs {
    /// Also accept remote clients over TCP at this address, e.g.
    /// `tcp://0.0.0.0:7447`. Requires `--token-file`: remote clients must send
    /// the token in hello.
    #[arg(long, value_name = "tcp://HOST:PORT", value_parser = parse_listen)]
    listen: Option<String>,

    /// Internal (cold activation): retire this long after the last client
    /// left and no worker is busy.
    #[arg(long, hide = true, value_name = "MS")]
    idle_exit_ms: Option<u64>,
}

/// `tcp://HOST:PORT` → `HOST:PORT`.
fn parse_listen(s: &str) -> Result<String, String> {
    let addr = s
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("expected tcp://HOST:PORT, got {s:?}"))?;
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(addr.to_string())
        }
        _ => Err(format!("expected tcp://HOST:PORT, got {s:?}")),
    }
}

/// Options of `create`.
#[derive(Debug, Args)]
struct CreateArgs {
    /// Working directory of the session [default: the current directory]
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,

    /// Display name.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,

    /// Model to start with, as PROVIDER/MODEL (see `pi-server models`).
    #[arg(long, value_name = "PROVIDER/MODEL", value_parser = parse_model)]
    model: Option<ModelRef>,

    /// Thinking level: off, minimal, low, medium, high, xhigh or max.
    #[arg(long, value_name = "LEVEL", value_parser = parse_thinking)]
    thinking: Option<ThinkingLevel>,
}

/// Why a command failed, and the exit code that says so: 1 for a failure,
/// 130 after Ctrl-C (as a shell reports a SIGINT death). Usage errors exit
/// 2, from clap.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: Option<String>,
}

impl Failure {
    /// The user pressed Ctrl-C; nothing more to say.
    fn interrupted() -> Self {
        Self {
            code: 130,
            message: None,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self {
            code: 1,
            message: Some(message),
        }
    }
}

/// The command line as parsed and documented. Global options show in the
/// help of the commands they mean something to: `--connect` is a client
/// option, so `serve`'s help leaves it out, and the tour (`demo`, which
/// makes its own throwaway server) and `completions` use none of them.
fn clap_command() -> clap::Command {
    let command = <Cli as clap::CommandFactory>::command();
    let globals: Vec<clap::Arg> = command
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    // A subcommand that already has an argument of a global's id does not
    // get the global propagated: give it a hidden copy instead.
    let hide = |command: clap::Command, sub: &str, ids: &[&str]| {
        command.mut_subcommand(sub, |mut sub| {
            for arg in globals
                .iter()
                .filter(|a| ids.contains(&a.get_id().as_str()))
            {
                sub = sub.arg(arg.clone().hide(true));
            }
            sub
        })
    };
    let all = [
        "server_dir",
        "server_id",
        "session_dir",
        "connect",
        "token_file",
    ];
    let command = hide(command, "serve", &["connect"]);
    let command = hide(command, "demo", &all);
    hide(command, "completions", &all)
}

fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = clap_command().try_get_matches_from(args)?;
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
}

/// Runs the command line and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    init_tracing(&cli.command);
    // The server and the worker are each one loop task (blocking work goes to
    // `spawn_blocking`): a current-thread runtime saves a thread hop per
    // request (BENCHMARKS.md, item 1: context switches per `list` 5.1 → 2.0).
    let single_loop = matches!(cli.command, Commands::Serve(_) | Commands::Worker);
    let mut builder = if single_loop {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pi-server: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // Do not wait for a blocking read of stdin (attach) to finish.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { code, message }) => {
            if let Some(message) = message {
                eprintln!("pi-server: {message}");
            }
            ExitCode::from(code)
        }
    }
}

fn init_tracing(command: &Commands) {
    let default = match command {
        Commands::Serve(_) | Commands::Worker => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .try_init();
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let Cli {
        global,
        default_model,
        command,
    } = cli;
    if default_model.is_some() && matches!(command, Commands::Serve(_) | Commands::Demo) {
        return Err(format!(
            "{MODEL_ONLY_AT_ACTIVATION}; for `serve`, set defaultProvider and defaultModel in {}",
            config::agent_dir().join("settings.json").display()
        )
        .into());
    }
    if matches!(command, Commands::Demo) && global.any() {
        return Err(Failure::from(
            "`demo` runs its own throwaway server and takes no server options".to_owned(),
        ));
    }
    let target = || client_target(&global, default_model.clone());
    let result = match command {
        Commands::Serve(args) => run_serve(global, args).await,
        Commands::Worker => crate::worker::run_worker().await,
        Commands::Demo => demo::run_demo().await,
        Commands::List { json, quiet } => run_list(&target()?, json, quiet).await,
        Commands::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut clap_command(),
                "pi-server",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Commands::Create(args) => run_create(&target()?, args).await,
        Commands::Prompt { id, text } => {
            let text = prompt_text(&text)?;
            return run_prompt(&target()?, &id, &text).await;
        }
        Commands::Attach { id, history, json } => {
            return run_attach(&target()?, &id, history, json).await;
        }
        Commands::Log { id, json } => run_log(&target()?, &id, json).await,
        Commands::Rm { id } => run_rm(&target()?, &id).await,
        Commands::Models { json } => run_models(&target()?, json).await,
        Commands::Acp => crate::acp::run(activate::connect(&target()?).await?).await,
    };
    result.map_err(Failure::from)
}

// ---------------------------------------------------------------------------
// Argument parsing

/// The prompt's words joined, or standard input for a lone `-`.
fn prompt_text(words: &[String]) -> Result<String, String> {
    if words != ["-"] {
        return Ok(words.join(" "));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
        .map_err(|e| format!("cannot read the prompt from standard input: {e}"))?;
    let text = text.trim_end_matches(['\n', '\r']).to_owned();
    if text.trim().is_empty() {
        return Err("the prompt read from standard input is empty".into());
    }
    Ok(text)
}

/// Parses `--connect`: `unix:///absolute/path.sock` (percent-escapes
/// allowed) or `tcp://HOST:PORT`.
fn parse_connect(address: &str) -> Result<Address, String> {
    if address.starts_with("tcp://") {
        return parse_listen(address).map(Address::Tcp);
    }
    let Some(rest) = address.strip_prefix("unix://") else {
        return Err("expected unix:///absolute/path.sock or tcp://HOST:PORT".into());
    };
    if !rest.starts_with('/') {
        return Err("the socket path must be absolute, as in unix:///run/pi/server.sock".into());
    }
    let bytes = percent_decode(rest)?;
    if bytes.len() < 2 {
        return Err("the socket path is missing, as in unix:///run/pi/server.sock".into());
    }
    Ok(Address::Unix(PathBuf::from(OsString::from_vec(bytes))))
}

fn percent_decode(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes
                .get(index + 1..index + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-escape at byte {index} of the path"))?;
            out.push(hex);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    Ok(out)
}

/// Parses `PROVIDER/MODEL`; the model id may itself contain slashes.
fn parse_model(text: &str) -> Result<ModelRef, String> {
    match text.split_once('/') {
        Some((provider, id)) if !provider.is_empty() && !id.is_empty() => Ok(ModelRef {
            provider: provider.to_owned(),
            id: id.to_owned(),
        }),
        _ => {
            Err("expected PROVIDER/MODEL, for example faux/faux-1 (see `pi-server models`)".into())
        }
    }
}

fn parse_thinking(text: &str) -> Result<ThinkingLevel, String> {
    ThinkingLevel::parse(text).ok_or_else(|| {
        let names: Vec<&str> = ThinkingLevel::ALL.iter().map(|l| l.as_str()).collect();
        format!(
            "unknown thinking level; expected one of {}",
            names.join(", ")
        )
    })
}

fn parse_non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(text.to_owned())
    }
}

// ---------------------------------------------------------------------------
// Finding the server

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("cannot resolve {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// serve

async fn run_serve(global: GlobalArgs, args: ServeArgs) -> Result<(), String> {
    if global.connect.is_some() {
        return Err(
            "--connect is for client commands; `serve` listens at <server-dir>/<server-id>.sock"
                .into(),
        );
    }
    let server_dir = absolute(&config::server_dir(global.server_dir))?;
    config::ensure_private_dir(&server_dir)?;
    let server_id = config::server_id(global.server_id, &server_dir)?;
    let session_dir = absolute(&config::session_dir(global.session_dir))?;
    let token = global
        .token_file
        .as_deref()
        .map(config::read_token_file)
        .transpose()?;
    let options = crate::daemon::ServeOptions {
        server_dir,
        server_id,
        session_dir,
        token,
        idle_exit: args.idle_exit_ms.map(Duration::from_millis),
        listen_tcp: args.listen.clone(),
    };
    crate::daemon::serve(options).await
}

// ---------------------------------------------------------------------------
// list, create, rm, models

/// Sessions of every discovered server (or of the chosen one), as
/// `(server id, session)` pairs sorted by server id, then session id.
async fn run_list(target: &Target, json: bool, quiet: bool) -> Result<(), String> {
    let found = servers(target).await?;
    let mut pairs: Vec<(String, SessionMetadata)> = Vec::new();
    let mut failed = None;
    for Found { server_id, client } in &found {
        match client.list().await {
            Ok(sessions) => pairs.extend(sessions.into_iter().map(|s| (server_id.clone(), s))),
            Err(e) => {
                failed = Some(format!(
                    "cannot list the sessions of server {server_id}: {e}"
                ));
                break;
            }
        }
    }
    close_all(found).await;
    if let Some(problem) = failed {
        return Err(problem);
    }
    // Newest activity first.
    let last = |s: &SessionMetadata| s.updated_at.unwrap_or(s.created_at);
    pairs.sort_by(|a, b| {
        last(&b.1)
            .cmp(&last(&a.1))
            .then_with(|| (&a.0, &a.1.id).cmp(&(&b.0, &b.1.id)))
    });
    if quiet {
        for (_, s) in &pairs {
            println!("{}", s.id);
        }
        return Ok(());
    }
    if json {
        let list: Vec<serde_json::Value> = pairs
            .iter()
            .map(|(server_id, s)| {
                let mut value = session_json(s);
                value["serverId"] = server_id.clone().into();
                if let Some((model, level)) = stored_model(target, &s.id) {
                    value["model"] = format!("{}/{}", model.provider, model.id).into();
                    value["thinkingLevel"] = level.as_str().into();
                }
                value
            })
            .collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    if pairs.is_empty() {
        eprintln!("no sessions yet; create one with `pi-server create`");
        return Ok(());
    }
    let mut rows = vec![vec![
        "SERVER".into(),
        "SESSION".into(),
        "CREATED (UTC)".into(),
        "LAST ACTIVITY (UTC)".into(),
        "MODEL".into(),
        "CWD".into(),
        "NAME".into(),
    ]];
    for (server_id, s) in &pairs {
        let model = stored_model(target, &s.id).map_or_else(
            || "-".to_owned(),
            |(m, level)| format!("{}/{} ({})", m.provider, m.id, level.as_str()),
        );
        rows.push(vec![
            server_id.clone(),
            s.id.clone(),
            format_utc(s.created_at),
            format_utc(last(s)),
            model,
            s.cwd.clone().unwrap_or_default(),
            s.session_name.clone().unwrap_or_default(),
        ]);
    }
    print_table(&rows);
    Ok(())
}

/// A listed session's model, from its `meta.json` where this client can
/// read the session directory (`--session-dir`); the protocol's session list
/// carries durable metadata only, without the model.
fn stored_model(target: &Target, id: &str) -> Option<(ModelRef, ThinkingLevel)> {
    let launch = target.launch.as_ref()?;
    crate::store::stored_model(&launch.session_dir, id)
}

fn session_json(s: &SessionMetadata) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("id".into(), s.id.clone().into());
    map.insert("createdAt".into(), s.created_at.into());
    if let Some(t) = s.updated_at {
        map.insert("updatedAt".into(), t.into());
    }
    if let Some(p) = &s.parent_session_id {
        map.insert("parentSessionId".into(), p.clone().into());
    }
    if let Some(n) = &s.session_name {
        map.insert("sessionName".into(), n.clone().into());
    }
    if let Some(c) = &s.cwd {
        map.insert("cwd".into(), c.clone().into());
    }
    serde_json::Value::Object(map)
}

async fn run_create(target: &Target, args: CreateArgs) -> Result<(), String> {
    let cwd = match args.cwd {
        Some(dir) => absolute(&dir)?,
        None => std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory: {e}"))?,
    };
    if !cwd.is_dir() {
        return Err(format!("--cwd {}: no such directory", cwd.display()));
    }
    let cwd = cwd
        .to_str()
        .ok_or_else(|| format!("--cwd {}: the path is not valid UTF-8", cwd.display()))?
        .to_owned();
    let client = connect(target).await?;
    if let Some(model) = &args.model {
        check_model(&client.server_snapshot().models, model, args.thinking)?;
    }
    let params = CreateParams {
        cwd: Some(cwd),
        name: args.name,
        model: args.model,
        thinking_level: args.thinking,
    };
    let session = client
        .create(params)
        .await
        .map_err(|e| format!("cannot create the session: {e}"))?;
    let models = client.server_snapshot().models;
    client.close().await;
    let chosen = &session.model;
    if models
        .iter()
        .any(|m| m.provider == chosen.provider && m.id == chosen.id && !m.authenticated)
    {
        eprintln!(
            "warning: model {}/{} has no credentials (no API key in the environment or auth.json); prompts will fail until it has",
            chosen.provider, chosen.id
        );
    }
    println!("{}", session.id);
    Ok(())
}

/// Checks a requested model (and thinking level) against the server's list,
/// with the kernel's rules and messages.
fn check_model(
    models: &[ModelMetadata],
    model: &ModelRef,
    thinking: Option<ThinkingLevel>,
) -> Result<(), String> {
    let found = kernel::runtime::find_model(models, model).map_err(|e| e.message)?;
    if let Some(level) = thinking {
        kernel::runtime::supported(found, level).map_err(|e| e.message)?;
    }
    Ok(())
}

fn levels(levels: &[ThinkingLevel]) -> String {
    levels
        .iter()
        .map(|l| l.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

async fn run_rm(target: &Target, query: &str) -> Result<(), String> {
    let (client, id) = session_server(target, query).await?;
    let id = id.as_str();
    let result = client.remove(id).await;
    client.close().await;
    result.map_err(|e| format!("cannot remove session {id}: {e}"))?;
    println!("removed session {id}");
    Ok(())
}

async fn run_models(target: &Target, json: bool) -> Result<(), String> {
    let client = connect(target).await?;
    let models = client.server_snapshot().models;
    client.close().await;
    if json {
        let list: Vec<serde_json::Value> = models
            .iter()
            .map(|m| {
                serde_json::json!({
                    "provider": m.provider,
                    "id": m.id,
                    "name": m.name,
                    "reasoning": m.reasoning,
                    "supportedThinkingLevels": m.supported_thinking_levels.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
                    "authenticated": m.authenticated,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(list));
        return Ok(());
    }
    let mut rows = vec![vec![
        "MODEL".into(),
        "NAME".into(),
        "REASONING".into(),
        "THINKING LEVELS".into(),
        "CREDENTIALS".into(),
    ]];
    for m in &models {
        rows.push(vec![
            format!("{}/{}", m.provider, m.id),
            m.name.clone(),
            if m.reasoning { "yes" } else { "no" }.into(),
            levels(&m.supported_thinking_levels),
            if m.authenticated { "yes" } else { "missing" }.into(),
        ]);
    }
    print_table(&rows);
    Ok(())
}

/// Prints rows in left-aligned columns; the last column is not padded.
fn print_table(rows: &[Vec<String>]) {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = std::io::stdout().lock();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Formats epoch milliseconds as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) fn format_utc(epoch_ms: u64) -> String {
    let secs = epoch_ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------
// Streaming replies

/// Reply text written to stdout as it arrives, remembering whether a line
/// is open. What is new is decided by the kernel's transcript follower.
#[derive(Debug)]
struct Stream {
    line_open: bool,
    /// The session followed, from the first snapshot written from.
    follower: Option<Follower>,
    /// `prompt` shows its own turn alone: replies streamed before its user
    /// message belong to another client's turn.
    own_only: bool,
    /// With `own_only`: our user message was seen.
    showing: bool,
    /// The assistant item whose text is being written.
    item: Option<String>,
    /// How many text updates were written (the demo reports it).
    deltas: usize,
    /// Ctrl-C was pressed while the prompt ran.
    interrupted: bool,
}

impl Stream {
    fn new() -> Self {
        Self {
            line_open: false,
            follower: None,
            own_only: false,
            showing: false,
            item: None,
            deltas: 0,
            interrupted: false,
        }
    }

    fn write(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        self.line_open = !text.ends_with('\n');
    }

    /// Ends the current line, if one is open.
    fn end_line(&mut self) {
        if self.line_open {
            self.write("\n");
        }
    }

    /// Follows `snapshot`'s session from here on: what it holds is shown.
    fn follow(&mut self, snapshot: &SessionSnapshot) {
        let mut follower = Follower::new(snapshot.id.clone());
        follower.resume(snapshot);
        self.follower = Some(follower);
    }

    /// Shows only the turn of `text`, which this client is about to send.
    fn expect_own(&mut self, text: &str) {
        if let Some(follower) = &mut self.follower {
            follower.expect_own(text);
        }
        self.own_only = true;
        self.showing = false;
    }

    /// Progress may have been lost: only snapshots are trusted until one.
    fn gap(&mut self) {
        if let Some(follower) = &mut self.follower {
            follower.gap();
        }
    }

    /// Writes the reply text `event` adds.
    fn on_event(&mut self, event: &ServerEvent) {
        let updates = match &mut self.follower {
            Some(follower) => follower.on_event(event),
            None => return,
        };
        self.show(updates);
    }

    /// The turn ended with `snapshot`: writes what the stream missed of it.
    fn finish(&mut self, snapshot: &SessionSnapshot) {
        let updates = match &mut self.follower {
            Some(follower) => follower.on_snapshot(snapshot),
            None => return,
        };
        self.show(updates);
        self.own_only = false;
    }

    fn show(&mut self, updates: Vec<Update>) {
        for update in updates {
            match update {
                Update::User { own: true, .. } => self.showing = true,
                Update::Text { item_id, delta } if self.showing || !self.own_only => {
                    if self.item.as_ref().is_some_and(|item| *item != item_id) {
                        self.end_line();
                    }
                    self.item = Some(item_id);
                    self.deltas += 1;
                    self.write(&delta);
                }
                _ => {}
            }
        }
    }
}

/// Sends a prompt and writes its reply's text deltas to `stream` until the
/// prompt's response arrives. With `sigint`, a first Ctrl-C aborts the turn
/// and a second gives up waiting.
async fn stream_prompt(
    client: &Client,
    session_id: &str,
    text: &str,
    stream: &mut Stream,
    mut sigint: Option<&mut Signal>,
) -> Result<SessionSnapshot, String> {
    let mut events = client.events();
    let mut events_open = true;
    let mut status = client.status();
    let mut status_open = true;
    let mut aborting = false;
    if stream.follower.is_none()
        && let Some(snapshot) = client.session_snapshot(session_id)
    {
        stream.follow(&snapshot);
    }
    stream.expect_own(text);
    let prompt = client.prompt(session_id, text);
    tokio::pin!(prompt);
    let outcome = loop {
        let interrupted = async {
            match sigint.as_mut() {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // First, so that no delta after a reconnection is written.
            biased;
            changed = status.changed(), if status_open => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        stream.gap();
                        // Stdout stays the reply alone: the notice goes to
                        // stderr, on a line of its own on a shared terminal.
                        let gap = if stream.line_open { "\n" } else { "" };
                        eprintln!("{gap}(lost the server: {reason}; reconnecting)");
                    }
                    Status::Ready { reconnected: true, .. } => eprintln!("(reconnected)"),
                    _ => {}
                },
                Err(_) => status_open = false,
            },
            outcome = &mut prompt => break outcome,
            event = events.recv(), if events_open => match event {
                Ok(event) => stream.on_event(&event),
                // A hole in the deltas: write only from snapshots until one.
                Err(broadcast::error::RecvError::Lagged(_)) => stream.gap(),
                Err(broadcast::error::RecvError::Closed) => events_open = false,
            },
            _ = interrupted => {
                stream.end_line();
                stream.interrupted = true;
                if aborting {
                    return Err("interrupted".into());
                }
                aborting = true;
                eprintln!("aborting the turn (Ctrl-C again to stop waiting)");
                if let Err(e) = client.abort(session_id).await {
                    eprintln!("cannot abort: {e}");
                }
            }
        }
    };
    // Events that arrived before the response may still be queued.
    while let Ok(event) = events.try_recv() {
        stream.on_event(&event);
    }
    let snapshot = outcome.map_err(|e| format!("the prompt failed: {e}"))?;
    stream.finish(&snapshot);
    stream.end_line();
    Ok(snapshot)
}

/// How a turn ended, from its final snapshot: `Ok(summary)` or `Err(problem)`.
fn turn_outcome(snapshot: &SessionSnapshot) -> Result<String, String> {
    let summary = format!(
        "revision {}, {} transcript items",
        snapshot.revision,
        snapshot.transcript.len()
    );
    // The turn starts at its (last) user message.
    let base = snapshot
        .transcript
        .iter()
        .rposition(|item| matches!(item, TranscriptItem::User(_)))
        .unwrap_or(0);
    match follow::turn_outcome(snapshot, base) {
        TurnOutcome::Completed => Ok(summary),
        TurnOutcome::MaxTokens => Ok(format!("{summary}; the reply was cut at the output limit")),
        TurnOutcome::Aborted { tool: None } => Err("the turn was aborted".into()),
        TurnOutcome::Aborted { tool: Some(tool) } => {
            Err(format!("the turn was aborted during the {tool} tool call"))
        }
        TurnOutcome::Failed { message } => Err(format!("the model reported an error: {message}")),
    }
}

// ---------------------------------------------------------------------------
// prompt

async fn run_prompt(target: &Target, query: &str, text: &str) -> Result<(), Failure> {
    let (client, id) = session_server(target, query).await?;
    let result = prompt_attached(&client, &id, text).await;
    let _ = client.detach(&id).await;
    client.close().await;
    result
}

/// Exits 130 when Ctrl-C stopped the turn, with the one message that says
/// how it ended (aborted, in a tool call or not).
async fn prompt_attached(client: &Client, id: &str, text: &str) -> Result<(), Failure> {
    client
        .attach(id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;
    let mut stream = Stream::new();
    let outcome = stream_prompt(client, id, text, &mut stream, Some(&mut sigint)).await;
    let outcome = outcome.and_then(|snapshot| turn_outcome(&snapshot).map(drop));
    match outcome {
        Err(message) if stream.interrupted => {
            eprintln!("pi-server: {message}");
            Err(Failure::interrupted())
        }
        other => other.map_err(Failure::from),
    }
}

async fn run_log(target: &Target, query: &str, json: bool) -> Result<(), String> {
    let (client, id) = session_server(target, query).await?;
    let attached = client.attach(&id).await;
    if attached.is_ok() {
        let _ = client.detach(&id).await;
    }
    client.close().await;
    let snapshot = attached.map_err(|e| format!("cannot read session {id}: {e}"))?;
    attach::print_log(&snapshot, json);
    Ok(())
}

// ---------------------------------------------------------------------------
// attach

async fn run_attach(
    target: &Target,
    query: &str,
    history: crate::tui::History,
    json: bool,
) -> Result<(), Failure> {
    let (client, id) = session_server(target, query).await?;
    let client = Arc::new(client);
    let id = id.as_str();
    let snapshot = client
        .attach(id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let result = if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() && !json {
        crate::tui::run(Arc::clone(&client), id, history)
            .await
            .map_err(Failure::from)
    } else {
        attach::run_lines(Arc::clone(&client), id, &snapshot, json).await
    };
    let _ = client.detach(id).await;
    if result.is_ok() {
        eprintln!("detached from session {id}");
    }
    if let Ok(client) = Arc::try_unwrap(client) {
        client.close().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(std::iter::once("pi-server").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        clap_command().debug_assert();
    }

    #[test]
    fn model_is_provider_slash_id() {
        let model = parse_model("faux/faux-1").unwrap();
        assert_eq!(
            (model.provider.as_str(), model.id.as_str()),
            ("faux", "faux-1")
        );
        let nested = parse_model("openrouter/anthropic/claude").unwrap();
        assert_eq!(nested.id, "anthropic/claude");
        for bad in ["faux", "/x", "x/", ""] {
            assert!(parse_model(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn create_flags_parse() {
        let cli = parse(&[
            "create",
            "--model",
            "faux/faux-reasoner",
            "--thinking",
            "high",
            "--name",
            "n",
        ])
        .unwrap();
        let Commands::Create(args) = cli.command else {
            panic!("not create")
        };
        assert_eq!(args.model.unwrap().id, "faux-reasoner");
        assert_eq!(args.thinking, Some(ThinkingLevel::High));
        assert_eq!(args.name.as_deref(), Some("n"));

        let error = parse(&["create", "--model", "nomodel"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("PROVIDER/MODEL"), "{error}");
        let error = parse(&["create", "--thinking", "extreme"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown thinking level"), "{error}");
    }

    #[test]
    fn global_model_is_distinct_from_create_model() {
        let cli = parse(&[
            "--model",
            "faux/faux-reasoner",
            "create",
            "--model",
            "faux/faux-1",
        ])
        .unwrap();
        assert_eq!(cli.default_model.unwrap().id, "faux-reasoner");
        let Commands::Create(args) = cli.command else {
            panic!("not create")
        };
        assert_eq!(args.model.unwrap().id, "faux-1");
        assert!(parse(&["list", "--model", "faux/faux-1"]).is_err());
        assert!(parse(&["--model", "faux", "list"]).is_err());
    }

    /// The long help of `pi-server <sub>`.
    fn help_of(sub: &str) -> String {
        let error = parse(&[sub, "--help"]).expect_err("help is an early exit");
        assert_eq!(error.kind(), clap::error::ErrorKind::DisplayHelp);
        error.to_string()
    }

    #[test]
    fn each_command_documents_only_the_options_it_takes() {
        let serve = help_of("serve");
        assert!(!serve.contains("--connect <"), "{serve}");
        assert!(serve.contains("--listen <") && serve.contains("--token-file <"));
        for client in [
            "list", "create", "prompt", "attach", "log", "rm", "models", "acp",
        ] {
            let help = help_of(client);
            assert!(help.contains("--connect <"), "{client}: {help}");
            assert!(!help.contains("--listen <"), "{client}: {help}");
            assert!(!help.contains("--idle-exit-ms <"), "{client}: {help}");
        }
        for standalone in ["demo", "completions"] {
            let help = help_of(standalone);
            assert!(!help.contains("--server-dir <"), "{standalone}: {help}");
            assert!(!help.contains("--connect <"), "{standalone}: {help}");
        }
        // Hidden is still accepted where it means something, and refused
        // where it does not.
        assert!(parse(&["serve", "--server-dir", "/tmp/x"]).is_ok());
    }

    #[test]
    fn connect_url_is_an_absolute_unix_path_or_a_tcp_address() {
        let unix = |path: &str| Address::Unix(PathBuf::from(path));
        assert_eq!(
            parse_connect("unix:///tmp/a.sock").unwrap(),
            unix("/tmp/a.sock")
        );
        assert_eq!(
            parse_connect("unix:///tmp/a%20b.sock").unwrap(),
            unix("/tmp/a b.sock")
        );
        assert_eq!(
            parse_connect("tcp://127.0.0.1:7447").unwrap(),
            Address::Tcp("127.0.0.1:7447".into())
        );
        for bad in [
            "/tmp/a.sock",
            "unix://tmp/a.sock",
            "unix://",
            "unix:///",
            "tcp://x",
            "tcp://:1",
            "tcp://x:port",
            "unix:///a%zz",
        ] {
            assert!(parse_connect(bad).is_err(), "{bad:?}");
        }
        let cli = parse(&["list", "--connect", "unix:///run/pi.sock"]).unwrap();
        assert_eq!(cli.global.connect, Some(unix("/run/pi.sock")));
        assert!(parse(&["--connect", "http://x", "list"]).is_err());
    }

    #[test]
    fn prompt_joins_words_and_rejects_empty_ids() {
        let cli = parse(&["prompt", "abc", "hello", "there"]).unwrap();
        let Commands::Prompt { id, text } = cli.command else {
            panic!("not prompt")
        };
        assert_eq!(
            (id.as_str(), text.join(" ").as_str()),
            ("abc", "hello there")
        );
        assert!(parse(&["prompt", "", "x"]).is_err());
        assert!(parse(&["prompt", "abc"]).is_err());
    }

    #[test]
    fn serve_accepts_token_file_and_hidden_idle_exit() {
        let cli = parse(&["serve", "--token-file", "/t", "--idle-exit-ms", "250"]).unwrap();
        let Commands::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.idle_exit_ms, Some(250));
        assert_eq!(cli.global.token_file, Some(PathBuf::from("/t")));
    }

    #[test]
    fn model_check_names_the_alternatives() {
        let models = kernel::faux::models();
        let reasoner = parse_model("faux/faux-reasoner").unwrap();
        assert!(check_model(&models, &reasoner, Some(ThinkingLevel::High)).is_ok());
        let error = check_model(&models, &reasoner, Some(ThinkingLevel::Max)).unwrap_err();
        assert!(error.contains("does not support"), "{error}");
        let error = check_model(&models, &parse_model("x/y").unwrap(), None).unwrap_err();
        assert!(error.contains("faux/faux-1"), "{error}");
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(format_utc(1_787_400_000_123), "2026-08-22 12:00:00");
    }
}
