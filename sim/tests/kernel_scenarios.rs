//! The seed server test's scenarios, scripted against the real kernel in the
//! simulated world. Each trace (one line per input and output, virtual time,
//! small ids) is an insta snapshot in `snapshots/kernel/`.

use kernel::protocol::{
    AssistantStatus, Command, CommandResult, CreateParams, ErrorCode, ModelRef, ServerEvent,
    ServerMessage, SessionPhase, ThinkingLevel, TranscriptItem,
};
use kernel::server::Stage;
use sim::world::{Options, WorkerScript, World};
use std::time::Duration;

fn snapshot(name: &str, world: &World) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/kernel"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, world.trace_text()));
}

fn ok(world: &World, conn: kernel::ids::ConnId, id: &str) -> CommandResult {
    match world.response(conn, id).map(|r| r.outcome.clone()) {
        Some(Ok(result)) => result,
        other => panic!("request {id}: expected success, got {other:?}"),
    }
}

fn err(world: &World, conn: kernel::ids::ConnId, id: &str) -> ErrorCode {
    match world.response(conn, id).map(|r| r.outcome.clone()) {
        Some(Err(e)) => e.code,
        other => panic!("request {id}: expected an error, got {other:?}"),
    }
}

fn last_hello_error(world: &World, conn: kernel::ids::ConnId) -> ErrorCode {
    match world.client(conn).received.last() {
        Some(ServerMessage::HelloError(e)) => e.code,
        other => panic!("expected hello_error last, got {other:?}"),
    }
}

fn create(world: &mut World, conn: kernel::ids::ConnId) -> String {
    let r = world.request(
        conn,
        Command::Create(CreateParams {
            cwd: Some("/work".into()),
            ..Default::default()
        }),
    );
    world.created(conn, &r)
}

fn prompt(s: &str, text: &str) -> Command {
    Command::Prompt {
        session_id: s.to_string(),
        text: text.to_string(),
    }
}

/// Scenario 1: A hello with the right token and version is accepted; a missing or
/// wrong token gets `auth` (checked before the version); a wrong version gets
/// `version`. Each rejection is the last frame before the close.
#[test]
fn s01_handshake_auth_and_version() {
    let mut w = World::new(Options {
        token: Some("s3cret".into()),
        ..Options::default()
    });
    let good = w.connect();
    w.hello(good, 1, Some("s3cret"));
    assert_eq!(w.server.connection_stage(good), Some(Stage::Ready));
    assert!(matches!(
        w.client(good).received[0],
        ServerMessage::Hello(_)
    ));

    let no_token = w.connect();
    w.hello(no_token, 1, None);
    assert_eq!(last_hello_error(&w, no_token), ErrorCode::Auth);
    let bad_token = w.connect();
    w.hello(bad_token, 2, Some("guess"));
    assert_eq!(
        last_hello_error(&w, bad_token),
        ErrorCode::Auth,
        "auth is checked before the version"
    );
    let bad_version = w.connect();
    w.hello(bad_version, 2, Some("s3cret"));
    assert_eq!(last_hello_error(&w, bad_version), ErrorCode::Version);
    for c in [no_token, bad_token, bad_version] {
        assert!(w.client(c).closed);
        assert_eq!(w.server.connection_stage(c), None);
    }
    // Without a configured token, a hello without one is accepted.
    let mut open = World::new(Options::default());
    let c = open.connect();
    open.hello(c, 1, None);
    assert_eq!(open.server.connection_stage(c), Some(Stage::Ready));
    snapshot("s01_handshake_auth_and_version", &w);
}

