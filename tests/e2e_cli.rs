//! The command line: cold activation (racing clients start exactly one
//! server, which retires after its grace), prompt streaming, create, rm,
//! list, models, attach and the demo.

mod common;

use common::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// `serve` processes for this server directory.
fn serve_processes(server: &TestServer) -> Vec<u32> {
    processes_mentioning(server.server_dir.as_os_str().as_encoded_bytes())
        .into_iter()
        .filter(|pid| cmdline_of(*pid).get(1).map(String::as_str) == Some("serve"))
        .collect()
}

/// The log of servers started on demand.
fn auto_log(server: &TestServer) -> String {
    std::fs::read_to_string(server.server_dir.join(format!("server-{SERVER_ID}.log")))
        .unwrap_or_default()
}

fn cold(name: &str, idle_exit_ms: u64) -> TestServer {
    TestServer::new(
        name,
        Options {
            env: vec![("PI_SERVER_IDLE_EXIT_MS".into(), idle_exit_ms.to_string())],
            ..Options::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn cold_activation_race_starts_exactly_one_server() {
    let server = cold("race", 5000);
    let commands = [
        server.cli(&["list", "--json"]),
        server.cli(&["list"]),
        server.cli(&["create", "--cwd", "/tmp", "--name", "racer-1"]),
        server.cli(&["create", "--cwd", "/tmp", "--name", "racer-2"]),
    ];
    let outputs = futures_join(commands.into_iter().map(run).collect()).await;
    for output in outputs {
        output.success();
    }
    let servers = serve_processes(&server);
    assert_eq!(servers.len(), 1, "one server: {servers:?}");
    let log = auto_log(&server);
    assert_eq!(
        log.matches("serving").count(),
        1,
        "one server started:\n{log}"
    );
    assert!(!log.contains("already running"), "{log}");

    // Within the grace, the next client uses the same server.
    let listed = server.run_cli(&["list", "--json"]).await.success();
    let sessions: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let names: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sessionName"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{sessions}");
    assert!(names.contains(&"racer-1") && names.contains(&"racer-2"));
    assert_eq!(serve_processes(&server), servers);
    assert_eq!(auto_log(&server).matches("serving").count(), 1);
}

/// Awaits every future, concurrently.
async fn futures_join<T: Send + 'static>(
    futures: Vec<impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.expect("task"));
    }
    out
}

/// Microseconds since midnight (UTC) of a log line's timestamp
/// (`2026-12-02T14:29:22.083548Z  INFO ...`).
fn log_time(line: &str) -> u64 {
    let time = line
        .split_once('T')
        .and_then(|(_, rest)| rest.split_once('Z'))
        .map(|(time, _)| time)
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"));
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let parts: Vec<u64> = hms.split(':').map(|p| p.parse().unwrap()).collect();
    let micros: u64 = format!("{fraction:0<6}")[..6].parse().unwrap();
    (parts[0] * 3600 + parts[1] * 60 + parts[2]) * 1_000_000 + micros
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_started_server_retires_after_its_grace() {
    let grace = Duration::from_millis(300);
    let server = cold("retire", grace.as_millis() as u64);
    let created = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "short-lived"])
        .await
        .success();
    let id = created.stdout.trim().to_owned();
    assert!(is_uuid_v4(&id), "{created:?}");
    wait_until("the auto-started server to retire", || {
        auto_log(&server).contains("server stopped")
    })
    .await;
    wait_until("the server process to exit", || {
        serve_processes(&server).is_empty()
    })
    .await;
    assert!(server.workers().is_empty(), "its workers are gone too");
    assert!(!server.socket.exists(), "the socket is removed");

    // It retired one grace after it became idle: when the session's worker
    // (disposed when the client left) exited.
    let log = auto_log(&server);
    let idle_at = log
        .lines()
        .filter(|l| l.contains("worker exited"))
        .map(log_time)
        .max()
        .expect("the worker exited");
    let stopped_at = log
        .lines()
        .find(|l| l.contains("server stopped"))
        .map(log_time)
        .unwrap();
    let idle = Duration::from_micros(stopped_at.wrapping_sub(idle_at) % 86_400_000_000);
    assert!(
        idle + Duration::from_millis(2) >= grace,
        "retired {idle:?} after becoming idle; the grace is {grace:?}\n{log}"
    );

    // The session is stored, and the next command starts a new server.
    let listed = server.run_cli(&["list"]).await.success();
    assert!(listed.stdout.contains(&id[..8]), "{listed:?}");
    assert_eq!(auto_log(&server).matches("serving").count(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_started_server_waits_for_a_busy_worker() {
    // The grace only needs to outlast the gap between `create` exiting and
    // the client below connecting.
    let server = cold("busy", 1000);
    let id = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    // A turn of about 2 s whose only client leaves at once.
    let client = server.connect().await;
    client.attach(&id).await.unwrap();
    let mut events = client.events();
    let text = long_text(400);
    tokio::select! {
        result = client.prompt(&id, &text) => panic!("the turn ended too early: {result:?}"),
        _ = next_event(&mut events, "the turn streams", |e| is_delta_of(e, &id)) => {}
    }
    client.close().await;
    let servers = serve_processes(&server);
    assert_eq!(servers.len(), 1);
    wait_exit(servers[0], "the server to retire after the turn").await;
    // Had it retired during the turn, the reply would be stored as aborted.
    let items = stored_items(&server.session_path(&id));
    assert_eq!(
        items.last(),
        Some(&("assistant".to_owned(), Some("complete".to_owned()))),
        "{items:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn prompt_streams_the_reply() {
    let server = TestServer::start("prompt").await;
    let id = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "p"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();

    let output = server
        .run_cli(&["prompt", &id, "hello", "from", "the", "cli"])
        .await
        .success();
    assert!(
        output.stdout.contains("You said: hello from the cli."),
        "{output:?}"
    );

    // Streaming: the first words arrive well before the turn ends.
    let text = long_text(300);
    let mut command = tokio::process::Command::from(server.cli(&["prompt", &id, &text]));
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    let n = within("the first streamed bytes", stdout.read(&mut first))
        .await
        .unwrap();
    assert!(n > 0);
    let first_at = started.elapsed();
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).await.unwrap();
    let status = within("the prompt command", child.wait()).await.unwrap();
    let total = started.elapsed();
    assert!(status.success());
    let mut all = first[..n].to_vec();
    all.extend(rest);
    let printed = String::from_utf8(all).unwrap();
    assert!(printed.contains("word0000") && printed.contains("word0299"));
    assert!(
        first_at + Duration::from_millis(500) < total,
        "streamed: first bytes after {first_at:?}, done after {total:?}"
    );

    // A refused prompt exits non-zero with the reason.
    let output = server.run_cli(&["prompt", "no-such-session", "x"]).await;
    assert!(!output.status.success());
    assert!(output.stderr.contains("no-such-session"), "{output:?}");
    assert!(output.stderr.contains("No session matches"), "{output:?}");
}

/// `prompt ID -` reads the prompt from standard input (all of it, newlines
/// kept), and an empty one is refused before anything is sent.
#[tokio::test(flavor = "multi_thread")]
async fn prompt_dash_reads_standard_input() {
    let server = TestServer::start("prompt-stdin").await;
    let id = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    for (input, ok) in [("hi from a pipe\n", true), ("  \n", false)] {
        let mut command = tokio::process::Command::from(server.cli(&["prompt", &id, "-"]));
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).await.unwrap();
        drop(stdin);
        let output = within("prompt -", child.wait_with_output()).await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.success(), ok, "{stdout}\n{stderr}");
        if ok {
            assert!(stdout.contains("You said: hi from a pipe."), "{stdout}");
        } else {
            assert!(stderr.contains("empty"), "{stderr}");
        }
    }
}

