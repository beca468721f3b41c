//! Unit tests of the runtime's agent loop, driven by a scripted model.

use super::context::{context_tokens, estimate_item, estimate_text, keep_from};
use super::*;
use crate::faux;

struct T {
    rt: Runtime,
    now: u64,
    out: Vec<RuntimeOutput>,
    /// The transcript as a server has it before `out`: built from the tails
    /// published so far.
    replica: Vec<TranscriptItem>,
    /// `replica` before the last step's outputs.
    before: Vec<TranscriptItem>,
}

/// `replica` after the tail a message carries, if any; then the snapshot
/// it stands for, whole.
fn follow(replica: &mut Vec<TranscriptItem>, message: &RuntimeMessage) -> Option<SessionSnapshot> {
    let tail = message.snapshot()?;
    assert!(
        tail.from <= replica.len(),
        "a tail starts within the replica"
    );
    replica.truncate(tail.from);
    replica.extend(tail.snapshot.transcript.iter().cloned());
    Some(SessionSnapshot {
        transcript: replica.clone(),
        ..tail.snapshot.clone()
    })
}

fn stored(model: &str) -> StoredSession {
    StoredSession {
        id: "s".into(),
        name: None,
        cwd: "/w".into(),
        created_at: 0,
        updated_at: 0,
        model: ModelRef {
            provider: "faux".into(),
            id: model.into(),
        },
        thinking_level: ThinkingLevel::Off,
        revision: 0,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        summary: None,
        approvals: Default::default(),
    }
}

impl T {
    fn new(model: &str) -> Self {
        let (rt, out) = Runtime::create(stored(model), faux::models(), Instant(0));
        let rt = rt.with_policy(Policy {
            backoff_base: Duration::from_millis(100),
            ..Policy::default()
        });
        let mut t = Self {
            rt,
            now: 0,
            out,
            replica: Vec::new(),
            before: Vec::new(),
        };
        t.follow_out();
        t
    }

    /// The replica follows the tails in `out`, and equals what was published.
    fn follow_out(&mut self) {
        self.before = self.replica.clone();
        for o in &self.out {
            if let RuntimeOutput::Send(message) = o {
                follow(&mut self.replica, message);
            }
        }
        assert_eq!(
            self.replica, self.rt.published,
            "the tails rebuild the transcript"
        );
    }

    fn step(&mut self, input: RuntimeInput) -> &[RuntimeOutput] {
        self.out = self.rt.step(Instant(self.now), input);
        check_commit_before_announce(&self.out);
        self.follow_out();
        &self.out
    }

    fn op(&mut self, op: u64, operation: Operation) -> &[RuntimeOutput] {
        self.step(RuntimeInput::Operation {
            op: OpId(op),
            operation,
        })
    }

    fn model(&mut self, call: u64, event: ModelEvent) -> &[RuntimeOutput] {
        self.step(RuntimeInput::Model { call, event })
    }

    fn started_call(&self) -> Option<(u64, ModelRequest)> {
        self.out.iter().find_map(|o| match o {
            RuntimeOutput::StartModel { call, request } => Some((*call, request.clone())),
            _ => None,
        })
    }

    fn run_tool(&self) -> Option<(String, String)> {
        self.out.iter().find_map(|o| match o {
            RuntimeOutput::RunTool { id, tool_name, .. } => Some((id.clone(), tool_name.clone())),
            _ => None,
        })
    }

    /// The answer to `op` in the last step's outputs, its snapshot whole.
    fn done(&self, op: u64) -> Option<Result<SessionSnapshot, ProtocolError>> {
        let mut replica = self.replica_before();
        self.out.iter().find_map(|o| {
            let RuntimeOutput::Send(message) = o else {
                return None;
            };
            let whole = follow(&mut replica, message);
            match message {
                FromWorker::OpDone { op: o, outcome } if o.0 == op => {
                    Some(outcome.clone().map(|_| whole.expect("a snapshot")))
                }
                _ => None,
            }
        })
    }

    /// The replica as it stood before the last step's outputs.
    fn replica_before(&self) -> Vec<TranscriptItem> {
        self.before.clone()
    }

    fn kinds(&self) -> Vec<String> {
        self.rt
            .state()
            .transcript
            .iter()
            .map(|i| match i {
                TranscriptItem::User(_) => "user".to_string(),
                TranscriptItem::Assistant(a) => format!("assistant:{:?}", a.status),
                TranscriptItem::Tool(t) => format!("tool:{:?}", t.status),
            })
            .collect()
    }
}

/// Every `item_finished` in a batch follows the persist of that very item.
fn check_commit_before_announce(out: &[RuntimeOutput]) {
    for (i, o) in out.iter().enumerate() {
        if let RuntimeOutput::Send(FromWorker::Progress {
            progress: TranscriptProgress::ItemFinished { item },
        }) = o
        {
            let persisted = out[..i]
                .iter()
                .any(|p| matches!(p, RuntimeOutput::Persist(Persist::Item(x)) if x == item));
            assert!(
                persisted,
                "item {} announced before it was committed",
                item.id()
            );
        }
    }
}

fn text(t: &str) -> ModelEvent {
    ModelEvent::Delta {
        kind: DeltaKind::Text,
        text: t.into(),
    }
}

fn done(stop: StopReason) -> ModelEvent {
    ModelEvent::Done {
        stop,
        usage: None,
        response_model: Some("faux-1-2026".into()),
    }
}

fn tool_call(id: &str, command: &str) -> Vec<ModelEvent> {
    vec![
        ModelEvent::ToolCall {
            tool_call_id: id.into(),
            tool_name: "bash".into(),
        },
        ModelEvent::Delta {
            kind: DeltaKind::ToolCall,
            text: "{\"command\":".into(),
        },
        ModelEvent::ToolInput {
            input: Value::Map(vec![("command".into(), Value::text(command))]),
        },
    ]
}

fn tool_done(t: &mut T, id: &str, output: &str) {
    t.step(RuntimeInput::ToolDone {
        id: id.into(),
        content: vec![Content::Text {
            text: output.into(),
        }],
        details: None,
        is_error: false,
    });
}

