//! The terminal UI over protocol v8: the same [`View`] fed from the
//! replicas of a [`V8Client`] instead of v1 snapshots.
//!
//! The connection follows the attached session's transcript and models and
//! our session status; on each change the host brings its
//! [`Conversation`] in step (reading only what was appended) and hands the
//! view the items that may have changed, with the session's facts
//! ([`conversation::head`]). A turn costs the terminal what it adds. What a
//! front request is over v8 is the kernel's ([`calls`]).

use crossterm::event::Event as TermEvent;
use tokio::sync::{broadcast, mpsc};

use super::view::{self, Action, Done, History, View};
use super::{Exit, Screen, draw, export_of, on_terminal, sessions_text, settings_of};
use crate::limits::{FRONT_ANSWERS, TICK};
use kernel::chord::call::ServiceCall;
use kernel::client::v8::calls::{self, Outcome};
use kernel::client::v8::connection::{Changed, SESSIONS, STATUS};
use kernel::client::v8::conversation::{self, Conversation};
use kernel::client::{Status, lookup, slash};
use kernel::protocol::codec::Schema;
use kernel::protocol::{ModelMetadata, SessionMetadata, SessionSnapshot};
use kernel::wire::Value;
use pi_client::v8::V8Client;

/// Runs the UI on session `id` over `client` until the user detaches, the
/// session is removed or the server is gone for good; `/new` and
/// `/sessions NAME` switch sessions on the way. Returns the session it
/// ended on, attached.
pub(crate) async fn run(client: V8Client, id: &str, history: History) -> Result<String, String> {
    let mut screen = Screen::enter().map_err(|e| format!("cannot set up the terminal: {e}"))?;
    let mut keys = super::terminal_events();
    let models = offered(&client).await;
    let mut id = id.to_owned();
    loop {
        client
            .attach(&id)
            .await
            .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
        match run_session(&client, &id, history, &models, &mut screen, &mut keys).await? {
            Exit::Detached => return Ok(id),
            Exit::Switch(to) => id = to,
        }
    }
}

/// The models the server offers (our `pi-server.sessions.models`).
async fn offered(client: &V8Client) -> Vec<ModelMetadata> {
    let call = ServiceCall::singleton(SESSIONS, "models", vec![]);
    match client.server(call).await {
        Ok(Some(Value::Array(models))) => models
            .iter()
            .filter_map(|m| ModelMetadata::from_value(m, "model").ok())
            .collect(),
        _ => Vec::new(),
    }
}

/// The attached session as the host follows it.
struct Followed {
    id: String,
    conversation: Conversation,
}

impl Followed {
    /// Brings the conversation in step; returns the session's facts and
    /// where the changed items begin.
    fn sync(&mut self, client: &V8Client) -> Option<(SessionSnapshot, usize)> {
        client.read(|c| self.conversation.follow(c, &self.id))
    }
}

async fn run_session(
    client: &V8Client,
    id: &str,
    history: History,
    models: &[ModelMetadata],
    screen: &mut Screen,
    keys: &mut mpsc::Receiver<TermEvent>,
) -> Result<Exit, String> {
    let mut changes = client.changes();
    let mut status = client.status();
    let mut followed = Followed {
        id: id.to_owned(),
        conversation: Conversation::default(),
    };
    let (head, _) = followed
        .sync(client)
        .ok_or_else(|| format!("session {id} is not attached"))?;
    let mut view = View::open(&head, followed.conversation.items(), history);
    view.windows = models
        .iter()
        .map(|m| (format!("{}/{}", m.provider, m.id), m.context_window))
        .collect();
    let (done_tx, mut done_rx) = mpsc::channel::<Done>(FRONT_ANSWERS);
    let colour = super::colour();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // After a reconnection the connection is back before the session is:
    // held lines go once it is attached again.
    let mut reattaching = false;
    loop {
        draw(screen, &mut view, colour)?;
        let mut actions = Vec::new();
        // A burst of changes is one redraw: the replicas are read once.
        let mut look = false;
        tokio::select! {
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        reattaching = true;
                        actions.extend(view.on_connection(Some(reason.clone())));
                    }
                    Status::Ready { .. } => {}
                    Status::Closed { error } => {
                        break Err(format!("the connection to the server ended: {error}"));
                    }
                },
                Err(_) => break Err("the client ended".into()),
            },
            Some(done) = done_rx.recv() => actions.extend(view.on_done(done)),
            change = changes.recv() => match change {
                Ok(change) => look |= noted(&mut view, client, id, &change, &mut reattaching, &mut actions),
                Err(broadcast::error::RecvError::Lagged(_)) => look = true,
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
            match changes.try_recv() {
                Ok(change) => {
                    look |= noted(
                        &mut view,
                        client,
                        id,
                        &change,
                        &mut reattaching,
                        &mut actions,
                    );
                    continue;
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    look = true;
                    continue;
                }
                Err(_) => {}
            }
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
        if look && let Some((head, from)) = followed.sync(client) {
            actions.extend(view.on_state(&head, followed.conversation.items(), from));
            let shown = client.read(kernel::client::v8::approvals::Shown::of);
            actions.extend(view.on_approvals(shown));
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
                    let head = followed.sync(client).map(|(head, _)| head);
                    let items = followed.conversation.items();
                    if let Some(to) =
                        local(client, id, models, head, items, command, &mut view).await
                    {
                        switch = Some(to);
                    }
                }
                Action::ShowOlder => {
                    view.show_older(followed.conversation.items(), view::PAGE_TURNS);
                }
                action => perform(client, id, action, &done_tx),
            }
        }
        if let Some(to) = switch {
            break Ok(Exit::Switch(to));
        }
    }
}

