//! MCP servers of one session: which servers run, what their tools are
//! called, and when a turn may use them.
//!
//! The worker host ([`crate::host`]) owns one [`McpServers`]. Its driver
//! reads the layers of configuration (the agent directory's `settings.json`,
//! the session's own, and the editor's servers remembered with the session)
//! and runs the servers with an MCP client; this machine decides everything
//! else:
//!
//! - **Configuration.** [`merge`] parses each layer's `mcpServers` and
//!   merges them in order, a later layer winning by name (`"disabled": true`
//!   removes a server). A malformed entry is a notice naming the entry and
//!   its file, and is left out; the others still run.
//! - **Lifecycle.** Each server is `starting`, `ready` with its tools, or
//!   `failed` with a reason. A server that does not start within
//!   [`McpLimits::start_timeout`] is stopped and failed. A failed server is
//!   started again by a later configuration once [`McpLimits::retry_after`]
//!   has passed, or at once if its configuration changed. Each start has a
//!   new generation: what an older one reports is stale.
//! - **Names.** A tool is offered as `mcp__<server>__<tool>`, with every
//!   character outside `[A-Za-z0-9_-]` made `_` and cut to 64 characters (what
//!   every provider accepts), so it cannot collide with a built-in tool. Two
//!   tools with the same offered name: the later is left out with a notice.
//!   A tool whose input schema is not a JSON schema object is left out with a
//!   notice; at most [`McpLimits::max_tools`] tools are offered in all.
//! - **Routing.** [`McpServers::route`] says whether a tool name the model
//!   used is a built-in, a ready MCP tool, or an MCP tool that cannot run
//!   now (and why, for the tool's error).
//!
//! Invariants ([`McpServers::invariants`]): at most one entry per name, in
//! name order; a starting server has a deadline; offered names are unique,
//! start with [`PREFIX`], and number at most `max_tools`.

use crate::limits::McpLimits;
use crate::protocol::JsonValue;
use crate::time::Instant;
use std::collections::BTreeSet;

/// The file in a session's directory that remembers the MCP servers its
/// editor configured (ACP `mcpServers`), as `{"mcpServers": {...}}`: the
/// last layer of its configuration.
pub const EDITOR_FILE: &str = "editor-mcp.json";

/// The file in a session's directory where its worker keeps the state of
/// the session's MCP servers ([`McpServers::status`]), for `pi-server mcp list`.
pub const STATUS_FILE: &str = "mcp-status.json";

/// Every offered MCP tool's name starts with this.
pub const PREFIX: &str = "mcp__";
/// The longest tool name every provider accepts.
pub const NAME_MAX: usize = 64;

/// How a server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A child process speaking JSON-RPC on its stdin and stdout, started in
    /// the session's working directory.
    Stdio {
        /// Program to run (looked up in `PATH`).
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to its environment.
        env: Vec<(String, String)>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// `http://` or `https://` address.
        url: String,
        /// Headers sent with every request (an authorization, say).
        headers: Vec<(String, String)>,
    },
}

/// One configured server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Its name, as the configuration's key.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
}

impl ServerConfig {
    /// How it is reached, as `mcp list` shows it: the command line or the url.
    pub fn target(&self) -> String {
        match &self.transport {
            Transport::Stdio { command, args, .. } => std::iter::once(command)
                .chain(args)
                .cloned()
                .collect::<Vec<_>>()
                .join(" "),
            Transport::Http { url, .. } => url.clone(),
        }
    }
}

/// One layer of configuration: a file's `mcpServers` value, if it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// Where it comes from, for notices (a path).
    pub source: String,
    /// The `mcpServers` value.
    pub servers: Option<JsonValue>,
}

/// The servers `layers` configure, merged in order (later wins by name),
/// in name order, and a notice for each malformed entry.
pub fn merge(layers: &[Layer]) -> (Vec<ServerConfig>, Vec<String>) {
    let mut servers: Vec<ServerConfig> = Vec::new();
    let mut problems = Vec::new();
    for layer in layers {
        let Some(value) = &layer.servers else {
            continue;
        };
        let JsonValue::Map(entries) = value else {
            problems.push(format!(
                "{}: \"mcpServers\" must be an object of named servers, not a {}",
                layer.source,
                value.kind()
            ));
            continue;
        };
        for (name, entry) in entries {
            match parse_entry(name, entry) {
                Ok(parsed) => {
                    servers.retain(|s| &s.name != name);
                    servers.extend(parsed);
                }
                Err(e) => problems.push(format!(
                    "{}: MCP server {name:?} is left out: {e}",
                    layer.source
                )),
            }
        }
    }
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    (servers, problems)
}

