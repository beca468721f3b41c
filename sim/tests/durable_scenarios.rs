//! The durable server's scenarios (issue 5), scripted against the real kernel
//! in the simulated world: worker lifecycle, replacement with adoption,
//! orphans, sessions outside the catalog. Each trace is an insta snapshot in
//! `snapshots/durable/`.
//!
//! Concurrent cold activation and the selection among several servers in one
//! server dir are CLI behaviours (socket discovery, activation locks); they
//! are covered end to end by `tests/e2e_durable.rs`, not here.

use kernel::ids::ConnId;
use kernel::protocol::{AssistantStatus, Command, CommandResult, CreateParams, TranscriptItem};
use sim::checkers::Checkers;
use sim::world::{Amount, Delivery, Options, World};
use std::time::Duration;

fn snapshot(name: &str, world: &World) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/durable"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, world.trace_text()));
}

fn ok(world: &World, conn: ConnId, id: &str) -> CommandResult {
    match world.response(conn, id).map(|r| r.outcome.clone()) {
        Some(Ok(result)) => result,
        other => panic!("request {id}: expected success, got {other:?}"),
    }
}

fn create(world: &mut World, conn: ConnId) -> String {
    let r = world.request(
        conn,
        Command::Create(CreateParams {
            cwd: Some("/work".into()),
            ..Default::default()
        }),
    );
    world.created(conn, &r)
}

fn attach(world: &mut World, conn: ConnId, s: &str) -> String {
    world.request(
        conn,
        Command::Attach {
            session_id: s.to_string(),
        },
    )
}

fn prompt(s: &str, text: &str) -> Command {
    Command::Prompt {
        session_id: s.to_string(),
        text: text.to_string(),
    }
}

fn completed_turns(world: &World, s: &str) -> usize {
    world.store.sessions[s]
        .transcript
        .iter()
        .filter(|i| matches!(i, TranscriptItem::Assistant(a) if matches!(a.status, AssistantStatus::Complete(_))))
        .count()
}

/// An idle worker stops once the last client attached to its session leaves.
#[test]
fn d01_idle_worker_stops_after_last_client_leaves() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    let b = w.connect_ready();
    let r = attach(&mut w, b, &s);
    ok(&w, b, &r);
    assert_eq!(w.worker_count(), 1);
    w.disconnect(a);
    assert_eq!(w.worker_count(), 1, "one client still attached");
    w.disconnect(b);
    w.settle(Duration::from_secs(1));
    assert_eq!(
        w.worker_count(),
        0,
        "the last client left: the idle worker stops"
    );
    snapshot("d01_idle_worker_stops_after_last_client_leaves", &w);
}

/// Each attached session has its own worker process.
#[test]
fn d02_one_worker_per_attached_session() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s1 = create(&mut w, a);
    let s2 = create(&mut w, a);
    let (w1, w2) = (w.worker_of(&s1).unwrap(), w.worker_of(&s2).unwrap());
    assert_ne!(w1, w2);
    assert_eq!(w.worker_count(), 2);
    snapshot("d02_one_worker_per_attached_session", &w);
}

/// Shutting a server down stops every worker.
#[test]
fn d03_workers_stop_on_shutdown() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    create(&mut w, a);
    create(&mut w, a);
    w.shutdown();
    w.settle(Duration::from_secs(10));
    assert!(w.is_shut_down());
    assert_eq!(w.worker_count(), 0);
    assert!(w.orphans().is_empty(), "a shutdown hands nothing over");
    snapshot("d03_workers_stop_on_shutdown", &w);
}

/// A worker that exited is replaced by a new one on the next attach.
#[test]
fn d04_exited_worker_replaced_on_next_attach() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    let first = w.worker_of(&s).unwrap();
    w.crash_worker(first);
    assert_eq!(w.worker_count(), 0);
    let b = w.connect_ready();
    let r = attach(&mut w, b, &s);
    ok(&w, b, &r);
    let second = w.worker_of(&s).expect("a new worker");
    assert_ne!(first, second);
    snapshot("d04_exited_worker_replaced_on_next_attach", &w);
}

