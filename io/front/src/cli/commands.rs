//! The commands that run once and print: `serve`, `list`, `create`, `rm`,
//! `models`, `log`, and `attach`'s entry (the terminal UI or line mode).

use super::Failure;
use super::activate::{Target, connect};
use super::args::{CreateArgs, GlobalArgs, Listen, ServeArgs, absolute};
use super::attach;
use super::discover::{Found, close_all, servers, session_server};
use crate::limits::{MCP_START_WAIT, MCP_STATUS_POLL};
use kernel::client::lookup;
use kernel::protocol::{
    CreateParams, LiveStatus, ModelMetadata, ModelRef, SessionMetadata, SessionSnapshot,
    ThinkingLevel,
};
use kernel::time::format_utc;
use pi_config as config;
use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

// ---------------------------------------------------------------------------
// serve

pub(super) async fn run_serve(
    daemon: &super::Daemon,
    global: GlobalArgs,
    args: ServeArgs,
) -> Result<(), String> {
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
    let mut listen_tcp = None;
    let mut listen_web = None;
    for listen in &args.listen {
        let (slot, address, scheme) = match listen {
            Listen::Tcp(a) => (&mut listen_tcp, a, "tcp"),
            Listen::Web(a) => (&mut listen_web, a, "http"),
        };
        if slot.replace(address.clone()).is_some() {
            return Err(format!("--listen {scheme}://… may be given once"));
        }
    }
    if (listen_tcp.is_some() || listen_web.is_some())
        && let (Some(token), Some(file)) = (&token, &global.token_file)
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file)
            .map_err(|e| format!("cannot read token file {}: {e}", file.display()))?
            .permissions()
            .mode();
        if let Some(problem) = kernel::server::network_token_problem(token, mode) {
            return Err(format!(
                "--token-file {} cannot guard a network listener: {problem}",
                file.display()
            ));
        }
    }
    if listen_web.is_none()
        && !(args.allow_host.is_empty()
            && args.allow_origin.is_empty()
            && args.trusted_proxy.is_empty())
    {
        return Err(
            "--allow-host, --allow-origin and --trusted-proxy are for the web listener: add --listen http://HOST:PORT".into(),
        );
    }
    let options = pi_config::ServeOptions {
        server_dir,
        server_id,
        session_dir,
        token,
        idle_exit: args.idle_exit_ms.map(Duration::from_millis),
        listen_tcp,
        listen_web,
        web_access: pi_config::WebAccess {
            hosts: args.allow_host.clone(),
            origins: args.allow_origin.clone(),
            proxies: args.trusted_proxy.clone(),
        },
    };
    (daemon.serve)(options).await
}

// ---------------------------------------------------------------------------
// list, create, rm, models, log

/// Sessions of every discovered server (or of the chosen one), as
/// `(server id, session)` pairs sorted by server id, then session id.
/// What `list` shows, and how.
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub(super) filter: Option<String>,
    pub(super) cwd: Option<String>,
    pub(super) wide: bool,
    pub(super) json: bool,
    pub(super) quiet: bool,
}

/// The sessions of the servers found, with what their `status` says.
struct Listed {
    /// `(server id, session)`, filtered, newest activity first.
    pairs: Vec<(String, SessionMetadata)>,
    live: BTreeMap<(String, String), LiveStatus>,
    /// Servers that answered `status`.
    known: BTreeSet<String>,
}

