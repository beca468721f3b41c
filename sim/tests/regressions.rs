//! Kernel bugs the simulator found, each kept as a minimal scripted
//! reproduction plus the swarm seed that first hit it. The seeds' options are
//! pinned by `SwarmOptions::from_seed`; if kernel behaviour changes, a seed may
//! stop reaching the bug, so the scripted reproduction is the real guard.

use kernel::ids::ConnId;
use kernel::protocol::{
    Command, CommandResult, CreateParams, ErrorCode, ServerMessage, encode_server_message,
};
use sim::options::{Overrides, SwarmOptions};
use sim::swarm;
use sim::world::{Holds, Options, World};

fn ok(world: &World, conn: kernel::ids::ConnId, id: &str) -> CommandResult {
    match world.response(conn, id).map(|r| r.outcome.clone()) {
        Some(Ok(result)) => result,
        other => panic!("request {id}: expected success, got {other:?}"),
    }
}

/// Runs a swarm seed and asserts that it passes.
fn seed_passes(seed: u64) {
    let (report, _) = swarm::run(SwarmOptions::from_seed(seed, &Overrides::default()), false);
    if let Err(failure) = report.result {
        panic!("seed {seed}: {failure}\nreproduce with: cargo run -p sim -- --seed {seed} --trace");
    }
}

