//! MCP servers (issue #43): the time from a prompt to the model's request
//! with three stdio MCP servers configured (the reference
//! `@modelcontextprotocol/server-everything`, installed by
//! `tests/mcp/install.sh`) against none, after the first turn, which starts
//! them; and the worker's resident memory with them, their own apart.
//!
//! Two servers run side by side on one mock model (`mockllm`), each with one
//! session; the turns alternate between them. A turn's figure is the time
//! from the `prompt` request to the mock receiving the model call.

use crate::mockllm::MockLlm;
use crate::server::Server;
use crate::util::{Env, Report, children, fmt_us, median, rss_kib, us};
use kernel::protocol::{CreateParams, ModelRef};
use serde_json::json;
use std::time::{Duration, Instant};

/// The MCP servers of the configured side.
const SERVERS: usize = 3;

struct Side {
    name: &'static str,
    server: Server,
    runtime: tokio::runtime::Runtime,
    client: pi_client::Client,
    session: String,
    samples: Vec<f64>,
}

impl Side {
    fn start(
        env: &Env,
        mock: &MockLlm,
        name: &'static str,
        mcp: Option<&str>,
    ) -> Result<Self, String> {
        let agent = env.fresh_dir(&format!("mcp-{name}-agent"));
        let models = json!({"providers": {"mock": {
            "baseUrl": mock.base, "api": "openai-completions",
            "models": [{"id": "mock", "contextWindow": 10_000_000, "maxTokens": 32000}]}}});
        std::fs::write(agent.join("models.json"), models.to_string()).map_err(|e| e.to_string())?;
        if let Some(script) = mcp {
            let servers: serde_json::Map<String, serde_json::Value> = (0..SERVERS)
                .map(|i| {
                    (
                        format!("e{i}"),
                        json!({"command": "node", "args": [script, "stdio"]}),
                    )
                })
                .collect();
            let settings = json!({"mcpServers": servers});
            std::fs::write(agent.join("settings.json"), settings.to_string())
                .map_err(|e| e.to_string())?;
        }
        let sessions = env.fresh_dir(&format!("mcp-{name}-sessions"));
        let vars = [("PI_CODING_AGENT_DIR", agent.display().to_string())];
        let server = Server::start(env, &sessions, &vars)?;
        let (runtime, client) = server.client(name)?;
        let params = CreateParams {
            cwd: Some(
                env.fresh_dir(&format!("mcp-{name}-project"))
                    .display()
                    .to_string(),
            ),
            model: Some(ModelRef {
                provider: "mock".into(),
                id: "mock".into(),
            }),
            ..CreateParams::default()
        };
        let session = runtime
            .block_on(client.create(params))
            .map_err(|e| format!("{name}: create: {e}"))?
            .id;
        Ok(Self {
            name,
            server,
            runtime,
            client,
            session,
            samples: Vec::new(),
        })
    }

    /// One turn; returns the time from the prompt to the model's request.
    fn turn(&mut self, mock: &MockLlm, text: &str) -> Result<Duration, String> {
        let before = mock.script.arrivals.lock().map_or(0, |a| a.len());
        let sent = Instant::now();
        self.runtime
            .block_on(self.client.prompt(&self.session, text))
            .map_err(|e| format!("{}: prompt: {e}", self.name))?;
        let arrivals = mock.script.arrivals.lock().map_err(|e| e.to_string())?;
        let arrived = arrivals
            .get(before)
            .ok_or_else(|| format!("{}: the turn made no model request", self.name))?;
        Ok(arrived.saturating_duration_since(sent))
    }

    /// The worker's resident memory, and its children's (the MCP servers).
    fn memory(&self) -> (u64, u64) {
        let workers = children(self.server.pid);
        let worker = workers.iter().filter_map(|p| rss_kib(*p)).sum();
        let servers = workers
            .iter()
            .flat_map(|w| children(*w))
            .filter_map(rss_kib)
            .sum();
        (worker, servers)
    }
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let install = env.workspace.join("tests/mcp/install.sh");
    let out = std::process::Command::new(&install)
        .output()
        .map_err(|e| format!("{}: {e}", install.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed: {out:?}", install.display()));
    }
    let script = env
        .workspace
        .join("tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
        .display()
        .to_string();
    let turns = env.pick(5, 40);
    let mock = MockLlm::start(5)?;
    let mut none = Side::start(env, &mock, "none", None)?;
    let mut three = Side::start(env, &mock, "three", Some(&script))?;
    // The first turn of each: the worker starts, and with it the servers.
    let first_none = none.turn(&mock, "first")?;
    let first_three = three.turn(&mock, "first")?;
    for turn in 0..turns {
        let text = format!("turn {turn}");
        for side in [&mut none, &mut three] {
            let took = side.turn(&mock, &text)?;
            side.samples.push(us(took));
        }
    }
    let (a, b) = (median(&none.samples), median(&three.samples));
    report.info(
        "mcp",
        "first turn (worker and servers start): prompt → model request, none / 3 stdio servers",
        format!("{} / {}", fmt_us(us(first_none)), fmt_us(us(first_three))),
    );
    let ratio = b / a;
    report.push(
        "mcp",
        format!("later turns, prompt → model request, {SERVERS} stdio MCP servers vs none (median of {turns})"),
        format!("{} vs {} ({ratio:.2}×)", fmt_us(b), fmt_us(a)),
        "≤ 1.25×",
        Some(ratio <= 1.25),
    );
    let (worker_none, _) = none.memory();
    let (worker_three, servers) = three.memory();
    report.info(
        "mcp",
        format!("worker RSS, none / {SERVERS} servers (the servers' own, apart)"),
        format!(
            "{:.1} / {:.1} MiB ({:.2}×; servers {:.1} MiB)",
            worker_none as f64 / 1024.0,
            worker_three as f64 / 1024.0,
            worker_three as f64 / worker_none.max(1) as f64,
            servers as f64 / 1024.0
        ),
    );
    for side in [&mut none, &mut three] {
        side.server.stop();
    }
    Ok(())
}
