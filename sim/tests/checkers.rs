//! The checkers fail when they must: each test feeds one checker a fact
//! sequence (or a store) that breaks its property and expects a violation,
//! next to the same sequence made correct.

use kernel::faux;
use kernel::ids::{ConnId, OpId, WorkerId};
use kernel::protocol::{
    Command, CommandResult, Content, CreateParams, ErrorCode, ProtocolError, Response, ServerEvent,
    ServerMessage, SessionPhase, SessionSnapshot, ThinkingLevel, TranscriptItem, UserItem,
};
use kernel::worker::Operation;
use sim::checkers::busy::{Busy, prompt_text};
use sim::checkers::requests::Requests;
use sim::checkers::snapshots::Snapshots;
use sim::checkers::store::StoreChecker;
use sim::world::{Fact, Options, World};
use std::sync::Arc;
use std::time::Duration;

const C1: ConnId = ConnId(1);

fn emitted(message: ServerMessage, attached_after: bool) -> Fact {
    let message = Arc::new(message);
    Fact::Emitted {
        conn: C1,
        message,
        attached_after: Some(attached_after),
        open_after: true,
        shutting_down: false,
    }
}

fn response(id: &str, outcome: Result<CommandResult, ProtocolError>) -> ServerMessage {
    ServerMessage::Response(Response {
        id: id.to_string(),
        outcome,
    })
}