#[test]
fn a_plain_turn_streams_commits_and_completes_the_prompt() {
    let mut t = T::new("faux-1");
    assert!(matches!(
        t.out.last(),
        Some(RuntimeOutput::Send(FromWorker::Ready { .. }))
    ));
    t.op(1, Operation::prompt("hi"));
    let (call, request) = t.started_call().expect("a model call");
    assert_eq!(request.purpose, Purpose::Reply);
    assert_eq!(
        request.context.len(),
        1,
        "the user message, not the streaming reply"
    );
    assert_eq!(t.rt.phase(), SessionPhase::Turn);
    t.model(call, text("hel"));
    t.model(call, text("lo"));
    t.model(call, done(StopReason::Stop));
    let snap = t.done(1).expect("prompt answered").expect("ok");
    assert_eq!(snap.phase, SessionPhase::Idle);
    assert_eq!(t.kinds(), ["user", "assistant:Complete(Stop)"]);
    let TranscriptItem::Assistant(a) = &snap.transcript[1] else {
        panic!()
    };
    assert_eq!(
        a.content,
        vec![Content::Text {
            text: "hello".into()
        }]
    );
    assert_eq!(a.response_model.as_deref(), Some("faux-1-2026"));
}

/// A prompt's images follow its text in the user message, which the model
/// is given whole.
#[test]
fn a_prompt_s_images_go_with_its_text_to_the_model() {
    let mut t = T::new("faux-1");
    let image = Content::Image {
        data: "iVBORw0KGgo=".into(),
        mime_type: "image/png".into(),
    };
    t.op(
        1,
        Operation::Prompt {
            text: "what is this".into(),
            images: vec![image.clone()],
        },
    );
    let (_, request) = t.started_call().expect("a model call");
    let TranscriptItem::User(user) = &request.context[0] else {
        panic!("{:?}", request.context)
    };
    assert_eq!(
        user.content,
        vec![
            Content::Text {
                text: "what is this".into()
            },
            image
        ]
    );
}

#[test]
fn tool_calls_run_one_at_a_time_then_the_model_continues() {
    let mut t = T::new("faux-1");
    two_bash_calls(&mut t, 1);
    let (first, name) = t.run_tool().expect("first tool runs");
    assert_eq!(name, "bash");
    assert_eq!(
        t.kinds(),
        [
            "user",
            "assistant:Complete(ToolUse)",
            "tool:Running",
            "tool:Running"
        ]
    );
    tool_done(&mut t, &first, "a b c");
    let (second, _) = t.run_tool().expect("second tool runs");
    assert_ne!(first, second);
    assert!(
        t.started_call().is_none(),
        "no model call while a tool runs"
    );
    tool_done(&mut t, &second, "/w");
    let (call2, request) = t.started_call().expect("the model continues");
    assert_eq!(
        request.context.len(),
        4,
        "user, reply with calls, two results"
    );
    t.model(call2, text("done"));
    t.model(call2, done(StopReason::Stop));
    assert!(t.done(1).unwrap().is_ok());
    assert_eq!(
        t.kinds(),
        [
            "user",
            "assistant:Complete(ToolUse)",
            "tool:Complete",
            "tool:Complete",
            "assistant:Complete(Stop)"
        ]
    );
}

#[test]
fn steer_is_delivered_after_the_current_tool_and_skips_the_rest() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    for e in tool_call("c1", "make")
        .into_iter()
        .chain(tool_call("c2", "make test"))
    {
        t.model(call, e);
    }
    t.model(call, done(StopReason::ToolUse));
    let (first, _) = t.run_tool().unwrap();
    let snap = t.op(
        2,
        Operation::Steer {
            text: "stop, use cargo".into(),
        },
    );
    assert!(!snap.is_empty());
    assert_eq!(t.rt.snapshot().queued_steer_count, 1);
    tool_done(&mut t, &first, "ok");
    assert!(t.run_tool().is_none(), "the second call is skipped");
    let (_, request) = t.started_call().expect("the model hears the steer next");
    assert!(
        matches!(request.context.last(), Some(TranscriptItem::User(u)) if u.content == vec![Content::Text { text: "stop, use cargo".into() }])
    );
    assert_eq!(t.rt.snapshot().queued_steer_count, 0);
    assert_eq!(
        t.kinds(),
        [
            "user",
            "assistant:Complete(ToolUse)",
            "tool:Complete",
            "tool:Error",
            "user",
            "assistant:Streaming"
        ]
    );
}

#[test]
fn abort_during_a_tool_cancels_it_and_completes_both_requests() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    for e in tool_call("c1", "sleep 100") {
        t.model(call, e);
    }
    t.model(call, done(StopReason::ToolUse));
    let (id, _) = t.run_tool().unwrap();
    t.op(2, Operation::Abort);
    assert!(
        t.out
            .contains(&RuntimeOutput::CancelTool { id: id.clone() })
    );
    assert!(t.done(2).unwrap().is_ok() && t.done(1).unwrap().is_ok());
    assert_eq!(t.rt.phase(), SessionPhase::Idle);
    assert_eq!(
        t.kinds(),
        ["user", "assistant:Complete(ToolUse)", "tool:Error"]
    );
    tool_done(&mut t, &id, "late");
    assert_eq!(
        t.kinds(),
        ["user", "assistant:Complete(ToolUse)", "tool:Error"],
        "a late result is ignored"
    );
}

/// An abort withdraws the steers the model has not seen: the aborted reply
/// stays the last item, the abort's response lists them (for the client to
/// put back in its input), and the next revision has none; nothing of them
/// is sent as context later.
#[test]
fn abort_withdraws_steers_the_model_has_not_seen() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    t.started_call().unwrap();
    t.op(
        2,
        Operation::Steer {
            text: "also this".into(),
        },
    );
    t.op(3, Operation::Abort);
    let abort = t.done(3).unwrap().unwrap();
    assert_eq!(abort.phase, SessionPhase::Idle);
    assert_eq!(abort.queued_steer.len(), 1, "the abort's response lists it");
    assert_eq!(
        abort.queued_steer[0].content,
        vec![Content::Text {
            text: "also this".into()
        }]
    );
    assert_eq!(t.kinds(), ["user", "assistant:Aborted"], "not committed");
    let now = t.rt.snapshot();
    assert!(now.queued_steer.is_empty() && now.revision == abort.revision + 1);
    t.out.clear();
    t.op(4, Operation::prompt("next"));
    let (_, request) = t.started_call().unwrap();
    assert!(
        !format!("{:?}", request.context).contains("also this"),
        "a withdrawn steer never reaches the model"
    );
}

