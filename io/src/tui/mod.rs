//! `pi-server attach` on a terminal: a full-screen UI over one session.
//!
//! This module is the host. It puts the terminal in raw mode on the
//! alternate screen with bracketed paste, reads keys on a thread, carries
//! the [`view`]'s actions out on the shared [`Client`] (which owns the
//! connection, its reconnection and the re-attachment of the session), feeds
//! every event, status change and request result back, and redraws. What
//! any of it means is decided in [`view`]; how it looks in [`render`].

mod markdown;
pub(crate) mod render;
pub(crate) mod view;

use std::io::{self, Stdout};
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{DisableBracketedPaste, EnableBracketedPaste, Event as TermEvent};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::sync::{broadcast, mpsc};

use crate::client::{Client, Status};
pub(crate) use view::History;
use view::{Action, Done, View};

/// How often the spinner turns while something runs.
const TICK: Duration = Duration::from_millis(120);

/// Restores the terminal when dropped, also on an early return or a panic.
struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    fn enter() -> io::Result<Self> {
        enable_raw_mode()?;
        let mut stdout = io::stdout();
        if let Err(e) = execute!(stdout, EnterAlternateScreen, EnableBracketedPaste) {
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
    let _ = execute!(io::stdout(), DisableBracketedPaste, LeaveAlternateScreen);
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
    let (tx, rx) = mpsc::channel(256);
    std::thread::spawn(move || {
        while let Ok(event) = crossterm::event::read() {
            if tx.blocking_send(event).is_err() {
                break;
            }
        }
    });
    rx
}

/// Runs the UI on session `id`, which `client` has attached, until the user
/// detaches, the session is removed or the server is gone for good.
pub(crate) async fn run(client: Arc<Client>, id: &str, history: History) -> Result<(), String> {
    let snapshot = client
        .session_snapshot(id)
        .ok_or_else(|| format!("session {id} is not attached"))?;
    let mut events = client.events();
    let mut status = client.status();
    let mut view = View::new(&snapshot, history);
    let mut screen = Screen::enter().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let mut keys = terminal_events();
    // Calls on their way are the front's: one prompt, one abort, the steers
    // typed; a full channel only makes their tasks wait.
    let (done_tx, mut done_rx) = mpsc::channel::<Done>(16);
    // https://no-color.org: styles stay (bold, dim, reverse), colours go.
    let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        screen
            .terminal
            .draw(|frame| {
                render::draw(frame, &view);
                if !colour {
                    render::strip_colour(frame.buffer_mut());
                }
            })
            .map_err(|e| format!("cannot draw: {e}"))?;
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
                None => break Ok(()),
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
            match keys.try_recv() {
                Ok(event) => actions.extend(on_terminal(&mut view, event)),
                Err(_) => break,
            }
        }
        if view.removed {
            break Err(format!("session {id} was removed"));
        }
        if actions.contains(&Action::Detach) {
            break Ok(());
        }
        for action in actions {
            perform(&client, id, action, &done_tx);
        }
    };
    drop(screen);
    result
}

fn on_terminal(view: &mut View, event: TermEvent) -> Vec<Action> {
    match event {
        TermEvent::Key(key) => view.on_key(key),
        TermEvent::Paste(text) => {
            view.on_paste(&text);
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
