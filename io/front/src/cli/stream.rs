//! `prompt`: a turn's reply streamed to stdout as it arrives, Ctrl-C as
//! abort, and the exit code that says how the turn ended.

use super::Failure;
use super::activate::Target;
use super::discover::session_server;
use crate::text::{Layout, Out, Plain};
use kernel::client::follow::{self, Follower, TurnOutcome, Update};
use kernel::client::front::{self, Front};
use kernel::protocol::{
    Content, ServerEvent, SessionPhase, SessionSnapshot, ToolStatus, TranscriptItem,
};
use pi_client::{Client, Status};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::broadcast;

/// A turn's reply written as it arrives: its text on stdout, its activity
/// on stderr ([`Plain`]'s reply layout), or every event as a JSON line.
/// What is new is decided by the kernel's transcript follower.
#[derive(Debug)]
pub(super) struct Stream {
    plain: Plain,
    /// The session followed, from the first snapshot written from.
    follower: Option<Follower>,
    /// `prompt` shows its own turn alone: replies streamed before its user
    /// message belong to another client's turn.
    own_only: bool,
    /// With `own_only`: our user message was seen.
    showing: bool,
    /// How many text updates were written (the demo reports it).
    deltas: usize,
    /// Ctrl-C was pressed while the prompt ran.
    interrupted: bool,
    /// Every event a JSON line on stdout instead (`--json`).
    json: bool,
}

/// What `prompt` and `exec` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shown {
    /// The reply on stdout; tool calls, thinking and notices on stderr.
    Activity,
    /// The reply alone (`--quiet`).
    Reply,
    /// Every event as a JSON line on stdout (`--json`).
    Json,
}

impl Shown {
    pub(super) fn of(quiet: bool, json: bool) -> Self {
        match (json, quiet) {
            (true, _) => Self::Json,
            (false, true) => Self::Reply,
            (false, false) => Self::Activity,
        }
    }

    fn stream(self) -> Stream {
        match self {
            Self::Activity => Stream::new(true),
            Self::Reply => Stream::new(false),
            Self::Json => Stream {
                json: true,
                ..Stream::new(false)
            },
        }
    }
}

/// A tool item's status as the protocol writes it.
fn tool_status(status: ToolStatus) -> &'static str {
    match status {
        ToolStatus::Running => "running",
        ToolStatus::Complete => "complete",
        ToolStatus::Error => "error",
    }
}

/// An ended reply's status as the protocol writes it (its stop reason, when complete).
fn reply_status(status: kernel::protocol::AssistantStatus) -> &'static str {
    use kernel::protocol::{AssistantStatus, StopReason};
    match status {
        AssistantStatus::Streaming => "streaming",
        AssistantStatus::Complete(StopReason::Stop) => "stop",
        AssistantStatus::Complete(StopReason::Length) => "length",
        AssistantStatus::Complete(StopReason::ToolUse) => "toolUse",
        AssistantStatus::Error => "error",
        AssistantStatus::Aborted => "aborted",
    }
}

/// One JSON line on stdout.
fn json_line(value: serde_json::Value) {
    crate::cli::print(&format!("{value}\n"));
}

impl Stream {
    /// Shows the reply, and with `activity` also its tool calls, thinking
    /// and notices, on stderr (stdout stays the reply alone).
    pub(super) fn new(activity: bool) -> Self {
        Self {
            plain: Plain::new(Layout::Reply { activity }),
            follower: None,
            own_only: false,
            showing: false,
            deltas: 0,
            interrupted: false,
            json: false,
        }
    }

    /// Writes what `plain` made of the updates.
    fn flush(&mut self, out: Out) {
        if !out.side.is_empty() {
            eprint!("{}", out.side);
        }
        crate::cli::print(&out.main);
    }

    /// Writes `text` on stdout as it is.
    pub(super) fn write(&mut self, text: &str) {
        let mut out = Out::default();
        self.plain.write(text, &mut out);
        self.flush(out);
    }

    /// A line on stderr, on a line of its own on a shared terminal.
    pub(super) fn note(&mut self, text: &str) {
        let mut out = Out::default();
        self.plain.note(text, &mut out);
        self.flush(out);
    }

