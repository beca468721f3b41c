//! MCP servers, run with the official Rust SDK (`rmcp`): a stdio server as a
//! child process in the session's working directory, in its own process
//! group (recorded like a `bash` command's, so that the next worker kills
//! what a killed worker left), or a Streamable HTTP endpoint.
//!
//! The kernel's [`McpServers`](kernel::mcp::McpServers) decides which
//! servers run, what their tools are called and where a call goes; this
//! module starts them, lists their tools, calls them, and says when one
//! ends.

use crate::tools::{GroupKill, ToolOutcome};
use kernel::mcp::{ListedTool, ServerConfig, ServerStatus, Transport};
use kernel::protocol::Content;
use kernel::wire::Value;
use rmcp::ServiceExt as _;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::transport::{
    StreamableHttpClientTransport, TokioChildProcess,
    streamable_http_client::StreamableHttpClientTransportConfig,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Bytes of text an MCP tool's result keeps (its start); the whole result
/// is kept in the session's directory.
pub const RESULT_MAX_BYTES: usize = 50 * 1024;
/// Bytes of a stdio server's stderr kept to explain why it stopped.
const STDERR_TAIL: usize = 2048;

/// A started server: its session with the client, and what to kill with
/// it. Dropping it ends the session and kills the server's process group.
pub struct Started {
    service: RunningService<RoleClient, ()>,
    /// The server's process group (stdio).
    group: Option<GroupKill>,
    /// The end of the server's stderr (stdio).
    stderr: Arc<Mutex<String>>,
}

impl Started {
    /// What the client uses to call the server's tools.
    pub fn peer(&self) -> Peer<RoleClient> {
        self.service.peer().clone()
    }

    /// Waits until the server ends its session (it exited, or closed its
    /// end), kills what is left of its processes, and says why, for a notice.
    pub async fn ended(self) -> String {
        let Self {
            service,
            group,
            stderr,
        } = self;
        let _ = service.waiting().await;
        drop(group);
        let tail = said(&stderr);
        explain("it closed its connection", &tail)
    }
}

/// Starts `config` (a stdio server in `cwd`, its group recorded under
/// `session`), and lists its tools.
pub async fn start(
    config: &ServerConfig,
    cwd: &Path,
    session: Option<&Path>,
) -> Result<(Started, Vec<ListedTool>), String> {
    let stderr = Arc::new(Mutex::new(String::new()));
    let (service, group) = match &config.transport {
        Transport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            crate::tools::without_worker_env(&mut cmd);
            cmd.args(args)
                .current_dir(cwd)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .process_group(0)
                .kill_on_drop(true);
            let (process, err) = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run {command:?}: {e}"))?;
            let pid = process
                .id()
                .and_then(|id| rustix::process::Pid::from_raw(id as i32));
            let group = GroupKill::new(pid, session);
            if let Some(err) = err {
                tokio::spawn(keep_stderr(err, Arc::clone(&stderr)));
            }
            let service = ().serve(process).await.map_err(|e| {
                let tail = said(&stderr);
                explain(&format!("no MCP handshake: {e}"), &tail)
            })?;
            (service, Some(group))
        }
        Transport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (k, v) in headers {
                let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| format!("header {k:?} is not a valid HTTP header name"))?;
                let value = reqwest::header::HeaderValue::from_str(v)
                    .map_err(|_| format!("header {k:?} has a value HTTP cannot carry"))?;
                custom.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom),
            );
            let service = ()
                .serve(transport)
                .await
                .map_err(|e| format!("no MCP handshake with {url}: {e}"))?;
            (service, None)
        }
    };
    let tools = service.peer().list_all_tools().await.map_err(|e| {
        let tail = said(&stderr);
        explain(&format!("cannot list its tools: {e}"), &tail)
    })?;
    let listed = tools
        .into_iter()
        .map(|t| ListedTool {
            name: t.name.into_owned(),
            description: t.description.map(|d| d.into_owned()),
            schema: pi_config::json::from_json(&serde_json::Value::Object(
                (*t.input_schema).clone(),
            )),
        })
        .collect();
    Ok((
        Started {
            service,
            group,
            stderr,
        },
        listed,
    ))
}