fn snapshot(revision: u64, phase: SessionPhase, prompts: &[&str]) -> SessionSnapshot {
    let user = |text: &&str| {
        let content = vec![Content::Text {
            text: text.to_string(),
        }];
        TranscriptItem::User(UserItem {
            id: format!("item-{text}"),
            content,
            timestamp: 0,
        })
    };
    SessionSnapshot {
        id: "s".into(),
        name: None,
        cwd: "/work".into(),
        created_at: 0,
        updated_at: 0,
        phase,
        model: faux::default_model(),
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision,
        transcript: prompts.iter().map(user).collect(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

#[test]
fn requests_flag_a_second_response_and_a_missing_one() {
    let mut r = Requests::default();
    let sent = Fact::RequestSent {
        conn: C1,
        id: "r1".into(),
        command: Command::List,
    };
    r.observe(&sent).unwrap();
    assert_eq!(r.unanswered().len(), 1, "owed until answered");
    let answer = emitted(
        response(
            "r1",
            Ok(CommandResult::List {
                sessions: Vec::new(),
            }),
        ),
        false,
    );
    r.observe(&answer).unwrap();
    assert!(r.observe(&answer).is_err(), "a second response");
    assert!(
        r.observe(&emitted(
            response("r9", Ok(CommandResult::List { sessions: vec![] })),
            false
        ))
        .is_err()
    );
    r.observe(&Fact::RequestSent {
        conn: C1,
        id: "r2".into(),
        command: Command::List,
    })
    .unwrap();
    r.observe(&Fact::ConnClosed { conn: C1 }).unwrap();
    assert!(
        r.unanswered().is_empty(),
        "forgiven once the connection ends"
    );
}

#[test]
fn snapshots_flag_revisions_going_back_and_a_wrong_attachment() {
    let world = World::new(Options::default());
    let event = |rev| {
        ServerMessage::Event(ServerEvent::SessionSnapshot {
            snapshot: snapshot(rev, SessionPhase::Idle, &[]),
        })
    };
    let mut s = Snapshots::default();
    s.observe(&world, &emitted(event(5), true)).unwrap();
    assert!(
        s.observe(&world, &emitted(event(5), true)).is_err(),
        "events strictly increase"
    );
    let attach = |rev| {
        response(
            "r1",
            Ok(CommandResult::Attach {
                session: snapshot(rev, SessionPhase::Idle, &[]),
            }),
        )
    };
    s.observe(&world, &emitted(attach(5), true)).unwrap();
    assert!(
        s.observe(&world, &emitted(attach(4), true)).is_err(),
        "responses never go back"
    );
    let mut fresh = Snapshots::default();
    assert!(
        fresh.observe(&world, &emitted(attach(1), false)).is_err(),
        "attached=true but detached"
    );
    assert!(
        fresh.observe(&world, &emitted(event(1), false)).is_err(),
        "an event to a detached connection"
    );
}

#[test]
fn busy_flags_wrong_runtime_answers_and_two_running_prompts() {
    let mut busy = Busy::default();
    let op = |operation, phase_before, immediate| Fact::RuntimeOp {
        worker: WorkerId(1),
        session_id: "s".into(),
        op: OpId(1),
        operation,
        phase_before,
        immediate,
        store_failed: false,
    };
    let prompt = |conn, id: &str| Operation::prompt(prompt_text(ConnId(conn), id, false));
    assert!(
        busy.observe(&op(
            prompt(1, "r1"),
            SessionPhase::Idle,
            Some(Err(ErrorCode::Busy))
        ))
        .is_err()
    );
    assert!(
        busy.observe(&op(Operation::Abort, SessionPhase::Idle, Some(Ok(()))))
            .is_err()
    );
    busy.observe(&op(Operation::Abort, SessionPhase::Turn, Some(Ok(()))))
        .unwrap();
    busy.observe(&op(prompt(1, "r1"), SessionPhase::Idle, None))
        .unwrap();
    let second = Fact::RuntimeOp {
        worker: WorkerId(1),
        session_id: "s".into(),
        op: OpId(2),
        operation: prompt(2, "r1"),
        phase_before: SessionPhase::Idle,
        immediate: None,
        store_failed: false,
    };
    busy.observe(&second).unwrap();
    let turn = snapshot(3, SessionPhase::Turn, &["c1#r1", "c2#r1"]);
    let event = ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot: turn });
    assert!(
        busy.observe(&emitted(event.clone(), true)).is_err(),
        "two prompts running"
    );
    busy.observe(&Fact::OpDoneConsumed {
        worker: WorkerId(1),
        op: OpId(1),
        session_id: Some("s".into()),
    })
    .unwrap();
    busy.observe(&emitted(event, true)).unwrap();
}

#[test]
fn store_flags_a_changed_or_lost_committed_item() {
    let mut w = World::new(Options::default());
    let c = w.connect_ready();
    let r = w.request(c, Command::Create(CreateParams::default()));
    let s = w.created(c, &r);
    w.request(
        c,
        Command::Prompt {
            session_id: s.clone(),
            text: "hi".into(),
        },
    );
    w.settle(Duration::from_secs(10));
    let mut checker = StoreChecker::default();
    checker.check(&mut w.store).unwrap();
    assert!(checker.items >= 2, "the prompt and the reply are committed");
    let TranscriptItem::User(user) = &mut w.store.sessions.get_mut(&s).unwrap().transcript[0]
    else {
        panic!("the prompt comes first")
    };
    user.content = vec![Content::Text {
        text: "rewritten".into(),
    }];
    w.store.touch(&s);
    assert!(
        checker.check(&mut w.store).is_err(),
        "a committed item changed"
    );
    let mut checker = StoreChecker::default();
    w.store.touch(&s);
    checker.check(&mut w.store).unwrap();
    w.store.sessions.remove(&s);
    w.store.touch(&s);
    assert!(
        checker.check(&mut w.store).is_err(),
        "a session vanished without a removal"
    );
}

#[test]
fn listed_flags_a_stored_session_missing_and_a_removed_one_named() {
    let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let fact = |listed: &[&str], settling: &[&str]| Fact::Listed {
        conn: C1,
        listed: ids(listed),
        stored: ids(&["a", "b"]),
        settling: ids(settling),
        removed: ids(&["r"]),
    };
    let check = sim::checkers::listed::observe;
    assert!(check(&fact(&["a", "b"], &[])).is_ok());
    assert!(check(&fact(&["a"], &["b"])).is_ok(), "b is being created");
    let violation = check(&fact(&["a"], &[])).unwrap_err();
    assert_eq!(violation.checker, "listed");
    assert!(violation.message.contains("\"b\""), "{violation}");
    let violation = check(&fact(&["a", "b", "r"], &[])).unwrap_err();
    assert!(
        violation.message.contains("removed sessions [\"r\"]"),
        "a removed session came back: {violation}"
    );
}
