use super::*;
use crate::protocol::{ErrorCode, SessionPhase};
use proptest::prelude::*;

fn snapshot(id: &str, revision: u64, attached: bool) -> SessionSnapshot {
    SessionSnapshot {
        id: id.to_owned(),
        name: None,
        cwd: "/w".to_owned(),
        created_at: 0,
        updated_at: 0,
        phase: SessionPhase::Idle,
        model: ModelRef {
            provider: "p".to_owned(),
            id: "m".to_owned(),
        },
        thinking_level: ThinkingLevel::Off,
        attached,
        locked: true,
        revision,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

fn lines(outputs: &[LeaseOutput]) -> Vec<String> {
    outputs.iter().map(ToString::to_string).collect()
}

/// A connected machine plus call numbering; every helper returns the
/// step's outputs as trace lines.
struct Harness {
    machine: Leases,
    calls: u64,
}

impl Harness {
    fn connected() -> Self {
        let mut harness = Self {
            machine: Leases::new(),
            calls: 0,
        };
        assert!(harness.step(LeaseInput::Connected).is_empty());
        harness
    }

    fn step(&mut self, input: LeaseInput) -> Vec<String> {
        lines(&self.machine.step(Instant(0), input))
    }

    fn call(&mut self) -> CallId {
        self.calls += 1;
        CallId(self.calls)
    }

    fn acquire(&mut self, session_id: &str, mode: LeaseMode) -> Vec<String> {
        let call = self.call();
        self.step(LeaseInput::Acquire {
            call,
            session_id: session_id.to_owned(),
            mode,
        })
    }

    fn release(&mut self, lease: u64, kind: ReleaseKind) -> Vec<String> {
        let call = self.call();
        self.step(LeaseInput::Release {
            call,
            lease: LeaseId(lease),
            kind,
        })
    }

    fn prompt(&mut self, lease: u64) -> Vec<String> {
        let call = self.call();
        let command = SessionCommand::Prompt {
            text: "hi".to_owned(),
        };
        self.step(LeaseInput::Command {
            call,
            lease: LeaseId(lease),
            command,
        })
    }

    fn respond(
        &mut self,
        request: u64,
        outcome: Result<CommandResult, ProtocolError>,
    ) -> Vec<String> {
        self.step(LeaseInput::Response(Response {
            id: request_id(request),
            outcome,
        }))
    }

    fn attach_ok(&mut self, request: u64, session_id: &str) -> Vec<String> {
        let session = snapshot(session_id, request, true);
        self.respond(request, Ok(CommandResult::Attach { session }))
    }

    fn detach_ok(&mut self, request: u64, session_id: &str) -> Vec<String> {
        self.respond(
            request,
            Ok(CommandResult::Detach {
                session_id: session_id.to_owned(),
            }),
        )
    }

    fn fail(&mut self, request: u64) -> Vec<String> {
        self.respond(
            request,
            Err(ProtocolError::new(ErrorCode::InternalError, "boom")),
        )
    }

    /// Acquires and grants a lease, expecting an `attach` as request `request`.
    fn lease(&mut self, session_id: &str, mode: LeaseMode, request: u64) -> LeaseId {
        let sent = self.acquire(session_id, mode);
        assert_eq!(
            sent,
            [format!("send request-{request} attach {session_id}")]
        );
        let granted = self.attach_ok(request, session_id);
        assert_eq!(granted.len(), 1, "{granted:?}");
        let lease = LeaseId(self.machine.lease_sequence);
        assert_eq!(
            granted[0],
            format!("complete c{} ok acquired {lease} {session_id}", self.calls)
        );
        lease
    }
}

const OWNED: &str = "err session s1 is already leased in this client";
const SERVER_ERROR: &str = "err server error internal_error: boom";

#[test]
fn exclusive_is_refused_while_any_lease_exists_even_before_attach() {
    let mut h = Harness::connected();
    assert_eq!(
        h.acquire("s1", LeaseMode::Shared),
        ["send request-1 attach s1"]
    );
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        [format!("complete c2 {OWNED}")]
    );
    assert_eq!(h.attach_ok(1, "s1"), ["complete c1 ok acquired L1 s1"]);
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        [format!("complete c3 {OWNED}")]
    );
    assert_eq!(h.machine.holder_count("s1"), 1);
    assert_eq!(h.machine.pending_requests(), 0);
}

