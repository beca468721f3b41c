//! The client side of one session, as every front end sees it: what a
//! typed line becomes and when it may go, what a refused or interrupted
//! line becomes, and where the user's turn starts. The terminal UI, the
//! CLI's line mode and `prompt`, and the ACP adapter drive it; none of
//! them decides any of this again.
//!
//! ```text
//!  Typed ──► held ──(link up; idle, no prompt of ours on its way)──► Prompt
//!              └────(link up; the server says a turn runs)─────────► Steer
//! ```
//!
//! **What a line becomes.** A typed line goes out as a prompt when the
//! session is idle and no prompt of ours is on its way; as a steer once the
//! server says a turn runs (a steer sent before the turn started would be
//! refused); otherwise, and while the connection is away, it is held, in
//! order. A request to start a turn now ([`Input::Prompt`]) is a prompt or
//! nothing: it is handed back at once when the session is busy.
//!
//! **What a refusal does (one rule).** A line that can wait, refused
//! because the session was not in the state it needed (`busy`: a steer
//! whose turn ended first, a prompt that met another client's turn), is
//! held again and decided afresh, at most [`MAX_RETRIES`] times; any other
//! refusal, and a line
//! whose call was lost with the connection (it cannot be known to have
//! run), is handed back to the user ([`Output::HandBack`]). An abort hands
//! back the lines still held and the steers it withdrew. So no typed line
//! is lost silently, and none is taken twice: a line is resent only after
//! the server refused it.
//!
//! **Where a turn starts.** At the transcript length the session had when
//! our prompt went out ([`Front::turn_start`]): its user item and
//! everything after it are the turn's.
//!
//! The machine takes no time (it has no deadline) and no bytes: its driver
//! sends the requests through a [`super::Client`] and reports answers,
//! phases and the connection's state.

use super::ClientError;
use super::slash::{self, Command, Line};
use crate::approval::{ApprovalPolicy, Decision};
use crate::protocol::{ErrorCode, ModelRef, SessionPhase, ThinkingLevel};
use std::collections::{BTreeMap, VecDeque};

/// How often a line refused for the session's state is decided again
/// before it is handed back.
pub const MAX_RETRIES: u8 = 2;

/// What a line is sent as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Start a turn.
    Prompt(String),
    /// Queue text into the running turn.
    Steer(String),
    /// End the running turn.
    Abort,
    /// Switch the model (`/model`).
    SetModel(ModelRef),
    /// Set the thinking level (`/thinking`).
    SetThinking(ThinkingLevel),
    /// Rename the session (`/name`).
    Rename(String),
    /// Summarise the older conversation now (`/compact [INSTRUCTIONS]`).
    Compact(Option<String>),
    /// Answer the question about tool item `id` (`/allow`, `/always`,
    /// `/deny`, or a key while it is shown).
    Answer {
        /// The question's tool item.
        id: String,
        /// The answer.
        decision: Decision,
    },
    /// Set the session's approval policy (`/approvals POLICY`).
    SetApprovals(ApprovalPolicy),
}

/// A call's answer, as the driver reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The prompt's turn ended; the session's phase after it.
    Prompt {
        /// The phase the answer's snapshot shows.
        phase: SessionPhase,
    },
    /// The steer was queued.
    Steer,
    /// The abort was taken; the steers it withdrew (the model never saw them).
    Abort {
        /// Their texts, oldest first.
        withdrawn: Vec<String>,
    },
    /// A setting (model, thinking level, name) was applied.
    Applied,
}

/// The connection as the front end's client reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Connected and attached.
    Up,
    /// Lost; a reconnection is under way.
    Reconnecting,
    /// Gone for good.
    Closed,
}

