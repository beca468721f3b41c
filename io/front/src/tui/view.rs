//! The terminal UI's state, without a terminal: what the transcript shows,
//! what the input line holds, and what a key asks for.
//!
//! The host ([`super::run`]) feeds it server events, connection status,
//! keys, pastes and the results of the requests it made, and carries out the
//! [`Action`]s it returns; [`super::render`] draws it. What is new in the
//! session is decided by the kernel's [`Follower`] (one decision for every
//! front end); this module decides only what the user sees and typed.
//!
//! Invariants:
//! - Invariant: every text that came from the model, a tool or another
//!   client is [`sanitize`]d before it is stored, so no control character
//!   reaches the terminal.
//! - Invariant: one Enter sends one message, whatever it holds (a paste of
//!   several lines is one message); it is a prompt when the session is idle
//!   and a steer while a turn runs ([`View::busy`]), and the input's title
//!   says which first.

use crate::text::sanitize;
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use kernel::client::ClientError;
use kernel::client::follow::{self, Follower, TurnOutcome, Update};
use kernel::client::front::{self, Answer, Front, Link, Notice, Output, Request, Why};
use kernel::client::slash;
use kernel::client::v8::approvals::Shown;
use kernel::protocol::{
    AssistantStatus, ServerEvent, SessionPhase, SessionSnapshot, ThinkingLevel, ToolStatus,
    TranscriptItem,
};
use std::collections::BTreeMap;

/// How much of the stored history `attach` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum History {
    /// The last N turns.
    Last(usize),
    /// Everything.
    All,
}

impl std::str::FromStr for History {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(Self::All);
        }
        s.parse()
            .map(Self::Last)
            .map_err(|_| format!("expected a number of turns or `all`, got `{s}`"))
    }
}

/// What the host must do for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send a request the session's [`Front`] decided on; its answer comes
    /// back as a [`Done`] with the same call.
    Send {
        /// The front's token for it.
        call: u64,
        /// What to send.
        request: Request,
    },
    /// Detach and leave.
    Detach,
    /// A slash command the host carries out: it needs the client (listings,
    /// a new session, switching, export); what comes of it comes back as
    /// [`View::info`] or [`View::warn`].
    Local(slash::Command),
    /// Load earlier turns ([`View::show_older`]) from the session the
    /// client holds.
    ShowOlder,
}

/// The answer to an [`Action::Send`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Done {
    /// The call answered.
    pub(crate) call: u64,
    /// Its outcome, for the front.
    pub(crate) outcome: Result<Answer, ClientError>,
    /// The answer's snapshot (a prompt's is its turn's end).
    pub(crate) snapshot: Option<Box<SessionSnapshot>>,
}

/// How a notice looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Info,
    Warn,
    Error,
}

/// One entry of the transcript as shown.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Block {
    /// A user message; `other` when another client sent it.
    User { text: String, other: bool },
    /// An assistant reply: its text (markdown), its thinking, whether it
    /// ended, and how, when that was an error or an abort.
    Reply {
        item_id: String,
        text: String,
        thinking: String,
        ended: bool,
        problem: Option<String>,
    },
    /// A tool call: its title, its status (`None` until it runs) and output.
    Tool {
        call_id: String,
        title: String,
        status: Option<ToolStatus>,
        output: String,
    },
    /// A line from the UI itself: retries, errors, reconnection, turn ends.
    Notice { level: Level, text: String },
}

/// The status line's facts, from the latest snapshot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Status {
    pub(crate) session: String,
    pub(crate) name: Option<String>,
    pub(crate) model: String,
    pub(crate) thinking: ThinkingLevel,
    pub(crate) phase: SessionPhase,
    /// Tokens and cost of every reply in the session.
    pub(crate) tokens: u64,
    pub(crate) cost: f64,
    /// Tokens of the latest model call (its context and reply): how full
    /// the context window is.
    pub(crate) context: u64,
    /// Steers accepted and not yet taken into the turn.
    pub(crate) queued_steers: u64,
}

