//! Kernel edge cases beyond the seed scenarios: hostile bytes, limits, worker
//! crashes and removal, scripted in the simulated world. Traces are insta
//! snapshots in `snapshots/kernel/`.

use kernel::ids::ConnId;
use kernel::limits::Limits;
use kernel::protocol::{
    AssistantStatus, Command, CommandResult, CreateParams, ErrorCode, ServerEvent, ServerMessage,
    TranscriptItem,
};
use sim::world::{Options, World};
use std::time::Duration;

fn snapshot(name: &str, world: &World) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/kernel"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, world.trace_text()));
}

fn hello_error(world: &World, conn: ConnId) -> (ErrorCode, String) {
    match world.client(conn).received.last() {
        Some(ServerMessage::HelloError(e)) => (e.code, e.message.clone()),
        other => panic!("expected hello_error last, got {other:?}"),
    }
}

fn create(world: &mut World, conn: ConnId) -> String {
    let r = world.request(conn, Command::Create(CreateParams::default()));
    world.created(conn, &r)
}

/// Garbage bytes, an oversize frame header, a second hello and an unknown
/// field each end that connection with `hello_error invalid_request`, while
/// another client keeps being served.
#[test]
fn hostile_bytes_close_only_their_connection() {
    let limits = Limits {
        max_frame_len: 1024,
        max_output_bytes_per_connection: 64 * 1024,
        ..Limits::default()
    };
    let mut w = World::new(Options {
        limits,
        ..Options::default()
    });
    let good = w.connect_ready();
    let garbage = w.connect();
    w.send_bytes(garbage, vec![0, 0, 0, 3, 0xff, 0xff, 0xff]);
    assert_eq!(hello_error(&w, garbage).0, ErrorCode::InvalidRequest);
    let oversize = w.connect();
    w.send_bytes(oversize, 5000u32.to_be_bytes().to_vec());
    let (code, message) = hello_error(&w, oversize);
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(message.contains("exceeds"), "{message}");
    let twice = w.connect_ready();
    w.hello(twice, 1, None);
    assert_eq!(hello_error(&w, twice).0, ErrorCode::InvalidRequest);
    let unknown = w.connect();
    // {type:"hello", version:1, extra:true}
    let payload = b"\xa3\x64type\x65hello\x67version\x01\x65extra\xf5".to_vec();
    let mut frame = (payload.len() as u32).to_be_bytes().to_vec();
    frame.extend(payload);
    w.send_bytes(unknown, frame);
    let (code, message) = hello_error(&w, unknown);
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(message.contains("extra"), "{message}");
    for c in [garbage, oversize, twice, unknown] {
        assert!(w.client(c).closed);
    }
    let r = w.request(good, Command::List);
    assert!(matches!(
        w.response(good, &r).map(|r| &r.outcome),
        Some(Ok(CommandResult::List { .. }))
    ));
    snapshot("edge_hostile_bytes_close_only_their_connection", &w);
}

