//! A session's updates as plain text: the one renderer of every standard
//! output of the CLI (`attach` without a terminal, `log`, `prompt`, `exec`)
//! and of the terminal's `/export`. What is new in a session is the
//! kernel [`Follower`]'s decision; this only formats it, in one of two
//! [`Layout`]s.

use kernel::client::follow::{self, Follower, Update};
use kernel::protocol::{AssistantStatus, SessionSnapshot, ToolStatus};
use std::collections::BTreeSet;

/// Output lines of a tool printed under its header.
const TOOL_LINES: usize = 5;

/// What goes where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Layout {
    /// Everything on the main output: user messages as `› text`, reply
    /// text as it streams, tool calls as `▸ bash: ls` with their first
    /// output lines, and how a reply ended when it did not complete.
    #[default]
    Transcript,
    /// Reply text alone on the main output; with `activity`, notices,
    /// thinking, tool calls and failed tools on the side output.
    Reply {
        /// Show the activity on the side output.
        activity: bool,
    },
}

/// Text to write: the main output (stdout) and the side output (stderr).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Out {
    /// For standard output.
    pub(crate) main: String,
    /// For standard error.
    pub(crate) side: String,
}

/// Formats [`Update`]s as plain text, remembering what is open.
#[derive(Debug, Default)]
pub(crate) struct Plain {
    layout: Layout,
    /// The main output's last line has no newline yet.
    line_open: bool,
    /// The reply whose text is being written.
    current: Option<String>,
    /// Tool calls whose header was written.
    headers: BTreeSet<String>,
    /// Thinking is being written to the side output.
    thinking: bool,
    /// Label user messages other clients sent (live, not in history).
    pub(crate) label_others: bool,
}

impl Plain {
    /// A renderer with `layout`.
    pub(crate) fn new(layout: Layout) -> Self {
        Self {
            layout,
            ..Self::default()
        }
    }

    /// Ends an open line of the main output.
    pub(crate) fn end_line(&mut self, out: &mut Out) {
        self.end_thinking(out);
        if self.line_open {
            out.main.push('\n');
            self.line_open = false;
        }
        self.current = None;
    }

    /// Writes `text` on the main output as it is.
    pub(crate) fn write(&mut self, text: &str, out: &mut Out) {
        if !text.is_empty() {
            out.main.push_str(text);
            self.line_open = !text.ends_with('\n');
        }
    }

    fn end_thinking(&mut self, out: &mut Out) {
        if std::mem::take(&mut self.thinking) {
            out.side.push('\n');
        }
    }

    /// A line of activity on the side output, on a line of its own where
    /// both outputs go to one terminal. The main output's open line stays
    /// open: its own newline comes with its next item.
    pub(crate) fn note(&mut self, text: &str, out: &mut Out) {
        self.end_thinking(out);
        if self.line_open {
            out.side.push('\n');
        }
        out.side.push_str(text);
        out.side.push('\n');
    }

    fn header(&mut self, call_id: &str, title: &str, out: &mut Out) {
        if self.headers.insert(call_id.to_owned()) {
            self.end_line(out);
            self.write(&format!("▸ {}\n", sanitize(title)), out);
        }
    }

    /// Appends the text of `update`.
    pub(crate) fn show(&mut self, update: Update, out: &mut Out) {
        match self.layout {
            Layout::Transcript => self.show_transcript(update, out),
            Layout::Reply { activity } => self.show_reply(update, activity, out),
        }
    }

    fn show_reply(&mut self, update: Update, activity: bool, out: &mut Out) {
        match update {
            Update::Text { item_id, delta } => {
                self.end_thinking(out);
                if self.current.as_ref().is_some_and(|item| *item != item_id) {
                    self.end_line(out);
                }
                self.current = Some(item_id);
                // The reply as the model wrote it: `prompt > file` keeps it.
                self.write(&delta, out);
            }
            _ if !activity => {}
            Update::Notice { text, .. } => self.note(&format!("⚠ {}", sanitize(&text)), out),
            Update::Thinking { delta, .. } => {
                if !self.thinking {
                    self.note("(thinking)", out);
                    self.thinking = true;
                }
                out.side.push_str(&sanitize(&delta));
            }
            Update::ToolCall {
                tool_name, input, ..
            } => {
                let title = follow::tool_title(&tool_name, &input);
                self.note(&format!("▸ {}", sanitize(&title)), out);
            }
            Update::Tool {
                status: ToolStatus::Error,
                ..
            } => {
                self.note("  ✗ the tool failed", out);
            }
            Update::User { .. } | Update::Tool { .. } | Update::Reply { .. } => {}
        }
    }