/// Scenario 2: A connection that does not complete the handshake within 5 s gets
/// `hello_error invalid_request "Handshake timeout"` and is closed; one that
/// sends a request first is rejected the same way.
#[test]
fn s02_handshake_timeout() {
    let mut w = World::new(Options::default());
    let slow = w.connect();
    w.advance(Duration::from_millis(4999));
    assert_eq!(w.server.connection_stage(slow), Some(Stage::AwaitingHello));
    w.advance(Duration::from_millis(1));
    assert_eq!(last_hello_error(&w, slow), ErrorCode::InvalidRequest);
    assert!(w.client(slow).closed);
    let rude = w.connect();
    w.request(rude, Command::List);
    assert_eq!(last_hello_error(&w, rude), ErrorCode::InvalidRequest);
    snapshot("s02_handshake_timeout", &w);
}

/// Scenario 3: The server assigns session ids; list shows them; attach and detach work
/// from any connection; detaching when not attached still answers.
#[test]
fn s03_server_assigned_ids_list_attach_detach() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s1 = create(&mut w, a);
    assert!(kernel::rng::is_uuid_v4(&s1), "server-assigned UUID: {s1}");
    let r = w.request(a, Command::List);
    assert!(
        matches!(ok(&w, a, &r), CommandResult::List { sessions } if sessions.len() == 1 && sessions[0].id == s1)
    );
    let b = w.connect_ready();
    let r = w.request(
        b,
        Command::Attach {
            session_id: s1.clone(),
        },
    );
    assert!(
        matches!(ok(&w, b, &r), CommandResult::Attach { session } if session.attached && session.locked)
    );
    let r = w.request(
        b,
        Command::Detach {
            session_id: s1.clone(),
        },
    );
    assert!(matches!(ok(&w, b, &r), CommandResult::Detach { session_id } if session_id == s1));
    let r = w.request(
        b,
        Command::Detach {
            session_id: s1.clone(),
        },
    );
    assert!(
        matches!(ok(&w, b, &r), CommandResult::Detach { .. }),
        "detach when not attached still answers"
    );
    let r = w.request(
        b,
        Command::Attach {
            session_id: "no-such-session".into(),
        },
    );
    assert_eq!(err(&w, b, &r), ErrorCode::NotFound);
    snapshot("s03_server_assigned_ids_list_attach_detach", &w);
}

/// Scenario 4: One connection holds independent attachments to two sessions: a turn
/// in one does not touch the other, and detaching one leaves the other.
#[test]
fn s04_independent_attachments_on_one_connection() {
    let mut w = World::new(Options::default());
    let c = w.connect_ready();
    let s1 = create(&mut w, c);
    let s2 = create(&mut w, c);
    assert_eq!(w.server.attachments(c).len(), 2);
    let p = w.request(c, prompt(&s1, "only s1"));
    w.settle(Duration::from_secs(10));
    assert!(
        matches!(ok(&w, c, &p), CommandResult::Prompt { session } if session.id == s1 && session.transcript.len() == 2)
    );
    let r = w.request(
        c,
        Command::Detach {
            session_id: s1.clone(),
        },
    );
    ok(&w, c, &r);
    assert_eq!(w.server.attachments(c), vec![s2.clone()]);
    assert!(w.worker_of(&s1).is_none(), "idle and unattached: disposed");
    assert!(w.worker_of(&s2).is_some());
    snapshot("s04_independent_attachments_on_one_connection", &w);
}

/// Scenario 5: Session snapshots and progress go only to attached connections; an
/// unattached connection sees server snapshots only.
#[test]
fn s05_snapshots_and_progress_only_to_attached() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let b = w.connect_ready();
    let s = create(&mut w, a);
    w.request(a, prompt(&s, "hi"));
    w.settle(Duration::from_secs(10));
    let session_events = |w: &World, c| {
        w.client(c)
            .received
            .iter()
            .filter(|m| {
                matches!(
                    m,
                    ServerMessage::Event(
                        ServerEvent::SessionSnapshot { .. } | ServerEvent::SessionProgress { .. }
                    )
                )
            })
            .count()
    };
    assert!(session_events(&w, a) > 5);
    assert_eq!(session_events(&w, b), 0);
    assert!(
        w.client(b)
            .received
            .iter()
            .any(|m| matches!(m, ServerMessage::Event(ServerEvent::ServerSnapshot { .. })))
    );
    snapshot("s05_snapshots_and_progress_only_to_attached", &w);
}

