//! The kernel issue's 13 scenarios (see `sim/tests/kernel_scenarios.rs`) end
//! to end: the real `pi-server serve`, real worker processes, real SQLite, and
//! clients on the real Unix socket.

mod common;

use common::*;
use kernel::protocol::{
    AssistantStatus, ClientMessage, Command, ErrorCode, ModelRef, Request, ServerEvent,
    ServerMessage, SessionPhase, ThinkingLevel,
};
use pi_client::{Client, ClientError};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn reasoner() -> ModelRef {
    ModelRef {
        provider: "faux".into(),
        id: "faux-reasoner".into(),
    }
}

/// 1. The right token and version are accepted; a missing or wrong token gets
/// `auth` (checked before the version); a wrong version gets `version`. Each
/// rejection is the last frame before the close.
#[tokio::test(flavor = "multi_thread")]
async fn s01_handshake_auth_and_version() {
    let options = Options {
        token: Some("s3cret".into()),
        ..Options::default()
    };
    let server = TestServer::start_with("s01", options).await;

    let good = server.connect().await;
    assert!(!good.connection_id().is_empty());
    assert_eq!(good.server_snapshot().server_id, SERVER_ID);

    let no_token = Client::connect(&server.socket, None).await;
    expect_code(no_token.map(drop), ErrorCode::Auth);
    let wrong = Client::connect(&server.socket, Some("guess")).await;
    expect_code(wrong.map(drop), ErrorCode::Auth);

    // Raw connections to choose the version.
    let mut bad_both = server.raw().await;
    bad_both.hello(2, Some("guess")).await;
    assert_eq!(
        bad_both.expect_hello_error().await.code,
        ErrorCode::Auth,
        "auth is checked before the version"
    );
    let mut bad_version = server.raw().await;
    bad_version.hello(2, Some("s3cret")).await;
    assert_eq!(
        bad_version.expect_hello_error().await.code,
        ErrorCode::Version
    );
    let mut right = server.raw().await;
    right.hello(1, Some("s3cret")).await;
    assert!(matches!(right.recv().await, Some(ServerMessage::Hello(h)) if h.version == 1));

    // The accepted client is still served.
    assert!(good.list().await.unwrap().is_empty());
    good.close().await;
}

/// 2. A connection that sends nothing gets `hello_error invalid_request
/// "Handshake timeout"` after the 5 s deadline, then a close; one that sends
/// a request first is rejected at once.
#[tokio::test(flavor = "multi_thread")]
async fn s02_handshake_timeout() {
    let server = TestServer::start("s02").await;
    let started = Instant::now();
    let mut silent = server.raw().await;

    let mut rude = server.raw().await;
    rude.send(&ClientMessage::Request(Request {
        id: "r1".into(),
        command: Command::List,
    }))
    .await;
    let error = rude.expect_hello_error().await;
    assert_eq!(error.code, ErrorCode::InvalidRequest);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "a request first is refused at once"
    );

    let error = silent.expect_hello_error().await;
    let waited = started.elapsed();
    assert_eq!(error.code, ErrorCode::InvalidRequest);
    assert!(error.message.contains("Handshake timeout"), "{error:?}");
    assert!(
        waited >= Duration::from_millis(4900),
        "the deadline is 5 s, closed after {waited:?}"
    );
}

/// 3. The server assigns session ids; list shows them; attach and detach
/// work from any connection; detaching when not attached still answers.
#[tokio::test(flavor = "multi_thread")]
async fn s03_server_assigned_ids_list_attach_detach() {
    let server = TestServer::start("s03").await;
    let a = server.connect().await;
    let created = a.create(params("three")).await.unwrap();
    let id = created.id.clone();
    assert!(is_uuid_v4(&id), "server-assigned UUID: {id}");
    assert!(created.attached && created.locked);
    assert_eq!(created.phase, SessionPhase::Idle);
    assert_eq!(created.name.as_deref(), Some("three"));

    let listed = a.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].session_name.as_deref(), Some("three"));
    assert_eq!(listed[0].cwd.as_deref(), Some("/tmp"));

    let b = server.connect().await;
    let attached = b.attach(&id).await.unwrap();
    assert!(attached.attached && attached.locked);
    assert_eq!(attached.revision, created.revision);
    b.detach(&id).await.unwrap();
    b.detach(&id)
        .await
        .expect("detach when not attached still answers");
    expect_code(b.attach("no-such-session").await, ErrorCode::NotFound);
    assert_eq!(
        server.workers_of(&id).len(),
        1,
        "one worker for the session"
    );
    a.close().await;
    b.close().await;
}

