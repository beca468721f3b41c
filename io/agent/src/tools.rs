//! The coding tools, run in the session's working directory: `read`,
//! `write`, `edit`, `bash`, and the search tools `grep`, `find` and `ls`
//! (`search.rs`).
//!
//! A tool never fails the worker: unknown tools, bad input and IO errors come
//! back as an [`ToolOutcome`] with `is_error` and a message the model can act
//! on. `bash` runs in its own process group, which is killed (SIGKILL) on
//! timeout, on cancellation, and when the future is dropped. While it runs,
//! the group is recorded in the session's directory ([`GROUPS`]), so that
//! after a worker's SIGKILL the next worker of the session kills it before
//! the session runs again ([`reap_tool_groups`]).

use base64::Engine as _;
use kernel::protocol::Content;
use kernel::wire::Value;
use serde_json::json;
use std::io::{BufRead, Read as _};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

mod search;

use crate::limits;

/// Lines `read` returns when no limit is given.
pub const READ_MAX_LINES: usize = 2000;
/// Bytes of text `read` returns at most.
pub const READ_MAX_BYTES: usize = 50 * 1024;
/// Largest image `read` returns.
pub const IMAGE_MAX_BYTES: u64 = 5 * 1024 * 1024;
/// Bytes of output `bash` keeps (the end of it).
pub const BASH_MAX_BYTES: usize = 50 * 1024;

/// A tool as described to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its input.
    pub parameters: serde_json::Value,
}

/// What a tool run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// Text and image parts.
    pub content: Vec<Content>,
    /// Tool-specific details (strict JSON).
    pub details: Option<Value>,
    /// Whether it failed.
    pub is_error: bool,
}

impl ToolSpec {
    /// An MCP server's tool, as the kernel offers it.
    pub fn mcp(tool: &kernel::mcp::OfferedTool) -> Self {
        Self {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: pi_config::json::to_json(&tool.schema),
        }
    }
}

impl ToolOutcome {
    fn ok(text: String, details: serde_json::Value) -> Self {
        Self {
            content: vec![Content::Text { text }],
            details: Some(pi_config::json::from_json(&details)),
            is_error: false,
        }
    }

    /// A failed run saying `text`.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            content: vec![Content::Text { text: text.into() }],
            details: None,
            is_error: true,
        }
    }
}

/// The tools a session offers when its settings name none: pi's four and
/// the search tools.
pub const DEFAULT_TOOLS: [&str; 7] = ["read", "write", "edit", "bash", "grep", "find", "ls"];

/// The tools named in `names`, in that order, described for the providers;
/// an unknown name is an error naming the known ones.
pub fn select_tools(names: &[String]) -> Result<Vec<ToolSpec>, String> {
    let all = tool_specs();
    let mut out: Vec<ToolSpec> = Vec::new();
    for name in names {
        match all.iter().find(|s| s.name == *name) {
            Some(spec) if !out.iter().any(|s| s.name == spec.name) => out.push(spec.clone()),
            Some(_) => {}
            None => {
                return Err(format!(
                    "unknown tool {name:?} in the \"tools\" setting; the tools are {}",
                    DEFAULT_TOOLS.join(", ")
                ));
            }
        }
    }
    Ok(out)
}