impl Status {
    /// The facts of `head` (a snapshot; its transcript is not read) and
    /// its transcript `items`.
    fn of(head: &SessionSnapshot, items: &[TranscriptItem]) -> Self {
        let snapshot = head;
        let (mut tokens, mut cost, mut context) = (0, 0.0, 0);
        for item in items {
            if let TranscriptItem::Assistant(a) = item
                && let Some(usage) = &a.usage
            {
                tokens += usage.total_tokens;
                cost += usage.cost.total;
                context = usage.total_tokens;
            }
        }
        Self {
            session: snapshot.id.clone(),
            name: snapshot.name.clone(),
            model: format!("{}/{}", snapshot.model.provider, snapshot.model.id),
            thinking: snapshot.thinking_level,
            phase: snapshot.phase,
            tokens,
            cost,
            context,
            queued_steers: snapshot.queued_steer_count,
        }
    }
}

/// The line being typed, with its cursor and the history of sent lines.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Editor {
    text: String,
    /// Byte offset into `text`, on a char boundary.
    cursor: usize,
    history: Vec<String>,
    /// While browsing: the history entry shown, and the draft it replaced.
    browsing: Option<(usize, String)>,
}

impl Editor {
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) fn cursor(&self) -> usize {
        self.cursor
    }

    fn insert(&mut self, text: &str) {
        self.browsing = None;
        self.text.insert_str(self.cursor, text);
        self.cursor += text.len();
    }

    fn prev_boundary(&self) -> usize {
        self.text[..self.cursor]
            .char_indices()
            .next_back()
            .map_or(0, |(i, _)| i)
    }

    fn next_boundary(&self) -> usize {
        self.text[self.cursor..]
            .chars()
            .next()
            .map_or(self.cursor, |c| self.cursor + c.len_utf8())
    }

    fn backspace(&mut self) {
        let start = self.prev_boundary();
        self.text.replace_range(start..self.cursor, "");
        self.cursor = start;
    }

    fn delete(&mut self) {
        let end = self.next_boundary();
        self.text.replace_range(self.cursor..end, "");
    }

    fn line_start(&self) -> usize {
        self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1)
    }

    fn line_end(&self) -> usize {
        self.text[self.cursor..]
            .find('\n')
            .map_or(self.text.len(), |i| self.cursor + i)
    }

    /// Ctrl-W: the word before the cursor, and the spaces after it.
    fn delete_word(&mut self) {
        let before = &self.text[..self.cursor];
        let trimmed = before.trim_end_matches([' ', '\t']);
        let start = trimmed
            .rfind(|c: char| c.is_whitespace())
            .map_or(0, |i| i + 1);
        self.text.replace_range(start..self.cursor, "");
        self.cursor = start;
    }

    fn clear(&mut self) {
        self.text.clear();
        self.cursor = 0;
        self.browsing = None;
    }

    /// Takes the text to send, remembering it in the history.
    fn take(&mut self) -> String {
        let text = std::mem::take(&mut self.text);
        self.cursor = 0;
        self.browsing = None;
        if !text.trim().is_empty() && self.history.last() != Some(&text) {
            self.history.push(text.clone());
        }
        text
    }

    fn show(&mut self, text: String) {
        self.text = text;
        self.cursor = self.text.len();
    }

    fn history_prev(&mut self) {
        let index = match &self.browsing {
            Some((0, _)) => return,
            Some((i, _)) => i - 1,
            None if self.history.is_empty() => return,
            None => self.history.len() - 1,
        };
        let draft = match self.browsing.take() {
            Some((_, draft)) => draft,
            None => self.text.clone(),
        };
        self.show(self.history[index].clone());
        self.browsing = Some((index, draft));
    }

    fn history_next(&mut self) {
        match self.browsing.take() {
            Some((i, draft)) if i + 1 >= self.history.len() => self.show(draft),
            Some((i, draft)) => {
                self.show(self.history[i + 1].clone());
                self.browsing = Some((i + 1, draft));
            }
            None => {}
        }
    }
}