/// Scenario 6: Every attached client controls the one runtime: a prompt from one, a
/// steer from the other, both seen by both; one worker serves them.
#[test]
fn s06_every_attached_client_controls_the_runtime() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let b = w.connect_ready();
    let s = create(&mut w, a);
    w.request(
        b,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    let p = w.request(b, prompt(&s, "from b"));
    w.advance(Duration::from_millis(25));
    let st = w.request(
        a,
        Command::Steer {
            session_id: s.clone(),
            text: "from a".into(),
        },
    );
    assert!(
        matches!(ok(&w, a, &st), CommandResult::Steer { session } if session.queued_steer_count == 1)
    );
    w.settle(Duration::from_secs(10));
    let CommandResult::Prompt { session } = ok(&w, b, &p) else {
        panic!()
    };
    let users = session
        .transcript
        .iter()
        .filter(|i| matches!(i, TranscriptItem::User(_)))
        .count();
    assert_eq!(users, 2, "the steer was taken into the turn");
    assert_eq!(session.queued_steer_count, 0);
    assert_eq!(w.worker_count(), 1);
    snapshot("s06_every_attached_client_controls_the_runtime", &w);
}

/// Scenario 7: Nothing queues: a second prompt during a turn is `busy`; steer and
/// abort work only while a prompt runs; abort ends the turn with an aborted
/// item and the prompt's response still succeeds; settings need idle.
#[test]
fn s07_no_prompt_queueing_steer_and_abort() {
    let mut w = World::new(Options::default());
    let c = w.connect_ready();
    let s = create(&mut w, c);
    let idle_steer = w.request(
        c,
        Command::Steer {
            session_id: s.clone(),
            text: "early".into(),
        },
    );
    assert_eq!(err(&w, c, &idle_steer), ErrorCode::Busy);
    let idle_abort = w.request(
        c,
        Command::Abort {
            session_id: s.clone(),
        },
    );
    assert_eq!(err(&w, c, &idle_abort), ErrorCode::Busy);
    let p = w.request(c, prompt(&s, "long task"));
    w.advance(Duration::from_millis(25));
    let p2 = w.request(c, prompt(&s, "second"));
    assert_eq!(err(&w, c, &p2), ErrorCode::Busy);
    let m = w.request(
        c,
        Command::SetModel {
            session_id: s.clone(),
            model: ModelRef {
                provider: "faux".into(),
                id: "faux-reasoner".into(),
            },
        },
    );
    assert_eq!(err(&w, c, &m), ErrorCode::Busy);
    let st = w.request(
        c,
        Command::Steer {
            session_id: s.clone(),
            text: "focus".into(),
        },
    );
    ok(&w, c, &st);
    assert!(
        w.response(c, &p).is_none(),
        "the prompt is pending during its turn"
    );
    let ab = w.request(
        c,
        Command::Abort {
            session_id: s.clone(),
        },
    );
    let CommandResult::Abort { session } = ok(&w, c, &ab) else {
        panic!()
    };
    assert_eq!(session.phase, SessionPhase::Idle);
    // The steer the model never saw is withdrawn: listed in the abort's
    // response, for the client to put back, and not committed.
    assert_eq!(session.queued_steer.len(), 1, "the abort returns the steer");
    let CommandResult::Prompt { session } = ok(&w, c, &p) else {
        panic!("the aborted prompt succeeds")
    };
    assert!(
        matches!(
            session.transcript.last(),
            Some(TranscriptItem::Assistant(a)) if a.status == AssistantStatus::Aborted
        ),
        "the aborted reply is the last item"
    );
    let m = w.request(
        c,
        Command::SetModel {
            session_id: s.clone(),
            model: ModelRef {
                provider: "faux".into(),
                id: "faux-reasoner".into(),
            },
        },
    );
    ok(&w, c, &m);
    let t = w.request(
        c,
        Command::SetThinking {
            session_id: s.clone(),
            thinking_level: ThinkingLevel::High,
        },
    );
    assert!(
        matches!(ok(&w, c, &t), CommandResult::SetThinking { session } if session.thinking_level == ThinkingLevel::High)
    );
    let bad = w.request(
        c,
        Command::SetThinking {
            session_id: s.clone(),
            thinking_level: ThinkingLevel::Max,
        },
    );
    assert_eq!(err(&w, c, &bad), ErrorCode::InvalidRequest);
    snapshot("s07_no_prompt_queueing_steer_and_abort", &w);
}