/// Ctrl-C while a tool runs aborts the turn, and `prompt` says so and exits
/// non-zero (the turn ends on the tool's result, with no reply after it).
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_during_a_tool_call_reports_the_abort() {
    let server = TestServer::start("prompt-abort-tool").await;
    let id = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    let mut command = tokio::process::Command::from(server.cli(&["prompt", &id, "!sleep 30"]));
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().unwrap();
    let pid = child.id().unwrap();
    // Wait until the session runs the tool.
    let client = server.connect().await;
    within("the tool to start", async {
        loop {
            let snapshot = client.attach(&id).await.unwrap();
            let running = snapshot.transcript.iter().any(|item| {
                matches!(item, kernel::protocol::TranscriptItem::Tool(t)
                    if t.status == kernel::protocol::ToolStatus::Running)
            });
            if running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    signal(pid, Sig::Int);
    let output = within("prompt to end", child.wait_with_output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(130),
        "Ctrl-C exits 130: {stderr}"
    );
    assert_eq!(
        stderr.matches("aborted").count(),
        1,
        "one message for the abort: {stderr}"
    );
    assert!(
        stderr.contains("aborted during the bash tool call"),
        "{stderr}"
    );
    client.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn create_list_rm_and_models() {
    let server = TestServer::start("cmds").await;

    let bad = server
        .run_cli(&["create", "--cwd", "/tmp", "--model", "nope/x"])
        .await;
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("Unknown model nope/x"), "{bad:?}");
    assert!(
        bad.stderr.contains("faux/faux-1"),
        "names the alternatives: {bad:?}"
    );
    let bad = server
        .run_cli(&["create", "--model", "faux/faux-1", "--thinking", "high"])
        .await;
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("does not support"), "{bad:?}");
    let bad = server.run_cli(&["create", "--cwd", "/no/such/dir"]).await;
    assert!(!bad.status.success());
    assert!(bad.stderr.contains("no such directory"), "{bad:?}");

    let id = server
        .run_cli(&[
            "create",
            "--cwd",
            "/tmp",
            "--name",
            "keeper",
            "--model",
            "faux/faux-reasoner",
            "--thinking",
            "low",
        ])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    assert!(is_uuid_v4(&id));
    let client = server.connect().await;
    let snapshot = client.attach(&id).await.unwrap();
    assert_eq!(snapshot.model.id, "faux-reasoner");
    assert_eq!(snapshot.thinking_level.as_str(), "low");

    // Attached: live, idle, with our one client.
    let table = server.run_cli(&["list", "--wide"]).await.success();
    let mut lines = table.stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.contains("CREATED (UTC)"), "{table:?}");
    let row = lines
        .find(|l| l.contains(&id))
        .expect("a row for the session");
    assert!(row.contains("keeper") && row.contains("/tmp"), "{row}");
    assert!(header.contains("MODEL"), "{table:?}");
    assert!(row.contains("faux/faux-reasoner (low)"), "{row}");
    // The default table: a short id, the state with its client, in 100 columns.
    let short = server.run_cli(&["list"]).await.success();
    let short_row = short
        .stdout
        .lines()
        .find(|l| l.starts_with(&id[..8]))
        .unwrap_or_else(|| panic!("a row for {id}: {short:?}"));
    assert!(
        short_row.contains("keeper") && short_row.contains("idle·1"),
        "{short_row}"
    );
    assert!(
        short.stdout.lines().all(|l| l.chars().count() <= 100),
        "{short:?}"
    );
    let filtered = server.run_cli(&["list", "keep"]).await.success();
    assert_eq!(filtered.stdout.lines().count(), 2, "{filtered:?}");
    let none = server
        .run_cli(&["list", "--cwd", "/nowhere"])
        .await
        .success();
    assert!(
        none.stdout.is_empty() && none.stderr.contains("no session matches"),
        "{none:?}"
    );
    let json = server.run_cli(&["list", "--json"]).await.success();
    let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["cwd"], "/tmp");
    assert_eq!(list[0]["model"], "faux/faux-reasoner");
    assert_eq!(list[0]["thinkingLevel"], "low");
    assert_eq!(list[0]["status"], "idle", "{list}");
    assert_eq!(list[0]["clients"], 1, "{list}");
    assert!(
        header.contains("STATUS") && header.contains("CLIENTS"),
        "{table:?}"
    );
    assert!(row.contains(" idle "), "{row}");
    // Detached: disposed, then stored with no worker.
    client.close().await;
    let mut status = serde_json::Value::Null;
    for _ in 0..100 {
        let json = server.run_cli(&["list", "--json"]).await.success();
        let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
        status = list[0]["status"].clone();
        if status == "stored" {
            assert_eq!(list[0]["clients"], 0);
            // The server says which model, not the session's files.
            assert_eq!(list[0]["model"], "faux/faux-reasoner");
            assert_eq!(list[0]["thinkingLevel"], "low");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, "stored", "its worker exits once nobody is attached");

    let models = server.run_cli(&["models"]).await.success();
    assert!(models.stdout.contains("faux/faux-1"), "{models:?}");
    assert!(models.stdout.contains("faux/faux-reasoner"), "{models:?}");
    let json = server.run_cli(&["models", "--json"]).await.success();
    let models: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let reasoner = models
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "faux-reasoner")
        .expect("the reasoning model");
    assert_eq!(reasoner["reasoning"], true);
    assert!(
        reasoner["supportedThinkingLevels"]
            .as_array()
            .unwrap()
            .len()
            > 1
    );

    let removed = server.run_cli(&["rm", &id]).await.success();
    assert!(removed.stdout.contains(&format!("removed session {id}")));
    assert!(
        !server.session_path(&id).exists(),
        "the directory is deleted"
    );
    let json = server.run_cli(&["list", "--json"]).await.success();
    assert_eq!(json.stdout.trim(), "[]");
    let again = server.run_cli(&["rm", &id]).await;
    assert!(!again.status.success());
    assert!(again.stderr.contains(&id), "{again:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn attach_prompts_from_stdin_and_detaches_at_eof() {
    // No delay between deltas: the end of a reply and the prompt's response
    // arrive together, which is where a reply could be cut in two.
    let options = Options {
        faux_delay_ms: 0,
        ..Options::default()
    };
    let server = TestServer::start_with("attach", options).await;
    let client = server.connect().await;
    let id = client.create(params("interactive")).await.unwrap().id;
    let mut watcher = client.events();

    let mut command = tokio::process::Command::from(server.cli(&["attach", &id]));
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let turns = 8;
    for turn in 0..turns {
        let typed = format!("typed at the terminal, line {turn}");
        stdin
            .write_all(format!("{typed}\n").as_bytes())
            .await
            .unwrap();
        let echo = within("our line, echoed", stdout.next_line())
            .await
            .unwrap()
            .expect("more output");
        assert_eq!(
            echo,
            format!("› {typed}"),
            "the transcript shows what was sent"
        );
        let line = within("the streamed reply", stdout.next_line())
            .await
            .unwrap()
            .expect("more output");
        assert_eq!(
            line,
            format!("You said: {typed}. This is the faux model answering offline, word by word."),
            "each reply is printed whole, on its own line"
        );
        // The other attached client saw the same turn end.
        let items = 2 * (turn + 1);
        next_event(
            &mut watcher,
            "the turn's end, seen by another client",
            |e| {
                matches!(e, kernel::protocol::ServerEvent::SessionSnapshot { snapshot }
                if snapshot.transcript.len() == items
                    && snapshot.phase == kernel::protocol::SessionPhase::Idle)
            },
        )
        .await;
    }
    // Ctrl-D detaches.
    drop(stdin);
    let output = within("attach to exit", child.wait_with_output())
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.matches("[turn complete").count(), turns, "{stderr}");
    assert!(
        stderr.contains(&format!("detached from session {id}")),
        "{stderr}"
    );
    client.close().await;
}

