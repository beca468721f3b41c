//! `pi-server attach` on a terminal: a full-screen UI over one session.
//!
//! This module is the host. It puts the terminal in raw mode on the
//! alternate screen with bracketed paste, reads keys on a thread, carries
//! the [`view`]'s actions out on the shared [`Client`] (which owns the
//! connection, its reconnection and the re-attachment of the session), feeds
//! every event, status change and request result back, and redraws. What
//! any of it means is decided in [`view`]; how it looks in [`render`].

mod highlight;
mod markdown;
pub(crate) mod render;
mod v8;
pub(crate) mod view;
pub(crate) use v8::run as run_v8;

use std::io::{self, Stdout};
use std::sync::Arc;

use crossterm::event::{
    DisableBracketedPaste, DisableFocusChange, EnableBracketedPaste, EnableFocusChange,
    Event as TermEvent,
};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::sync::{broadcast, mpsc};

use crate::limits::{FRONT_ANSWERS, TERMINAL_EVENTS, TICK};
use kernel::client::{lookup, slash};
use kernel::protocol::{CreateParams, ModelMetadata, SessionMetadata, SessionSnapshot};
use pi_client::{Client, Status};
pub(crate) use view::History;
use view::{Action, Done, View};

/// What `/model` and `/thinking` show without an argument: the server's
/// models with the session's marked, or its model's thinking levels.
pub(crate) fn settings_text(client: &Client, id: &str, models: bool) -> String {
    let offered = client.server_snapshot().models;
    let Some(session) = client.session_snapshot(id) else {
        return format!("session {id} is not attached");
    };
    settings_of(&offered, &session, models)
}

/// [`settings_text`] of the models `offered` and the session `session`.
fn settings_of(offered: &[ModelMetadata], session: &SessionSnapshot, models: bool) -> String {
    let current = &session.model;
    if models {
        let width = offered
            .iter()
            .map(|m| m.provider.len() + 1 + m.id.len())
            .max()
            .unwrap_or(0);
        let mut text = String::from("models (/model PROVIDER/MODEL switches between turns):");
        for m in offered {
            let name = format!("{}/{}", m.provider, m.id);
            let mark = if m.provider == current.provider && m.id == current.id {
                "*"
            } else {
                " "
            };
            let credentials = if m.authenticated {
                ""
            } else {
                "  (no credentials)"
            };
            text.push_str(&format!("\n{mark} {name:<width$}  {}{credentials}", m.name));
        }
        return text;
    }
    let levels = offered
        .iter()
        .find(|m| m.provider == current.provider && m.id == current.id)
        .map(|m| {
            m.supported_thinking_levels
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "unknown".into());
    format!(
        "thinking: {} ({}/{} offers {levels}); /thinking LEVEL sets it between turns",
        session.thinking_level.as_str(),
        current.provider,
        current.id,
    )
}

/// Restores the terminal when dropped, also on an early return or a panic.
struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    fn enter() -> io::Result<Self> {
        enable_raw_mode()?;
        let mut stdout = io::stdout();
        if let Err(e) = execute!(
            stdout,
            EnterAlternateScreen,
            EnableBracketedPaste,
            EnableFocusChange
        ) {
            let _ = disable_raw_mode();
            return Err(e);
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        let terminal = Terminal::new(CrosstermBackend::new(stdout))?;
        Ok(Self { terminal })
    }
}

fn restore() {
    let _ = execute!(
        io::stdout(),
        DisableFocusChange,
        DisableBracketedPaste,
        LeaveAlternateScreen
    );
    let _ = disable_raw_mode();
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.terminal.show_cursor();
        restore();
    }
}

/// Terminal input, read on a plain thread (crossterm's reads block).
fn terminal_events() -> mpsc::Receiver<TermEvent> {
    let (tx, rx) = mpsc::channel(TERMINAL_EVENTS);
    std::thread::spawn(move || {
        while let Ok(event) = crossterm::event::read() {
            if tx.blocking_send(event).is_err() {
                break;
            }
        }
    });
    rx
}

/// How the UI of one session ended well.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exit {
    /// The user detached (Ctrl-D, `/quit`, end of input).
    Detached,
    /// The user switched to another session (`/new`, `/sessions NAME`),
    /// which the client has attached.
    Switch(String),
}

/// Runs the UI on session `id`, which `client` has attached, until the user
/// detaches, the session is removed or the server is gone for good; `/new`
/// and `/sessions NAME` switch sessions on the way (the one left is
/// detached). Returns the session it ended on, attached.
pub(crate) async fn run(client: Arc<Client>, id: &str, history: History) -> Result<String, String> {
    let mut screen = Screen::enter().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    // One reader for the whole run: a reader per session would leave the
    // old one blocked in a read that swallows the next key.
    let mut keys = terminal_events();
    let mut id = id.to_owned();
    loop {
        match run_session(&client, &id, history, &mut screen, &mut keys).await? {
            Exit::Detached => return Ok(id),
            Exit::Switch(to) => {
                let _ = client.detach(&id).await;
                id = to;
            }
        }
    }
}