/// Takes a change in: true when the session's replicas are to be read
/// again. The session attached again after a reconnection is the
/// connection back, for the view; the route going while the session is
/// gone from our status is its removal.
fn noted(
    view: &mut View,
    client: &V8Client,
    id: &str,
    change: &Changed,
    reattaching: &mut bool,
    actions: &mut Vec<Action>,
) -> bool {
    match change {
        Changed::Session | Changed::Server(_) => true,
        Changed::Route(Some(to)) => {
            if *reattaching && to == id {
                *reattaching = false;
                actions.extend(view.on_connection(None));
            }
            true
        }
        Changed::Route(None) => {
            let gone = client.read(|c| {
                c.server_state(STATUS)
                    .is_some_and(|s| conversation::status_entry(s, id).is_none())
            });
            if gone {
                view.removed_now();
            }
            false
        }
    }
}

/// The sessions our status lists, as `/sessions` and its lookup read them.
fn listed(client: &V8Client) -> Vec<SessionMetadata> {
    client.read(|c| {
        let Some(Value::Array(sessions)) = c.server_state(STATUS).and_then(|s| s.get("sessions"))
        else {
            return Vec::new();
        };
        sessions
            .iter()
            .filter_map(|s| {
                let text = |key: &str| match s.get(key) {
                    Some(Value::Text(t)) => Some(t.clone()),
                    _ => None,
                };
                let at = |key: &str| match s.get(key) {
                    Some(Value::Int(n)) => u64::try_from(*n).ok(),
                    _ => None,
                };
                Some(SessionMetadata {
                    id: text("sessionId")?,
                    created_at: at("createdAt").unwrap_or(0),
                    updated_at: at("updatedAt"),
                    parent_session_id: None,
                    session_name: text("name"),
                    cwd: text("cwd"),
                })
            })
            .collect()
    })
}

/// Carries out a slash command that needs the client (see the v1 host's).
async fn local(
    client: &V8Client,
    id: &str,
    models: &[ModelMetadata],
    head: Option<SessionSnapshot>,
    items: &[kernel::protocol::TranscriptItem],
    command: slash::Command,
    view: &mut View,
) -> Option<String> {
    use slash::Command;
    let Some(head) = head else {
        view.warn(&format!("session {id} is not attached"));
        return None;
    };
    match command {
        Command::Model(None) => view.info(&settings_of(models, &head, true)),
        Command::Thinking(None) => view.info(&settings_of(models, &head, false)),
        Command::Sessions(None) => view.info(&sessions_text(listed(client), id)),
        Command::Sessions(Some(query)) => match lookup::resolve(&listed(client), &query) {
            Ok(to) if to == id => view.info("that is this session"),
            Ok(to) => return Some(to),
            Err(lookup::Unresolved::None) => {
                view.warn(&format!("no session matches {query}; /sessions lists them"))
            }
            Err(lookup::Unresolved::Ambiguous(candidates)) => view.warn(&format!(
                "{query} names more than one session: {}",
                candidates.join(", ")
            )),
        },
        Command::New => {
            let params = Value::object(vec![("cwd", Value::text(&head.cwd))]);
            let create = ServiceCall::singleton(SESSIONS, "create", vec![params]);
            match client.server(create).await {
                Ok(Some(summary)) => match summary.get("sessionId") {
                    Some(Value::Text(to)) => return Some(to.clone()),
                    _ => view.warn("the server created a session without an id"),
                },
                Ok(None) => view.warn("the server created a session without an id"),
                Err(e) => view.warn(&format!("cannot create a session: {e}")),
            }
        }
        Command::Export(file) => {
            let snapshot = SessionSnapshot {
                transcript: items.to_vec(),
                ..head
            };
            match export_of(&snapshot, file) {
                Ok(path) => view.info(&format!("transcript written to {path}")),
                Err(e) => view.warn(&e),
            }
        }
        Command::Approvals(None) => {
            let shown = client.read(kernel::client::v8::approvals::Shown::of);
            match shown {
                Some(shown) => view.info(&crate::text::approvals_text(id, &shown)),
                None => view.warn("the server shows no approvals for this session"),
            }
        }
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

/// Carries an action out over v8; its result comes back as a [`Done`].
fn perform(client: &V8Client, id: &str, action: Action, done: &mpsc::Sender<Done>) {
    let Action::Send { call, request } = action else {
        return;
    };
    let (client, id, done) = (client.clone(), id.to_owned(), done.clone());
    tokio::spawn(async move {
        let result = client.request(calls::request_of(&id, &request)).await;
        let outcome = match calls::outcome_of(&request, result) {
            Outcome::Answer(answer) => answer,
            Outcome::Wait(wait) => calls::prompt_ended(client.request(wait).await),
        };
        let _ = done
            .send(Done {
                call,
                outcome,
                snapshot: None,
            })
            .await;
    });
}