impl Listed {
    /// Asks every server found for its sessions and their status.
    async fn gather(target: &Target) -> Result<Self, String> {
        let found = servers(target).await?;
        let mut listed = Listed {
            pairs: Vec::new(),
            live: BTreeMap::new(),
            known: BTreeSet::new(),
        };
        let mut failed = None;
        for Found { server_id, client } in &found {
            match client.list().await {
                Ok(sessions) => {
                    let pairs = sessions.into_iter().map(|s| (server_id.clone(), s));
                    listed.pairs.extend(pairs)
                }
                Err(e) => {
                    failed = Some(format!(
                        "cannot list the sessions of server {server_id}: {e}"
                    ));
                    break;
                }
            }
            // A server from before `status` closes the connection on it: its
            // sessions' state is then unknown (`-`), which is no failure.
            match client.session_status().await {
                Ok(statuses) => {
                    listed.known.insert(server_id.clone());
                    let keyed = statuses
                        .into_iter()
                        .map(|s| ((server_id.clone(), s.session_id.clone()), s));
                    listed.live.extend(keyed);
                }
                Err(e) => tracing::debug!(%server_id, error = %e, "no session status"),
            }
        }
        close_all(found).await;
        match failed {
            Some(problem) => Err(problem),
            None => Ok(listed),
        }
    }

    /// Keeps what `listing` asks for, newest activity first.
    fn select(&mut self, listing: &Listing) {
        let mut pairs = std::mem::take(&mut self.pairs);
        pairs.retain(|(server_id, s)| {
            let cwd = listing.cwd.as_ref();
            let preview = self.preview(server_id, &s.id);
            cwd.is_none_or(|cwd| s.cwd.as_ref() == Some(cwd))
                && (listing.filter.as_deref()).is_none_or(|text| lookup::listed(s, preview, text))
        });
        self.pairs = pairs;
        self.pairs.sort_by(|a, b| {
            last(&b.1)
                .cmp(&last(&a.1))
                .then_with(|| (&a.0, &a.1.id).cmp(&(&b.0, &b.1.id)))
        });
    }

    /// What the server's `status` says of a session, if anything.
    fn status(&self, server_id: &str, id: &str) -> Option<&LiveStatus> {
        self.live.get(&(server_id.to_owned(), id.to_owned()))
    }

    /// A session's first prompt, as the server previews it.
    fn preview(&self, server_id: &str, id: &str) -> Option<&str> {
        self.status(server_id, id)?.preview.as_deref()
    }

    /// A session's state and attached clients. A listed session that is not
    /// live has no worker: nothing runs in it.
    fn state(&self, server_id: &str, id: &str) -> (&str, Option<u64>) {
        match self.status(server_id, id) {
            Some(s) => (s.state.as_str(), Some(s.clients)),
            None if self.known.contains(server_id) => ("stored", Some(0)),
            None => ("-", None),
        }
    }

    /// Its model, as the server reports it (a server from before `status`
    /// reported models says nothing of it).
    fn model(&self, server_id: &str, id: &str) -> Option<(ModelRef, ThinkingLevel)> {
        let s = self.status(server_id, id)?;
        Some((s.model.clone()?, s.thinking_level?))
    }

    /// How the tables name a session: its name, else its first prompt in
    /// quotes (as the server previews it), else `-`.
    fn name(&self, server_id: &str, s: &SessionMetadata) -> String {
        if let Some(name) = &s.session_name {
            return name.clone();
        }
        match self.preview(server_id, &s.id) {
            Some(preview) => format!("“{preview}”"),
            None => "-".to_owned(),
        }
    }

    /// As the tables show it: `provider/id (level)`, or `-`.
    fn model_text(&self, server_id: &str, id: &str) -> String {
        self.model(server_id, id).map_or_else(
            || "-".to_owned(),
            |(m, level)| format!("{}/{} ({})", m.provider, m.id, level.as_str()),
        )
    }

    fn print_json(&self) {
        let list: Vec<serde_json::Value> = self
            .pairs
            .iter()
            .map(|(server_id, s)| {
                let mut value = session_json(s);
                value["serverId"] = server_id.clone().into();
                let (status, clients) = self.state(server_id, &s.id);
                value["status"] = status.into();
                if let Some(n) = clients {
                    value["clients"] = n.into();
                }
                if let Some((model, level)) = self.model(server_id, &s.id) {
                    value["model"] = format!("{}/{}", model.provider, model.id).into();
                    value["thinkingLevel"] = level.as_str().into();
                }
                if let Some(preview) = self.preview(server_id, &s.id) {
                    value["preview"] = preview.into();
                }
                value
            })
            .collect();
        outln!("{}", serde_json::Value::Array(list));
    }

