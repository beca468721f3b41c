//! The command line's grammar: every command and option as clap parses
//! and documents it, and the parsers of the values it takes.

use clap::{Args, Parser, Subcommand};
use kernel::approval::ApprovalPolicy;
use kernel::protocol::{ModelRef, ThinkingLevel};
use pi_client::Address;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// A durable multi-client server for coding-agent sessions (pi protocol v1).
///
/// Client commands (all but serve, completions and demo) talk to the server
/// of the selected server directory and id, and start one in the background
/// when none is running. Several servers (different ids) may share a server
/// directory: `list` shows the sessions of all of them, and the commands
/// taking a session find the server holding it. Run `pi-server demo` for a
/// tour.
#[derive(Debug, Parser)]
#[command(name = "pi-server", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub(super) global: GlobalArgs,

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
    pub(super) default_model: Option<ModelRef>,

    #[command(subcommand)]
    pub(super) command: Commands,
}

/// Options every command accepts.
#[derive(Debug, Args)]
pub(super) struct GlobalArgs {
    /// Directory of server sockets, ids and logs [default: $PI_SERVER_DIR, else ~/.pi/server]
    #[arg(long, global = true, value_name = "DIR")]
    pub(super) server_dir: Option<PathBuf>,

    /// Logical server id, a lowercase UUIDv4; when given (or set in $PI_SERVER_ID), `list`,
    /// `prompt`, `attach` and `rm` use this server alone instead of every server in the
    /// server dir [default: $PI_SERVER_ID, else <DIR>/default-server-id]
    #[arg(long, global = true, value_name = "UUID")]
    pub(super) server_id: Option<String>,

    /// Where sessions are stored [default: $PI_CODING_AGENT_DIR/sessions, else ~/.pi/agent/sessions]
    #[arg(long, global = true, value_name = "DIR")]
    pub(super) session_dir: Option<PathBuf>,

    /// Use the server at this address alone and never start one: its socket, or
    /// the `serve --listen` address, which needs --token-file
    #[arg(long, global = true, value_name = "unix:///PATH|tcp://HOST:PORT", value_parser = parse_connect)]
    pub(super) connect: Option<Address>,

    /// File holding a shared secret [clients' default: $PI_SERVER_TOKEN_FILE]: clients send it
    /// in hello; `serve` requires it of remote clients, and of local ones only without --listen.
    /// For a network listener it must be private (chmod 600) and of 128 bits or more
    #[arg(long, global = true, value_name = "FILE")]
    pub(super) token_file: Option<PathBuf>,
}