/// 4. One connection holds independent attachments to two sessions: a turn
/// in one does not touch the other, and detaching one leaves the other.
#[tokio::test(flavor = "multi_thread")]
async fn s04_independent_attachments_on_one_connection() {
    let server = TestServer::start("s04").await;
    let c = server.connect().await;
    let s1 = c.create(params("one")).await.unwrap().id;
    let s2 = c.create(params("two")).await.unwrap().id;
    let before = c.session_snapshot(&s2).unwrap();
    let mut events = c.events();

    let done = c.prompt(&s1, "only s1").await.unwrap();
    assert_eq!(done.id, s1);
    assert_eq!(done.transcript.len(), 2);
    assert!(text_of(assistants(&done)[0]).contains("only s1"));
    let seen = drain(&mut events);
    assert!(seen.iter().any(|e| is_delta_of(e, &s1)));
    assert!(
        !seen.iter().any(|e| is_session_event_of(e, &s2)),
        "nothing about s2"
    );
    assert_eq!(c.session_snapshot(&s2).unwrap(), before);

    let w1 = server.worker_of(&s1).await;
    let w2 = server.worker_of(&s2).await;
    c.detach(&s1).await.unwrap();
    wait_exit(w1, "s1's worker to be disposed (idle, unattached)").await;
    assert!(alive(w2), "s2 stays live");
    let s2_now = c.attach(&s2).await.unwrap();
    assert_eq!(s2_now.revision, before.revision);
    assert_eq!(server.workers_of(&s2), vec![w2]);
    c.close().await;
}

/// 5. Session snapshots and progress go only to attached connections; an
/// unattached connection sees server snapshots only.
#[tokio::test(flavor = "multi_thread")]
async fn s05_snapshots_and_progress_only_to_attached() {
    let server = TestServer::start("s05").await;
    let a = server.connect().await;
    let b = server.connect().await;
    let mut a_events = a.events();
    let mut b_events = b.events();
    let s = a.create(params("five")).await.unwrap().id;
    a.prompt(&s, "hi").await.unwrap();
    // A round trip on each connection: what was sent before is delivered.
    a.list().await.unwrap();
    b.list().await.unwrap();

    let a_seen = drain(&mut a_events);
    let b_seen = drain(&mut b_events);
    let session_events =
        |seen: &[ServerEvent]| seen.iter().filter(|e| is_session_event_of(e, &s)).count();
    assert!(session_events(&a_seen) > 5, "{a_seen:#?}");
    assert_eq!(session_events(&b_seen), 0, "{b_seen:#?}");
    assert!(
        b_seen.iter().any(|e| matches!(e,
            ServerEvent::ServerSnapshot { snapshot } if snapshot.sessions.iter().any(|m| m.id == s))),
        "b sees the new session in a server snapshot: {b_seen:#?}"
    );
    a.close().await;
    b.close().await;
}

/// 6. Every attached client controls the one runtime: a prompt from one, a
/// steer from the other, both seen by both; one worker serves them.
#[tokio::test(flavor = "multi_thread")]
async fn s06_every_attached_client_controls_the_runtime() {
    let server = TestServer::start("s06").await;
    let a = server.connect().await;
    let b = Arc::new(server.connect().await);
    let s = a.create(params("six")).await.unwrap().id;
    b.attach(&s).await.unwrap();
    let mut a_events = a.events();

    let prompt = tokio::spawn({
        let (b, s) = (Arc::clone(&b), s.clone());
        async move { b.prompt(&s, &long_text(200)).await }
    });
    next_event(&mut a_events, "a sees b's reply streaming", |e| {
        is_delta_of(e, &s)
    })
    .await;
    let steered = a.steer(&s, "from a").await.unwrap();
    assert_eq!(steered.queued_steer_count, 1);
    assert_eq!(steered.queued_steer.len(), 1);

    let done = within("b's prompt", prompt).await.unwrap().unwrap();
    assert_eq!(user_count(&done), 2, "the steer was taken into the turn");
    assert_eq!(done.queued_steer_count, 0);
    assert_eq!(done.phase, SessionPhase::Idle);
    let last = assistants(&done).last().map(|a| text_of(a)).unwrap();
    assert!(last.contains("from a"), "{last}");

    let final_a = next_event(&mut a_events, "a sees the final snapshot", |e| {
        matches!(e, ServerEvent::SessionSnapshot { snapshot }
            if snapshot.id == s && snapshot.revision >= done.revision)
    })
    .await;
    let ServerEvent::SessionSnapshot { snapshot } = final_a else {
        unreachable!()
    };
    assert_eq!(snapshot.transcript, done.transcript);
    assert_eq!(server.workers_of(&s).len(), 1, "one worker serves both");
    a.close().await;
}

