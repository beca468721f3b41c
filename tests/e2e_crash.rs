//! Crashes: a worker killed with SIGKILL mid-turn, a server killed with
//! SIGKILL, and restarts that restore stored sessions lazily.

mod common;

use common::*;
use kernel::protocol::{AssistantStatus, SessionPhase, TranscriptItem};
use std::sync::Arc;
use std::time::Duration;

/// `PRAGMA integrity_check` of a session's database (no worker may run).
fn integrity(server: &TestServer, session: &str) -> String {
    let db = rusqlite::Connection::open(server.session_path(session).join("session.sqlite"))
        .expect("open session.sqlite");
    db.query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check")
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_a_worker_mid_turn() {
    let server = TestServer::start("wkill").await;
    let a = Arc::new(server.connect().await);
    let bystander = server.connect().await;
    let s = a.create(params("crash")).await.unwrap().id;
    let other = bystander.create(params("other")).await.unwrap().id;
    let first = a.prompt(&s, "committed before the crash").await.unwrap();
    assert_eq!(first.transcript.len(), 2);

    let worker = server.worker_of(&s).await;
    let lock = std::fs::read_to_string(server.session_path(&s).join("lock")).unwrap();
    assert_eq!(
        lock.lines().next().unwrap_or_default(),
        worker.to_string(),
        "the lock file names the worker"
    );

    let mut events = a.events();
    let prompt = tokio::spawn({
        let (a, s) = (Arc::clone(&a), s.clone());
        async move { a.prompt(&s, &long_text(400)).await }
    });
    // Several deltas in, so the streaming item is stored.
    for _ in 0..5 {
        next_event(&mut events, "the turn streams", |e| is_delta_of(e, &s)).await;
    }
    signal(worker, Sig::Kill);

    // Runtime-error semantics: the server closes the attached connection.
    // The client reconnects, re-attaches (a fresh worker records the
    // interrupted reply as aborted) and the prompt resolves with that.
    let outcome = within("the pending prompt", prompt).await.unwrap();
    let resolved = outcome.expect("the prompt resolves after the reconnection");
    assert_eq!(resolved.phase, SessionPhase::Idle);
    assert_eq!(
        last_assistant_status(&resolved),
        Some(AssistantStatus::Aborted),
        "{resolved:#?}"
    );
    assert!(a.closed_reason().is_none());
    wait_exit(worker, "the killed worker to be reaped").await;

    // A connection not attached to it is untouched.
    bystander.list().await.unwrap();
    assert_eq!(bystander.session_snapshot(&other).unwrap().id, other);

    // The committed transcript is intact.
    assert_eq!(integrity(&server, &s), "ok");
    let items = stored_items(&server.session_path(&s));
    assert!(items.len() >= 3, "{items:?}");
    assert_eq!(items[0], ("user".to_owned(), None));
    assert_eq!(
        items[1],
        ("assistant".to_owned(), Some("complete".to_owned()))
    );
    assert_eq!(items[2], ("user".to_owned(), None));

    // The next attach spawns a fresh worker that records the interrupted item as aborted.
    let c = server.connect().await;
    let snapshot = c.attach(&s).await.unwrap();
    let fresh = server.worker_of(&s).await;
    assert_ne!(fresh, worker);
    assert_eq!(snapshot.phase, SessionPhase::Idle);
    assert_eq!(snapshot.transcript[..2], first.transcript[..]);
    let Some(TranscriptItem::Assistant(interrupted)) = snapshot.transcript.last() else {
        panic!("the interrupted reply is kept: {:#?}", snapshot.transcript);
    };
    assert_eq!(interrupted.status, AssistantStatus::Aborted);
    assert!(
        interrupted
            .error_message
            .as_deref()
            .is_some_and(|m| m.contains("Interrupted")),
        "{interrupted:?}"
    );
    // And the session works again.
    let again = c.prompt(&s, "after the crash").await.unwrap();
    assert!(matches!(
        last_assistant_status(&again),
        Some(AssistantStatus::Complete(_))
    ));
    c.close().await;
    bystander.close().await;
}

/// Pids of running processes whose command line is exactly `args`.
fn processes(args: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// A worker SIGKILLed in the middle of an MCP call: the call is marked
/// failed like a built-in tool's, the stdio server (in its own recorded
/// process group) dies with the next worker's start, and that worker starts
/// the session's servers again before the next turn, which calls one.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_mcp_servers_die_and_the_next_worker_starts_them_again() {
    let mcp = mcp_servers().await;
    let server = TestServer::start("wmcp").await;
    let faulty = mcp.join("faulty.mjs").display().to_string();
    // An argument no other test uses: it names this test's server processes.
    let marker = format!("wmcp.{}", std::process::id());
    let agent = server.root.path.join("agent");
    std::fs::create_dir_all(&agent).unwrap();
    let settings = serde_json::json!({"mcpServers": {
        "faulty": {"command": "node", "args": [faulty, "tools", marker]},
    }});
    std::fs::write(agent.join("settings.json"), settings.to_string()).unwrap();
    let argv = ["node", faulty.as_str(), "tools", marker.as_str()];

    let a = Arc::new(server.connect().await);
    let s = a.create(params("mcp")).await.unwrap().id;
    let prompt = tokio::spawn({
        let (a, s) = (Arc::clone(&a), s.clone());
        async move { a.prompt(&s, "!mcp__faulty__hang text=forever").await }
    });
    let started = std::time::Instant::now();
    let hanging = loop {
        let snapshot = a.attach(&s).await.unwrap();
        let running = snapshot
            .transcript
            .iter()
            .any(|i| matches!(i, TranscriptItem::Tool(t) if t.tool_name == "mcp__faulty__hang"));
        if running && !processes(&argv).is_empty() {
            break processes(&argv);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the MCP call runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let worker = server.worker_of(&s).await;
    signal(worker, Sig::Kill);
    wait_exit(worker, "the killed worker to be reaped").await;

    let outcome = within("the pending prompt", prompt).await.unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    let started = std::time::Instant::now();
    while hanging.iter().any(|pid| processes(&argv).contains(pid)) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the killed worker's MCP server outlives the session's next worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let snapshot = a.attach(&s).await.unwrap();
    let call = snapshot.transcript.iter().find_map(|i| match i {
        TranscriptItem::Tool(t) if t.tool_name == "mcp__faulty__hang" => Some(t.clone()),
        _ => None,
    });
    let call = call.expect("the interrupted call is in the transcript");
    assert!(
        call.status == kernel::protocol::ToolStatus::Error,
        "{call:?}"
    );

    let again = a.prompt(&s, "!mcp__faulty__ok text=again").await.unwrap();
    let answered = again.transcript.iter().any(|i| {
        matches!(i, TranscriptItem::Tool(t) if t.tool_name == "mcp__faulty__ok"
            && t.status == kernel::protocol::ToolStatus::Complete)
    });
    assert!(answered, "{:#?}", again.transcript);
    assert_eq!(processes(&argv).len(), 1, "one server, the new worker's");
}

/// A worker SIGKILLed mid-`bash` cannot kill the command's processes; the
/// session's next worker does, before the session runs again.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_tool_processes_die_before_the_session_runs_again() {
    let server = TestServer::start("wtool").await;
    let a = Arc::new(server.connect().await);
    let s = a.create(params("tool")).await.unwrap().id;
    // Durations no other test uses: they name this test's processes.
    let (bg, fg) = (
        format!("301.{}", std::process::id()),
        format!("302.{}", std::process::id()),
    );
    let prompt = tokio::spawn({
        let (a, s, text) = (
            Arc::clone(&a),
            s.clone(),
            format!("!sleep {bg} & sleep {fg}"),
        );
        async move { a.prompt(&s, &text).await }
    });
    let started = std::time::Instant::now();
    while processes(&["sleep", &bg]).is_empty() || processes(&["sleep", &fg]).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the command runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let groups = server.session_path(&s).join("tool-groups");
    assert_eq!(
        std::fs::read_dir(&groups).unwrap().count(),
        1,
        "its group is recorded"
    );
    let worker = server.worker_of(&s).await;
    signal(worker, Sig::Kill);
    wait_exit(worker, "the killed worker to be reaped").await;

    // The client re-attaches: a fresh worker opens the session, and the
    // command's processes are gone.
    let outcome = within("the pending prompt", prompt).await.unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    let started = std::time::Instant::now();
    while !processes(&["sleep", &bg]).is_empty() || !processes(&["sleep", &fg]).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the command's processes outlive the session's next worker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_dir(&groups).unwrap().count(),
        0,
        "no record left"
    );
}

/// Orphaned workers (their server died) retire after this grace when no
/// server adopts them; the default is 30 s.
const ORPHAN_GRACE_MS: &str = "300";

fn short_orphan_grace() -> Options {
    Options {
        env: vec![("PI_WORKER_ORPHAN_GRACE_MS".into(), ORPHAN_GRACE_MS.into())],
        ..Options::default()
    }
}

/// A server killed with SIGKILL: its idle workers retire after their orphan
/// grace; the next server lists the stored sessions and opens them only on
/// attach.
#[tokio::test(flavor = "multi_thread")]
async fn server_restart_restores_sessions_lazily() {
    let mut server = TestServer::start_with("lazy", short_orphan_grace()).await;
    let c = server.connect().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = c.create(params(&format!("stored-{n}"))).await.unwrap().id;
        c.prompt(&id, &format!("turn of {n}")).await.unwrap();
        ids.push(id);
    }
    let workers: Vec<u32> = server.workers().into_iter().map(|(pid, _)| pid).collect();
    assert_eq!(workers.len(), 3);

    server.kill();
    for pid in workers {
        wait_exit(pid, "an unadopted idle orphan to retire").await;
    }
    drop(c);

    server.spawn();
    server.wait_ready().await;
    let c = server.connect().await;
    let listed = c.list().await.unwrap();
    let mut listed_ids: Vec<String> = listed.iter().map(|m| m.id.clone()).collect();
    listed_ids.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(listed_ids, expected);
    assert!(server.workers().is_empty(), "listing starts no worker");

    let snapshot = c.attach(&ids[1]).await.unwrap();
    assert_eq!(snapshot.transcript.len(), 2);
    assert!(text_of(assistants(&snapshot)[0]).contains("turn of 1"));
    let live: Vec<String> = server.workers().into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        live,
        vec![ids[1].clone()],
        "only the attached session is opened"
    );
    c.close().await;
}