    /// Ends the current line, if one is open.
    pub(super) fn end_line(&mut self) {
        let mut out = Out::default();
        self.plain.end_line(&mut out);
        self.flush(out);
    }

    /// Follows `snapshot`'s session from here on: what it holds is shown.
    pub(super) fn follow(&mut self, snapshot: &SessionSnapshot) {
        let mut follower = Follower::new(snapshot.id.clone());
        follower.resume(snapshot);
        self.follower = Some(follower);
    }

    /// Shows only the turn of `text`, which this client is about to send.
    pub(super) fn expect_own(&mut self, text: &str) {
        if let Some(follower) = &mut self.follower {
            follower.expect_own(text);
        }
        self.own_only = true;
        self.showing = false;
    }

    /// Shows what `items` (a part of the session's transcript, in order)
    /// hold beyond what was shown.
    pub(super) fn tell(&mut self, items: &[TranscriptItem]) {
        let updates = match &mut self.follower {
            Some(follower) => follower.tell(items),
            None => return,
        };
        self.show(updates);
    }

    /// Progress may have been lost: only snapshots are trusted until one.
    pub(super) fn gap(&mut self) {
        if let Some(follower) = &mut self.follower {
            follower.gap();
        }
    }

    /// Writes the reply text `event` adds.
    pub(super) fn on_event(&mut self, event: &ServerEvent) {
        let updates = match &mut self.follower {
            Some(follower) => follower.on_event(event),
            None => return,
        };
        self.show(updates);
    }

    /// The turn ended with `snapshot`: writes what the stream missed of it.
    pub(super) fn finish(&mut self, snapshot: &SessionSnapshot) {
        let updates = match &mut self.follower {
            Some(follower) => follower.on_snapshot(snapshot),
            None => return,
        };
        self.show(updates);
        self.own_only = false;
    }

    pub(super) fn show(&mut self, updates: Vec<Update>) {
        if self.json {
            return self.show_json(updates);
        }
        let mut out = Out::default();
        for update in updates {
            match &update {
                Update::User { own: true, .. } => self.showing = true,
                // Told before the turn (a server that did not start): its own.
                Update::Notice { .. } => {}
                _ if self.own_only && !self.showing => continue,
                Update::Text { .. } => self.deltas += 1,
                _ => {}
            }
            self.plain.show(update, &mut out);
        }
        self.flush(out);
    }
}

impl Stream {
    /// The updates as JSON lines: notices, and everything of our turn.
    fn show_json(&mut self, updates: Vec<Update>) {
        use pi_config::json::to_json;
        use serde_json::json;
        for update in updates {
            let shown = self.showing || !self.own_only;
            let line = match update {
                Update::User { own: true, .. } => {
                    self.showing = true;
                    continue;
                }
                Update::Notice { text, .. } => json!({"type": "notice", "text": text}),
                _ if !shown => continue,
                Update::User { text, .. } => json!({"type": "user", "text": text}),
                Update::Text { item_id, delta } => {
                    self.deltas += 1;
                    json!({"type": "text", "item": item_id, "delta": delta})
                }
                Update::Thinking { item_id, delta } => {
                    json!({"type": "thinking", "item": item_id, "delta": delta})
                }
                Update::ToolCall {
                    tool_call_id,
                    tool_name,
                    input,
                } => json!({"type": "tool_call", "id": tool_call_id, "name": tool_name,
                    "input": to_json(&input)}),
                Update::Tool {
                    tool_call_id,
                    tool_name,
                    status,
                    content,
                    ..
                } => json!({"type": "tool", "id": tool_call_id, "name": tool_name,
                    "status": tool_status(status), "output": follow::text_of(&content)}),
                Update::Reply {
                    item_id,
                    status,
                    error_message,
                    usage,
                } => json!({"type": "reply_end", "item": item_id, "status": reply_status(status),
                    "error": error_message, "tokens": usage.map(|u| u.total_tokens)}),
            };
            json_line(line);
        }
    }
}