/// 7. Nothing queues: a second prompt during a turn is `busy`; steer and
/// abort work only while a prompt runs; abort ends the turn with an aborted
/// item and the prompt's response still succeeds; settings need idle.
#[tokio::test(flavor = "multi_thread")]
async fn s07_no_prompt_queueing_steer_and_abort() {
    let server = TestServer::start("s07").await;
    let c = Arc::new(server.connect().await);
    let s = c.create(params("seven")).await.unwrap().id;
    expect_code(c.steer(&s, "early").await, ErrorCode::Busy);
    expect_code(c.abort(&s).await, ErrorCode::Busy);

    let mut events = c.events();
    let prompt = tokio::spawn({
        let (c, s) = (Arc::clone(&c), s.clone());
        async move { c.prompt(&s, &long_text(400)).await }
    });
    next_event(&mut events, "the turn streams", |e| is_delta_of(e, &s)).await;
    expect_code(c.prompt(&s, "second").await, ErrorCode::Busy);
    expect_code(c.set_model(&s, reasoner()).await, ErrorCode::Busy);
    expect_code(
        c.set_thinking(&s, ThinkingLevel::Off).await,
        ErrorCode::Busy,
    );
    let steered = c.steer(&s, "focus").await.unwrap();
    assert_eq!(steered.queued_steer_count, 1);
    assert!(
        !prompt.is_finished(),
        "the prompt is pending during its turn"
    );

    let aborted = c.abort(&s).await.unwrap();
    assert_eq!(aborted.phase, SessionPhase::Idle);
    let done = within("the aborted prompt", prompt)
        .await
        .unwrap()
        .expect("the aborted prompt succeeds");
    assert!(
        assistants(&done)
            .iter()
            .any(|a| a.status == AssistantStatus::Aborted),
        "{:#?}",
        done.transcript
    );

    let with_model = c.set_model(&s, reasoner()).await.unwrap();
    assert_eq!(with_model.model, reasoner());
    let with_thinking = c.set_thinking(&s, ThinkingLevel::High).await.unwrap();
    assert_eq!(with_thinking.thinking_level, ThinkingLevel::High);
    let message = expect_code(
        c.set_thinking(&s, ThinkingLevel::Max).await,
        ErrorCode::InvalidRequest,
    );
    assert!(
        message.contains("high"),
        "names what is supported: {message}"
    );
    let message = expect_code(
        c.set_model(
            &s,
            ModelRef {
                provider: "nope".into(),
                id: "missing".into(),
            },
        )
        .await,
        ErrorCode::InvalidRequest,
    );
    assert!(
        message.contains("nope/missing"),
        "names the model: {message}"
    );

    // Idle again: a prompt works, with the reasoner's thinking.
    let again = c.prompt(&s, "after abort").await.unwrap();
    assert!(matches!(
        last_assistant_status(&again),
        Some(AssistantStatus::Complete(_))
    ));
}

