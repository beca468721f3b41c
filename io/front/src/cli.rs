//! The `pi-server` command line: the server (`serve`), its internal worker
//! (`worker`), and client commands that talk pi protocol v1 to a server
//! through [`pi_client::Client`].
//!
//! Client commands reach a server as [`activate`] describes: the server
//! `<serverDir>/<serverId>.sock` (see [`pi_config`]) or the socket
//! `--connect` names, started in the background when none answers ("cold
//! activation") and replaced when it speaks another protocol version.
//! Several servers (different ids) may share a server dir: `list` shows the
//! sessions of all of them, and commands taking a session id find the
//! server that holds it ([`discover`]).
//!
//! The grammar is [`args`]; the commands that run once and print are
//! [`commands`]; `prompt`'s streamed reply is [`stream`]; `attach` without
//! a terminal is [`attach`] (with one, [`crate::tui`]); the tour is [`demo`].

/// `println!` through [`print`]: quiet on a closed pipe.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::print_line(format_args!($($arg)*))
    };
}

mod activate;
mod approve;
mod args;
mod attach;
mod commands;
mod demo;
mod discover;
mod stream;

pub use self::args::Cli;
pub use kernel::time::format_utc;

use self::activate::{MODEL_ONLY_AT_ACTIVATION, client_target};
use self::args::{Commands, McpCommand, parse_from, prompt_text};
use self::commands::{
    Control, run_attach, run_control, run_create, run_list, run_log, run_mcp_list, run_models,
    run_rm, run_serve,
};
use self::stream::{Which, run_prompt};
use crate::limits::SHUTDOWN_WAIT;
use pi_config as config;
use std::io::IsTerminal;
use std::process::ExitCode;

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

/// What the daemon runs, handed in by the binary: the front ends are client
/// side only and do not link it.
#[derive(Debug, Clone, Copy)]
pub struct Daemon {
    /// `serve`: the server loop, until it stops.
    pub serve: fn(pi_config::ServeOptions) -> Running,
    /// The hidden `worker`: one session's worker process.
    pub worker: fn() -> Running,
}

/// A daemon's run, to its end.
pub type Running = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>>;