/// One input to [`Front::step`].
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The user entered a line (blank ones are ignored): text for the
    /// model, or a slash command ([`slash`]).
    Typed(String),
    /// A request to start a turn now (ACP's `session/prompt`): a prompt or
    /// nothing. It waits out a reconnection, but not a busy session: busy
    /// (a turn runs, ours or another client's), it is handed back at once,
    /// and a `busy` refusal hands it back too. `tag` comes back with what
    /// becomes of it, for the front end to answer the request it came with.
    Prompt {
        /// The text.
        text: String,
        /// The front end's name for it.
        tag: u64,
    },
    /// The user asks to end the running turn.
    Abort,
    /// No more lines will be typed (end of input).
    EndOfInput,
    /// The server's latest word on the session: its phase and transcript length.
    Session {
        /// Its phase.
        phase: SessionPhase,
        /// Items in its transcript.
        transcript_len: usize,
    },
    /// The question the session shows now (the oldest one waiting), or
    /// none ([`crate::approval::Approvals::pending`]).
    Asked(Option<String>),
    /// The user answered the question shown (a key, or `/allow`, `/always`,
    /// `/deny`).
    Decide(Decision),
    /// A call from an [`Output::Send`] finished.
    Answered {
        /// The call.
        call: u64,
        /// Its outcome.
        outcome: Result<Answer, ClientError>,
    },
    /// The connection changed.
    Link(Link),
}

/// Why a line came back to the user.
#[derive(Debug, Clone, PartialEq)]
pub enum Why {
    /// The server refused it (and it was not a matter of waiting).
    Refused(ClientError),
    /// The session was busy: a line that cannot wait found a turn running,
    /// or a line was refused for the session's state [`MAX_RETRIES`] times.
    Busy,
    /// Its call was lost with the connection: it may or may not have run.
    Lost(String),
    /// The user aborted before it went out.
    Aborted,
    /// The abort withdrew it before the model saw it.
    Withdrawn,
    /// The connection is closed for good.
    Closed,
    /// A slash command that is none as written ([`slash::Line::Invalid`]).
    Invalid(String),
    /// A setting asked while the connection is away (it is not held: the
    /// session may have changed meanwhile).
    NotConnected,
}

/// Something the front end tells the user.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// Lines are held until the connection is back.
    Held {
        /// How many.
        lines: usize,
    },
    /// The connection was lost; a reconnection is under way.
    Reconnecting,
    /// The connection is back.
    Reconnected,
    /// A refused line goes again, as a prompt or a steer.
    Retrying {
        /// The line.
        text: String,
    },
    /// An abort was asked with no turn running.
    NothingToAbort,
    /// An abort went out.
    Aborting,
    /// The abort was refused.
    AbortRefused(ClientError),
    /// A slash command's setting was applied: the line that asked for it.
    Applied(String),
    /// An answer was given with no question waiting.
    NothingAsked,
}

/// One output of [`Front::step`], carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send `request`; report its answer as [`Input::Answered`] with `call`.
    Send {
        /// A token unique within this machine.
        call: u64,
        /// What to send.
        request: Request,
        /// The line's tag ([`Input::Prompt`]; 0 for a typed line or an abort).
        tag: u64,
    },
    /// Give the line back to the user (the TUI puts it in the input, a
    /// line-mode CLI prints it, ACP answers with the reason).
    HandBack {
        /// The line.
        text: String,
        /// Why.
        why: Why,
        /// Its tag (0 for a typed line).
        tag: u64,
    },
    /// Tell the user.
    Notice(Notice),
    /// A slash command for the front end itself to carry out (help, quit,
    /// listings, switching sessions, export): nothing goes to the server
    /// from the front.
    Local(Command),
    /// Input ended, every line went out or came back, and no turn of ours runs.
    Finished,
}

#[derive(Debug, Clone, PartialEq)]
struct Held {
    text: String,
    /// Only a prompt will do: it was asked for as one, or a steer of it was
    /// refused because no turn ran.
    prompt_only: bool,
    /// Asked for as a prompt ([`Input::Prompt`]): never a steer.
    explicit: bool,
    retries: u8,
    tag: u64,
}

#[derive(Debug, Clone, PartialEq)]
enum Sent {
    Prompt(Held),
    Steer(Held),
    Abort,
    /// A slash command's setting: its line, and what it asks.
    Setting {
        line: String,
        request: Request,
    },
}

