//! `grep`, `find` and `ls`: searching the tree as ripgrep does, on its own
//! crates (`ignore` walks, honouring `.gitignore`, `.ignore` and
//! `.git/info/exclude`; `grep-regex` and `grep-searcher` match, skipping
//! binary files). Every result is bounded (a count and [`MAX_BYTES`]) and
//! says what it cut, as `read` does. `.git` itself is never listed.

use super::{Args, ToolOutcome, resolve};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::WalkBuilder;
use ignore::overrides::OverrideBuilder;
use kernel::protocol::Content;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Most bytes of one search result.
pub(super) const MAX_BYTES: usize = 50 * 1024;
/// Longest line shown in a `grep` result.
const MAX_LINE: usize = 500;
/// Default counts.
const GREP_LIMIT: usize = 100;
const FIND_LIMIT: usize = 1000;
const LS_LIMIT: usize = 500;

fn outcome(text: String, details: serde_json::Value) -> ToolOutcome {
    ToolOutcome {
        content: vec![Content::Text { text }],
        details: Some(pi_config::json::from_json(&details)),
        is_error: false,
    }
}

/// `path` for display: relative to `root` where it is inside it.
fn shown(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A walker over `root` honouring ignore files, hidden files included, `.git` left out.
fn walker(root: &Path) -> WalkBuilder {
    let mut builder = WalkBuilder::new(root);
    builder
        .hidden(false)
        .require_git(false)
        .filter_entry(|e| e.file_name() != ".git");
    builder
}

/// `glob` (gitignore syntax) as a matcher rooted at `root`.
fn globs(tool: &str, root: &Path, glob: &str) -> Result<ignore::overrides::Override, String> {
    let invalid = |e: ignore::Error| format!("{tool}: invalid glob {glob:?}: {e}");
    let mut builder = OverrideBuilder::new(root);
    builder.add(glob).map_err(invalid)?;
    builder.build().map_err(invalid)
}

/// Runs `work` on the blocking pool; `cancel` makes it stop early.
async fn blocking<T: Send + 'static>(
    cancel: tokio_util::sync::CancellationToken,
    work: impl FnOnce(&AtomicBool) -> T + Send + 'static,
) -> Result<T, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let watcher = tokio::spawn(async move {
        cancel.cancelled().await;
        flag.store(true, Ordering::Relaxed);
    });
    let result = tokio::task::spawn_blocking(move || work(&stop)).await;
    watcher.abort();
    result.map_err(|e| e.to_string())
}

// ---- grep ------------------------------------------------------------------

/// Collects matches and context lines of one file as `path:n: text` lines.
struct Lines<'a> {
    path: &'a str,
    out: &'a mut String,
    matches: &'a mut usize,
    limit: usize,
    cut: &'a mut bool,
    last_line: Option<u64>,
}

impl Lines<'_> {
    fn line(&mut self, number: Option<u64>, bytes: &[u8], sep: char) -> bool {
        let n = number.unwrap_or(0);
        if let Some(last) = self.last_line
            && n > last + 1
            && sep == '-'
        {
            self.out.push_str("--\n");
        }
        self.last_line = Some(n);
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim_end_matches(['\n', '\r']);
        let mut text = text.to_string();
        if text.chars().count() > MAX_LINE {
            text = text.chars().take(MAX_LINE).collect::<String>() + "…";
        }
        let line = format!("{}{sep}{n}{sep} {text}\n", self.path);
        if self.out.len() + line.len() > MAX_BYTES {
            *self.cut = true;
            return false;
        }
        self.out.push_str(&line);
        true
    }
}

impl Sink for Lines<'_> {
    type Error = std::io::Error;

    fn matched(
        &mut self,
        _: &grep_searcher::Searcher,
        m: &SinkMatch<'_>,
    ) -> Result<bool, Self::Error> {
        if *self.matches >= self.limit {
            *self.cut = true;
            return Ok(false);
        }
        *self.matches += 1;
        Ok(self.line(m.line_number(), m.bytes(), ':'))
    }

    fn context(
        &mut self,
        _: &grep_searcher::Searcher,
        c: &SinkContext<'_>,
    ) -> Result<bool, Self::Error> {
        Ok(self.line(c.line_number(), c.bytes(), '-'))
    }
}

