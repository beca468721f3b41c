//! The remote-session ownership seed test, as six scripted scenarios of the
//! client lease machine ([`kernel::client::lease::Leases`]).
//!
//! Each scenario drives the machine through a small script and snapshots its
//! trace: one line per input (`>`) and per output (`<`), with small ids
//! (`c1` calls, `L1` leases, `request-1` requests, `s1` sessions). The
//! snapshots live in the top-level `snapshots/lease/`.

use kernel::time::Instant;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use kernel::client::lease::{
    CallId, Completion, LeaseError, LeaseId, LeaseInput, LeaseMode, LeaseOutput, LeaseStatus,
    Leases, ReleaseKind, SessionCommand,
};
use kernel::protocol::{
    CommandResult, ErrorCode, ModelRef, ProtocolError, Response, ServerEvent, SessionPhase,
    SessionSnapshot, ThinkingLevel,
};

/// A session snapshot as the server returns it in an `attach` response.
fn snapshot(id: &str, revision: u64) -> SessionSnapshot {
    SessionSnapshot {
        id: id.to_owned(),
        name: None,
        cwd: "/work".to_owned(),
        created_at: 0,
        updated_at: 0,
        phase: SessionPhase::Idle,
        model: ModelRef {
            provider: "p".to_owned(),
            id: "m".to_owned(),
        },
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

/// The scenario DSL: a machine, its trace, and the completions seen so far.
struct Script {
    machine: Leases,
    trace: String,
    calls: u64,
    completions: BTreeMap<CallId, Result<Completion, LeaseError>>,
}

impl Script {
    /// A machine whose connection has completed its handshake.
    fn connected() -> Self {
        let mut script = Self {
            machine: Leases::new(),
            trace: String::new(),
            calls: 0,
            completions: BTreeMap::new(),
        };
        script.input(LeaseInput::Connected);
        script
    }

    /// Feeds one input and records it and its outputs in the trace.
    fn input(&mut self, input: LeaseInput) -> Vec<LeaseOutput> {
        writeln!(self.trace, "> {input}").unwrap();
        let outputs = self.machine.step(Instant(0), input);
        for output in &outputs {
            writeln!(self.trace, "< {output}").unwrap();
            if let LeaseOutput::Complete { call, result } = output {
                assert!(self.completions.insert(*call, result.clone()).is_none());
            }
        }
        outputs
    }

    /// A comment line in the trace.
    fn note(&mut self, text: &str) {
        writeln!(self.trace, "# {text}").unwrap();
    }

    fn call(&mut self) -> CallId {
        self.calls += 1;
        CallId(self.calls)
    }

    fn acquire(&mut self, session_id: &str, mode: LeaseMode) -> (CallId, Vec<LeaseOutput>) {
        let call = self.call();
        (
            call,
            self.input(LeaseInput::Acquire {
                call,
                session_id: session_id.to_owned(),
                mode,
            }),
        )
    }

    fn release(&mut self, lease: LeaseId, kind: ReleaseKind) -> (CallId, Vec<LeaseOutput>) {
        let call = self.call();
        (call, self.input(LeaseInput::Release { call, lease, kind }))
    }

    fn prompt(&mut self, lease: LeaseId, text: &str) -> (CallId, Vec<LeaseOutput>) {
        let call = self.call();
        let command = SessionCommand::Prompt {
            text: text.to_owned(),
        };
        (
            call,
            self.input(LeaseInput::Command {
                call,
                lease,
                command,
            }),
        )
    }

    fn respond(&mut self, request: u64, outcome: Result<CommandResult, ProtocolError>) {
        self.input(LeaseInput::Response(Response {
            id: format!("request-{request}"),
            outcome,
        }));
    }

    fn attach_ok(&mut self, request: u64, session_id: &str) {
        self.respond(
            request,
            Ok(CommandResult::Attach {
                session: snapshot(session_id, request),
            }),
        );
    }

    fn detach_ok(&mut self, request: u64, session_id: &str) {
        self.respond(
            request,
            Ok(CommandResult::Detach {
                session_id: session_id.to_owned(),
            }),
        );
    }

    fn fail(&mut self, request: u64, message: &str) {
        self.respond(
            request,
            Err(ProtocolError::new(ErrorCode::InternalError, message)),
        );
    }

    /// Acquires a lease whose `attach` is request number `request`, answers
    /// it, and returns the granted lease.
    fn lease(&mut self, session_id: &str, mode: LeaseMode, request: u64) -> LeaseId {
        let (call, _) = self.acquire(session_id, mode);
        self.attach_ok(request, session_id);
        self.granted(call)
    }

    fn result(&self, call: CallId) -> Option<&Result<Completion, LeaseError>> {
        self.completions.get(&call)
    }

    fn granted(&self, call: CallId) -> LeaseId {
        match self.result(call) {
            Some(Ok(Completion::Acquired { lease, .. })) => *lease,
            other => panic!("{call} was not granted: {other:?}"),
        }
    }

    fn released(&self, call: CallId) -> bool {
        matches!(self.result(call), Some(Ok(Completion::Released)))
    }

    /// Snapshots the trace under `snapshots/lease/<name>.snap`.
    fn snapshot(self, name: &str) {
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/lease"));
        settings.set_prepend_module_to_snapshot(false);
        settings.bind(|| insta::assert_snapshot!(name, self.trace));
    }
}

fn sends(outputs: &[LeaseOutput]) -> usize {
    outputs
        .iter()
        .filter(|o| matches!(o, LeaseOutput::Send(_)))
        .count()
}

fn ownership(session_id: &str) -> Option<Result<Completion, LeaseError>> {
    Some(Err(LeaseError::Ownership {
        session_id: session_id.to_owned(),
    }))
}

/// Scenario 1. Goal: ownership conflicts are refused locally. Method: hold a
/// shared lease (refused while its `attach` is still in flight, then after it
/// was granted) and try an exclusive one; hold an exclusive lease and try a
/// shared one. Every refusal is an ownership error and sends no request.
#[test]
fn ownership_conflicts_are_refused_without_a_request() {
    let mut s = Script::connected();
    s.note("a shared lease is reserved before its attach is answered");
    let (shared, _) = s.acquire("s1", LeaseMode::Shared);
    let (early, out) = s.acquire("s1", LeaseMode::Exclusive);
    assert_eq!(sends(&out), 0);
    assert_eq!(s.result(early).cloned(), ownership("s1"));
    s.attach_ok(1, "s1");
    s.granted(shared);
    let (late, out) = s.acquire("s1", LeaseMode::Exclusive);
    assert_eq!(sends(&out), 0);
    assert_eq!(s.result(late).cloned(), ownership("s1"));

    s.note("an exclusive lease refuses shared ones");
    s.lease("s2", LeaseMode::Exclusive, 2);
    let (refused, out) = s.acquire("s2", LeaseMode::Shared);
    assert_eq!(sends(&out), 0);
    assert_eq!(s.result(refused).cloned(), ownership("s2"));
    let (refused, out) = s.acquire("s2", LeaseMode::Exclusive);
    assert_eq!(sends(&out), 0);
    assert_eq!(s.result(refused).cloned(), ownership("s2"));
    assert_eq!(s.machine.pending_requests(), 0);
    s.snapshot("1_ownership_conflicts_are_refused");
}

/// Scenario 2. Goal: shared leases share one `attach`, and `detach` goes out
/// only for the last one. Method: two concurrent shared acquisitions and a
/// third after the attachment; release them one by one.
#[test]
fn shared_leases_share_one_attach_and_the_last_release_detaches() {
    let mut s = Script::connected();
    let (first, out) = s.acquire("s1", LeaseMode::Shared);
    assert_eq!(sends(&out), 1);
    let (second, out) = s.acquire("s1", LeaseMode::Shared);
    assert_eq!(sends(&out), 0, "the in-flight attach is shared");
    s.attach_ok(1, "s1");
    let (third, out) = s.acquire("s1", LeaseMode::Shared);
    assert_eq!(sends(&out), 0, "already attached");
    let leases = [s.granted(first), s.granted(second), s.granted(third)];

    let (call, out) = s.release(leases[0], ReleaseKind::Dispose);
    assert_eq!(sends(&out), 0);
    assert!(s.released(call));
    let (call, out) = s.release(leases[1], ReleaseKind::Detach);
    assert_eq!(sends(&out), 0);
    assert!(s.released(call));
    let (last, out) = s.release(leases[2], ReleaseKind::Dispose);
    assert_eq!(sends(&out), 1, "the last release detaches");
    s.detach_ok(2, "s1");
    assert!(s.released(last));
    s.snapshot("2_shared_leases_share_attach_and_last_release_detaches");
}

/// Scenario 3. Goal: disposal is idempotent. Method: dispose a lease twice
/// while its `detach` is in flight (both calls complete together, with the
/// same result, after one request) and once more afterwards (no request);
/// repeat with a `detach` that fails, where both calls get the same error.
#[test]
fn a_second_dispose_returns_the_same_completion() {
    let mut s = Script::connected();
    let lease = s.lease("s1", LeaseMode::Exclusive, 1);
    let (first, out) = s.release(lease, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 1);
    let (second, out) = s.release(lease, ReleaseKind::Dispose);
    assert!(out.is_empty());
    s.detach_ok(2, "s1");
    assert!(s.released(first) && s.released(second));
    let (third, out) = s.release(lease, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 0);
    assert!(s.released(third));

    s.note("the same when the detach fails");
    let lease = s.lease("s2", LeaseMode::Exclusive, 3);
    let (first, _) = s.release(lease, ReleaseKind::Dispose);
    let (second, out) = s.release(lease, ReleaseKind::Dispose);
    assert!(out.is_empty());
    s.fail(4, "detach failed");
    assert!(matches!(s.result(first), Some(Err(LeaseError::Server(_)))));
    assert_eq!(s.result(first), s.result(second));
    let (third, out) = s.release(lease, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 0);
    assert!(s.released(third));
    s.snapshot("3_second_dispose_returns_same_completion");
}

/// Scenario 4. Goal: a failed `detach` during dispose does not leave the
/// lease held, and the session is reconciled before it is used again.
/// Method: dispose an exclusive lease and fail its `detach`; the lease is
/// relinquished (a new exclusive acquisition is allowed) and that
/// acquisition sends a reconciling `detach` before a fresh `attach`.
#[test]
fn a_failed_dispose_relinquishes_and_the_next_acquire_reconciles() {
    let mut s = Script::connected();
    let lease = s.lease("s1", LeaseMode::Exclusive, 1);
    let (dispose, _) = s.release(lease, ReleaseKind::Dispose);
    s.fail(2, "detach failed");
    assert!(matches!(
        s.result(dispose),
        Some(Err(LeaseError::Server(_)))
    ));
    assert_eq!(s.machine.status(lease), Some(LeaseStatus::Released));
    assert!(s.machine.cleanup_required("s1"));
    let (again, out) = s.acquire("s1", LeaseMode::Exclusive);
    assert!(matches!(&out[..], [LeaseOutput::Send(r)] if r.command.name() == "detach"));
    s.detach_ok(3, "s1");
    s.attach_ok(4, "s1");
    let lease = s.granted(again);
    assert!(s.machine.is_active(lease));
    assert!(!s.machine.cleanup_required("s1"));
    s.snapshot("4_failed_dispose_relinquishes_and_next_acquire_reconciles");
}

/// Scenario 5. Goal: `session_removed` and a disconnect invalidate leases,
/// and releasing an invalidated lease sends nothing. Method: remove one
/// leased session and dispose its lease; fail the dispose of another (which
/// marks it for reconciliation); disconnect with a third lease's `detach` in
/// flight (it completes as a no-op); reconnect and acquire again: plain
/// `attach`es, since the disconnect cleared the mark and the invalidated
/// leases no longer count.
#[test]
fn session_removed_and_disconnect_invalidate_leases() {
    let mut s = Script::connected();
    let removed = s.lease("s1", LeaseMode::Exclusive, 1);
    let shared = s.lease("s2", LeaseMode::Shared, 2);
    let marked = s.lease("s3", LeaseMode::Exclusive, 3);

    s.input(LeaseInput::Event(ServerEvent::SessionRemoved {
        session_id: "s1".to_owned(),
    }));
    assert_eq!(s.machine.status(removed), Some(LeaseStatus::Invalidated));
    let (call, out) = s.release(removed, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 0);
    assert!(s.released(call));

    s.release(marked, ReleaseKind::Dispose);
    s.fail(4, "detach failed");
    assert!(s.machine.cleanup_required("s3"));
    let (in_flight, out) = s.release(shared, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 1);
    s.input(LeaseInput::Disconnected);
    assert!(
        s.released(in_flight),
        "an invalidated release completes as a no-op"
    );
    assert!(!s.machine.cleanup_required("s3"));
    let (call, out) = s.release(shared, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 0);
    assert!(s.released(call));

    s.input(LeaseInput::Connected);
    let (_, out) = s.acquire("s3", LeaseMode::Exclusive);
    assert!(matches!(&out[..], [LeaseOutput::Send(r)] if r.command.name() == "attach"));
    let (_, out) = s.acquire("s2", LeaseMode::Exclusive);
    assert!(matches!(&out[..], [LeaseOutput::Send(r)] if r.command.name() == "attach"));
    s.snapshot("5_session_removed_and_disconnect_invalidate_leases");
}

/// Scenario 6. Goal: after the client is disposed, disposing a lease sends
/// nothing. Method: hold a lease with a prompt and another acquisition in
/// flight, dispose the client (the connection closes and the pending calls
/// fail), then dispose and detach the lease (no-ops) and try new calls.
#[test]
fn after_client_disposal_disposing_a_lease_sends_nothing() {
    let mut s = Script::connected();
    let lease = s.lease("s1", LeaseMode::Exclusive, 1);
    let (prompt, _) = s.prompt(lease, "hello");
    let (pending, _) = s.acquire("s2", LeaseMode::Shared);
    let out = s.input(LeaseInput::DisposeClient);
    assert_eq!(sends(&out), 0);
    assert_eq!(
        s.result(prompt).cloned(),
        Some(Err(LeaseError::ClientDisposed))
    );
    assert_eq!(
        s.result(pending).cloned(),
        Some(Err(LeaseError::ClientDisposed))
    );
    let (dispose, out) = s.release(lease, ReleaseKind::Dispose);
    assert_eq!(sends(&out), 0);
    assert!(s.released(dispose));
    let (detach, out) = s.release(lease, ReleaseKind::Detach);
    assert_eq!(sends(&out), 0);
    assert!(s.released(detach));
    let (refused, _) = s.acquire("s1", LeaseMode::Exclusive);
    assert_eq!(
        s.result(refused).cloned(),
        Some(Err(LeaseError::ClientDisposed))
    );
    assert!(s.input(LeaseInput::DisposeClient).is_empty());
    s.snapshot("6_after_client_disposal_lease_dispose_sends_nothing");
}