/// Lines piped in at once go out as the session can take them (a prompt,
/// then steers once the turn runs), and end of input waits for the turn:
/// nothing is lost and the reply is not cut.
#[tokio::test(flavor = "multi_thread")]
async fn a_piped_attach_sends_as_the_session_can_take_it_and_waits_at_eof() {
    let server = TestServer::start("attach-pipe").await;
    let id = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    let mut command = tokio::process::Command::from(server.cli(&["attach", &id]));
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"first question\nsecond thought\nthird thought\n")
        .await
        .unwrap();
    drop(stdin);
    let output = within(
        "attach to finish the turn and exit",
        child.wait_with_output(),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for line in ["› first question", "› second thought", "› third thought"] {
        assert!(
            stdout.contains(line),
            "{line:?} missing:\n{stdout}\n{stderr}"
        );
    }
    assert!(
        stdout
            .trim_end()
            .ends_with("answering offline, word by word."),
        "the last reply is whole:\n{stdout}"
    );
    assert!(!stderr.contains("refused"), "{stderr}");
    let log = server.run_cli(&["log", &id]).await.success().stdout;
    assert_eq!(
        log.matches("› ").count(),
        3,
        "every line reached the session:\n{log}"
    );
}

/// `log` prints the stored transcript; a session is named by its id, a
/// unique prefix or its name, and an ambiguous name lists the candidates.
#[tokio::test(flavor = "multi_thread")]
async fn log_prefixes_and_names() {
    let mut server = TestServer::start("log").await;
    let id = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "notes"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    server
        .run_cli(&["prompt", "notes", "remember the milk"])
        .await
        .success();
    let log = server.run_cli(&["log", &id[..8]]).await.success().stdout;
    assert_eq!(
        log,
        "› remember the milk\nYou said: remember the milk. This is the faux model answering offline, word by word.\n"
    );
    let json = server
        .run_cli(&["log", "notes", "--json"])
        .await
        .success()
        .stdout;
    let items: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["role"], "user");
    assert_eq!(items[1]["role"], "assistant");

    // Names are unique within a server, but sessions from elsewhere (an
    // older server, a copied directory) may share one.
    server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "twin"])
        .await
        .success();
    let copy = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "twin-copy"])
        .await
        .success()
        .stdout;
    assert!(server.terminate().await.success());
    let meta = server.session_dir.join(copy.trim()).join("meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("twin-copy", "twin")).unwrap();
    server.spawn();
    server.wait_ready().await;
    let twin = server.run_cli(&["log", "twin"]).await;
    assert_eq!(twin.status.code(), Some(1));
    assert!(
        twin.stderr.contains("twin names more than one session")
            && twin.stderr.matches("(twin)").count() == 2,
        "{}",
        twin.stderr
    );
    let none = server.run_cli(&["prompt", "nope", "hi"]).await;
    assert_eq!(none.status.code(), Some(1));
    assert!(
        none.stderr.contains("No session matches nope"),
        "{}",
        none.stderr
    );
    let usage = server.run_cli(&["log"]).await;
    assert_eq!(usage.status.code(), Some(2), "a usage error exits 2");
}