/// Every tool, described for the providers.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "read".into(),
            description:
                "Read a file. Text comes back as is, at most 2000 lines or 50 KB per call \
                          (use offset and limit for more). Images (png, jpeg, gif, webp) come back \
                          as images."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to read, relative to the working directory or absolute"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read"}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "write".into(),
            description: "Write content to a file, creating it and its parent directories, or \
                          replacing it entirely."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to write, relative to the working directory or absolute"},
                    "content": {"type": "string", "description": "The complete new content"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "edit".into(),
            description: "Replace exact text in a file. old_text must match the file exactly \
                          (whitespace included) and exactly once; include surrounding lines to \
                          make it unique."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to edit, relative to the working directory or absolute"},
                    "old_text": {"type": "string", "description": "Exact text to replace"},
                    "new_text": {"type": "string", "description": "Text to put in its place"}
                },
                "required": ["path", "old_text", "new_text"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "bash".into(),
            description: "Run a bash command in the working directory. stdout and stderr are \
                          returned together; long output keeps its last 50 KB. The command is \
                          killed after timeout seconds (default 120)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line"},
                    "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "Timeout in seconds (default 120)"}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "grep".into(),
            description: "Search file contents for a regular expression (ripgrep syntax), \
                          respecting .gitignore. Returns path:line: text, at most limit matches \
                          (default 100) or 50 KB."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression (or text, with literal)"},
                    "path": {"type": "string", "description": "Directory or file to search (default: the working directory)"},
                    "glob": {"type": "string", "description": "Only files matching this glob, e.g. *.rs or src/**/*.ts"},
                    "ignoreCase": {"type": "boolean", "description": "Case-insensitive search"},
                    "literal": {"type": "boolean", "description": "Treat pattern as plain text"},
                    "context": {"type": "integer", "minimum": 0, "description": "Lines of context around each match"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Most matches returned (default 100)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "find".into(),
            description: "Find files and directories whose path matches a glob (e.g. *.rs, \
                          **/test_*.py), respecting .gitignore. At most limit paths (default 1000)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob to match"},
                    "path": {"type": "string", "description": "Directory to search (default: the working directory)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Most paths returned (default 1000)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "ls".into(),
            description: "List a directory's entries, sorted, directories with a trailing /, \
                          dotfiles included. At most limit entries (default 500)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory to list (default: the working directory)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Most entries returned (default 500)"}
                },
                "additionalProperties": false
            }),
        },
    ]
}

/// Runs tool `name` with `input` in `cwd`. `cancel` (or dropping the future)
/// stops it; a cancelled `bash` has its process group killed.
pub async fn run_tool(
    name: &str,
    input: &Value,
    cwd: &Path,
    cancel: CancellationToken,
) -> ToolOutcome {
    run_tool_in(name, input, cwd, None, cancel).await
}

/// [`run_tool`], keeping in `outputs` (the session's directory) the whole
/// output of a `bash` command whose output was cut to [`BASH_MAX_BYTES`];
/// the result names the file.
pub async fn run_tool_in(
    name: &str,
    input: &Value,
    cwd: &Path,
    outputs: Option<&Path>,
    cancel: CancellationToken,
) -> ToolOutcome {
    let args = match Args::new(input) {
        Ok(args) => args,
        Err(e) => return ToolOutcome::error(format!("{name}: {e}")),
    };
    let result = match name {
        "read" => read(&args, cwd).await,
        "write" => write(&args, cwd).await,
        "edit" => edit(&args, cwd).await,
        "bash" => bash(&args, cwd, outputs, cancel).await,
        "grep" => search::grep(&args, cwd, cancel).await,
        "find" => search::find(&args, cwd, cancel).await,
        "ls" => search::ls(&args, cwd).await,
        other => {
            let known: Vec<String> = tool_specs().into_iter().map(|s| s.name).collect();
            return ToolOutcome::error(format!(
                "unknown tool {other:?}; the tools are {}",
                known.join(", ")
            ));
        }
    };
    result.unwrap_or_else(|e| {
        let prefix = format!("{name}: ");
        ToolOutcome::error(if e.starts_with(&prefix) {
            e
        } else {
            prefix + &e
        })
    })
}

/// Leaves the worker's own variables (its channel's token among them) out
/// of a process it starts for a tool or an MCP server.
pub(crate) fn without_worker_env(cmd: &mut tokio::process::Command) {
    for (key, _) in std::env::vars_os() {
        if key.as_encoded_bytes().starts_with(b"PI_WORKER_") {
            cmd.env_remove(key);
        }
    }
}

/// A tool's input object.
struct Args<'a>(&'a [(String, Value)]);