pub(super) async fn grep(
    args: &Args<'_>,
    cwd: &Path,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<ToolOutcome, String> {
    let pattern = args.required(&["pattern"])?.to_owned();
    let path = args.string(&["path"])?.unwrap_or(".").to_owned();
    let glob = args.string(&["glob"])?.map(str::to_owned);
    let ignore_case = args.flag("ignoreCase")?.unwrap_or(false);
    let literal = args.flag("literal")?.unwrap_or(false);
    let context = args.count_or_zero("context")?;
    let limit = args.count("limit")?.unwrap_or(GREP_LIMIT);
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(ignore_case)
        .fixed_strings(literal)
        .build(&pattern)
        .map_err(|e| format!("grep: invalid pattern {pattern:?}: {e}"))?;
    let root = resolve(cwd, &path);
    if !root.exists() {
        return Err(format!("grep: {path} does not exist"));
    }
    blocking(cancel, move |stop| {
        let mut walk = walker(&root);
        if let Some(glob) = &glob {
            walk.overrides(globs("grep", &root, glob)?);
        }
        let mut searcher = SearcherBuilder::new()
            .binary_detection(BinaryDetection::quit(0))
            .line_number(true)
            .before_context(context)
            .after_context(context)
            .build();
        let (mut out, mut matches, mut cut, mut files) = (String::new(), 0, false, 0);
        for entry in walk.build() {
            if stop.load(Ordering::Relaxed) || cut {
                break;
            }
            let Ok(entry) = entry else { continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let display = shown(&root, entry.path());
            let display = if display.is_empty() {
                path.clone()
            } else {
                display
            };
            let before = matches;
            let mut sink = Lines {
                path: &display,
                out: &mut out,
                matches: &mut matches,
                limit,
                cut: &mut cut,
                last_line: None,
            };
            let _ = searcher.search_path(&matcher, entry.path(), &mut sink);
            if matches > before {
                files += 1;
            }
        }
        let mut text = if out.is_empty() {
            format!("No matches for {pattern:?} in {path}.")
        } else {
            out
        };
        if cut {
            text.push_str(&format!(
                "\n[Results cut at {matches} matches (limit {limit}, {} KB): narrow the pattern or path, or raise limit.]",
                MAX_BYTES / 1024
            ));
        }
        if stop.load(Ordering::Relaxed) {
            text.push_str("\n[Search aborted.]");
        }
        Ok(outcome(
            text,
            json!({"matches": matches, "files": files, "truncated": cut}),
        ))
    })
    .await?
}

// ---- find ------------------------------------------------------------------

pub(super) async fn find(
    args: &Args<'_>,
    cwd: &Path,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<ToolOutcome, String> {
    let pattern = args.required(&["pattern"])?.to_owned();
    let path = args.string(&["path"])?.unwrap_or(".").to_owned();
    let limit = args.count("limit")?.unwrap_or(FIND_LIMIT);
    let root = resolve(cwd, &path);
    if !root.is_dir() {
        return Err(format!("find: {path} is not a directory"));
    }
    let globs = globs("find", &root, &pattern)?;
    blocking(cancel, move |stop| {
        let mut found: Vec<String> = Vec::new();
        let mut cut = false;
        for entry in walker(&root).build() {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Ok(entry) = entry else { continue };
            if entry.depth() == 0 {
                continue;
            }
            let is_dir = entry.file_type().is_some_and(|t| t.is_dir());
            if !globs.matched(entry.path(), is_dir).is_whitelist() {
                continue;
            }
            if found.len() >= limit {
                cut = true;
                break;
            }
            let mut name = shown(&root, entry.path());
            if is_dir {
                name.push('/');
            }
            found.push(name);
        }
        found.sort();
        let mut text = String::new();
        for name in &found {
            if text.len() + name.len() + 1 > MAX_BYTES {
                cut = true;
                break;
            }
            text.push_str(name);
            text.push('\n');
        }
        if found.is_empty() {
            text = format!("No files match {pattern:?} in {path}.");
        }
        if cut {
            text.push_str(&format!(
                "\n[Results cut at {} paths (limit {limit}): narrow the pattern or path, or raise limit.]",
                found.len()
            ));
        }
        outcome(text, json!({"count": found.len(), "truncated": cut}))
    })
    .await
}

// ---- ls --------------------------------------------------------------------

pub(super) async fn ls(args: &Args<'_>, cwd: &Path) -> Result<ToolOutcome, String> {
    let path = args.string(&["path"])?.unwrap_or(".").to_owned();
    let limit = args.count("limit")?.unwrap_or(LS_LIMIT);
    let dir: PathBuf = resolve(cwd, &path);
    tokio::task::spawn_blocking(move || {
        let entries = std::fs::read_dir(&dir).map_err(|e| super::io_error("ls", &path, &e))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|e| {
                let mut name = e.file_name().to_string_lossy().into_owned();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    name.push('/');
                }
                name
            })
            .collect();
        names.sort_by_key(|n| n.to_lowercase());
        let total = names.len();
        let cut = total > limit;
        names.truncate(limit);
        let mut text: String = names.iter().map(|n| format!("{n}\n")).collect();
        if total == 0 {
            text = "(empty directory)".into();
        }
        if cut {
            text.push_str(&format!(
                "\n[{total} entries; the first {limit} shown: raise limit for more.]"
            ));
        }
        Ok(outcome(text, json!({"count": total, "truncated": cut})))
    })
    .await
    .map_err(|e| format!("ls: {e}"))?
}