/// The client side of one session. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Front {
    phase: SessionPhase,
    transcript_len: usize,
    link: Link,
    held: VecDeque<Held>,
    sent: BTreeMap<u64, Sent>,
    /// The call of our prompt on its way, if one is.
    prompting: Option<u64>,
    aborting: bool,
    ended: bool,
    finished: bool,
    turn_start: Option<usize>,
    /// The question the session shows, if one waits (its tool item).
    asked: Option<String>,
    next_call: u64,
    out: Vec<Output>,
}

impl Front {
    /// A session as its attach showed it.
    pub fn new(phase: SessionPhase, transcript_len: usize) -> Self {
        Self {
            phase,
            transcript_len,
            link: Link::Up,
            held: VecDeque::new(),
            sent: BTreeMap::new(),
            prompting: None,
            aborting: false,
            ended: false,
            finished: false,
            turn_start: None,
            asked: None,
            next_call: 1,
            out: Vec::new(),
        }
    }

    /// Processes one input; returns what to do, in order.
    pub fn step(&mut self, input: Input) -> Vec<Output> {
        match input {
            Input::Typed(text) => self.typed(text),
            Input::Prompt { text, tag } => self.hold(text, true, tag),
            Input::Abort => self.on_abort(),
            Input::EndOfInput => self.ended = true,
            Input::Session {
                phase,
                transcript_len,
            } => {
                if phase == SessionPhase::Idle {
                    self.aborting = false;
                }
                self.phase = phase;
                self.transcript_len = transcript_len;
            }
            Input::Answered { call, outcome } => self.on_answer(call, outcome),
            Input::Link(link) => self.on_link(link),
            Input::Asked(asked) => self.asked = asked,
            Input::Decide(decision) => self.typed(format!("/{}", decision.as_str())),
        }
        self.pump();
        self.check();
        std::mem::take(&mut self.out)
    }

    /// Whether a turn runs or our prompt is on its way: what Enter would
    /// be, what the input box says, what Ctrl-C does.
    pub fn busy(&self) -> bool {
        self.prompting.is_some() || self.phase != SessionPhase::Idle
    }

    /// Whether an abort of ours is on its way or not yet seen to end the turn.
    pub fn aborting(&self) -> bool {
        self.aborting
    }

    /// The question waiting for an answer, if the session shows one.
    pub fn asked(&self) -> Option<&str> {
        self.asked.as_deref()
    }

    /// What key `key` answers while a question is shown and nothing is
    /// typed: `y` allows, `a` allows always, `n` denies; other keys, or no
    /// question, are typing.
    pub fn key_answer(&self, key: char) -> Option<Decision> {
        self.asked.as_ref()?;
        match key {
            'y' | 'Y' => Some(Decision::Allow),
            'a' | 'A' => Some(Decision::Always),
            'n' | 'N' => Some(Decision::Deny),
            _ => None,
        }
    }

    /// Lines typed and not sent yet.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The connection as last reported.
    pub fn link(&self) -> Link {
        self.link
    }

    /// Where our latest prompt's turn starts in the transcript (the length
    /// it had when the prompt went out).
    pub fn turn_start(&self) -> Option<usize> {
        self.turn_start
    }

    /// A typed line: text is held, a command carried out or handed on, an
    /// invalid one handed back.
    fn typed(&mut self, text: String) {
        if text.trim().is_empty() {
            return;
        }
        let request = match slash::parse(&text) {
            Line::Text(text) => return self.hold(text, false, 0),
            Line::Invalid(why) => {
                let (why, tag) = (Why::Invalid(why), 0);
                return self.out.push(Output::HandBack { text, why, tag });
            }
            Line::Command(Command::Abort) => return self.on_abort(),
            Line::Command(Command::Model(Some(model))) => Request::SetModel(model),
            Line::Command(Command::Thinking(Some(level))) => Request::SetThinking(level),
            Line::Command(Command::Name(name)) => Request::Rename(name),
            Line::Command(Command::Compact(instructions)) => Request::Compact(instructions),
            Line::Command(Command::Approvals(Some(policy))) => Request::SetApprovals(policy),
            Line::Command(Command::Decide(decision)) => match self.asked.clone() {
                Some(id) => Request::Answer { id, decision },
                None => return self.out.push(Output::Notice(Notice::NothingAsked)),
            },
            Line::Command(local) => return self.out.push(Output::Local(local)),
        };
        let why = match self.link {
            Link::Up => {
                self.call(Sent::Setting {
                    line: text,
                    request,
                });
                return;
            }
            Link::Reconnecting => Why::NotConnected,
            Link::Closed => Why::Closed,
        };
        self.out.push(Output::HandBack { text, why, tag: 0 });
    }