/// A turn that ends by itself still carries on with queued steers.
#[test]
fn a_turn_ending_normally_keeps_its_queued_steers() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    t.op(
        2,
        Operation::Steer {
            text: "and then".into(),
        },
    );
    t.out.clear();
    t.model(call, done(StopReason::Stop));
    let (_, request) = t.started_call().expect("the steer goes to the model");
    assert!(matches!(
        request.context.last(),
        Some(TranscriptItem::User(_))
    ));
}

/// The stored text of the streaming reply, per its last `Persist::Item`.
fn persisted_text(out: &[RuntimeOutput]) -> Option<String> {
    out.iter().rev().find_map(|o| match o {
        RuntimeOutput::Persist(Persist::Item(TranscriptItem::Assistant(a))) => {
            Some(crate::client::follow::text_of(&a.content))
        }
        _ => None,
    })
}

/// A streaming reply is checkpointed at most 250 ms after a delta was shown,
/// or at once when 4 KiB are unsaved; after a crash the aborted item keeps
/// the checkpointed text.
#[test]
fn streaming_text_is_checkpointed_within_its_bound() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    t.now = 10;
    t.model(call, text("one "));
    assert_eq!(persisted_text(&t.out), None, "not at once");
    assert_eq!(t.rt.next_deadline(), Some(Instant(260)));
    t.now = 100;
    t.model(call, text("two "));
    assert_eq!(
        t.rt.next_deadline(),
        Some(Instant(260)),
        "the first unsaved delta sets it"
    );
    t.now = 260;
    t.step(RuntimeInput::Tick);
    assert_eq!(persisted_text(&t.out).as_deref(), Some("one two "));
    assert_eq!(t.rt.next_deadline(), None, "nothing unsaved");
    t.now = 270;
    let big = "x".repeat(4096);
    t.model(call, text(&big));
    assert_eq!(
        persisted_text(&t.out).map(|s| s.len()),
        Some(8 + 4096),
        "4 KiB unsaved is stored at once"
    );
    t.now = 280;
    t.model(call, text("tail"));
    // The worker dies here: what was stored is what a new worker opens.
    let mut state = t.rt.state().clone();
    if let Some(TranscriptItem::Assistant(a)) = state.transcript.last_mut() {
        a.content = vec![Content::Text {
            text: format!("one two {big}"),
        }];
    }
    let (reopened, _) = Runtime::open(state, faux::models(), Instant(1000));
    match reopened.state().transcript.last() {
        Some(TranscriptItem::Assistant(a)) => {
            assert_eq!(a.status, AssistantStatus::Aborted);
            assert_eq!(crate::client::follow::text_of(&a.content).len(), 8 + 4096);
        }
        other => panic!("{other:?}"),
    }
    t.model(call, done(StopReason::Stop));
    assert_eq!(t.rt.next_deadline(), None, "the final commit clears it");
}

#[test]
fn transient_errors_retry_with_backoff_then_give_up() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    let fail = |retry_after_ms| ModelEvent::Failed {
        message: "HTTP 503".into(),
        retryable: true,
        retry_after_ms,
    };
    t.model(call, fail(None));
    assert_eq!(t.rt.phase(), SessionPhase::Retry);
    assert_eq!(t.rt.next_deadline(), Some(Instant(100)));
    t.now = 99;
    t.step(RuntimeInput::Tick);
    assert!(t.started_call().is_none(), "not yet");
    t.now = 100;
    t.step(RuntimeInput::Tick);
    let (call, _) = t.started_call().expect("retried");
    assert_eq!(t.rt.phase(), SessionPhase::Turn);
    t.model(call, fail(Some(250)));
    assert_eq!(
        t.rt.next_deadline(),
        Some(Instant(350)),
        "retry-after is honoured"
    );
    t.now = 350;
    t.step(RuntimeInput::Tick);
    let (call, _) = t.started_call().unwrap();
    t.model(call, fail(None));
    t.now = t.rt.next_deadline().unwrap().as_millis();
    t.step(RuntimeInput::Tick);
    let (call, _) = t.started_call().unwrap();
    t.model(call, fail(None));
    assert_eq!(
        t.rt.phase(),
        SessionPhase::Idle,
        "four attempts, then the turn ends"
    );
    assert!(t.done(1).unwrap().is_ok());
    assert_eq!(
        t.kinds().iter().filter(|k| *k == "assistant:Error").count(),
        4
    );
}

#[test]
fn a_permanent_error_ends_the_turn_with_an_error_item() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    t.model(
        call,
        ModelEvent::Failed {
            message: "HTTP 401: invalid key".into(),
            retryable: false,
            retry_after_ms: None,
        },
    );
    assert!(t.done(1).unwrap().is_ok());
    let TranscriptItem::Assistant(a) = t.rt.state().transcript.last().unwrap() else {
        panic!()
    };
    assert_eq!(a.status, AssistantStatus::Error);
    assert_eq!(a.error_message.as_deref(), Some("HTTP 401: invalid key"));
}