    fn show_transcript(&mut self, update: Update, out: &mut Out) {
        match update {
            Update::Notice { text, .. } => {
                self.end_line(out);
                self.write(&format!("⚠ {}\n", sanitize(&text)), out);
            }
            Update::User { text, own, .. } => {
                self.end_line(out);
                let label = if self.label_others && !own {
                    "› [another client] "
                } else {
                    "› "
                };
                for (i, line) in sanitize(&text).split('\n').enumerate() {
                    let prefix = if i == 0 { label } else { "  " };
                    self.write(&format!("{prefix}{line}\n"), out);
                }
            }
            Update::Text { item_id, delta } => {
                if self.current.as_ref() != Some(&item_id) {
                    self.end_line(out);
                    self.current = Some(item_id);
                }
                self.write(&sanitize(&delta), out);
            }
            Update::Thinking { .. } => {}
            Update::ToolCall {
                tool_call_id,
                tool_name,
                input,
            } => self.header(&tool_call_id, &follow::tool_title(&tool_name, &input), out),
            Update::Tool {
                tool_call_id,
                tool_name,
                input,
                status,
                content,
                ..
            } => {
                if status == ToolStatus::Running {
                    return;
                }
                self.header(&tool_call_id, &follow::tool_title(&tool_name, &input), out);
                let text = sanitize(&follow::text_of(&content));
                let lines: Vec<&str> = text.trim_end().lines().collect();
                for line in lines.iter().take(TOOL_LINES) {
                    self.write(&format!("  │ {line}\n"), out);
                }
                if lines.len() > TOOL_LINES {
                    let more = lines.len() - TOOL_LINES;
                    self.write(&format!("  │ … {more} more lines\n"), out);
                }
                let mark = if status == ToolStatus::Error {
                    "  ✗ failed\n"
                } else {
                    "  ✓\n"
                };
                self.write(mark, out);
            }
            Update::Reply {
                status,
                error_message,
                ..
            } => {
                self.end_line(out);
                match status {
                    AssistantStatus::Error => {
                        let why = sanitize(error_message.as_deref().unwrap_or("no message"));
                        self.write(&format!("✗ the model reported an error: {why}\n"), out)
                    }
                    AssistantStatus::Aborted => self.write("■ turn aborted\n", out),
                    _ => {}
                }
            }
        }
    }
}

/// The transcript as `log` prints it (and the terminal's `/export` writes it).
pub(crate) fn transcript_text(snapshot: &SessionSnapshot) -> String {
    let mut plain = Plain::default();
    let mut out = Out::default();
    for update in Follower::new(snapshot.id.clone()).replay(snapshot) {
        plain.show(update, &mut out);
    }
    plain.end_line(&mut out);
    out.main
}

/// Text safe to put on a terminal: control characters become their visible
/// Unicode pictures (`␛` for ESC), tabs four spaces; newlines stay.
pub(crate) fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push('\n'),
            '\t' => out.push_str("    "),
            '\r' => {}
            c if (c as u32) < 0x20 => {
                out.push(char::from_u32(0x2400 + c as u32).unwrap_or('\u{FFFD}'));
            }
            '\u{7f}' => out.push('\u{2421}'),
            c if c.is_control() => out.push('\u{FFFD}'),
            // Bidirectional overrides would reorder what follows them.
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Why approvals cannot be shown, set or answered on a v1 connection, and
/// how to reach v8.
pub(crate) const APPROVALS_NEED_V8: &str = "approvals are answered and set over protocol v8, \
    which the terminal speaks on the server's Unix socket without a token (and without \
    PI_SERVER_PROTOCOL=1)";

/// Lines of a change's text shown with a question at most.
const QUESTION_LINES: usize = 12;