/// Scenario 8: The snapshot in a response says whether the requester is attached: a
/// client that detaches during its prompt gets `attached:false`, while the
/// other client's broadcasts say `attached:true`.
#[test]
fn s08_attachment_state_relative_to_requester() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let b = w.connect_ready();
    let s = create(&mut w, a);
    w.request(
        b,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    let p = w.request(a, prompt(&s, "then leave"));
    w.advance(Duration::from_millis(15));
    w.request(
        a,
        Command::Detach {
            session_id: s.clone(),
        },
    );
    w.settle(Duration::from_secs(10));
    let CommandResult::Prompt { session } = ok(&w, a, &p) else {
        panic!()
    };
    assert!(!session.attached, "the requester is no longer attached");
    let last_b = w.client(b).received.iter().rev().find_map(|m| match m {
        ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => Some(snapshot.clone()),
        _ => None,
    });
    assert!(last_b.is_some_and(|s| s.attached && s.phase == SessionPhase::Idle));
    snapshot("s08_attachment_state_relative_to_requester", &w);
}

/// Scenario 9: A running turn survives its only client's disconnect; the runtime is
/// disposed when the turn ends, and the finished reply is stored.
#[test]
fn s09_busy_work_survives_disconnect() {
    let mut w = World::new(Options::default());
    let c = w.connect_ready();
    let s = create(&mut w, c);
    w.request(c, prompt(&s, "keep going"));
    w.advance(Duration::from_millis(15));
    w.disconnect(c);
    assert!(w.worker_of(&s).is_some(), "busy work keeps its runtime");
    w.settle(Duration::from_secs(10));
    assert!(w.worker_of(&s).is_none(), "disposed once idle");
    let stored = &w.store.sessions[&s];
    assert!(
        matches!(stored.transcript.last(), Some(TranscriptItem::Assistant(a)) if matches!(a.status, AssistantStatus::Complete(_)))
    );
    snapshot("s09_busy_work_survives_disconnect", &w);
}