#[test]
fn compaction_summarises_older_items_when_the_window_fills() {
    let mut t = T::new("faux-tiny");
    let long = "word ".repeat(60);
    let mut op = 1;
    let mut compactions = 0;
    // Each summary call reports its usage, as a provider does.
    let call_usage = Usage {
        input: 300,
        output: 20,
        total_tokens: 320,
        cost: crate::protocol::UsageCost {
            input: 0.25,
            total: 0.25,
            ..Default::default()
        },
        ..Usage::default()
    };
    let mut persisted = None;
    for _ in 0..12 {
        t.op(op, Operation::prompt(long.clone()));
        loop {
            let (call, request) = t.started_call().expect("a call");
            if request.purpose == Purpose::Summarize {
                assert_eq!(t.rt.phase(), SessionPhase::Compaction);
                compactions += 1;
                t.model(call, text("the user kept saying word"));
                let out = t.model(
                    call,
                    ModelEvent::Done {
                        stop: StopReason::Stop,
                        usage: Some(call_usage.clone()),
                        response_model: None,
                    },
                );
                persisted = out
                    .iter()
                    .find_map(|o| match o {
                        RuntimeOutput::Persist(Persist::State { summary, .. }) => summary.clone(),
                        _ => None,
                    })
                    .or(persisted);
                continue;
            }
            t.model(call, text("ok"));
            t.model(call, done(StopReason::Stop));
            break;
        }
        assert!(t.done(op).unwrap().is_ok());
        op += 1;
    }
    assert!(compactions >= 2, "the tiny window forced compactions");
    let summary = t.rt.state().summary.clone().expect("a summary is kept");
    assert_eq!(summary.text, "the user kept saying word");
    // The summary calls are paid for: their usage adds up on the summary,
    // which is stored.
    let usage = summary.usage.clone().expect("the summary calls' usage");
    assert_eq!(
        (usage.input, usage.output, usage.total_tokens),
        (300 * compactions, 20 * compactions, 320 * compactions)
    );
    assert!((usage.cost.total - 0.25 * compactions as f64).abs() < 1e-9);
    assert_eq!(persisted.as_ref(), Some(&summary), "stored with the state");
    assert_eq!(
        t.rt.state().transcript.len(),
        24,
        "compaction never drops transcript items"
    );
    t.op(op, Operation::prompt("short"));
    let (_, request) = t.started_call().unwrap();
    assert_eq!(
        request.summary.as_deref(),
        Some("the user kept saying word")
    );
    assert!(request.context.len() < t.rt.state().transcript.len());
}

#[test]
fn open_marks_interrupted_work_and_never_reruns_it() {
    let mut s = stored("faux-1");
    s.revision = 41;
    s.transcript = vec![
        TranscriptItem::User(UserItem {
            id: "item-1".into(),
            content: vec![],
            timestamp: 0,
        }),
        TranscriptItem::Assistant(AssistantItem {
            id: "item-2".into(),
            content: vec![],
            model: s.model.clone(),
            response_model: None,
            usage: None,
            timestamp: 0,
            status: AssistantStatus::Complete(StopReason::ToolUse),
            error_message: None,
        }),
        TranscriptItem::Tool(ToolItem {
            id: "item-3".into(),
            tool_call_id: "c".into(),
            tool_name: "bash".into(),
            input: Value::Map(vec![]),
            content: vec![],
            details: None,
            usage: None,
            timestamp: 0,
            status: ToolStatus::Running,
        }),
    ];
    s.queued_steer = vec![UserItem {
        id: "item-4".into(),
        content: vec![],
        timestamp: 0,
    }];
    let (rt, out) = Runtime::open(s, faux::models(), Instant(5));
    assert!(!out.iter().any(|o| matches!(
        o,
        RuntimeOutput::RunTool { .. } | RuntimeOutput::StartModel { .. }
    )));
    let snap = rt.snapshot();
    assert_eq!(snap.revision, 42, "revisions continue from storage");
    assert!(
        matches!(&snap.transcript[2], TranscriptItem::Tool(t) if t.status == ToolStatus::Error)
    );
    assert!(
        matches!(&snap.transcript[3], TranscriptItem::User(u) if u.id == "item-4"),
        "undelivered steer kept"
    );
    assert_eq!(snap.queued_steer_count, 0);
    let (rt2, _) = Runtime::open(rt.state().clone(), faux::models(), Instant(6));
    assert_eq!(
        rt2.snapshot().transcript,
        snap.transcript,
        "recovery is idempotent"
    );
}

#[test]
fn set_model_records_the_default_for_new_sessions() {
    let mut t = T::new("faux-1");
    let out = t
        .op(
            1,
            Operation::SetModel {
                model: ModelRef {
                    provider: "faux".into(),
                    id: "faux-reasoner".into(),
                },
            },
        )
        .to_vec();
    assert!(
        out.contains(&RuntimeOutput::Persist(Persist::DefaultModel(ModelRef {
            provider: "faux".into(),
            id: "faux-reasoner".into()
        })))
    );
}

#[test]
fn a_rename_is_stored_and_shown_even_during_a_turn() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("go"));
    let out = t
        .op(
            2,
            Operation::Rename {
                name: "fixes".into(),
            },
        )
        .to_vec();
    assert!(
        out.iter().any(|o| matches!(
            o,
            RuntimeOutput::Persist(Persist::State { name: Some(n), .. }) if n == "fixes"
        )),
        "{out:#?}"
    );
    let renamed = t.done(2).expect("answered").expect("accepted");
    assert_eq!(renamed.name.as_deref(), Some("fixes"));
    assert_eq!(renamed.phase, SessionPhase::Turn, "the turn goes on");
}

#[test]
fn faux_tool_round_trip() {
    // The faux provider asks for bash on a `!` prompt and reports the result.
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("!echo hi"));
    let mut guard = 0;
    while t.done(1).is_none() {
        guard += 1;
        assert!(guard < 10);
        if let Some((call, request)) = t.started_call() {
            let mut stream = faux::FauxStream::start(&request, Instant(t.now), Duration::ZERO);
            let events = stream.step(Instant(t.now));
            let mut last = Vec::new();
            for e in events {
                last = t.model(call, e).to_vec();
            }
            t.out = last;
        } else if let Some((id, _)) = t.run_tool() {
            tool_done(&mut t, &id, "hi");
        } else {
            panic!("stuck: {:?}", t.out);
        }
    }
    assert_eq!(
        t.kinds(),
        [
            "user",
            "assistant:Complete(ToolUse)",
            "tool:Complete",
            "assistant:Complete(Stop)"
        ]
    );
    let TranscriptItem::Assistant(a) = t.rt.state().transcript.last().unwrap() else {
        panic!()
    };
    assert!(matches!(&a.content[0], Content::Text { text } if text.contains("finished: hi")));
}