/// A question about a tool call, for a person: what the call would do
/// (`bash` its command, `write` its file and content, `edit` its file and
/// the lines it changes, as a diff), safe for a terminal.
pub(crate) fn question_lines(q: &kernel::approval::Question) -> Vec<String> {
    use kernel::wire::Value;
    let field = |key: &str| match q.input.get(key) {
        Some(Value::Text(t)) => Some(sanitize(t)),
        _ => None,
    };
    let clip = |text: &str, mark: &str, lines: &mut Vec<String>| {
        let all: Vec<&str> = text.lines().collect();
        for line in all.iter().take(QUESTION_LINES) {
            lines.push(format!("  {mark} {line}"));
        }
        if all.len() > QUESTION_LINES {
            lines.push(format!("  … {} more lines", all.len() - QUESTION_LINES));
        }
    };
    let mut lines = Vec::new();
    match (q.tool.as_str(), field("path")) {
        ("bash", _) => {
            let command = field("command").unwrap_or_default();
            lines.push("bash wants to run:".to_string());
            clip(&command, "$", &mut lines);
        }
        ("write", Some(path)) => {
            lines.push(format!("write wants to replace {path} with:"));
            clip(&field("content").unwrap_or_default(), "+", &mut lines);
        }
        ("edit", Some(path)) => {
            lines.push(format!("edit wants to change {path}:"));
            clip(&field("old_text").unwrap_or_default(), "-", &mut lines);
            clip(&field("new_text").unwrap_or_default(), "+", &mut lines);
        }
        (tool, _) => {
            lines.push(format!("{} wants to run with:", sanitize(tool)));
            clip(&sanitize(&q.input.json_text()), " ", &mut lines);
        }
    }
    lines
}

/// The policy, the tools allowed always, and the question waiting.
pub(crate) fn approvals_text(id: &str, s: &kernel::client::v8::approvals::Shown) -> String {
    let whose = match s.own {
        true => "set for this session",
        false => "from the settings",
    };
    let mut text = format!("session {id} approves as {} ({whose})", s.policy.as_str());
    if !s.always.is_empty() {
        text.push_str(&format!("\nallowed always: {}", s.always.join(", ")));
    }
    match s.asked() {
        Some(q) => {
            for line in question_lines(q) {
                text.push('\n');
                text.push_str(&line);
            }
            text.push_str("\n(answer with `pi-server approve`, --always or --deny)");
        }
        None => text.push_str("\nno question waits"),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel::protocol::{Content, StopReason};
    use kernel::wire::Value;

    fn turn() -> Vec<Update> {
        let input = Value::Map(vec![("command".into(), Value::text("ls"))]);
        vec![
            Update::User {
                item_id: "u".into(),
                text: "hi\nthere".into(),
                own: false,
            },
            Update::Thinking {
                item_id: "a".into(),
                delta: "hm".into(),
            },
            Update::Text {
                item_id: "a".into(),
                delta: "Look\u{1b}[2J".into(),
            },
            Update::ToolCall {
                tool_call_id: "c".into(),
                tool_name: "bash".into(),
                input: input.clone(),
            },
            Update::Tool {
                tool_call_id: "c".into(),
                tool_name: "bash".into(),
                input,
                status: ToolStatus::Error,
                content: vec![Content::Text {
                    text: "a\nb\n".into(),
                }],
                details: None,
            },
            Update::Reply {
                item_id: "a".into(),
                status: AssistantStatus::Complete(StopReason::ToolUse),
                error_message: None,
                usage: None,
            },
            Update::Text {
                item_id: "b".into(),
                delta: "done".into(),
            },
            Update::Reply {
                item_id: "b".into(),
                status: AssistantStatus::Error,
                error_message: Some("rate limited".into()),
                usage: None,
            },
        ]
    }

    fn render(mut plain: Plain) -> Out {
        let mut out = Out::default();
        for update in turn() {
            plain.show(update, &mut out);
        }
        plain.end_line(&mut out);
        out
    }

    #[test]
    fn a_transcript_shows_everything_on_the_main_output() {
        let mut plain = Plain::new(Layout::Transcript);
        plain.label_others = true;
        let out = render(plain);
        assert_eq!(
            out.main,
            "› [another client] hi\n  there\nLook␛[2J\n▸ bash: ls\n  │ a\n  │ b\n  ✗ failed\ndone\n✗ the model reported an error: rate limited\n"
        );
        assert_eq!(out.side, "");
    }

    #[test]
    fn a_reply_keeps_the_main_output_for_its_text_and_the_side_for_its_activity() {
        let out = render(Plain::new(Layout::Reply { activity: true }));
        assert_eq!(out.main, "Look\u{1b}[2J\ndone\n", "as the model wrote it");
        assert_eq!(
            out.side,
            "(thinking)\nhm\n\n▸ bash: ls\n\n  ✗ the tool failed\n"
        );
        let quiet = render(Plain::new(Layout::Reply { activity: false }));
        assert_eq!(quiet.main, out.main);
        assert_eq!(quiet.side, "");
    }
}