/// One entry of `mcpServers`: `None` when it is disabled.
fn parse_entry(name: &str, entry: &JsonValue) -> Result<Option<ServerConfig>, String> {
    if name.is_empty() {
        return Err("a server needs a name".into());
    }
    if !matches!(entry, JsonValue::Map(_)) {
        return Err(format!("it must be an object, not a {}", entry.kind()));
    }
    if entry.get("disabled") == Some(&JsonValue::Bool(true)) {
        return Ok(None);
    }
    let kind = match entry.get("type") {
        None => None,
        Some(JsonValue::Text(t)) => Some(t.as_str()),
        Some(other) => return Err(format!("\"type\" must be a string, not a {}", other.kind())),
    };
    let kind = match kind {
        Some("stdio") => "stdio",
        Some("http" | "streamable-http" | "streamableHttp") => "http",
        Some("sse") => {
            return Err(
                "the SSE transport is not supported; give the server's Streamable HTTP \
                 address with \"type\": \"http\""
                    .into(),
            );
        }
        Some(other) => {
            return Err(format!(
                "unknown \"type\" {other:?}; it is \"stdio\" or \"http\""
            ));
        }
        None if entry.get("command").is_some() => "stdio",
        None if entry.get("url").is_some() => "http",
        None => return Err("it needs a \"command\" (stdio) or a \"url\" (http)".into()),
    };
    let transport = if kind == "stdio" {
        let command = text_field(entry, "command")?
            .ok_or("a stdio server needs a \"command\"")?
            .to_string();
        Transport::Stdio {
            command,
            args: strings(entry, "args")?,
            env: pairs(entry, "env")?,
        }
    } else {
        let url = text_field(entry, "url")?
            .ok_or("an http server needs a \"url\"")?
            .to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "\"url\" must start with http:// or https://: {url:?}"
            ));
        }
        Transport::Http {
            url,
            headers: pairs(entry, "headers")?,
        }
    };
    Ok(Some(ServerConfig {
        name: name.to_string(),
        transport,
    }))
}

fn text_field<'a>(entry: &'a JsonValue, key: &str) -> Result<Option<&'a str>, String> {
    match entry.get(key) {
        None => Ok(None),
        Some(JsonValue::Text(t)) if !t.trim().is_empty() => Ok(Some(t)),
        Some(other) => Err(format!(
            "{key:?} must be a non-empty string, not {}",
            describe(other)
        )),
    }
}

fn strings(entry: &JsonValue, key: &str) -> Result<Vec<String>, String> {
    match entry.get(key) {
        None => Ok(Vec::new()),
        Some(JsonValue::Array(items)) => items
            .iter()
            .map(|i| match i {
                JsonValue::Text(t) => Ok(t.clone()),
                other => Err(format!(
                    "{key:?} must be a list of strings; it holds a {}",
                    other.kind()
                )),
            })
            .collect(),
        Some(other) => Err(format!(
            "{key:?} must be a list of strings, not a {}",
            other.kind()
        )),
    }
}

fn pairs(entry: &JsonValue, key: &str) -> Result<Vec<(String, String)>, String> {
    match entry.get(key) {
        None => Ok(Vec::new()),
        Some(JsonValue::Map(items)) => items
            .iter()
            .map(|(k, v)| match v {
                JsonValue::Text(t) => Ok((k.clone(), t.clone())),
                other => Err(format!(
                    "{key:?} values must be strings; {k:?} is a {}",
                    other.kind()
                )),
            })
            .collect(),
        Some(other) => Err(format!(
            "{key:?} must be an object of strings, not a {}",
            other.kind()
        )),
    }
}

fn describe(value: &JsonValue) -> String {
    match value {
        JsonValue::Text(_) => "an empty string".into(),
        other => format!("a {}", other.kind()),
    }
}