/// Runs one prompt to its end with replies of `reply`, answering every
/// compaction with a short summary; returns whether it compacted and the
/// estimated size of the reply request (summary and context).
fn turn_with_compaction(t: &mut T, op: u64, prompt: &str, reply: &str) -> (bool, u64) {
    t.op(op, Operation::prompt(prompt));
    let mut compacted = false;
    loop {
        let (call, request) = t.started_call().expect("a call");
        if request.purpose == Purpose::Summarize {
            compacted = true;
            t.model(call, text("summary"));
            t.model(call, done(StopReason::Stop));
            continue;
        }
        let size = request.summary.as_deref().map_or(0, estimate_text)
            + request.context.iter().map(estimate_item).sum::<u64>();
        t.model(call, text(reply));
        t.model(call, done(StopReason::Stop));
        assert!(t.done(op).unwrap().is_ok());
        return (compacted, size);
    }
}

#[test]
fn a_compaction_leaves_room_so_the_next_turns_do_not_compact_again() {
    let mut t = T::new("faux-tiny"); // a 400-token window: compaction past 320
    let window = 400;
    let prompt = "word ".repeat(60);
    let mut compactions = Vec::new();
    for op in 1..=12 {
        let (compacted, size) = turn_with_compaction(&mut t, op, &prompt, "ok");
        assert!(
            size * 100 <= window * 80,
            "turn {op}: the request after compaction fits ({size} tokens)"
        );
        if compacted {
            compactions.push(op);
        }
    }
    assert!(compactions.len() >= 2, "{compactions:?}");
    assert!(
        compactions.windows(2).all(|w| w[1] - w[0] >= 2),
        "never two turns in a row: {compactions:?}"
    );
}

#[test]
fn the_kept_part_never_starts_with_a_tool_result() {
    let user = |id: &str, text: &str| {
        TranscriptItem::User(UserItem {
            id: id.into(),
            content: vec![Content::Text { text: text.into() }],
            timestamp: 0,
        })
    };
    let call = TranscriptItem::Assistant(AssistantItem {
        id: "a".into(),
        content: vec![Content::ToolCall {
            tool_call_id: "c".into(),
            tool_name: "bash".into(),
            input: Value::Map(Vec::new()),
        }],
        model: faux::default_model(),
        response_model: None,
        usage: None,
        timestamp: 0,
        status: AssistantStatus::Complete(StopReason::ToolUse),
        error_message: None,
    });
    let result = |id: &str, text: &str| {
        TranscriptItem::Tool(ToolItem {
            id: id.into(),
            tool_call_id: "c".into(),
            tool_name: "bash".into(),
            input: Value::Map(Vec::new()),
            content: vec![Content::Text { text: text.into() }],
            details: None,
            usage: None,
            timestamp: 0,
            status: ToolStatus::Complete,
        })
    };
    let big = "x".repeat(400); // 100 tokens
    let context = vec![
        user("u1", &big),
        call.clone(),
        result("t1", &big),
        result("t2", "short"),
    ];
    // A budget for the newest result only would cut between the call and
    // its results: the cut moves back to the call.
    assert_eq!(keep_from(&context, 10), 1);
    assert_eq!(keep_from(&context, 1000), 0, "everything fits");
    assert_eq!(keep_from(&[user("u", &big)], 1), 0, "the newest item stays");
}

#[test]
fn reported_usage_counts_and_only_what_follows_it_is_estimated() {
    let reply = |usage: Option<Usage>, status| {
        TranscriptItem::Assistant(AssistantItem {
            id: "a".into(),
            content: vec![Content::Text {
                text: "x".repeat(4000),
            }],
            model: faux::default_model(),
            response_model: None,
            usage,
            timestamp: 0,
            status,
            error_message: None,
        })
    };
    let usage = Usage {
        input: 9000,
        output: 500,
        cache_read: 400,
        cache_write: 100,
        reasoning: None,
        total_tokens: 10_000,
        cost: crate::protocol::UsageCost::default(),
    };
    let after = TranscriptItem::User(UserItem {
        id: "u".into(),
        content: vec![Content::Text {
            text: "y".repeat(400),
        }],
        timestamp: 0,
    });
    let complete = AssistantStatus::Complete(StopReason::Stop);
    let context = vec![reply(Some(usage.clone()), complete), after.clone()];
    assert_eq!(context_tokens(&context), 10_000 + 100 + 4);
    let estimated = vec![reply(None, complete), after.clone()];
    assert_eq!(context_tokens(&estimated), 1004 + 104);
    let failed = vec![reply(Some(usage), AssistantStatus::Error), after];
    assert_eq!(context_tokens(&failed), 104, "a failed reply is not sent");
}

#[test]
fn a_context_overflow_compacts_and_retries_once() {
    let mut t = T::new("faux-1"); // a large window: nothing is due by size
    for op in 1..=3 {
        let (compacted, _) = turn_with_compaction(&mut t, op, "hello there", "hi");
        assert!(!compacted);
    }
    t.op(4, Operation::prompt("more"));
    let overflow = |t: &mut T, call| {
        t.model(
            call,
            ModelEvent::Failed {
                message: "This model's maximum context length is 8192 tokens. However, your \
                          messages resulted in 9000 tokens. (context_length_exceeded)"
                    .into(),
                retryable: false,
                retry_after_ms: None,
            },
        );
    };
    let (call, request) = t.started_call().unwrap();
    assert_eq!(request.purpose, Purpose::Reply);
    overflow(&mut t, call);
    let (call, request) = t.started_call().expect("compacts at once");
    assert_eq!(request.purpose, Purpose::Summarize);
    t.model(call, text("earlier: greetings"));
    t.model(call, done(StopReason::Stop));
    let (call, request) = t.started_call().expect("asks again");
    assert_eq!(request.purpose, Purpose::Reply);
    assert_eq!(request.summary.as_deref(), Some("earlier: greetings"));
    overflow(&mut t, call);
    assert!(
        t.started_call().is_none(),
        "a second overflow ends the turn"
    );
    assert!(t.done(4).unwrap().is_ok(), "the prompt completes");
    let Some(TranscriptItem::Assistant(last)) = t.rt.state().transcript.last() else {
        panic!("a reply ends the turn");
    };
    assert_eq!(last.status, AssistantStatus::Error);
    assert!(
        last.error_message
            .as_deref()
            .unwrap()
            .contains("maximum context length")
    );
}