/// A client that stops reading is cut off when its queued output would pass
/// its bound; the other attached client keeps receiving everything.
#[test]
fn slow_consumer_is_cut_off_at_its_bound() {
    let limits = Limits {
        max_frame_len: 4096,
        max_output_bytes_per_connection: 8 * 1024,
        ..Limits::default()
    };
    let mut w = World::new(Options {
        limits,
        ..Options::default()
    });
    let fast = w.connect_ready();
    let slow = w.connect_ready();
    let s = create(&mut w, fast);
    w.request(
        slow,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    w.set_reading(slow, false);
    for i in 0..6 {
        let p = w.request(
            fast,
            Command::Prompt {
                session_id: s.clone(),
                text: format!("turn {i}"),
            },
        );
        w.settle(Duration::from_secs(10));
        assert!(
            w.response(fast, &p).is_some(),
            "the fast client keeps being served"
        );
    }
    assert!(w.client(slow).closed, "the slow client was cut off");
    assert!(w.server.queued_bytes(fast) == 0);
    snapshot("edge_slow_consumer_is_cut_off_at_its_bound", &w);
}

/// Over the connection limit, a new connection gets `hello_error` and is closed.
#[test]
fn connection_limit_is_explicit() {
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let mut w = World::new(Options {
        limits,
        ..Options::default()
    });
    let _a = w.connect_ready();
    let _b = w.connect_ready();
    let c = w.connect();
    let (code, message) = hello_error(&w, c);
    assert_eq!(code, ErrorCode::InternalError);
    assert!(message.contains("connection limit"), "{message}");
    assert!(w.client(c).closed);
    snapshot("edge_connection_limit_is_explicit", &w);
}

/// A worker crash mid-turn has runtime-error semantics: every attached
/// connection is closed; the committed transcript survives; the next attach
/// spawns a fresh worker, which records the interrupted reply as aborted.
#[test]
fn worker_crash_mid_turn() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    let p = w.request(
        a,
        Command::Prompt {
            session_id: s.clone(),
            text: "first".into(),
        },
    );
    w.settle(Duration::from_secs(10));
    assert!(w.response(a, &p).is_some());
    w.request(
        a,
        Command::Prompt {
            session_id: s.clone(),
            text: "second".into(),
        },
    );
    w.advance(Duration::from_millis(25));
    let worker = w.worker_of(&s).expect("live");
    w.crash_worker(worker);
    assert!(w.client(a).closed, "attached connections are closed");
    let b = w.connect_ready();
    let r = w.request(
        b,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    let Some(Ok(CommandResult::Attach { session })) = w.response(b, &r).map(|r| r.outcome.clone())
    else {
        panic!("re-attach works")
    };
    assert_ne!(w.worker_of(&s), Some(worker), "a fresh worker");
    let statuses: Vec<_> = session
        .transcript
        .iter()
        .filter_map(|i| match i {
            TranscriptItem::Assistant(a) => Some(a.status),
            _ => None,
        })
        .collect();
    assert!(
        matches!(
            statuses.as_slice(),
            [AssistantStatus::Complete(_), AssistantStatus::Aborted]
        ),
        "{statuses:?}"
    );
    snapshot("edge_worker_crash_mid_turn", &w);
}

/// `remove` (our extension) deletes an idle session: attached connections
/// get `session_removed`, the store forgets it, and it is gone from lists.
/// A busy session is not removed.
#[test]
fn remove_session() {
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
    w.request(
        a,
        Command::Prompt {
            session_id: s.clone(),
            text: "busy".into(),
        },
    );
    let r = w.request(
        b,
        Command::Remove {
            session_id: s.clone(),
        },
    );
    assert!(
        matches!(w.response(b, &r).map(|r| &r.outcome), Some(Err(e)) if e.code == ErrorCode::Busy)
    );
    w.settle(Duration::from_secs(10));
    let r = w.request(
        b,
        Command::Remove {
            session_id: s.clone(),
        },
    );
    assert!(matches!(
        w.response(b, &r).map(|r| &r.outcome),
        Some(Ok(CommandResult::Remove { .. }))
    ));
    assert!(!w.store.sessions.contains_key(&s));
    assert!(w.client(a).received.iter().any(|m| matches!(m, ServerMessage::Event(ServerEvent::SessionRemoved { session_id }) if *session_id == s)));
    let r = w.request(a, Command::List);
    assert!(
        matches!(w.response(a, &r).map(|r| &r.outcome), Some(Ok(CommandResult::List { sessions })) if sessions.is_empty())
    );
    let r = w.request(
        a,
        Command::Remove {
            session_id: s.clone(),
        },
    );
    assert!(
        matches!(w.response(a, &r).map(|r| &r.outcome), Some(Err(e)) if e.code == ErrorCode::NotFound)
    );
    snapshot("edge_remove_session", &w);
}

/// Issue #15, item 2: a full store is reported and survived. The prompt
/// that could not be written is answered with the cause; the connection,
/// the other attached client and the worker stay; both clients see the
/// session as stored; once there is room again, the session works without a
/// restart.
#[test]
fn a_full_store_is_reported_and_survived() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    let b = w.connect_ready();
    let r = w.request(
        b,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    assert!(matches!(w.response(b, &r).map(|r| &r.outcome), Some(Ok(_))));
    w.store.fail_writes = true;
    let p = w.request(
        a,
        Command::Prompt {
            session_id: s.clone(),
            text: "doomed".into(),
        },
    );
    w.settle(Duration::from_secs(5));
    match w.response(a, &p).map(|r| &r.outcome) {
        Some(Err(e)) => {
            assert_eq!(e.code, ErrorCode::InternalError);
            assert!(
                e.message.contains("storage write failure")
                    && e.message.contains("free some space"),
                "{}",
                e.message
            );
        }
        other => panic!("the prompt gets the cause: {other:?}"),
    }
    assert!(
        !w.client(a).closed && !w.client(b).closed,
        "nobody is cut off"
    );
    assert_eq!(w.worker_count(), 1, "the worker survives");
    w.store.fail_writes = false;
    let p = w.request(
        a,
        Command::Prompt {
            session_id: s.clone(),
            text: "again".into(),
        },
    );
    w.settle(Duration::from_secs(5));
    assert!(
        matches!(
            w.response(a, &p).map(|r| &r.outcome),
            Some(Ok(CommandResult::Prompt { .. }))
        ),
        "works again once there is room"
    );
    snapshot("edge_a_full_store_is_reported_and_survived", &w);
}
