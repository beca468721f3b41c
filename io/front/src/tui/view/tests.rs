//! The terminal UI's behaviour and look: keys in, actions out, and render
//! snapshots of the screen (`snapshots/tui/`) drawn on ratatui's test backend.

use super::*;
use crate::tui::render;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use kernel::protocol::{
    AssistantItem, Content, ModelRef, StopReason, ToolItem, TranscriptProgress, Usage, UsageCost,
    UserItem,
};
use kernel::protocol::{ErrorCode, ProtocolError};
use kernel::wire::Value;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn user(id: &str, text: &str) -> TranscriptItem {
    TranscriptItem::User(UserItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        timestamp: 1,
    })
}

fn assistant(id: &str, content: Vec<Content>, status: AssistantStatus) -> AssistantItem {
    AssistantItem {
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
    }
}

fn reply(id: &str, content: Vec<Content>, status: AssistantStatus) -> TranscriptItem {
    TranscriptItem::Assistant(assistant(id, content, status))
}

fn text(t: &str) -> Content {
    Content::Text { text: t.into() }
}

fn bash(command: &str) -> Value {
    Value::Map(vec![("command".into(), Value::text(command))])
}

fn call(id: &str, command: &str) -> Content {
    Content::ToolCall {
        tool_call_id: id.into(),
        tool_name: "bash".into(),
        input: bash(command),
    }
}

fn tool(id: &str, call: &str, command: &str, status: ToolStatus, output: &str) -> TranscriptItem {
    TranscriptItem::Tool(ToolItem {
        id: id.into(),
        tool_call_id: call.into(),
        tool_name: "bash".into(),
        input: bash(command),
        content: vec![text(output)],
        details: None,
        usage: None,
        timestamp: 3,
        status,
    })
}

