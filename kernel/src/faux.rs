//! The embedded default provider `faux`: deterministic streamed replies with
//! no network and no key, so the whole product runs anywhere.
//!
//! A [`FauxStream`] turns a [`ModelRequest`] into a timed sequence of
//! [`ModelEvent`]s: optional thinking, then the reply text in several deltas,
//! one every `delay`. The reply contains the text of the latest user message.
//! Time is an input, so the daemon and the simulator drive it the same way.

use crate::protocol::{
    Content, DeltaKind, InputKind, ModelCost, ModelMetadata, ModelRef, StopReason, ThinkingLevel,
    ToolStatus, TranscriptItem, Usage, UsageCost,
};
use crate::runtime::{ModelEvent, ModelRequest, Purpose};
use crate::time::Instant;
use crate::wire::Value;
use std::collections::VecDeque;
use std::time::Duration;

/// Provider id of the embedded models.
pub const PROVIDER: &str = "faux";

/// The default model of a new session.
pub fn default_model() -> ModelRef {
    ModelRef {
        provider: PROVIDER.into(),
        id: "faux-1".into(),
    }
}

/// The embedded models: a plain one and a reasoning one with several
/// thinking levels, both taking images; and one of a tiny window, text only.
pub fn models() -> Vec<ModelMetadata> {
    let model = |id: &str, name: &str, reasoning: bool, levels: Vec<ThinkingLevel>| ModelMetadata {
        provider: PROVIDER.into(),
        id: id.into(),
        name: name.into(),
        api: "faux".into(),
        reasoning,
        input: vec![InputKind::Text, InputKind::Image],
        context_window: 128_000,
        max_tokens: 16_384,
        cost: ModelCost::default(),
        supported_thinking_levels: levels,
        authenticated: true,
    };
    use ThinkingLevel::*;
    vec![
        model("faux-1", "Faux 1 (embedded, offline)", false, vec![Off]),
        model(
            "faux-reasoner",
            "Faux Reasoner (embedded, offline)",
            true,
            vec![Off, Minimal, Low, Medium, High],
        ),
        // A tiny context window, so that compaction can be seen (and tested) within a few turns.
        ModelMetadata {
            context_window: 400,
            input: vec![InputKind::Text],
            ..model(
                "faux-tiny",
                "Faux Tiny (embedded, 400-token window)",
                false,
                vec![Off],
            )
        },
    ]
}

/// The longest summary the faux model writes, in bytes (about 1,000
/// tokens). A real model's summary is bounded by its `max_tokens`; one that
/// repeated every earlier request grew with the session until it alone kept
/// the context past the compaction threshold, and every turn compacted again
/// (BENCHMARKS.md, the soak).
pub const SUMMARY_MAX_BYTES: usize = 4096;

/// One streaming faux reply.
#[derive(Debug, Clone, PartialEq)]
pub struct FauxStream {
    pending: VecDeque<ModelEvent>,
    next_at: Instant,
    delay: Duration,
}

/// The tool a `!` prompt asks for, and its input: `bash` with the text as
/// the command, or an MCP tool named first with `key=value` arguments.
fn tool_call(command: &str) -> (String, Value) {
    let mut words = command.split_whitespace();
    match words.next() {
        Some(tool) if tool.starts_with(crate::mcp::PREFIX) => {
            let args = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| {
                    let value = v.parse::<i64>().map_or_else(|_| Value::text(v), Value::Int);
                    (k.to_string(), value)
                })
                .collect();
            (tool.to_string(), Value::Map(args))
        }
        _ => (
            "bash".into(),
            Value::Map(vec![("command".into(), Value::text(command))]),
        ),
    }
}