/// Sends a prompt and writes its reply's text deltas to `stream` until the
/// prompt's response arrives. With `sigint`, a first Ctrl-C aborts the turn
/// and a second gives up waiting.
pub(super) async fn stream_prompt(
    client: &Client,
    session_id: &str,
    text: &str,
    stream: &mut Stream,
    mut sigint: Option<&mut Signal>,
) -> Result<SessionSnapshot, String> {
    let mut events = client.events();
    let mut events_open = true;
    let mut status = client.status();
    let mut status_open = true;
    let mut aborting = false;
    let known = client.session_snapshot(session_id);
    if stream.follower.is_none()
        && let Some(snapshot) = &known
    {
        stream.follow(snapshot);
    }
    // A prompt or nothing, as the kernel's front decides: a session busy
    // with a turn refuses it (`prompt` never steers someone else's turn).
    let (phase, len) = known.map_or((SessionPhase::Idle, 0), |s| (s.phase, s.transcript.len()));
    let mut front = Front::new(phase, len);
    let request = prompt_request(&mut front, session_id, text)?;
    stream.expect_own(text);
    let prompt = client.front_request(session_id, &request);
    tokio::pin!(prompt);
    let outcome = loop {
        let interrupted = async {
            match sigint.as_mut() {
                Some(signal) => signal.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // First, so that no delta after a reconnection is written.
            biased;
            changed = status.changed(), if status_open => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        stream.gap();
                        // Stdout stays the reply alone: the notice goes to
                        // stderr, on a line of its own on a shared terminal.
                        stream.note(&format!("(lost the server: {reason}; reconnecting)"));
                    }
                    Status::Ready { reconnected: true, .. } => eprintln!("(reconnected)"),
                    _ => {}
                },
                Err(_) => status_open = false,
            },
            (outcome, snapshot) = &mut prompt => break outcome.map(|_| snapshot.expect("an answered prompt has its snapshot")),
            event = events.recv(), if events_open => match event {
                Ok(event) => stream.on_event(&event),
                // A hole in the deltas: write only from snapshots until one.
                Err(broadcast::error::RecvError::Lagged(_)) => stream.gap(),
                Err(broadcast::error::RecvError::Closed) => events_open = false,
            },
            _ = interrupted => {
                stream.end_line();
                stream.interrupted = true;
                if aborting {
                    return Err("interrupted".into());
                }
                aborting = true;
                eprintln!("aborting the turn (Ctrl-C again to stop waiting)");
                for output in front.step(front::Input::Abort) {
                    if let front::Output::Send { request, .. } = output
                        && let (Err(e), _) = client.front_request(session_id, &request).await
                    {
                        eprintln!("cannot abort: {e}");
                    }
                }
            }
        }
    };
    // Events that arrived before the response may still be queued.
    while let Ok(event) = events.try_recv() {
        stream.on_event(&event);
    }
    let snapshot = outcome.map_err(|e| format!("the prompt failed: {}", e))?;
    stream.finish(&snapshot);
    stream.end_line();
    Ok(snapshot)
}

/// What `prompt` sends, as the kernel's front decides: a prompt, or nothing
/// when a turn runs (`prompt` never steers someone else's turn).
fn prompt_request(
    front: &mut Front,
    session_id: &str,
    text: &str,
) -> Result<front::Request, String> {
    let step = front.step(front::Input::Prompt {
        text: text.to_owned(),
        tag: 1,
    });
    match step.into_iter().next() {
        Some(front::Output::Send { request, .. }) => Ok(request),
        Some(front::Output::HandBack { .. }) => Err(format!(
            "the prompt failed: busy: a turn is already running in session {session_id}"
        )),
        other => unreachable!("a prompt is sent or handed back, not {other:?}"),
    }
}

/// How a turn ended, from its final snapshot: `Ok(summary)` or `Err(problem)`.
pub(super) fn turn_outcome(snapshot: &SessionSnapshot) -> Result<String, String> {
    let summary = format!(
        "revision {}, {} transcript items",
        snapshot.revision,
        snapshot.transcript.len()
    );
    // The turn starts at its (last) user message.
    let base = snapshot
        .transcript
        .iter()
        .rposition(|item| matches!(item, TranscriptItem::User(_)))
        .unwrap_or(0);
    match follow::turn_outcome(snapshot, base) {
        TurnOutcome::Completed => Ok(summary),
        TurnOutcome::MaxTokens => Ok(format!("{summary}; the reply was cut at the output limit")),
        TurnOutcome::Aborted { tool: None } => Err("the turn was aborted".into()),
        TurnOutcome::Aborted { tool: Some(tool) } => {
            Err(format!("the turn was aborted during the {tool} tool call"))
        }
        TurnOutcome::Failed { message } => Err(format!("the model reported an error: {message}")),
    }
}

