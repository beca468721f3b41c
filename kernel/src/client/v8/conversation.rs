//! What a client shows of a session, from its `pi.transcript` replica (pi's
//! `ConversationView`): the transcript items every front end draws, as the
//! server's view makes them (`server::v8::view`), read back.
//!
//! - Each entry in order: `pi.user` a user item, `pi.assistant` a reply,
//!   `pi.tool-result` a finished tool call, its input taken from the reply
//!   that called it. Other kinds (`pi.system`, a head marker's own entry)
//!   show nothing.
//! - Then what `docs["pi.live"]` holds during a turn: the running tools
//!   (with their output so far), then the streaming reply.
//! - An entry's item is `e<id>`, a tool's (running or finished)
//!   `tool:<callId>`. A streaming reply's is `r<timestamp>-<entries read>`
//!   when it first shows, and the entry that ends it (the reply of the same
//!   timestamp) keeps it: a follower never tells a reply twice, though the
//!   server may show a reply before the entry that precedes it.
//!
//! An entry never changes once appended, so [`Conversation::sync`] reads
//! only the entries past the ones it has read: a turn costs what it adds.
//! A publication that changes the entries otherwise (a head marker drops a
//! prefix) is read whole again.

use crate::protocol::{
    AssistantItem, AssistantStatus, Content, ModelRef, SessionPhase, SessionSnapshot, StopReason,
    ThinkingLevel, ToolItem, ToolStatus, TranscriptItem, Usage, UsageCost, UserItem,
};
use crate::wire::Value;
use std::collections::BTreeMap;

/// The items of one transcript replica, kept in step with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    /// The items of the entries read, in order, then the live ones (from
    /// `live_from`).
    items: Vec<TranscriptItem>,
    live_from: usize,
    /// The ids of the entries read, in order (to see a changed prefix).
    ids: Vec<i64>,
    /// Tool calls of the replies read, by call id: a result's input.
    calls: BTreeMap<String, Value>,
    /// A run is under way (`pi.live.run`).
    busy: bool,
    /// The streaming reply last shown: its timestamp and item id, until an
    /// entry of that timestamp takes the id.
    streaming: Option<(u64, String)>,
}

impl Conversation {
    /// The conversation of `view` (a `ConversationView`).
    pub fn new(view: &Value) -> Self {
        let mut conversation = Self::default();
        conversation.sync(view);
        conversation
    }

    /// Brings the items in step with `view`, the replica after an update.
    /// Reads only the entries appended since the last sync, unless the
    /// entries read before changed. Returns where the items that may have
    /// changed begin (the ones before are as they were).
    pub fn sync(&mut self, view: &Value) -> usize {
        let entries = match view.get("entries") {
            Some(Value::Array(entries)) => entries.as_slice(),
            _ => &[],
        };
        // Entries are only appended, or a head marker drops a prefix: the
        // ones read are still there when the first and last read still are.
        let n = self.ids.len();
        let kept = entries.len() >= n
            && (n == 0
                || (entry_id(&entries[0]) == Some(self.ids[0])
                    && entry_id(&entries[n - 1]) == Some(self.ids[n - 1])));
        if !kept {
            self.items.clear();
            self.live_from = 0;
            self.ids.clear();
            self.calls.clear();
        }
        let from = self.live_from;
        self.items.truncate(from);
        for entry in &entries[self.ids.len()..] {
            self.ids.push(entry_id(entry).unwrap_or(0));
            if let Some(item) = self.item_of(entry) {
                self.items.push(item);
            }
        }
        self.live_from = self.items.len();
        let live = view.get("docs").and_then(|d| d.get("pi.live"));
        self.busy = live.and_then(|l| l.get("run")).is_some();
        let live = match live {
            Some(live) => self.live_items(live),
            None => Vec::new(),
        };
        self.items.extend(live);
        from
    }