/// Scenario 10: After a restart, stored sessions are listed without starting anything,
/// and attaching opens one lazily with its transcript.
#[test]
fn s10_lazy_restore_after_restart() {
    let mut w = World::new(Options::default());
    let c = w.connect_ready();
    let s = create(&mut w, c);
    w.request(c, prompt(&s, "remember me"));
    w.settle(Duration::from_secs(10));
    w.restart_server();
    assert_eq!(w.worker_count(), 0);
    let c = w.connect_ready();
    let r = w.request(c, Command::List);
    assert!(matches!(ok(&w, c, &r), CommandResult::List { sessions } if sessions.len() == 1));
    assert_eq!(w.worker_count(), 0, "listing opens nothing");
    let r = w.request(
        c,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    let CommandResult::Attach { session } = ok(&w, c, &r) else {
        panic!()
    };
    assert_eq!(session.transcript.len(), 2);
    assert_eq!(w.worker_count(), 1);
    snapshot("s10_lazy_restore_after_restart", &w);
}

/// Scenario 11: A runtime that reports another session id than the one assigned is
/// disposed, and the create fails `invalid_request`.
#[test]
fn s11_wrong_runtime_id_rejected_and_disposed() {
    let mut w = World::new(Options::default());
    w.worker_scripts
        .insert(String::new(), WorkerScript::WrongId("impostor".into()));
    let c = w.connect_ready();
    let r = w.request(c, Command::Create(CreateParams::default()));
    assert_eq!(err(&w, c, &r), ErrorCode::InvalidRequest);
    assert_eq!(w.worker_count(), 0, "the runtime was disposed");
    assert!(w.server.attachments(c).is_empty());
    snapshot("s11_wrong_runtime_id_rejected_and_disposed", &w);
}

/// Scenario 12: A worker that finds the session locked maps to `session_locked`;
/// control commands on a session the connection is not attached to are
/// `invalid_request`.
#[test]
fn s12_lock_errors_and_unattached_control() {
    let mut w = World::new(Options::default());
    let c = w.connect_ready();
    let s = create(&mut w, c);
    w.request(
        c,
        Command::Detach {
            session_id: s.clone(),
        },
    );
    w.worker_scripts.insert(
        s.clone(),
        WorkerScript::Fail(ErrorCode::SessionLocked, format!("Session is locked: {s}")),
    );
    let r = w.request(
        c,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    assert_eq!(err(&w, c, &r), ErrorCode::SessionLocked);
    let r = w.request(c, prompt(&s, "not attached"));
    assert_eq!(err(&w, c, &r), ErrorCode::InvalidRequest);
    let r = w.request(
        c,
        Command::Abort {
            session_id: "unknown".into(),
        },
    );
    assert_eq!(err(&w, c, &r), ErrorCode::InvalidRequest);
    snapshot("s12_lock_errors_and_unattached_control", &w);
}

/// Scenario 13, a durable stop: a graceful close stops accepting, closes
/// every connection and disposes the idle runtimes; a session whose turn
/// runs is let go as an orphan (pi disposes it, aborting the turn), and the
/// next server adopts it, so its reply is stored complete.
#[test]
fn s13_a_stop_keeps_running_turns() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let b = w.connect_ready();
    let s1 = create(&mut w, a);
    let s2 = create(&mut w, b);
    w.request(a, prompt(&s1, "busy"));
    w.advance(Duration::from_millis(15));
    w.shutdown();
    assert!(w.client(a).closed && w.client(b).closed);
    assert!(
        w.trace
            .iter()
            .any(|l| l.ends_with("server shutdown complete"))
    );
    assert_eq!(w.worker_count(), 1, "the busy session's worker goes on");
    assert_eq!(w.store.sessions[&s2].transcript.len(), 0);
    // The next server adopts it, and the reply ends as it would have.
    w.start_server();
    w.advance(Duration::from_secs(5));
    assert!(matches!(
        w.store.sessions[&s1].transcript.last(),
        Some(TranscriptItem::Assistant(a)) if matches!(a.status, AssistantStatus::Complete(_))
    ));
    snapshot("s13_a_stop_keeps_running_turns", &w);
}

/// Scenario 13: A worker whose hello carries a token other than the one it
/// was spawned with is refused and never started; the server's start
/// deadline kills it, and the create fails with the cause.
#[test]
fn s13_a_worker_with_a_forged_token_is_refused() {
    let mut w = World::new(Options::default());
    w.worker_scripts
        .insert(String::new(), WorkerScript::WrongToken);
    let c = w.connect_ready();
    let r = w.request(c, Command::Create(CreateParams::default()));
    assert!(w.response(c, &r).is_none(), "not started: no answer yet");
    w.advance(Duration::from_secs(16));
    assert_eq!(err(&w, c, &r), ErrorCode::InternalError);
    assert_eq!(w.worker_count(), 0, "killed at its start deadline");
    assert!(w.server.attachments(c).is_empty());
    snapshot("s13_a_worker_with_a_forged_token_is_refused", &w);
}