#[test]
fn shared_is_refused_while_an_exclusive_lease_exists() {
    let mut h = Harness::connected();
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-1 attach s1"]
    );
    assert_eq!(
        h.acquire("s1", LeaseMode::Shared),
        [format!("complete c2 {OWNED}")]
    );
    assert_eq!(h.attach_ok(1, "s1"), ["complete c1 ok acquired L1 s1"]);
    assert_eq!(
        h.acquire("s1", LeaseMode::Shared),
        [format!("complete c3 {OWNED}")]
    );
    // Other sessions are independent.
    assert_eq!(
        h.acquire("s2", LeaseMode::Shared),
        ["send request-2 attach s2"]
    );
}

#[test]
fn concurrent_acquisitions_share_one_attach() {
    let mut h = Harness::connected();
    assert_eq!(
        h.acquire("s1", LeaseMode::Shared),
        ["send request-1 attach s1"]
    );
    assert!(h.acquire("s1", LeaseMode::Shared).is_empty());
    assert_eq!(
        h.attach_ok(1, "s1"),
        [
            "complete c1 ok acquired L1 s1",
            "complete c2 ok acquired L2 s1"
        ]
    );
}

#[test]
fn acquiring_an_attached_session_sends_nothing() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    assert_eq!(
        h.acquire("s1", LeaseMode::Shared),
        ["complete c2 ok acquired L2 s1"]
    );
}

#[test]
fn failed_attach_fails_every_waiter_and_restores_the_revision() {
    let mut h = Harness::connected();
    let session = snapshot("s1", 7, false);
    assert!(
        h.step(LeaseInput::Event(ServerEvent::SessionSnapshot {
            snapshot: session
        }))
        .is_empty()
    );
    h.acquire("s1", LeaseMode::Shared);
    h.acquire("s1", LeaseMode::Shared);
    assert_eq!(
        h.machine.sessions["s1"].revision, None,
        "attach forgets the snapshot"
    );
    assert_eq!(
        h.fail(1),
        [
            format!("complete c1 {SERVER_ERROR}"),
            format!("complete c2 {SERVER_ERROR}")
        ]
    );
    assert_eq!(h.machine.sessions["s1"].revision, Some(7));
    assert_eq!(h.machine.holder_count("s1"), 0);
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-2 attach s1"]
    );
}

#[test]
fn acquisition_waits_for_an_in_flight_detach_then_attaches() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["send request-2 detach s1"]
    );
    assert!(h.acquire("s1", LeaseMode::Shared).is_empty());
    assert_eq!(h.machine.holder_count("s1"), 2);
    assert_eq!(
        h.detach_ok(2, "s1"),
        ["complete c2 ok released", "send request-3 attach s1"]
    );
    assert_eq!(h.attach_ok(3, "s1"), ["complete c3 ok acquired L2 s1"]);
}

#[test]
fn exclusive_is_refused_while_a_release_is_in_flight() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    h.release(1, ReleaseKind::Dispose);
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        [format!("complete c3 {OWNED}")]
    );
}

#[test]
fn detach_is_sent_only_when_the_last_lease_is_released() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    h.acquire("s1", LeaseMode::Shared);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c3 ok released"]
    );
    assert_eq!(
        h.release(2, ReleaseKind::Detach),
        ["send request-2 detach s1"]
    );
    assert_eq!(h.detach_ok(2, "s1"), ["complete c4 ok released"]);
    assert!(!h.machine.is_attached("s1"));
    assert_eq!(h.machine.status(LeaseId(2)), Some(LeaseStatus::Released));
}

#[test]
fn a_second_release_joins_the_first_and_later_ones_are_no_ops() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["send request-2 detach s1"]
    );
    assert!(h.release(1, ReleaseKind::Dispose).is_empty());
    assert!(h.release(1, ReleaseKind::Detach).is_empty());
    assert_eq!(
        h.detach_ok(2, "s1"),
        [
            "complete c2 ok released",
            "complete c3 ok released",
            "complete c4 ok released"
        ]
    );
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c5 ok released"]
    );
}