    /// Brings the items in step with the transcript `connection` follows
    /// for the attached session `session_id`; returns the session's facts
    /// ([`head`]) and where the changed items begin. `None` while nothing
    /// is followed (not attached yet, or reconnecting).
    pub fn follow(
        &mut self,
        connection: &super::connection::Connection,
        session_id: &str,
    ) -> Option<(SessionSnapshot, usize)> {
        use super::connection::{MODELS, STATUS, TRANSCRIPT};
        let view = connection.session_state(TRANSCRIPT)?;
        let from = self.sync(view);
        let models = connection.session_state(MODELS);
        let head = head(
            session_id,
            self,
            view,
            models,
            connection.server_state(STATUS),
        );
        Some((head, from))
    }

    /// The items shown: the entries', then the live ones.
    pub fn items(&self) -> &[TranscriptItem] {
        &self.items
    }

    /// The finished items, in order.
    pub fn finished(&self) -> &[TranscriptItem] {
        &self.items[..self.live_from]
    }

    /// The running tools and the streaming reply.
    pub fn live(&self) -> &[TranscriptItem] {
        &self.items[self.live_from..]
    }

    /// A run is under way.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// The turn of a prompt of `text` sent when the transcript held `base`
    /// items has ended: its user message is there and nothing runs. (How
    /// a client whose `waitForPrompt` was cut off by a reconnection knows.)
    pub fn settled(&self, base: usize, text: &str) -> bool {
        !self.busy
            && self.finished().get(base..).is_some_and(|turn| {
                turn.iter().any(|item| match item {
                    TranscriptItem::User(u) => crate::client::follow::text_of(&u.content) == text,
                    _ => false,
                })
            })
    }

    fn item_of(&mut self, entry: &Value) -> Option<TranscriptItem> {
        let message = match entry.get("model") {
            Some(Value::Array(messages)) => messages.first()?,
            _ => return None,
        };
        let id = format!("e{}", entry_id(entry)?);
        let kind = match entry.get("kind") {
            Some(Value::Text(kind)) => kind.as_str(),
            _ => return None,
        };
        Some(match kind {
            "pi.user" => TranscriptItem::User(UserItem {
                id,
                content: content(message.get("content")),
                timestamp: uint(message.get("timestamp")),
            }),
            "pi.assistant" => {
                let id = match self.streaming.take() {
                    Some((at, live)) if at == uint(message.get("timestamp")) => live,
                    other => {
                        self.streaming = other;
                        id
                    }
                };
                for part in parts(message.get("content")) {
                    if let (Some(Value::Text(t)), Some(Value::Text(call))) =
                        (part.get("type"), part.get("id"))
                        && t == "toolCall"
                    {
                        let input = part.get("arguments").cloned().unwrap_or(Value::Null);
                        self.calls.insert(call.clone(), input);
                    }
                }
                TranscriptItem::Assistant(reply(id, message, false))
            }
            "pi.tool-result" => {
                let call = text(message.get("toolCallId"));
                TranscriptItem::Tool(ToolItem {
                    id: format!("tool:{call}"),
                    input: self.calls.get(&call).cloned().unwrap_or(Value::Null),
                    tool_call_id: call,
                    tool_name: text(message.get("toolName")),
                    content: content(message.get("content")),
                    details: message.get("details").cloned(),
                    usage: None,
                    timestamp: uint(message.get("timestamp")),
                    status: match message.get("isError") {
                        Some(Value::Bool(true)) => ToolStatus::Error,
                        _ => ToolStatus::Complete,
                    },
                })
            }
            _ => return None,
        })
    }