/// 8. The snapshot in a response says whether the requester is attached: a
/// client that detaches during its prompt gets `attached:false`, while the
/// other client's broadcasts say `attached:true`.
#[tokio::test(flavor = "multi_thread")]
async fn s08_attachment_state_relative_to_requester() {
    let server = TestServer::start("s08").await;
    let a = Arc::new(server.connect_once().await);
    let b = server.connect_once().await;
    let s = a.create(params("eight")).await.unwrap().id;
    b.attach(&s).await.unwrap();
    let mut a_events = a.events();
    let mut b_events = b.events();

    let prompt = tokio::spawn({
        let (a, s) = (Arc::clone(&a), s.clone());
        async move { a.prompt(&s, &long_text(200)).await }
    });
    next_event(&mut a_events, "the turn streams", |e| is_delta_of(e, &s)).await;
    a.detach(&s).await.unwrap();
    let done = within("a's prompt", prompt).await.unwrap().unwrap();
    assert!(!done.attached, "the requester is no longer attached");
    assert_eq!(done.phase, SessionPhase::Idle);

    let last_b = next_event(&mut b_events, "b's idle snapshot", |e| {
        matches!(e, ServerEvent::SessionSnapshot { snapshot }
            if snapshot.id == s && snapshot.revision >= done.revision)
    })
    .await;
    let ServerEvent::SessionSnapshot { snapshot } = last_b else {
        unreachable!()
    };
    assert!(snapshot.attached && snapshot.phase == SessionPhase::Idle);
    b.close().await;
}

/// 9. A running turn survives its only client's disconnect; the worker exits
/// when the turn ends, and the finished reply is stored.
#[tokio::test(flavor = "multi_thread")]
async fn s09_busy_work_survives_disconnect() {
    let server = TestServer::start("s09").await;
    let c = server.connect().await;
    let created = c.create(params("nine")).await.unwrap();
    let s = created.id.clone();
    let worker = server.worker_of(&s).await;
    let mut events = c.events();
    let text = long_text(300);
    tokio::select! {
        result = c.prompt(&s, &text) => panic!("the turn ended too early: {result:?}"),
        _ = next_event(&mut events, "the turn streams", |e| is_delta_of(e, &s)) => {}
    }
    c.close().await;

    let observer = server.connect().await;
    let listed = observer.list().await.unwrap();
    assert!(listed.iter().any(|m| m.id == s));
    assert!(
        alive(worker),
        "busy work keeps its runtime after the disconnect"
    );
    wait_exit(worker, "the worker to be disposed once idle").await;

    // Stored: the complete reply. Attaching opens it in a fresh worker.
    let items = stored_items(&server.session_path(&s));
    assert_eq!(
        items.last(),
        Some(&("assistant".to_owned(), Some("complete".to_owned()))),
        "{items:?}"
    );
    // Listed while no worker runs: what the session last reported (the end
    // of its turn), not what it was when created. (Opening it again is a
    // state change of its own: a later updatedAt.)
    let listed = observer.list().await.unwrap();
    let listed = listed.iter().find(|m| m.id == s).expect("listed");
    let turn_end = listed.updated_at.expect("updatedAt");
    let snapshot = observer.attach(&s).await.unwrap();
    assert!(
        created.updated_at < turn_end && turn_end <= snapshot.updated_at,
        "created {}, listed {turn_end}, reopened {}",
        created.updated_at,
        snapshot.updated_at
    );
    assert_eq!(snapshot.transcript.len(), 2);
    assert!(matches!(
        last_assistant_status(&snapshot),
        Some(AssistantStatus::Complete(_))
    ));
    assert!(text_of(assistants(&snapshot)[0]).contains("word0299"));
    let fresh = server.worker_of(&s).await;
    assert_ne!(fresh, worker);
    observer.close().await;
}

/// 10. After a restart, stored sessions are listed without starting anything,
/// and attaching opens one lazily with its transcript.
#[tokio::test(flavor = "multi_thread")]
async fn s10_lazy_restore_after_restart() {
    let mut server = TestServer::start("s10").await;
    let c = server.connect().await;
    let s = c.create(params("ten")).await.unwrap().id;
    c.prompt(&s, "remember me").await.unwrap();
    c.close().await;
    server.restart().await;
    assert!(server.workers().is_empty(), "no worker after a restart");

    let c = server.connect().await;
    assert!(c.server_snapshot().sessions.iter().any(|m| m.id == s));
    let listed = c.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, s);
    assert_eq!(listed[0].session_name.as_deref(), Some("ten"));
    assert!(server.workers().is_empty(), "listing opens nothing");

    let snapshot = c.attach(&s).await.unwrap();
    assert_eq!(snapshot.transcript.len(), 2);
    assert!(text_of(assistants(&snapshot)[0]).contains("remember me"));
    assert_eq!(server.workers_of(&s).len(), 1, "attach spawned one worker");
    c.close().await;
}