/// A replacement server adopts the old server's workers: the same fake
/// worker (its runtime and model stream) keeps running, the in-flight turn
/// completes, and the old clients, disconnected, re-attach to the new server.
#[test]
fn d05_workers_adopted_after_replacement() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    w.request(a, prompt(&s, "long job"));
    w.advance(Duration::from_millis(15));
    let old = w.worker_of(&s).unwrap();
    assert!(w.is_streaming(old), "a turn is in flight");
    w.replace_server();
    assert_eq!(w.generation(), 1);
    assert!(
        w.client(a).closed,
        "the old server's clients are disconnected"
    );
    assert!(w.orphans().is_empty(), "every orphan was adopted");
    assert_eq!(w.worker_count(), 1, "no second worker was spawned");
    let adopted = w.worker_of(&s).unwrap();
    assert!(
        w.is_streaming(adopted),
        "the same stream continues under the new server"
    );
    let b = w.connect_ready();
    let r = attach(&mut w, b, &s);
    ok(&w, b, &r);
    w.settle(Duration::from_secs(10));
    assert_eq!(completed_turns(&w, &s), 1, "the in-flight turn completed");
    snapshot("d05_workers_adopted_after_replacement", &w);
}

/// An orphan (its server died and none reclaims it) retires after its grace
/// once idle; a busy orphan first finishes its turn and commits it.
#[test]
fn d06_orphaned_idle_worker_retires_after_grace() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let idle = create(&mut w, a);
    let busy = create(&mut w, a);
    w.request(a, prompt(&busy, "keep going"));
    w.crash_server_keep_workers();
    assert_eq!(w.orphans().len(), 2);
    assert_eq!(w.worker_count(), 2, "the workers survive their server");
    w.advance(Duration::from_secs(29));
    assert_eq!(w.worker_count(), 2, "within the grace");
    assert_eq!(
        completed_turns(&w, &busy),
        1,
        "the busy orphan committed its turn"
    );
    w.advance(Duration::from_secs(2));
    assert_eq!(
        w.worker_count(),
        0,
        "both retired after the grace: {:?}",
        w.workers()
    );
    assert!(w.orphans().is_empty());
    assert!(w.store.sessions.contains_key(&idle));
    snapshot("d06_orphaned_idle_worker_retires_after_grace", &w);
}

/// A session an adopted worker holds but the new server's store catalog
/// lacks is still listed and served.
#[test]
fn d07_tracked_sessions_outside_catalog_restored() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    w.crash_server_keep_workers();
    let stored = w.store.sessions.remove(&s).expect("stored");
    w.start_server();
    w.store.sessions.insert(s.clone(), stored);
    assert!(w.orphans().is_empty(), "adopted");
    let b = w.connect_ready();
    let r = w.request(b, Command::List);
    assert!(
        matches!(ok(&w, b, &r), CommandResult::List { sessions } if sessions.iter().any(|m| m.id == s)),
        "listed although outside the catalog"
    );
    let r = attach(&mut w, b, &s);
    ok(&w, b, &r);
    w.request(b, prompt(&s, "still here?"));
    w.settle(Duration::from_secs(10));
    assert_eq!(completed_turns(&w, &s), 1, "served");
    snapshot("d07_tracked_sessions_outside_catalog_restored", &w);
}

/// An attach that reaches the new server right after the hand-off, before
/// the released worker announced itself, waits for the adoption instead of
/// spawning a second worker.
#[test]
fn d08_attach_after_handoff_waits_for_adoption() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    let mut early = None;
    w.replace_server_then(|w| {
        let b = w.connect_ready();
        let r = attach(w, b, &s);
        assert!(w.response(b, &r).is_none(), "the attach waits");
        assert_eq!(w.worker_count(), 1, "no second worker");
        early = Some((b, r));
    });
    let (b, r) = early.unwrap();
    assert!(
        matches!(ok(&w, b, &r), CommandResult::Attach { session } if session.attached),
        "answered once the worker was adopted"
    );
    assert_eq!(w.worker_count(), 1);
    snapshot("d08_attach_after_handoff_waits_for_adoption", &w);
}

/// Issue #15, item 1: a server crashes mid-turn and a new one starts. The
/// session lock, held by a live orphan that serves this server's id, tells
/// it that the orphan will announce itself, so an attach arriving first waits
/// for the adoption instead of spawning a second worker (which would find the
/// lock held and answer `session_locked`); the orphan's turn completes.
#[test]
fn d09_attach_after_crash_waits_for_the_orphan() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    w.request(a, prompt(&s, "keep going"));
    w.crash_server_keep_workers();
    let mut early = None;
    w.start_server_then(|w| {
        let b = w.connect_ready();
        let r = attach(w, b, &s);
        assert!(w.response(b, &r).is_none(), "the attach waits");
        assert_eq!(w.worker_count(), 1, "no second worker");
        early = Some((b, r));
    });
    let (b, r) = early.unwrap();
    assert!(
        matches!(ok(&w, b, &r), CommandResult::Attach { session } if session.attached),
        "answered once the orphan was adopted"
    );
    assert_eq!(w.worker_count(), 1);
    w.settle(Duration::from_secs(10));
    assert_eq!(completed_turns(&w, &s), 1, "the orphan's turn completed");
    snapshot("d09_attach_after_crash_waits_for_the_orphan", &w);
}