impl<'a> Args<'a> {
    fn new(input: &'a Value) -> Result<Self, String> {
        match input {
            Value::Map(entries) => Ok(Self(entries)),
            Value::Text(raw) => Err(format!(
                "the arguments are not valid JSON: {}",
                super::text::excerpt(raw, 300)
            )),
            other => Err(format!(
                "the arguments must be a JSON object, not {}",
                other.kind()
            )),
        }
    }

    fn get(&self, names: &[&str]) -> Option<&'a Value> {
        names
            .iter()
            .find_map(|n| self.0.iter().find(|(k, _)| k == n).map(|(_, v)| v))
    }

    fn string(&self, names: &[&str]) -> Result<Option<&'a str>, String> {
        match self.get(names) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Text(s)) => Ok(Some(s)),
            Some(other) => Err(format!(
                "{} must be a string, not {}",
                names[0],
                other.kind()
            )),
        }
    }

    fn required(&self, names: &[&str]) -> Result<&'a str, String> {
        self.string(names)?
            .ok_or_else(|| format!("missing required argument {}", names[0]))
    }

    fn number(&self, name: &str) -> Result<Option<f64>, String> {
        match self.get(&[name]) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Int(i)) => Ok(Some(*i as f64)),
            Some(Value::Float(f)) => Ok(Some(*f)),
            Some(Value::Text(s)) => s
                .trim()
                .parse::<f64>()
                .map(Some)
                .map_err(|_| format!("{name} must be a number, not {s:?}")),
            Some(other) => Err(format!("{name} must be a number, not {}", other.kind())),
        }
    }

    fn flag(&self, name: &str) -> Result<Option<bool>, String> {
        match self.get(&[name]) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::Text(s)) if s == "true" || s == "false" => Ok(Some(s == "true")),
            Some(other) => Err(format!(
                "{name} must be true or false, not {}",
                other.kind()
            )),
        }
    }

    /// A whole number ≥ 0 (0 when absent).
    fn count_or_zero(&self, name: &str) -> Result<usize, String> {
        match self.number(name)? {
            None => Ok(0),
            Some(n) if n >= 0.0 && n.fract() == 0.0 => Ok(n as usize),
            Some(n) => Err(format!("{name} must be a whole number ≥ 0, not {n}")),
        }
    }

    fn count(&self, name: &str) -> Result<Option<usize>, String> {
        match self.number(name)? {
            None => Ok(None),
            Some(n) if n >= 1.0 && n.fract() == 0.0 => Ok(Some(n as usize)),
            Some(n) => Err(format!("{name} must be a whole number ≥ 1, not {n}")),
        }
    }
}

/// `path` resolved against `cwd` (`~/` is the home directory).
fn resolve(cwd: &Path, path: &str) -> PathBuf {
    let path = path.strip_prefix('@').unwrap_or(path);
    if let Some(rest) = path.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    cwd.join(path)
}

// ---- read ----------------------------------------------------------------------

