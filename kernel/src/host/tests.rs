use super::*;
use crate::ids::OpId;
use crate::protocol::ThinkingLevel;
use crate::worker::Operation;
use std::time::Duration;

fn config() -> HostConfig {
    HostConfig {
        session_id: "s1".into(),
        token: "secret".into(),
        pid: 42,
        models: faux::models(),
        default_model: None,
        cwd: Some("/home/u".into()),
        policy: Policy::default(),
        limits: WorkerLimits::default(),
        observe: false,
    }
}

fn spec() -> CreateSpec {
    CreateSpec {
        cwd: None,
        name: None,
        model: None,
        thinking_level: None,
    }
}

fn start(create: Option<CreateSpec>) -> HostInput {
    HostInput::Frame(WorkerFrame::Start {
        create,
        revision_floor: 0,
    })
}

/// Steps `host`, answering its requests for the MCP configuration with
/// none, as a session without MCP servers does.
fn serve(host: &mut WorkerHost, now: Instant, input: HostInput) -> Vec<HostOutput> {
    let mut out = host.step(now, input);
    out.retain(|o| !matches!(o, HostOutput::RecordMcp(_)));
    while let Some(i) = out.iter().position(|o| *o == HostOutput::LoadMcp) {
        out.remove(i);
        let more = host.step(now, HostInput::Mcp(McpInput::Configure(Vec::new())));
        out.extend(
            more.into_iter()
                .filter(|o| !matches!(o, HostOutput::RecordMcp(_))),
        );
    }
    out
}

/// A host that created its session and committed its first writes.
fn running(config: HostConfig) -> (WorkerHost, Vec<HostOutput>) {
    let (mut host, _) = WorkerHost::new(config, Instant(1000));
    let out = serve(&mut host, Instant(1000), start(Some(spec())));
    let Some(HostOutput::CreateStore(stored)) = out.first().cloned() else {
        panic!("expected CreateStore, got {out:?}");
    };
    let mut out = serve(&mut host, Instant(1000), HostInput::StoreOpened(Ok(stored)));
    commit_all(&mut host, &mut out);
    (host, out)
}

/// Answers every commit in `out` with success, collecting what follows.
fn commit_all(host: &mut WorkerHost, out: &mut Vec<HostOutput>) {
    while let Some(HostOutput::Commit(_)) = out.last() {
        let more = serve(host, Instant(1000), HostInput::Committed(Ok(())));
        out.extend(more);
    }
}

/// The operations `out` answers.
fn answered(out: &[HostOutput]) -> Vec<OpId> {
    sent(out)
        .iter()
        .filter_map(|m| match m {
            FromWorker::OpDone { op, .. } => Some(*op),
            _ => None,
        })
        .collect()
}

fn sent(out: &[HostOutput]) -> Vec<&FromWorker> {
    out.iter()
        .filter_map(|o| match o {
            HostOutput::Send(WorkerFrame::FromWorker(m)) => Some(m),
            _ => None,
        })
        .collect()
}

#[test]
fn the_first_output_is_the_hello_with_the_token() {
    let (host, out) = WorkerHost::new(config(), Instant(0));
    assert_eq!(host.stage(), HostStage::AwaitingStart);
    assert_eq!(
        out,
        vec![HostOutput::Send(WorkerFrame::Hello {
            version: WORKER_PROTOCOL_VERSION,
            token: "secret".into(),
            session_id: "s1".into(),
            pid: 42,
            resume: None,
        })]
    );
}

#[test]
fn create_takes_the_process_cwd_and_the_known_default_model() {
    let mut cfg = config();
    cfg.default_model = Some(ModelRef {
        provider: "faux".into(),
        id: "faux-reasoner".into(),
    });
    let (mut host, _) = WorkerHost::new(cfg.clone(), Instant(5));
    let out = serve(&mut host, Instant(7), start(Some(spec())));
    let [HostOutput::CreateStore(stored)] = out.as_slice() else {
        panic!("{out:?}");
    };
    assert_eq!(stored.cwd, "/home/u");
    assert_eq!(stored.model.id, "faux-reasoner");
    assert_eq!(stored.thinking_level, ThinkingLevel::Off);
    assert_eq!(stored.created_at, 7);

    // A default the catalog no longer has falls back to the built-in one,
    // and no process cwd falls back to `/`.
    cfg.default_model = Some(ModelRef {
        provider: "gone".into(),
        id: "x".into(),
    });
    cfg.cwd = None;
    let (mut host, _) = WorkerHost::new(cfg, Instant(5));
    let out = serve(&mut host, Instant(7), start(Some(spec())));
    let [HostOutput::CreateStore(stored)] = out.as_slice() else {
        panic!("{out:?}");
    };
    assert_eq!(
        (stored.cwd.as_str(), stored.model.clone()),
        ("/", faux::default_model())
    );
}