/// Issue #15, item 3: a worker killed mid-reply loses at most the
/// checkpoint bound of what its clients were shown: the aborted item the
/// next worker makes keeps the text stored up to the last checkpoint.
#[test]
fn d10_a_crash_mid_reply_keeps_the_checkpointed_text() {
    let options = Options {
        faux_delay: Duration::from_millis(20),
        ..Options::default()
    };
    let mut w = World::new(options);
    let a = w.connect_ready();
    let s = create(&mut w, a);
    let long = (0..60)
        .map(|i| format!("word{i:02}"))
        .collect::<Vec<_>>()
        .join(" ");
    w.request(a, prompt(&s, &long));
    w.advance(Duration::from_millis(600));
    assert!(!w.streaming_replies().is_empty(), "the reply still streams");
    let worker = w.worker_of(&s).unwrap();
    w.crash_worker(worker);
    let b = w.connect_ready();
    let r = attach(&mut w, b, &s);
    let CommandResult::Attach { session } = ok(&w, b, &r) else {
        panic!()
    };
    let Some(TranscriptItem::Assistant(reply)) = session.transcript.last() else {
        panic!("{:?}", session.transcript)
    };
    assert_eq!(reply.status, AssistantStatus::Aborted);
    let kept = kernel::client::follow::text_of(&reply.content);
    assert!(
        kept.len() > 40 && kept.starts_with("You said: word00"),
        "the text up to the last checkpoint is kept: {kept:?}"
    );
    snapshot("d10_a_crash_mid_reply_keeps_the_checkpointed_text", &w);
}

fn listed(world: &mut World, conn: ConnId) -> Vec<String> {
    let r = world.request(conn, Command::List);
    match ok(world, conn, &r) {
        CommandResult::List { sessions } => sessions.into_iter().map(|m| m.id).collect(),
        other => panic!("not a list: {other:?}"),
    }
}

/// Issue #15, item 6, pinned: after a crash, an orphan announced itself
/// before the new server's catalog had loaded, so the server took the
/// stored session for one outside its catalog ("foreign") and forgot it
/// when the adopted worker retired: the session vanished from `list`,
/// `prompt` and `attach` until a restart. The catalog load now tells the
/// server which adopted sessions are stored.
#[test]
fn d11_a_session_adopted_before_the_catalog_loaded_stays_listed() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let s = create(&mut w, a);
    w.request(a, prompt(&s, "before the crash"));
    w.settle(Duration::from_secs(10));
    w.crash_server_keep_workers();
    w.start_server_catalog_late();
    assert!(w.orphans().is_empty(), "adopted");
    // Nobody re-attaches: the adopted worker retires after its grace.
    w.settle(Duration::from_secs(120));
    assert_eq!(w.worker_count(), 0, "the adopted worker retired");
    let b = w.connect_ready();
    assert_eq!(listed(&mut w, b), std::slice::from_ref(&s), "still listed");
    let r = attach(&mut w, b, &s);
    ok(&w, b, &r);
    snapshot(
        "d11_a_session_adopted_before_the_catalog_loaded_stays_listed",
        &w,
    );
}

/// Issue #15, item 5: sessions a sibling server sharing the session
/// directory creates, renames or removes reach this server's list once the
/// change has settled (`Limits::catalog_settle`), and its clients get a
/// server snapshot.
#[test]
fn d12_the_catalog_follows_a_sibling_server() {
    let mut w = World::new(Options::default());
    let a = w.connect_ready();
    let mine = create(&mut w, a);
    let gone = create(&mut w, a);
    let r = w.request(
        a,
        Command::Detach {
            session_id: gone.clone(),
        },
    );
    ok(&w, a, &r);
    w.settle(Duration::from_secs(5));
    let template = w.store.sessions[&mine].clone();
    let theirs = "0e9f1c52-7d2a-4b8e-9f3a-5c6d7e8f9a0b".to_string();
    w.sibling_changes(|store| {
        let mut created = template.clone();
        created.id = theirs.clone();
        created.name = Some("from the sibling".into());
        store.sessions.insert(theirs.clone(), created);
        store.sessions.remove(&gone);
        store.touch(&theirs);
        store.touch(&gone);
        vec![theirs.clone(), gone.clone()]
    });
    let before = listed(&mut w, a);
    assert!(
        before.contains(&gone) && !before.contains(&theirs),
        "not scanned yet"
    );
    w.advance(Duration::from_millis(150));
    let mut expected = vec![mine.clone(), theirs.clone()];
    expected.sort();
    assert_eq!(
        listed(&mut w, a),
        expected,
        "the scan brought the sibling's changes"
    );
    let r = attach(&mut w, a, &theirs);
    ok(&w, a, &r);
    snapshot("d12_the_catalog_follows_a_sibling_server", &w);
}