#[test]
fn overflow_errors_are_recognised_and_rate_limits_are_not() {
    for overflow in [
        "This model's maximum context length is 128000 tokens (context_length_exceeded)",
        "prompt is too long: 210000 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit; the request exceeds the context window",
        "Please reduce the length of the messages or completion.",
    ] {
        assert!(is_context_overflow(overflow), "{overflow}");
    }
    for other in [
        "Rate limit reached for gpt-4o on tokens per min (TPM)",
        "Number of request tokens has exceeded your per-minute rate limit",
        "HTTP 401: invalid key",
        "overloaded_error",
    ] {
        assert!(!is_context_overflow(other), "{other}");
    }
}

#[test]
fn a_dispose_whose_last_write_fails_still_exits() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("hi"));
    let (call, _) = t.started_call().expect("a model call");
    t.model(call, text("hel"));
    let out = t.step(RuntimeInput::Dispose).to_vec();
    let exit = out
        .iter()
        .position(|o| matches!(o, RuntimeOutput::Exit))
        .expect("dispose exits");
    let write = out
        .iter()
        .position(|o| matches!(o, RuntimeOutput::Persist(_)))
        .expect("the interrupted reply is written");
    assert!(write < exit, "the exit waits behind the write");
    // The host could not write: it hands back what it held, the exit included.
    let out = t.step(RuntimeInput::StorageFailed {
        message: "disk gone".into(),
        fault: StorageFault::Fatal,
        dropped: out[write + 1..].to_vec(),
        stored: None,
    });
    assert!(
        matches!(out, [RuntimeOutput::Exit]),
        "the runtime still exits: {out:?}"
    );
    // Anything after that is ignored.
    assert!(t.step(RuntimeInput::Tick).is_empty());
}

/// A provider's signature of a thinking part is kept with the part in the
/// stored item (clients never see it): more thinking after a signed part
/// starts a part of its own, and the next call's context carries both.
#[test]
fn a_thinking_signature_is_kept_with_its_part() {
    let mut t = T::new("faux-1");
    t.op(1, Operation::prompt("hi"));
    let (call, _) = t.started_call().expect("a model call");
    let thinking = |text: &str| ModelEvent::Delta {
        kind: DeltaKind::Thinking,
        text: text.into(),
    };
    t.model(call, thinking("first"));
    t.model(call, thinking(" thought"));
    t.model(
        call,
        ModelEvent::Signature {
            signature: "sig-1".into(),
        },
    );
    t.model(call, thinking("second"));
    t.model(call, text("answer"));
    let out = t.model(call, done(StopReason::Stop)).to_vec();
    let part = |thinking: &str, signature: Option<&str>| Content::Thinking {
        thinking: thinking.into(),
        redacted: None,
        signature: signature.map(Into::into),
    };
    let want = vec![
        part("first thought", Some("sig-1")),
        part("second", None),
        Content::Text {
            text: "answer".into(),
        },
    ];
    let stored = out.iter().find_map(|o| match o {
        RuntimeOutput::Persist(Persist::Item(TranscriptItem::Assistant(a))) => Some(a.clone()),
        _ => None,
    });
    assert_eq!(stored.expect("the reply is stored").content, want);
    let snap = t.done(1).expect("answered").expect("ok");
    let wire = crate::protocol::codec::Schema::to_checked_value(&snap.transcript[1]);
    assert!(
        !format!("{:?}", wire.expect("encodes")).contains("sig-1"),
        "clients get no signature"
    );
    t.op(2, Operation::prompt("more"));
    let (_, request) = t.started_call().expect("a model call");
    let TranscriptItem::Assistant(context) = &request.context[1] else {
        panic!("the reply")
    };
    assert_eq!(context.content, want, "the next call sends it back");
}

/// `compact`: between turns, a compaction of its own, answered when the
/// summary is stored; refused with nothing older to summarise, or while a
/// turn runs; an abort or a failed summary call ends it, nothing changed.
#[test]
fn a_compaction_asked_for_summarises_now_and_is_answered_when_stored() {
    let mut t = T::new("faux-tiny");
    // Nothing yet: refused at once, nothing started.
    t.op(1, Operation::Compact { instructions: None });
    let refused = t.done(1).expect("answered at once").unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidRequest);
    assert!(
        refused.message.starts_with("Nothing to compact"),
        "{refused:?}"
    );
    assert_eq!(t.rt.phase(), SessionPhase::Idle);
    // Two short turns, under the threshold: no compaction of their own.
    for (op, prompt) in [(2, "first question"), (3, "second question")] {
        t.op(op, Operation::prompt(prompt));
        let (call, request) = t.started_call().expect("a reply");
        assert_eq!(request.purpose, Purpose::Reply);
        t.model(call, text(&"an answer word ".repeat(30)));
        t.model(call, done(StopReason::Stop));
        assert!(t.done(op).unwrap().is_ok());
    }
    let items = t.rt.state().transcript.len();
    // Asked for: it starts now, and a prompt or a steer meanwhile is busy.
    t.op(
        4,
        Operation::Compact {
            instructions: Some("keep the questions".into()),
        },
    );
    let (call, request) = t.started_call().expect("a summary call");
    assert_eq!(request.purpose, Purpose::Summarize);
    assert_eq!(request.instructions.as_deref(), Some("keep the questions"));
    assert_eq!(t.rt.phase(), SessionPhase::Compaction);
    assert!(t.done(4).is_none(), "answered when stored");
    t.op(5, Operation::prompt("now"));
    assert_eq!(t.done(5).unwrap().unwrap_err().code, ErrorCode::Busy);
    t.op(6, Operation::Steer { text: "now".into() });
    assert_eq!(t.done(6).unwrap().unwrap_err().code, ErrorCode::Busy);
    t.model(call, text("they asked two questions"));
    t.model(call, done(StopReason::Stop));
    let answered = t.done(4).expect("answered").expect("compacted");
    assert_eq!(answered.phase, SessionPhase::Idle);
    let summary = t.rt.state().summary.clone().expect("a summary");
    assert_eq!(summary.text, "they asked two questions");
    assert_eq!(t.rt.state().transcript.len(), items, "no item dropped");
    // The next turn starts from the summary.
    t.op(7, Operation::prompt("go on"));
    let (call, request) = t.started_call().expect("a reply");
    assert_eq!(request.summary.as_deref(), Some("they asked two questions"));
    assert!(request.context.len() < items);
    // Asked for during a turn: busy.
    t.op(8, Operation::Compact { instructions: None });
    assert_eq!(t.done(8).unwrap().unwrap_err().code, ErrorCode::Busy);
    t.model(call, text(&"more words ".repeat(30)));
    t.model(call, done(StopReason::Stop));
    assert!(t.done(7).unwrap().is_ok());
    // An abort ends it: the compaction is answered as aborted, the
    // summary as it was.
    t.op(9, Operation::Compact { instructions: None });
    assert!(t.started_call().is_some());
    t.op(10, Operation::Abort);
    assert!(t.done(10).unwrap().is_ok());
    let aborted = t.done(9).expect("answered").unwrap_err();
    assert!(aborted.message.contains("aborted"), "{aborted:?}");
    assert_eq!(t.rt.state().summary, Some(summary.clone()));
    assert_eq!(t.rt.phase(), SessionPhase::Idle);
    // A summary call that fails for good ends it with why.
    t.op(11, Operation::Compact { instructions: None });
    let (call, _) = t.started_call().expect("a summary call");
    t.model(
        call,
        ModelEvent::Failed {
            message: "the provider said no".into(),
            retryable: false,
            retry_after_ms: None,
        },
    );
    let failed = t.done(11).expect("answered").unwrap_err();
    assert!(
        failed.message.contains("the provider said no"),
        "{failed:?}"
    );
    assert_eq!(t.rt.state().summary, Some(summary));
    assert_eq!(t.rt.phase(), SessionPhase::Idle);
}