/// A server killed during a turn: the orphaned worker finishes and commits
/// the turn, retires after its grace, and a new server finds it complete.
#[tokio::test(flavor = "multi_thread")]
async fn server_sigkill_mid_turn_keeps_the_turn() {
    let mut server = TestServer::start_with("skill", short_orphan_grace()).await;
    let c = Arc::new(server.connect_once().await);
    let s = c.create(params("orphan")).await.unwrap().id;
    let worker = server.worker_of(&s).await;
    let mut events = c.events();
    let prompt = tokio::spawn({
        let (c, s) = (Arc::clone(&c), s.clone());
        async move { c.prompt(&s, &long_text(100)).await }
    });
    next_event(&mut events, "the turn streams", |e| is_delta_of(e, &s)).await;
    server.kill();
    let outcome = within("the pending prompt", prompt).await.unwrap();
    assert!(outcome.is_err());
    wait_exit(worker, "the orphaned worker to finish its turn and retire").await;

    assert_eq!(integrity(&server, &s), "ok");
    let items = stored_items(&server.session_path(&s));
    assert_eq!(
        items,
        vec![
            ("user".to_owned(), None),
            ("assistant".to_owned(), Some("complete".to_owned()))
        ]
    );

    server.spawn();
    server.wait_ready().await;
    let c = server.connect().await;
    let snapshot = c.attach(&s).await.unwrap();
    assert!(text_of(assistants(&snapshot)[0]).contains("word0099"));
    c.close().await;
}