fn image_type(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

async fn read(args: &Args<'_>, cwd: &Path) -> Result<ToolOutcome, String> {
    let shown = args.required(&["path", "file_path"])?.to_string();
    let offset = args.count("offset")?.unwrap_or(1);
    let limit = args.count("limit")?;
    let path = resolve(cwd, &shown);
    tokio::task::spawn_blocking(move || read_blocking(&path, &shown, offset, limit))
        .await
        .map_err(|e| format!("read: {e}"))?
}

fn read_blocking(
    path: &Path,
    shown: &str,
    offset: usize,
    limit: Option<usize>,
) -> Result<ToolOutcome, String> {
    let meta = std::fs::metadata(path).map_err(|e| io_error("read", shown, &e))?;
    if meta.is_dir() {
        return Err(format!(
            "read: {shown} is a directory; use bash (ls) to list it"
        ));
    }
    let mut file = std::fs::File::open(path).map_err(|e| io_error("read", shown, &e))?;
    let mut head = Vec::with_capacity(8192);
    (&mut file)
        .take(8192)
        .read_to_end(&mut head)
        .map_err(|e| io_error("read", shown, &e))?;
    if let Some(mime_type) = image_type(&head) {
        if meta.len() > IMAGE_MAX_BYTES {
            return Err(format!(
                "read: {shown} is an image of {} bytes; the limit is {IMAGE_MAX_BYTES} bytes",
                meta.len()
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| io_error("read", shown, &e))?;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return Ok(ToolOutcome {
            content: vec![
                Content::Text {
                    text: format!("Read image file {shown} [{mime_type}]"),
                },
                Content::Image {
                    data,
                    mime_type: mime_type.to_string(),
                },
            ],
            details: Some(pi_config::json::from_json(
                &json!({"path": shown, "mimeType": mime_type, "bytes": bytes.len()}),
            )),
            is_error: false,
        });
    }
    if head.contains(&0) {
        return Err(format!(
            "read: {shown} looks like a binary file ({} bytes); use bash (file, xxd) to inspect it",
            meta.len()
        ));
    }
    drop(head);
    let file = std::fs::File::open(path).map_err(|e| io_error("read", shown, &e))?;
    let mut reader = std::io::BufReader::new(file);
    let max_lines = limit.unwrap_or(READ_MAX_LINES);
    let mut text = String::new();
    let mut line = Vec::new();
    let mut total = 0usize; // lines in the file
    let mut last_shown = 0usize;
    let mut byte_cut = false;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| io_error("read", shown, &e))?;
        if n == 0 {
            break;
        }
        total += 1;
        let wanted = total >= offset && total < offset + max_lines;
        if !wanted || byte_cut {
            continue;
        }
        let piece = String::from_utf8_lossy(&line);
        if text.len() + piece.len() > READ_MAX_BYTES {
            if text.is_empty() {
                // One line longer than the whole budget: show its beginning.
                text.push_str(&super::text::excerpt(&piece, READ_MAX_BYTES));
                last_shown = total;
            }
            byte_cut = true;
            continue;
        }
        text.push_str(&piece);
        last_shown = total;
    }
    if total == 0 {
        return Ok(ToolOutcome::ok(
            String::new(),
            json!({"path": shown, "totalLines": 0, "truncated": false}),
        ));
    }
    if offset > total {
        return Err(format!(
            "read: offset {offset} is beyond the end of {shown} ({total} lines)"
        ));
    }
    let more = last_shown < total;
    if more {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let why = if byte_cut { " (50 KB limit)" } else { "" };
        text.push_str(&format!(
            "\n[Showing lines {offset}-{last_shown} of {total}{why}. Use offset={} to continue.]",
            last_shown + 1
        ));
    }
    let details = json!({
        "path": shown,
        "totalLines": total,
        "startLine": offset,
        "endLine": last_shown,
        "truncated": more,
    });
    Ok(ToolOutcome::ok(text, details))
}

fn io_error(tool: &str, shown: &str, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => format!("{tool}: {shown}: no such file or directory"),
        std::io::ErrorKind::PermissionDenied => format!("{tool}: {shown}: permission denied"),
        _ => format!("{tool}: {shown}: {e}"),
    }
}

// ---- write ---------------------------------------------------------------------

async fn write(args: &Args<'_>, cwd: &Path) -> Result<ToolOutcome, String> {
    let shown = args.required(&["path", "file_path"])?;
    let content = args.required(&["content"])?;
    let path = resolve(cwd, shown);
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| io_error("write", shown, &e))?;
    }
    let existed = tokio::fs::try_exists(&path).await.unwrap_or(false);
    tokio::fs::write(&path, content)
        .await
        .map_err(|e| io_error("write", shown, &e))?;
    let verb = if existed { "Replaced" } else { "Created" };
    Ok(ToolOutcome::ok(
        format!("{verb} {shown} ({} bytes)", content.len()),
        json!({"path": shown, "bytes": content.len(), "created": !existed}),
    ))
}

// ---- edit ----------------------------------------------------------------------