/// `list -q`, newest first; `models` says which models have credentials;
/// `completions` prints a script for the shell.
#[tokio::test(flavor = "multi_thread")]
async fn list_quiet_models_credentials_and_completions() {
    let server = TestServer::start("conventions").await;
    let older = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let newer = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout;
    let ids = server.run_cli(&["list", "-q"]).await.success().stdout;
    assert_eq!(ids, format!("{}{}", newer, older), "ids only, newest first");
    let models = server.run_cli(&["models"]).await.success().stdout;
    assert!(models.contains("CREDENTIALS"), "{models}");
    let script = server
        .run_cli(&["completions", "bash"])
        .await
        .success()
        .stdout;
    assert!(
        script.contains("_pi__server") && script.contains("attach"),
        "{script}"
    );
    let bad = server.run_cli(&["completions", "tcsh"]).await;
    assert_eq!(bad.status.code(), Some(2));
}

/// Runs `tests/cli/complete.<shell>` with the binary on PATH: what the
/// shell's completion of `pi-server completions <shell>` offers.
fn complete(shell: &str, line: &[&str]) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli");
    let bin_dir = Path::new(bin()).parent().expect("the binary's directory");
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("a PATH");
    let mut command = std::process::Command::new(shell);
    command.arg(dir.join(format!("complete.{shell}")));
    if shell == "zsh" {
        command.arg(line.join(" "));
    } else {
        command.args(line);
    }
    let output = command
        .env("PATH", path)
        .env("HOME", std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shell}: {e}"));
    assert!(
        output.status.success(),
        "{shell} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut words: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    words.sort();
    words.dedup();
    words
}

/// Completion scripts work in bash and zsh: commands (never the internal
/// `worker`), a command's own options with the global ones, and none of the
/// global options where a command refuses them. `.ci/run` installs zsh; on
/// CI its absence fails the test, elsewhere it skips with a message.
#[test]
fn completions_offer_commands_and_their_options_in_bash_and_zsh() {
    for shell in ["bash", "zsh"] {
        let present = std::process::Command::new(shell)
            .arg("-c")
            .arg("true")
            .status()
            .is_ok_and(|s| s.success());
        if !present {
            assert!(std::env::var_os("CI").is_none(), "{shell} is needed");
            eprintln!("SKIPPED: {shell} is not installed");
            continue;
        }
        let commands = complete(shell, &["pi-server", ""]);
        for command in ["attach", "create", "list", "prompt", "serve"] {
            assert!(
                commands.iter().any(|c| c == command),
                "{shell}: {commands:?}"
            );
        }
        assert!(
            !commands.iter().any(|c| c == "worker"),
            "{shell}: {commands:?}"
        );
        let create = complete(shell, &["pi-server", "create", "--"]);
        for option in ["--cwd", "--name", "--model", "--thinking", "--server-dir"] {
            assert!(create.iter().any(|c| c == option), "{shell}: {create:?}");
        }
        let attach = complete(shell, &["pi-server", "attach", "--h"]);
        assert!(
            attach.iter().any(|c| c == "--history"),
            "{shell}: {attach:?}"
        );
        let demo = complete(shell, &["pi-server", "demo", "-"]);
        assert!(
            !demo.iter().any(|c| c == "--server-dir"),
            "{shell}: {demo:?}"
        );
        let serve = complete(shell, &["pi-server", "serve", "--"]);
        assert!(serve.iter().any(|c| c == "--listen"), "{shell}: {serve:?}");
        assert!(
            !serve
                .iter()
                .any(|c| c == "--idle-exit-ms" || c == "--connect"),
            "{shell}: {serve:?}"
        );
    }
}

/// Every command that prints ends quietly when its reader has gone (`| head`
/// closing the pipe): no panic, no message, the status of a process killed by
/// `SIGPIPE`, and what it did stays done.
#[tokio::test(flavor = "multi_thread")]
async fn every_command_is_quiet_on_a_closed_pipe() {
    let server = TestServer::start("closed-pipe").await;
    let id = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "piped"])
        .await
        .success()
        .stdout;
    let id = id.trim().to_owned();
    server.run_cli(&["prompt", &id, "hello"]).await.success();
    let commands: [&[&str]; 8] = [
        &["list"],
        &["list", "--json"],
        &["models"],
        &["log", &id],
        &["prompt", &id, "again"],
        &["create", "--cwd", "/tmp"],
        &["completions", "bash"],
        &["completions", "zsh"],
    ];
    for args in commands {
        let mut command = tokio::process::Command::from(server.cli(args));
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn pi-server");
        drop(child.stdout.take());
        let output = within("a command with its stdout closed", child.wait_with_output())
            .await
            .expect("wait for pi-server");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(141), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} said: {stderr}");
    }
    // The piped create did create; the piped prompt's turn ran.
    let listed = server.run_cli(&["list", "-q"]).await.success().stdout;
    assert_eq!(listed.lines().count(), 2, "{listed}");
    let log = server.run_cli(&["log", &id]).await.success().stdout;
    assert!(log.contains("again"), "{log}");
}