/// A world whose orphans' announcements travel until delivered, with a
/// session mid-turn on `text`: the world, its session, and checkers fed
/// from its facts.
fn mid_turn_with_travelling_announcements(text: &str) -> (World, String, Checkers) {
    let mut options = Options {
        record_facts: true,
        ..Options::default()
    };
    options.holds.announce = true;
    let mut w = World::new(options);
    let a = w.connect_ready();
    let s = create(&mut w, a);
    w.request(a, prompt(&s, text));
    w.advance(Duration::from_millis(15));
    (w, s, Checkers::new())
}

/// Delivers the one announcement on its way.
fn deliver_the_announcement(w: &mut World) {
    let announcement = w
        .deliveries()
        .into_iter()
        .find(|(_, d)| matches!(d, Delivery::Announcement(_)))
        .expect("the announcement travels")
        .1;
    w.deliver(&announcement, Amount::All);
}

/// A hand-over mid-reply whose orphan streams on while its announcement
/// travels: the hello's snapshot lags what streamed since. A client that
/// waited for the adoption is answered with the reply as it stands, so the
/// text it rebuilds from that answer and the deltas after it has no hole
/// (the ACP editor's "server replacement mid-prompt" lost a word this way).
#[test]
fn d13_a_reply_streamed_while_the_announcement_travels_has_no_hole() {
    let (mut w, s, mut checkers) = mid_turn_with_travelling_announcements("long job");
    let mut early = None;
    w.replace_server_then(|w| {
        let b = w.connect_ready();
        let r = attach(w, b, &s);
        assert!(w.response(b, &r).is_none(), "the attach waits");
        early = Some((b, r));
    });
    let (b, r) = early.unwrap();
    // The orphan streams on while its announcement is on the way.
    w.advance(Duration::from_millis(40));
    deliver_the_announcement(&mut w);
    assert!(
        matches!(ok(&w, b, &r), CommandResult::Attach { session } if session.attached),
        "answered once the orphan was adopted"
    );
    checkers.observe(&mut w).expect("no hole so far");
    w.settle(Duration::from_secs(10));
    checkers
        .observe(&mut w)
        .expect("no hole in the whole reply");
    assert_eq!(completed_turns(&w, &s), 1, "the orphan's turn completed");
    snapshot(
        "d13_a_reply_streamed_while_the_announcement_travels_has_no_hole",
        &w,
    );
}

/// As d13, but the orphan's turn ends while its announcement travels: the
/// server adopts it with a snapshot of a turn that is over. The orphan
/// sends the session as it stands at once, so the server does not hold the
/// session busy forever, and a client attaching later sees the reply whole.
#[test]
fn d14_a_turn_that_ends_while_the_announcement_travels_is_seen_to_end() {
    let (mut w, s, mut checkers) = mid_turn_with_travelling_announcements("short");
    w.replace_server_then(|_| {});
    w.advance(Duration::from_secs(1));
    deliver_the_announcement(&mut w);
    let adopted = w.worker_of(&s).expect("adopted");
    assert_eq!(
        w.server.session_revision(&s),
        w.runtime_revision(adopted),
        "the server holds the session as the orphan does"
    );
    let b = w.connect_ready();
    let r = attach(&mut w, b, &s);
    assert!(
        matches!(ok(&w, b, &r), CommandResult::Attach { session } if session.phase == kernel::protocol::SessionPhase::Idle),
        "the attach sees the turn ended"
    );
    w.settle(Duration::from_secs(10));
    checkers.observe(&mut w).expect("no hole, nothing stale");
    assert_eq!(completed_turns(&w, &s), 1, "the orphan's turn completed");
    snapshot(
        "d14_a_turn_that_ends_while_the_announcement_travels_is_seen_to_end",
        &w,
    );
}