/// The editor's `mcpServers` of an ACP `session/new`, `session/load` or
/// `session/resume` (a list of `{name, command, args, env: [{name, value}]}`
/// and `{type: "http", name, url, headers: [{name, value}]}`), in the shape
/// of `settings.json`'s `mcpServers`, to be remembered with the session.
pub fn from_acp(list: &JsonValue) -> Result<JsonValue, String> {
    let JsonValue::Array(items) = list else {
        return Err(format!("mcpServers must be a list, not a {}", list.kind()));
    };
    let mut out: Vec<(String, JsonValue)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let name = match item.get("name") {
            Some(JsonValue::Text(n)) if !n.is_empty() => n.clone(),
            _ => return Err(format!("mcpServers[{i}] needs a \"name\"")),
        };
        let named = |key: &str| -> Result<JsonValue, String> {
            let mut map = Vec::new();
            if let Some(JsonValue::Array(list)) = item.get(key) {
                for pair in list {
                    match (pair.get("name"), pair.get("value")) {
                        (Some(JsonValue::Text(k)), Some(JsonValue::Text(v))) => {
                            map.push((k.clone(), JsonValue::Text(v.clone())))
                        }
                        _ => {
                            return Err(format!(
                                "mcpServers[{i}] ({name:?}): each of {key:?} is {{name, value}}"
                            ));
                        }
                    }
                }
            }
            Ok(JsonValue::Map(map))
        };
        let mut entry = Vec::new();
        match item.get("type") {
            Some(JsonValue::Text(t)) if t == "http" || t == "sse" => {
                entry.push(("type".to_string(), JsonValue::text(t.clone())));
                if let Some(url) = item.get("url") {
                    entry.push(("url".to_string(), url.clone()));
                }
                entry.push(("headers".to_string(), named("headers")?));
            }
            _ => {
                if let Some(command) = item.get("command") {
                    entry.push(("command".to_string(), command.clone()));
                }
                if let Some(args) = item.get("args") {
                    entry.push(("args".to_string(), args.clone()));
                }
                entry.push(("env".to_string(), named("env")?));
            }
        }
        out.retain(|(n, _)| n != &name);
        out.push((name, JsonValue::Map(entry)));
    }
    Ok(JsonValue::Map(out))
}

/// `mcp__<server>__<tool>`, with every character outside `[A-Za-z0-9_-]`
/// made `_`, cut to [`NAME_MAX`] characters.
pub fn offered_name(server: &str, tool: &str) -> String {
    format!("{PREFIX}{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(NAME_MAX)
        .collect()
}

/// A tool as a server listed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedTool {
    /// Its name on the server.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// Its `inputSchema`.
    pub schema: JsonValue,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedTool {
    /// The name the model uses ([`offered_name`]).
    pub name: String,
    /// The server it belongs to.
    pub server: String,
    /// Its name on that server.
    pub tool: String,
    /// What it does, for the model.
    pub description: String,
    /// Its input schema, passed through.
    pub schema: JsonValue,
}

/// Where a tool call goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// Not an MCP tool: one of the built-in tools (or an unknown one).
    Builtin,
    /// A tool of a ready server.
    Call {
        /// The server.
        server: String,
        /// The start of it the call goes to.
        generation: u64,
        /// The tool's name on the server.
        tool: String,
    },
    /// An MCP tool that cannot run now; the message says why.
    Unavailable(String),
}

/// A server's state, as `pi-server mcp list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerStatus {
    /// Its name.
    pub name: String,
    /// How it is reached: the command line or the url.
    pub target: String,
    /// `starting`, `ready` or `failed`.
    pub state: &'static str,
    /// Why it failed.
    pub reason: Option<String>,
    /// Its offered tools' names.
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Starting { deadline: Instant },
    Ready { tools: Vec<OfferedTool> },
    Failed { reason: String, at: Instant },
}

#[derive(Debug, Clone, PartialEq)]
struct Server {
    config: ServerConfig,
    generation: u64,
    state: State,
}

/// Inputs of [`McpServers`].
#[derive(Debug, Clone, PartialEq)]
pub enum McpInput {
    /// The configuration as read now, layer by layer.
    Configure(Vec<Layer>),
    /// Server `name`'s start `generation` is up and lists these tools.
    Started {
        /// The server.
        name: String,
        /// Which start.
        generation: u64,
        /// Its tools.
        tools: Vec<ListedTool>,
    },
    /// Server `name`'s start `generation` failed to start, or died.
    Failed {
        /// The server.
        name: String,
        /// Which start.
        generation: u64,
        /// Why.
        reason: String,
    },
    /// Time passed (see [`McpServers::next_deadline`]).
    Tick,
}

/// Outputs of [`McpServers`], carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum McpOutput {
    /// Start a server; answer [`McpInput::Started`] or [`McpInput::Failed`].
    Start {
        /// Which start, to name in the answer.
        generation: u64,
        /// What to start.
        config: ServerConfig,
    },
    /// Stop this start of a server (kill its process, close its session).
    Stop {
        /// The server.
        name: String,
        /// Which start.
        generation: u64,
    },
    /// Tell the session's clients.
    Notice(String),
}