    /// A line entered: held (blank ones ignored), or handed back at once
    /// on a closed connection.
    fn hold(&mut self, text: String, prompt_only: bool, tag: u64) {
        if text.trim().is_empty() {
            return;
        }
        if self.link == Link::Closed {
            let why = Why::Closed;
            self.out.push(Output::HandBack { text, why, tag });
            return;
        }
        self.held.push_back(Held {
            text,
            prompt_only,
            explicit: prompt_only,
            retries: 0,
            tag,
        });
        if self.link == Link::Reconnecting {
            let lines = self.held.len();
            self.out.push(Output::Notice(Notice::Held { lines }));
        }
    }

    fn call(&mut self, sent: Sent) -> u64 {
        let call = self.next_call;
        self.next_call += 1;
        let (request, tag) = match &sent {
            Sent::Prompt(line) => (Request::Prompt(line.text.clone()), line.tag),
            Sent::Steer(line) => (Request::Steer(line.text.clone()), line.tag),
            Sent::Abort => (Request::Abort, 0),
            Sent::Setting { request, .. } => (request.clone(), 0),
        };
        self.sent.insert(call, sent);
        self.out.push(Output::Send { call, request, tag });
        call
    }

    fn hand_back(&mut self, line: Held, why: Why) {
        self.out.push(Output::HandBack {
            text: line.text,
            why,
            tag: line.tag,
        });
    }

    /// Sends what may go now.
    fn pump(&mut self) {
        while self.link == Link::Up
            && let Some(line) = self.held.front()
        {
            if self.phase != SessionPhase::Idle && !line.prompt_only {
                let line = self.held.pop_front().expect("a front");
                self.call(Sent::Steer(line));
            } else if self.busy() && line.explicit {
                let line = self.held.pop_front().expect("a front");
                self.hand_back(line, Why::Busy);
            } else if self.busy() {
                break;
            } else {
                let line = self.held.pop_front().expect("a front");
                self.turn_start = Some(self.transcript_len);
                let call = self.call(Sent::Prompt(line));
                self.prompting = Some(call);
            }
        }
        if self.ended
            && !self.finished
            && self.held.is_empty()
            && self.sent.is_empty()
            && !self.busy()
        {
            self.finished = true;
            self.out.push(Output::Finished);
        }
    }

    fn on_abort(&mut self) {
        if !self.busy() {
            self.out.push(Output::Notice(Notice::NothingToAbort));
            return;
        }
        for line in std::mem::take(&mut self.held) {
            self.hand_back(line, Why::Aborted);
        }
        if !self.aborting {
            self.aborting = true;
            self.out.push(Output::Notice(Notice::Aborting));
            self.call(Sent::Abort);
        }
    }