impl GlobalArgs {
    pub(super) fn any(&self) -> bool {
        self.server_dir.is_some()
            || self.server_id.is_some()
            || self.session_dir.is_some()
            || self.connect.is_some()
            || self.token_file.is_some()
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum Commands {
    /// Run a server in the foreground until SIGINT or SIGTERM.
    ///
    /// It listens at <server-dir>/<server-id>.sock (mode 0600) and stores
    /// sessions in the session directory. With --token-file, clients must
    /// send that token in their hello.
    Serve(ServeArgs),

    /// Internal: run one session worker (started by the server).
    #[command(hide = true)]
    Worker,

    /// List the sessions of every server running in the server dir: a short
    /// id (usable wherever a session is named), name, status, attached
    /// clients, model, last activity and working directory.
    ///
    /// Newest activity first; --wide adds the server and creation time and
    /// shows ids and times (UTC) in full. STATUS is what a live session is doing
    /// (opening, idle, turn, compaction, retry, error: its last reply failed,
    /// closing) or `stored` when no worker runs it. The model and thinking
    /// level are the server's report (`-` from a server too old to say).
    /// When no server runs, the default one is started. With --server-id or
    /// --connect, that server only.
    List {
        /// Only sessions whose id starts with TEXT, or whose name or
        /// working directory holds it (ignoring case).
        #[arg(value_name = "TEXT")]
        filter: Option<String>,
        /// Only sessions working in DIR.
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Every column in full: server, whole ids, UTC times.
        #[arg(short, long, conflicts_with_all = ["json", "quiet"])]
        wide: bool,
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
    Create {
        #[command(flatten)]
        args: CreateArgs,
        /// Print the new session as a JSON object (id, name, cwd, model,
        /// thinkingLevel) instead of its id.
        #[arg(long)]
        json: bool,
    },

    /// Send one prompt to a session and stream the reply to stdout.
    ///
    /// Exits 0 when the turn completes; non-zero when the server refuses the
    /// prompt (for example `busy` during another turn) or the reply ends in
    /// an error. Ctrl-C aborts the turn.
    Prompt {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`);
        /// none with --last.
        #[arg(required_unless_present = "last", value_name = "ID")]
        id: Option<String>,
        /// The prompt; several words are joined with spaces. `-` alone reads
        /// the prompt from standard input.
        #[arg(num_args = 0.., value_name = "TEXT")]
        text: Vec<String>,
        /// The most recently active session of the working directory.
        #[arg(short = 'c', long)]
        last: bool,
        /// An image (PNG, JPEG, GIF or WebP) to send with the prompt, to a
        /// model that takes images; repeat for more.
        #[arg(long = "image", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
        images: Vec<std::path::PathBuf>,
        /// The reply alone: no tool calls or thinking on stderr.
        #[arg(short, long)]
        quiet: bool,
        /// One JSON object a line on stdout for each event of the turn
        /// (text, thinking, tool calls and results, notices), then its end.
        #[arg(long)]
        json: bool,
    },

    /// Create a session, send it one prompt, stream the reply, and exit (as
    /// `codex exec` and `claude -p`); the session stays for `prompt --last`.
    ///
    /// Tool calls and thinking go to stderr (--quiet: the reply alone), and
    /// the session's id at the end. Exits as `prompt` does.
    Exec {
        #[command(flatten)]
        create: CreateArgs,
        /// An image (PNG, JPEG, GIF or WebP) to send with the prompt; repeat
        /// for more.
        #[arg(long = "image", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
        images: Vec<std::path::PathBuf>,
        /// The reply alone: no tool calls, thinking or session id on stderr.
        #[arg(short, long)]
        quiet: bool,
        /// One JSON object a line on stdout: the new session, each event of
        /// the turn (text, thinking, tool calls and results, notices), its end.
        #[arg(long)]
        json: bool,
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
        #[arg(value_parser = parse_non_empty, required_unless_present = "last", value_name = "ID")]
        id: Option<String>,
        /// The most recently active session of the working directory.
        #[arg(short = 'c', long, conflicts_with = "id")]
        last: bool,
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

    /// Send a steering message into a session's running turn: the model
    /// reads it before its next step.
    ///
    /// Refused when no turn runs (start one with `prompt`).
    Steer {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// The message; several words are joined with spaces. `-` alone
        /// reads it from standard input.
        #[arg(required = true, num_args = 1.., value_name = "TEXT")]
        text: Vec<String>,
    },

    /// Abort a session's running turn: what the reply had so far is kept,
    /// marked aborted.
    ///
    /// Refused when no turn runs.
    Abort {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
    },

    /// Summarise a session's older conversation now, as a full context
    /// would: its next turns send the model the summary and what followed.
    ///
    /// Between turns only; every item stays in the session.
    Compact {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// What the summary should keep or stress (the words are joined).
        instructions: Vec<String>,
    },

    /// Switch a session's model for its next turns (see `pi-server models`).
    ///
    /// Refused while a turn runs.
    SetModel {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// The model, as PROVIDER/MODEL.
        #[arg(value_name = "PROVIDER/MODEL", value_parser = parse_model)]
        model: ModelRef,
    },

    /// Set a session's thinking level for its next turns.
    ///
    /// Refused while a turn runs, and for a level the session's model does
    /// not offer (`pi-server models` lists each model's levels).
    SetThinking {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// off, minimal, low, medium, high, xhigh or max.
        #[arg(value_name = "LEVEL", value_parser = parse_thinking)]
        level: ThinkingLevel,
    },

    /// Rename a session. Names are unique among a server's sessions: a
    /// name another session has is refused, naming that session.
    Rename {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// The new name: one line, at most 128 characters.
        #[arg(value_parser = parse_non_empty)]
        name: String,
    },

    /// Answer the question a session asks before a tool call runs (its
    /// approval policy is `ask`): allow it, allow the tool from now on
    /// (--always), or deny it (--deny; the model is told).
    ///
    /// Over protocol v8 only (the Unix socket without a token).
    Approve {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// Allow this tool for the rest of the session.
        #[arg(long, conflicts_with = "deny")]
        always: bool,
        /// Do not run the call.
        #[arg(long)]
        deny: bool,
        /// Wait for a question if none waits yet.
        #[arg(long)]
        wait: bool,
    },

    /// Show a session's approval policy and the question waiting, or set
    /// the policy: auto (every tool runs), ask (tools that write, run
    /// commands or come from MCP servers wait for `approve`), read-only
    /// (only read, grep, find and ls are offered).
    ///
    /// The default comes from "approvals" in settings.json. Over protocol
    /// v8 only (the Unix socket without a token).
    Approvals {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        id: String,
        /// auto, ask or read-only.
        #[arg(value_name = "POLICY", value_parser = parse_policy)]
        policy: Option<ApprovalPolicy>,
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

    /// MCP servers: their tools are offered to a session's model beside the
    /// built-in ones, as mcp__<server>__<tool>.
    ///
    /// Configure them in "mcpServers" of <agent-dir>/settings.json or of a
    /// session's own settings.json, as {"name": {"command", "args", "env"}}
    /// (stdio, started in the session's cwd) or {"name": {"type": "http",
    /// "url", "headers"}} (Streamable HTTP); an editor's servers (ACP) are
    /// remembered with its session. Later layers win by name.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
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
pub(super) struct ServeArgs {
    /// Also accept remote clients: `tcp://HOST:PORT` for pi protocol over
    /// TCP, `http://HOST:PORT` for the web client and its WebSocket (at
    /// most one of each). Requires `--token-file`: remote clients must send
    /// the token in hello.
    #[arg(long, value_name = "tcp://HOST:PORT|http://HOST:PORT", value_parser = parse_serve_listen)]
    pub(super) listen: Vec<Listen>,

    /// Also accept this `Host` header on the web listener (`name:port`, or
    /// just `name` behind a proxy on the default port). The listener's own
    /// address, and `localhost` on a loopback one, are always accepted.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(super) allow_host: Vec<String>,

    /// Also accept WebSocket connections from pages of this origin
    /// (`https://example.com`); the served page's own origin always is.
    #[arg(long, value_name = "ORIGIN")]
    pub(super) allow_origin: Vec<String>,

    /// Believe `X-Forwarded-Proto`, `-Host` and `-For` from this proxy's
    /// address (a TLS-terminating reverse proxy in front of the web listener).
    #[arg(long, value_name = "IP")]
    pub(super) trusted_proxy: Vec<std::net::IpAddr>,

    /// Internal (cold activation): retire this long after the last client
    /// left and no worker is busy.
    #[arg(long, hide = true, value_name = "MS")]
    pub(super) idle_exit_ms: Option<u64>,
}

/// A `serve --listen` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Listen {
    /// `tcp://HOST:PORT`: pi protocol over TCP.
    Tcp(String),
    /// `http://HOST:PORT`: the web client and its WebSocket.
    Web(String),
}

fn parse_serve_listen(s: &str) -> Result<Listen, String> {
    if let Some(rest) = s.strip_prefix("http://") {
        return parse_listen(&format!("tcp://{rest}"))
            .map(Listen::Web)
            .map_err(|_| format!("expected http://HOST:PORT, got {s:?}"));
    }
    if s.starts_with("https://") {
        return Err(format!(
            "{s:?}: the web listener speaks plain HTTP; put a TLS proxy in front of it (see the README) and pass --trusted-proxy"
        ));
    }
    parse_listen(s)
        .map(Listen::Tcp)
        .map_err(|_| format!("expected tcp://HOST:PORT or http://HOST:PORT, got {s:?}"))
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
pub(super) struct CreateArgs {
    /// Working directory of the session [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub(super) cwd: Option<PathBuf>,

    /// Display name.
    #[arg(long, value_name = "NAME")]
    pub(super) name: Option<String>,

    /// Model to start with, as PROVIDER/MODEL (see `pi-server models`).
    #[arg(long, value_name = "PROVIDER/MODEL", value_parser = parse_model)]
    pub(super) model: Option<ModelRef>,

    /// Thinking level: off, minimal, low, medium, high, xhigh or max.
    #[arg(long, value_name = "LEVEL", value_parser = parse_thinking)]
    pub(super) thinking: Option<ThinkingLevel>,
}

/// The command line as parsed and documented. Global options show in the
/// help of the commands they mean something to: `--connect` is a client
/// option, so `serve`'s help leaves it out, and the tour (`demo`, which
/// makes its own throwaway server) and `completions` use none of them.
pub(super) fn clap_command() -> clap::Command {
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

/// The completion script for `shell`: the commands and options a user may
/// type, so neither the internal `worker` nor any hidden option, with the
/// global options on the commands that take them.
pub(super) fn completions(shell: clap_complete::Shell) -> String {
    let full = clap_command();
    let globals: Vec<clap::Arg> = full
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.clone().global(false))
        .collect();
    let shown = |arg: &&clap::Arg| !arg.is_hide_set();
    let mut root = clap::Command::new(full.get_name().to_owned())
        .version(full.get_version().map(str::to_owned).unwrap_or_default())
        .about(full.get_about().cloned().unwrap_or_default())
        .args(
            full.get_arguments()
                .filter(shown)
                .map(|a| a.clone().global(false)),
        );
    for sub in full.get_subcommands().filter(|s| !s.is_hide_set()) {
        // A command that refuses the global options holds hidden copies
        // of them (`clap_command`): it gets none.
        let refuses = |global: &clap::Arg| {
            sub.get_arguments()
                .any(|a| a.get_id() == global.get_id() && a.is_hide_set())
        };
        let mut copy = clap::Command::new(sub.get_name().to_owned())
            .about(sub.get_about().cloned().unwrap_or_default())
            .args(sub.get_arguments().filter(shown).cloned());
        for global in globals.iter().filter(|g| !refuses(g)) {
            copy = copy.arg(global.clone());
        }
        root = root.subcommand(copy);
    }
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut root, "pi-server", &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        // clap_complete spells a hyphenated name's states one way where it
        // sets them and another where it matches them, so no subcommand's
        // options ever complete (clap-rs/clap#6421, open): match as set.
        clap_complete::Shell::Bash => script.replace("pi__subcmd__server", "pi__server"),
        _ => script,
    }
}

pub(super) fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = clap_command().try_get_matches_from(args)?;
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
}

// ---------------------------------------------------------------------------
// Values

/// The prompt's words joined, or standard input for a lone `-`.
pub(super) fn prompt_text(words: &[String]) -> Result<String, String> {
    if words != ["-"] {
        let text = words.join(" ");
        if text.trim().is_empty() {
            return Err(
                "the prompt is empty: give its text, or `-` to read it from standard input".into(),
            );
        }
        return Ok(text);
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
pub(super) fn parse_connect(address: &str) -> Result<Address, String> {
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
pub(super) fn parse_model(text: &str) -> Result<ModelRef, String> {
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

fn parse_policy(text: &str) -> Result<ApprovalPolicy, String> {
    ApprovalPolicy::parse(text)
        .ok_or_else(|| format!("unknown policy; expected {}", ApprovalPolicy::NAMES))
}

fn parse_non_empty(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(text.to_owned())
    }
}

pub(super) fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("cannot resolve {}: {e}", path.display()))
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
        let Commands::Create { args, .. } = cli.command else {
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
        let Commands::Create { args, .. } = cli.command else {
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
    fn prompt_joins_words_and_takes_the_last_session() {
        let cli = parse(&["prompt", "abc", "hello", "there"]).unwrap();
        let Commands::Prompt { id, text, last, .. } = cli.command else {
            panic!("not prompt")
        };
        assert_eq!(
            (id.as_deref(), text.join(" ").as_str(), last),
            (Some("abc"), "hello there", false)
        );
        assert!(parse(&["prompt"]).is_err(), "an id or --last");
        let cli = parse(&["prompt", "-c", "hello", "there"]).unwrap();
        let Commands::Prompt { id, text, last, .. } = cli.command else {
            panic!("not prompt")
        };
        assert_eq!(
            (id.as_deref(), text, last),
            (Some("hello"), vec!["there".to_owned()], true)
        );
        assert!(prompt_text(&["".to_owned()]).is_err(), "an empty prompt");
        assert!(prompt_text(&[" ".to_owned(), "".to_owned()]).is_err());
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
}

/// `pi-server mcp ...`
#[derive(Debug, Subcommand)]
pub(super) enum McpCommand {
    /// Show MCP servers, their state and their tools. With a session, its
    /// servers as its worker runs them (starting them if it is not live);
    /// without, the servers <agent-dir>/settings.json configures.
    List {
        /// Session id, a unique prefix of one, or a session name (see `pi-server list`).
        #[arg(value_parser = parse_non_empty)]
        session: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}