/// What a server said on stderr, its end.
fn said(stderr: &Mutex<String>) -> String {
    stderr.lock().map(|s| s.clone()).unwrap_or_default()
}

/// `what`, with the end of the server's stderr when it said something.
pub fn explain(what: &str, stderr: &str) -> String {
    let tail = stderr.trim();
    if tail.is_empty() {
        what.to_string()
    } else {
        format!("{what}; it said: {tail}")
    }
}

async fn keep_stderr(mut err: tokio::process::ChildStderr, tail: Arc<Mutex<String>>) {
    use tokio::io::AsyncReadExt as _;
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = err.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        tracing::debug!(target: "mcp", "{}", text.trim_end());
        if let Ok(mut kept) = tail.lock() {
            kept.push_str(&text);
            if kept.len() > STDERR_TAIL {
                let mut cut = kept.len() - STDERR_TAIL;
                while !kept.is_char_boundary(cut) {
                    cut += 1;
                }
                kept.drain(..cut);
            }
        }
    }
}

/// Calls `tool` on `peer` with `input`; a result longer than
/// [`RESULT_MAX_BYTES`] keeps its start, and its whole text goes to a file
/// under `outputs` (the session's directory), which the result names.
pub async fn call(
    peer: &Peer<RoleClient>,
    tool: &str,
    input: &Value,
    outputs: Option<&Path>,
) -> ToolOutcome {
    let arguments = match pi_config::json::to_json(input) {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => Default::default(),
        other => {
            return ToolOutcome::error(format!("{tool}: the input must be an object, not {other}"));
        }
    };
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
    let result = match peer.call_tool(params).await {
        Ok(result) => result,
        Err(e) => return ToolOutcome::error(format!("{tool}: the MCP server failed: {e}")),
    };
    let mut content = Vec::new();
    let mut text = String::new();
    for block in result.content {
        match block {
            ContentBlock::Text(t) => text.push_str(&t.text),
            ContentBlock::Image(i) => content.push(Content::Image {
                data: i.data,
                mime_type: i.mime_type,
            }),
            other => {
                // Resources, links and audio: as the JSON the server sent.
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&serde_json::to_string(&other).unwrap_or_default());
            }
        }
    }
    if text.is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if text.len() > RESULT_MAX_BYTES {
        let kept = crate::text::excerpt(&text, RESULT_MAX_BYTES);
        let saved = match outputs {
            Some(dir) => save(dir, &text).await,
            None => None,
        };
        text = match saved {
            Some(path) => format!(
                "{kept}\n\n[The result was cut to its first {RESULT_MAX_BYTES} bytes of {}; \
                 the whole of it is in {}]",
                text.len(),
                path.display()
            ),
            None => format!(
                "{kept}\n\n[The result was cut to its first {RESULT_MAX_BYTES} bytes of {}]",
                text.len()
            ),
        };
    }
    if !text.is_empty() || content.is_empty() {
        content.insert(0, Content::Text { text });
    }
    ToolOutcome {
        content,
        details: None,
        is_error: result.is_error == Some(true),
    }
}

/// Writes the state of a session's MCP servers to its directory
/// ([`kernel::mcp::STATUS_FILE`]), replacing the last.
pub fn record(session: &Path, status: &[ServerStatus]) -> std::io::Result<()> {
    let list: Vec<serde_json::Value> = status
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.name, "target": s.target, "state": s.state,
                "reason": s.reason, "tools": s.tools,
            })
        })
        .collect();
    let text = serde_json::to_string_pretty(&list).expect("JSON") + "\n";
    let tmp = session.join(format!(".{}.tmp", kernel::mcp::STATUS_FILE));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, session.join(kernel::mcp::STATUS_FILE))
}

async fn save(dir: &Path, text: &str) -> Option<std::path::PathBuf> {
    let dir = dir.join("mcp-output");
    tokio::fs::create_dir_all(&dir).await.ok()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = dir.join(format!("{stamp}-{}.txt", std::process::id()));
    tokio::fs::write(&path, text).await.ok()?;
    Some(path)
}
