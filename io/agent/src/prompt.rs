//! What both providers send: the system prompt and the conversation in a
//! provider-neutral shape that every API accepts (tool calls paired with
//! their results, failed replies left out, the summary first).

use super::model::{ModelRequest, Purpose};
use super::registry::ProviderConfig;
use kernel::protocol::{AssistantStatus, Content, ToolStatus, TranscriptItem};
use kernel::wire::Value;
use std::fmt::Write as _;

/// A user or tool-result content part.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    Text(String),
    Image { mime_type: String, data: String },
}

/// An assistant content part.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Said {
    Text(String),
    Thinking {
        text: String,
        /// The provider's signature, which Anthropic needs back.
        signature: Option<String>,
    },
    ToolCall {
        id: String,
        name: String,
        input: Value,
    },
}

/// One message of the conversation sent to a provider.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message {
    User(Vec<Part>),
    Assistant(Vec<Said>),
    ToolResult {
        call_id: String,
        content: Vec<Part>,
        is_error: bool,
    },
}

/// The system prompt of a request; `context` (the date, the OS, the
/// project's context files) goes last.
pub(crate) fn system_prompt(request: &ModelRequest, p: &ProviderConfig) -> String {
    if request.purpose == Purpose::Summarize {
        return SUMMARIZER.to_string();
    }
    let mut text = String::from(
        "You are an expert coding assistant working in the user's project. You help by \
         reading files, running commands, editing code and writing new files, using the \
         tools below.\n\nAvailable tools:\n",
    );
    if p.tools.is_empty() {
        text.push_str("(none in this session)\n");
    }
    for spec in &p.tools {
        let _ = writeln!(text, "- {}: {}", spec.name, spec.description);
    }
    text.push_str(
        "\nGuidelines:\n\
         - Read a file before you edit it.\n\
         - Use edit for precise changes: old_text must match the file exactly, once.\n\
         - Use write only for new files or complete rewrites.\n\
         - Use grep, find and ls to explore the tree; bash for builds, tests and git.\n\
         - Relative paths are resolved against the working directory.\n\
         - Be concise, and name the files you change.\n",
    );
    let _ = write!(text, "\nCurrent working directory: {}", p.cwd);
    text.push_str(&p.context);
    text
}

const SUMMARIZER: &str = "You summarise a conversation between a user and a coding assistant \
so that the work can continue with a shorter context. Write a concise, structured summary: the \
user's goal and constraints, what has been done (files read, created or changed, commands run \
and their outcome), decisions taken, open problems, and the next steps. Keep exact file paths, \
names and error messages that matter. Do not continue the conversation; output only the summary.";

const SUMMARY_INTRO: &str = "The earlier part of this conversation was compacted. Summary of it:";

/// The conversation of a reply request, in a shape every API accepts.
pub(crate) fn messages(request: &ModelRequest) -> Vec<Message> {
    if request.purpose == Purpose::Summarize {
        return vec![Message::User(vec![Part::Text(summarize_prompt(request))])];
    }
    let mut out = Vec::new();
    if let Some(summary) = request.summary.as_ref().filter(|s| !s.trim().is_empty()) {
        out.push(Message::User(vec![Part::Text(format!(
            "{SUMMARY_INTRO}\n\n{summary}"
        ))]));
    }
    // Tool calls of the latest assistant message still waiting for a result.
    let mut pending: Vec<String> = Vec::new();
    for item in request.context.iter() {
        match item {
            TranscriptItem::User(u) => {
                flush(&mut pending, &mut out);
                let parts = parts(&u.content);
                if !parts.is_empty() {
                    out.push(Message::User(parts));
                }
            }
            TranscriptItem::Assistant(a) => {
                flush(&mut pending, &mut out);
                // A failed or aborted reply may hold half a tool call; it is not sent back.
                if matches!(a.status, AssistantStatus::Error | AssistantStatus::Aborted) {
                    continue;
                }
                let mut said = Vec::new();
                for c in &a.content {
                    match c {
                        Content::Text { text } if !text.is_empty() => {
                            said.push(Said::Text(text.clone()))
                        }
                        Content::Thinking {
                            thinking,
                            redacted,
                            signature,
                        } if !thinking.is_empty() && redacted != &Some(true) => {
                            said.push(Said::Thinking {
                                text: thinking.clone(),
                                signature: signature.clone(),
                            })
                        }
                        Content::ToolCall {
                            tool_call_id,
                            tool_name,
                            input,
                        } => {
                            pending.push(tool_call_id.clone());
                            said.push(Said::ToolCall {
                                id: tool_call_id.clone(),
                                name: tool_name.clone(),
                                input: input.clone(),
                            });
                        }
                        _ => {}
                    }
                }
                if !said.is_empty() {
                    out.push(Message::Assistant(said));
                }
            }
            TranscriptItem::Tool(t) => {
                let Some(i) = pending.iter().position(|id| *id == t.tool_call_id) else {
                    continue; // its call was not sent: drop the orphan result
                };
                pending.remove(i);
                let mut content = parts(&t.content);
                if t.status == ToolStatus::Running {
                    content.push(Part::Text("The tool call did not finish.".into()));
                }
                if content.is_empty() {
                    content.push(Part::Text("(no output)".into()));
                }
                out.push(Message::ToolResult {
                    call_id: t.tool_call_id.clone(),
                    content,
                    is_error: t.status != ToolStatus::Complete,
                });
            }
        }
    }
    flush(&mut pending, &mut out);
    out
}

