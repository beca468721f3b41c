//! The v8 checker fails when it must: each test feeds it what a broken
//! server would send a v8 client (a sequence gap, an op chord 0.85.1
//! refuses, an update after its route ended, an answer before its
//! envelope, management calls answered out of order, a replica that
//! drifts from the kernel's state) next to the same stream made correct.

use kernel::chord::call::ServiceCall;
use kernel::chord::{Member, State, singleton_snapshot, state_update};
use kernel::ids::ConnId;
use kernel::protocol::v8::Target;
use kernel::wire::Value;
use sim::checkers::Checkers;
use sim::checkers::v8::V8;
use sim::world::v8::{
    CONTROL, MANAGEMENT, Route, TRANSCRIPT, V8Message, server_target, session_target,
};
use sim::world::{Fact, Options, World};
use std::sync::Arc;

const C: ConnId = ConnId(7);

fn route() -> Route {
    Route {
        session_id: "s".into(),
        attachment_id: "a1".into(),
    }
}

fn sent(id: &str, target: Target, service: &str, member: &str, args: Vec<Value>) -> Fact {
    Fact::V8RequestSent {
        conn: C,
        id: id.into(),
        target,
        call: ServiceCall::singleton(service, member, args),
    }
}

fn emitted(message: V8Message) -> Fact {
    Fact::V8Emitted {
        conn: C,
        message: Arc::new(message),
        open_after: true,
    }
}

fn ok(id: &str, result: Option<Value>) -> Fact {
    emitted(V8Message::Response {
        id: id.into(),
        outcome: Ok(result),
    })
}

fn ops(ops: Vec<Value>) -> Value {
    Value::Array(ops)
}

fn op(parts: Vec<Value>) -> Value {
    Value::Array(parts)
}

fn update(sequence: u64, wire: Value) -> Fact {
    emitted(V8Message::Update {
        subscription_id: "service-1".into(),
        update: state_update("state", sequence, wire),
    })
}

/// A checker whose client is attached (route `a1`) and subscribed to the
/// transcript, whose state is `{"n": 1}` at sequence 0.
fn subscribed() -> V8 {
    let mut v8 = V8::default();
    let facts = [
        sent(
            "r1",
            server_target(),
            MANAGEMENT,
            "attach",
            vec![Value::text("s")],
        ),
        emitted(V8Message::Attachment(Some(route()))),
        ok("r1", None),
        sent(
            "r2",
            session_target(&route()),
            CONTROL,
            "subscribe",
            vec![
                Value::text("service-1"),
                Value::text(TRANSCRIPT),
                Value::text("singleton"),
            ],
        ),
        ok(
            "r2",
            Some(singleton_snapshot(
                TRANSCRIPT,
                &[Member::State(
                    "state",
                    &State::new(Value::Map(vec![("n".into(), Value::Int(1))])),
                )],
            )),
        ),
    ];
    for fact in &facts {
        v8.observe(fact).expect("a correct stream");
    }
    v8
}

fn set_n(n: i64) -> Value {
    ops(vec![op(vec![
        Value::text("s"),
        Value::Array(vec![Value::text("n")]),
        Value::Int(n),
    ])])
}

#[test]
fn sequences_follow_one_by_one() {
    let mut v8 = subscribed();
    v8.observe(&update(1, set_n(2))).expect("1 after 0");
    let gap = v8.observe(&update(3, set_n(3)));
    assert!(gap.unwrap_err().message.contains("a gap or a repeat"));
    let mut v8 = subscribed();
    let repeat = v8.observe(&update(0, set_n(3)));
    assert!(repeat.is_err());
}

#[test]
fn only_chord_0_85_1_vocabulary_decodes() {
    let mut v8 = subscribed();
    let reorder = ops(vec![op(vec![
        Value::text("m"),
        Value::Array(vec![]),
        Value::Array(vec![]),
    ])]);
    let refused = v8.observe(&update(1, reorder));
    assert!(refused.unwrap_err().message.contains("op verb"));
    let mut v8 = subscribed();
    let reset = emitted(V8Message::Update {
        subscription_id: "service-1".into(),
        update: Value::Map(vec![
            ("type".into(), Value::text("reset")),
            ("snapshot".into(), Value::Null),
        ]),
    });
    assert!(v8.observe(&reset).is_err());
    // An id never defined, and an op that does not apply, are caught too.
    let mut v8 = subscribed();
    let unknown_id = ops(vec![op(vec![
        Value::text("s"),
        Value::Int(4),
        Value::Int(1),
    ])]);
    let undecodable = v8.observe(&update(1, unknown_id));
    assert!(undecodable.unwrap_err().message.contains("does not decode"));
    let mut v8 = subscribed();
    let append_to_a_number = ops(vec![op(vec![
        Value::text("a"),
        Value::Array(vec![Value::text("n")]),
        Value::text("x"),
    ])]);
    let inapplicable = v8.observe(&update(1, append_to_a_number));
    assert!(inapplicable.unwrap_err().message.contains("does not apply"));
    let mut v8 = subscribed();
    let malformed = emitted(V8Message::parse(&Value::Map(vec![(
        "type".into(),
        Value::text("response"),
    )])));
    assert!(v8.observe(&malformed).is_err());
}

