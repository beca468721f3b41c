//! `attach` without a terminal, and `log`: a session's transcript as plain
//! text (or JSON lines), and stdin lines fed to the session as it can take
//! them.
//!
//! What is new in the session is the kernel [`Follower`]'s decision; when a
//! line may go out, as what, and what a refused one becomes is the kernel
//! [`Front`]'s; [`Plain`] only formats.

use super::Failure;
use crate::text::{Out, Plain, transcript_text};
use crate::tui::view::reason;
use kernel::client::follow::Follower;
use kernel::client::front::{Front, Link, Notice, Output, Request};
use kernel::client::{front, slash};
use kernel::protocol::codec::Schema;
use kernel::protocol::{ServerEvent, SessionSnapshot};
use pi_client::{Client, Status};
use std::sync::Arc;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{broadcast, mpsc};

use crate::cli::print;
use crate::limits::{FRONT_ANSWERS, STDIN_LINES};

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

/// Lines of stdin, read on a plain thread (a blocking read must not hold up
/// the runtime's shutdown). The channel closes at end of input.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (lines, receiver) = mpsc::channel(STDIN_LINES);
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
        Command::Approvals(None) => crate::text::APPROVALS_NEED_V8.into(),
        Command::Approvals(Some(_)) | Command::Decide(_) => unreachable!("the front sends these"),
        Command::Abort
        | Command::Compact(_)
        | Command::Model(Some(_))
        | Command::Thinking(Some(_))
        | Command::Name(_) => {
            unreachable!("the front carries these out")
        }
    })
}

/// Carries out what the front decided: its calls go out as tasks whose
/// answers come back on `done`; what it hands back or tells goes to
/// stderr. True once the front is finished.
fn carry_out(
    client: &Arc<Client>,
    id: &str,
    follower: &mut Follower,
    done: &mpsc::Sender<Answered>,
    outputs: Vec<Output>,
) -> bool {
    let mut finished = false;
    for output in outputs {
        match output {
            Output::Send { call, request, .. } => {
                if let Request::Prompt(text) | Request::Steer(text) = &request {
                    follower.expect_own(text.clone());
                }
                let (client, id, done) = (Arc::clone(client), id.to_owned(), done.clone());
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
                Notice::NothingAsked => eprintln!("(no tool call waits for an answer)"),
            },
            Output::Local(command) => {
                if let Some(text) = local(client, id, command) {
                    eprintln!("{text}");
                } else {
                    finished = true;
                }
            }
            Output::Finished => finished = true,
        }
    }
    finished
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
    let mut plain = Plain::default();
    plain.label_others = true;
    let mut front = Front::new(snapshot.phase, snapshot.transcript.len());
    let mut lines = stdin_lines();
    let mut lines_open = true;
    // Calls on their way are bounded by the front: one prompt, one abort,
    // and the steers of the lines typed.
    let (done_tx, mut done_rx) = mpsc::channel::<Answered>(FRONT_ANSWERS);
    eprintln!(
        "attached to session {id} ({}, {} transcript items); each line of input is a prompt, or a steer while a turn runs",
        snapshot.phase.as_str(),
        snapshot.transcript.len()
    );
    loop {
        let mut out = Out::default();
        let input = tokio::select! {
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        follower.gap();
                        plain.end_line(&mut out);
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
                    plain.end_line(&mut out);
                    print(&out.main);
                    out.main.clear();
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
                        out.main.push_str(&json_line(&event));
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
                            print(&out.main);
                            break Err(format!("session {id} was removed").into());
                        }
                        _ => {
                            print(&out.main);
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
                plain.end_line(&mut out);
                print(&out.main);
                out.main.clear();
                if !front.busy() || front.aborting() {
                    break Err(Failure::interrupted());
                }
                front::Input::Abort
            }
        };
        let finished = carry_out(&client, id, &mut follower, &done_tx, front.step(input));
        if finished {
            plain.end_line(&mut out);
            print(&out.main);
            break Ok(());
        }
        print(&out.main);
    }
}
