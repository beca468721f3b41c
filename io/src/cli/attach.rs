//! `attach` without a terminal, and `log`: a session's transcript as plain
//! text (or JSON lines), and stdin lines fed to the session as it can take
//! them.
//!
//! What is new in the session is the kernel [`Follower`]'s decision; when a
//! line may go out, and as what, is [`Feed`]'s; [`Plain`] only formats.

use super::Failure;
use crate::client::{Client, Status};
use crate::tui::view::sanitize;
use kernel::client::follow::{self, Follower, Update};
use kernel::protocol::codec::Schema;
use kernel::protocol::{AssistantStatus, ServerEvent, SessionPhase, SessionSnapshot, ToolStatus};
use std::collections::{BTreeSet, VecDeque};
use std::io::Write;
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{broadcast, mpsc};

/// Output lines of a tool printed under its header.
const TOOL_LINES: usize = 5;

/// Formats [`Update`]s as plain text: user messages as `› text`, reply
/// text as it streams, tool calls as `▸ bash: ls` with their first output
/// lines, and how a reply ended when it did not complete.
#[derive(Debug, Default)]
pub(super) struct Plain {
    line_open: bool,
    /// The reply whose text is being written.
    current: Option<String>,
    /// Tool calls whose header was written.
    headers: BTreeSet<String>,
    /// Label user messages other clients sent (live, not in history).
    pub(super) label_others: bool,
}

impl Plain {
    fn end_line(&mut self, out: &mut String) {
        if self.line_open {
            out.push('\n');
            self.line_open = false;
        }
        self.current = None;
    }

    fn write(&mut self, text: &str, out: &mut String) {
        if !text.is_empty() {
            out.push_str(text);
            self.line_open = !text.ends_with('\n');
        }
    }

    fn header(&mut self, call_id: &str, title: &str, out: &mut String) {
        if self.headers.insert(call_id.to_owned()) {
            self.end_line(out);
            self.write(&format!("▸ {}\n", sanitize(title)), out);
        }
    }

    /// Appends the text of `update` to `out`.
    pub(super) fn show(&mut self, update: Update, out: &mut String) {
        match update {
            Update::User { text, own, .. } => {
                self.end_line(out);
                let label = if self.label_others && !own {
                    "› [another client] "
                } else {
                    "› "
                };
                for (i, line) in sanitize(&text).split('\n').enumerate() {
                    let prefix = if i == 0 { label } else { "  " };
                    self.write(&format!("{prefix}{line}\n"), out);
                }
            }
            Update::Text { item_id, delta } => {
                if self.current.as_ref() != Some(&item_id) {
                    self.end_line(out);
                    self.current = Some(item_id);
                }
                self.write(&sanitize(&delta), out);
            }
            Update::Thinking { .. } => {}
            Update::ToolCall {
                tool_call_id,
                tool_name,
                input,
            } => self.header(&tool_call_id, &follow::tool_title(&tool_name, &input), out),
            Update::Tool {
                tool_call_id,
                tool_name,
                input,
                status,
                content,
                ..
            } => {
                if status == ToolStatus::Running {
                    return;
                }
                self.header(&tool_call_id, &follow::tool_title(&tool_name, &input), out);
                let text = sanitize(&follow::text_of(&content));
                let lines: Vec<&str> = text.trim_end().lines().collect();
                for line in lines.iter().take(TOOL_LINES) {
                    self.write(&format!("  │ {line}\n"), out);
                }
                if lines.len() > TOOL_LINES {
                    self.write(
                        &format!("  │ … {} more lines\n", lines.len() - TOOL_LINES),
                        out,
                    );
                }
                let mark = if status == ToolStatus::Error {
                    "  ✗ failed\n"
                } else {
                    "  ✓\n"
                };
                self.write(mark, out);
            }
            Update::Reply {
                status,
                error_message,
                ..
            } => {
                self.end_line(out);
                match status {
                    AssistantStatus::Error => self.write(
                        &format!(
                            "✗ the model reported an error: {}\n",
                            sanitize(error_message.as_deref().unwrap_or("no message"))
                        ),
                        out,
                    ),
                    AssistantStatus::Aborted => self.write("■ turn aborted\n", out),
                    _ => {}
                }
            }
        }
    }

