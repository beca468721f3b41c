//! Kernel bugs the v8 clients and checkers found, each as a minimal
//! scripted reproduction. Those the kernel still has are `#[ignore]`d (the
//! simulator reports kernel bugs, it does not fix them): `cargo test -p
//! sim --test v8_regressions -- --ignored` fails on each until it is
//! fixed; then drop the `#[ignore]`. Bugs 1–6 were fixed in `ed6b3af`;
//! all stay as guards.
//!
//! Bugs 7 and 8 were fixed after them; the swarm's v8 clients now cancel
//! management calls too (`AVOID_KNOWN_V8_BUGS` is off).

use kernel::ids::ConnId;
use kernel::protocol::{Command, CreateParams};
use kernel::wire::Value;
use sim::checkers::Checkers;
use sim::world::v8::{AGENT, MANAGEMENT, TRANSCRIPT, prompt_request};
use sim::world::{Amount, Delivery, Holds, Options, World};
use std::time::Duration;

fn world(holds: Holds) -> World {
    World::new(Options {
        holds,
        record_facts: true,
        ..Options::default()
    })
}

fn deliver_all(w: &mut World) {
    while let Some((_, d)) = w.deliveries().into_iter().min() {
        w.deliver(&d, Amount::All);
    }
}

/// Two sessions stored, neither live (made by a v1 client that leaves).
fn two_cold_sessions(w: &mut World) -> (String, String) {
    let c = w.connect_ready();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = w.request(c, Command::Create(CreateParams::default()));
        deliver_all(w);
        ids.push(w.created(c, &r));
    }
    w.disconnect(c);
    w.settle(Duration::from_secs(60));
    deliver_all(w);
    (ids[0].clone(), ids[1].clone())
}

fn attach(w: &mut World, conn: ConnId, session: &str) -> String {
    w.v8_server_call(conn, MANAGEMENT, "attach", vec![Value::text(session)])
}

/// Bug 1: a v8 connection with two attaches in flight (each waiting for
/// its session's worker) ends up attached to both, and the kernel's own
/// invariant ("a v8 route is its one attachment") panics: the server
/// process dies, whatever build (the invariants run in release too, every
/// `FULL_CHECK_INTERVAL` steps).
///
/// Where: `kernel/src/server/v8/mod.rs`, `v8_attach` compares the new
/// session only with the admitted route (none yet, while the first attach
/// waits), and `v8_admit` sets the route and inserts the session into
/// `attached` without releasing the route another admitted attach set
/// meanwhile. pi's server runs `attach` calls one at a time (pi-v8.md §3.2).
///
/// Fixed in `ed6b3af`.
#[test]
fn bug1_two_attaches_in_flight_on_one_v8_connection() {
    let mut w = world(Holds {
        boot: true,
        ..Holds::none()
    });
    let (a, b) = two_cold_sessions(&mut w);
    let c = w.connect_v8();
    attach(&mut w, c, &a);
    attach(&mut w, c, &b);
    // When both workers are on their way, the second boots first.
    let boots: Vec<Delivery> = w
        .deliveries()
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| matches!(d, Delivery::Boot(_)))
        .collect();
    for boot in boots.iter().rev() {
        w.deliver(boot, Amount::All); // the kernel panicked here
    }
    deliver_all(&mut w);
    assert_eq!(
        w.server.attachments(c),
        vec![b],
        "attached to the session of its last attach only"
    );
}

/// Bug 2: a graceful hand-off while a v8 prompt runs panics the old
/// server (`finish_pending`: "no request in flight").
///
/// Where: `kernel/src/server/sessions.rs`, `on_handoff` calls
/// `finish_pending` for every pending operation of every live session,
/// but a v8 prompt's operation (answered at once, no request id) was never
/// counted in flight (`start_op`); `fail_ops` skips those, `on_handoff`
/// does not.
///
/// Fixed in `ed6b3af`.
#[test]
fn bug2_a_handoff_while_a_v8_prompt_runs() {
    let mut w = world(Holds::none());
    let (s, _) = two_cold_sessions(&mut w);
    let c = w.connect_v8();
    attach(&mut w, c, &s);
    w.v8_session_call(c, AGENT, "prompt", vec![prompt_request("c1#r2")]);
    w.advance(Duration::from_millis(25));
    w.replace_server(); // the old server panics here
    assert_eq!(w.generation(), 1);
}