fn snapshot(phase: SessionPhase, transcript: Vec<TranscriptItem>) -> SessionSnapshot {
    SessionSnapshot {
        id: "5e55-10n".into(),
        name: Some("demo".into()),
        cwd: "/work".into(),
        created_at: 0,
        updated_at: 0,
        phase,
        model: ModelRef {
            provider: "faux".into(),
            id: "faux-1".into(),
        },
        thinking_level: ThinkingLevel::Medium,
        attached: true,
        locked: true,
        revision: transcript.len() as u64,
        transcript,
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

fn progress(progress: TranscriptProgress) -> ServerEvent {
    ServerEvent::SessionProgress {
        session_id: "5e55-10n".into(),
        progress,
    }
}

fn delta(id: &str, d: &str) -> ServerEvent {
    progress(TranscriptProgress::AssistantDelta {
        message_id: id.into(),
        content_index: 0,
        kind: kernel::protocol::DeltaKind::Text,
        delta: d.into(),
    })
}

fn started(item: TranscriptItem) -> ServerEvent {
    progress(TranscriptProgress::ItemStarted { item })
}

fn snap(s: SessionSnapshot) -> ServerEvent {
    ServerEvent::SessionSnapshot { snapshot: s }
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn ctrl(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
}

fn typed(view: &mut View, text: &str) {
    for c in text.chars() {
        assert!(view.on_key(key(KeyCode::Char(c))).is_empty());
    }
}

/// The screen as text, one row per line, trailing spaces cut.
fn screen(view: &View, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal
        .draw(|f| {
            render::draw(f, view);
        })
        .unwrap();
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..height {
        let row: String = (0..width)
            .map(|x| buffer[(x, y)].symbol().to_string())
            .collect();
        out.push_str(row.trim_end());
        out.push('\n');
    }
    out
}

fn assert_screen(name: &str, view: &View) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../../snapshots/tui"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, screen(view, 80, 40)));
}

fn history() -> SessionSnapshot {
    let mut done = assistant(
        "a1",
        vec![
            Content::Thinking {
                thinking: "The user wants a listing.\nRun ls.".into(),
                redacted: None,
                signature: None,
            },
            text("Let me look."),
            call("c1", "ls -la"),
        ],
        AssistantStatus::Complete(StopReason::ToolUse),
    );
    done.usage = Some(Usage {
        input: 100,
        output: 20,
        cache_read: 0,
        cache_write: 0,
        reasoning: None,
        total_tokens: 120,
        cost: UsageCost {
            total: 0.0012,
            ..UsageCost::default()
        },
    });
    let mut failed = assistant("a3", vec![], AssistantStatus::Error);
    failed.error_message = Some("rate limited".into());
    snapshot(
        SessionPhase::Idle,
        vec![
            user("u1", "what is here?"),
            TranscriptItem::Assistant(done),
            tool(
                "t1",
                "c1",
                "ls -la",
                ToolStatus::Complete,
                "total 8\n1\n2\n3\n4\n5\n6\n7",
            ),
            reply(
                "a2",
                vec![text(
                    "## Files\n\nThere are **seven** files:\n\n- `1` to `7`\n\n```sh\nls -la\n```",
                )],
                AssistantStatus::Complete(StopReason::Stop),
            ),
            user("u2", "and now?"),
            TranscriptItem::Assistant(failed),
            user("u3", "stop\u{1b}[2J"),
            reply("a4", vec![text("Partial")], AssistantStatus::Aborted),
        ],
    )
}

#[test]
fn a_history_with_every_item_kind() {
    let view = View::new(&history(), History::All);
    assert_screen("history_every_item_kind", &view);
    let text = screen(&view, 80, 30);
    assert!(
        text.contains("stop␛[2J"),
        "control characters are shown, not sent"
    );
}

#[test]
fn history_keeps_the_last_turns() {
    let view = View::new(&history(), History::Last(1));
    let text = screen(&view, 80, 30);
    assert!(
        text.contains("2 earlier turns (PageUp loads them)"),
        "{text}"
    );
    assert!(!text.contains("what is here?"), "{text}");
    assert!(text.contains("stop␛[2J"), "{text}");
    // The skipped turns stay told: the next snapshot of the same session
    // shows nothing of them again.
    let mut view = view;
    let blocks = view.blocks.len();
    let _ = view.on_event(&ServerEvent::SessionSnapshot {
        snapshot: history(),
    });
    assert_eq!(view.blocks.len(), blocks, "nothing told twice");
    assert!(!screen(&view, 80, 30).contains("what is here?"));
}

/// Scrolling past the oldest turn shown pages earlier ones in from the
/// session the client holds, a page at a time, until none is left.
#[test]
fn scrolling_past_the_oldest_turn_pages_earlier_ones_in() {
    let turns: Vec<TranscriptItem> = (0..5)
        .flat_map(|i| {
            [
                user(&format!("u{i}"), &format!("question {i}")),
                reply(
                    &format!("a{i}"),
                    vec![text(&format!("answer {i}"))],
                    AssistantStatus::Complete(StopReason::Stop),
                ),
            ]
        })
        .collect();
    let session = snapshot(SessionPhase::Idle, turns);
    let mut view = View::new(&session, History::Last(1));
    let text = screen(&view, 80, 40);
    assert!(
        text.contains("4 earlier turns (PageUp loads them)"),
        "{text}"
    );
    assert!(!text.contains("question 3"), "{text}");
    // Not at the top yet: PageUp only scrolls.
    view.top_drawn = false;
    assert!(view.on_key(key(KeyCode::PageUp)).is_empty());
    view.top_drawn = true;
    assert_eq!(view.on_key(key(KeyCode::PageUp)), vec![Action::ShowOlder]);
    view.show_older(&session.transcript, 3);
    let text = screen(&view, 80, 40);
    assert!(
        text.contains("1 earlier turn (PageUp loads them)"),
        "{text}"
    );
    for i in 1..5 {
        assert!(text.contains(&format!("question {i}")), "{text}");
        assert!(text.contains(&format!("answer {i}")), "{text}");
    }
    assert!(!text.contains("question 0"), "{text}");
    // In order, oldest first.
    assert!(text.find("question 1") < text.find("question 4"), "{text}");
    view.show_older(&session.transcript, 3);
    let text = screen(&view, 80, 40);
    assert!(
        text.contains("question 0") && !text.contains("PageUp loads"),
        "{text}"
    );
    assert!(view.on_key(key(KeyCode::PageUp)).is_empty(), "nothing left");
}

#[test]
fn thinking_is_collapsed_until_asked_for() {
    let mut view = View::new(&history(), History::All);
    assert!(screen(&view, 80, 50).contains("thinking, 2 lines (Ctrl-T shows)"));
    view.on_key(ctrl('t'));
    let text = screen(&view, 80, 50);
    assert!(text.contains("┊ The user wants a listing."), "{text}");
}

/// A prompt typed, sent, streamed with a tool call, and finished.
#[test]
fn a_streamed_turn_with_a_tool_call() {
    let idle = snapshot(SessionPhase::Idle, vec![]);
    let mut view = View::new(&idle, History::All);
    typed(&mut view, "list files");
    assert!(screen(&view, 80, 30).contains(" prompt › "));
    assert_eq!(
        view.on_key(key(KeyCode::Enter)),
        [send(1, Request::Prompt("list files".into()))]
    );
    assert_eq!(view.editor.text(), "");
    let u = user("u1", "list files");
    let streaming = reply("a1", vec![], AssistantStatus::Streaming);
    view.on_event(&started(u.clone()));
    view.on_event(&started(streaming.clone()));
    view.on_event(&snap(snapshot(
        SessionPhase::Turn,
        vec![u.clone(), streaming],
    )));
    view.on_event(&delta("a1", "Listing "));
    view.on_event(&delta("a1", "now."));
    let asked = reply(
        "a1",
        vec![text("Listing now."), call("c1", "ls")],
        AssistantStatus::Complete(StopReason::ToolUse),
    );
    view.on_event(&progress(TranscriptProgress::ItemFinished {
        item: asked.clone(),
    }));
    let running = tool("t1", "c1", "ls", ToolStatus::Running, "Cargo.toml");
    view.on_event(&started(running.clone()));
    view.tick = 3;
    assert_screen("streamed_turn_running_tool", &view);
    let text = screen(&view, 80, 30);
    assert!(
        text.contains("› list files"),
        "our prompt is not labelled: {text}"
    );
    assert!(text.contains(" steer › "), "Enter steers now: {text}");
    assert_eq!(text.matches("Listing now.").count(), 1, "{text}");
}

/// Enter while a turn runs steers; another client's messages are labelled.
#[test]
fn a_steer_and_another_clients_message() {
    let u = user("u1", "long job");
    let streaming = reply("a1", vec![], AssistantStatus::Streaming);
    let busy = snapshot(SessionPhase::Turn, vec![u, streaming.clone()]);
    let mut view = View::new(&busy, History::All);
    typed(&mut view, "also check tests");
    assert_eq!(
        view.on_key(key(KeyCode::Enter)),
        [send(1, Request::Steer("also check tests".into()))]
    );
    view.on_event(&started(user("u2", "also check tests")));
    view.on_event(&started(user("u3", "and docs please")));
    let text = screen(&view, 80, 30);
    assert!(
        text.contains("› long job"),
        "history is not labelled: {text}"
    );
    assert!(text.contains("› also check tests"), "{text}");
    assert!(
        text.contains("› (another client) and docs please"),
        "{text}"
    );
    assert_screen("steer_and_other_client", &view);
}

/// Retries show; Ctrl-C aborts once, then clears; the end says aborted once.
#[test]
fn a_retry_then_an_abort() {
    let u = user("u1", "go");
    let busy = snapshot(SessionPhase::Turn, vec![u.clone()]);
    let mut view = View::new(&busy, History::All);
    view.on_event(&snap(snapshot(SessionPhase::Retry, vec![u.clone()])));
    assert_eq!(view.on_key(ctrl('c')), [send(1, Request::Abort)]);
    typed(&mut view, "half");
    assert!(
        view.on_key(ctrl('c')).is_empty(),
        "a second Ctrl-C does not abort again"
    );
    assert_eq!(view.editor.text(), "", "it clears the input");
    view.on_event(&snap(snapshot(
        SessionPhase::Idle,
        vec![
            u,
            reply(
                "a1",
                vec![call("c1", "sleep 9")],
                AssistantStatus::Complete(StopReason::ToolUse),
            ),
            tool("t1", "c1", "sleep 9", ToolStatus::Error, "aborted"),
        ],
    )));
    let text = screen(&view, 80, 30);
    assert!(text.contains("retrying"), "{text}");
    assert_eq!(text.matches("turn aborted").count(), 1, "{text}");
    assert!(text.contains("during the bash tool call"), "{text}");
    assert_screen("retry_then_abort", &view);
}

/// A reconnection: deltas after the hole are not shown out of place; the
/// snapshot after the re-attach tells the rest, once.
#[test]
fn a_reconnect_loses_and_duplicates_nothing() {
    let u = user("u1", "go");
    let streaming = reply("a1", vec![], AssistantStatus::Streaming);
    let busy = snapshot(SessionPhase::Turn, vec![u.clone(), streaming.clone()]);
    let mut view = View::new(&busy, History::All);
    view.on_event(&started(streaming));
    view.on_event(&delta("a1", "one "));
    view.on_connection(Some("server replaced".into()));
    assert!(view.on_key(key(KeyCode::Enter)).is_empty());
    view.on_event(&delta("a1", "three "));
    view.on_connection(None);
    view.on_event(&snap(snapshot(
        SessionPhase::Idle,
        vec![
            u,
            reply(
                "a1",
                vec![text("one two three four")],
                AssistantStatus::Complete(StopReason::Stop),
            ),
        ],
    )));
    let text = screen(&view, 80, 30);
    assert!(text.contains("reconnecting"), "{text}");
    assert!(text.contains("reconnected"), "{text}");
    assert!(text.contains("one two three four"), "{text}");
    assert_eq!(text.matches("three").count(), 1, "{text}");
    assert_screen("reconnect", &view);
}

/// A paste of three lines is one message; Alt-Enter adds a newline.
#[test]
fn a_multi_line_paste_is_one_message() {
    let mut view = View::new(&snapshot(SessionPhase::Idle, vec![]), History::All);
    view.on_paste("one\r\ntwo\nthree");
    view.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::ALT));
    typed(&mut view, "four");
    assert_eq!(
        view.on_key(key(KeyCode::Enter)),
        [send(1, Request::Prompt("one\ntwo\nthree\nfour".into()))]
    );
}