/// `steer`, `abort`, `set-model` and `set-thinking` act on a session another
/// client runs a turn in, say what came of it, and exit 1 with the server's
/// reason when it refuses (busy, no turn, an unknown model or level).
#[tokio::test(flavor = "multi_thread")]
async fn steer_abort_and_settings_from_the_command_line() {
    let options = Options {
        faux_delay_ms: 5,
        ..Options::default()
    };
    let server = TestServer::start_with("control", options).await;
    let client = std::sync::Arc::new(server.connect().await);
    let id = client.create(params("ctl")).await.unwrap().id;

    // Idle: nothing to steer or abort.
    for args in [&["steer", "ctl", "hi"][..], &["abort", "ctl"]] {
        let refused = server.run_cli(args).await;
        assert_eq!(refused.status.code(), Some(1), "{args:?}: {refused:#?}");
        assert!(refused.stderr.contains("no active prompt"), "{refused:#?}");
    }

    let mut events = client.events();
    let turn = {
        let (client, id) = (std::sync::Arc::clone(&client), id.clone());
        tokio::spawn(async move {
            client
                .prompt(&id, "a long job with many words to stream, one by one")
                .await
        })
    };
    next_event(&mut events, "the turn streams", |e| {
        matches!(e, kernel::protocol::ServerEvent::SessionProgress { .. })
    })
    .await;
    let steered = server
        .run_cli(&["steer", "ctl", "be", "brief"])
        .await
        .success();
    assert!(
        steered.stdout.starts_with("steered session"),
        "{steered:#?}"
    );
    let busy = server
        .run_cli(&["set-model", "ctl", "faux/faux-reasoner"])
        .await;
    assert_eq!(busy.status.code(), Some(1), "{busy:#?}");
    assert!(busy.stderr.contains("(busy)"), "{busy:#?}");
    let aborted = server.run_cli(&["abort", "ctl"]).await.success();
    assert!(
        aborted.stdout.starts_with("aborted the running turn"),
        "{aborted:#?}"
    );
    let ended = within("the aborted turn to end", turn).await.unwrap();
    let last = ended.expect("the prompt settles").transcript;
    assert!(
        matches!(
            last.last(),
            Some(kernel::protocol::TranscriptItem::Assistant(a))
                if a.status == kernel::protocol::AssistantStatus::Aborted
        ),
        "{last:#?}"
    );

    let switched = server
        .run_cli(&["set-model", "ctl", "faux/faux-reasoner"])
        .await
        .success();
    assert!(
        switched
            .stdout
            .contains("now uses faux/faux-reasoner with thinking"),
        "{switched:#?}"
    );
    let high = server
        .run_cli(&["set-thinking", "ctl", "high"])
        .await
        .success();
    assert!(high.stdout.contains("with thinking high"), "{high:#?}");
    let unknown = server.run_cli(&["set-model", "ctl", "nope/x"]).await;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        unknown.stderr.contains("Unknown model nope/x"),
        "{unknown:#?}"
    );
    server
        .run_cli(&["set-model", "ctl", "faux/faux-1"])
        .await
        .success();
    let unsupported = server.run_cli(&["set-thinking", "ctl", "high"]).await;
    assert_eq!(unsupported.status.code(), Some(1));
    assert!(
        unsupported
            .stderr
            .contains("does not support thinking level high"),
        "{unsupported:#?}"
    );
    let usage = server.run_cli(&["set-thinking", "ctl", "bogus"]).await;
    assert_eq!(usage.status.code(), Some(2));
    // The other client sees the session's settings change.
    let now = client.attach(&id).await.unwrap();
    assert_eq!(now.model.id, "faux-1");
}

/// Names are unique: `create --name` and `rename` refuse a taken name,
/// naming its holder; a renamed session is found by its new name, listed
/// with it, and keeps it across a server restart.
#[tokio::test(flavor = "multi_thread")]
async fn names_are_unique_and_sessions_can_be_renamed() {
    let mut server = TestServer::start("names").await;
    let first = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "dup"])
        .await
        .success()
        .stdout;
    let first = first.trim().to_owned();
    let again = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "dup"])
        .await;
    assert_eq!(again.status.code(), Some(1), "{again:#?}");
    assert!(
        again
            .stderr
            .contains(&format!("Name \"dup\" is taken by session {first}")),
        "{again:#?}"
    );
    let second = server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "other"])
        .await
        .success()
        .stdout;
    let second = second.trim().to_owned();
    let taken = server.run_cli(&["rename", "other", "dup"]).await;
    assert_eq!(taken.status.code(), Some(1), "{taken:#?}");
    assert!(taken.stderr.contains(&first), "{taken:#?}");

    let renamed = server
        .run_cli(&["rename", "other", "tests"])
        .await
        .success();
    assert_eq!(
        renamed.stdout,
        format!("session {second} is now named tests\n")
    );
    server
        .run_cli(&["prompt", "tests", "hello"])
        .await
        .success();
    server.restart().await;
    let listed = server.run_cli(&["list", "--json"]).await.success().stdout;
    assert!(listed.contains("\"tests\""), "{listed}");
    assert!(!listed.contains("\"other\""), "{listed}");
    let log = server.run_cli(&["log", "tests"]).await.success().stdout;
    assert!(log.contains("hello"), "{log}");
}