/// The whole UI state of one attached session.
#[derive(Debug, Clone)]
pub(crate) struct View {
    follower: Follower,
    pub(crate) blocks: Vec<Block>,
    pub(crate) status: Status,
    pub(crate) editor: Editor,
    /// While the connection is being re-established: why it was lost.
    pub(crate) reconnecting: Option<String>,
    /// What typed lines become and what refused ones do (the kernel decides).
    front: Front,
    /// Lines scrolled up from the bottom of the transcript (0 follows it).
    pub(crate) scroll: usize,
    pub(crate) show_thinking: bool,
    /// Tool outputs shown whole (Ctrl-O), not cut to their first lines.
    pub(crate) expand_tools: bool,
    /// The tool call selected (Alt-Up/Alt-Down), whose output Ctrl-O
    /// expands or collapses alone.
    pub(crate) selected: Option<String>,
    /// Tool calls whose output is shown whole, one by one.
    pub(crate) expanded: std::collections::BTreeSet<String>,
    /// Advances with time while something runs (the spinner).
    pub(crate) tick: u64,
    /// The transcript length when the current turn started.
    turn_base: usize,
    /// The session was removed: the host leaves.
    pub(crate) removed: bool,
    /// Context windows of the server's models, by `provider/id`.
    pub(crate) windows: BTreeMap<String, u64>,
    /// The terminal has the focus (as far as it reports).
    pub(crate) focused: bool,
    /// A turn ended while the terminal was not focused: ring once.
    pub(crate) bell: bool,
    /// Earlier turns not loaded into `blocks` (`--history N`), and where
    /// the loaded part starts in the transcript.
    hidden_turns: usize,
    loaded_from: usize,
    /// The last draw showed the first block: scrolling up goes past it.
    pub(crate) top_drawn: bool,
    /// The question the session asks before a tool call runs, as lines
    /// ([`crate::text::question_lines`]); y, a and n answer it.
    pub(crate) asked: Option<Vec<String>>,
}

/// Turns loaded at a time when scrolling goes past the oldest shown.
pub(crate) const PAGE_TURNS: usize = 10;

/// Where each user message stands in `items`: the turns' starts.
fn user_items(items: &[TranscriptItem]) -> Vec<usize> {
    (items.iter().enumerate())
        .filter(|(_, item)| matches!(item, TranscriptItem::User(_)))
        .map(|(i, _)| i)
        .collect()
}

/// Why a line came back, as the input's notice says it.
/// `/help` in the terminal: the commands, then the keys.
fn help() -> String {
    format!(
        "{}\nkeys: Enter send · Alt-Enter/Ctrl-J newline · Tab complete a /command · \
         Ctrl-C/Esc abort (again: clear) · Ctrl-D detach · Ctrl-T thinking · \
         Alt-Up/Alt-Down select a tool call · Ctrl-O its whole output (none selected: all) · \
         PageUp/PageDown scroll (past the top: earlier turns) · Up/Down history · \
         y/a/n answer a tool call's question (nothing typed)",
        slash::help()
    )
}

/// Why a line came back, as every front end says it.
pub(crate) fn reason(why: &Why) -> String {
    match why {
        Why::Refused(e) => format!("refused: {}", sanitize(&e.to_string())),
        Why::Busy => "the session was busy".into(),
        Why::Lost(how) => format!(
            "the connection was lost while it was sent ({}); it may have run",
            sanitize(how)
        ),
        Why::Aborted => "the turn was aborted before it went out".into(),
        Why::Withdrawn => "the abort withdrew it before the model saw it".into(),
        Why::Closed => "the connection is closed".into(),
        Why::Invalid(why) => sanitize(why),
        Why::NotConnected => "not connected; try again once the server is back".into(),
    }
}

/// Spinner frames.
pub(crate) const SPINNER: [&str; 8] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧"];

impl View {
    /// A view of `snapshot`'s session showing `history` of its transcript.
    pub(crate) fn new(snapshot: &SessionSnapshot, history: History) -> Self {
        Self::open(snapshot, &snapshot.transcript, history)
    }

