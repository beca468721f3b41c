//! The transcript follower: what a front end shows of one session, as an
//! ordered stream of increments, each told exactly once.
//!
//! A session reaches a client as authoritative snapshots (whole transcripts)
//! and transient progress (item starts, text deltas, item updates). Every
//! front end (the CLI's `prompt`, the terminal UI, the ACP adapter, the web
//! client's server side) must turn those into "what is new since I last
//! showed it", without a duplicate when a snapshot repeats what deltas
//! already said, and without a gap when deltas were lost (a reconnection, a
//! reader that fell behind). [`Follower`] is that decision, once.
//!
//! # Calling protocol
//!
//! Feed it every event of its session ([`Follower::on_event`]) and, when
//! progress may have been lost, [`Follower::gap`]; each call returns the
//! [`Update`]s to show, in order. [`Follower::replay`] tells a whole
//! transcript (a `session/load`, a terminal attaching), [`Follower::resume`]
//! marks one as already shown. [`Follower::expect_own`] says which prompt
//! this client sent, so that its user message is told as its own.
//!
//! # Invariants
//!
//! - Invariant: for every content part, the text told is a prefix of the
//!   part's text in the latest snapshot that held it, told once, in order.
//! - Invariant: a delta is told only for an item whose content was seen
//!   (in a snapshot or a live item event) with no gap since. The server
//!   sends a snapshot current as of the deltas that follow it (an attach
//!   during a turn waits for the worker's current snapshot), so a client
//!   joining mid-reply tells the reply so far, then streams from there.
//!   After a gap a reply is told from the next snapshot (the re-attach's)
//!   or live item event, never across the hole.
//! - Invariant: an item's terminal update (a finished reply, a tool's final
//!   status) is told once, after everything the item said.

use std::collections::BTreeMap;

use crate::protocol::{
    AssistantItem, AssistantStatus, Content, DeltaKind, JsonValue, ServerEvent, SessionSnapshot,
    StopReason, ToolItem, ToolStatus, TranscriptItem, TranscriptProgress, Usage, UserItem,
};

/// One thing to show, in transcript order.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// A user message entered the transcript (a prompt, or a steer taken
    /// into the turn).
    User {
        /// Item id.
        item_id: String,
        /// Its text parts, joined.
        text: String,
        /// True when it is the prompt this client announced with
        /// [`Follower::expect_own`].
        own: bool,
    },
    /// Reply text appended to an assistant item's content part.
    Text {
        /// Assistant item id.
        item_id: String,
        /// The new text.
        delta: String,
    },
    /// Thinking appended to an assistant item's content part.
    Thinking {
        /// Assistant item id.
        item_id: String,
        /// The new thinking text.
        delta: String,
    },
    /// The model asked for a tool (the call is complete; it has not run).
    ToolCall {
        /// The call's id, shared with the tool item that runs it.
        tool_call_id: String,
        /// Tool name.
        tool_name: String,
        /// Its input.
        input: JsonValue,
    },
    /// A tool item started, changed or finished.
    Tool {
        /// The call it executes.
        tool_call_id: String,
        /// Tool name.
        tool_name: String,
        /// Its input.
        input: JsonValue,
        /// Running, complete or error.
        status: ToolStatus,
        /// Its output so far (text and images).
        content: Vec<Content>,
        /// Tool-specific details.
        details: Option<JsonValue>,
    },
    /// A notice of the session (an MCP server that failed to start, say):
    /// no reply, though the transcript holds it as an assistant item.
    Notice {
        /// Item id.
        item_id: String,
        /// What it says.
        text: String,
    },
    /// An assistant item ended.
    Reply {
        /// Item id.
        item_id: String,
        /// How it ended (never `Streaming`).
        status: AssistantStatus,
        /// The error or abort message, if any.
        error_message: Option<String>,
        /// Its token usage, if reported.
        usage: Option<Usage>,
    },
}

/// How a turn ended, judged from the transcript after its user message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnOutcome {
    /// The model finished its reply.
    Completed,
    /// The reply was cut at the output token limit.
    MaxTokens,
    /// The turn was aborted; `tool` names the tool that was running when
    /// the turn stopped on a tool result, if it did.
    Aborted {
        /// The tool the turn ended on.
        tool: Option<String>,
    },
    /// The model reported an error.
    Failed {
        /// What it said.
        message: String,
    },
}