    /// The table that fits the terminal: short ids, "ago" times, the
    /// clients beside the state, `~` for home, the directory clipped.
    fn print_short(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let servers: BTreeSet<&String> = self.pairs.iter().map(|(server, _)| server).collect();
        let short = lookup::unique_prefix_len(self.pairs.iter().map(|(_, s)| s.id.as_str()), 8);
        let home = std::env::var("HOME").unwrap_or_default();
        let mut header: Vec<String> = ["ID", "NAME", "STATUS", "MODEL", "ACTIVE", "CWD"]
            .map(str::to_owned)
            .to_vec();
        if servers.len() > 1 {
            header.insert(0, "SERVER".into());
        }
        let mut rows = vec![header];
        for (server_id, s) in &self.pairs {
            let model = self.model_text(server_id, &s.id);
            // Attached clients, after the state: `idle·2`.
            let status = match self.state(server_id, &s.id) {
                (status, Some(clients)) if clients > 0 => format!("{status}·{clients}"),
                (status, _) => status.to_owned(),
            };
            let cwd = s.cwd.clone().unwrap_or_default();
            let cwd = match cwd.strip_prefix(&home) {
                Some(rest) if !home.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
                    format!("~{rest}")
                }
                _ => cwd,
            };
            let mut row = vec![
                s.id[..short.min(s.id.len())].to_owned(),
                clip(&self.name(server_id, s), 28),
                status,
                clip(&model, 28),
                kernel::time::ago(now, last(s)),
                cwd,
            ];
            if servers.len() > 1 {
                row.insert(0, server_id[..8.min(server_id.len())].to_owned());
            }
            rows.push(row);
        }
        // The directory takes what the terminal (else 100 columns) leaves.
        let width = terminal_width().unwrap_or(100);
        let columns = rows[0].len();
        let used: usize = (0..columns - 1)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0) + 2)
            .sum();
        let room = width.saturating_sub(used).max(12);
        for row in &mut rows[1..] {
            let cwd = row.last_mut().expect("a directory column");
            *cwd = clip_left(cwd, room);
        }
        print_table(&rows);
    }

    /// `-w`: every column in full.
    fn print_wide(&self) {
        let mut rows = vec![vec![
            "SERVER".into(),
            "SESSION".into(),
            "CREATED (UTC)".into(),
            "LAST ACTIVITY (UTC)".into(),
            "STATUS".into(),
            "CLIENTS".into(),
            "MODEL".into(),
            "CWD".into(),
            "NAME".into(),
        ]];
        for (server_id, s) in &self.pairs {
            let (status, clients) = self.state(server_id, &s.id);
            rows.push(vec![
                server_id.clone(),
                s.id.clone(),
                format_utc(s.created_at),
                format_utc(last(s)),
                status.to_owned(),
                clients.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                self.model_text(server_id, &s.id),
                s.cwd.clone().unwrap_or_default(),
                self.name(server_id, s),
            ]);
        }
        print_table(&rows);
    }
}

/// A session's last activity.
fn last(s: &SessionMetadata) -> u64 {
    s.updated_at.unwrap_or(s.created_at)
}

pub(super) async fn run_list(target: &Target, listing: &Listing) -> Result<(), String> {
    let mut listed = Listed::gather(target).await?;
    listed.select(listing);
    if listing.quiet {
        for (_, s) in &listed.pairs {
            outln!("{}", s.id);
        }
    } else if listing.json {
        listed.print_json();
    } else if listed.pairs.is_empty() {
        if listing.filter.is_some() || listing.cwd.is_some() {
            eprintln!("no session matches");
        } else {
            eprintln!("no sessions yet; create one with `pi-server create`");
        }
    } else if listing.wide {
        listed.print_wide();
    } else {
        listed.print_short();
    }
    Ok(())
}

