use super::*;
use crate::protocol::{ModelRef, SessionPhase, ThinkingLevel};
use crate::wire::Value;

fn user(id: &str, text: &str) -> TranscriptItem {
    TranscriptItem::User(UserItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        timestamp: 1,
    })
}

fn reply(id: &str, content: Vec<Content>, status: AssistantStatus) -> TranscriptItem {
    TranscriptItem::Assistant(AssistantItem {
        id: id.into(),
        content,
        model: ModelRef {
            provider: "faux".into(),
            id: "faux-1".into(),
        },
        response_model: None,
        usage: None,
        timestamp: 2,
        status,
        error_message: None,
    })
}

fn text(t: &str) -> Content {
    Content::Text { text: t.into() }
}

fn thinking(t: &str) -> Content {
    Content::Thinking {
        thinking: t.into(),
        redacted: None,
        signature: None,
    }
}

fn call(id: &str) -> Content {
    Content::ToolCall {
        tool_call_id: id.into(),
        tool_name: "bash".into(),
        input: Value::Map(vec![("command".into(), Value::text("ls"))]),
    }
}

fn tool(id: &str, call: &str, status: ToolStatus, output: &[&str]) -> TranscriptItem {
    TranscriptItem::Tool(ToolItem {
        id: id.into(),
        tool_call_id: call.into(),
        tool_name: "bash".into(),
        input: Value::Map(vec![("command".into(), Value::text("ls"))]),
        content: output.iter().map(|t| text(t)).collect(),
        details: None,
        usage: None,
        timestamp: 3,
        status,
    })
}

fn snapshot(revision: u64, transcript: Vec<TranscriptItem>) -> SessionSnapshot {
    SessionSnapshot {
        id: "s".into(),
        name: None,
        cwd: "/".into(),
        created_at: 0,
        updated_at: 0,
        phase: SessionPhase::Turn,
        model: ModelRef {
            provider: "faux".into(),
            id: "faux-1".into(),
        },
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision,
        transcript,
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

fn delta(id: &str, index: u64, kind: DeltaKind, d: &str) -> ServerEvent {
    ServerEvent::SessionProgress {
        session_id: "s".into(),
        progress: TranscriptProgress::AssistantDelta {
            message_id: id.into(),
            content_index: index,
            kind,
            delta: d.into(),
        },
    }
}

fn started(item: TranscriptItem) -> ServerEvent {
    ServerEvent::SessionProgress {
        session_id: "s".into(),
        progress: TranscriptProgress::ItemStarted { item },
    }
}

fn snap(s: SessionSnapshot) -> ServerEvent {
    ServerEvent::SessionSnapshot { snapshot: s }
}

/// The text told for assistant item `id`, joined.
fn said(updates: &[Update]) -> String {
    updates
        .iter()
        .filter_map(|u| match u {
            Update::Text { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn replay_tells_a_whole_transcript_in_order() {
    let mut f = Follower::new("s");
    let s = snapshot(
        3,
        vec![
            user("u1", "list it"),
            reply(
                "a1",
                vec![thinking("hmm"), text("running"), call("c1")],
                AssistantStatus::Complete(StopReason::ToolUse),
            ),
            tool("t1", "c1", ToolStatus::Complete, &["file"]),
            reply(
                "a2",
                vec![text("done")],
                AssistantStatus::Complete(StopReason::Stop),
            ),
        ],
    );
    let updates = f.replay(&s);
    let kinds: Vec<&str> = updates
        .iter()
        .map(|u| match u {
            Update::User { .. } => "user",
            Update::Text { .. } => "text",
            Update::Thinking { .. } => "thinking",
            Update::ToolCall { .. } => "call",
            Update::Tool { .. } => "tool",
            Update::Reply { .. } => "reply",
            Update::Notice { .. } => "notice",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user", "thinking", "text", "call", "reply", "tool", "text", "reply"
        ]
    );
    // Told once: the same snapshot again tells nothing.
    assert!(f.on_event(&snap(s)).is_empty());
}

#[test]
fn deltas_then_a_snapshot_tell_each_character_once() {
    let mut f = Follower::new("s");
    f.resume(&snapshot(1, vec![user("u1", "hi")]));
    let mut told = Vec::new();
    told.extend(f.on_event(&started(reply("a1", vec![], AssistantStatus::Streaming))));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "hel")));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "lo ")));
    // The snapshot holds more than the deltas said: only the rest is told.
    told.extend(f.on_event(&snap(snapshot(
        2,
        vec![
            user("u1", "hi"),
            reply("a1", vec![text("hello wor")], AssistantStatus::Streaming),
        ],
    ))));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "ld")));
    told.extend(f.on_event(&snap(snapshot(
        3,
        vec![
            user("u1", "hi"),
            reply(
                "a1",
                vec![text("hello world")],
                AssistantStatus::Complete(StopReason::Stop),
            ),
        ],
    ))));
    assert_eq!(said(&told), "hello world");
    assert!(matches!(told.last(), Some(Update::Reply { .. })));
    // Nothing about the user message the follower resumed past.
    assert!(!told.iter().any(|u| matches!(u, Update::User { .. })));
}