/// Bug 3: a v8 client that sent `attach`, then `detach`, stays attached:
/// the detach of a connection whose attach waits for its worker is
/// answered at once (nothing is attached yet), and the attach completes
/// after it. pi's server runs management calls one at a time, so the
/// client's last call decides (pi-v8.md §3.2). The checker's rule (f')
/// flags the detach answered before the attach.
///
/// Where: `kernel/src/server/v8/mod.rs`, `on_server_call`'s `detach` looks
/// only at the admitted route; nothing orders a connection's management
/// calls.
///
/// Fixed in `ed6b3af`.
#[test]
fn bug3_a_detach_sent_after_an_attach_is_answered_first() {
    let mut w = world(Holds {
        boot: true,
        ..Holds::none()
    });
    let (s, _) = two_cold_sessions(&mut w);
    let mut checkers = Checkers::new();
    checkers.observe(&mut w).expect("the setup breaks nothing");
    let c = w.connect_v8();
    attach(&mut w, c, &s);
    w.v8_server_call(c, MANAGEMENT, "detach", vec![]);
    deliver_all(&mut w);
    let verdict = checkers.observe(&mut w);
    assert!(
        w.server.attachments(c).is_empty(),
        "its last call was a detach, yet it is attached to {:?}",
        w.server.attachments(c)
    );
    verdict.expect("management calls answered in order");
}

/// Bug 4: an `attach` that fails (an unknown session) after the
/// connection was attached elsewhere drops the old attachment without
/// telling the client: no `attachment null`, so the client keeps a route
/// the kernel no longer has, and its subscriptions under it go silent.
/// pi's server resolves the session before it releases the old
/// attachment (pi-v8.md §3.2, `attach`). The checker's route agreement
/// flags it.
///
/// Where: `kernel/src/server/v8/mod.rs`, `v8_attach` calls
/// `v8_release(conn, false)` (and `detach`, whose release then publishes
/// nothing) before `on_attach` has found the session.
///
/// Fixed in `ed6b3af`.
#[test]
fn bug4_a_failed_attach_drops_the_old_route_untold() {
    let mut w = world(Holds::none());
    let (s, _) = two_cold_sessions(&mut w);
    let mut checkers = Checkers::new();
    checkers.observe(&mut w).expect("the setup breaks nothing");
    let c = w.connect_v8();
    attach(&mut w, c, &s);
    w.v8_subscribe(c, TRANSCRIPT);
    checkers.observe(&mut w).expect("attached");
    let failed = attach(&mut w, c, sim::swarm::UNKNOWN_SESSION);
    assert!(matches!(w.v8_answer(c, &failed), Some(Err(_))));
    let told = w.v8_client(c).route.as_ref().map(|r| r.session_id.clone());
    let kernel = w.server.attachments(c).first().cloned();
    let verdict = checkers.observe(&mut w);
    assert_eq!(
        told, kernel,
        "the route the client was told is the kernel's"
    );
    verdict.expect("routes agree");
}

/// Bug 5: a v8 prompt is refused `busy` while the session runs no turn,
/// only because another operation (here a model change) is on
/// its way to the worker; a v1 prompt at that moment runs. The issue's
/// rule is "a busy session is busy for both", and pi's `prompt` rejects
/// only while the agent runs (pi-v8.md §3.5).
///
/// Where: `kernel/src/server/v8/mod.rs`, `on_session_call` answers
/// `prompt` from `Live::is_busy` (`kernel/src/server/sessions.rs`), which
/// counts every operation in flight, not only a running turn.
///
/// Fixed in `ed6b3af`.
#[test]
fn bug5_a_v8_prompt_is_refused_busy_while_only_a_setting_changes() {
    let mut w = world(Holds {
        to_worker: true,
        ..Holds::none()
    });
    let (s, _) = two_cold_sessions(&mut w);
    let c = w.connect_v8();
    attach(&mut w, c, &s);
    deliver_all(&mut w);
    let model = &kernel::faux::models()[1];
    let select = vec![Value::Map(vec![
        ("provider".into(), Value::text(&model.provider)),
        ("modelId".into(), Value::text(&model.id)),
    ])];
    w.v8_session_call(c, sim::world::v8::MODELS, "select", select);
    // The change waits on its way to the worker; the session runs no turn.
    assert_eq!(
        w.runtime_phase(w.worker_of(&s).unwrap()),
        Some(kernel::protocol::SessionPhase::Idle)
    );
    let p = w.v8_session_call(c, AGENT, "prompt", vec![prompt_request("c1#r4")]);
    let answer = w.v8_answer(c, &p).cloned();
    let accepted = answer
        .as_ref()
        .and_then(|a| a.as_ref().ok())
        .and_then(|r| r.as_ref())
        .and_then(|r| r.get("accepted"))
        .cloned();
    assert_eq!(accepted, Some(Value::Bool(true)), "answered {answer:?}");
}