#[test]
fn failed_detach_makes_the_lease_active_again() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    assert_eq!(
        h.release(1, ReleaseKind::Detach),
        ["send request-2 detach s1"]
    );
    assert!(!h.machine.is_active(LeaseId(1)));
    assert_eq!(h.fail(2), [format!("complete c2 {SERVER_ERROR}")]);
    assert!(h.machine.is_active(LeaseId(1)));
    assert!(!h.machine.cleanup_required("s1"));
    assert_eq!(h.prompt(1), ["send request-3 prompt s1 \"hi\""]);
    assert_eq!(
        h.release(1, ReleaseKind::Detach),
        ["send request-4 detach s1"]
    );
}

#[test]
fn failed_dispose_relinquishes_and_the_next_acquire_reconciles() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["send request-2 detach s1"]
    );
    assert!(h.release(1, ReleaseKind::Dispose).is_empty());
    assert_eq!(
        h.fail(2),
        [
            format!("complete c2 {SERVER_ERROR}"),
            format!("complete c3 {SERVER_ERROR}")
        ]
    );
    assert_eq!(h.machine.status(LeaseId(1)), Some(LeaseStatus::Released));
    assert!(h.machine.cleanup_required("s1"));
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c4 ok released"]
    );
    // Two shared acquisitions share the reconciliation and the attach.
    assert_eq!(
        h.acquire("s1", LeaseMode::Shared),
        ["send request-3 detach s1"]
    );
    assert!(h.acquire("s1", LeaseMode::Shared).is_empty());
    assert_eq!(h.detach_ok(3, "s1"), ["send request-4 attach s1"]);
    assert!(!h.machine.cleanup_required("s1"));
    assert_eq!(
        h.attach_ok(4, "s1"),
        [
            "complete c5 ok acquired L2 s1",
            "complete c6 ok acquired L3 s1"
        ]
    );
}

#[test]
fn reconciliation_sends_attach_even_if_still_attached() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    h.release(1, ReleaseKind::Dispose);
    h.fail(2);
    assert!(
        h.machine.is_attached("s1"),
        "the failed detach left the session attached"
    );
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-3 detach s1"]
    );
    let attached_again = snapshot("s1", 9, true);
    h.step(LeaseInput::Event(ServerEvent::SessionSnapshot {
        snapshot: attached_again,
    }));
    assert_eq!(h.detach_ok(3, "s1"), ["send request-4 attach s1"]);
}

#[test]
fn failed_reconciliation_fails_the_acquisition_and_keeps_the_mark() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    h.release(1, ReleaseKind::Dispose);
    h.fail(2);
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-3 detach s1"]
    );
    assert_eq!(h.fail(3), [format!("complete c3 {SERVER_ERROR}")]);
    assert!(h.machine.cleanup_required("s1"));
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-4 detach s1"]
    );
}

#[test]
fn create_grants_an_exclusive_lease_on_the_new_id() {
    let mut h = Harness::connected();
    let call = h.call();
    let sent = h.step(LeaseInput::Create {
        call,
        params: CreateParams::default(),
    });
    assert_eq!(sent, ["send request-1 create"]);
    let created = h.respond(
        1,
        Ok(CommandResult::Create {
            session: snapshot("s9", 1, true),
        }),
    );
    assert_eq!(created, ["complete c1 ok acquired L1 s9"]);
    assert_eq!(
        h.acquire("s9", LeaseMode::Shared),
        ["complete c2 err session s9 is already leased in this client"]
    );
    assert_eq!(h.prompt(1), ["send request-2 prompt s9 \"hi\""]);
}

#[test]
fn create_of_an_already_leased_id_is_an_ownership_error() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    let call = h.call();
    h.step(LeaseInput::Create {
        call,
        params: CreateParams::default(),
    });
    let created = h.respond(
        2,
        Ok(CommandResult::Create {
            session: snapshot("s1", 3, true),
        }),
    );
    assert_eq!(created, [format!("complete c2 {OWNED}")]);
    assert_eq!(h.machine.holder_count("s1"), 1);
}