#[test]
fn line_editing_and_history() {
    let mut view = View::new(&snapshot(SessionPhase::Idle, vec![]), History::All);
    typed(&mut view, "helo wrld");
    for _ in 0..3 {
        view.on_key(key(KeyCode::Left));
    }
    view.on_key(key(KeyCode::Char('o')));
    view.on_key(ctrl('a'));
    view.on_key(key(KeyCode::Right));
    view.on_key(key(KeyCode::Right));
    view.on_key(key(KeyCode::Right));
    view.on_key(key(KeyCode::Char('l')));
    assert_eq!(view.editor.text(), "hello world");
    view.on_key(key(KeyCode::End));
    view.on_key(ctrl('w'));
    assert_eq!(view.editor.text(), "hello ");
    typed(&mut view, "there");
    view.on_key(key(KeyCode::Backspace));
    assert_eq!(
        view.on_key(key(KeyCode::Enter)),
        [send(1, Request::Prompt("hello ther".into()))]
    );
    typed(&mut view, "draft");
    view.on_key(key(KeyCode::Up));
    assert_eq!(view.editor.text(), "hello ther");
    view.on_key(key(KeyCode::Down));
    assert_eq!(view.editor.text(), "draft");
    // Refused for another reason than the session's state: the line comes
    // back into the input, before the draft, never lost.
    let refused = ProtocolError::new(ErrorCode::InvalidRequest, "no such model");
    view.on_done(Done {
        call: 1,
        outcome: Err(ClientError::Server(refused)),
        snapshot: None,
    });
    assert_eq!(view.editor.text(), "hello ther\ndraft");
    assert_eq!(view.on_key(ctrl('d')), [], "Ctrl-D with text deletes");
    view.on_key(ctrl('c'));
    assert_eq!(view.on_key(ctrl('d')), [Action::Detach]);
    assert!(screen(&view, 80, 30).contains("back in the input"));
}