// ---------------------------------------------------------------------------
// prompt

/// Which session `prompt` and `attach` mean.
#[derive(Debug, Clone)]
pub(super) enum Which {
    /// A session id, a unique prefix of one, or a name.
    Query(String),
    /// The most recently active session of this working directory.
    Last,
}

/// The server and session id `which` means.
pub(super) async fn which_session(
    target: &Target,
    which: &Which,
) -> Result<(Client, String), String> {
    match which {
        Which::Query(query) => session_server(target, query).await,
        Which::Last => super::discover::latest_here(target).await,
    }
}

pub(super) async fn run_prompt(
    target: &Target,
    which: &Which,
    text: &str,
    images: &[Content],
    shown: Shown,
) -> Result<(), Failure> {
    let (client, id) = which_session(target, which).await?;
    if let Some(server_id) = super::commands::speaks_v8(target, &client) {
        client.close().await;
        let client = super::commands::connect_v8(target, &server_id).await?;
        let result = prompt_v8(&client, &id, text, images, shown).await;
        let _ = client.detach().await;
        return result;
    }
    if !images.is_empty() {
        client.close().await;
        return Err(Failure::from(NO_IMAGES_OVER_V1.to_owned()));
    }
    let result = prompt_attached(&client, &id, text, shown).await;
    let _ = client.detach(&id).await;
    client.close().await;
    result
}

/// Why `--image` needs protocol v8, and how to get it.
const NO_IMAGES_OVER_V1: &str = "images go with a prompt over protocol v8 only, which needs \
     the server's local socket and no token (its permissions guard it)";