#[test]
fn session_removed_invalidates_leases_and_clears_the_mark() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    h.lease("s2", LeaseMode::Shared, 2);
    let removed = ServerEvent::SessionRemoved {
        session_id: "s1".to_owned(),
    };
    assert!(h.step(LeaseInput::Event(removed)).is_empty());
    assert_eq!(h.machine.status(LeaseId(1)), Some(LeaseStatus::Invalidated));
    assert!(h.machine.is_active(LeaseId(2)));
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c3 ok released"]
    );
    assert_eq!(
        h.release(1, ReleaseKind::Detach),
        ["complete c4 ok released"]
    );
    assert_eq!(h.prompt(1), ["complete c5 err session s1 is not attached"]);
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-3 attach s1"]
    );
    // The mark of a failed dispose goes with the session too.
    h.release(2, ReleaseKind::Dispose);
    h.fail(4);
    assert!(h.machine.cleanup_required("s2"));
    let removed = ServerEvent::SessionRemoved {
        session_id: "s2".to_owned(),
    };
    h.step(LeaseInput::Event(removed));
    assert!(!h.machine.cleanup_required("s2"));
}

#[test]
fn an_in_flight_release_of_an_invalidated_lease_completes_as_a_no_op() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["send request-2 detach s1"]
    );
    let removed = ServerEvent::SessionRemoved {
        session_id: "s1".to_owned(),
    };
    assert!(h.step(LeaseInput::Event(removed)).is_empty());
    // A new acquisition still waits for the old detach.
    assert!(h.acquire("s1", LeaseMode::Exclusive).is_empty());
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c4 ok released"]
    );
    assert_eq!(
        h.fail(2),
        ["complete c2 ok released", "send request-3 attach s1"]
    );
    assert!(!h.machine.cleanup_required("s1"));
    assert_eq!(h.machine.holder_count("s1"), 1);
}

#[test]
fn an_acquisition_keeps_its_reservation_across_session_removed() {
    let mut h = Harness::connected();
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-1 attach s1"]
    );
    let removed = ServerEvent::SessionRemoved {
        session_id: "s1".to_owned(),
    };
    h.step(LeaseInput::Event(removed));
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        [format!("complete c2 {OWNED}")]
    );
    assert_eq!(h.attach_ok(1, "s1"), ["complete c1 ok acquired L1 s1"]);
    assert!(h.machine.is_active(LeaseId(1)));
}

#[test]
fn disconnect_invalidates_fails_pending_and_clears_marks() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    h.lease("s2", LeaseMode::Shared, 2);
    h.lease("s4", LeaseMode::Exclusive, 3);
    h.release(3, ReleaseKind::Dispose);
    h.fail(4);
    assert!(h.machine.cleanup_required("s4"));
    assert_eq!(
        h.release(2, ReleaseKind::Dispose),
        ["send request-5 detach s2"]
    );
    assert_eq!(
        h.acquire("s3", LeaseMode::Shared),
        ["send request-6 attach s3"]
    );
    assert_eq!(h.prompt(1), ["send request-7 prompt s1 \"hi\""]);
    assert!(
        h.acquire("s2", LeaseMode::Shared).is_empty(),
        "waits for the detach"
    );
    assert_eq!(
        h.step(LeaseInput::Disconnected),
        [
            "complete c5 ok released",
            "complete c8 err client is disconnected",
            "complete c6 err client is disconnected",
            "complete c7 err client is disconnected",
        ]
    );
    assert_eq!(h.machine.status(LeaseId(1)), Some(LeaseStatus::Invalidated));
    assert!(!h.machine.cleanup_required("s4"));
    assert!(h.step(LeaseInput::Disconnected).is_empty());
    assert_eq!(h.prompt(1), ["complete c9 err client is disconnected"]);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c10 ok released"]
    );
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["complete c11 err client is disconnected"]
    );
    h.step(LeaseInput::Connected);
    assert_eq!(
        h.acquire("s4", LeaseMode::Exclusive),
        ["send request-8 attach s4"]
    );
    assert_eq!(
        h.acquire("s1", LeaseMode::Exclusive),
        ["send request-9 attach s1"]
    );
}

#[test]
fn disposing_the_client_sends_nothing_and_refuses_calls() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    h.prompt(1);
    assert_eq!(
        h.step(LeaseInput::DisposeClient),
        [
            "close connection: client is disposed",
            "complete c2 err client is disposed"
        ]
    );
    assert!(h.machine.is_disposed() && !h.machine.is_connected());
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c3 ok released"]
    );
    assert_eq!(
        h.release(1, ReleaseKind::Detach),
        ["complete c4 ok released"]
    );
    assert_eq!(h.prompt(1), ["complete c5 err client is disposed"]);
    assert_eq!(
        h.acquire("s2", LeaseMode::Shared),
        ["complete c6 err client is disposed"]
    );
    let call = h.call();
    assert_eq!(
        h.step(LeaseInput::List { call }),
        ["complete c7 err client is disposed"]
    );
    assert!(h.step(LeaseInput::DisposeClient).is_empty());
    assert!(h.step(LeaseInput::Connected).is_empty());
    assert!(!h.machine.is_connected());
}