#[test]
fn sanitize_neutralises_control_characters() {
    assert_eq!(sanitize("a\u{1b}[31mb\u{7}\tc\r\n"), "a␛[31mb␇    c\n");
    assert_eq!(sanitize("\u{9b}x\u{202e}y"), "\u{FFFD}x\u{FFFD}y");
}

/// `NO_COLOR`: the host strips every colour after drawing; styles stay.
#[test]
fn no_color_strips_colours_and_keeps_styles() {
    let view = View::new(&history(), History::All);
    let mut terminal = Terminal::new(TestBackend::new(80, 40)).unwrap();
    terminal
        .draw(|f| {
            render::draw(f, &view);
            render::strip_colour(f.buffer_mut());
        })
        .unwrap();
    let buffer = terminal.backend().buffer();
    assert!(
        buffer
            .content
            .iter()
            .all(|c| c.fg == ratatui::style::Color::Reset && c.bg == ratatui::style::Color::Reset)
    );
    assert!(
        buffer
            .content
            .iter()
            .any(|c| c.modifier.contains(ratatui::style::Modifier::BOLD))
    );
}

/// An abort hands back the steers the model never saw: into the input,
/// before what was typed since.
#[test]
fn withdrawn_steers_come_back_into_the_input() {
    let busy = snapshot(SessionPhase::Turn, vec![user("u1", "go")]);
    let mut view = View::new(&busy, History::All);
    assert_eq!(view.on_key(ctrl('c')), [send(1, Request::Abort)]);
    typed(&mut view, "new");
    view.on_done(Done {
        call: 1,
        outcome: Ok(Answer::Abort {
            withdrawn: vec!["use cargo".into()],
        }),
        snapshot: None,
    });
    assert_eq!(view.editor.text(), "use cargo\nnew");
    assert!(screen(&view, 80, 30).contains("back in the input"));
}