/// `exec` creates a session in the working directory, streams one reply to
/// stdout with tool calls and thinking on stderr (`--quiet`: the reply
/// alone), and leaves the session for `prompt --last` / `-c`, which takes
/// the newest session of the directory; an empty prompt is refused.
#[tokio::test(flavor = "multi_thread")]
async fn exec_then_prompt_the_last_session_of_the_directory() {
    let server = TestServer::start("exec").await;
    let project = server.root.path.join("project");
    std::fs::create_dir_all(&project).unwrap();
    let in_project = |args: &[&str]| {
        let mut command = server.cli(args);
        command.current_dir(&project);
        run(command)
    };
    let first = in_project(&[
        "exec",
        "--model",
        "faux/faux-reasoner",
        "--thinking",
        "high",
        "!echo from-the-tool",
    ])
    .await
    .success();
    assert_eq!(
        first.stdout, "The bash tool finished: from-the-tool\n",
        "stdout is the reply alone"
    );
    assert!(
        first.stderr.contains("▸ bash: echo from-the-tool"),
        "{first:?}"
    );
    assert!(first.stderr.contains("(thinking)"), "{first:?}");
    assert!(first.stderr.contains("(session "), "{first:?}");
    let quiet = in_project(&["exec", "-q", "!echo quiet"]).await.success();
    assert!(quiet.stderr.is_empty(), "{quiet:?}");
    let created = in_project(&["create", "--json", "--name", "as-json"])
        .await
        .success();
    let created: serde_json::Value = serde_json::from_str(&created.stdout).unwrap();
    assert_eq!(
        (created["name"].as_str(), created["model"].as_str()),
        (Some("as-json"), Some("faux/faux-1"))
    );
    let as_json = created["id"].as_str().unwrap().to_owned();
    server.run_cli(&["rm", &as_json]).await.success();

    let again = in_project(&["prompt", "-c", "and", "once", "more"])
        .await
        .success();
    assert!(
        again.stdout.contains("You said: and once more"),
        "{again:?}"
    );
    let listed = server.run_cli(&["list", "--json"]).await.success().stdout;
    let sessions: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(sessions.len(), 2, "{listed}");
    let cwd = project.to_str().unwrap();
    assert!(sessions.iter().all(|s| s["cwd"] == cwd), "{listed}");
    let log = in_project(&["log", sessions[0]["id"].as_str().unwrap()])
        .await
        .success()
        .stdout;
    assert!(
        log.contains("› !echo quiet") && log.contains("› and once more"),
        "the newest session took it: {log}"
    );

    let empty = in_project(&["prompt", "-c", " "]).await;
    assert_eq!(empty.status.code(), Some(1), "{empty:?}");
    assert!(empty.stderr.contains("the prompt is empty"), "{empty:?}");
    let elsewhere = server.run_cli(&["prompt", "--last", "hi"]).await;
    assert_eq!(elsewhere.status.code(), Some(1), "{elsewhere:?}");
    assert!(
        elsewhere.stderr.contains("No session works in"),
        "{elsewhere:?}"
    );
}

/// Issue #15, item 7: a `prompt` refused as busy prints nothing of the turn
/// another client is running (it prints only its own session's output, and
/// only for its own request), and says why on stderr. Many rounds, each
/// racing the other client's stream.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_prompt_prints_nothing_of_another_clients_turn() {
    let options = Options {
        faux_delay_ms: 2,
        ..Options::default()
    };
    let server = TestServer::start_with("refused", options).await;
    let client = std::sync::Arc::new(server.connect().await);
    let id = client.create(params("busy")).await.unwrap().id;
    for round in 0..10 {
        let mut events = client.events();
        let other = {
            let (client, id) = (std::sync::Arc::clone(&client), id.clone());
            tokio::spawn(async move {
                client
                    .prompt(
                        &id,
                        &format!("round {round} of a long job with many words to stream"),
                    )
                    .await
            })
        };
        next_event(&mut events, "the other turn streams", |e| {
            matches!(e, kernel::protocol::ServerEvent::SessionProgress { .. })
        })
        .await;
        let output = server.run_cli(&["prompt", &id, "me too"]).await;
        let refused = !output.status.success();
        if refused {
            assert_eq!(output.stdout, "", "round {round}: {output:?}");
            assert!(output.stderr.contains("busy"), "round {round}: {output:?}");
        } else {
            assert!(
                output.stdout.contains("You said: me too") && !output.stdout.contains("round"),
                "round {round}: only its own reply: {output:?}"
            );
        }
        other.await.unwrap().unwrap();
    }
    if let Ok(client) = std::sync::Arc::try_unwrap(client) {
        client.close().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn demo_shows_two_clients_sharing_a_session() {
    let root = TestRoot::new("demo");
    let mut command = std::process::Command::new(bin());
    command.arg("demo");
    root.isolate(&mut command);
    command.env("TMPDIR", &root.path);
    let output = run(command).await.success();
    let out = &output.stdout;
    for expected in [
        "[client 1] created session",
        "You said: Hello, pi-server!",
        "[client 2] attached to the session: revision",
        "[client 1] has its own copy: revision",
        "[demo] both clients hold the same session snapshot",
        "[client 2] saw the same reply live",
        "[demo] done.",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    // Both snapshot lines name the same revision and transcript length.
    let tail = |prefix: &str| {
        out.lines()
            .find_map(|l| l.split_once(prefix).map(|(_, t)| t.to_owned()))
            .unwrap()
    };
    let theirs = tail("[client 2] attached to the session: ");
    let ours = tail("[client 1] has its own copy: ");
    assert!(theirs.starts_with(&ours), "{theirs} vs {ours}");
    // It cleaned up after itself.
    let leftovers: Vec<_> = std::fs::read_dir(&root.path)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pi-demo-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Issue #17, item 8: `create` with a hosted model that has no key warns at
/// once, and the first prompt's error names the variable and the
/// `auth.json` entry to set.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_without_credentials_warns_at_create_and_the_prompt_says_what_to_set() {
    let mut server = TestServer::new("nokey", Default::default());
    let agent = server.root.path.join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    let var = "PI_TEST_UNSET_HOSTED_KEY_51C7";
    let models = serde_json::json!({"providers": {"hosted": {
        "baseUrl": "http://127.0.0.1:9/v1", "api": "openai-responses", "apiKeyEnv": var,
        "models": [{"id": "big"}]
    }}});
    std::fs::write(agent.join("models.json"), models.to_string()).unwrap();
    server.spawn();
    server.wait_ready().await;
    let created = server
        .run_cli(&["create", "--cwd", "/tmp", "--model", "hosted/big"])
        .await
        .success();
    assert!(
        created
            .stderr
            .contains("model hosted/big has no credentials"),
        "{created:?}"
    );
    let id = created.stdout.trim().to_owned();
    let output = server.run_cli(&["prompt", &id, "hi"]).await;
    let all = format!("{}{}", output.stdout, output.stderr);
    assert!(
        all.contains(&format!(
            "no API key for provider hosted: set {var} or add {{\"hosted\": {{\"key\": \"...\"}}}} to {}",
            agent.join("auth.json").display()
        )),
        "{output:?}"
    );
}

/// `mcp list` shows the configured servers without a session, and with one
/// the state its worker runs them in: the reference server from npm ready
/// with its tools, an absent command failed with the reason; a prompt calls
/// one of the tools through the faux model.
#[tokio::test(flavor = "multi_thread")]
async fn mcp_list_shows_servers_their_state_and_tools() {
    let mcp = mcp_servers().await;
    let server = TestServer::start("mcp").await;
    let everything = mcp.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let settings = serde_json::json!({"mcpServers": {
        "everything": {"command": "node", "args": [everything, "stdio"]},
        "absent": {"command": "no-such-mcp-server"},
    }});
    let agent = server.root.path.join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(agent.join("settings.json"), settings.to_string()).unwrap();

    let configured = server.run_cli(&["mcp", "list"]).await.success().stdout;
    assert!(configured.starts_with("NAME "), "{configured}");
    assert!(
        configured.contains("everything  configured") && configured.contains("no-such-mcp-server"),
        "{configured}"
    );
    server
        .run_cli(&["create", "--cwd", "/tmp", "--name", "tools"])
        .await
        .success();
    let live = server
        .run_cli(&["mcp", "list", "tools"])
        .await
        .success()
        .stdout;
    assert!(live.contains("everything  ready"), "{live}");
    assert!(live.contains("absent      failed"), "{live}");
    assert!(live.contains("mcp__everything__get-sum"), "{live}");
    assert!(
        live.contains("absent: cannot run \"no-such-mcp-server\""),
        "{live}"
    );
    let json = server
        .run_cli(&["mcp", "list", "tools", "--json"])
        .await
        .success()
        .stdout;
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(2), "{json}");
    let reply = server
        .run_cli(&["prompt", "tools", "!mcp__everything__get-sum a=2 b=40"])
        .await
        .success()
        .stdout;
    assert!(reply.contains("The sum of 2 and 40 is 42"), "{reply}");
}

/// `exec --json` and `prompt --json`: one JSON object a line on stdout (the
/// new session, each event of the turn, its end), nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn exec_and_prompt_print_json_lines_with_json() {
    let server = TestServer::start("jsonl").await;
    let out = server
        .run_cli(&["exec", "--json", "--cwd", "/tmp", "!echo hi"])
        .await
        .success()
        .stdout;
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"session"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"turn_end"), "{kinds:?}");
    let session = lines[0]["id"].as_str().unwrap().to_owned();
    let call = lines
        .iter()
        .find(|l| l["type"] == "tool_call")
        .expect("a tool call");
    assert_eq!(call["name"], "bash");
    assert_eq!(call["input"]["command"], "echo hi");
    let done = lines
        .iter()
        .find(|l| l["type"] == "tool" && l["status"] == "complete")
        .expect("the tool's result");
    assert!(done["output"].as_str().unwrap().contains("hi"), "{done}");
    let text: String = lines
        .iter()
        .filter(|l| l["type"] == "text")
        .map(|l| l["delta"].as_str().unwrap())
        .collect();
    assert!(text.contains("The bash tool finished: hi"), "{text}");
    assert_eq!(lines.last().unwrap()["ok"], true);
    assert_eq!(lines.last().unwrap()["session"], session.as_str());

    let out = server
        .run_cli(&["prompt", "--json", &session, "hello"])
        .await
        .success()
        .stdout;
    let last: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "turn_end");
    assert!(
        out.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    );
    assert!(
        !out.contains("\"user\""),
        "our own prompt is not echoed: {out}"
    );
}