#[test]
fn commands_need_an_active_lease_on_an_attached_session() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    assert_eq!(h.prompt(1), ["send request-2 prompt s1 \"hi\""]);
    let answered = h.respond(
        2,
        Ok(CommandResult::Prompt {
            session: snapshot("s1", 5, true),
        }),
    );
    assert_eq!(answered, ["complete c2 ok session s1 rev 5 attached"]);
    // A newer snapshot saying "not attached" detaches the lease's commands.
    let stale = snapshot("s1", 4, false);
    h.step(LeaseInput::Event(ServerEvent::SessionSnapshot {
        snapshot: stale,
    }));
    assert!(
        h.machine.is_active(LeaseId(1)),
        "an older snapshot is ignored"
    );
    let newer = snapshot("s1", 6, false);
    h.step(LeaseInput::Event(ServerEvent::SessionSnapshot {
        snapshot: newer,
    }));
    assert!(!h.machine.is_active(LeaseId(1)));
    assert_eq!(h.prompt(1), ["complete c3 err session s1 is not attached"]);
    assert_eq!(
        h.release(1, ReleaseKind::Dispose),
        ["complete c4 err session s1 is not attached"]
    );
    assert_eq!(h.machine.status(LeaseId(1)), Some(LeaseStatus::Active));
    assert_eq!(h.prompt(7), ["complete c5 err unknown lease L7"]);
}

#[test]
fn commands_on_a_releasing_lease_are_detached() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Exclusive, 1);
    h.release(1, ReleaseKind::Detach);
    assert_eq!(h.prompt(1), ["complete c3 err session s1 is not attached"]);
    let call = h.call();
    let commands = [
        SessionCommand::Steer {
            text: "s".to_owned(),
        },
        SessionCommand::Abort,
        SessionCommand::SetModel {
            model: ModelRef {
                provider: "p".to_owned(),
                id: "m".to_owned(),
            },
        },
        SessionCommand::SetThinking {
            thinking_level: ThinkingLevel::High,
        },
    ];
    h.fail(2);
    let mut sent = Vec::new();
    for (i, command) in commands.into_iter().enumerate() {
        let call = CallId(call.0 + i as u64);
        sent.extend(h.step(LeaseInput::Command {
            call,
            lease: LeaseId(1),
            command,
        }));
    }
    assert_eq!(
        sent,
        [
            "send request-3 steer s1 \"s\"",
            "send request-4 abort s1",
            "send request-5 set_model s1 p/m",
            "send request-6 set_thinking s1 high",
        ]
    );
}

#[test]
fn request_ids_count_up_per_machine() {
    let mut h = Harness::connected();
    let (c1, c2) = (h.call(), h.call());
    assert_eq!(
        h.step(LeaseInput::List { call: c1 }),
        ["send request-1 list"]
    );
    assert_eq!(
        h.step(LeaseInput::List { call: c2 }),
        ["send request-2 list"]
    );
    let answered = h.respond(
        2,
        Ok(CommandResult::List {
            sessions: Vec::new(),
        }),
    );
    assert_eq!(answered, ["complete c2 ok sessions (0)"]);
    assert_eq!(parse_request_id("request-10"), Some(10));
    for bad in [
        "request-01",
        "request-+1",
        "request-",
        "req-1",
        "request-1x",
    ] {
        assert_eq!(parse_request_id(bad), None, "{bad}");
    }
}

#[test]
fn a_response_without_a_request_fails_the_connection() {
    let mut h = Harness::connected();
    h.acquire("s1", LeaseMode::Shared);
    assert_eq!(
        h.attach_ok(9, "s1"),
        [
            "close connection: protocol violation: Response has no matching request",
            "complete c1 err protocol violation: Response has no matching request",
        ]
    );
    assert!(!h.machine.is_connected());
    assert!(
        h.attach_ok(1, "s1").is_empty(),
        "ignored while disconnected"
    );
}