    /// Ends an open line.
    pub(super) fn finish(&mut self, out: &mut String) {
        self.end_line(out);
    }
}

fn print(text: &str) {
    if text.is_empty() {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// An event as one JSON line, in the protocol's own field names.
fn json_line(event: &ServerEvent) -> String {
    let mut line = crate::agent::json::to_json(&event.to_value()).to_string();
    line.push('\n');
    line
}

/// `log`: the stored transcript of the session in `snapshot`.
pub(super) fn print_log(snapshot: &SessionSnapshot, json: bool) {
    if json {
        for item in &snapshot.transcript {
            let mut line = crate::agent::json::to_json(&item.to_value()).to_string();
            line.push('\n');
            print(&line);
        }
        return;
    }
    let mut plain = Plain::default();
    let mut out = String::new();
    for update in Follower::new(snapshot.id.clone()).replay(snapshot) {
        plain.show(update, &mut out);
    }
    plain.finish(&mut out);
    print(&out);
}

/// What to send for a line of input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Send {
    Prompt(String),
    Steer(String),
}

/// Lines of input waiting for the session to take them. A line goes out as
/// a prompt when the session is idle and no prompt of ours is on its way,
/// as a steer once the server says a turn runs, and otherwise waits (a
/// steer sent before the turn started would be refused). A steer the
/// server refused (its turn ended first) comes back as a prompt, so no line
/// is lost. At end of input the feed is finished once the last turn ended.
#[derive(Debug)]
pub(super) struct Feed {
    /// Lines to send, and whether each must wait for an idle session.
    queue: VecDeque<(String, bool)>,
    eof: bool,
    prompting: bool,
    phase: SessionPhase,
}

impl Feed {
    pub(super) fn new(phase: SessionPhase) -> Self {
        Self {
            queue: VecDeque::new(),
            eof: false,
            prompting: false,
            phase,
        }
    }

    pub(super) fn line(&mut self, line: String) {
        if !line.trim().is_empty() {
            self.queue.push_back((line, false));
        }
    }

    /// A steer was refused (the turn ended before it arrived): the line is
    /// sent again, first, as a prompt.
    pub(super) fn steer_refused(&mut self, line: String) {
        self.queue.push_front((line, true));
    }

    pub(super) fn end_of_input(&mut self) {
        self.eof = true;
    }

    pub(super) fn phase(&mut self, phase: SessionPhase) {
        self.phase = phase;
    }

    /// Our prompt's request settled.
    pub(super) fn prompt_done(&mut self, phase: SessionPhase) {
        self.prompting = false;
        self.phase = phase;
    }

    pub(super) fn busy(&self) -> bool {
        self.prompting || self.phase != SessionPhase::Idle
    }

    /// The next line to send now, if any.
    pub(super) fn next(&mut self) -> Option<Send> {
        let (_, prompt_only) = self.queue.front()?;
        if self.phase != SessionPhase::Idle && !prompt_only {
            return self.queue.pop_front().map(|(line, _)| Send::Steer(line));
        }
        if self.prompting || self.phase != SessionPhase::Idle {
            return None;
        }
        self.prompting = true;
        self.queue.pop_front().map(|(line, _)| Send::Prompt(line))
    }

    /// Input ended, every line went out and the last turn is over.
    pub(super) fn finished(&self) -> bool {
        self.eof && self.queue.is_empty() && !self.busy()
    }
}

/// Lines of stdin, read on a plain thread (a blocking read must not hold up
/// the runtime's shutdown). The channel closes at end of input.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (lines, receiver) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if lines.blocking_send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

enum Done {
    Prompt(Result<SessionSnapshot, String>),
    /// A steer's result, with its text.
    Steer(Result<(), String>, String),
    Abort(Result<(), String>),
}

/// `attach` without a terminal: follows session `id` (attached by `client`,
/// its snapshot `snapshot`), feeding it stdin's lines, until input ends and
/// the last turn is over, Ctrl-C when idle, or the session goes away.
pub(super) async fn run_lines(
    client: Arc<Client>,
    id: &str,
    snapshot: &SessionSnapshot,
    json: bool,
) -> Result<(), Failure> {
    let mut events = client.events();
    let mut status = client.status();
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| Failure::from(format!("cannot handle Ctrl-C: {e}")))?;
    let mut follower = Follower::new(id.to_owned());
    follower.resume(snapshot);
    let mut plain = Plain {
        label_others: true,
        ..Plain::default()
    };
    let mut feed = Feed::new(snapshot.phase);
    let mut lines = stdin_lines();
    let mut lines_open = true;
    let mut aborting = false;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    eprintln!(
        "attached to session {id} ({}, {} transcript items); each line of input is a prompt, or a steer while a turn runs",
        snapshot.phase.as_str(),
        snapshot.transcript.len()
    );
    loop {
        let mut out = String::new();
        tokio::select! {
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        follower.gap();
                        plain.finish(&mut out);
                        eprintln!("(lost the server: {reason}; reconnecting)");
                    }
                    Status::Ready { reconnected: true, .. } => eprintln!("(reconnected)"),
                    Status::Ready { .. } => {}
                    Status::Closed { error } => {
                        break Err(format!("the connection to the server ended: {error}").into());
                    }
                },
                Err(_) => break Err("the client ended".to_string().into()),
            },
            Some(done) = done_rx.recv() => match done {
                Done::Prompt(Ok(snapshot)) => {
                    if !json {
                        for update in follower.on_snapshot(&snapshot) {
                            plain.show(update, &mut out);
                        }
                    }
                    plain.finish(&mut out);
                    print(&out);
                    out.clear();
                    match super::stream::turn_outcome(&snapshot) {
                        Ok(summary) => eprintln!("[turn complete: {summary}]"),
                        Err(problem) => eprintln!("[turn ended: {problem}]"),
                    }
                    let phase = client.session_snapshot(id).map_or(snapshot.phase, |s| s.phase);
                    feed.prompt_done(phase);
                }
                Done::Prompt(Err(e)) => {
                    let phase = client.session_snapshot(id).map_or(SessionPhase::Idle, |s| s.phase);
                    feed.prompt_done(phase);
                    eprintln!("(prompt refused: {e})");
                }
                Done::Steer(Err(e), text) => {
                    eprintln!("(steer refused: {e}; sending it as a prompt)");
                    feed.steer_refused(text);
                }
                Done::Abort(Err(e)) => eprintln!("(cannot abort: {e})"),
                Done::Steer(Ok(()), _) | Done::Abort(Ok(())) => {}
            },
            event = events.recv() => match event {
                Ok(event) => {
                    if json {
                        out.push_str(&json_line(&event));
                    } else {
                        for update in follower.on_event(&event) {
                            plain.show(update, &mut out);
                        }
                    }
                    match &event {
                        ServerEvent::SessionSnapshot { snapshot } if snapshot.id == id => {
                            let phase = client.session_snapshot(id).map_or(snapshot.phase, |s| s.phase);
                            feed.phase(phase);
                            if phase == SessionPhase::Idle {
                                aborting = false;
                            }
                        }
                        ServerEvent::SessionRemoved { session_id } if session_id == id => {
                            print(&out);
                            break Err(format!("session {id} was removed").into());
                        }
                        _ => {}
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => follower.gap(),
                Err(broadcast::error::RecvError::Closed) => break Err("the client ended".to_string().into()),
            },
            line = lines.recv(), if lines_open => match line {
                Some(line) => feed.line(line),
                None => {
                    lines_open = false;
                    feed.end_of_input();
                }
            },
            _ = sigint.recv() => {
                plain.finish(&mut out);
                print(&out);
                if !feed.busy() || aborting {
                    break Err(Failure::interrupted());
                }
                aborting = true;
                eprintln!("(aborting the turn; Ctrl-C again leaves)");
                let (client, id, done) = (Arc::clone(&client), id.to_owned(), done_tx.clone());
                tokio::spawn(async move {
                    let r = client.abort(&id).await.map(drop).map_err(|e| e.to_string());
                    let _ = done.send(Done::Abort(r));
                });
                continue;
            }
        }
        while let Some(send) = feed.next() {
            let (client, id, done) = (Arc::clone(&client), id.to_owned(), done_tx.clone());
            match send {
                Send::Prompt(text) => {
                    follower.expect_own(text.clone());
                    tokio::spawn(async move {
                        let r = client.prompt(&id, &text).await.map_err(|e| e.to_string());
                        let _ = done.send(Done::Prompt(r));
                    });
                }
                Send::Steer(text) => {
                    follower.expect_own(text.clone());
                    tokio::spawn(async move {
                        let r = client
                            .steer(&id, &text)
                            .await
                            .map(drop)
                            .map_err(|e| e.to_string());
                        let _ = done.send(Done::Steer(r, text));
                    });
                }
            }
        }
        if feed.finished() {
            plain.finish(&mut out);
            print(&out);
            break Ok(());
        }
        print(&out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_go_out_when_the_session_can_take_them() {
        let mut feed = Feed::new(SessionPhase::Idle);
        feed.line("first".into());
        feed.line("second".into());
        feed.line("   ".into());
        assert_eq!(feed.next(), Some(Send::Prompt("first".into())));
        assert_eq!(
            feed.next(),
            None,
            "no steer before the turn is known to run"
        );
        feed.phase(SessionPhase::Turn);
        assert_eq!(feed.next(), Some(Send::Steer("second".into())));
        feed.line("third".into());
        feed.end_of_input();
        feed.prompt_done(SessionPhase::Idle);
        assert!(!feed.finished(), "a line is still waiting");
        assert_eq!(feed.next(), Some(Send::Prompt("third".into())));
        assert!(!feed.finished(), "its turn runs");
        feed.prompt_done(SessionPhase::Idle);
        assert!(feed.finished());
    }

    #[test]
    fn a_refused_steer_comes_back_as_a_prompt() {
        let mut feed = Feed::new(SessionPhase::Turn);
        feed.line("late".into());
        assert_eq!(feed.next(), Some(Send::Steer("late".into())));
        feed.steer_refused("late".into());
        assert_eq!(
            feed.next(),
            None,
            "not steered again while the turn seems to run"
        );
        feed.phase(SessionPhase::Idle);
        assert_eq!(feed.next(), Some(Send::Prompt("late".into())));
    }

    #[test]
    fn plain_text_of_a_turn() {
        use kernel::protocol::{Content, StopReason};
        use kernel::wire::Value;
        let input = Value::Map(vec![("command".into(), Value::text("ls"))]);
        let mut plain = Plain {
            label_others: true,
            ..Plain::default()
        };
        let mut out = String::new();
        let updates = vec![
            Update::User {
                item_id: "u".into(),
                text: "hi\nthere".into(),
                own: false,
            },
            Update::Text {
                item_id: "a".into(),
                delta: "Look\u{1b}[2J".into(),
            },
            Update::ToolCall {
                tool_call_id: "c".into(),
                tool_name: "bash".into(),
                input: input.clone(),
            },
            Update::Tool {
                tool_call_id: "c".into(),
                tool_name: "bash".into(),
                input,
                status: ToolStatus::Complete,
                content: vec![Content::Text {
                    text: "a\nb\n".into(),
                }],
                details: None,
            },
            Update::Reply {
                item_id: "a".into(),
                status: AssistantStatus::Complete(StopReason::ToolUse),
                error_message: None,
                usage: None,
            },
            Update::Reply {
                item_id: "b".into(),
                status: AssistantStatus::Error,
                error_message: Some("rate limited".into()),
                usage: None,
            },
        ];
        for update in updates {
            plain.show(update, &mut out);
        }
        plain.finish(&mut out);
        assert_eq!(
            out,
            "› [another client] hi\n  there\nLook␛[2J\n▸ bash: ls\n  │ a\n  │ b\n  ✓\n✗ the model reported an error: rate limited\n"
        );
    }
}