/// `compact` summarises a session's older conversation between turns: it
/// says so while it waits, keeps every item, refuses with nothing older to
/// summarise, and `/compact` in the line mode does the same.
#[tokio::test(flavor = "multi_thread")]
async fn compact_from_the_command_line_and_the_line_mode() {
    let server = TestServer::start("compact").await;
    let client = server.connect().await;
    let tiny = kernel::protocol::ModelRef {
        provider: "faux".into(),
        id: "faux-tiny".into(),
    };
    let created = client
        .create(kernel::protocol::CreateParams {
            model: Some(tiny),
            ..params("squeeze")
        })
        .await
        .unwrap();
    let id = created.id;
    // Nothing older than what a compaction keeps: refused, nothing changed.
    let early = server.run_cli(&["compact", "squeeze"]).await;
    assert_eq!(early.status.code(), Some(1), "{early:#?}");
    assert!(early.stderr.contains("Nothing to compact"), "{early:#?}");
    // Turns until there is more than a compaction keeps (a turn that
    // fills the tiny window compacts on its own, which keeps the newest).
    let mut compacted = None;
    let mut items = 0;
    for n in 0..16 {
        let turn = client.prompt(&id, &format!("question {n}")).await.unwrap();
        items = turn.transcript.len();
        let out = server
            .run_cli(&["compact", "squeeze", "keep", "the", "questions"])
            .await;
        if out.status.success() {
            compacted = Some(out);
            break;
        }
        assert!(out.stderr.contains("Nothing to compact"), "{out:#?}");
    }
    let compacted = compacted.expect("a compaction within 16 turns");
    assert!(
        compacted.stdout.starts_with("compacted session"),
        "{compacted:#?}"
    );
    assert!(
        compacted.stderr.contains("compacting session"),
        "progress is shown while the model works: {compacted:#?}"
    );
    let after = client.attach(&id).await.unwrap();
    assert_eq!(after.transcript.len(), items, "every item stays");
    assert_eq!(after.phase, kernel::protocol::SessionPhase::Idle);
    // Everything older is in the summary now.
    let again = server.run_cli(&["compact", "squeeze"]).await;
    assert_eq!(again.status.code(), Some(1), "{again:#?}");
    assert!(again.stderr.contains("Nothing to compact"), "{again:#?}");
    // The line mode: `/compact` goes to the session, and comes back refused
    // with nothing more to summarise.
    let mut command = tokio::process::Command::from(server.cli(&["attach", "squeeze"]));
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"/compact\n").await.unwrap();
    drop(stdin);
    let output = within("attach with /compact", child.wait_with_output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/compact") && stderr.contains("Nothing to compact"),
        "{stderr}"
    );
}