// ---- approvals ---------------------------------------------------------------

/// A runtime whose settings ask before tools that write.
fn asking() -> T {
    let mut t = T::new("faux-1");
    t.rt = t.rt.clone().with_policy(Policy {
        approvals: ApprovalPolicy::Ask,
        ..Policy::default()
    });
    t
}

/// Prompts `op` and has the model call `bash` twice (ids c1, c2).
fn two_bash_calls(t: &mut T, op: u64) {
    t.op(op, Operation::prompt("go"));
    let (call, _) = t.started_call().unwrap();
    for e in tool_call("c1", "ls")
        .into_iter()
        .chain(tool_call("c2", "pwd"))
    {
        t.model(call, e);
    }
    t.model(call, done(StopReason::ToolUse));
}

/// The approvals the last step told the server, if it told them.
fn told(t: &T) -> Option<(Approvals, ApprovalPolicy)> {
    t.out.iter().rev().find_map(|o| match o {
        RuntimeOutput::Send(FromWorker::Approvals { approvals, policy }) => {
            Some((approvals.clone(), *policy))
        }
        _ => None,
    })
}

#[test]
fn under_ask_a_tool_waits_for_its_answer_which_is_stored_before_it_is_shown() {
    let mut t = asking();
    two_bash_calls(&mut t, 1);
    assert!(t.run_tool().is_none(), "nothing runs unasked");
    let (approvals, policy) = told(&t).expect("the question is told");
    assert_eq!(policy, ApprovalPolicy::Ask);
    let [question] = approvals.pending.as_slice() else {
        panic!("{approvals:?}")
    };
    assert_eq!(
        (question.tool.as_str(), question.call_id.as_str()),
        ("bash", "c1")
    );
    // Stored before it is told.
    let stored = t.out.iter().position(|o| {
        matches!(o, RuntimeOutput::Persist(Persist::State { approvals, .. }) if !approvals.pending.is_empty())
    });
    let shown = t
        .out
        .iter()
        .position(|o| matches!(o, RuntimeOutput::Send(FromWorker::Approvals { .. })));
    assert!(stored.unwrap() < shown.unwrap());
    assert_eq!(t.rt.phase(), SessionPhase::Turn);
    let first = question.id.clone();
    t.op(
        2,
        Operation::Answer {
            id: first.clone(),
            decision: Decision::Allow,
        },
    );
    assert!(t.done(2).unwrap().is_ok());
    assert_eq!(t.run_tool().map(|(id, _)| id), Some(first.clone()));
    assert!(told(&t).unwrap().0.pending.is_empty());
    // A second answer to the same question is refused: the first one won.
    t.op(
        3,
        Operation::Answer {
            id: first.clone(),
            decision: Decision::Deny,
        },
    );
    assert_eq!(t.done(3).unwrap().unwrap_err().code, ErrorCode::NotFound);
    assert!(t.run_tool().is_none());
    // The next call asks too; `always` runs it and every later `bash`.
    tool_done(&mut t, &first, "a b");
    let second = told(&t).unwrap().0.pending[0].id.clone();
    t.op(
        4,
        Operation::Answer {
            id: second.clone(),
            decision: Decision::Always,
        },
    );
    assert_eq!(t.run_tool().map(|(id, _)| id), Some(second.clone()));
    assert_eq!(t.rt.state().approvals.always, ["bash"]);
    tool_done(&mut t, &second, "/w");
    let (call, _) = t.started_call().expect("the model goes on");
    for e in tool_call("c3", "date") {
        t.model(call, e);
    }
    t.model(call, done(StopReason::ToolUse));
    assert!(t.run_tool().is_some(), "allowed always: not asked again");
}

#[test]
fn a_denied_tool_never_runs_and_the_model_is_told() {
    let mut t = asking();
    two_bash_calls(&mut t, 1);
    let first = t.rt.state().approvals.pending[0].id.clone();
    t.op(
        2,
        Operation::Answer {
            id: first.clone(),
            decision: Decision::Deny,
        },
    );
    assert!(t.run_tool().is_none(), "a denied call never runs");
    let TranscriptItem::Tool(item) = &t.rt.state().transcript[2] else {
        panic!()
    };
    assert_eq!(item.status, ToolStatus::Error);
    assert!(matches!(&item.content[0], Content::Text { text } if text.starts_with("Denied")));
    // The second call is asked in its turn.
    assert_eq!(t.rt.state().approvals.pending.len(), 1);
    let second = t.rt.state().approvals.pending[0].id.clone();
    assert_ne!(first, second);
    t.op(
        3,
        Operation::Answer {
            id: second,
            decision: Decision::Deny,
        },
    );
    let (_, request) = t.started_call().expect("the model hears the denials");
    assert_eq!(request.context.len(), 4);
}