fn send(call: u64, request: Request) -> Action {
    Action::Send { call, request }
}

/// A message typed while the server is away waits, and goes once it is back.
#[test]
fn a_message_typed_while_reconnecting_waits_and_goes() {
    let mut view = View::new(&snapshot(SessionPhase::Idle, vec![]), History::All);
    assert!(
        view.on_connection(Some("server replaced".into()))
            .is_empty()
    );
    typed(&mut view, "hello");
    assert!(view.on_key(key(KeyCode::Enter)).is_empty());
    assert!(screen(&view, 80, 30).contains("held until the server is back"));
    assert_eq!(
        view.on_connection(None),
        [send(1, Request::Prompt("hello".into()))]
    );
}

#[test]
fn any_terminal_size_draws_without_panicking() {
    let mut view = View::new(&history(), History::All);
    typed(&mut view, "a draft in the input");
    for (width, height) in [(0, 0), (1, 1), (3, 2), (10, 4), (20, 5), (100, 30)] {
        screen(&view, width, height);
    }
}

#[test]
fn slash_commands_complete_and_stay_out_of_the_transcript() {
    let mut view = View::new(&snapshot(SessionPhase::Idle, vec![]), History::All);
    typed(&mut view, "/th");
    assert!(view.on_key(key(KeyCode::Tab)).is_empty());
    assert_eq!(view.editor.text(), "/thinking ");
    typed(&mut view, "high");
    let actions = view.on_key(key(KeyCode::Enter));
    assert!(
        matches!(
            &actions[..],
            [Action::Send {
                request: Request::SetThinking(_),
                ..
            }]
        ),
        "{actions:?}"
    );
    typed(&mut view, "/sessions");
    let actions = view.on_key(key(KeyCode::Enter));
    assert_eq!(actions, [Action::Local(slash::Command::Sessions(None))]);
    typed(&mut view, "/quit");
    assert_eq!(view.on_key(key(KeyCode::Enter)), [Action::Detach]);
    typed(&mut view, "/nope");
    assert!(view.on_key(key(KeyCode::Enter)).is_empty());
    assert_eq!(view.editor.text(), "/nope", "an unknown command comes back");
    let shown = screen(&view, 80, 20);
    assert!(shown.contains("unknown command /nope"), "{shown}");
}

