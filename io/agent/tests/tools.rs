//! The coding tools on a temporary directory.

use base64::Engine as _;
use kernel::protocol::Content;
use kernel::wire::Value;
use pi_agent::{CancellationToken, ToolOutcome, run_tool, run_tool_in, tool_specs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pi-agent-tools-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn args(pairs: &[(&str, Value)]) -> Value {
    Value::Map(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

fn s(text: &str) -> Value {
    Value::text(text)
}

async fn run(name: &str, input: Value, cwd: &Path) -> ToolOutcome {
    run_tool(name, &input, cwd, CancellationToken::new()).await
}

fn text(outcome: &ToolOutcome) -> String {
    outcome
        .content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn detail(outcome: &ToolOutcome, key: &str) -> Value {
    outcome
        .details
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
        .unwrap_or(Value::Null)
}

/// True once `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_for_file(path: &Path) -> String {
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} never appeared", path.display());
}

async fn wait_gone(pid: i32) -> bool {
    for _ in 0..100 {
        if gone(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[test]
fn specs_describe_every_tool_with_object_schemas() {
    let specs = tool_specs();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["read", "write", "edit", "bash", "grep", "find", "ls"]
    );
    for spec in specs {
        assert_eq!(spec.parameters["type"], "object");
        assert!(!spec.description.is_empty());
        // Every tool but `ls` (whose path defaults to the cwd) requires something.
        assert_eq!(
            spec.parameters["required"]
                .as_array()
                .is_some_and(|r| !r.is_empty()),
            spec.name != "ls",
            "{}",
            spec.name
        );
    }
}

#[tokio::test]
async fn read_with_offset_and_limit() {
    let dir = TempDir::new();
    let lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    std::fs::write(dir.0.join("ten.txt"), &lines).unwrap();
    let out = run("read", args(&[("path", s("ten.txt"))]), &dir.0).await;
    assert!(!out.is_error);
    assert_eq!(text(&out), lines);
    let out = run(
        "read",
        args(&[
            ("path", s("ten.txt")),
            ("offset", Value::Int(3)),
            ("limit", Value::Int(2)),
        ]),
        &dir.0,
    )
    .await;
    assert!(!out.is_error, "{}", text(&out));
    assert_eq!(
        text(&out),
        "line 3\nline 4\n\n[Showing lines 3-4 of 10. Use offset=5 to continue.]"
    );
    assert_eq!(detail(&out, "totalLines"), Value::Int(10));
    let out = run(
        "read",
        args(&[("path", s("ten.txt")), ("offset", Value::Int(11))]),
        &dir.0,
    )
    .await;
    assert!(out.is_error);
    assert!(
        text(&out).contains("offset 11 is beyond the end of ten.txt (10 lines)"),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn read_truncates_long_files_with_a_note() {
    let dir = TempDir::new();
    let many: String = (1..=3000).map(|i| format!("{i}\n")).collect();
    std::fs::write(dir.0.join("many.txt"), many).unwrap();
    let out = run("read", args(&[("path", s("many.txt"))]), &dir.0).await;
    let t = text(&out);
    assert!(t.starts_with("1\n2\n") && t.contains("\n2000\n"), "{t}");
    assert!(
        t.ends_with("[Showing lines 1-2000 of 3000. Use offset=2001 to continue.]"),
        "{t}"
    );
    assert_eq!(detail(&out, "truncated"), Value::Bool(true));

    let wide: String = (0..100)
        .map(|i| format!("{i:04}{}\n", "x".repeat(995)))
        .collect();
    std::fs::write(dir.0.join("wide.txt"), wide).unwrap();
    let out = run("read", args(&[("path", s("wide.txt"))]), &dir.0).await;
    let t = text(&out);
    assert!(t.len() < 52 * 1024, "{}", t.len());
    assert!(
        t.ends_with("[Showing lines 1-51 of 100 (50 KB limit). Use offset=52 to continue.]"),
        "{}",
        &t[t.len() - 100..]
    );
}

#[tokio::test]
async fn read_returns_images_as_image_parts() {
    let dir = TempDir::new();
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend_from_slice(&[0, 0, 0, 13, b'I', b'H', b'D', b'R', 0, 1, 2, 3, 255]);
    std::fs::write(dir.0.join("pic.png"), &png).unwrap();
    let out = run("read", args(&[("path", s("pic.png"))]), &dir.0).await;
    assert!(!out.is_error);
    let Some(Content::Image { data, mime_type }) = out.content.get(1) else {
        panic!("{:?}", out.content)
    };
    assert_eq!(mime_type, "image/png");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        png
    );
    // Magic bytes, not the extension, decide.
    std::fs::write(dir.0.join("photo.dat"), b"\xff\xd8\xff\xe0rest").unwrap();
    let out = run("read", args(&[("path", s("photo.dat"))]), &dir.0).await;
    assert!(
        matches!(&out.content[1], Content::Image { mime_type, .. } if mime_type == "image/jpeg")
    );
}

#[tokio::test]
async fn read_errors_are_clear() {
    let dir = TempDir::new();
    let out = run("read", args(&[("path", s("nope.txt"))]), &dir.0).await;
    assert!(out.is_error);
    assert_eq!(text(&out), "read: nope.txt: no such file or directory");
    std::fs::write(dir.0.join("blob.bin"), b"\x00\x01\x02binary").unwrap();
    let out = run("read", args(&[("path", s("blob.bin"))]), &dir.0).await;
    assert!(
        out.is_error && text(&out).contains("binary"),
        "{}",
        text(&out)
    );
    let out = run("read", args(&[("path", s("."))]), &dir.0).await;
    assert!(out.is_error && text(&out).contains("is a directory"));
}

#[tokio::test]
async fn write_creates_parent_directories() {
    let dir = TempDir::new();
    let out = run(
        "write",
        args(&[("path", s("a/b/c.txt")), ("content", s("hello\n"))]),
        &dir.0,
    )
    .await;
    assert!(!out.is_error, "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(dir.0.join("a/b/c.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(text(&out), "Created a/b/c.txt (6 bytes)");
    let abs = dir.0.join("a/b/c.txt").display().to_string();
    let out = run(
        "write",
        args(&[("path", s(&abs)), ("content", s("bye"))]),
        Path::new("/"),
    )
    .await;
    assert!(text(&out).starts_with("Replaced "));
    assert_eq!(
        std::fs::read_to_string(dir.0.join("a/b/c.txt")).unwrap(),
        "bye"
    );
}

#[tokio::test]
async fn edit_replaces_exactly_once_and_explains_misses() {
    let dir = TempDir::new();
    let file = dir.0.join("main.rs");
    std::fs::write(&file, "fn a() {}\nfn b() {}\nfn b() {}\n").unwrap();
    let edit = |old: &str, new: &str| {
        args(&[
            ("path", s("main.rs")),
            ("old_text", s(old)),
            ("new_text", s(new)),
        ])
    };
    let out = run("edit", edit("fn a() {}", "fn a() { todo!() }"), &dir.0).await;
    assert!(!out.is_error, "{}", text(&out));
    assert_eq!(detail(&out, "line"), Value::Int(1));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "fn a() { todo!() }\nfn b() {}\nfn b() {}\n"
    );

    let out = run("edit", edit("fn c() {}", "x"), &dir.0).await;
    assert!(out.is_error);
    assert!(
        text(&out).starts_with("edit: old_text was not found in main.rs"),
        "{}",
        text(&out)
    );

    let out = run("edit", edit("fn b() {}", "x"), &dir.0).await;
    assert!(out.is_error);
    assert!(
        text(&out).starts_with("edit: old_text matches 2 places in main.rs"),
        "{}",
        text(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "fn a() { todo!() }\nfn b() {}\nfn b() {}\n"
    );

    // CRLF files accept LF old_text.
    std::fs::write(&file, "one\r\ntwo\r\nthree\r\n").unwrap();
    let out = run("edit", edit("one\ntwo", "1\n2"), &dir.0).await;
    assert!(!out.is_error, "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "1\r\n2\r\nthree\r\n"
    );
}

#[tokio::test]
async fn bad_input_and_unknown_tools_are_errors() {
    let dir = TempDir::new();
    let out = run("fly", args(&[]), &dir.0).await;
    assert!(out.is_error);
    assert_eq!(
        text(&out),
        "unknown tool \"fly\"; the tools are read, write, edit, bash, grep, find, ls"
    );
    let out = run("read", args(&[]), &dir.0).await;
    assert_eq!(text(&out), "read: missing required argument path");
    let out = run("read", args(&[("path", Value::Int(3))]), &dir.0).await;
    assert_eq!(text(&out), "read: path must be a string, not integer");
    let out = run("bash", Value::text("{\"command\": \"ls"), &dir.0).await;
    assert!(out.is_error && text(&out).starts_with("bash: the arguments are not valid JSON"));
    let out = run(
        "read",
        args(&[("path", s("x")), ("limit", Value::Int(0))]),
        &dir.0,
    )
    .await;
    assert!(
        text(&out).contains("limit must be a whole number ≥ 1"),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn bash_runs_in_cwd_and_interleaves_stdout_and_stderr() {
    let dir = TempDir::new();
    let out = run(
        "bash",
        args(&[("command", s("pwd; echo out; echo err >&2; echo out2"))]),
        &dir.0,
    )
    .await;
    assert!(!out.is_error, "{}", text(&out));
    let want = format!(
        "{}\nout\nerr\nout2\n",
        std::fs::canonicalize(&dir.0).unwrap().display()
    );
    assert_eq!(text(&out), want);
    assert_eq!(detail(&out, "exitCode"), Value::Int(0));
    let out = run(
        "bash",
        args(&[("command", s("echo failing; exit 3"))]),
        &dir.0,
    )
    .await;
    assert!(out.is_error);
    assert_eq!(text(&out), "failing\n\nCommand exited with code 3");
    let out = run("bash", args(&[("command", s("true"))]), &dir.0).await;
    assert_eq!(text(&out), "(no output)");
}

/// A cut `bash` output is kept whole in the session's directory and the
/// result names the file; an output that fits leaves no file behind.
#[tokio::test]
async fn a_cut_bash_output_is_kept_whole_in_the_session_dir() {
    let dir = TempDir::new();
    let session = dir.0.join("session");
    std::fs::create_dir_all(&session).unwrap();
    let command = "for i in $(seq 1 20000); do echo \"line $i of the output\"; done";
    let input = args(&[("command", s(command))]);
    let out = run_tool_in(
        "bash",
        &input,
        &dir.0,
        Some(&session),
        CancellationToken::new(),
    )
    .await;
    let Value::Text(path) = detail(&out, "fullOutputPath") else {
        panic!("no path: {:?}", out.details)
    };
    assert!(path.starts_with(&session.join("bash-output").display().to_string()));
    assert!(
        text(&out).contains(&format!("The full output is in {path}.")),
        "{}",
        &text(&out)[..300]
    );
    let whole = std::fs::read_to_string(&path).unwrap();
    assert_eq!(whole.lines().count(), 20000);
    assert!(whole.starts_with("line 1 of the output\n"));
    let short = args(&[("command", s("echo small"))]);
    let out = run_tool_in(
        "bash",
        &short,
        &dir.0,
        Some(&session),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(detail(&out, "fullOutputPath"), Value::Null);
    assert_eq!(
        std::fs::read_dir(session.join("bash-output"))
            .unwrap()
            .count(),
        1,
        "only the cut output is kept"
    );
}

#[tokio::test]
async fn bash_output_is_truncated_to_its_end_with_a_note() {
    let dir = TempDir::new();
    let command = "for i in $(seq 1 20000); do echo \"line $i of the output\"; done; echo END";
    let out = run("bash", args(&[("command", s(command))]), &dir.0).await;
    assert!(!out.is_error);
    let t = text(&out);
    assert!(
        t.starts_with("[Output truncated: the first "),
        "{}",
        &t[..200]
    );
    assert!(t.ends_with("line 20000 of the output\nEND\n"));
    assert!(t.len() <= 51 * 1024, "{}", t.len());
    let total = detail(&out, "totalBytes");
    assert!(matches!(total, Value::Int(n) if n > 400_000), "{total:?}");
    assert_eq!(detail(&out, "truncated"), Value::Bool(true));
    // The kept text starts on a whole line.
    let first_kept = t.lines().nth(1).unwrap();
    assert!(
        first_kept.starts_with("line ") && first_kept.ends_with(" of the output"),
        "{first_kept}"
    );
}

#[tokio::test]
async fn bash_timeout_kills_the_process_group() {
    let dir = TempDir::new();
    let started = Instant::now();
    let command = "sleep 300 & echo $! > child.pid; echo started; wait";
    let out = run(
        "bash",
        // Long enough for the shell to start on a loaded machine.
        args(&[("command", s(command)), ("timeout", Value::Float(2.5))]),
        &dir.0,
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.is_error);
    let t = text(&out);
    assert!(
        t.starts_with("started\n") && t.contains("Command timed out after 2.5 seconds"),
        "{t}"
    );
    assert_eq!(detail(&out, "timedOut"), Value::Bool(true));
    let pid: i32 = wait_for_file(&dir.0.join("child.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_gone(pid).await,
        "background child {pid} survived the timeout"
    );
}

#[tokio::test]
async fn bash_cancel_kills_the_process_group() {
    let dir = TempDir::new();
    let cancel = CancellationToken::new();
    let cwd = dir.0.clone();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let input = args(&[("command", s("sleep 300 & echo $! > child.pid; wait"))]);
            run_tool("bash", &input, &cwd, cancel).await
        }
    });
    let pid: i32 = wait_for_file(&dir.0.join("child.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(!gone(pid));
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("prompt")
        .unwrap();
    assert!(out.is_error);
    assert!(text(&out).contains("Command aborted"), "{}", text(&out));
    assert!(
        wait_gone(pid).await,
        "background child {pid} survived the cancellation"
    );
}

#[tokio::test]
async fn dropping_a_bash_run_kills_the_process_group() {
    let dir = TempDir::new();
    let cwd = dir.0.clone();
    let task = tokio::spawn(async move {
        let input = args(&[("command", s("sleep 300 & echo $! > child.pid; wait"))]);
        run_tool("bash", &input, &cwd, CancellationToken::new()).await
    });
    let pid: i32 = wait_for_file(&dir.0.join("child.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    task.abort();
    let _ = task.await;
    assert!(
        wait_gone(pid).await,
        "background child {pid} survived the abort"
    );
}

/// A generated tree: sources, a .gitignore'd build dir, a hidden dir, a
/// binary file, and `.git`.
fn tree() -> TempDir {
    let dir = TempDir::new();
    let root = &dir.0;
    for (path, text) in [
        (".gitignore", "target/\n*.log\n"),
        (
            "src/main.rs",
            "fn main() {\n    let needle = 1;\n    println!(\"{needle}\");\n}\n",
        ),
        (
            "src/lib/util.rs",
            "// Needle in the lib\npub fn util() {}\n",
        ),
        ("target/debug/out.rs", "let needle = 2;\n"),
        ("run.log", "needle in a log\n"),
        (".github/ci.yml", "needle: yes\n"),
        (".git/config", "needle = git\n"),
        ("README.md", "# Project\n"),
    ] {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::write(root.join("blob.bin"), b"needle\x00\x01\x02").unwrap();
    dir
}

#[tokio::test]
async fn grep_respects_gitignore_skips_binaries_and_git_and_bounds_its_output() {
    let dir = tree();
    let out = run("grep", args(&[("pattern", s("needle"))]), &dir.0).await;
    assert!(!out.is_error, "{}", text(&out));
    let t = text(&out);
    let mut lines: Vec<&str> = t.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            ".github/ci.yml:1: needle: yes",
            "src/main.rs:2:     let needle = 1;",
            "src/main.rs:3:     println!(\"{needle}\");",
        ],
        "ignored, binary and .git files are skipped; hidden ones are searched"
    );
    let out = run(
        "grep",
        args(&[
            ("pattern", s("NEEDLE")),
            ("ignoreCase", Value::Bool(true)),
            ("glob", s("*.rs")),
        ]),
        &dir.0,
    )
    .await;
    assert_eq!(text(&out).lines().count(), 3, "{}", text(&out));
    let out = run(
        "grep",
        args(&[
            ("pattern", s("needle")),
            ("path", s("src")),
            ("context", Value::Int(1)),
            ("limit", Value::Int(1)),
        ]),
        &dir.0,
    )
    .await;
    let t = text(&out);
    assert!(
        t.contains("main.rs-1- fn main() {") && t.contains("main.rs:2:"),
        "{t}"
    );
    assert!(t.contains("[Results cut at 1 matches"), "{t}");
    assert_eq!(detail(&out, "truncated"), Value::Bool(true));
    let bad = run("grep", args(&[("pattern", s("("))]), &dir.0).await;
    assert!(
        bad.is_error && text(&bad).contains("invalid pattern"),
        "{}",
        text(&bad)
    );
    let none = run("grep", args(&[("pattern", s("zebra"))]), &dir.0).await;
    assert!(!none.is_error && text(&none).starts_with("No matches"));
}

#[tokio::test]
async fn find_matches_globs_and_ls_lists_one_directory() {
    let dir = tree();
    let out = run("find", args(&[("pattern", s("*.rs"))]), &dir.0).await;
    assert_eq!(
        text(&out),
        "src/lib/util.rs\nsrc/main.rs\n",
        "target/ is ignored"
    );
    let out = run(
        "find",
        args(&[("pattern", s("*")), ("limit", Value::Int(2))]),
        &dir.0,
    )
    .await;
    assert!(
        text(&out).contains("[Results cut at 2 paths"),
        "{}",
        text(&out)
    );
    let out = run("ls", args(&[]), &dir.0).await;
    assert_eq!(
        text(&out),
        ".git/\n.github/\n.gitignore\nblob.bin\nREADME.md\nrun.log\nsrc/\ntarget/\n"
    );
    let missing = run("ls", args(&[("path", s("nope"))]), &dir.0).await;
    assert!(missing.is_error, "{}", text(&missing));
}