#[test]
fn a_response_for_another_command_fails_the_connection() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    h.prompt(1);
    h.acquire("s2", LeaseMode::Shared);
    let reason = "protocol violation: Response command detach does not match prompt";
    assert_eq!(
        h.detach_ok(2, "s1"),
        [
            format!("close connection: {reason}"),
            format!("complete c2 err {reason}"),
            format!("complete c3 err {reason}"),
        ]
    );
    assert_eq!(h.machine.status(LeaseId(1)), Some(LeaseStatus::Invalidated));
}

#[test]
fn forgetting_a_lease_disposes_it_and_drops_its_record() {
    let mut h = Harness::connected();
    h.lease("s1", LeaseMode::Shared, 1);
    h.acquire("s1", LeaseMode::Shared);
    assert!(h.step(LeaseInput::Forget { lease: LeaseId(1) }).is_empty());
    assert_eq!(h.machine.status(LeaseId(1)), None);
    assert_eq!(
        h.step(LeaseInput::Forget { lease: LeaseId(2) }),
        ["send request-2 detach s1"]
    );
    assert_eq!(h.machine.status(LeaseId(2)), Some(LeaseStatus::Releasing));
    assert!(h.detach_ok(2, "s1").is_empty());
    assert_eq!(h.machine.status(LeaseId(2)), None);
    assert_eq!(
        h.release(2, ReleaseKind::Dispose),
        ["complete c3 err unknown lease L2"]
    );
    assert!(h.machine.sessions.is_empty() || !h.machine.is_attached("s1"));
}

// ---- property: random drives keep the invariants and complete every call ----

#[derive(Debug, Clone)]
enum Action {
    Connect,
    Disconnect,
    DisposeClient,
    Acquire(u8, bool),
    Create,
    List,
    Release(u8, bool),
    Command(u8),
    Forget(u8),
    Respond(u8, bool),
    Garbage(bool),
    Removed(u8),
    Snapshot(u8, bool),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => Just(Action::Connect),
        6 => Just(Action::Disconnect),
        1 => Just(Action::DisposeClient),
        60 => (0..3u8, any::<bool>()).prop_map(|(s, e)| Action::Acquire(s, e)),
        8 => Just(Action::Create),
        4 => Just(Action::List),
        50 => (any::<u8>(), any::<bool>()).prop_map(|(l, d)| Action::Release(l, d)),
        20 => any::<u8>().prop_map(Action::Command),
        8 => any::<u8>().prop_map(Action::Forget),
        100 => (any::<u8>(), prop::bool::weighted(0.7)).prop_map(|(r, ok)| Action::Respond(r, ok)),
        3 => any::<bool>().prop_map(Action::Garbage),
        6 => (0..3u8).prop_map(Action::Removed),
        10 => (0..3u8, any::<bool>()).prop_map(|(s, a)| Action::Snapshot(s, a)),
    ]
}

#[derive(Default)]
struct World {
    machine: Leases,
    calls: u64,
    outstanding: BTreeSet<CallId>,
    in_flight: Vec<Request>,
    granted: Vec<LeaseId>,
    revision: u64,
}

impl World {
    fn call(&mut self) -> CallId {
        self.calls += 1;
        assert!(self.outstanding.insert(CallId(self.calls)));
        CallId(self.calls)
    }

    fn feed(&mut self, input: LeaseInput) {
        for output in self.machine.step(Instant(0), input) {
            match output {
                LeaseOutput::Send(request) => {
                    assert!(self.machine.is_connected());
                    if let Command::Attach { session_id } = &request.command {
                        let twice = self.in_flight.iter().any(|r| {
                            matches!(&r.command, Command::Attach { session_id: s } if s == session_id)
                        });
                        assert!(!twice, "two attaches of {session_id} in flight");
                    }
                    self.in_flight.push(request);
                }
                LeaseOutput::Complete { call, result } => {
                    assert!(self.outstanding.remove(&call), "{call} completed twice");
                    if let Ok(Completion::Acquired { lease, .. }) = result {
                        self.granted.push(lease);
                    }
                }
                LeaseOutput::CloseConnection { .. } => self.in_flight.clear(),
                LeaseOutput::Orphaned { call, .. } => {
                    assert!(self.outstanding.remove(&call), "{call} orphaned twice");
                }
            }
        }
        if !self.machine.is_connected() {
            self.in_flight.clear();
        }
    }