#[test]
fn an_abort_cancels_the_question_with_its_turn() {
    let mut t = asking();
    two_bash_calls(&mut t, 1);
    t.op(2, Operation::Abort);
    assert!(
        !t.out
            .iter()
            .any(|o| matches!(o, RuntimeOutput::CancelTool { .. })),
        "nothing ran to cancel"
    );
    assert!(t.done(1).unwrap().is_ok());
    assert!(told(&t).unwrap().0.pending.is_empty());
    assert_eq!(t.rt.phase(), SessionPhase::Idle);
    assert_eq!(
        t.kinds(),
        [
            "user",
            "assistant:Complete(ToolUse)",
            "tool:Error",
            "tool:Error"
        ]
    );
    let question = t.rt.state().transcript[2].id().to_string();
    t.op(
        3,
        Operation::Answer {
            id: question,
            decision: Decision::Allow,
        },
    );
    assert_eq!(t.done(3).unwrap().unwrap_err().code, ErrorCode::NotFound);
    assert!(t.run_tool().is_none());
}

#[test]
fn a_policy_set_while_asked_settles_the_question() {
    let mut t = asking();
    two_bash_calls(&mut t, 1);
    t.op(
        2,
        Operation::SetApprovals {
            policy: Some(ApprovalPolicy::Auto),
        },
    );
    assert!(t.done(2).unwrap().is_ok());
    let (ran, _) = t.run_tool().expect("auto runs the held call");
    tool_done(&mut t, &ran, "ok");
    assert!(t.run_tool().is_some(), "and the next one");
    assert_eq!(t.rt.state().approvals.policy, Some(ApprovalPolicy::Auto));
    assert!(t.rt.state().approvals.pending.is_empty());
}

#[test]
fn read_only_offers_reading_tools_and_refuses_the_rest() {
    let mut t = T::new("faux-1");
    t.op(
        1,
        Operation::SetApprovals {
            policy: Some(ApprovalPolicy::ReadOnly),
        },
    );
    assert_eq!(told(&t).unwrap().1, ApprovalPolicy::ReadOnly);
    t.op(2, Operation::prompt("go"));
    let (call, request) = t.started_call().unwrap();
    assert_eq!(request.approvals, ApprovalPolicy::ReadOnly);
    for e in tool_call("c1", "rm -rf /") {
        t.model(call, e);
    }
    t.model(call, done(StopReason::ToolUse));
    assert!(t.run_tool().is_none(), "a write is refused, not run");
    let TranscriptItem::Tool(item) = &t.rt.state().transcript[2] else {
        panic!()
    };
    assert!(matches!(&item.content[0], Content::Text { text } if text.contains("read-only")));
    assert!(t.started_call().is_some(), "the model is told and goes on");
}

#[test]
fn a_question_a_dead_worker_asked_is_asked_again_and_the_turn_goes_on() {
    let mut t = asking();
    two_bash_calls(&mut t, 1);
    let asked = t.rt.state().approvals.pending[0].clone();
    // The worker dies; the next one opens what was stored.
    let (rt, out) = Runtime::open(t.rt.state().clone(), faux::models(), Instant(10));
    let rt = rt.with_policy(Policy {
        approvals: ApprovalPolicy::Ask,
        ..Policy::default()
    });
    assert!(
        !out.iter()
            .any(|o| matches!(o, RuntimeOutput::RunTool { .. }))
    );
    assert_eq!(rt.phase(), SessionPhase::Turn, "the turn waits on");
    assert_eq!(rt.state().approvals.pending, std::slice::from_ref(&asked));
    let told = rt.told_approvals().expect("told to the server");
    assert!(
        matches!(told, FromWorker::Approvals { ref approvals, .. } if approvals.pending == [asked.clone()])
    );
    let mut t = T {
        rt,
        now: 10,
        out: Vec::new(),
        replica: t.rt.state().transcript.clone(),
        before: Vec::new(),
    };
    t.rt.published = t.replica.clone();
    t.op(
        2,
        Operation::Answer {
            id: asked.id.clone(),
            decision: Decision::Allow,
        },
    );
    assert_eq!(t.run_tool().map(|(id, _)| id), Some(asked.id.clone()));
    tool_done(&mut t, &asked.id, "ok");
    let second = t.rt.state().approvals.pending[0].id.clone();
    t.op(
        3,
        Operation::Answer {
            id: second.clone(),
            decision: Decision::Allow,
        },
    );
    tool_done(&mut t, &second, "ok");
    let (call, _) = t.started_call().expect("the turn goes on");
    t.model(call, text("done"));
    t.model(call, done(StopReason::Stop));
    assert_eq!(t.rt.phase(), SessionPhase::Idle);
    // Its end answers nobody: no server asked for the resumed turn.
    assert!(t.done(RESUMED.0).unwrap().is_ok());
}

#[test]
fn a_question_nobody_answers_in_time_is_denied() {
    let mut t = asking();
    t.rt = t.rt.clone().with_policy(Policy {
        approvals: ApprovalPolicy::Ask,
        approval_timeout: Some(Duration::from_secs(60)),
        ..Policy::default()
    });
    two_bash_calls(&mut t, 1);
    let asked = t.rt.state().approvals.pending[0].clone();
    assert_eq!(
        t.rt.next_deadline(),
        Some(Instant(asked.asked_at) + Duration::from_secs(60))
    );
    t.now = asked.asked_at + 59_999;
    t.step(RuntimeInput::Tick);
    assert_eq!(t.rt.state().approvals.pending.len(), 1, "not yet");
    t.now = asked.asked_at + 60_000;
    t.step(RuntimeInput::Tick);
    assert!(t.run_tool().is_none(), "a call nobody allowed never runs");
    let TranscriptItem::Tool(item) = &t.rt.state().transcript[2] else {
        panic!()
    };
    assert!(
        matches!(&item.content[0], Content::Text { text } if text.contains("nobody answered within 60 s"))
    );
    // The next call is asked, with its own time.
    let next = &t.rt.state().approvals.pending[0];
    assert_ne!(next.id, asked.id);
    assert_eq!(next.asked_at, asked.asked_at + 60_000);
}