/// The error of an attach that must fail.
async fn attach_error(client: &Client, session: &str) -> kernel::protocol::ProtocolError {
    code(client.attach(session).await)
}

/// 11. (The wrong-runtime-id case cannot happen with the real worker.) A
/// session whose directory was deleted, or whose database is corrupt, fails
/// to attach with a clear error, and the server keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn s11_broken_session_directory_is_a_clear_error() {
    let server = TestServer::start("s11").await;
    let c = server.connect().await;
    let gone = c.create(params("gone")).await.unwrap().id;
    let corrupt = c.create(params("corrupt")).await.unwrap().id;
    let fine = c.create(params("fine")).await.unwrap().id;
    for s in [&gone, &corrupt, &fine] {
        c.detach(s).await.unwrap();
    }
    for s in [&gone, &corrupt, &fine] {
        server.wait_no_worker(s).await;
    }

    std::fs::remove_dir_all(server.session_path(&gone)).unwrap();
    let db = server.session_path(&corrupt).join("session.sqlite");
    std::fs::write(&db, vec![0x5a; 8192]).unwrap();
    let _ = std::fs::remove_file(db.with_extension("sqlite-wal"));
    let _ = std::fs::remove_file(db.with_extension("sqlite-shm"));

    let error = attach_error(&c, &gone).await;
    eprintln!("attach of a deleted session: {error:?}");
    assert_eq!(error.code, ErrorCode::NotFound, "{error:?}");
    assert!(
        error.message.contains(&gone),
        "names the session: {error:?}"
    );

    let error = attach_error(&c, &corrupt).await;
    eprintln!("attach of a corrupt session: {error:?}");
    assert!(
        matches!(
            error.code,
            ErrorCode::InternalError | ErrorCode::InvalidRequest
        ),
        "{error:?}"
    );
    assert!(
        error.message.contains(&corrupt) || error.message.contains("session.sqlite"),
        "a clear message naming the session: {error:?}"
    );
    server.wait_no_worker(&corrupt).await;

    // Everyone else is still served.
    assert_eq!(c.attach(&fine).await.unwrap().id, fine);
    assert!(c.list().await.unwrap().iter().any(|m| m.id == fine));
    c.close().await;
}

/// 12. A session locked by another process maps to `session_locked`; control
/// commands on a session the connection is not attached to are
/// `invalid_request`.
#[tokio::test(flavor = "multi_thread")]
async fn s12_lock_errors_and_unattached_control() {
    let server = TestServer::start("s12").await;
    let c = server.connect().await;
    let s = c.create(params("twelve")).await.unwrap().id;
    c.detach(&s).await.unwrap();
    server.wait_no_worker(&s).await;

    let lock_path = server.session_path(&s).join("lock");
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lock_path)
        .unwrap();
    lock.try_lock()
        .expect("the disposed worker released the lock");

    let error = attach_error(&c, &s).await;
    assert_eq!(error.code, ErrorCode::SessionLocked, "{error:?}");
    let message = error.message;
    assert!(message.contains(&s), "{message}");
    server.wait_no_worker(&s).await;
    expect_code(
        c.prompt(&s, "not attached").await,
        ErrorCode::InvalidRequest,
    );
    expect_code(c.steer(&s, "not attached").await, ErrorCode::InvalidRequest);
    expect_code(c.abort("unknown").await, ErrorCode::InvalidRequest);
    expect_code(c.set_model(&s, reasoner()).await, ErrorCode::InvalidRequest);

    drop(lock);
    let snapshot = c.attach(&s).await.expect("attach once the lock is free");
    assert!(snapshot.attached);
    c.close().await;
}

/// 12, under concurrency: every attach of a locked session is
/// `session_locked`, however the worker's failure and its exit interleave.
///
/// A worker that reports `Failed { session_locked }` and exits at once must
/// not have its exit overtake its report: the daemon reports a worker's exit
/// only after its channel is drained, so every one of these 400 attaches
/// gets the real reason.
#[tokio::test(flavor = "multi_thread")]
async fn s12_locked_session_under_concurrent_attaches() {
    let server = TestServer::start("s12c").await;
    let c = server.connect().await;
    let mut locks = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = c.create(params(&format!("locked {i}"))).await.unwrap().id;
        c.detach(&s).await.unwrap();
        server.wait_no_worker(&s).await;
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(server.session_path(&s).join("lock"))
            .unwrap();
        lock.try_lock().unwrap();
        locks.push(lock);
        let client = server.connect().await;
        tasks.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            for _ in 0..50 {
                let error = code(client.attach(&s).await);
                if error.code != ErrorCode::SessionLocked {
                    wrong.push(error);
                }
            }
            wrong
        }));
    }
    let mut wrong = Vec::new();
    for task in tasks {
        wrong.extend(within("the attaches", task).await.unwrap());
    }
    assert!(
        wrong.is_empty(),
        "{} of 400 attaches: {:?}",
        wrong.len(),
        wrong.first()
    );
    c.close().await;
}