/// The MCP servers of one session. See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServers {
    limits: McpLimits,
    servers: Vec<Server>,
    next_generation: u64,
    /// The configuration problems last told, so they are told once.
    told: Vec<String>,
    /// Counts the changes of any server's state ([`McpServers::revision`]).
    revision: u64,
    out: Vec<McpOutput>,
}

impl McpServers {
    /// No servers yet.
    pub fn new(limits: McpLimits) -> Self {
        Self {
            limits,
            servers: Vec::new(),
            next_generation: 1,
            told: Vec::new(),
            revision: 0,
            out: Vec::new(),
        }
    }

    /// Feeds one input at `now`.
    pub fn step(&mut self, now: Instant, input: McpInput) -> Vec<McpOutput> {
        match input {
            McpInput::Configure(layers) => self.configure(now, &layers),
            McpInput::Started {
                name,
                generation,
                tools,
            } => self.started(&name, generation, tools),
            McpInput::Failed {
                name,
                generation,
                reason,
            } => {
                if let Some(i) = self.find(&name, generation) {
                    let was_ready = matches!(self.servers[i].state, State::Ready { .. });
                    self.fail(i, now, reason, was_ready);
                }
            }
            McpInput::Tick => {
                for i in 0..self.servers.len() {
                    if let State::Starting { deadline } = self.servers[i].state
                        && now >= deadline
                    {
                        let s = &self.servers[i];
                        self.out.push(McpOutput::Stop {
                            name: s.config.name.clone(),
                            generation: s.generation,
                        });
                        let secs = self.limits.start_timeout.as_secs_f64();
                        self.fail(i, now, format!("it did not start within {secs} s"), false);
                    }
                }
            }
        }
        debug_assert_eq!(self.invariants(), Ok(()));
        std::mem::take(&mut self.out)
    }

    /// Changes whenever a server's state does (so its tools may have):
    /// what was made of [`McpServers::tools`] at the same revision holds.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// True when no server is starting: a turn may begin.
    pub fn settled(&self) -> bool {
        !self
            .servers
            .iter()
            .any(|s| matches!(s.state, State::Starting { .. }))
    }

    /// When to feed [`McpInput::Tick`].
    pub fn next_deadline(&self) -> Option<Instant> {
        self.servers
            .iter()
            .filter_map(|s| match s.state {
                State::Starting { deadline } => Some(deadline),
                _ => None,
            })
            .min()
    }

    /// The tools offered to the model, server by server.
    pub fn tools(&self) -> impl Iterator<Item = &OfferedTool> {
        self.servers.iter().flat_map(|s| match &s.state {
            State::Ready { tools } => tools.as_slice(),
            _ => &[],
        })
    }

    /// Where a call of tool `name` goes.
    pub fn route(&self, name: &str) -> Route {
        if !name.starts_with(PREFIX) {
            return Route::Builtin;
        }
        for s in &self.servers {
            match &s.state {
                State::Ready { tools } => {
                    if let Some(t) = tools.iter().find(|t| t.name == name) {
                        return Route::Call {
                            server: s.config.name.clone(),
                            generation: s.generation,
                            tool: t.tool.clone(),
                        };
                    }
                }
                State::Failed { reason, .. }
                    if name.starts_with(&offered_name(&s.config.name, "")) =>
                {
                    return Route::Unavailable(format!(
                        "{name}: MCP server {:?} is not running ({reason})",
                        s.config.name
                    ));
                }
                _ => {}
            }
        }
        Route::Unavailable(format!(
            "{name}: no running MCP server offers this tool (the MCP tools now are: {})",
            self.tools()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Each server's state, in name order.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.servers
            .iter()
            .map(|s| {
                let target = s.config.target();
                let (state, reason, tools) = match &s.state {
                    State::Starting { .. } => ("starting", None, Vec::new()),
                    State::Ready { tools } => (
                        "ready",
                        None,
                        tools.iter().map(|t| t.name.clone()).collect(),
                    ),
                    State::Failed { reason, .. } => ("failed", Some(reason.clone()), Vec::new()),
                };
                ServerStatus {
                    name: s.config.name.clone(),
                    target,
                    state,
                    reason,
                    tools,
                }
            })
            .collect()
    }

    /// The machine's invariants (see the module documentation).
    pub fn invariants(&self) -> Result<(), String> {
        if !self
            .servers
            .windows(2)
            .all(|w| w[0].config.name < w[1].config.name)
        {
            return Err("servers are not unique and in name order".into());
        }
        let mut names = BTreeSet::new();
        for t in self.tools() {
            if !t.name.starts_with(PREFIX) || t.name.len() > NAME_MAX {
                return Err(format!("offered name {:?} is malformed", t.name));
            }
            if !names.insert(&t.name) {
                return Err(format!("offered name {:?} twice", t.name));
            }
        }
        if names.len() > self.limits.max_tools {
            return Err(format!("{} tools offered", names.len()));
        }
        Ok(())
    }

    fn find(&self, name: &str, generation: u64) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| s.config.name == name && s.generation == generation)
    }