/// Reads `--image` files: PNG, JPEG, GIF or WebP by their first bytes, at
/// most `MAX_PROMPT_IMAGE_BYTES` together, as image parts.
pub(super) fn read_images(paths: &[std::path::PathBuf]) -> Result<Vec<Content>, String> {
    use base64::Engine;
    use std::io::Read;
    let mut total = 0u64;
    let mut parts = Vec::new();
    for path in paths {
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mut bytes = Vec::new();
        let room = crate::limits::MAX_PROMPT_IMAGE_BYTES - total;
        file.take(room + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {shown}: {e}"))?;
        total += bytes.len() as u64;
        if total > crate::limits::MAX_PROMPT_IMAGE_BYTES {
            let max = crate::limits::MAX_PROMPT_IMAGE_BYTES / (1024 * 1024);
            return Err(format!(
                "the images of one prompt are at most {max} MiB together; {shown} goes past it"
            ));
        }
        let mime_type = match bytes.as_slice() {
            [0x89, b'P', b'N', b'G', ..] => "image/png",
            [0xff, 0xd8, 0xff, ..] => "image/jpeg",
            [b'G', b'I', b'F', b'8', ..] => "image/gif",
            [
                b'R',
                b'I',
                b'F',
                b'F',
                _,
                _,
                _,
                _,
                b'W',
                b'E',
                b'B',
                b'P',
                ..,
            ] => "image/webp",
            _ => {
                return Err(format!(
                    "{shown} is not a PNG, JPEG, GIF or WebP image (the types models take)"
                ));
            }
        };
        parts.push(Content::Image {
            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
            mime_type: mime_type.into(),
        });
    }
    Ok(parts)
}

/// `exec`: a new session, one prompt streamed, and its id on stderr.
pub(super) async fn run_exec(
    target: &Target,
    params: kernel::protocol::CreateParams,
    text: &str,
    images: &[Content],
    shown: Shown,
) -> Result<(), Failure> {
    let client = super::activate::connect(target).await?;
    if let Some(server_id) = super::commands::speaks_v8(target, &client) {
        client.close().await;
        return exec_v8(target, &server_id, params, text, images, shown).await;
    }
    if !images.is_empty() {
        client.close().await;
        return Err(Failure::from(NO_IMAGES_OVER_V1.to_owned()));
    }
    let created = client
        .create(params)
        .await
        .map_err(|e| format!("cannot create the session: {e}"));
    let result = match created {
        Ok(session) => {
            if shown == Shown::Json {
                json_line(serde_json::json!({"type": "session", "id": session.id}));
            }
            let result = prompt_attached(&client, &session.id, text, shown).await;
            if shown == Shown::Activity {
                eprintln!(
                    "(session {}: `pi-server prompt {} ...` goes on with it)",
                    session.id,
                    &session.id[..8.min(session.id.len())]
                );
            }
            let _ = client.detach(&session.id).await;
            result
        }
        Err(e) => Err(Failure::from(e)),
    };
    client.close().await;
    result
}

/// Exits 130 when Ctrl-C stopped the turn, with the one message that says
/// how it ended (aborted, in a tool call or not).
pub(super) async fn prompt_attached(
    client: &Client,
    id: &str,
    text: &str,
    shown: Shown,
) -> Result<(), Failure> {
    client
        .attach(id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;
    let mut stream = shown.stream();
    let outcome = stream_prompt(client, id, text, &mut stream, Some(&mut sigint)).await;
    let outcome = outcome.and_then(|snapshot| turn_outcome(&snapshot).map(drop));
    finish_prompt(id, outcome, &stream, shown)
}

/// The prompt's end: a JSON line with `--json`, and the exit (130 when
/// Ctrl-C stopped the turn) with the one message that says how it ended.
fn finish_prompt(
    id: &str,
    outcome: Result<(), String>,
    stream: &Stream,
    shown: Shown,
) -> Result<(), Failure> {
    if shown == Shown::Json {
        let end = match &outcome {
            Ok(()) => serde_json::json!({"type": "turn_end", "session": id, "ok": true}),
            Err(message) => {
                serde_json::json!({"type": "turn_end", "session": id, "ok": false, "error": message})
            }
        };
        json_line(end);
    }
    match outcome {
        Err(message) if stream.interrupted => {
            eprintln!("pi-server: {message}");
            Err(Failure::interrupted())
        }
        other => other.map_err(Failure::from),
    }
}

// ---------------------------------------------------------------------------
// over v8

/// `exec` over v8: a new session (our `pi-server.sessions.create`, with
/// `params`), one prompt streamed, its id on stderr.
async fn exec_v8(
    target: &Target,
    server_id: &str,
    params: kernel::protocol::CreateParams,
    text: &str,
    images: &[Content],
    shown: Shown,
) -> Result<(), Failure> {
    use kernel::chord::call::ServiceCall;
    use kernel::client::v8::connection::SESSIONS;
    use kernel::wire::Value;
    let client = super::commands::connect_v8(target, server_id).await?;
    let mut args = Vec::new();
    if let Some(cwd) = &params.cwd {
        args.push(("cwd", Value::text(cwd)));
    }
    if let Some(name) = &params.name {
        args.push(("name", Value::text(name)));
    }
    if let Some(model) = &params.model {
        let model = Value::object(vec![
            ("provider", Value::text(&model.provider)),
            ("modelId", Value::text(&model.id)),
        ]);
        args.push(("model", model));
    }
    if let Some(level) = params.thinking_level {
        args.push(("thinkingLevel", Value::text(level.as_str())));
    }
    let create = ServiceCall::singleton(SESSIONS, "create", vec![Value::object(args)]);
    let created = client
        .server(create)
        .await
        .map_err(|e| format!("cannot create the session: {e}"))?;
    let Some(Value::Text(id)) = created.as_ref().and_then(|c| c.get("sessionId")) else {
        return Err(Failure::from(
            "the server created a session without an id".to_owned(),
        ));
    };
    if shown == Shown::Json {
        json_line(serde_json::json!({"type": "session", "id": id}));
    }
    let result = prompt_v8(&client, id, text, images, shown).await;
    if shown == Shown::Activity {
        eprintln!(
            "(session {id}: `pi-server prompt {} ...` goes on with it)",
            &id[..8.min(id.len())]
        );
    }
    let _ = client.detach().await;
    result
}

/// `prompt` over v8: the session attached, the reply streamed from its
/// transcript replica (what the turn adds), Ctrl-C an abort; exits as the
/// v1 path does. A reconnection during the turn is waited out: the turn's
/// end is then read from the replica ([`Conversation::settled`]).
async fn prompt_v8(
    client: &pi_client::v8::V8Client,
    id: &str,
    text: &str,
    images: &[Content],
    shown: Shown,
) -> Result<(), Failure> {
    use kernel::client::v8::calls::{self, Outcome};
    use kernel::client::v8::connection::Changed;
    use kernel::client::v8::conversation::Conversation;
    client
        .attach(id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;
    let mut stream = shown.stream();
    let mut changes = client.changes();
    let mut status = client.status();
    let mut conversation = Conversation::default();
    let read = |conversation: &mut Conversation| client.read(|c| conversation.follow(c, id));
    let (head, _) =
        read(&mut conversation).ok_or_else(|| format!("session {id} is not attached"))?;
    stream.follow(&SessionSnapshot {
        transcript: conversation.items().to_vec(),
        ..head.clone()
    });
    let base = conversation.finished().len();
    let mut front = Front::new(head.phase, conversation.items().len());
    let request = prompt_request(&mut front, id, text)?;
    stream.expect_own(text);
    let call = calls::with_images(calls::request_of(id, &request), images);
    let prompt = async {
        let result = client.request(call).await;
        match calls::outcome_of(&request, result) {
            Outcome::Answer(answer) => answer.map(drop),
            Outcome::Wait(wait) => calls::prompt_ended(client.request(wait).await).map(drop),
        }
    };
    tokio::pin!(prompt);
    let mut waiting = true;
    let mut aborting = false;
    let outcome: Result<(), String> = loop {
        tokio::select! {
            biased;
            changed = status.changed() => match changed {
                Ok(()) => match &*status.borrow_and_update() {
                    Status::Reconnecting { reason } => {
                        stream.note(&format!("(lost the server: {reason}; reconnecting)"));
                    }
                    Status::Ready { reconnected: true, .. } => eprintln!("(reconnected)"),
                    Status::Closed { error } => break Err(format!("the prompt failed: {error}")),
                    Status::Ready { .. } => {}
                },
                Err(_) => break Err("the client ended".into()),
            },
            // The turn ended (or the wait was cut off by a reconnection):
            // done once the replica shows it ended, which the answer may
            // have overtaken.
            ended = &mut prompt, if waiting => match ended {
                // (A wait cut off by a reconnection is `Ok` too: admitted.)
                Ok(()) => {
                    waiting = false;
                    if let Some((_, from)) = read(&mut conversation) {
                        stream.tell(&conversation.items()[from..]);
                    }
                    if conversation.settled(base, text) {
                        break Ok(());
                    }
                }
                Err(e) => break Err(format!("the prompt failed: {e}")),
            },
            change = changes.recv() => {
                if matches!(change, Err(broadcast::error::RecvError::Closed)) {
                    break Err("the client ended".into());
                }
                if matches!(change, Ok(Changed::Route(None))) {
                    continue;
                }
                if let Some((_, from)) = read(&mut conversation) {
                    stream.tell(&conversation.items()[from..]);
                    if !waiting && conversation.settled(base, text) {
                        break Ok(());
                    }
                }
            }
            _ = sigint.recv() => {
                stream.end_line();
                stream.interrupted = true;
                if aborting {
                    break Err("interrupted".into());
                }
                aborting = true;
                eprintln!("aborting the turn (Ctrl-C again to stop waiting)");
                for output in front.step(front::Input::Abort) {
                    if let front::Output::Send { request, .. } = output
                        && let Err(e) = client.request(calls::request_of(id, &request)).await
                    {
                        eprintln!("cannot abort: {e}");
                    }
                }
            }
        }
    };
    // What arrived with the turn's end.
    if let Some((_, from)) = read(&mut conversation) {
        stream.tell(&conversation.items()[from..]);
    }
    stream.end_line();
    let outcome = outcome.and_then(|()| {
        let snapshot = SessionSnapshot {
            transcript: conversation.finished().to_vec(),
            ..head
        };
        turn_outcome(&snapshot).map(drop)
    });
    finish_prompt(id, outcome, &stream, shown)
}