/// How a turn ended: `transcript[base..]` is the turn (its user message
/// first, when `base` is the transcript length the prompt was sent at). With
/// no reply at all (a turn that was never run) it is `Completed`.
pub fn turn_outcome(snapshot: &SessionSnapshot, base: usize) -> TurnOutcome {
    turn_outcome_of(&snapshot.transcript, base)
}

/// [`turn_outcome`] of a transcript's `items`.
pub fn turn_outcome_of(items: &[TranscriptItem], base: usize) -> TurnOutcome {
    let turn = items.get(base..).unwrap_or_default();
    match turn.last() {
        Some(TranscriptItem::Assistant(a)) => match a.status {
            AssistantStatus::Error => TurnOutcome::Failed {
                message: a
                    .error_message
                    .clone()
                    .unwrap_or_else(|| "no message".into()),
            },
            AssistantStatus::Aborted => TurnOutcome::Aborted { tool: None },
            AssistantStatus::Complete(StopReason::Length) => TurnOutcome::MaxTokens,
            _ => TurnOutcome::Completed,
        },
        // A turn never ends on a tool result by itself: the model is called
        // again with it. Ending there means the turn was stopped.
        Some(TranscriptItem::Tool(tool)) => TurnOutcome::Aborted {
            tool: Some(tool.tool_name.clone()),
        },
        _ => TurnOutcome::Completed,
    }
}

/// The text parts of `content`, joined.
pub fn text_of(content: &[Content]) -> String {
    content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// A text field of a tool's input.
pub fn input_text<'a>(input: &'a JsonValue, key: &str) -> Option<&'a str> {
    match input.get(key) {
        Some(JsonValue::Text(text)) => Some(text),
        _ => None,
    }
}

/// The path a tool works on, if its input names one.
pub fn tool_path(input: &JsonValue) -> Option<&str> {
    input_text(input, "path").or_else(|| input_text(input, "file_path"))
}

/// A tool call's one-line title, the tool and its main argument:
/// `bash: ls -la`, `read: src/main.rs`. Every front end names calls alike.
pub fn tool_title(name: &str, input: &JsonValue) -> String {
    let main = input_text(input, "command")
        .or_else(|| tool_path(input))
        .or_else(|| input_text(input, "pattern"))
        .or_else(|| input_text(input, "url"));
    match main {
        Some(arg) => {
            let line = arg.lines().next().unwrap_or_default();
            let mut short: String = line.chars().take(120).collect();
            if short.len() < arg.len() {
                short.push('…');
            }
            format!("{name}: {short}")
        }
        None => name.to_owned(),
    }
}

/// What was told of one transcript item.
#[derive(Debug, Clone, PartialEq)]
enum Told {
    User,
    Assistant {
        /// Per content part: bytes of text or thinking told, or whether a
        /// tool call was told.
        parts: Vec<usize>,
        finished: bool,
        /// Its deltas follow on from what was told: its content was seen
        /// live, with no gap since.
        anchored: bool,
    },
    Tool {
        status: ToolStatus,
        /// Output parts told (a running tool's output grows).
        content: usize,
    },
}

/// Own prompts a follower waits to see at most.
const OWN_EXPECTED: usize = 64;

/// Follows one session for one front end. See the module docs.
#[derive(Debug, Clone)]
pub struct Follower {
    session_id: String,
    told: BTreeMap<String, Told>,
    /// Prompts this client sent whose user message was not seen yet.
    own: Vec<String>,
}