/// A server whose program file is replaced while it runs (an upgrade, a
/// rebuild) still starts workers of its own build for new sessions.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_whose_program_was_replaced_still_starts_workers() {
    let root = TestRoot::new("replaced-program");
    let program = root.path.join("pi-server-copy");
    std::fs::copy(bin(), &program).unwrap();
    let mut server = TestServer::start_with(
        "replaced-program-server",
        Options {
            program: Some(program.clone()),
            ..Options::default()
        },
    )
    .await;
    // Replaced by a file that is no program at all.
    std::fs::remove_file(&program).unwrap();
    std::fs::write(&program, "#!/bin/false\n").unwrap();

    let c = server.connect().await;
    let id = c.create(params("after the upgrade")).await.unwrap().id;
    let done = c.prompt(&id, "still here?").await.unwrap();
    assert!(
        matches!(
            last_assistant_status(&done),
            Some(AssistantStatus::Complete(_))
        ),
        "{}",
        server.log()
    );
    c.close().await;
    server.terminate().await;
}

/// Found by the kill-loop bench: an orphan announces itself with its
/// session's whole snapshot, and the server refused announcements over
/// 64 KiB. A session with a longer transcript was never adopted after a
/// crash or a hand-over, and every attach then failed `session_locked`.
#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_with_a_large_transcript_is_adopted() {
    let options = Options {
        faux_delay_ms: 0,
        ..Options::default()
    };
    let mut server = TestServer::start_with("large-orphan", options).await;
    let c = server.connect_once().await;
    let s = c.create(params("large")).await.unwrap().id;
    c.prompt(&s, &long_text(12_000)).await.unwrap(); // ~100 KiB each way
    let worker = server.worker_of(&s).await;
    server.kill();
    drop(c);
    server.spawn();
    server.wait_ready().await;
    let c = server.connect().await;
    let snapshot = c.attach(&s).await.expect("adopted, not locked");
    assert!(snapshot.transcript.len() >= 2);
    assert_eq!(server.workers_of(&s), [worker], "the orphan serves it");
    c.close().await;
}