#[test]
fn no_update_after_the_envelope_that_ended_its_route() {
    let mut v8 = subscribed();
    v8.observe(&update(1, set_n(2))).expect("live");
    v8.observe(&emitted(V8Message::Attachment(None)))
        .expect("detached");
    let late = v8.observe(&update(2, set_n(3)));
    let message = late.unwrap_err().message;
    assert!(message.contains("ended by attachment null"), "{message}");
    // Nor after an unsubscribe was answered, nor for one never made.
    let mut v8 = subscribed();
    let unsubscribe = sent(
        "r3",
        session_target(&route()),
        CONTROL,
        "unsubscribe",
        vec![Value::text("service-1")],
    );
    v8.observe(&unsubscribe).unwrap();
    v8.observe(&update(1, set_n(2))).expect("before the answer");
    v8.observe(&ok("r3", None)).unwrap();
    assert!(v8.observe(&update(2, set_n(3))).is_err());
    let mut v8 = subscribed();
    let stray = emitted(V8Message::Update {
        subscription_id: "service-9".into(),
        update: state_update("state", 1, set_n(2)),
    });
    assert!(v8.observe(&stray).is_err());
}

#[test]
fn the_envelope_goes_before_the_answer() {
    let mut v8 = V8::default();
    let attach = sent(
        "r1",
        server_target(),
        MANAGEMENT,
        "attach",
        vec![Value::text("s")],
    );
    v8.observe(&attach).unwrap();
    let early = v8.observe(&ok("r1", None));
    assert!(early.unwrap_err().message.contains("envelope goes first"));
    let mut v8 = subscribed();
    let detach = sent("r3", server_target(), MANAGEMENT, "detach", vec![]);
    v8.observe(&detach).unwrap();
    assert!(v8.observe(&ok("r3", None)).is_err());
}

#[test]
fn management_calls_are_answered_in_order() {
    let mut v8 = V8::default();
    let create = sent(
        "r1",
        server_target(),
        MANAGEMENT,
        "create",
        vec![Value::Null],
    );
    let detach = sent("r2", server_target(), MANAGEMENT, "detach", vec![]);
    v8.observe(&create).unwrap();
    v8.observe(&detach).unwrap();
    let overtaking = v8.observe(&ok("r2", None));
    assert!(overtaking.unwrap_err().message.contains("sent earlier"));
}

/// A real world: an update the kernel never published (here injected into
/// the facts) puts the replica ahead of the kernel's state after the step.
#[test]
fn a_replica_must_be_the_kernels_state() {
    let mut w = World::new(Options {
        record_facts: true,
        ..Options::default()
    });
    let mut checkers = Checkers::new();
    let v1 = w.connect_ready();
    let r = w.request(
        v1,
        kernel::protocol::Command::Create(kernel::protocol::CreateParams::default()),
    );
    let s = w.created(v1, &r);
    let c = w.connect_v8();
    w.v8_server_call(c, MANAGEMENT, "attach", vec![Value::text(&s)]);
    w.v8_subscribe(c, TRANSCRIPT);
    checkers.observe(&mut w).expect("a correct run");
    let sub = w.v8_client(c).subs.keys().next().unwrap().clone();
    let drift = Fact::V8Emitted {
        conn: c,
        message: Arc::new(V8Message::Update {
            subscription_id: sub,
            update: state_update(
                "state",
                1,
                ops(vec![op(vec![
                    Value::text("s"),
                    Value::Array(vec![Value::text("extra")]),
                    Value::Int(1),
                ])]),
            ),
        }),
        open_after: true,
    };
    checkers.v8.observe(&drift).expect("it decodes and applies");
    let verdict = checkers.v8.check(&w);
    assert!(verdict.unwrap_err().message.contains("is at sequence 1"));
}