/// `list` names an unnamed session by its first prompt, as the server
/// previews it from the session's `meta.json`: in the tables, in quotes,
/// and in `--json`; a named session keeps its name.
#[tokio::test(flavor = "multi_thread")]
async fn list_previews_the_first_prompt_of_an_unnamed_session() {
    let server = TestServer::start("preview").await;
    let client = server.connect().await;
    let unnamed = client
        .create(kernel::protocol::CreateParams {
            cwd: Some("/tmp".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    client
        .prompt(&unnamed, "fix the failing\ntest   in the parser")
        .await
        .unwrap();
    let mut preview = serde_json::Value::Null;
    for _ in 0..100 {
        let json = server.run_cli(&["list", "--json"]).await.success();
        let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
        preview = list[0]["preview"].clone();
        if !preview.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(preview, "fix the failing test in the parser");
    let short = server.run_cli(&["list"]).await.success();
    assert!(
        short.stdout.contains("“fix the failing test in th…"),
        "clipped to its column: {short:#?}"
    );
    let wide = server.run_cli(&["list", "-w"]).await.success();
    assert!(
        wide.stdout.contains("“fix the failing test in the parser”"),
        "{wide:#?}"
    );
    // `list TEXT` finds it by its first prompt too.
    let found = server.run_cli(&["list", "PARSER"]).await.success();
    assert_eq!(found.stdout.lines().count(), 2, "{found:#?}");
    let none = server.run_cli(&["list", "weather"]).await.success();
    assert!(none.stderr.contains("no session matches"), "{none:#?}");
}

/// `prompt --image` and `exec --image` send images with the prompt (over
/// protocol v8, to a model that takes them); a file that is no image, one
/// too large, or a model without image input is refused with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn images_go_with_a_prompt_and_bad_ones_are_refused() {
    let server = TestServer::start("prompt-image").await;
    let dir = &server.root.path;
    // A 1×1 PNG.
    let png = dir.join("dot.png");
    let bytes: Vec<u8> = [
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000",
        "1f15c4890000000d49444154789c63f8cfc0f01f0005fe02fea7d6a4e20000000049454e44ae426082",
    ]
    .concat()
    .as_bytes()
    .chunks(2)
    .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap())
    .collect();
    std::fs::write(&png, bytes).unwrap();
    let png = png.to_str().unwrap();
    let id = server
        .run_cli(&["create", "--cwd", "/tmp"])
        .await
        .success()
        .stdout
        .trim()
        .to_owned();
    let seen = server
        .run_cli(&["prompt", &id, "--image", png, "what is this"])
        .await
        .success();
    assert!(
        seen.stdout
            .contains("You said: what is this, with 1 image (image/png)."),
        "{seen:?}"
    );
    let two = server
        .run_cli(&[
            "exec",
            "--cwd",
            "/tmp",
            "--image",
            png,
            "--image",
            png,
            "and these",
        ])
        .await
        .success();
    assert!(two.stdout.contains("with 2 images"), "{two:?}");

    let text = dir.join("notes.txt");
    std::fs::write(&text, "not an image").unwrap();
    let refused = server
        .run_cli(&["prompt", &id, "--image", text.to_str().unwrap(), "x"])
        .await;
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("not a PNG, JPEG, GIF or WebP"),
        "{refused:?}"
    );
    let missing = server
        .run_cli(&["prompt", &id, "--image", "/no/such.png", "x"])
        .await;
    assert!(
        missing.stderr.contains("cannot read /no/such.png"),
        "{missing:?}"
    );
    // faux-tiny takes no images: refused before the turn, in band.
    let tiny = server
        .run_cli(&["exec", "--model", "faux/faux-tiny", "--image", png, "look"])
        .await;
    assert!(!tiny.status.success());
    assert!(tiny.stderr.contains("does not take images"), "{tiny:?}");
}

/// Approvals from the command line: `approvals` sets a session's policy
/// and shows it; under `ask` a prompt's tool call waits until `approve`
/// answers it (allowed, it runs; denied, the model is told and the turn
/// goes on); with nothing asked `approve` says so.
#[tokio::test]
async fn approvals_are_set_shown_and_answered_from_the_command_line() {
    let server = TestServer::start("approve").await;
    let client = server.connect().await;
    client.create(params("gated")).await.unwrap();
    client.close().await;
    let set = server
        .run_cli(&["approvals", "gated", "ask"])
        .await
        .success();
    assert!(set.stdout.contains("now approves as ask"), "{set:#?}");
    let bad = server.run_cli(&["approvals", "gated", "sometimes"]).await;
    assert_eq!(bad.status.code(), Some(2), "{bad:#?}");
    assert!(bad.stderr.contains("auto, ask or read-only"), "{bad:#?}");
    let none = server.run_cli(&["approve", "gated"]).await;
    assert_eq!(none.status.code(), Some(1), "{none:#?}");
    assert!(none.stderr.contains("asks nothing"), "{none:#?}");

    for (flags, shows) in [
        (&[][..], "The bash tool finished: approved-run"),
        (&["--deny"][..], "Denied: the user did not allow"),
    ] {
        let prompt = tokio::process::Command::from(server.cli(&[
            "prompt",
            "--quiet",
            "gated",
            "!echo approved-run",
        ]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
        let mut args = vec!["approve", "gated", "--wait"];
        args.extend_from_slice(flags);
        let approved = server.run_cli(&args).await.success();
        assert!(
            approved.stderr.contains("bash wants to run:")
                && approved.stderr.contains("$ echo approved-run"),
            "the question is shown: {approved:#?}"
        );
        let verb = if flags.is_empty() {
            "allowed"
        } else {
            "denied"
        };
        assert!(
            approved
                .stdout
                .starts_with(&format!("bash {verb} in session")),
            "{approved:#?}"
        );
        let out = within("the prompt", prompt.wait_with_output())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(stdout.contains(shows), "{stdout}");
    }
    let shown = server.run_cli(&["approvals", "gated"]).await.success();
    assert!(
        shown
            .stdout
            .contains("approves as ask (set for this session)")
            && shown.stdout.contains("no question waits"),
        "{shown:#?}"
    );
}