    /// A view of the session of `head` (a snapshot whose transcript is not
    /// read) whose transcript is `items`, showing `history` of it.
    pub(crate) fn open(head: &SessionSnapshot, items: &[TranscriptItem], history: History) -> Self {
        let snapshot = head;
        let mut view = Self {
            follower: Follower::new(snapshot.id.clone()),
            blocks: Vec::new(),
            status: Status::of(head, items),
            editor: Editor::default(),
            reconnecting: None,
            front: Front::new(snapshot.phase, items.len()),
            scroll: 0,
            show_thinking: false,
            expand_tools: false,
            selected: None,
            expanded: Default::default(),
            tick: 0,
            turn_base: turn_base(items),
            removed: false,
            windows: BTreeMap::new(),
            focused: true,
            bell: false,
            hidden_turns: 0,
            loaded_from: 0,
            top_drawn: false,
            asked: None,
        };
        // Only the turns shown are told: the older ones are skipped (a long
        // session's first screen costs its last turns, not its history).
        let users = user_items(items);
        let hidden = match history {
            History::Last(turns) => users.len().saturating_sub(turns),
            History::All => 0,
        };
        if hidden > 0 {
            let start = users.get(hidden).copied().unwrap_or(items.len());
            view.follower.skip(&items[..start]);
            (view.hidden_turns, view.loaded_from) = (hidden, start);
        }
        let updates = view.follower.tell(items);
        view.show_history(updates);
        view.note_hidden();
        view
    }

    /// Stored turns as blocks: history is not labelled by sender (the
    /// protocol does not record it).
    fn show_history(&mut self, updates: Vec<Update>) {
        for update in updates {
            match update {
                Update::User { text, .. } => self.blocks.push(Block::User {
                    text: sanitize(&text),
                    other: false,
                }),
                update => self.apply_one(update),
            }
        }
    }

    /// The first block says how many earlier turns are not loaded.
    fn note_hidden(&mut self) {
        let hidden = self.hidden_turns;
        if hidden > 0 {
            let s = if hidden == 1 { "" } else { "s" };
            let text = format!("… {hidden} earlier turn{s} (PageUp loads them)");
            self.blocks.insert(
                0,
                Block::Notice {
                    level: Level::Info,
                    text,
                },
            );
        }
    }

    /// Loads up to `turns` earlier turns of `snapshot` (the session as the
    /// client holds it) above the oldest shown: scrolling up pages them in.
    pub(crate) fn show_older(&mut self, items: &[TranscriptItem], turns: usize) {
        if self.hidden_turns == 0 || items.len() < self.loaded_from {
            return;
        }
        let before = &items[..self.loaded_from];
        let users = user_items(before);
        let take = turns.min(users.len());
        let start = match users.len() - take {
            0 => 0,
            kept => users[kept],
        };
        // The notice goes; the page is told into blocks of its own, above.
        if matches!(self.blocks.first(), Some(Block::Notice { .. })) {
            self.blocks.remove(0);
        }
        let shown = std::mem::take(&mut self.blocks);
        let updates = Follower::new(self.status.session.clone()).tell(&before[start..]);
        self.show_history(updates);
        self.blocks.extend(shown);
        self.hidden_turns = users.len() - take;
        self.loaded_from = start;
        self.note_hidden();
    }

    /// True while a turn runs or our prompt is on its way: Enter steers.
    pub(crate) fn busy(&self) -> bool {
        self.front.busy()
    }

    /// True while something runs that the spinner shows.
    pub(crate) fn animating(&self) -> bool {
        self.busy() || self.reconnecting.is_some()
    }