#[test]
fn a_bad_create_request_fails_and_exits_without_touching_the_store() {
    let (mut host, _) = WorkerHost::new(config(), Instant(0));
    let mut bad = spec();
    bad.model = Some(ModelRef {
        provider: "faux".into(),
        id: "nope".into(),
    });
    let out = serve(&mut host, Instant(0), start(Some(bad)));
    assert!(matches!(
        sent(&out).as_slice(),
        [FromWorker::Failed { error }] if error.code == ErrorCode::InvalidRequest
    ));
    assert_eq!(out.last(), Some(&HostOutput::Exit(Ok(()))));
    assert!(!out.iter().any(|o| matches!(o, HostOutput::CreateStore(_))));
    assert_eq!(host.stage(), HostStage::Done);
}

#[test]
fn store_failures_map_to_protocol_codes() {
    for (kind, code) in [
        (StoreFailureKind::Locked, ErrorCode::SessionLocked),
        (StoreFailureKind::NotFound, ErrorCode::NotFound),
        (StoreFailureKind::InvalidId, ErrorCode::InvalidRequest),
        (StoreFailureKind::Exists, ErrorCode::InvalidRequest),
        (StoreFailureKind::Broken, ErrorCode::InternalError),
    ] {
        let (mut host, _) = WorkerHost::new(config(), Instant(0));
        assert_eq!(
            serve(&mut host, Instant(0), start(None)),
            vec![HostOutput::OpenStore]
        );
        let failure = StoreFailure::new(kind, "why");
        let out = serve(&mut host, Instant(0), HostInput::StoreOpened(Err(failure)));
        assert!(
            matches!(sent(&out).as_slice(), [FromWorker::Failed { error }] if error.code == code && error.message == "why"),
            "{kind:?}: {out:?}"
        );
        assert_eq!(out.last(), Some(&HostOutput::Exit(Ok(()))));
    }
}

#[test]
fn anything_but_start_first_is_an_error_exit() {
    let (mut host, _) = WorkerHost::new(config(), Instant(0));
    let out = serve(
        &mut host,
        Instant(0),
        HostInput::Frame(WorkerFrame::Adopted),
    );
    assert!(matches!(out.as_slice(), [HostOutput::Exit(Err(e))] if e.contains("expected start")));
    let (mut host, _) = WorkerHost::new(config(), Instant(0));
    let out = serve(&mut host, Instant(0), HostInput::ChannelLost);
    assert!(matches!(out.as_slice(), [HostOutput::Exit(Err(e))] if e.contains("before start")));
}

#[test]
fn open_starts_above_the_revision_the_server_showed() {
    let (mut host, _) = WorkerHost::new(config(), Instant(0));
    serve(
        &mut host,
        Instant(0),
        HostInput::Frame(WorkerFrame::Start {
            create: None,
            revision_floor: 9,
        }),
    );
    let (stored, _) = {
        let (mut creator, _) = WorkerHost::new(config(), Instant(0));
        let out = creator.step(Instant(0), start(Some(spec())));
        let Some(HostOutput::CreateStore(s)) = out.into_iter().next() else {
            panic!()
        };
        (s, ())
    };
    let mut out = serve(&mut host, Instant(0), HostInput::StoreOpened(Ok(stored)));
    assert_eq!(out.first(), Some(&HostOutput::RecordServer));
    commit_all(&mut host, &mut out);
    let Some(FromWorker::Ready { snapshot }) = sent(&out).first().copied() else {
        panic!("{out:?}");
    };
    assert!(snapshot.head().revision > 9, "{}", snapshot.head().revision);
}

#[test]
fn nothing_after_a_commit_is_released_until_it_succeeds() {
    let (mut host, _) = running(config());
    let prompt = HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Operation {
        op: OpId(1),
        operation: Operation::prompt("hi"),
    }));
    let out = serve(&mut host, Instant(1000), prompt);
    let Some(HostOutput::Commit(batch)) = out.last() else {
        panic!("the prompt's user item commits first: {out:?}");
    };
    assert!(!batch.is_empty());
    assert!(sent(&out).is_empty(), "no frame before the commit: {out:?}");
    // An input arriving meanwhile waits behind the commit.
    assert!(serve(&mut host, Instant(1001), HostInput::Tick).is_empty());
    let out = serve(&mut host, Instant(1002), HostInput::Committed(Ok(())));
    assert!(!sent(&out).is_empty(), "released after the commit: {out:?}");
    assert!(
        out.iter()
            .any(|o| matches!(o, HostOutput::StartModel { .. }))
    );
}