async fn run_session(
    client: &Arc<Client>,
    id: &str,
    history: History,
    screen: &mut Screen,
    keys: &mut mpsc::Receiver<TermEvent>,
) -> Result<Exit, String> {
    let snapshot = client
        .session_snapshot(id)
        .ok_or_else(|| format!("session {id} is not attached"))?;
    let mut events = client.events();
    let mut status = client.status();
    let mut view = View::new(&snapshot, history);
    view.windows = client
        .server_snapshot()
        .models
        .iter()
        .map(|m| (format!("{}/{}", m.provider, m.id), m.context_window))
        .collect();
    // Calls on their way are the front's: one prompt, one abort, the steers
    // typed; a full channel only makes their tasks wait.
    let (done_tx, mut done_rx) = mpsc::channel::<Done>(FRONT_ANSWERS);
    let colour = colour();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        draw(screen, &mut view, colour)?;
        // Wait for something, then take everything else already there
        // before the next draw (a burst of deltas is one frame).
        let mut actions = Vec::new();
        tokio::select! {
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => actions.extend(view.on_connection(Some(reason.clone()))),
                    Status::Ready { .. } => actions.extend(view.on_connection(None)),
                    Status::Closed { error } => {
                        break Err(format!("the connection to the server ended: {error}"));
                    }
                },
                Err(_) => break Err("the client ended".into()),
            },
            Some(done) = done_rx.recv() => actions.extend(view.on_done(done)),
            event = events.recv() => match event {
                Ok(event) => actions.extend(view.on_event(&event)),
                Err(broadcast::error::RecvError::Lagged(_)) => view.on_gap(),
                Err(broadcast::error::RecvError::Closed) => break Err("the client ended".into()),
            },
            key = keys.recv() => match key {
                Some(event) => actions.extend(on_terminal(&mut view, event)),
                None => break Ok(Exit::Detached),
            },
            _ = tick.tick() => {
                if view.animating() {
                    view.tick += 1;
                }
            }
        }
        loop {
            if let Ok(done) = done_rx.try_recv() {
                actions.extend(view.on_done(done));
                continue;
            }
            match events.try_recv() {
                Ok(event) => {
                    actions.extend(view.on_event(&event));
                    continue;
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    view.on_gap();
                    continue;
                }
                Err(_) => {}
            }
            // Keys after a slash command the host carries out (it may switch
            // sessions) or a detach wait for it: they are the next view's.
            if actions
                .iter()
                .any(|a| matches!(a, Action::Local(_) | Action::Detach))
            {
                break;
            }
            match keys.try_recv() {
                Ok(event) => actions.extend(on_terminal(&mut view, event)),
                Err(_) => break,
            }
        }
        if view.removed {
            break Err(format!("session {id} was removed"));
        }
        if actions.contains(&Action::Detach) {
            break Ok(Exit::Detached);
        }
        let mut switch = None;
        for action in actions {
            match action {
                Action::Local(command) => {
                    if let Some(to) = local(client, id, command, &mut view).await {
                        switch = Some(to);
                    }
                }
                Action::ShowOlder => {
                    if let Some(snapshot) = client.session_snapshot(id) {
                        view.show_older(&snapshot.transcript, view::PAGE_TURNS);
                    }
                }
                action => perform(client, id, action, &done_tx),
            }
        }
        if let Some(to) = switch {
            break Ok(Exit::Switch(to));
        }
    }
}

/// Draws `view`, and rings when a turn ended while the terminal was elsewhere.
fn draw(screen: &mut Screen, view: &mut View, colour: bool) -> Result<(), String> {
    screen
        .terminal
        .draw(|frame| {
            view.top_drawn = render::draw(frame, view);
            if !colour {
                render::strip_colour(frame.buffer_mut());
            }
        })
        .map_err(|e| format!("cannot draw: {e}"))?;
    if std::mem::take(&mut view.bell) {
        // The bell, and an OSC 9 notification where the terminal shows them.
        use std::io::Write;
        let mut out = io::stdout();
        let _ = out.write_all(b"\x07\x1b]9;pi-server: the turn ended\x07");
        let _ = out.flush();
    }
    Ok(())
}