/// Runs the command line and returns the process exit code.
pub fn main(daemon: Daemon) -> ExitCode {
    let cli = parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    // The server and the worker are each one loop task (blocking work goes to
    // `spawn_blocking`): a current-thread runtime saves a thread hop per
    // request (BENCHMARKS.md, item 1: context switches per `list` 5.1 → 2.0).
    let single_loop = matches!(cli.command, Commands::Serve(_) | Commands::Worker);
    if single_loop {
        run_with_fixed_mmap_threshold();
    }
    init_tracing(&cli.command);
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
    let result = runtime.block_on(run(daemon, cli));
    // Do not wait for a blocking read of stdin (attach) to finish.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
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

/// Writes `text` to standard output and flushes it. A reader that closed
/// the pipe (`pi-server list | head -1`) ends the command at once and
/// quietly, with the status of a process killed by `SIGPIPE` (141), as
/// `cat` and `git` end; any other write error ends it with a message.
pub(crate) fn print(text: &str) {
    use std::io::Write;
    if text.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        Err(e) => {
            eprintln!("pi-server: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// [`print`] with a newline.
pub(crate) fn print_line(text: impl std::fmt::Display) {
    print(&format!("{text}\n"));
}

/// glibc's environment variable that fixes its mmap threshold.
pub const MMAP_THRESHOLD_VAR: &str = "MALLOC_MMAP_THRESHOLD_";

/// Runs this process again, once, with glibc's mmap threshold fixed at its
/// default of 128 KiB, unless the environment already tunes glibc's malloc.
///
/// glibc raises the threshold to the size of each large buffer it frees, so
/// later buffers of that size come from the heap, and their pages stay when
/// they are freed: a long-lived server's memory then keeps the high-water
/// mark of the largest frames it ever passed on (a session snapshot of
/// megabytes, several times a turn; BENCHMARKS.md, the soak). A fixed
/// threshold keeps every large buffer mapped on its own and returned when
/// freed. glibc reads it only from the environment at start (setting it
/// later needs `mallopt`, which is `unsafe`), hence the `exec`; workers
/// inherit the environment. If the `exec` fails, the process goes on as it
/// is.
fn run_with_fixed_mmap_threshold() {
    use std::os::unix::process::CommandExt;
    let tuned = |var: &str| std::env::var_os(var).is_some();
    if !cfg!(all(target_os = "linux", target_env = "gnu"))
        || tuned(MMAP_THRESHOLD_VAR)
        || tuned("GLIBC_TUNABLES")
    {
        return;
    }
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| "pi-server".into());
    let error = std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .env(MMAP_THRESHOLD_VAR, "131072")
        .exec();
    eprintln!("pi-server: cannot fix the allocator's mmap threshold ({error}); going on without");
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

async fn run(daemon: Daemon, cli: Cli) -> Result<(), Failure> {
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
        Commands::Serve(args) => run_serve(&daemon, global, args).await,
        Commands::Worker => (daemon.worker)().await,
        Commands::Demo => demo::run_demo().await,
        Commands::List {
            filter,
            cwd,
            wide,
            json,
            quiet,
        } => {
            let cwd = cwd.as_deref().map(args::absolute).transpose()?;
            let listing = commands::Listing {
                filter,
                cwd: cwd.map(|c| c.to_string_lossy().into_owned()),
                wide,
                json,
                quiet,
            };
            run_list(&target()?, &listing).await
        }
        Commands::Completions { shell } => {
            print(&args::completions(shell));
            Ok(())
        }
        Commands::Create { args, json } => run_create(&target()?, args, json).await,
        Commands::Prompt {
            id,
            text,
            last,
            images,
            quiet,
            json,
        } => {
            // With --last every word is the prompt's.
            let (which, words) = match (last, id) {
                (true, id) => (Which::Last, id.into_iter().chain(text).collect()),
                (false, Some(id)) if id.trim().is_empty() => {
                    return Err(Failure::from("the session id is empty".to_owned()));
                }
                (false, Some(id)) => (Which::Query(id), text),
                (false, None) => unreachable!("clap requires an id without --last"),
            };
            if words.is_empty() {
                return Err(Failure::from(
                    "the prompt's text is missing: `pi-server prompt ID TEXT`".to_owned(),
                ));
            }
            let text = prompt_text(&words)?;
            let images = stream::read_images(&images)?;
            let shown = stream::Shown::of(quiet, json);
            return run_prompt(&target()?, &which, &text, &images, shown).await;
        }
        Commands::Exec {
            create,
            images,
            quiet,
            json,
            text,
        } => {
            let text = prompt_text(&text)?;
            let images = stream::read_images(&images)?;
            let params = commands::create_params(create)?;
            let shown = stream::Shown::of(quiet, json);
            return stream::run_exec(&target()?, params, &text, &images, shown).await;
        }
        Commands::Attach {
            id,
            last,
            history,
            json,
        } => {
            let which = match id {
                Some(id) if !last => Which::Query(id),
                _ => Which::Last,
            };
            return run_attach(&target()?, &which, history, json).await;
        }
        Commands::Log { id, json } => run_log(&target()?, &id, json).await,
        Commands::Rm { id } => run_rm(&target()?, &id).await,
        Commands::Steer { id, text } => {
            let text = prompt_text(&text)?;
            run_control(&target()?, &id, Control::Steer(text)).await
        }
        Commands::Rename { id, name } => run_control(&target()?, &id, Control::Rename(name)).await,
        Commands::Abort { id } => run_control(&target()?, &id, Control::Abort).await,
        Commands::Compact { id, instructions } => {
            let instructions = (!instructions.is_empty()).then(|| instructions.join(" "));
            run_control(&target()?, &id, Control::Compact(instructions)).await
        }
        Commands::SetModel { id, model } => {
            run_control(&target()?, &id, Control::SetModel(model)).await
        }
        Commands::SetThinking { id, level } => {
            run_control(&target()?, &id, Control::SetThinking(level)).await
        }
        Commands::Approve {
            id,
            always,
            deny,
            wait,
        } => {
            let decision = match (always, deny) {
                (true, _) => kernel::approval::Decision::Always,
                (_, true) => kernel::approval::Decision::Deny,
                _ => kernel::approval::Decision::Allow,
            };
            approve::run_approve(&target()?, &id, decision, wait).await
        }
        Commands::Approvals { id, policy } => approve::run_approvals(&target()?, &id, policy).await,
        Commands::Models { json } => run_models(&target()?, json).await,
        Commands::Mcp {
            command: McpCommand::List { session, json },
        } => run_mcp_list(&target()?, session.as_deref(), json).await,
        Commands::Acp => crate::acp::run(activate::connect(&target()?).await?).await,
    };
    result.map_err(Failure::from)
}