#[test]
fn the_default_model_is_saved_only_after_its_batch_commits() {
    for ok in [true, false] {
        let (mut host, _) = running(config());
        let set = HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Operation {
            op: OpId(1),
            operation: Operation::SetModel {
                model: ModelRef {
                    provider: "faux".into(),
                    id: "faux-reasoner".into(),
                },
            },
        }));
        let out = serve(&mut host, Instant(1000), set);
        assert!(
            matches!(out.last(), Some(HostOutput::Commit(b)) if !b.iter().any(|p| matches!(p, Persist::DefaultModel(_))))
        );
        assert!(
            !out.iter()
                .any(|o| matches!(o, HostOutput::SaveDefaultModel(_)))
        );
        let result = if ok {
            Ok(())
        } else {
            Err(StoreFailure::new(
                StoreFailureKind::Broken,
                "disk I/O error",
            ))
        };
        let out = serve(&mut host, Instant(1000), HostInput::Committed(result));
        assert_eq!(
            out.iter()
                .any(|o| matches!(o, HostOutput::SaveDefaultModel(m) if m.id == "faux-reasoner")),
            ok,
            "{out:?}"
        );
    }
}

#[test]
fn a_full_store_is_read_back_and_survived_and_a_broken_one_is_fatal() {
    let (mut host, _) = running(config());
    let prompt = HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Operation {
        op: OpId(1),
        operation: Operation::prompt("hi"),
    }));
    serve(&mut host, Instant(1000), prompt.clone());
    let stored = host.runtime().expect("running").state().clone();
    let full = StoreFailure::new(StoreFailureKind::Full, "database or disk is full");
    let out = serve(&mut host, Instant(1000), HostInput::Committed(Err(full)));
    assert_eq!(out, vec![HostOutput::ReloadStore]);
    let out = serve(&mut host, Instant(1000), HostInput::Reloaded(Ok(stored)));
    let done = sent(&out).into_iter().find_map(|m| match m {
        FromWorker::OpDone {
            outcome: Err(e), ..
        } => Some(e.message.clone()),
        _ => None,
    });
    assert!(
        done.as_deref()
            .is_some_and(|m| m.contains("database or disk is full")),
        "the prompt is answered with the cause: {out:?}"
    );
    assert!(
        !out.iter().any(|o| matches!(o, HostOutput::Exit(_))),
        "survived"
    );

    let (mut host, _) = running(config());
    serve(&mut host, Instant(1000), prompt);
    let broken = StoreFailure::new(StoreFailureKind::Broken, "disk I/O error");
    let mut out = serve(&mut host, Instant(1000), HostInput::Committed(Err(broken)));
    commit_all(&mut host, &mut out);
    assert!(
        sent(&out)
            .iter()
            .any(|m| matches!(m, FromWorker::Fatal { .. })),
        "{out:?}"
    );
    assert_eq!(out.last(), Some(&HostOutput::Exit(Ok(()))));
}

#[test]
fn an_orphan_announces_one_attempt_at_a_time_and_is_adopted() {
    let (mut host, _) = running(config());
    let out = serve(&mut host, Instant(2000), HostInput::ChannelLost);
    let [
        HostOutput::Announce(WorkerFrame::Hello {
            resume: Some(snapshot),
            token,
            ..
        }),
    ] = out.as_slice()
    else {
        panic!("{out:?}");
    };
    assert_eq!(
        (snapshot.head().id.as_str(), token.as_str()),
        ("s1", "secret")
    );
    assert!(host.is_orphaned());
    // A retry while the first attempt is out starts no second one.
    assert_eq!(host.next_deadline(), Some(Instant(2200)));
    assert!(serve(&mut host, Instant(2200), HostInput::Tick).is_empty());
    assert!(serve(&mut host, Instant(2201), HostInput::ServerAppeared).is_empty());
    // No server: dropped, and the next retry announces again.
    assert_eq!(
        serve(&mut host, Instant(2300), HostInput::Announced(None)),
        vec![HostOutput::DropAnnouncement]
    );
    let out = serve(&mut host, Instant(2400), HostInput::Tick);
    assert!(
        matches!(out.as_slice(), [HostOutput::Announce(_)]),
        "{out:?}"
    );
    let out = serve(
        &mut host,
        Instant(2410),
        HostInput::Announced(Some(WorkerFrame::Adopted)),
    );
    assert_eq!(out, vec![HostOutput::SwitchChannel]);
    assert!(!host.is_orphaned());
    assert_eq!(host.next_deadline(), None);
}