fn finished(item: TranscriptItem) -> ServerEvent {
    ServerEvent::SessionProgress {
        session_id: "s".into(),
        progress: TranscriptProgress::ItemFinished { item },
    }
}

#[test]
fn after_a_gap_a_streaming_reply_waits_for_the_next_snapshot() {
    let mut f = Follower::new("s");
    f.resume(&snapshot(1, vec![user("u1", "hi")]));
    let mut told = f.on_event(&started(reply("a1", vec![], AssistantStatus::Streaming)));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "one ")));
    f.gap();
    assert!(f.is_unanchored());
    // Deltas after the hole would be told in the wrong place.
    assert!(
        f.on_event(&delta("a1", 0, DeltaKind::Text, "three"))
            .is_empty()
    );
    // The re-attach's snapshot tells what it holds and is current: the
    // deltas after it go on from there.
    told.extend(f.on_event(&snap(snapshot(
        4,
        vec![
            user("u1", "hi"),
            reply(
                "a1",
                vec![text("one two three")],
                AssistantStatus::Streaming,
            ),
        ],
    ))));
    assert!(!f.is_unanchored());
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, " four")));
    assert_eq!(said(&told), "one two three four");
    told.extend(f.on_event(&finished(reply(
        "a1",
        vec![text("one two three four five")],
        AssistantStatus::Complete(StopReason::Stop),
    ))));
    assert!(!f.is_unanchored());
    assert_eq!(said(&told), "one two three four five");
}

#[test]
fn joining_mid_reply_tells_the_reply_so_far_then_streams() {
    // The attach's snapshot holds the reply as far as it streamed.
    let mut f = Follower::new("s");
    let mut told = f.replay(&snapshot(
        3,
        vec![
            user("u1", "hi"),
            reply("a1", vec![text("start ")], AssistantStatus::Streaming),
        ],
    ));
    assert_eq!(said(&told), "start ");
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "middle ")));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "end")));
    assert_eq!(said(&told), "start middle end");
    told.extend(f.on_event(&finished(reply(
        "a1",
        vec![text("start middle end")],
        AssistantStatus::Complete(StopReason::Stop),
    ))));
    assert_eq!(said(&told), "start middle end");
}

#[test]
fn deltas_of_a_reply_never_seen_wait_for_its_end() {
    // Deltas of a reply no snapshot or item event showed go on from a
    // middle this follower never saw.
    let mut f = Follower::new("s");
    let mut told = f.replay(&snapshot(1, vec![user("u1", "hi")]));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "middle ")));
    told.extend(f.on_event(&delta("a1", 0, DeltaKind::Text, "end")));
    assert_eq!(said(&told), "");
    told.extend(f.on_event(&finished(reply(
        "a1",
        vec![text("start middle end")],
        AssistantStatus::Complete(StopReason::Stop),
    ))));
    assert_eq!(said(&told), "start middle end");
    // The next reply streams live from its start.
    told.extend(f.on_event(&started(reply("a2", vec![], AssistantStatus::Streaming))));
    told.extend(f.on_event(&delta("a2", 0, DeltaKind::Text, "next")));
    assert_eq!(said(&told), "start middle endnext");
}

#[test]
fn own_prompts_are_told_apart_from_other_clients() {
    let mut f = Follower::new("s");
    f.expect_own("mine");
    let told = f.replay(&snapshot(
        2,
        vec![user("u1", "theirs"), user("u2", "mine"), user("u3", "mine")],
    ));
    let owns: Vec<bool> = told
        .iter()
        .filter_map(|u| match u {
            Update::User { own, .. } => Some(*own),
            _ => None,
        })
        .collect();
    // Only the first message with the text is the one this client sent.
    assert_eq!(owns, [false, true, false]);
}