/// 13. A durable stop (SIGTERM): the server stops accepting, closes every
/// connection, disposes the idle runtimes and removes its socket; a running
/// turn goes on in its worker. With no next server the turn ends complete and
/// the worker retires after the orphan grace; with one, the turn is adopted
/// and ends complete there. (pi's own server aborts such a turn.)
#[tokio::test(flavor = "multi_thread")]
async fn s13_a_stop_keeps_running_turns() {
    let options = Options {
        env: vec![("PI_WORKER_ORPHAN_GRACE_MS".into(), "300".into())],
        ..Options::default()
    };
    let mut server = TestServer::start_with("s13", options).await;
    for next_server in [false, true] {
        let a = Arc::new(server.connect_once().await);
        let b = server.connect_once().await;
        let s1 = a
            .create(params(&format!("busy {next_server}")))
            .await
            .unwrap()
            .id;
        let s2 = b
            .create(params(&format!("idle {next_server}")))
            .await
            .unwrap()
            .id;
        let busy = server.worker_of(&s1).await;
        let idle = server.worker_of(&s2).await;
        let mut a_events = a.events();
        let mut b_events = b.events();
        let prompt = tokio::spawn({
            let (a, s1) = (Arc::clone(&a), s1.clone());
            async move { a.prompt(&s1, &long_text(300)).await }
        });
        next_event(&mut a_events, "the turn streams", |e| is_delta_of(e, &s1)).await;

        let status = server.terminate().await;
        assert!(status.success(), "a stop exits 0, got {status}");
        until_closed(&mut a_events).await;
        until_closed(&mut b_events).await;
        let outcome = within("the pending prompt", prompt).await.unwrap();
        assert!(
            matches!(outcome, Err(ClientError::Disconnected(_))),
            "{outcome:?}"
        );
        assert!(!server.socket.exists(), "the socket is removed");
        wait_exit(idle, "the idle worker to exit").await;
        assert!(alive(busy), "the busy worker goes on");
        if next_server {
            server.spawn();
            server.wait_ready().await;
            let c = server.connect().await;
            let done = within("the adopted turn", async {
                loop {
                    let snapshot = c.attach(&s1).await.unwrap();
                    if snapshot.phase == SessionPhase::Idle {
                        break snapshot;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            assert_eq!(server.worker_of(&s1).await, busy, "adopted, not restarted");
            assert!(done.transcript.len() == 2, "{:?}", done.transcript);
            c.close().await;
            wait_exit(busy, "the idle worker to be disposed").await;
        } else {
            wait_exit(busy, "the orphan to finish its turn and retire").await;
            server.spawn();
            server.wait_ready().await;
        }
        let items = stored_items(&server.session_path(&s1));
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(
            items.last(),
            Some(&("assistant".to_owned(), Some("complete".to_owned()))),
            "the turn was not aborted (next server: {next_server})"
        );
    }
}

/// `serve` runs itself again with glibc's mmap threshold fixed, and its
/// workers inherit it, so the buffers of large frames go back to the
/// system when freed (DESIGN.md, the io layer).
#[tokio::test(flavor = "multi_thread")]
async fn the_server_and_its_workers_run_with_a_fixed_mmap_threshold() {
    let server = TestServer::start("mmap").await;
    let a = server.connect().await;
    let created = a.create(params("mmap")).await.unwrap();
    let fixed = |pid: u32| {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        let wanted = format!("{}=131072", pi_front::cli::MMAP_THRESHOLD_VAR);
        environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes())
    };
    assert!(fixed(server.pid()), "the server");
    let worker = server.worker_of(&created.id).await;
    assert!(fixed(worker), "its worker");
    a.close().await;
}