impl FauxStream {
    /// Starts replying to `request` at `now`, one event every `delay`.
    ///
    /// - A summarise request answers with a short summary of the user messages.
    /// - A prompt starting with `!` asks for the `bash` tool with the rest of
    ///   the text as the command; once the tool result is in the context, the
    ///   reply reports its first line. `!mcp__<server>__<tool> key=value …`
    ///   asks for that MCP tool instead, each value a string (or an integer
    ///   when it reads as one).
    /// - Otherwise the reply repeats the latest user message, word by word
    ///   (after some thinking on a reasoning level above `off`).
    ///
    /// A summary keeps the newest [`SUMMARY_MAX_BYTES`] of what it would say.
    pub fn start(request: &ModelRequest, now: Instant, delay: Duration) -> Self {
        let mut pending = VecDeque::new();
        let text_reply = |pending: &mut VecDeque<ModelEvent>, reply: &str| {
            for chunk in chunks(reply) {
                pending.push_back(ModelEvent::Delta {
                    kind: DeltaKind::Text,
                    text: chunk,
                });
            }
        };
        let mut stop = StopReason::Stop;
        match request.purpose {
            Purpose::Summarize => {
                let users: Vec<String> = request
                    .context
                    .iter()
                    .filter_map(|i| match i {
                        TranscriptItem::User(u) => {
                            Some(text_of(&u.content).chars().take(60).collect())
                        }
                        _ => None,
                    })
                    .collect();
                let previous = request
                    .summary
                    .as_deref()
                    .map(|s| format!("{s} "))
                    .unwrap_or_default();
                let summary = format!("{previous}Earlier the user asked: {}.", users.join("; "));
                text_reply(&mut pending, &bounded(summary));
            }
            Purpose::Reply => {
                if request.thinking_level != ThinkingLevel::Off {
                    let said = latest_user_text(&request.context);
                    let thinking = format!(
                        "The user wrote {} characters; answer plainly. ",
                        said.chars().count()
                    );
                    pending.push_back(ModelEvent::Delta {
                        kind: DeltaKind::Thinking,
                        text: thinking,
                    });
                }
                match request.context.last() {
                    Some(TranscriptItem::Tool(tool)) => {
                        let output = text_of(&tool.content);
                        let first = output.lines().next().unwrap_or("").trim();
                        let verdict = if tool.status == ToolStatus::Error {
                            "failed"
                        } else {
                            "finished"
                        };
                        text_reply(
                            &mut pending,
                            &format!("The {} tool {verdict}: {first}", tool.tool_name),
                        );
                    }
                    _ => {
                        let said = latest_user_text(&request.context);
                        match said.strip_prefix('!') {
                            Some(command) => {
                                let id = format!("call-{}", request.context.len());
                                let (tool_name, input) = tool_call(command.trim());
                                pending.push_back(ModelEvent::ToolCall {
                                    tool_call_id: id,
                                    tool_name,
                                });
                                let args = input.json_text();
                                for chunk in chunks(&args) {
                                    pending.push_back(ModelEvent::Delta {
                                        kind: DeltaKind::ToolCall,
                                        text: chunk,
                                    });
                                }
                                pending.push_back(ModelEvent::ToolInput { input });
                                stop = StopReason::ToolUse;
                            }
                            None => {
                                let seen = latest_user_images(&request.context);
                                let with = match seen.len() {
                                    0 => String::new(),
                                    n => format!(
                                        ", with {n} image{} ({})",
                                        if n == 1 { "" } else { "s" },
                                        seen.join(", ")
                                    ),
                                };
                                text_reply(
                                    &mut pending,
                                    &format!(
                                        "You said: {said}{with}. This is the faux model answering offline, word by word."
                                    ),
                                )
                            }
                        }
                    }
                }
            }
        }
        let output_tokens = pending.len() as u64;
        let input_tokens = request.context.len() as u64 * 8;
        let usage = Usage {
            input: input_tokens,
            output: output_tokens,
            total_tokens: input_tokens + output_tokens,
            cost: UsageCost::default(),
            ..Usage::default()
        };
        pending.push_back(ModelEvent::Done {
            stop,
            usage: Some(usage),
            response_model: None,
        });
        Self {
            pending,
            next_at: now + delay,
            delay,
        }
    }

    /// When the next event is due, or `None` when the reply is complete.
    pub fn next_deadline(&self) -> Option<Instant> {
        (!self.pending.is_empty()).then_some(self.next_at)
    }

    /// The events due at `now`, in order. A stream takes no input but time:
    /// its calling protocol is `step(now)` and [`FauxStream::next_deadline`].
    pub fn step(&mut self, now: Instant) -> Vec<ModelEvent> {
        let mut due = Vec::new();
        while !self.pending.is_empty() && self.next_at <= now {
            due.push(self.pending.pop_front().expect("non-empty"));
            self.next_at = self.next_at + self.delay;
        }
        due
    }
}