    fn on_answer(&mut self, call: u64, outcome: Result<Answer, ClientError>) {
        let Some(sent) = self.sent.remove(&call) else {
            return;
        };
        if self.prompting == Some(call) {
            self.prompting = None;
        }
        match (sent, outcome) {
            (Sent::Setting { line, .. }, Ok(_)) => {
                self.out.push(Output::Notice(Notice::Applied(line)))
            }
            (Sent::Setting { line: text, .. }, Err(error)) => {
                let why = failure(error);
                self.out.push(Output::HandBack { text, why, tag: 0 });
            }
            (Sent::Prompt(_), Ok(Answer::Prompt { phase })) => self.phase = phase,
            (Sent::Steer(_), Ok(_)) | (Sent::Prompt(_), Ok(_)) => {}
            (Sent::Abort, Ok(answer)) => {
                if let Answer::Abort { withdrawn } = answer {
                    for text in withdrawn {
                        let (why, tag) = (Why::Withdrawn, 0);
                        self.out.push(Output::HandBack { text, why, tag });
                    }
                }
            }
            (Sent::Abort, Err(error)) => {
                self.aborting = false;
                self.out.push(Output::Notice(Notice::AbortRefused(error)));
            }
            (Sent::Prompt(line), Err(error)) if is_busy(&error) && !line.explicit => {
                self.retry(line, false)
            }
            (Sent::Steer(line), Err(error)) if is_busy(&error) => self.retry(line, true),
            (Sent::Prompt(line) | Sent::Steer(line), Err(error)) => {
                self.hand_back(line, failure(error))
            }
        }
    }

    /// A line refused for the session's state: held again (first, since it
    /// was typed before the rest), or handed back after [`MAX_RETRIES`].
    /// A refused steer found no turn: only a prompt will do now. A refused
    /// prompt met a turn: it steers that one once the server shows it.
    fn retry(&mut self, mut line: Held, was_steer: bool) {
        let why = match self.link {
            Link::Closed => Some(Why::Closed),
            _ if line.retries >= MAX_RETRIES => Some(Why::Busy),
            _ => None,
        };
        if let Some(why) = why {
            return self.hand_back(line, why);
        }
        line.retries += 1;
        line.prompt_only = was_steer;
        if !was_steer && self.phase == SessionPhase::Idle {
            // The server just said a turn runs; its snapshot is on its way.
            self.phase = SessionPhase::Turn;
        }
        self.out.push(Output::Notice(Notice::Retrying {
            text: line.text.clone(),
        }));
        self.held.push_front(line);
    }

    fn on_link(&mut self, link: Link) {
        let was = self.link;
        self.link = link;
        match (was, link) {
            (Link::Up, Link::Reconnecting) => self.out.push(Output::Notice(Notice::Reconnecting)),
            (Link::Reconnecting, Link::Up) => self.out.push(Output::Notice(Notice::Reconnected)),
            (_, Link::Closed) => {
                for line in std::mem::take(&mut self.held) {
                    self.hand_back(line, Why::Closed);
                }
            }
            _ => {}
        }
    }

    /// The machine's invariants, asserted after every step in debug builds.
    pub fn invariants(&self) -> Result<(), String> {
        if let Some(call) = self.prompting
            && !matches!(self.sent.get(&call), Some(Sent::Prompt(_)))
        {
            return Err(format!("prompting {call} is not a prompt on its way"));
        }
        let prompts = self
            .sent
            .values()
            .filter(|s| matches!(s, Sent::Prompt(_)))
            .count();
        if prompts > 1 {
            return Err(format!("{prompts} prompts of ours on their way"));
        }
        if self.held.iter().any(|l| l.text.trim().is_empty()) {
            return Err("a blank line is held".into());
        }
        if self.held.iter().any(|l| l.retries > MAX_RETRIES) {
            return Err("a line was retried past the bound".into());
        }
        if self.link == Link::Closed && !self.held.is_empty() {
            return Err("lines held on a closed connection".into());
        }
        if self.finished && !(self.held.is_empty() && self.sent.is_empty()) {
            return Err("finished with lines left".into());
        }
        Ok(())
    }

    fn check(&self) {
        if cfg!(debug_assertions)
            && let Err(broken) = self.invariants()
        {
            panic!("front: {broken}");
        }
    }
}

/// Why a call's line comes back: lost with the connection (it may have
/// run), or refused.
fn failure(error: ClientError) -> Why {
    match error {
        ClientError::Disconnected(how) => Why::Lost(how),
        other => Why::Refused(other),
    }
}

/// A refusal that says the session was not in the state the line needed.
fn is_busy(error: &ClientError) -> bool {
    matches!(error, ClientError::Server(e) if e.code == ErrorCode::Busy)
}

#[cfg(test)]
mod tests;