pub(super) fn session_json(s: &SessionMetadata) -> serde_json::Value {
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

/// What `create` (and `exec`) ask for: the working directory resolved and
/// checked (the current one by default).
pub(super) fn create_params(args: CreateArgs) -> Result<CreateParams, String> {
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
    Ok(CreateParams {
        cwd: Some(cwd),
        name: args.name,
        model: args.model,
        thinking_level: args.thinking,
    })
}

pub(super) async fn run_create(
    target: &Target,
    args: CreateArgs,
    json: bool,
) -> Result<(), String> {
    let params = create_params(args)?;
    let client = connect(target).await?;
    if let Some(model) = &params.model {
        check_model(
            &client.server_snapshot().models,
            model,
            params.thinking_level,
        )?;
    }
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
    if json {
        let value = serde_json::json!({
            "id": session.id,
            "name": session.name,
            "cwd": session.cwd,
            "model": format!("{}/{}", chosen.provider, chosen.id),
            "thinkingLevel": session.thinking_level.as_str(),
        });
        outln!("{value}");
    } else {
        outln!("{}", session.id);
    }
    Ok(())
}

/// Checks a requested model (and thinking level) against the server's list,
/// with the kernel's rules and messages.
pub(super) fn check_model(
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

pub(super) fn levels(levels: &[ThinkingLevel]) -> String {
    levels
        .iter()
        .map(|l| l.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) async fn run_rm(target: &Target, query: &str) -> Result<(), String> {
    let (client, id) = session_server(target, query).await?;
    let id = id.as_str();
    let result = client.remove(id).await;
    client.close().await;
    result.map_err(|e| format!("cannot remove session {id}: {e}"))?;
    outln!("removed session {id}");
    Ok(())
}

/// What `steer`, `abort`, `set-model`, `set-thinking` and `rename` ask of a
/// session.
#[derive(Debug)]
pub(super) enum Control {
    Steer(String),
    Abort,
    SetModel(ModelRef),
    SetThinking(ThinkingLevel),
    Rename(String),
    Compact(Option<String>),
}

/// Attaches to the session `query` names, asks `control` of it, says what
/// came of it, and detaches.
pub(super) async fn run_control(
    target: &Target,
    query: &str,
    control: Control,
) -> Result<(), String> {
    let (client, id) = session_server(target, query).await?;
    let result = control_session(&client, &id, control).await;
    client.close().await;
    outln!("{}", result?);
    Ok(())
}

async fn control_session(
    client: &pi_client::Client,
    id: &str,
    control: Control,
) -> Result<String, String> {
    client
        .attach(id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let uses = |s: SessionSnapshot| {
        format!(
            "session {id} now uses {}/{} with thinking {}",
            s.model.provider,
            s.model.id,
            s.thinking_level.as_str()
        )
    };
    let result = match control {
        Control::Steer(text) => client
            .steer(id, &text)
            .await
            .map(|_| format!("steered session {id}: its running turn reads the message next"))
            .map_err(|e| format!("cannot steer session {id}: {e}")),
        Control::Compact(instructions) => {
            eprintln!("compacting session {id}: the model summarises its older conversation…");
            client
                .compact(id, instructions.as_deref())
                .await
                .map(|_| format!("compacted session {id}: its next turns start from the summary"))
                .map_err(|e| format!("cannot compact session {id}: {e}"))
        }
        Control::Abort => client
            .abort(id)
            .await
            .map(|_| format!("aborted the running turn of session {id}"))
            .map_err(|e| format!("cannot abort the turn of session {id}: {e}")),
        Control::SetModel(model) => client
            .set_model(id, model)
            .await
            .map(uses)
            .map_err(|e| format!("cannot switch the model of session {id}: {e}")),
        Control::SetThinking(level) => client
            .set_thinking(id, level)
            .await
            .map(uses)
            .map_err(|e| format!("cannot set the thinking level of session {id}: {e}")),
        Control::Rename(name) => client
            .rename(id, &name)
            .await
            .map(|s| format!("session {id} is now named {}", s.name.unwrap_or_default()))
            .map_err(|e| format!("cannot rename session {id}: {e}")),
    };
    let _ = client.detach(id).await;
    result
}

/// `pi-server mcp list [SESSION]`: a session's MCP servers as its worker
/// runs them (attaching starts it, and it starts them), or the servers
/// `<agentDir>/settings.json` configures.
pub(super) async fn run_mcp_list(
    target: &Target,
    session: Option<&str>,
    json: bool,
) -> Result<(), String> {
    use kernel::mcp::{STATUS_FILE, merge};
    let Some(query) = session else {
        let (servers, problems) = merge(&[pi_config::settings::mcp_global(&config::agent_dir())]);
        for p in &problems {
            eprintln!("pi-server: {p}");
        }
        let status: Vec<serde_json::Value> = servers
            .iter()
            .map(|s| {
                serde_json::json!({"name": s.name, "target": s.target(), "state": "configured",
                    "reason": null, "tools": []})
            })
            .collect();
        return print_mcp(
            &status,
            json,
            "no MCP servers are configured in the agent directory's settings.json",
        );
    };
    let Some(launch) = &target.launch else {
        return Err("mcp list SESSION reads the session's directory: run it on the server's machine, without --connect".into());
    };
    let (client, id) = session_server(target, query).await?;
    let attached = client.attach(&id).await;
    let path = launch.session_dir.join(&id).join(STATUS_FILE);
    let read = || -> Option<Vec<serde_json::Value>> {
        let text = std::fs::read_to_string(&path).ok()?;
        serde_json::from_str(&text).ok()
    };
    // The worker records its servers' state at each change; wait for the
    // ones still starting.
    let limit = std::time::Instant::now() + MCP_START_WAIT;
    let mut told = false;
    let status = loop {
        let status = read();
        let starting = status.as_ref().map_or(usize::MAX, |s| {
            s.iter().filter(|v| v["state"] == "starting").count()
        });
        if starting == 0 || std::time::Instant::now() >= limit {
            break status;
        }
        if !told && starting != usize::MAX {
            told = true;
            eprintln!("waiting for {starting} MCP server(s) to start…");
        }
        tokio::time::sleep(MCP_STATUS_POLL).await;
    };
    if attached.is_ok() {
        let _ = client.detach(&id).await;
    }
    client.close().await;
    attached.map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let status = status.ok_or_else(|| {
        format!(
            "session {id}'s worker has not recorded its MCP servers in {}",
            path.display()
        )
    })?;
    print_mcp(&status, json, &format!("session {id} has no MCP servers"))
}

fn print_mcp(status: &[serde_json::Value], json: bool, none: &str) -> Result<(), String> {
    if json {
        outln!("{}", serde_json::Value::Array(status.to_vec()));
        return Ok(());
    }
    if status.is_empty() {
        outln!("{none}");
        return Ok(());
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut rows = vec![vec![
        "NAME".into(),
        "STATE".into(),
        "TOOLS".into(),
        "SERVER".into(),
    ]];
    for s in status {
        let tools = s["tools"].as_array().map_or(0, Vec::len);
        rows.push(vec![
            text(&s["name"]),
            text(&s["state"]),
            if s["state"] == "ready" {
                tools.to_string()
            } else {
                "-".into()
            },
            text(&s["target"]),
        ]);
    }
    print_table(&rows);
    for s in status {
        if let Some(reason) = s["reason"].as_str() {
            outln!("{}: {reason}", text(&s["name"]));
        }
        let tools: Vec<String> = s["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        if !tools.is_empty() {
            outln!("{}: {}", text(&s["name"]), tools.join(", "));
        }
    }
    Ok(())
}

pub(super) async fn run_models(target: &Target, json: bool) -> Result<(), String> {
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
        outln!("{}", serde_json::Value::Array(list));
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

/// Standard output's terminal's width, when it is one.
fn terminal_width() -> Option<usize> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    let size = rustix::termios::tcgetwinsize(&stdout).ok()?;
    (size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// `text` cut to `width` characters, the cut marked with `…`.
fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let kept: String = text.chars().take(width.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// `text` cut to its last `width` characters (a path's end says most).
fn clip_left(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_owned();
    }
    let kept: String = text.chars().skip(count - width.saturating_sub(1)).collect();
    format!("…{kept}")
}

/// Prints rows in left-aligned columns; the last column is not padded.
pub(super) fn print_table(rows: &[Vec<String>]) {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    crate::cli::print(&out);
}

pub(super) async fn run_log(target: &Target, query: &str, json: bool) -> Result<(), String> {
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

pub(super) async fn run_attach(
    target: &Target,
    which: &super::stream::Which,
    history: crate::tui::History,
    json: bool,
) -> Result<(), Failure> {
    let (client, id) = super::stream::which_session(target, which).await?;
    let terminal = std::io::stdin().is_terminal() && std::io::stdout().is_terminal() && !json;
    if terminal && let Some(server_id) = speaks_v8(target, &client) {
        // The terminal follows the session's replicas over v8: a turn
        // costs it what the turn adds, not the transcript.
        client.close().await;
        return attach_v8(target, &server_id, &id, history).await;
    }
    let client = Arc::new(client);
    let id = id.as_str();
    let snapshot = client
        .attach(id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let mut id = id.to_owned();
    let result = if terminal {
        // The UI may end on another session (`/new`, `/sessions NAME`).
        match crate::tui::run(Arc::clone(&client), &id, history).await {
            Ok(last) => {
                id = last;
                Ok(())
            }
            Err(e) => Err(Failure::from(e)),
        }
    } else {
        attach::run_lines(Arc::clone(&client), &id, &snapshot, json).await
    };
    let id = id.as_str();
    let _ = client.detach(id).await;
    if result.is_ok() {
        eprintln!("detached from session {id}");
    }
    if let Ok(client) = Arc::try_unwrap(client) {
        client.close().await;
    }
    result
}

/// The server's id when the terminal can follow it over v8: over its Unix
/// socket without a token (v8's hello carries none; the socket's
/// permissions guard it). `PI_SERVER_PROTOCOL=1` keeps the terminal on v1.
pub(super) fn speaks_v8(target: &Target, client: &pi_client::Client) -> Option<String> {
    let v1 = std::env::var("PI_SERVER_PROTOCOL").is_ok_and(|v| v == "1");
    let local = matches!(target.address, pi_client::Address::Unix(_));
    (!v1 && local && target.token.is_none()).then(|| client.server_snapshot().server_id)
}

/// A v8 connection to the target's server, following our session status;
/// it starts the server again should a reconnection find none.
pub(super) async fn connect_v8(
    target: &Target,
    server_id: &str,
) -> Result<pi_client::v8::V8Client, String> {
    use kernel::client::v8::connection::STATUS;
    // The server found may be another of the server dir than the default.
    let target = match &target.launch {
        Some(launch) if launch.server_id != server_id => target
            .for_server(server_id)
            .unwrap_or_else(|| target.clone()),
        _ => target.clone(),
    };
    let launcher = super::activate::launcher(&target);
    pi_client::v8::V8Client::connect(&target.address, server_id, vec![STATUS], launcher)
        .await
        .map_err(|e| format!("cannot connect to the server over protocol v8: {e}"))
}

/// `attach` in the terminal over v8.
async fn attach_v8(
    target: &Target,
    server_id: &str,
    id: &str,
    history: crate::tui::History,
) -> Result<(), Failure> {
    let client = connect_v8(target, server_id).await?;
    let last = crate::tui::run_v8(client.clone(), id, history)
        .await
        .map_err(Failure::from)?;
    let _ = client.detach().await;
    eprintln!("detached from session {last}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::parse_model;
    use kernel::protocol::ThinkingLevel;

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
}