/// Every tool call needs a result before the conversation goes on.
fn flush(pending: &mut Vec<String>, out: &mut Vec<Message>) {
    for call_id in pending.drain(..) {
        out.push(Message::ToolResult {
            call_id,
            content: vec![Part::Text("No result: the tool call did not run.".into())],
            is_error: true,
        });
    }
}

fn parts(content: &[Content]) -> Vec<Part> {
    content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } if !text.is_empty() => Some(Part::Text(text.clone())),
            Content::Image { data, mime_type } => Some(Part::Image {
                mime_type: mime_type.clone(),
                data: data.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// Longest tool output quoted in a summarisation request.
const MAX_QUOTED: usize = 2_000;

fn summarize_prompt(request: &ModelRequest) -> String {
    let mut text = String::new();
    if let Some(summary) = request.summary.as_ref().filter(|s| !s.trim().is_empty()) {
        let _ = write!(
            text,
            "<previous-summary>\n{summary}\n</previous-summary>\n\n"
        );
    }
    text.push_str("<conversation>\n");
    for item in request.context.iter() {
        match item {
            TranscriptItem::User(u) => {
                let _ = writeln!(text, "[user]: {}", plain(&u.content, usize::MAX));
            }
            TranscriptItem::Assistant(a) => {
                for c in &a.content {
                    match c {
                        Content::Text { text: t } => {
                            let _ = writeln!(text, "[assistant]: {t}");
                        }
                        Content::ToolCall {
                            tool_name, input, ..
                        } => {
                            let input = pi_config::json::to_json(input);
                            let _ = writeln!(text, "[assistant tool call]: {tool_name} {input}");
                        }
                        _ => {}
                    }
                }
            }
            TranscriptItem::Tool(t) => {
                let status = if t.status == ToolStatus::Complete {
                    "result"
                } else {
                    "error"
                };
                let _ = writeln!(
                    text,
                    "[tool {status} of {}]: {}",
                    t.tool_name,
                    plain(&t.content, MAX_QUOTED)
                );
            }
        }
    }
    text.push_str("</conversation>\n\n");
    text.push_str(if request.summary.is_some() {
        "Update the previous summary with the conversation above and output the new summary."
    } else {
        "Summarise the conversation above."
    });
    if let Some(instructions) = request
        .instructions
        .as_ref()
        .filter(|i| !i.trim().is_empty())
    {
        let _ = write!(
            text,
            "\n\nThe user asked this summary to follow these instructions:\n{instructions}"
        );
    }
    text
}

/// The text of content parts (images named, long text cut to `max` bytes).
fn plain(content: &[Content], max: usize) -> String {
    let mut text = String::new();
    for c in content {
        match c {
            Content::Text { text: t } => text.push_str(t),
            Content::Image { mime_type, .. } => {
                let _ = write!(text, "[image {mime_type}]");
            }
            _ => {}
        }
    }
    if text.len() > max {
        let cut = text.len() - max;
        text = format!("{} […{cut} bytes cut]", super::text::excerpt(&text, max));
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kernel::protocol::{
        AssistantItem, ModelRef, StopReason, ThinkingLevel, ToolItem, UserItem,
    };

    pub(crate) fn user(id: &str, content: Vec<Content>) -> TranscriptItem {
        TranscriptItem::User(UserItem {
            id: id.into(),
            content,
            timestamp: 0,
        })
    }

    pub(crate) fn assistant(
        id: &str,
        status: AssistantStatus,
        content: Vec<Content>,
    ) -> TranscriptItem {
        TranscriptItem::Assistant(AssistantItem {
            id: id.into(),
            content,
            model: ModelRef {
                provider: "openai".into(),
                id: "gpt-4.1".into(),
            },
            response_model: None,
            usage: None,
            timestamp: 0,
            status,
            error_message: None,
        })
    }

    pub(crate) fn tool(
        id: &str,
        call: &str,
        status: ToolStatus,
        content: Vec<Content>,
    ) -> TranscriptItem {
        TranscriptItem::Tool(ToolItem {
            id: id.into(),
            tool_call_id: call.into(),
            tool_name: "read".into(),
            input: Value::Map(vec![]),
            content,
            details: None,
            usage: None,
            timestamp: 0,
            status,
        })
    }

    pub(crate) fn call(id: &str, input: Value) -> Content {
        Content::ToolCall {
            tool_call_id: id.into(),
            tool_name: "read".into(),
            input,
        }
    }

    pub(crate) fn text(t: &str) -> Content {
        Content::Text { text: t.into() }
    }

    pub(crate) fn req(context: Vec<TranscriptItem>, summary: Option<&str>) -> ModelRequest {
        ModelRequest {
            model: ModelRef {
                provider: "openai".into(),
                id: "gpt-4.1".into(),
            },
            thinking_level: ThinkingLevel::Off,
            purpose: Purpose::Reply,
            summary: summary.map(str::to_string),
            instructions: None,
            context: context.into(),
            approvals: Default::default(),
        }
    }

    /// A summary asked for with instructions passes them on, after the
    /// conversation; one without says nothing of them.
    #[test]
    fn a_summary_carries_the_users_instructions() {
        let mut r = req(vec![user("item-1", vec![text("fix the parser")])], None);
        r.purpose = Purpose::Summarize;
        let plain = summarize_prompt(&r);
        assert!(!plain.contains("instructions"), "{plain}");
        r.instructions = Some("keep every file path".into());
        let asked = summarize_prompt(&r);
        assert!(
            asked.ends_with("follow these instructions:\nkeep every file path"),
            "{asked}"
        );
        assert!(asked.contains("[user]: fix the parser"), "{asked}");
    }

    #[test]
    fn calls_and_results_are_paired_and_failed_replies_left_out() {
        let done = AssistantStatus::Complete(StopReason::ToolUse);
        let context = vec![
            user("item-1", vec![text("go")]),
            assistant(
                "item-2",
                done,
                vec![
                    text("ok"),
                    call("c1", Value::Map(vec![])),
                    call("c2", Value::Map(vec![])),
                ],
            ),
            tool("item-3", "c1", ToolStatus::Complete, vec![text("file")]),
            // c2 never ran (the turn was aborted before it).
            assistant(
                "item-4",
                AssistantStatus::Aborted,
                vec![text("half"), call("c3", Value::Map(vec![]))],
            ),
            tool("item-5", "c3", ToolStatus::Error, vec![text("stopped")]),
            user("item-6", vec![text("again")]),
            assistant("item-7", done, vec![call("c4", Value::Map(vec![]))]),
            tool("item-8", "c4", ToolStatus::Running, vec![]),
        ];
        let got = messages(&req(context, Some("We began.")));
        let result = |id: &str, t: &str, is_error| Message::ToolResult {
            call_id: id.into(),
            content: vec![Part::Text(t.into())],
            is_error,
        };
        let want = vec![
            Message::User(vec![Part::Text(format!("{SUMMARY_INTRO}\n\nWe began."))]),
            Message::User(vec![Part::Text("go".into())]),
            Message::Assistant(vec![
                Said::Text("ok".into()),
                Said::ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    input: Value::Map(vec![]),
                },
                Said::ToolCall {
                    id: "c2".into(),
                    name: "read".into(),
                    input: Value::Map(vec![]),
                },
            ]),
            result("c1", "file", false),
            result("c2", "No result: the tool call did not run.", true),
            Message::User(vec![Part::Text("again".into())]),
            Message::Assistant(vec![Said::ToolCall {
                id: "c4".into(),
                name: "read".into(),
                input: Value::Map(vec![]),
            }]),
            result("c4", "The tool call did not finish.", true),
        ];
        assert_eq!(got, want);
    }
}