impl Follower {
    /// A follower of `session_id` that has shown nothing.
    pub fn new(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            told: BTreeMap::new(),
            own: Vec::new(),
        }
    }

    /// The session it follows.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Tells all of `snapshot` that was not told yet (all of it, on a new
    /// follower).
    pub fn replay(&mut self, snapshot: &SessionSnapshot) -> Vec<Update> {
        self.on_snapshot(snapshot)
    }

    /// Marks `items` as shown without telling them: a front end that shows
    /// only a session's newest turns skips the older ones, at the cost of a
    /// lookup each (no text is copied).
    pub fn skip(&mut self, items: &[TranscriptItem]) {
        for item in items {
            let told = match item {
                TranscriptItem::User(_) => Told::User,
                TranscriptItem::Assistant(a) => Told::Assistant {
                    parts: a
                        .content
                        .iter()
                        .map(|c| match c {
                            Content::Text { text } | Content::Thinking { thinking: text, .. } => {
                                text.len()
                            }
                            Content::ToolCall { .. } => {
                                usize::from(a.status != AssistantStatus::Streaming)
                            }
                            Content::Image { .. } => 0,
                        })
                        .collect(),
                    finished: a.status != AssistantStatus::Streaming
                        || crate::runtime::notice_text(a).is_some(),
                    anchored: true,
                },
                TranscriptItem::Tool(t) => Told::Tool {
                    status: t.status,
                    content: t.content.len(),
                },
            };
            self.told.insert(item.id().to_owned(), told);
        }
        debug_assert_eq!(self.invariants(), Ok(()));
    }

    /// Marks all of `snapshot` as shown (the front end already has it).
    pub fn resume(&mut self, snapshot: &SessionSnapshot) {
        let _ = self.on_snapshot(snapshot);
    }

    /// The next user message with exactly `text` is this client's own
    /// prompt.
    pub fn expect_own(&mut self, text: impl Into<String>) {
        // A prompt refused or lost is never seen: the oldest expectation
        // goes, so a follower's memory stays bounded.
        if self.own.len() == OWN_EXPECTED {
            self.own.remove(0);
        }
        self.own.push(text.into());
    }

    /// Expectations are bounded, and a finished reply is anchored: its
    /// whole content was seen, so no gap unsettles it.
    pub fn invariants(&self) -> Result<(), String> {
        if self.own.len() > OWN_EXPECTED {
            return Err(format!("{} own prompts expected", self.own.len()));
        }
        for (id, told) in &self.told {
            if let Told::Assistant {
                finished: true,
                anchored: false,
                ..
            } = told
            {
                return Err(format!("reply {id} finished unanchored"));
            }
        }
        Ok(())
    }

    /// Progress may have been lost (the connection was re-established, or a
    /// reader fell behind): a reply streaming now is told again from the
    /// next snapshot or live item event, not from deltas after the hole.
    pub fn gap(&mut self) {
        for told in self.told.values_mut() {
            if let Told::Assistant {
                anchored,
                finished: false,
                ..
            } = told
            {
                *anchored = false;
            }
        }
    }

    /// True while some reply's deltas are not told (after a gap, or joined
    /// mid-reply).
    pub fn is_unanchored(&self) -> bool {
        self.told.values().any(|told| {
            matches!(
                told,
                Told::Assistant {
                    anchored: false,
                    finished: false,
                    ..
                }
            )
        })
    }

    /// Tells what `event` adds, if it is about this session.
    pub fn on_event(&mut self, event: &ServerEvent) -> Vec<Update> {
        let updates = self.on_event_inner(event);
        debug_assert_eq!(self.invariants(), Ok(()));
        updates
    }

    fn on_event_inner(&mut self, event: &ServerEvent) -> Vec<Update> {
        match event {
            ServerEvent::SessionSnapshot { snapshot } if snapshot.id == self.session_id => {
                self.on_snapshot(snapshot)
            }
            ServerEvent::SessionProgress {
                session_id,
                progress,
            } if *session_id == self.session_id => self.on_progress(progress),
            _ => Vec::new(),
        }
    }

    /// Tells what `snapshot` holds beyond what was told.
    pub fn on_snapshot(&mut self, snapshot: &SessionSnapshot) -> Vec<Update> {
        self.tell(&snapshot.transcript)
    }

    /// Tells what `items` (a part of the session's transcript, in order)
    /// hold beyond what was told.
    pub fn tell(&mut self, items: &[TranscriptItem]) -> Vec<Update> {
        let mut out = Vec::new();
        for item in items {
            self.item(item, &mut out);
        }
        debug_assert_eq!(self.invariants(), Ok(()));
        out
    }

    fn on_progress(&mut self, progress: &TranscriptProgress) -> Vec<Update> {
        let mut out = Vec::new();
        match progress {
            TranscriptProgress::ItemStarted { item }
            | TranscriptProgress::ItemUpdated { item }
            | TranscriptProgress::ItemFinished { item } => self.item(item, &mut out),
            TranscriptProgress::AssistantDelta {
                message_id,
                content_index,
                kind,
                delta,
            } => {
                let Some((parts, finished, anchored)) = self.reply(message_id) else {
                    return out;
                };
                let index = *content_index as usize;
                // Stale (the item's end was told), or following on from
                // text this follower never saw.
                if *finished || !*anchored {
                    return out;
                }
                // Parts before it that were never seen stay untold: a
                // snapshot tells them.
                if parts.len() <= index {
                    parts.resize(index + 1, 0);
                }
                // Tool-call arguments stream as JSON fragments: the call is
                // told whole when its reply is complete.
                if *kind == DeltaKind::ToolCall {
                    return out;
                }
                parts[index] += delta.len();
                let item_id = message_id.clone();
                let delta = delta.clone();
                out.push(match kind {
                    DeltaKind::Thinking => Update::Thinking { item_id, delta },
                    _ => Update::Text { item_id, delta },
                });
            }
        }
        out
    }

    /// An item as a snapshot or a live item event holds it: as far as its
    /// deltas.
    fn item(&mut self, item: &TranscriptItem, out: &mut Vec<Update>) {
        match item {
            TranscriptItem::User(user) => self.user(user, out),
            TranscriptItem::Assistant(assistant) => self.assistant(assistant, out),
            TranscriptItem::Tool(tool) => self.tool(tool, out),
        }
    }

    fn user(&mut self, user: &UserItem, out: &mut Vec<Update>) {
        if self.told.contains_key(&user.id) {
            return;
        }
        self.told.insert(user.id.clone(), Told::User);
        let text = text_of(&user.content);
        let own = match self.own.iter().position(|t| *t == text) {
            Some(i) => {
                self.own.remove(i);
                true
            }
            None => false,
        };
        out.push(Update::User {
            item_id: user.id.clone(),
            text,
            own,
        });
    }

    /// What was told of assistant item `id` (nothing yet, when it is new):
    /// its parts, whether it finished, whether it is anchored. `None` when
    /// the id names another kind of item.
    fn reply(&mut self, id: &str) -> Option<(&mut Vec<usize>, &mut bool, &mut bool)> {
        let told = self.told.entry(id.to_owned()).or_insert(Told::Assistant {
            parts: Vec::new(),
            finished: false,
            anchored: false,
        });
        match told {
            Told::Assistant {
                parts,
                finished,
                anchored,
            } => Some((parts, finished, anchored)),
            _ => None,
        }
    }

    fn assistant(&mut self, item: &AssistantItem, out: &mut Vec<Update>) {
        let Some((parts, finished, anchored)) = self.reply(&item.id) else {
            return;
        };
        if *finished {
            return;
        }
        *anchored = true;
        if let Some(text) = crate::runtime::notice_text(item) {
            *finished = true;
            out.push(Update::Notice {
                item_id: item.id.clone(),
                text: text.to_owned(),
            });
            return;
        }
        for (index, content) in item.content.iter().enumerate() {
            if index == parts.len() {
                parts.push(0);
            }
            let told = &mut parts[index];
            match content {
                Content::Text { text } | Content::Thinking { thinking: text, .. } => {
                    // A part that does not extend what was told (it cannot,
                    // short of a server bug) is left alone rather than told
                    // twice.
                    let Some(rest) = text.get(*told..).filter(|rest| !rest.is_empty()) else {
                        continue;
                    };
                    *told = text.len();
                    let item_id = item.id.clone();
                    let delta = rest.to_owned();
                    out.push(match content {
                        Content::Thinking { .. } => Update::Thinking { item_id, delta },
                        _ => Update::Text { item_id, delta },
                    });
                }
                Content::ToolCall {
                    tool_call_id,
                    tool_name,
                    input,
                } => {
                    // Told once the reply is complete: until then the
                    // input may still be streaming.
                    if *told == 0 && item.status != AssistantStatus::Streaming {
                        *told = 1;
                        out.push(Update::ToolCall {
                            tool_call_id: tool_call_id.clone(),
                            tool_name: tool_name.clone(),
                            input: input.clone(),
                        });
                    }
                }
                Content::Image { .. } => {}
            }
        }
        if item.status != AssistantStatus::Streaming {
            *finished = true;
            out.push(Update::Reply {
                item_id: item.id.clone(),
                status: item.status,
                error_message: item.error_message.clone(),
                usage: item.usage.clone(),
            });
        }
    }

    fn tool(&mut self, item: &ToolItem, out: &mut Vec<Update>) {
        match self.told.get(&item.id) {
            None => {}
            // A running tool's output may grow; a finished one is told.
            Some(Told::Tool { status, content })
                if *status == ToolStatus::Running
                    && (*status != item.status || *content != item.content.len()) => {}
            Some(_) => return,
        }
        self.told.insert(
            item.id.clone(),
            Told::Tool {
                status: item.status,
                content: item.content.len(),
            },
        );
        out.push(Update::Tool {
            tool_call_id: item.tool_call_id.clone(),
            tool_name: item.tool_name.clone(),
            input: item.input.clone(),
            status: item.status,
            content: item.content.clone(),
            details: item.details.clone(),
        });
    }
}

#[cfg(test)]
mod tests;