async fn edit(args: &Args<'_>, cwd: &Path) -> Result<ToolOutcome, String> {
    let shown = args.required(&["path", "file_path"])?;
    let old = args.required(&["old_text", "oldText", "old_string"])?;
    let new = args.required(&["new_text", "newText", "new_string"])?;
    if old.is_empty() {
        return Err("edit: old_text is empty; use write to create or replace a whole file".into());
    }
    if old == new {
        return Err("edit: old_text and new_text are identical; nothing would change".into());
    }
    let path = resolve(cwd, shown);
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|e| io_error("edit", shown, &e))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("edit: {shown} is not UTF-8 text; edit it with bash or write"))?;
    let (mut old, mut new) = (old.to_string(), new.to_string());
    let mut count = text.matches(old.as_str()).count();
    if count == 0 && text.contains("\r\n") && old.contains('\n') && !old.contains("\r\n") {
        // The model wrote `\n` line ends for a file with `\r\n` ones.
        let (o, n) = (old.replace('\n', "\r\n"), new.replace('\n', "\r\n"));
        count = text.matches(o.as_str()).count();
        (old, new) = (o, n);
    }
    match count {
        0 => {
            return Err(format!(
                "edit: old_text was not found in {shown}. It must match the file exactly, \
                 whitespace and indentation included; read the file to see its current content."
            ));
        }
        1 => {}
        n => {
            return Err(format!(
                "edit: old_text matches {n} places in {shown}; include more surrounding lines so \
                 that it matches exactly one."
            ));
        }
    }
    let at = text.find(old.as_str()).expect("counted once");
    let line = text[..at].matches('\n').count() + 1;
    let updated = format!("{}{}{}", &text[..at], new, &text[at + old.len()..]);
    tokio::fs::write(&path, &updated)
        .await
        .map_err(|e| io_error("edit", shown, &e))?;
    let diff = diff(&old, &new, line);
    Ok(ToolOutcome::ok(
        format!(
            "Edited {shown}: replaced {} lines at line {line}.",
            old.lines().count().max(1)
        ),
        json!({"path": shown, "line": line, "diff": diff}),
    ))
}

/// A small `-`/`+` diff of the replaced lines (capped).
fn diff(old: &str, new: &str, line: usize) -> String {
    let mut out = format!("@@ line {line} @@\n");
    for l in old.lines() {
        out.push('-');
        out.push_str(l);
        out.push('\n');
    }
    for l in new.lines() {
        out.push('+');
        out.push_str(l);
        out.push('\n');
    }
    super::text::excerpt(&out, 8 * 1024)
}

// ---- bash ----------------------------------------------------------------------

/// Where a session's directory records the process groups of its running
/// `bash` commands: one file per group, named by its id, holding its
/// leader's start time (`/proc/<pid>/stat`, field 22).
pub const GROUPS: &str = "tool-groups";

/// The script `bash -c` runs with the command as `$1`: the command starts
/// once a line comes on stdin, with stdin then from `/dev/null`; if stdin
/// closes first, it never starts.
const GATE: &str = r#"read -r _ && exec bash -c "$1" </dev/null"#;

/// Kills a process group (SIGKILL) when dropped while armed, and keeps its
/// record in the session's directory while armed.
pub(crate) struct GroupKill {
    pid: Option<rustix::process::Pid>,
    record: Option<PathBuf>,
}

impl GroupKill {
    /// Arms for `pid`'s group, recorded under `session` if given.
    pub(crate) fn new(pid: Option<rustix::process::Pid>, session: Option<&Path>) -> Self {
        let record = pid.zip(session).and_then(|(pid, session)| {
            let dir = session.join(GROUPS);
            let started = start_time(pid.as_raw_nonzero().get())?;
            std::fs::create_dir_all(&dir).ok()?;
            let path = dir.join(pid.as_raw_nonzero().to_string());
            std::fs::write(&path, started.to_string()).ok()?;
            Some(path)
        });
        Self { pid, record }
    }

    fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        self.forget();
    }

    /// Disarms: the group is left alone, and no longer recorded.
    fn forget(&mut self) {
        self.pid = None;
        if let Some(record) = self.record.take() {
            let _ = std::fs::remove_file(record);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The start time of process `pid` (clock ticks after boot), if it runs.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from the third (state) on; the start time is the 22nd.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the process groups of `bash` commands a dead worker of the session
/// left running (recorded under `session`, see [`GROUPS`]), and forgets
/// the records. Returns how many groups were killed. Run by the session's
/// next worker, holding its lock, before the session runs again.
///
/// A group is killed unless its id now names another process's group: if
/// its leader runs, only when its start time is the recorded one; if the
/// leader is gone, the id cannot have been reused while members are left
/// (Linux keeps a process group's id while the group has a member), so a
/// kill reaches only them, or nothing.
pub fn reap_tool_groups(session: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(session.join(GROUPS)) else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let recorded = std::fs::read_to_string(&path).ok();
        let _ = std::fs::remove_file(&path);
        let pid = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok());
        let (Some(pid), Some(recorded)) =
            (pid, recorded.and_then(|r| r.trim().parse::<u64>().ok()))
        else {
            continue;
        };
        let reused = start_time(pid).is_some_and(|now| now != recorded);
        if let Some(group) = rustix::process::Pid::from_raw(pid)
            && !reused
            && rustix::process::kill_process_group(group, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// The last `cap` bytes of a stream, and how many came in all.
struct Tail {
    buf: Vec<u8>,
    cap: usize,
    total: u64,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > 2 * self.cap {
            let cut = self.buf.len() - self.cap;
            self.buf.drain(..cut);
        }
    }

    /// The kept text, starting on a character (and if near, a line) boundary.
    fn text(&self) -> (String, u64) {
        let mut start = self.buf.len().saturating_sub(self.cap);
        if self.total > self.cap as u64 {
            if let Some(nl) = self.buf[start..]
                .iter()
                .take(1024)
                .position(|b| *b == b'\n')
            {
                start += nl + 1;
            }
            while start < self.buf.len() && (self.buf[start] & 0xc0) == 0x80 {
                start += 1;
            }
        }
        let kept = &self.buf[start..];
        (
            String::from_utf8_lossy(kept).into_owned(),
            self.total - kept.len() as u64,
        )
    }
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
    Cancelled,
}

/// The whole output of a `bash` command, written as it arrives, kept only
/// if the result had to cut it.
struct Spill {
    path: PathBuf,
    file: Option<tokio::fs::File>,
}

impl Spill {
    async fn open(dir: &Path) -> Option<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = dir.join("bash-output");
        tokio::fs::create_dir_all(&dir).await.ok()?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{stamp}-{}-{n}.log", std::process::id()));
        let file = tokio::fs::File::create(&path).await.ok()?;
        Some(Self {
            path,
            file: Some(file),
        })
    }

    async fn write(&mut self, bytes: &[u8]) {
        if let Some(file) = &mut self.file
            && file.write_all(bytes).await.is_err()
        {
            self.file = None; // a full disk costs the copy, not the command
        }
    }

    /// The path of the whole output if it was cut and fully kept; else the file goes.
    async fn finish(mut self, cut: bool) -> Option<PathBuf> {
        let kept = match self.file.take() {
            Some(mut file) => file.flush().await.is_ok(),
            None => false,
        };
        if cut && kept {
            return Some(self.path);
        }
        let _ = tokio::fs::remove_file(&self.path).await;
        None
    }
}

/// Output read from the command: its tail for the result, all of it to the spill file.
async fn keep(tail: &mut Tail, spill: &mut Option<Spill>, bytes: &[u8]) {
    tail.push(bytes);
    if let Some(spill) = spill {
        spill.write(bytes).await;
    }
}

async fn bash(
    args: &Args<'_>,
    cwd: &Path,
    outputs: Option<&Path>,
    cancel: CancellationToken,
) -> Result<ToolOutcome, String> {
    let command = args.required(&["command", "cmd"])?;
    let timeout = match args.number("timeout")? {
        None => limits::BASH_DEFAULT_TIMEOUT,
        Some(s) if s.is_finite() && s > 0.0 => {
            Duration::from_secs_f64(s.min(limits::BASH_MAX_TIMEOUT.as_secs_f64()))
        }
        Some(s) => {
            return Err(format!(
                "bash: timeout must be a number of seconds > 0, not {s}"
            ));
        }
    };
    if !cwd.is_dir() {
        return Err(format!(
            "bash: the working directory {} does not exist",
            cwd.display()
        ));
    }
    let (reader, writer) =
        std::io::pipe().map_err(|e| format!("bash: cannot create a pipe: {e}"))?;
    let writer2 = writer
        .try_clone()
        .map_err(|e| format!("bash: cannot create a pipe: {e}"))?;
    let mut cmd = tokio::process::Command::new("bash");
    // Not a login shell: a profile can be slow or block (a profile that waits
    // on a lock held by another shell stalls every command), and the worker's
    // environment is already the user's. The command waits at a gate (a line
    // on its stdin) until its group is recorded: a worker killed before that
    // closes the pipe, and the command never starts, unrecorded.
    cmd.arg("-c")
        .arg(GATE)
        .arg("bash")
        .arg(command)
        .current_dir(cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(writer)
        .stderr(writer2)
        .process_group(0)
        .kill_on_drop(true);
    without_worker_env(&mut cmd);
    let spawned = cmd.spawn();
    drop(cmd); // closes our copies of the pipe's write end
    let mut child = spawned.map_err(|e| format!("bash: cannot start bash: {e}"))?;
    let mut group = GroupKill::new(
        child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32)),
        outputs,
    );
    if let Some(mut gate) = child.stdin.take() {
        // A shell that died at once has closed it: its exit status tells.
        let _ = gate.write_all(b"\n").await;
    }
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(reader.into())
        .map_err(|e| format!("bash: cannot read the command's output: {e}"))?;
    let mut tail = Tail {
        buf: Vec::new(),
        cap: BASH_MAX_BYTES,
        total: 0,
    };
    let mut spill = match outputs {
        Some(dir) => Spill::open(dir).await,
        None => None,
    };
    let mut chunk = vec![0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    let mut open = true;
    let mut status = None;
    let ending = loop {
        if let Some(status) = status
            && !open
        {
            break Ending::Exited(status);
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => break Ending::Cancelled,
            () = tokio::time::sleep_until(deadline) => break Ending::TimedOut,
            n = pipe.read(&mut chunk), if open => match n {
                Ok(0) | Err(_) => open = false,
                Ok(n) => keep(&mut tail, &mut spill, &chunk[..n]).await,
            },
            s = child.wait(), if status.is_none() => match s {
                Ok(s) => {
                    status = Some(s);
                    // The shell is gone; background processes it left may hold the pipe open.
                    let grace = tokio::time::Instant::now() + limits::BASH_PIPE_GRACE;
                    while open {
                        match tokio::time::timeout_at(grace, pipe.read(&mut chunk)).await {
                            Ok(Ok(n)) if n > 0 => keep(&mut tail, &mut spill, &chunk[..n]).await,
                            _ => open = false,
                        }
                    }
                }
                Err(e) => return Err(format!("bash: cannot wait for the command: {e}")),
            },
        }
    };
    match ending {
        Ending::Exited(_) => group.forget(), // leave what it started in the background alone
        Ending::TimedOut | Ending::Cancelled => {
            group.kill();
            let _ = tokio::time::timeout(limits::BASH_REAP, child.wait()).await;
        }
    }
    let (output, cut) = tail.text();
    let full = match spill {
        Some(spill) => spill.finish(cut > 0).await,
        None => None,
    };
    Ok(bash_outcome(
        &ending, output, cut, tail.total, full, timeout,
    ))
}

/// What the model is told of a command: its output's tail (and where the
/// whole is when it was cut), and how it ended.
fn bash_outcome(
    ending: &Ending,
    output: String,
    cut: u64,
    total: u64,
    full: Option<std::path::PathBuf>,
    timeout: Duration,
) -> ToolOutcome {
    let mut text = String::new();
    if cut > 0 {
        let whole = match &full {
            Some(path) => format!(" The full output is in {}.", path.display()),
            None => String::new(),
        };
        text.push_str(&format!(
            "[Output truncated: the first {cut} of {} bytes were cut; showing the last {} bytes.{whole}]\n",
            total,
            total - cut
        ));
    }
    text.push_str(&output);
    if total == 0 {
        text.push_str("(no output)");
    }
    let secs = timeout.as_secs_f64();
    let (exit_code, is_error, note) = match ending {
        Ending::Exited(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(s)) {
            (Some(0), _) => (Some(0), false, None),
            (Some(code), _) => (
                Some(code),
                true,
                Some(format!("Command exited with code {code}")),
            ),
            (None, Some(sig)) => (
                None,
                true,
                Some(format!("Command was killed by signal {sig}")),
            ),
            (None, None) => (None, true, Some("Command ended abnormally".to_string())),
        },
        Ending::TimedOut => (
            None,
            true,
            Some(format!(
                "Command timed out after {secs} seconds; its process group was killed"
            )),
        ),
        Ending::Cancelled => (
            None,
            true,
            Some("Command aborted; its process group was killed".to_string()),
        ),
    };
    if let Some(note) = note {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push('\n');
        text.push_str(&note);
    }
    let details = json!({
        "exitCode": exit_code,
        "timedOut": matches!(ending, Ending::TimedOut),
        "cancelled": matches!(ending, Ending::Cancelled),
        "truncated": cut > 0,
        "totalBytes": total,
        "fullOutputPath": full.as_ref().map(|p| p.display().to_string()),
    });
    ToolOutcome {
        content: vec![Content::Text { text }],
        details: Some(pi_config::json::from_json(&details)),
        is_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// A record whose start time is not the running leader's names a reused
    /// id: that group is left alone; the true one is killed.
    #[test]
    fn reaping_kills_recorded_groups_and_spares_a_reused_id() {
        let session = std::env::temp_dir().join(format!("pi-reap-{}", std::process::id()));
        let groups = session.join(GROUPS);
        std::fs::create_dir_all(&groups).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let started = start_time(pid).expect("it runs");
        let record = groups.join(pid.to_string());

        std::fs::write(&record, (started + 1).to_string()).unwrap();
        assert_eq!(reap_tool_groups(&session), 0, "another process's group");
        assert!(child.try_wait().unwrap().is_none(), "left alone");
        assert!(!record.exists(), "the record is forgotten");

        std::fs::write(&record, started.to_string()).unwrap();
        assert_eq!(reap_tool_groups(&session), 1);
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(!record.exists());
        let _ = std::fs::remove_dir_all(&session);
    }

    /// A `bash` command whose worker died before it recorded the group (its
    /// gate's pipe closed with no line) never starts; a line starts it, with
    /// nothing left on its stdin.
    #[test]
    fn a_gated_command_starts_only_when_let_through() {
        let dir = std::env::temp_dir().join(format!("pi-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |line: &[u8]| {
            let mut child = std::process::Command::new("bash")
                .args(["-c", GATE, "bash", "cat > ran; echo $0 >> ran"])
                .current_dir(&dir)
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut gate = child.stdin.take().unwrap();
            std::io::Write::write_all(&mut gate, line).unwrap();
            drop(gate);
            child.wait().unwrap()
        };
        assert!(!run(b"").success());
        assert!(!dir.join("ran").exists(), "a closed gate runs nothing");
        assert!(run(b"\nleft over\n").success());
        let ran = std::fs::read_to_string(dir.join("ran")).unwrap();
        assert_eq!(ran, "bash\n", "stdin is empty and $0 is bash");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
