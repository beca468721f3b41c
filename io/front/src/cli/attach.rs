//! `attach` without a terminal, and `log`: a session's transcript as plain
//! text (or JSON lines), and stdin lines fed to the session as it can take
//! them.
//!
//! What is new in the session is the kernel [`Follower`]'s decision; when a
//! line may go out, as what, and what a refused one becomes is the kernel
//! [`Front`]'s; [`Plain`] only formats.

use super::Failure;
use crate::tui::view::{reason, sanitize};
use kernel::client::follow::{self, Follower, Update};
use kernel::client::front::{Front, Link, Notice, Output, Request};
use kernel::client::{front, slash};
use kernel::protocol::codec::Schema;
use kernel::protocol::{AssistantStatus, ServerEvent, SessionSnapshot, ToolStatus};
use pi_client::{Client, Status};
use std::collections::BTreeSet;
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
            Update::Notice { text, .. } => {
                self.end_line(out);
                self.write(&format!("⚠ {}\n", sanitize(&text)), out);
            }
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

use crate::cli::print;

/// An event as one JSON line, in the protocol's own field names.
fn json_line(event: &ServerEvent) -> String {
    let mut line = pi_config::json::to_json(&event.to_value()).to_string();
    line.push('\n');
    line
}

/// `log`: the stored transcript of the session in `snapshot`.
pub(super) fn print_log(snapshot: &SessionSnapshot, json: bool) {
    if json {
        for item in &snapshot.transcript {
            let mut line = pi_config::json::to_json(&item.to_value()).to_string();
            line.push('\n');
            print(&line);
        }
        return;
    }
    print(&transcript_text(snapshot));
}

/// The transcript as `log` prints it (and the terminal's `/export` writes it).
pub(crate) fn transcript_text(snapshot: &SessionSnapshot) -> String {
    let mut plain = Plain::default();
    let mut out = String::new();
    for update in Follower::new(snapshot.id.clone()).replay(snapshot) {
        plain.show(update, &mut out);
    }
    plain.finish(&mut out);
    out
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

/// The answer to a call of the session's [`Front`], with its snapshot.
type Answered = (
    u64,
    Result<front::Answer, kernel::client::ClientError>,
    Option<SessionSnapshot>,
);

/// Why a line came back, as the user reads it.
/// A slash command line mode carries out itself: the text to show, or
/// `None` to leave (`/quit`).
fn local(client: &Client, id: &str, command: slash::Command) -> Option<String> {
    use slash::Command;
    Some(match command {
        Command::Quit => return None,
        Command::Help => slash::help(),
        Command::Model(None) | Command::Thinking(None) => {
            crate::tui::settings_text(client, id, matches!(command, Command::Model(_)))
        }
        Command::New => "(in line mode, start one with `pi-server create`)".into(),
        Command::Sessions(_) => "(in line mode, `pi-server list` lists them)".into(),
        Command::Export(_) => "(in line mode, `pi-server log` prints the transcript)".into(),
        Command::Abort
        | Command::Model(Some(_))
        | Command::Thinking(Some(_))
        | Command::Name(_) => {
            unreachable!("the front carries these out")
        }
    })
}

/// `attach` without a terminal: follows session `id` (attached by `client`,
/// its snapshot `snapshot`), feeding it stdin's lines as the kernel's
/// [`Front`] decides, until input ends and the last turn is over, Ctrl-C
/// when idle, or the session goes away. A line the session does not take
/// is printed back on stderr, never dropped.
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
    let mut front = Front::new(snapshot.phase, snapshot.transcript.len());
    let mut lines = stdin_lines();
    let mut lines_open = true;
    // Calls on their way are bounded by the front: one prompt, one abort,
    // and the steers of the lines typed.
    let (done_tx, mut done_rx) = mpsc::channel::<Answered>(16);
    eprintln!(
        "attached to session {id} ({}, {} transcript items); each line of input is a prompt, or a steer while a turn runs",
        snapshot.phase.as_str(),
        snapshot.transcript.len()
    );
    loop {
        let mut out = String::new();
        let input = tokio::select! {
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        follower.gap();
                        plain.finish(&mut out);
                        eprintln!("(lost the server: {reason})");
                        front::Input::Link(Link::Reconnecting)
                    }
                    Status::Ready { .. } => front::Input::Link(Link::Up),
                    Status::Closed { error } => {
                        front.step(front::Input::Link(Link::Closed));
                        break Err(format!("the connection to the server ended: {error}").into());
                    }
                },
                Err(_) => break Err("the client ended".to_string().into()),
            },
            Some((call, outcome, answered)) = done_rx.recv() => {
                if let Some(snapshot) = answered.filter(|_| matches!(outcome, Ok(front::Answer::Prompt { .. }))) {
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
                }
                front::Input::Answered { call, outcome }
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
                            front::Input::Session {
                                phase: snapshot.phase,
                                transcript_len: snapshot.transcript.len(),
                            }
                        }
                        ServerEvent::SessionRemoved { session_id } if session_id == id => {
                            print(&out);
                            break Err(format!("session {id} was removed").into());
                        }
                        _ => {
                            print(&out);
                            continue;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    follower.gap();
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => break Err("the client ended".to_string().into()),
            },
            line = lines.recv(), if lines_open => match line {
                Some(line) => front::Input::Typed(line),
                None => {
                    lines_open = false;
                    front::Input::EndOfInput
                }
            },
            _ = sigint.recv() => {
                plain.finish(&mut out);
                print(&out);
                out.clear();
                if !front.busy() || front.aborting() {
                    break Err(Failure::interrupted());
                }
                front::Input::Abort
            }
        };
        let mut finished = false;
        for output in front.step(input) {
            match output {
                Output::Send { call, request, .. } => {
                    if let Request::Prompt(text) | Request::Steer(text) = &request {
                        follower.expect_own(text.clone());
                    }
                    let (client, id, done) = (Arc::clone(&client), id.to_owned(), done_tx.clone());
                    tokio::spawn(async move {
                        let (outcome, snapshot) = client.front_request(&id, &request).await;
                        let _ = done.send((call, outcome, snapshot)).await;
                    });
                }
                Output::HandBack { text, why, .. } => {
                    eprintln!("(line not taken: {}) {text}", reason(&why))
                }
                Output::Notice(notice) => match notice {
                    Notice::Held { lines } => {
                        eprintln!("(holding {lines} line(s) until the server is back)")
                    }
                    Notice::Reconnecting => eprintln!("(reconnecting)"),
                    Notice::Reconnected => eprintln!("(reconnected)"),
                    Notice::Retrying { text } => {
                        eprintln!("(the session was busy; sending again) {text}")
                    }
                    Notice::NothingToAbort => {}
                    Notice::Aborting => eprintln!("(aborting the turn; Ctrl-C again leaves)"),
                    Notice::AbortRefused(e) => eprintln!("(cannot abort: {e})"),
                    Notice::Applied(line) => eprintln!("(done: {line})"),
                },
                Output::Local(command) => {
                    if let Some(text) = local(&client, id, command) {
                        eprintln!("{text}");
                    } else {
                        finished = true;
                    }
                }
                Output::Finished => finished = true,
            }
        }
        if finished {
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