fn text_of(content: &[Content]) -> String {
    content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn latest_user_text(context: &[TranscriptItem]) -> String {
    let text = context.iter().rev().find_map(|item| match item {
        TranscriptItem::User(u) => Some(text_of(&u.content)),
        _ => None,
    });
    text.unwrap_or_default()
}

/// The types of the images the newest user message holds.
fn latest_user_images(context: &[TranscriptItem]) -> Vec<&str> {
    let images = context.iter().rev().find_map(|item| match item {
        TranscriptItem::User(u) => Some(
            u.content
                .iter()
                .filter_map(|c| match c {
                    Content::Image { mime_type, .. } => Some(mime_type.as_str()),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    });
    images.unwrap_or_default()
}

/// `summary`, or its newest part within [`SUMMARY_MAX_BYTES`] after a mark
/// that something older was left out.
fn bounded(summary: String) -> String {
    const CUT: &str = "… ";
    if summary.len() <= SUMMARY_MAX_BYTES {
        return summary;
    }
    let mut start = summary.len() - (SUMMARY_MAX_BYTES - CUT.len());
    while !summary.is_char_boundary(start) {
        start += 1;
    }
    format!("{CUT}{}", &summary[start..])
}

/// Splits text into word-sized deltas, at least four of them.
fn chunks(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for ch in text.chars() {
        current.push(ch);
        if ch == ' ' && current.len() >= 6 {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::UserItem;

    fn request(text: &str, level: ThinkingLevel) -> ModelRequest {
        let user = UserItem {
            id: "item-1".into(),
            content: vec![Content::Text { text: text.into() }],
            timestamp: 0,
        };
        ModelRequest {
            model: default_model(),
            thinking_level: level,
            purpose: Purpose::Reply,
            summary: None,
            instructions: None,
            context: vec![TranscriptItem::User(user)].into(),
            approvals: Default::default(),
        }
    }

    #[test]
    fn streams_several_deltas_containing_the_prompt() {
        let mut s = FauxStream::start(
            &request("hello there", ThinkingLevel::Off),
            Instant(0),
            Duration::from_millis(10),
        );
        assert_eq!(s.next_deadline(), Some(Instant(10)));
        assert!(s.step(Instant(9)).is_empty());
        let mut events = Vec::new();
        let mut t = 10;
        while s.next_deadline().is_some() {
            events.extend(s.step(Instant(t)));
            t += 10;
        }
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                ModelEvent::Delta {
                    kind: DeltaKind::Text,
                    text,
                } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert!(text.contains("hello there"), "{text}");
        assert!(events.len() >= 5, "several deltas: {}", events.len());
        assert!(matches!(events.last(), Some(ModelEvent::Done { .. })));
    }

    /// A summary of a summary stays within its bound and keeps the newest
    /// request, so a long session compacts now and then, not every turn.
    #[test]
    fn summaries_stay_bounded_and_keep_the_newest() {
        let mut previous: Option<String> = None;
        for round in 0..200 {
            let mut req = request(
                &format!("request {round} é with some words"),
                ThinkingLevel::Off,
            );
            req.purpose = Purpose::Summarize;
            req.summary = previous.take();
            let mut s = FauxStream::start(&req, Instant(0), Duration::ZERO);
            let text: String = s
                .step(Instant(0))
                .into_iter()
                .filter_map(|e| match e {
                    ModelEvent::Delta { text, .. } => Some(text),
                    _ => None,
                })
                .collect();
            assert!(text.len() <= SUMMARY_MAX_BYTES, "{} bytes", text.len());
            assert!(
                text.ends_with(&format!("request {round} é with some words.")),
                "{text}"
            );
            previous = Some(text);
        }
        assert!(previous.expect("summarised").starts_with("… "));
    }

    #[test]
    fn thinking_comes_first_on_reasoning_levels() {
        let mut s = FauxStream::start(
            &request("x", ThinkingLevel::High),
            Instant(0),
            Duration::ZERO,
        );
        let events = s.step(Instant(0));
        assert!(matches!(
            &events[0],
            ModelEvent::Delta {
                kind: DeltaKind::Thinking,
                ..
            }
        ));
        assert!(
            models()
                .iter()
                .any(|m| m.reasoning && m.supported_thinking_levels.len() > 2)
        );
    }
}