/// Bug 1 (found by seed 1): an `attach` that waits for a disposing session's
/// worker to exit was dropped — never answered, its in-flight count leaked —
/// when a `remove` of the same session was accepted meanwhile.
///
/// Method: hold server → worker messages so the session stays `Disposing`;
/// attach from one client and remove from another while it does; then let the
/// worker exit. The attach must be answered `not_found`.
#[test]
fn attach_waiting_on_a_disposing_session_is_answered_when_it_is_removed() {
    let holds = Holds {
        to_worker: true,
        ..Holds::none()
    };
    let mut w = World::new(Options {
        holds,
        ..Options::default()
    });
    let a = w.connect_ready();
    let r = w.request(a, Command::Create(CreateParams::default()));
    deliver_all(&mut w);
    let s = w.created(a, &r);
    let r = w.request(
        a,
        Command::Detach {
            session_id: s.clone(),
        },
    );
    ok(&w, a, &r);
    let b = w.connect_ready();
    let attach = w.request(
        b,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    assert!(
        w.response(b, &attach).is_none(),
        "the attach waits for the old worker to exit"
    );
    let remove = w.request(
        a,
        Command::Remove {
            session_id: s.clone(),
        },
    );
    deliver_all(&mut w);
    assert!(matches!(ok(&w, a, &remove), CommandResult::Remove { .. }));
    match w.response(b, &attach).map(|r| &r.outcome) {
        Some(Err(e)) => assert_eq!(e.code, ErrorCode::NotFound),
        other => panic!("the waiting attach must be answered not_found, got {other:?}"),
    }
    let list = w.request(b, Command::List);
    assert!(matches!(ok(&w, b, &list), CommandResult::List { sessions } if sessions.is_empty()));
}

fn deliver_all(w: &mut World) {
    while let Some((_, d)) = w.deliveries().into_iter().min() {
        w.deliver(&d, sim::world::Amount::All);
    }
}

/// Bug 1, as the swarm first found it.
#[test]
fn seed_1_attach_dropped_by_remove() {
    seed_passes(1);
}

/// Bug 2 (found by seed 297 and many others): the kernel asserted at most
/// `max_connections + 1` connections, but a refused connection stays
/// `Closing` until the driver has flushed its `hello_error` and reports it
/// gone; a second connect in between panicked the server.
///
/// Method: one connection allowed; hold server → client frames so the
/// refused connection cannot finish closing; connect twice more.
#[test]
fn refused_connections_still_closing_do_not_break_the_connection_bound() {
    let limits = kernel::limits::Limits {
        max_connections: 1,
        ..Default::default()
    };
    let holds = Holds {
        to_client: true,
        ..Holds::none()
    };
    let mut w = World::new(Options {
        limits,
        holds,
        ..Options::default()
    });
    let first = w.connect_ready();
    let refused: Vec<_> = (0..3).map(|_| w.connect()).collect();
    assert_eq!(
        w.server.connection_count(),
        4,
        "three refused connections are still closing"
    );
    deliver_all(&mut w);
    assert_eq!(w.server.connection_count(), 1);
    for conn in refused {
        assert!(w.client(conn).closed);
    }
    assert!(!w.client(first).closed);
}

/// Bug 2, as the swarm first found it.
#[test]
fn seed_297_connection_bound() {
    seed_passes(297);
}

/// Two clients attach while the session opens; the first does not read.
/// Returns the world just before the worker boots, the two clients, and the session.
fn admission(limits: kernel::limits::Limits) -> (World, ConnId, ConnId, String) {
    let holds = Holds {
        boot: true,
        ..Holds::none()
    };
    let mut w = World::new(Options {
        limits,
        holds,
        ..Options::default()
    });
    let c = w.connect_ready();
    let r = w.request(c, Command::Create(CreateParams::default()));
    deliver_all(&mut w);
    let s = w.created(c, &r);
    w.disconnect(c); // idle and unattached: disposed, its worker exits
    let slow = w.connect();
    w.set_reading(slow, false); // everything it is sent from now on stays queued
    w.hello(slow, 1, None);
    for _ in 0..2 {
        let passer_by = w.connect_ready();
        w.disconnect(passer_by); // a server snapshot more for `slow` to not read
    }
    let other = w.connect_ready();
    w.request(
        slow,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    w.request(
        other,
        Command::Attach {
            session_id: s.clone(),
        },
    );
    (w, slow, other, s)
}

/// Bug 3 (found by seed 866): when a session opened with several attaches
/// waiting, admitting one whose response overflowed its connection's output
/// bound closed that connection, which disposed the session (nobody was
/// attached yet) — and the next waiter was then attached to a disposing
/// session: a kernel assertion, i.e. a server panic.
///
/// Method: measure in a probe world how many bytes the slow client has queued
/// before the boot (`queued`) and how long its attach response is
/// (`response`); rerun with an output bound one byte short of both. The slow
/// client was sent two more server snapshots than the other, so the other
/// fits the (large) server snapshots it receives meanwhile.
#[test]
fn admission_that_closes_a_slow_consumer_keeps_the_other_waiters() {
    let (mut probe, slow, _, _) = admission(kernel::limits::Limits::default());
    let queued = probe.server.queued_bytes(slow);
    deliver_all(&mut probe);
    let response = probe.client(slow).received.iter().find(|m| {
        matches!(m, ServerMessage::Response(r) if matches!(r.outcome, Ok(CommandResult::Attach { .. })))
    });
    let encoded = encode_server_message(response.expect("the probe's attach was answered"));
    let response = encoded.expect("encodable").len() + 4;
    let bound = queued + response - 1;
    let limits = kernel::limits::Limits {
        max_frame_len: (bound - 4) as u32,
        max_output_bytes_per_connection: bound,
        ..Default::default()
    };
    let (mut w, slow, other, s) = admission(limits);
    deliver_all(&mut w);
    assert!(
        w.client(slow).closed,
        "the slow client was cut off at its bound"
    );
    assert_eq!(
        w.server.attachments(other),
        vec![s.clone()],
        "the other waiter is attached"
    );
    let attach = w.client(other).received.iter().any(|m| {
        matches!(m, ServerMessage::Response(r) if matches!(r.outcome, Ok(CommandResult::Attach { .. })))
    });
    assert!(attach, "its attach was answered");
}

/// Bug 3, as the swarm first found it.
#[test]
fn seed_866_attached_while_disposing() {
    seed_passes(866);
}

/// A catalog change due while the server shut down left a scan deadline in
/// the past for good (no scan starts during a shutdown): the liveness check
/// saw a deadline pending forever, and the daemon's loop would have spun.
#[test]
fn seed_1796558075540946358_scan_deadline_during_shutdown() {
    seed_passes(1_796_558_075_540_946_358);
}