#[test]
fn tool_calls_wait_for_their_input_and_tools_tell_each_status_once() {
    let mut f = Follower::new("s");
    f.resume(&snapshot(1, vec![user("u1", "!ls")]));
    let streaming = reply("a1", vec![call("c1")], AssistantStatus::Streaming);
    assert!(
        f.on_event(&delta("a1", 0, DeltaKind::ToolCall, "{\"comm"))
            .is_empty()
    );
    // The call's input may still be streaming.
    assert!(f.on_event(&snap(snapshot(2, vec![streaming]))).is_empty());
    let done = reply(
        "a1",
        vec![call("c1")],
        AssistantStatus::Complete(StopReason::ToolUse),
    );
    let running = tool("t1", "c1", ToolStatus::Running, &[]);
    let told = f.on_event(&snap(snapshot(3, vec![done.clone(), running.clone()])));
    assert!(matches!(&told[0], Update::ToolCall { tool_call_id, .. } if tool_call_id == "c1"));
    assert!(matches!(
        &told[2],
        Update::Tool {
            status: ToolStatus::Running,
            ..
        }
    ));
    // The same status again is not news; output and the end are.
    assert!(f.on_event(&started(running)).is_empty());
    let partial = tool("t1", "c1", ToolStatus::Running, &["a"]);
    assert_eq!(f.on_event(&started(partial)).len(), 1);
    let finished = tool("t1", "c1", ToolStatus::Complete, &["a", "b"]);
    let told = f.on_event(&snap(snapshot(4, vec![done, finished.clone()])));
    assert!(matches!(
        &told[..],
        [Update::Tool { status: ToolStatus::Complete, content, .. }] if content.len() == 2
    ));
    assert!(f.on_event(&started(finished)).is_empty());
}

#[test]
fn stale_and_foreign_events_tell_nothing() {
    let mut f = Follower::new("s");
    let finished = reply(
        "a1",
        vec![text("all")],
        AssistantStatus::Complete(StopReason::Stop),
    );
    f.resume(&snapshot(1, vec![finished]));
    assert!(f.on_event(&delta("a1", 0, DeltaKind::Text, "x")).is_empty());
    let mut other = snapshot(2, vec![user("u9", "elsewhere")]);
    other.id = "t".into();
    assert!(f.on_event(&snap(other)).is_empty());
    // A snapshot whose text does not extend what was told is not told twice.
    let shorter = reply("a2", vec![text("ab")], AssistantStatus::Streaming);
    f.on_event(&started(reply("a2", vec![], AssistantStatus::Streaming)));
    assert_eq!(f.on_event(&delta("a2", 0, DeltaKind::Text, "abc")).len(), 1);
    assert!(f.on_event(&snap(snapshot(3, vec![shorter]))).is_empty());
}

#[test]
fn outcomes_of_a_turn() {
    let base = 1;
    let turn = |items: Vec<TranscriptItem>| {
        let mut all = vec![user("u0", "before")];
        all.extend(items);
        turn_outcome(&snapshot(9, all), base)
    };
    assert_eq!(turn(vec![]), TurnOutcome::Completed);
    assert_eq!(
        turn(vec![reply(
            "a",
            vec![],
            AssistantStatus::Complete(StopReason::Stop)
        )]),
        TurnOutcome::Completed
    );
    assert_eq!(
        turn(vec![reply(
            "a",
            vec![],
            AssistantStatus::Complete(StopReason::Length)
        )]),
        TurnOutcome::MaxTokens
    );
    assert_eq!(
        turn(vec![reply("a", vec![], AssistantStatus::Aborted)]),
        TurnOutcome::Aborted { tool: None }
    );
    assert_eq!(
        turn(vec![tool("t", "c", ToolStatus::Error, &[])]),
        TurnOutcome::Aborted {
            tool: Some("bash".into())
        }
    );
    let TranscriptItem::Assistant(mut failed) = reply("a", vec![], AssistantStatus::Error) else {
        unreachable!()
    };
    failed.error_message = Some("overloaded".into());
    assert_eq!(
        turn(vec![TranscriptItem::Assistant(failed)]),
        TurnOutcome::Failed {
            message: "overloaded".into()
        }
    );
    // A base past the end is a turn with nothing in it.
    assert_eq!(
        turn_outcome(&snapshot(1, vec![]), 5),
        TurnOutcome::Completed
    );
}

#[test]
fn a_notice_is_told_as_one_and_a_failed_reply_as_a_reply() {
    let mut f = Follower::new("s");
    let notice = TranscriptItem::Assistant(AssistantItem {
        id: "n1".into(),
        content: Vec::new(),
        model: crate::runtime::notice_model(),
        response_model: None,
        usage: None,
        timestamp: 1,
        status: AssistantStatus::Error,
        error_message: Some("MCP server \"x\" failed to start".into()),
    });
    let failed = reply("a1", Vec::new(), AssistantStatus::Error);
    let updates = f.replay(&snapshot(2, vec![notice, user("u1", "hi"), failed]));
    assert!(matches!(
        &updates[0],
        Update::Notice { item_id, text } if item_id == "n1" && text.contains("failed to start")
    ));
    assert!(matches!(updates[1], Update::User { .. }));
    assert!(matches!(updates[2], Update::Reply { .. }));
    assert_eq!(updates.len(), 3);
}