/// Colours, unless https://no-color.org asks for none (styles stay).
fn colour() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Carries out a slash command that needs the client, telling the view what
/// came of it; returns the session to switch to (attached), if any.
async fn local(
    client: &Client,
    id: &str,
    command: slash::Command,
    view: &mut View,
) -> Option<String> {
    use slash::Command;
    match command {
        Command::Model(None) => view.info(&settings_text(client, id, true)),
        Command::Thinking(None) => view.info(&settings_text(client, id, false)),
        Command::Sessions(None) => view.info(&sessions_text(client.server_snapshot().sessions, id)),
        Command::Sessions(Some(query)) => {
            let sessions = client.server_snapshot().sessions;
            match lookup::resolve(&sessions, &query) {
                Ok(to) if to == id => view.info("that is this session"),
                Ok(to) => match client.attach(&to).await {
                    Ok(_) => return Some(to),
                    Err(e) => view.warn(&format!("cannot attach to session {to}: {e}")),
                },
                Err(lookup::Unresolved::None) => {
                    view.warn(&format!("no session matches {query}; /sessions lists them"))
                }
                Err(lookup::Unresolved::Ambiguous(candidates)) => view.warn(&format!(
                    "{query} names more than one session: {}",
                    candidates.join(", ")
                )),
            }
        }
        Command::New => {
            let cwd = client.session_snapshot(id).map(|s| s.cwd);
            let params = CreateParams {
                cwd,
                ..CreateParams::default()
            };
            match client.create(params).await {
                Ok(created) => return Some(created.id),
                Err(e) => view.warn(&format!("cannot create a session: {e}")),
            }
        }
        Command::Export(file) => match export(client, id, file) {
            Ok(path) => view.info(&format!("transcript written to {path}")),
            Err(e) => view.warn(&e),
        },
        Command::Approvals(None) => view.info(crate::text::APPROVALS_NEED_V8),
        Command::Help
        | Command::Approvals(Some(_))
        | Command::Decide(_)
        | Command::Quit
        | Command::Abort
        | Command::Compact(_)
        | Command::Model(Some(_))
        | Command::Thinking(Some(_))
        | Command::Name(_) => unreachable!("the view or the front carries these out"),
    }
    None
}

/// `/sessions`: the server's sessions, newest first, this one marked.
fn sessions_text(mut sessions: Vec<SessionMetadata>, id: &str) -> String {
    sessions.sort_by_key(|s| std::cmp::Reverse(s.updated_at.unwrap_or(s.created_at)));
    let mut text = String::from("sessions (/sessions NAME-OR-ID switches):");
    for s in &sessions {
        let mark = if s.id == id { "*" } else { " " };
        let name = s.session_name.as_deref().unwrap_or("-");
        let cwd = s.cwd.as_deref().unwrap_or("");
        text.push_str(&format!(
            "\n{mark} {}  {name}  {cwd}",
            &s.id[..s.id.len().min(8)]
        ));
    }
    text
}

/// `/export [FILE]`: the transcript as `pi-server log` prints it, to `FILE`
/// (default `<name or id>.md` in the working directory); refuses to
/// overwrite a file.
fn export(client: &Client, id: &str, file: Option<String>) -> Result<String, String> {
    let snapshot = client
        .session_snapshot(id)
        .ok_or_else(|| format!("session {id} is not attached"))?;
    export_of(&snapshot, file)
}

/// [`export`] of the session `snapshot`.
fn export_of(snapshot: &SessionSnapshot, file: Option<String>) -> Result<String, String> {
    let file = file.unwrap_or_else(|| {
        let stem = snapshot.name.clone().unwrap_or_else(|| snapshot.id.clone());
        let stem: String = stem
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("{stem}.md")
    });
    let text = crate::text::transcript_text(snapshot);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .map_err(|e| format!("cannot write {file}: {e}"))?;
    std::io::Write::write_all(&mut out, text.as_bytes())
        .map_err(|e| format!("cannot write {file}: {e}"))?;
    Ok(file)
}

fn on_terminal(view: &mut View, event: TermEvent) -> Vec<Action> {
    match event {
        TermEvent::Key(key) => view.on_key(key),
        TermEvent::Paste(text) => {
            view.on_paste(&text);
            Vec::new()
        }
        TermEvent::FocusGained => {
            view.focused = true;
            Vec::new()
        }
        TermEvent::FocusLost => {
            view.focused = false;
            Vec::new()
        }
        _ => Vec::new(), // a resize redraws anyway
    }
}

/// Carries an action out on the client; its result comes back as a [`Done`].
fn perform(client: &Arc<Client>, id: &str, action: Action, done: &mpsc::Sender<Done>) {
    let Action::Send { call, request } = action else {
        return;
    };
    let (client, id, done) = (Arc::clone(client), id.to_owned(), done.clone());
    tokio::spawn(async move {
        let (outcome, snapshot) = client.front_request(&id, &request).await;
        let snapshot = snapshot.map(Box::new);
        let _ = done
            .send(Done {
                call,
                outcome,
                snapshot,
            })
            .await;
    });
}