/// Runs `approvals SESSION` until its output contains `needle`.
async fn until_approvals_show(server: &TestServer, session: &str, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = server.run_cli(&["approvals", session]).await;
        if out.stdout.contains(needle) {
            return out.stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "approvals never showed {needle:?}: {out:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A question is session state: it outlives the client that started the
/// turn, a server killed with SIGKILL (the orphan tells the next server),
/// and its worker killed with SIGKILL (the next worker asks it again, since
/// the tool never ran); answered then, the tool runs once and the turn ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_question_outlives_its_client_a_server_crash_and_a_worker_crash() {
    let mut server = TestServer::start("askcrash").await;
    let work = server.root.path.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let c = server.connect().await;
    let gated = kernel::protocol::CreateParams {
        cwd: Some(work.display().to_string()),
        ..params("gated")
    };
    let s = c.create(gated).await.unwrap().id;
    c.close().await;
    server
        .run_cli(&["approvals", "gated", "ask"])
        .await
        .success();
    let mut prompt = tokio::process::Command::from(server.cli(&[
        "prompt",
        "--quiet",
        "gated",
        "!echo once >> ran.txt; echo ran",
    ]))
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    until_approvals_show(&server, "gated", "bash wants to run").await;
    // The client that started the turn goes; the question stays.
    prompt.kill().await.unwrap();
    let worker = server.worker_of(&s).await;
    server.kill();
    server.spawn();
    server.wait_ready().await;
    let told = until_approvals_show(&server, "gated", "bash wants to run").await;
    assert!(told.contains("$ echo once >> ran.txt; echo ran"), "{told}");
    assert_eq!(server.worker_of(&s).await, worker, "the orphan was adopted");
    signal(worker, Sig::Kill);
    wait_exit(worker, "the killed worker").await;
    // A new worker opens the session, asks again, and the answer runs it.
    let approved = server
        .run_cli(&["approve", "gated", "--wait"])
        .await
        .success();
    assert!(approved.stdout.starts_with("bash allowed"), "{approved:#?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let log = loop {
        let log = server.run_cli(&["log", "gated"]).await.success();
        if log.stdout.contains("The bash tool finished: ran") {
            break log.stdout;
        }
        assert!(std::time::Instant::now() < deadline, "{log:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!log.contains("Interrupted"), "the turn went on: {log}");
    let ran = std::fs::read_to_string(work.join("ran.txt")).unwrap();
    assert_eq!(ran, "once\n", "the tool ran exactly once");
}