    fn live_items(&mut self, live: &Value) -> Vec<TranscriptItem> {
        let mut items = Vec::new();
        let done: Vec<&str> = self.items[..self.live_from]
            .iter()
            .filter_map(|i| match i {
                TranscriptItem::Tool(t) => Some(t.tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        for slot in parts(live.get("tools")) {
            let call = text(slot.get("callId"));
            if done.contains(&call.as_str()) {
                continue;
            }
            let output = text(slot.get("output"));
            items.push(TranscriptItem::Tool(ToolItem {
                id: format!("tool:{call}"),
                input: self.calls.get(&call).cloned().unwrap_or(Value::Null),
                tool_name: text(slot.get("name")),
                content: match output.is_empty() {
                    true => Vec::new(),
                    false => vec![Content::Text { text: output }],
                },
                tool_call_id: call,
                details: None,
                usage: None,
                timestamp: 0,
                status: match slot.get("status") {
                    Some(Value::Text(s)) if s == "running" || s == "pending" => ToolStatus::Running,
                    _ => ToolStatus::Complete,
                },
            }));
        }
        if let Some(message) = live.get("generation").and_then(|g| g.get("message")) {
            let at = uint(message.get("timestamp"));
            let id = match &self.streaming {
                Some((shown, id)) if *shown == at => id.clone(),
                _ => {
                    let id = format!("r{at}-{}", self.ids.len());
                    self.streaming = Some((at, id.clone()));
                    id
                }
            };
            items.push(TranscriptItem::Assistant(reply(id, message, true)));
        }
        items
    }
}

/// The facts a front end shows beside an attached session's transcript, as
/// a snapshot without one: its phase (a run under way is a turn, or what
/// our status names it: a compaction, a retry), its model and thinking
/// level (`pi.models`, else `pi.agent`), its working directory (`pi.agent`)
/// and its name (our status). `status` is our status service's state.
pub fn head(
    session_id: &str,
    conversation: &Conversation,
    view: &Value,
    models: Option<&Value>,
    status: Option<&Value>,
) -> SessionSnapshot {
    let entry = status.and_then(|s| status_entry(s, session_id));
    let phase = match (conversation.busy(), entry.and_then(|e| e.get("state"))) {
        (false, _) => SessionPhase::Idle,
        (true, Some(Value::Text(state))) => match state.as_str() {
            "compaction" => SessionPhase::Compaction,
            "retry" => SessionPhase::Retry,
            "branch_summary" => SessionPhase::BranchSummary,
            _ => SessionPhase::Turn,
        },
        (true, _) => SessionPhase::Turn,
    };
    let agent = view.get("docs").and_then(|d| d.get("pi.agent"));
    let configuration = models.and_then(|m| m.get("configuration"));
    let model = configuration
        .and_then(|c| c.get("model"))
        .or_else(|| agent.and_then(|a| a.get("model")));
    let level = configuration
        .and_then(|c| c.get("thinkingLevel"))
        .or_else(|| agent.and_then(|a| a.get("thinkingLevel")));
    let at = |key: &str| uint(entry.and_then(|e| e.get(key)));
    SessionSnapshot {
        id: session_id.to_owned(),
        name: entry.and_then(|e| match e.get("name") {
            Some(Value::Text(name)) => Some(name.clone()),
            _ => None,
        }),
        cwd: text(agent.and_then(|a| a.get("cwd"))),
        created_at: at("createdAt"),
        updated_at: at("updatedAt"),
        phase,
        model: ModelRef {
            provider: text(model.and_then(|m| m.get("provider"))),
            id: text(model.and_then(|m| m.get("modelId"))),
        },
        thinking_level: match level {
            Some(Value::Text(l)) => ThinkingLevel::parse(l).unwrap_or(ThinkingLevel::Off),
            _ => ThinkingLevel::Off,
        },
        attached: true,
        locked: false,
        revision: 0,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

/// One session's entry in our status service's state.
pub fn status_entry<'a>(status: &'a Value, session_id: &str) -> Option<&'a Value> {
    match status.get("sessions") {
        Some(Value::Array(sessions)) => sessions
            .iter()
            .find(|s| s.get("sessionId") == Some(&Value::text(session_id))),
        _ => None,
    }
}

fn entry_id(entry: &Value) -> Option<i64> {
    match entry.get("id") {
        Some(Value::Int(id)) => Some(*id),
        _ => None,
    }
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::Text(s)) => s.clone(),
        _ => String::new(),
    }
}

fn uint(value: Option<&Value>) -> u64 {
    match value {
        Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        Some(Value::Float(f)) if *f >= 0.0 => *f as u64,
        _ => 0,
    }
}

fn float(value: Option<&Value>) -> f64 {
    match value {
        Some(Value::Int(n)) => *n as f64,
        Some(Value::Float(f)) => *f,
        _ => 0.0,
    }
}

fn parts(value: Option<&Value>) -> &[Value] {
    match value {
        Some(Value::Array(parts)) => parts,
        _ => &[],
    }
}

/// pi-ai content (a string, or parts) as content parts.
fn content(value: Option<&Value>) -> Vec<Content> {
    if let Some(Value::Text(text)) = value {
        return vec![Content::Text { text: text.clone() }];
    }
    parts(value)
        .iter()
        .filter_map(|part| {
            let kind = match part.get("type") {
                Some(Value::Text(kind)) => kind.as_str(),
                _ => return None,
            };
            Some(match kind {
                "text" => Content::Text {
                    text: text(part.get("text")),
                },
                "thinking" => Content::Thinking {
                    thinking: text(part.get("thinking")),
                    redacted: match part.get("redacted") {
                        Some(Value::Bool(b)) => Some(*b),
                        _ => None,
                    },
                    signature: None,
                },
                "image" => Content::Image {
                    data: text(part.get("data")),
                    mime_type: text(part.get("mimeType")),
                },
                "toolCall" => Content::ToolCall {
                    tool_call_id: text(part.get("id")),
                    tool_name: text(part.get("name")),
                    input: part.get("arguments").cloned().unwrap_or(Value::Null),
                },
                _ => return None,
            })
        })
        .collect()
}

/// pi-ai's `AssistantMessage` as a reply item.
fn reply(id: String, message: &Value, streaming: bool) -> AssistantItem {
    let status = match (streaming, message.get("stopReason")) {
        (true, _) => AssistantStatus::Streaming,
        (false, Some(Value::Text(reason))) => match reason.as_str() {
            "error" => AssistantStatus::Error,
            "aborted" => AssistantStatus::Aborted,
            "length" => AssistantStatus::Complete(StopReason::Length),
            "toolUse" => AssistantStatus::Complete(StopReason::ToolUse),
            _ => AssistantStatus::Complete(StopReason::Stop),
        },
        (false, _) => AssistantStatus::Complete(StopReason::Stop),
    };
    let model = text(message.get("model"));
    AssistantItem {
        id,
        content: content(message.get("content")),
        model: ModelRef {
            provider: text(message.get("provider")),
            id: model.clone(),
        },
        response_model: Some(model),
        usage: message.get("usage").map(usage),
        timestamp: uint(message.get("timestamp")),
        status,
        error_message: match message.get("errorMessage") {
            Some(Value::Text(m)) => Some(m.clone()),
            _ => None,
        },
    }
}

fn usage(u: &Value) -> Usage {
    let cost = u.get("cost");
    let of = |key: &str| float(cost.and_then(|c| c.get(key)));
    Usage {
        input: uint(u.get("input")),
        output: uint(u.get("output")),
        cache_read: uint(u.get("cacheRead")),
        cache_write: uint(u.get("cacheWrite")),
        reasoning: None,
        total_tokens: uint(u.get("totalTokens")),
        cost: UsageCost {
            input: of("input"),
            output: of("output"),
            cache_read: of("cacheRead"),
            cache_write: of("cacheWrite"),
            total: of("total"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chord::{State, ops};
    use crate::faux;
    use crate::server::v8::view::conversation_view;
    use proptest::prelude::*;

    fn snapshot(transcript: Vec<TranscriptItem>, busy: bool) -> SessionSnapshot {
        SessionSnapshot {
            id: "s".into(),
            name: None,
            cwd: "/work".into(),
            created_at: 1,
            updated_at: 1,
            phase: if busy {
                SessionPhase::Turn
            } else {
                SessionPhase::Idle
            },
            model: faux::default_model(),
            thinking_level: ThinkingLevel::Off,
            attached: true,
            locked: false,
            revision: 1,
            transcript,
            queued_steer: Vec::new(),
            queued_steer_count: 0,
        }
    }

    /// What a v8 client is told of `transcript`: each finished item as its
    /// entry carries it, then the running tools and the streaming reply as
    /// `pi.live` carries them.
    fn seen_over_v8(transcript: &[TranscriptItem]) -> Vec<TranscriptItem> {
        let done = transcript
            .iter()
            .position(|i| !i.is_terminal())
            .unwrap_or(transcript.len());
        let mut seen = Vec::new();
        // A result's input is its call's, as far as the entries carry it
        // (a call dropped with a prefix leaves its result without one).
        let mut calls = BTreeMap::new();
        for (i, item) in transcript.iter().enumerate() {
            let finished = i < done;
            if let (true, TranscriptItem::Assistant(a)) = (finished, item) {
                for part in &a.content {
                    if let Content::ToolCall {
                        tool_call_id,
                        input,
                        ..
                    } = part
                    {
                        calls.insert(tool_call_id.clone(), input.clone());
                    }
                }
            }
            seen.push(match item.clone() {
                TranscriptItem::User(mut u) => {
                    u.id = format!("e{}", i + 1);
                    TranscriptItem::User(u)
                }
                TranscriptItem::Assistant(mut a) => {
                    if !finished && a.status != AssistantStatus::Streaming {
                        continue; // pi.live shows only the streaming reply
                    }
                    a.id = match finished {
                        true => format!("e{}", i + 1),
                        false => format!("e{}", done + 1),
                    };
                    let model = a.response_model.take().unwrap_or(a.model.id.clone());
                    a.model.id = model.clone();
                    a.response_model = Some(model);
                    let mut usage = a.usage.take().unwrap_or_default();
                    usage.reasoning = None;
                    a.usage = Some(usage);
                    for part in &mut a.content {
                        if let Content::Thinking { signature, .. } = part {
                            *signature = None;
                        }
                    }
                    TranscriptItem::Assistant(a)
                }
                TranscriptItem::Tool(mut t) => {
                    t.usage = None;
                    t.input = calls.get(&t.tool_call_id).cloned().unwrap_or(Value::Null);
                    t.id = format!("tool:{}", t.tool_call_id);
                    if !finished {
                        let output = crate::client::follow::text_of(&t.content);
                        t.content = match output.is_empty() {
                            true => Vec::new(),
                            false => vec![Content::Text { text: output }],
                        };
                        t.details = None;
                        t.timestamp = 0;
                    }
                    TranscriptItem::Tool(t)
                }
            });
        }
        // pi.live lists the tools before the streaming reply.
        let (finished, live) = seen.split_at(done.min(seen.len()));
        let (replies, tools): (Vec<_>, Vec<_>) = live
            .iter()
            .cloned()
            .partition(|i| matches!(i, TranscriptItem::Assistant(_)));
        let mut out = finished.to_vec();
        out.extend(tools);
        out.extend(replies.into_iter().next_back());
        out
    }

    /// `items` with their replies' ids blanked: a reply keeps the id it
    /// first showed with, which a reading of the whole replica cannot know.
    fn blank_replies(items: &[TranscriptItem]) -> Vec<TranscriptItem> {
        items
            .iter()
            .cloned()
            .map(|item| match item {
                TranscriptItem::Assistant(mut a) => {
                    a.id.clear();
                    TranscriptItem::Assistant(a)
                }
                other => other,
            })
            .collect()
    }

    fn user(n: usize, text: &str) -> TranscriptItem {
        TranscriptItem::User(UserItem {
            id: format!("u{n}"),
            content: vec![Content::Text { text: text.into() }],
            timestamp: n as u64,
        })
    }

    fn assistant(n: usize, content: Vec<Content>, status: AssistantStatus) -> TranscriptItem {
        TranscriptItem::Assistant(AssistantItem {
            id: format!("a{n}"),
            content,
            model: faux::default_model(),
            response_model: Some("faux-1-2026".into()),
            usage: Some(Usage {
                total_tokens: 7,
                reasoning: Some(2),
                ..Usage::default()
            }),
            timestamp: n as u64,
            status,
            error_message: (status == AssistantStatus::Error).then(|| "boom".into()),
        })
    }

    fn tool(n: usize, call: &str, status: ToolStatus, output: &str) -> TranscriptItem {
        TranscriptItem::Tool(ToolItem {
            id: format!("t{n}"),
            tool_call_id: call.into(),
            tool_name: "bash".into(),
            input: Value::object(vec![("command", Value::text("ls"))]),
            content: vec![Content::Text {
                text: output.into(),
            }],
            details: None,
            usage: None,
            timestamp: n as u64,
            status,
        })
    }

    fn call(id: &str) -> Content {
        Content::ToolCall {
            tool_call_id: id.into(),
            tool_name: "bash".into(),
            input: Value::object(vec![("command", Value::text("ls"))]),
        }
    }

    /// Every kind of item, finished and live, reads back as v8 carries it.
    #[test]
    fn every_item_reads_back_as_the_server_s_view_carries_it() {
        let transcript = vec![
            user(0, "list"),
            assistant(
                1,
                vec![
                    Content::Thinking {
                        thinking: "hm".into(),
                        redacted: None,
                        signature: Some("sig".into()),
                    },
                    call("c1"),
                ],
                AssistantStatus::Complete(StopReason::ToolUse),
            ),
            tool(2, "c1", ToolStatus::Error, "no such file"),
            assistant(
                3,
                vec![call("c2")],
                AssistantStatus::Complete(StopReason::ToolUse),
            ),
            tool(4, "c2", ToolStatus::Running, "a\nb"),
            assistant(
                5,
                vec![Content::Text { text: "so".into() }],
                AssistantStatus::Streaming,
            ),
        ];
        let view = conversation_view(&snapshot(transcript.clone(), true));
        let conversation = Conversation::new(&view);
        let items = conversation.items().to_vec();
        assert_eq!(
            blank_replies(&items),
            blank_replies(&seen_over_v8(&transcript))
        );
        assert!(conversation.busy());
        let TranscriptItem::Tool(t) = &items[2] else {
            panic!("{items:#?}")
        };
        assert_eq!(t.input, Value::object(vec![("command", Value::text("ls"))]));
        assert_eq!(conversation.live().len(), 2);
    }

    /// The server may show a reply streaming before the user message that
    /// asked for it is an entry (progress overtakes the snapshot): the
    /// user message is still told, and the reply once, under one id.
    #[test]
    fn a_reply_shown_before_its_prompt_s_entry_is_told_once() {
        let reply = |text: &str, done: bool| {
            let mut pairs = vec![
                ("role", Value::text("assistant")),
                (
                    "content",
                    Value::Array(vec![Value::object(vec![
                        ("type", Value::text("text")),
                        ("text", Value::text(text)),
                    ])]),
                ),
                ("provider", Value::text("faux")),
                ("model", Value::text("faux-1")),
            ];
            if done {
                pairs.push(("stopReason", Value::text("stop")));
            }
            pairs.push(("timestamp", Value::Int(5)));
            Value::object(pairs)
        };
        let user = Value::object(vec![
            ("id", Value::Int(1)),
            ("kind", Value::text("pi.user")),
            (
                "model",
                Value::Array(vec![Value::object(vec![
                    ("role", Value::text("user")),
                    ("content", Value::text("go")),
                    ("timestamp", Value::Int(4)),
                ])]),
            ),
        ]);
        let view = |entries: Vec<Value>, live: Option<Value>| {
            let live = match live {
                Some(message) => Value::object(vec![
                    ("run", Value::object(vec![])),
                    (
                        "generation",
                        Value::object(vec![("attempt", Value::Int(1)), ("message", message)]),
                    ),
                ]),
                None => Value::object(vec![]),
            };
            Value::object(vec![
                ("entries", Value::Array(entries)),
                ("docs", Value::object(vec![("pi.live", live)])),
            ])
        };
        let answer = Value::object(vec![
            ("id", Value::Int(2)),
            ("kind", Value::text("pi.assistant")),
            ("model", Value::Array(vec![reply("hello there", true)])),
        ]);
        let steps = [
            view(vec![], Some(reply("hel", false))),
            view(vec![user.clone()], Some(reply("hello", false))),
            view(vec![user, answer], None),
        ];
        let mut conversation = Conversation::default();
        let mut follower = crate::client::follow::Follower::new("s");
        follower.expect_own("go");
        let mut told = Vec::new();
        for step in &steps {
            let from = conversation.sync(step);
            told.extend(follower.tell(&conversation.items()[from..]));
        }
        use crate::client::follow::Update;
        let own = told
            .iter()
            .filter(|u| matches!(u, Update::User { own: true, .. }))
            .count();
        assert_eq!(own, 1, "{told:#?}");
        let text: String = told
            .iter()
            .filter_map(|u| match u {
                Update::Text { delta, .. } => Some(delta.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "hello there");
        let ends = told
            .iter()
            .filter(|u| matches!(u, Update::Reply { .. }))
            .count();
        assert_eq!(ends, 1);
    }

    /// One step of a session's life, as its runtime reports it.
    #[derive(Debug, Clone)]
    enum Step {
        Prompt,
        Delta(u8),
        CallTool,
        ToolOutput,
        FinishTool(bool),
        Finish(u8),
        /// The whole transcript starts again from a later item (a new
        /// server's view, or a prefix dropped).
        Restart,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Prompt),
            (0u8..3).prop_map(Step::Delta),
            Just(Step::CallTool),
            Just(Step::ToolOutput),
            any::<bool>().prop_map(Step::FinishTool),
            (0u8..3).prop_map(Step::Finish),
            Just(Step::Restart),
        ]
    }

    /// Applies `step` to a transcript the way a runtime grows one.
    fn apply(transcript: &mut Vec<TranscriptItem>, n: &mut usize, step: &Step) {
        *n += 1;
        let n = *n;
        let terminal = transcript.last().is_none_or(TranscriptItem::is_terminal);
        match step {
            Step::Prompt if terminal => return transcript.push(user(n, "go")),
            Step::Delta(_) if terminal && !transcript.is_empty() => {
                return transcript.push(assistant(n, Vec::new(), AssistantStatus::Streaming));
            }
            Step::Restart if transcript.len() > 2 => {
                transcript.drain(..transcript.len() / 2);
                return;
            }
            _ => {}
        }
        let mut next = None;
        match (step, transcript.last_mut()) {
            (Step::Delta(k), Some(TranscriptItem::Assistant(a)))
                if a.status == AssistantStatus::Streaming =>
            {
                match (a.content.last_mut(), k) {
                    (Some(Content::Text { text }), 0) => text.push_str(" more"),
                    (_, 1) => a.content.push(Content::Thinking {
                        thinking: "think".into(),
                        redacted: None,
                        signature: None,
                    }),
                    _ => a.content.push(Content::Text { text: "t".into() }),
                }
            }
            (Step::CallTool, Some(TranscriptItem::Assistant(a)))
                if a.status == AssistantStatus::Streaming =>
            {
                let id = format!("c{n}");
                a.content.push(call(&id));
                a.status = AssistantStatus::Complete(StopReason::ToolUse);
                next = Some(tool(n, &id, ToolStatus::Running, ""));
            }
            (Step::ToolOutput, Some(TranscriptItem::Tool(t)))
                if t.status == ToolStatus::Running =>
            {
                t.content = vec![Content::Text {
                    text: format!("line {n}\n"),
                }];
            }
            (Step::FinishTool(ok), Some(TranscriptItem::Tool(t)))
                if t.status == ToolStatus::Running =>
            {
                t.status = if *ok {
                    ToolStatus::Complete
                } else {
                    ToolStatus::Error
                };
            }
            (Step::Finish(how), Some(TranscriptItem::Assistant(a)))
                if a.status == AssistantStatus::Streaming =>
            {
                a.status = match how {
                    0 => AssistantStatus::Complete(StopReason::Stop),
                    1 => AssistantStatus::Aborted,
                    _ => AssistantStatus::Error,
                };
            }
            _ => {}
        }
        transcript.extend(next);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// A replica kept by applying each publication's ops, read back
        /// after every one (only what was appended, unless a prefix went),
        /// always shows what the server's transcript is over v8, and the
        /// same as reading the replica whole.
        #[test]
        fn a_replica_kept_by_ops_always_reads_as_the_server_s_transcript(
            steps in prop::collection::vec(step(), 1..60)
        ) {
            let mut transcript = Vec::new();
            let mut n = 0;
            let first = conversation_view(&snapshot(Vec::new(), false));
            let mut state = State::new(first.clone());
            let mut replica = first;
            let mut conversation = Conversation::new(&replica);
            // A follower told what changed at each step tells each user
            // message and each reply's end once.
            let mut follower = crate::client::follow::Follower::new("s");
            let (mut users, mut ends, mut told) = (0, 0, 0);
            for step in &steps {
                apply(&mut transcript, &mut n, step);
                let busy = !transcript.last().is_none_or(TranscriptItem::is_terminal);
                let view = conversation_view(&snapshot(transcript.clone(), busy));
                if let Some(published) = state.publish(view) {
                    ops::apply_all(&mut replica, &published).expect("the ops apply");
                }
                let before = conversation.items().to_vec();
                let from = conversation.sync(&replica);
                let items = conversation.items().to_vec();
                prop_assert_eq!(&items[..from], &before[..from], "the items before `from` are as they were");
                for update in follower.tell(&items[from..]) {
                    match update {
                        crate::client::follow::Update::User { .. } => users += 1,
                        crate::client::follow::Update::Reply { .. } => ends += 1,
                        crate::client::follow::Update::Text { delta, .. } => told += delta.len(),
                        _ => {}
                    }
                }
                let whole = Conversation::new(&replica).items().to_vec();
                prop_assert_eq!(blank_replies(&items), blank_replies(&whole));
                // Restarts renumber entries; compare from a fresh reading.
                if !matches!(step, Step::Restart) {
                    prop_assert_eq!(blank_replies(&items), blank_replies(&seen_over_v8(&transcript)));
                }
                prop_assert_eq!(conversation.busy(), busy);
            }
            if !steps.iter().any(|s| matches!(s, Step::Restart)) {
                let count = |f: fn(&TranscriptItem) -> bool| transcript.iter().filter(|i| f(i)).count();
                prop_assert_eq!(users, count(|i| matches!(i, TranscriptItem::User(_))));
                prop_assert_eq!(ends, count(|i| matches!(i, TranscriptItem::Assistant(a) if a.status != AssistantStatus::Streaming)));
                let text: usize = transcript
                    .iter()
                    .filter_map(|i| match i {
                        TranscriptItem::Assistant(a) => Some(crate::client::follow::text_of(&a.content).len()),
                        _ => None,
                    })
                    .sum();
                prop_assert_eq!(told, text, "every reply's text told once");
            }
        }
    }
}