/// Bug 6: cancelling a v8 request whose work goes on (a `create` waiting
/// for its worker) frees its place among the connection's active requests
/// but not in `Connection::in_flight`; the next such request takes
/// `in_flight` past `max_requests_in_flight_per_connection` and the
/// kernel's invariant panics: any v8 client can stop the server.
///
/// Where: `kernel/src/server/v8/mod.rs`, `on_v8_cancel` answers and
/// forgets the request (`v8_reply`) while its waiter or operation still
/// counts in flight; `on_v8_request` admits by the active requests only,
/// and `v8_create` (like `start_op` with a request id) adds to `in_flight`
/// unchecked. The invariant is `check_connection`'s "in flight"
/// (`kernel/src/server/mod.rs`).
///
/// Fixed in `ed6b3af`.
#[test]
fn bug6_cancelled_requests_still_count_in_flight() {
    let mut w = World::new(Options {
        holds: Holds {
            boot: true,
            ..Holds::none()
        },
        limits: kernel::limits::Limits {
            max_requests_in_flight_per_connection: 1,
            ..Default::default()
        },
        ..Options::default()
    });
    let c = w.connect_v8();
    let create = w.v8_server_call(c, MANAGEMENT, "create", vec![Value::Null]);
    w.v8_cancel(c, &create, &sim::world::v8::server_target());
    // The kernel panics here: two creates in flight, the limit is one.
    w.v8_server_call(c, MANAGEMENT, "create", vec![Value::Null]);
    deliver_all(&mut w);
}

/// Bug 7 (open, in the fixes of bugs 1–6): an `attach` cancelled while
/// its session's worker boots still routes the connection when the
/// worker is ready. Sent again meanwhile, it panics the server ("attached
/// while Disposing"): the cancelled attach's waiter is admitted and
/// routes the connection, and the second one, finding the same session
/// as the old route, releases it — the session, attached by nobody for a
/// moment, is disposed — and attaches the connection to it.
///
/// Where: `kernel/src/server/v8/mod.rs`, `v8_admit` admits a waiter whose
/// request was cancelled (its answer is dropped by `v8_reply`, its route
/// is not), and releases an old route that names the very session it
/// admits to, with `maybe_dispose` on the release.
#[test]
fn bug7_an_attach_cancelled_while_its_worker_boots_then_sent_again() {
    let mut w = world(Holds {
        boot: true,
        ..Holds::none()
    });
    let (s, _) = two_cold_sessions(&mut w);
    let c = w.connect_v8();
    let first = attach(&mut w, c, &s);
    w.v8_cancel(c, &first, &sim::world::v8::server_target());
    attach(&mut w, c, &s);
    deliver_all(&mut w); // the kernel panicked here
    assert_eq!(w.server.attachments(c), vec![s]);
}

/// Bug 8 (open, in the fix of bug 3): a management call cancelled while
/// it waits its turn behind another stalls the connection's queue: the
/// calls queued after it are never answered (a liveness failure).
///
/// Where: `kernel/src/server/v8/mod.rs`: the cancel answers the queued
/// call and forgets it as active, but leaves it in `management_queue`;
/// `v8_run_management` later runs it and sets `managing` to its id, and
/// its answer goes through `v8_end`, which returns at once for an id no
/// longer active, before it clears `managing`: nothing runs after it.
#[test]
fn bug8_a_management_call_cancelled_in_the_queue_stalls_the_rest() {
    let mut w = world(Holds {
        boot: true,
        ..Holds::none()
    });
    let (s, _) = two_cold_sessions(&mut w);
    let c = w.connect_v8();
    attach(&mut w, c, &s);
    let queued = attach(&mut w, c, sim::swarm::UNKNOWN_SESSION);
    w.v8_cancel(c, &queued, &sim::world::v8::server_target());
    let last = w.v8_server_call(c, MANAGEMENT, "detach", vec![]);
    deliver_all(&mut w);
    w.settle(Duration::from_secs(60));
    deliver_all(&mut w);
    assert!(
        w.v8_answer(c, &last).is_some(),
        "the detach queued after the cancelled attach is answered"
    );
    assert!(w.server.attachments(c).is_empty());
}

/// Bug 7, as the checker sees it without a panic: a cancelled attach
/// routes the connection once its worker is ready, after a later attach
/// of another session was answered; the client's last call named that
/// other session. The checker flags the envelope: no attach of its
/// session is in flight.
#[test]
fn bug7_a_cancelled_attach_still_routes_the_connection() {
    let mut w = world(Holds {
        boot: true,
        ..Holds::none()
    });
    let (a, b) = two_cold_sessions(&mut w);
    let mut checkers = Checkers::new();
    checkers.observe(&mut w).expect("the setup breaks nothing");
    let c = w.connect_v8();
    let first = attach(&mut w, c, &a);
    attach(&mut w, c, &b);
    w.v8_cancel(c, &first, &sim::world::v8::server_target());
    attach(&mut w, c, &b);
    checkers.observe(&mut w).expect("nothing routed yet");
    let boots: Vec<Delivery> = w.deliveries().into_iter().map(|(_, d)| d).collect();
    let mut verdict = Ok(());
    for boot in boots.iter().rev() {
        w.deliver(boot, Amount::All);
        verdict = verdict.and(checkers.observe(&mut w));
    }
    assert_eq!(
        w.server.attachments(c),
        vec![b],
        "routed by its last attach"
    );
    verdict.expect("no route without an attach in flight");
}