    fn pick_lease(&self, index: u8) -> LeaseId {
        if self.granted.is_empty() {
            LeaseId(99)
        } else {
            self.granted[usize::from(index) % self.granted.len()]
        }
    }

    fn result_for(&mut self, command: &Command) -> CommandResult {
        self.revision += 1;
        let session = |id: &str| snapshot(id, self.revision, true);
        match command {
            Command::List => CommandResult::List {
                sessions: Vec::new(),
            },
            Command::Create(_) => CommandResult::Create {
                session: session(&format!("s{}", self.revision % 4)),
            },
            Command::Attach { session_id } => CommandResult::Attach {
                session: session(session_id),
            },
            Command::Detach { session_id } => CommandResult::Detach {
                session_id: session_id.clone(),
            },
            Command::Prompt { session_id, .. } => CommandResult::Prompt {
                session: session(session_id),
            },
            other => CommandResult::Abort {
                session: session(other.session_id().unwrap_or("s0")),
            },
        }
    }

    fn act(&mut self, action: Action) {
        let input = match action {
            Action::Connect => LeaseInput::Connected,
            Action::Disconnect => LeaseInput::Disconnected,
            Action::DisposeClient => LeaseInput::DisposeClient,
            Action::Acquire(session, exclusive) => LeaseInput::Acquire {
                call: self.call(),
                session_id: format!("s{session}"),
                mode: if exclusive {
                    LeaseMode::Exclusive
                } else {
                    LeaseMode::Shared
                },
            },
            Action::Create => LeaseInput::Create {
                call: self.call(),
                params: CreateParams::default(),
            },
            Action::List => LeaseInput::List { call: self.call() },
            Action::Release(lease, dispose) => LeaseInput::Release {
                call: self.call(),
                lease: self.pick_lease(lease),
                kind: if dispose {
                    ReleaseKind::Dispose
                } else {
                    ReleaseKind::Detach
                },
            },
            Action::Command(lease) => LeaseInput::Command {
                call: self.call(),
                lease: self.pick_lease(lease),
                command: SessionCommand::Prompt {
                    text: "x".to_owned(),
                },
            },
            Action::Forget(lease) => LeaseInput::Forget {
                lease: self.pick_lease(lease),
            },
            Action::Respond(index, ok) => {
                if self.in_flight.is_empty() {
                    return;
                }
                let request = self
                    .in_flight
                    .remove(usize::from(index) % self.in_flight.len());
                let outcome = if ok {
                    Ok(self.result_for(&request.command))
                } else {
                    Err(ProtocolError::new(ErrorCode::Busy, "no"))
                };
                LeaseInput::Response(Response {
                    id: request.id,
                    outcome,
                })
            }
            Action::Garbage(unknown) => {
                let id = if unknown || self.in_flight.is_empty() {
                    "request-999999".to_owned()
                } else {
                    self.in_flight[0].id.clone()
                };
                let session = snapshot("s0", 0, true);
                let wrong = if self
                    .in_flight
                    .first()
                    .is_some_and(|r| r.command.name() == "create")
                {
                    CommandResult::Attach { session }
                } else {
                    CommandResult::Create { session }
                };
                LeaseInput::Response(Response {
                    id,
                    outcome: Ok(wrong),
                })
            }
            Action::Removed(session) => LeaseInput::Event(ServerEvent::SessionRemoved {
                session_id: format!("s{session}"),
            }),
            Action::Snapshot(session, attached) => {
                self.revision += 1;
                let snapshot = snapshot(&format!("s{session}"), self.revision, attached);
                LeaseInput::Event(ServerEvent::SessionSnapshot { snapshot })
            }
        };
        self.feed(input);
    }
}

proptest! {
    #[test]
    fn random_drives_keep_invariants_and_complete_every_call(
        actions in proptest::collection::vec(action(), 1..120)
    ) {
        let mut world = World::default();
        world.feed(LeaseInput::Connected);
        for action in actions {
            world.act(action);
        }
        world.feed(LeaseInput::DisposeClient);
        prop_assert!(world.outstanding.is_empty(), "uncompleted calls: {:?}", world.outstanding);
        prop_assert_eq!(world.machine.pending_requests(), 0);
    }
}