    fn configure(&mut self, now: Instant, layers: &[Layer]) {
        let (configs, problems) = merge(layers);
        for p in &problems {
            if !self.told.contains(p) {
                self.out.push(McpOutput::Notice(p.clone()));
            }
        }
        self.told = problems;
        let mut servers = Vec::with_capacity(configs.len());
        let mut old = std::mem::take(&mut self.servers).into_iter().peekable();
        for config in configs {
            // Both are in name order: walk them together.
            let mut kept = None;
            while let Some(s) = old.next_if(|s| s.config.name <= config.name) {
                if s.config.name == config.name {
                    kept = Some(s);
                } else {
                    self.stop(&s);
                }
            }
            let server = match kept {
                Some(s) if s.config == config => match s.state {
                    State::Failed { at, .. } if now >= at + self.limits.retry_after => {
                        self.start(now, config)
                    }
                    _ => s,
                },
                Some(s) => {
                    self.stop(&s);
                    self.start(now, config)
                }
                None => self.start(now, config),
            };
            servers.push(server);
        }
        for s in old {
            self.stop(&s);
        }
        // A server started or stopped: the tools change.
        if self.out.iter().any(|o| !matches!(o, McpOutput::Notice(_))) {
            self.revision += 1;
        }
        self.servers = servers;
    }

    fn start(&mut self, now: Instant, config: ServerConfig) -> Server {
        let generation = self.next_generation;
        self.next_generation += 1;
        self.out.push(McpOutput::Start {
            generation,
            config: config.clone(),
        });
        Server {
            config,
            generation,
            state: State::Starting {
                deadline: now + self.limits.start_timeout,
            },
        }
    }

    fn stop(&mut self, s: &Server) {
        if !matches!(s.state, State::Failed { .. }) {
            self.out.push(McpOutput::Stop {
                name: s.config.name.clone(),
                generation: s.generation,
            });
        }
    }

    fn fail(&mut self, i: usize, now: Instant, reason: String, was_ready: bool) {
        let s = &mut self.servers[i];
        if matches!(s.state, State::Failed { .. }) {
            return;
        }
        let notice = if was_ready {
            format!(
                "MCP server {:?} stopped: {reason}; its tools are unavailable until it starts again",
                s.config.name
            )
        } else {
            format!(
                "MCP server {:?} failed to start: {reason}; the session goes on without it",
                s.config.name
            )
        };
        s.state = State::Failed { reason, at: now };
        self.revision += 1;
        self.out.push(McpOutput::Notice(notice));
    }

    fn started(&mut self, name: &str, generation: u64, listed: Vec<ListedTool>) {
        let Some(i) = self.find(name, generation) else {
            return;
        };
        if !matches!(self.servers[i].state, State::Starting { .. }) {
            return;
        }
        let mut taken: BTreeSet<String> = self.tools().map(|t| t.name.clone()).collect();
        let mut tools = Vec::new();
        let mut problems = Vec::new();
        let mut cut = 0;
        for t in listed {
            let offered = offered_name(name, &t.name);
            let object = matches!(&t.schema, JsonValue::Map(_))
                && matches!(t.schema.get("type"), Some(JsonValue::Text(k)) if k == "object");
            if !object {
                problems.push(format!(
                    "MCP server {name:?}: tool {:?} is left out: its input schema is not a \
                     JSON schema of an object",
                    t.name
                ));
            } else if taken.contains(&offered) {
                problems.push(format!(
                    "MCP server {name:?}: tool {:?} is left out: its name {offered} is taken",
                    t.name
                ));
            } else if taken.len() >= self.limits.max_tools {
                cut += 1;
            } else {
                taken.insert(offered.clone());
                tools.push(OfferedTool {
                    name: offered,
                    server: name.to_string(),
                    tool: t.name.clone(),
                    description: t.description.unwrap_or_default(),
                    schema: t.schema,
                });
            }
        }
        if cut > 0 {
            problems.push(format!(
                "MCP server {name:?}: {cut} tools are left out: a session offers at most {} \
                 MCP tools",
                self.limits.max_tools
            ));
        }
        self.out.extend(problems.into_iter().map(McpOutput::Notice));
        self.servers[i].state = State::Ready { tools };
        self.revision += 1;
    }
}

#[cfg(test)]
mod tests;