#[test]
fn the_status_line_shows_the_context_window_and_a_turn_ending_unfocused_rings() {
    let mut view = View::new(&history(), History::All);
    view.windows.insert("faux/faux-1".into(), 400);
    let shown = screen(&view, 120, 30);
    assert!(shown.contains("context 30% of 400"), "{shown}");

    let mut view = View::new(&snapshot(SessionPhase::Idle, vec![]), History::All);
    view.focused = false;
    let turn = snapshot(SessionPhase::Turn, vec![user("u1", "go")]);
    view.on_event(&snap(turn));
    assert!(!view.bell, "not before the turn ends");
    let mut done = snapshot(
        SessionPhase::Idle,
        vec![
            user("u1", "go"),
            reply(
                "a1",
                vec![text("done")],
                AssistantStatus::Complete(StopReason::Stop),
            ),
        ],
    );
    done.revision = 5;
    view.on_event(&snap(done.clone()));
    assert!(view.bell, "a turn ended while unfocused");
    let mut focused = View::new(&snapshot(SessionPhase::Turn, vec![]), History::All);
    focused.on_event(&snap(done));
    assert!(!focused.bell, "focused: no bell");
}

#[test]
fn ctrl_o_shows_tool_outputs_whole() {
    let mut view = View::new(&history(), History::All);
    let cut = screen(&view, 80, 40);
    assert!(cut.contains("… 3 more lines (Ctrl-O shows them)"), "{cut}");
    assert!(!cut.contains("  7"), "{cut}");
    view.on_key(ctrl('o'));
    let whole = screen(&view, 80, 40);
    assert!(
        whole.contains("  7") && !whole.contains("more lines"),
        "{whole}"
    );
    view.on_key(ctrl('o'));
    assert_eq!(screen(&view, 80, 40), cut);
}

/// Alt-Up/Alt-Down select one tool call, and Ctrl-O expands or collapses
/// its output alone; with none selected it acts on all.
#[test]
fn one_selected_tool_output_expands_alone() {
    let long = |n: usize| {
        (0..8)
            .map(|i| format!("out{n}-{i}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let session = snapshot(
        SessionPhase::Idle,
        vec![
            user("u1", "run both"),
            TranscriptItem::Assistant(assistant(
                "a1",
                vec![call("c1", "first"), call("c2", "second")],
                AssistantStatus::Complete(StopReason::ToolUse),
            )),
            tool("t1", "c1", "first", ToolStatus::Complete, &long(1)),
            tool("t2", "c2", "second", ToolStatus::Complete, &long(2)),
        ],
    );
    let alt = |code| KeyEvent::new(code, KeyModifiers::ALT);
    let mut view = View::new(&session, History::All);
    view.on_key(alt(KeyCode::Up));
    assert_eq!(view.selected.as_deref(), Some("c2"), "the newest first");
    view.on_key(ctrl('o'));
    let text = screen(&view, 80, 40);
    assert!(
        text.contains("out2-7") && !text.contains("out1-7"),
        "{text}"
    );
    view.on_key(alt(KeyCode::Up));
    assert_eq!(view.selected.as_deref(), Some("c1"));
    view.on_key(ctrl('o'));
    let text = screen(&view, 80, 40);
    assert!(text.contains("out1-7") && text.contains("out2-7"), "{text}");
    view.on_key(ctrl('o'));
    assert!(!screen(&view, 80, 40).contains("out1-7"), "collapsed again");
    view.on_key(alt(KeyCode::Down));
    view.on_key(alt(KeyCode::Down));
    assert_eq!(view.selected, None, "past the newest, none");
    view.on_key(ctrl('o'));
    assert!(view.expand_tools, "none selected: all");
}