    /// A server event (any session; others are ignored). Held lines may go.
    pub(crate) fn on_event(&mut self, event: &ServerEvent) -> Vec<Action> {
        let updates = self.follower.on_event(event);
        self.apply(updates);
        match event {
            ServerEvent::SessionSnapshot { snapshot } if snapshot.id == self.status.session => {
                self.on_head(snapshot, &snapshot.transcript)
            }
            ServerEvent::SessionRemoved { session_id } if *session_id == self.status.session => {
                self.removed_now();
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// The session as a v8 connection follows it: `head` (a snapshot whose
    /// transcript is not read) and its transcript `items`, of which those
    /// from `from` on may be new or changed. Held lines may go.
    pub(crate) fn on_state(
        &mut self,
        head: &SessionSnapshot,
        items: &[TranscriptItem],
        from: usize,
    ) -> Vec<Action> {
        let updates = self.follower.tell(&items[from.min(items.len())..]);
        self.apply(updates);
        self.on_head(head, items)
    }

    /// The session's latest state: `head`'s facts, `items` its transcript.
    fn on_head(&mut self, head: &SessionSnapshot, items: &[TranscriptItem]) -> Vec<Action> {
        let snapshot = head;
        let actions = self.front_step(front::Input::Session {
            phase: snapshot.phase,
            transcript_len: items.len(),
        });
        let before = self.status.phase;
        self.status = Status::of(head, items);
        let now = snapshot.phase;
        if before == SessionPhase::Idle && now != SessionPhase::Idle {
            self.turn_base = turn_base(items);
        }
        if now == SessionPhase::Retry && before != SessionPhase::Retry {
            self.notice(
                Level::Warn,
                "the model reported a transient error; retrying…".into(),
            );
        }
        if now == SessionPhase::Compaction && before != SessionPhase::Compaction {
            self.notice(
                Level::Info,
                "compacting older history into a summary…".into(),
            );
        }
        if before != SessionPhase::Idle && now == SessionPhase::Idle {
            self.turn_ended(items);
        }
        actions
    }

    /// The session was removed: say so; the host leaves.
    pub(crate) fn removed_now(&mut self) {
        self.notice(Level::Error, "this session was removed".into());
        self.removed = true;
    }

    /// The line that says how a turn ended, when no reply says it.
    fn turn_ended(&mut self, items: &[TranscriptItem]) {
        if !self.focused {
            self.bell = true;
        }
        let base = turn_base(items).min(self.turn_base);
        // An aborted or failed reply says so itself; these endings have no reply to say it.
        match follow::turn_outcome_of(items, base) {
            TurnOutcome::MaxTokens => {
                self.notice(
                    Level::Warn,
                    "the reply was cut at the output token limit".into(),
                );
            }
            TurnOutcome::Aborted { tool: Some(tool) } => {
                self.notice(
                    Level::Warn,
                    format!("■ turn aborted during the {} tool call", sanitize(&tool)),
                );
            }
            TurnOutcome::Completed
            | TurnOutcome::Aborted { tool: None }
            | TurnOutcome::Failed { .. } => {}
        }
    }

    /// Progress may have been lost (the event reader fell behind).
    pub(crate) fn on_gap(&mut self) {
        self.follower.gap();
    }

    /// The connection was lost (`Some(reason)`) or is back (`None`); held
    /// lines may go.
    pub(crate) fn on_connection(&mut self, lost: Option<String>) -> Vec<Action> {
        match lost {
            Some(reason) => {
                self.follower.gap();
                if self.reconnecting.is_none() {
                    self.notice(
                        Level::Warn,
                        format!("lost the server ({}); reconnecting…", sanitize(&reason)),
                    );
                }
                self.reconnecting = Some(reason);
                self.front_step(front::Input::Link(Link::Reconnecting))
            }
            None => {
                self.reconnecting = None;
                self.front_step(front::Input::Link(Link::Up))
            }
        }
    }

    /// A request the host made finished.
    pub(crate) fn on_done(&mut self, done: Done) -> Vec<Action> {
        if let (Some(snapshot), Ok(Answer::Prompt { .. })) = (&done.snapshot, &done.outcome) {
            // Whatever the stream missed of the turn, then its end.
            let updates = self.follower.on_snapshot(snapshot);
            self.apply(updates);
            let was = self.status.phase;
            let mut actions = self.on_head(snapshot, &snapshot.transcript);
            if was == SessionPhase::Idle && snapshot.phase == SessionPhase::Idle {
                // The turn ran between two snapshots we never saw busy.
                self.turn_ended(&snapshot.transcript);
            }
            actions.extend(self.front_step(front::Input::Answered {
                call: done.call,
                outcome: done.outcome,
            }));
            return actions;
        }
        self.front_step(front::Input::Answered {
            call: done.call,
            outcome: done.outcome,
        })
    }

    /// Steps the front and shows what it says; returns what to send.
    fn front_step(&mut self, input: front::Input) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut back = Vec::new();
        for output in self.front.step(input) {
            match output {
                Output::Send { call, request, .. } => {
                    if let Request::Prompt(text) | Request::Steer(text) = &request {
                        self.follower.expect_own(text.clone());
                    }
                    actions.push(Action::Send { call, request });
                }
                Output::Local(slash::Command::Help) => self.notice(Level::Info, help()),
                Output::Local(slash::Command::Quit) => actions.push(Action::Detach),
                Output::Local(command) => actions.push(Action::Local(command)),
                Output::HandBack { text, why, .. } => {
                    self.notice(
                        Level::Warn,
                        format!("not sent ({}): back in the input", reason(&why)),
                    );
                    back.push(text);
                }
                Output::Notice(notice) => match notice {
                    Notice::Held { lines } => {
                        let s = if lines == 1 { "" } else { "s" };
                        self.notice(
                            Level::Info,
                            format!("{lines} message{s} held until the server is back"),
                        );
                    }
                    Notice::Reconnected => self.notice(Level::Info, "reconnected".into()),
                    Notice::NothingAsked => {
                        self.notice(Level::Warn, "no tool call waits for an answer".into())
                    }
                    Notice::Reconnecting | Notice::NothingToAbort => {}
                    Notice::Retrying { .. } => {
                        self.notice(Level::Info, "the session was busy; sending it again".into())
                    }
                    Notice::Aborting => self.notice(Level::Info, "aborting the turn…".into()),
                    Notice::Applied(line) => {
                        self.notice(Level::Info, format!("done: {}", sanitize(&line)))
                    }
                    Notice::AbortRefused(e) => self.notice(
                        Level::Error,
                        format!("cannot abort: {}", sanitize(&e.to_string())),
                    ),
                },
                Output::Finished => {}
            }
        }
        if !back.is_empty() {
            // Back into the input, before whatever was typed since.
            let mut text = back.join("\n");
            if !self.editor.text.is_empty() {
                text.push('\n');
            }
            let draft = std::mem::take(&mut self.editor.text);
            self.editor.show(sanitize(&text) + &draft);
        }
        actions
    }

    /// A bracketed paste: inserted whole, newlines kept, sent as one message.
    pub(crate) fn on_paste(&mut self, text: &str) {
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        self.editor.insert(&sanitize(&text));
    }

    /// The session's approvals changed: the question shown follows the
    /// oldest one waiting (a new one rings when the terminal is not focused).
    pub(crate) fn on_approvals(&mut self, shown: Option<Shown>) -> Vec<Action> {
        let asked = shown.as_ref().and_then(Shown::asked);
        let id = asked.map(|q| q.id.clone());
        if id.as_deref() == self.front.asked() {
            return Vec::new();
        }
        self.asked = asked.map(crate::text::question_lines);
        if asked.is_some() && !self.focused {
            self.bell = true;
        }
        self.front_step(front::Input::Asked(id))
    }

    /// A key; returns what the host must do.
    pub(crate) fn on_key(&mut self, key: KeyEvent) -> Vec<Action> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        // y, a and n answer the question shown while nothing is typed.
        if let KeyCode::Char(c) = key.code
            && !key
                .modifiers
                .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
            && self.editor.text.is_empty()
            && let Some(decision) = self.front.key_answer(c)
        {
            return self.front_step(front::Input::Decide(decision));
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        match key.code {
            KeyCode::Char('c') if ctrl => return self.interrupt(),
            KeyCode::Char('d') if ctrl => {
                if self.editor.text.is_empty() {
                    return vec![Action::Detach];
                }
                self.editor.delete();
            }
            KeyCode::Enter if alt => self.editor.insert("\n"),
            KeyCode::Char('j') if ctrl => self.editor.insert("\n"),
            KeyCode::Enter => return self.submit(),
            KeyCode::Char('t') if ctrl => self.show_thinking = !self.show_thinking,
            KeyCode::Char('o') if ctrl => match &self.selected {
                Some(call) if !self.expanded.remove(call) => {
                    self.expanded.insert(call.clone());
                }
                Some(_) => {}
                None => self.expand_tools = !self.expand_tools,
            },
            KeyCode::Up if alt => self.select_tool(true),
            KeyCode::Down if alt => self.select_tool(false),
            KeyCode::Char('a') if ctrl => self.editor.cursor = self.editor.line_start(),
            KeyCode::Char('e') if ctrl => self.editor.cursor = self.editor.line_end(),
            KeyCode::Char('u') if ctrl => {
                let start = self.editor.line_start();
                self.editor
                    .text
                    .replace_range(start..self.editor.cursor, "");
                self.editor.cursor = start;
            }
            KeyCode::Char('w') if ctrl => self.editor.delete_word(),
            KeyCode::Char(c) if !ctrl => self.editor.insert(c.encode_utf8(&mut [0; 4])),
            KeyCode::Esc => return self.interrupt(),
            KeyCode::Tab => self.complete(),
            KeyCode::Backspace => self.editor.backspace(),
            KeyCode::Delete => self.editor.delete(),
            KeyCode::Left => self.editor.cursor = self.editor.prev_boundary(),
            KeyCode::Right => self.editor.cursor = self.editor.next_boundary(),
            KeyCode::Home => self.editor.cursor = self.editor.line_start(),
            KeyCode::End if ctrl => self.scroll = 0,
            KeyCode::End => self.editor.cursor = self.editor.line_end(),
            KeyCode::Up => self.editor.history_prev(),
            KeyCode::Down => self.editor.history_next(),
            KeyCode::PageUp => {
                self.scroll += 10;
                // Past the oldest turn shown: the host pages earlier ones in.
                if self.top_drawn && self.hidden_turns > 0 {
                    return vec![Action::ShowOlder];
                }
            }
            KeyCode::PageDown => self.scroll = self.scroll.saturating_sub(10),
            _ => {}
        }
        Vec::new()
    }

    /// Alt-Up / Alt-Down: selects the tool call before (older) or after the
    /// selected one; from none, Up takes the newest; past the newest, none.
    fn select_tool(&mut self, older: bool) {
        let calls: Vec<&String> = (self.blocks.iter())
            .filter_map(|b| match b {
                Block::Tool { call_id, .. } => Some(call_id),
                _ => None,
            })
            .collect();
        let at = self
            .selected
            .as_ref()
            .and_then(|s| calls.iter().position(|c| *c == s));
        let next = match (at, older) {
            (None, true) => calls.len().checked_sub(1),
            (None, false) => None,
            (Some(i), true) => Some(i.saturating_sub(1)),
            (Some(i), false) => (i + 1 < calls.len()).then_some(i + 1),
        };
        self.selected = next.map(|i| calls[i].clone());
    }

    /// Tab: completes a slash command's name (and lists the candidates when
    /// there are several); elsewhere, four spaces.
    fn complete(&mut self) {
        let candidates = slash::complete(&self.editor.text);
        match candidates.as_slice() {
            [] => self.editor.insert("    "),
            [one] => self.editor.show(format!("{one} ")),
            many => {
                let common = many.iter().fold(many[0].to_owned(), |common, name| {
                    common
                        .chars()
                        .zip(name.chars())
                        .take_while(|(a, b)| a == b)
                        .map(|(a, _)| a)
                        .collect()
                });
                self.editor.show(common);
                self.notice(Level::Info, many.join("  "));
            }
        }
    }

    /// Something the host did for a slash command.
    pub(crate) fn info(&mut self, text: &str) {
        self.notice(Level::Info, sanitize(text));
    }

    /// Something the host could not do for a slash command.
    pub(crate) fn warn(&mut self, text: &str) {
        self.notice(Level::Warn, sanitize(text));
    }

    /// Ctrl-C: aborts a running turn; pressed again, or when idle, clears the input.
    fn interrupt(&mut self) -> Vec<Action> {
        if self.busy() && !self.front.aborting() {
            return self.front_step(front::Input::Abort);
        }
        if self.editor.text.is_empty() && !self.busy() {
            self.notice(Level::Info, "Ctrl-D detaches".into());
        }
        self.editor.clear();
        Vec::new()
    }

    fn submit(&mut self) -> Vec<Action> {
        if self.editor.text.trim().is_empty() {
            return Vec::new();
        }
        let text = self.editor.take();
        self.scroll = 0;
        self.front_step(front::Input::Typed(text))
    }

    fn notice(&mut self, level: Level, text: String) {
        self.blocks.push(Block::Notice { level, text });
    }

    fn apply(&mut self, updates: Vec<Update>) {
        for update in updates {
            self.apply_one(update);
        }
    }

    fn apply_one(&mut self, update: Update) {
        match update {
            Update::User { text, own, .. } => self.blocks.push(Block::User {
                text: sanitize(&text),
                other: !own,
            }),
            Update::Notice { text, .. } => self.blocks.push(Block::Notice {
                level: Level::Warn,
                text: format!("⚠ {}", sanitize(&text)),
            }),
            Update::Text { item_id, delta } => {
                if let Some(Block::Reply { text, .. }) = self.reply(&item_id) {
                    text.push_str(&sanitize(&delta));
                }
            }
            Update::Thinking { item_id, delta } => {
                if let Some(Block::Reply { thinking, .. }) = self.reply(&item_id) {
                    thinking.push_str(&sanitize(&delta));
                }
            }
            Update::ToolCall {
                tool_call_id,
                tool_name,
                input,
            } => {
                if self.tool(&tool_call_id).is_none() {
                    self.blocks.push(Block::Tool {
                        call_id: tool_call_id,
                        title: sanitize(&follow::tool_title(&tool_name, &input)),
                        status: None,
                        output: String::new(),
                    });
                }
            }
            Update::Tool {
                tool_call_id,
                tool_name,
                input,
                status: new_status,
                content,
                ..
            } => {
                let text = sanitize(&follow::text_of(&content));
                match self.tool(&tool_call_id) {
                    Some(Block::Tool { status, output, .. }) => {
                        *status = Some(new_status);
                        *output = text;
                    }
                    _ => self.blocks.push(Block::Tool {
                        call_id: tool_call_id,
                        title: sanitize(&follow::tool_title(&tool_name, &input)),
                        status: Some(new_status),
                        output: text,
                    }),
                }
            }
            Update::Reply {
                item_id,
                status,
                error_message,
                ..
            } => {
                let why = error_message.as_deref().map(sanitize);
                let said = match status {
                    AssistantStatus::Error => Some(format!(
                        "✗ the model reported an error: {}",
                        why.unwrap_or_else(|| "no message".into())
                    )),
                    AssistantStatus::Aborted => Some("■ turn aborted".to_string()),
                    _ => None,
                };
                if let Some(Block::Reply { ended, problem, .. }) = self.reply(&item_id) {
                    *ended = status != AssistantStatus::Streaming;
                    *problem = said;
                }
            }
        }
    }

    /// The reply block of `item_id`, made when first told.
    fn reply(&mut self, item_id: &str) -> Option<&mut Block> {
        let found = self
            .blocks
            .iter()
            .rposition(|b| matches!(b, Block::Reply { item_id: id, .. } if id == item_id));
        let index = match found {
            Some(index) => index,
            None => {
                self.blocks.push(Block::Reply {
                    item_id: item_id.to_owned(),
                    text: String::new(),
                    thinking: String::new(),
                    ended: false,
                    problem: None,
                });
                self.blocks.len() - 1
            }
        };
        self.blocks.get_mut(index)
    }

    fn tool(&mut self, call_id: &str) -> Option<&mut Block> {
        self.blocks
            .iter_mut()
            .rev()
            .find(|b| matches!(b, Block::Tool { call_id: id, .. } if id == call_id))
    }
}

/// Where the current turn starts: its last user message.
fn turn_base(items: &[TranscriptItem]) -> usize {
    items
        .iter()
        .rposition(|item| matches!(item, TranscriptItem::User(_)))
        .unwrap_or(items.len())
}

#[cfg(test)]
mod tests;