#[test]
fn an_orphan_ignores_the_old_channel_and_keeps_its_frames_to_itself() {
    let (mut host, _) = running(config());
    serve(&mut host, Instant(1000), HostInput::ChannelLost);
    let prompt = HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Operation {
        op: OpId(1),
        operation: Operation::prompt("hi"),
    }));
    assert!(serve(&mut host, Instant(1000), prompt).is_empty());
}

#[test]
fn an_idle_orphan_retires_after_its_grace_a_busy_one_finishes_first() {
    let mut cfg = config();
    cfg.limits.orphan_grace = Duration::from_secs(1);
    let (mut host, _) = running(cfg.clone());
    serve(&mut host, Instant(1000), HostInput::ChannelLost);
    serve(&mut host, Instant(1001), HostInput::Announced(None));
    let mut out = serve(&mut host, Instant(2000), HostInput::Tick);
    commit_all(&mut host, &mut out);
    assert_eq!(out.last(), Some(&HostOutput::Exit(Ok(()))), "{out:?}");
    assert_eq!(host.stage(), HostStage::Done);

    let (mut host, _) = running(cfg);
    let prompt = HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Operation {
        op: OpId(1),
        operation: Operation::prompt("hi"),
    }));
    let mut out = serve(&mut host, Instant(1000), prompt);
    commit_all(&mut host, &mut out);
    serve(&mut host, Instant(1000), HostInput::ChannelLost);
    serve(&mut host, Instant(1001), HostInput::Announced(None));
    let out = serve(&mut host, Instant(5000), HostInput::Tick);
    assert!(
        !out.iter().any(|o| matches!(o, HostOutput::Exit(_))),
        "a turn is running: {out:?}"
    );
    assert_eq!(host.stage(), HostStage::Running);
}

#[test]
fn an_adopted_turn_answers_no_operation_of_the_new_server() {
    let (mut host, _) = running(config());
    let op = |op: u64, operation: Operation| {
        HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Operation {
            op: OpId(op),
            operation,
        }))
    };
    // The old server's op 1 starts a turn; then that server is gone.
    let mut out = serve(&mut host, Instant(1000), op(1, Operation::prompt("hi")));
    commit_all(&mut host, &mut out);
    serve(&mut host, Instant(1000), HostInput::ChannelLost);
    let out = serve(
        &mut host,
        Instant(1001),
        HostInput::Announced(Some(WorkerFrame::Adopted)),
    );
    assert_eq!(out, vec![HostOutput::SwitchChannel]);
    // The new server numbers from 1 again: its steer is answered as its own.
    let mut out = serve(
        &mut host,
        Instant(1002),
        op(
            1,
            Operation::Steer {
                text: "more".into(),
            },
        ),
    );
    commit_all(&mut host, &mut out);
    let done = answered(&out);
    assert_eq!(done, vec![OpId(1)], "{out:?}");
    // Its abort ends the inherited turn: the abort is answered, under the
    // new server's id; the old prompt's answer goes nowhere.
    let mut out = serve(&mut host, Instant(1003), op(2, Operation::Abort));
    commit_all(&mut host, &mut out);
    let done = answered(&out);
    assert_eq!(done, vec![OpId(2)], "{out:?}");
}

/// Asked for its snapshot, a worker sends the runtime's as it stands,
/// packed; an orphan sends nothing (its announcement carries its state).
#[test]
fn a_worker_asked_for_its_snapshot_sends_it() {
    let (mut host, _) = running(config());
    let ask = HostInput::Frame(WorkerFrame::ToWorker(ToWorker::Snapshot));
    let out = serve(&mut host, Instant(1001), ask.clone());
    let expected = host.runtime().expect("running").snapshot();
    let [FromWorker::Snapshot { snapshot }] = sent(&out).as_slice() else {
        panic!("{out:?}");
    };
    assert_eq!(snapshot.unpack().expect("decodes"), expected);
    serve(&mut host, Instant(1002), HostInput::ChannelLost);
    assert!(host.is_orphaned());
    assert!(sent(&serve(&mut host, Instant(1003), ask)).is_empty());
}
