//! Markdown to styled terminal lines: headings, emphasis, inline code, code
//! blocks, lists, quotes, links and GFM tables, from pulldown-cmark's events. Partial
//! markdown (a reply still streaming, an unclosed code fence) renders as far
//! as it goes. The input is already sanitised.

use pulldown_cmark::{Alignment, CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthStr;

/// The lines of `text` rendered, unwrapped (the renderer wraps them).
pub(crate) fn render(text: &str) -> Vec<Line<'static>> {
    let mut r = Renderer::default();
    let options =
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS | Options::ENABLE_TABLES;
    for event in Parser::new_ext(text, options) {
        r.event(event);
    }
    // An unclosed fence (a reply still streaming): what came so far, plain.
    if let Some((_, text)) = r.code.take() {
        r.code_lines(&text, None);
    }
    r.flush();
    while r.lines.last().is_some_and(|l| l.spans.is_empty()) {
        r.lines.pop();
    }
    r.lines
}

#[derive(Default)]
struct Renderer {
    lines: Vec<Line<'static>>,
    /// The line being built.
    spans: Vec<Span<'static>>,
    /// Inline styles in force (emphasis, strong, …).
    styles: Vec<Style>,
    /// Open lists: the next number of each ordered one.
    lists: Vec<Option<u64>>,
    /// Prefix of every line: quote bars and list indentation.
    quote: usize,
    /// Inside a code block: its fence's language, and its text so far
    /// (drawn, highlighted where the language is known, when it closes).
    code: Option<(String, String)>,
    /// The link target of an open link.
    link: Option<String>,
    /// A list item's bullet, to put before its first text.
    bullet: Option<String>,
    /// A table being read: drawn whole at its end, its columns aligned.
    table: Option<Table>,
}

/// A GFM table's cells as plain text, its header first.
#[derive(Default)]
struct Table {
    alignments: Vec<Alignment>,
    rows: Vec<Vec<String>>,
    cell: String,
}

impl Table {
    /// The table's lines: cells padded to their column's width as the
    /// column aligns, `│` between them, a rule under the header.
    fn lines(&self) -> Vec<Line<'static>> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let width = |c: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(c))
                .map(|cell| UnicodeWidthStr::width(cell.as_str()))
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..columns).map(width).collect();
        let bar = Style::default().add_modifier(Modifier::DIM);
        let mut lines = Vec::new();
        for (i, row) in self.rows.iter().enumerate() {
            let mut spans = Vec::new();
            for (c, w) in widths.iter().enumerate() {
                if c > 0 {
                    spans.push(Span::styled(" │ ", bar));
                }
                let cell = row.get(c).map_or("", String::as_str);
                let pad = w.saturating_sub(UnicodeWidthStr::width(cell));
                let (left, right) = match self.alignments.get(c) {
                    Some(Alignment::Right) => (pad, 0),
                    Some(Alignment::Center) => (pad / 2, pad - pad / 2),
                    _ => (0, pad),
                };
                let text = format!("{}{cell}{}", " ".repeat(left), " ".repeat(right));
                let style = if i == 0 {
                    Style::default().add_modifier(Modifier::BOLD)
                } else {
                    Style::default()
                };
                spans.push(Span::styled(text, style));
            }
            lines.push(Line::from(spans));
            if i == 0 {
                let rule: Vec<String> = widths.iter().map(|w| "─".repeat(*w)).collect();
                lines.push(Line::styled(rule.join("─┼─"), bar));
            }
        }
        lines
    }
}

impl Renderer {
    fn style(&self) -> Style {
        self.styles
            .iter()
            .fold(Style::default(), |acc, s| acc.patch(*s))
    }

    fn indent(&self) -> String {
        let mut prefix = "▎ ".repeat(self.quote);
        prefix.push_str(&"  ".repeat(self.lists.len().saturating_sub(1)));
        prefix
    }

    fn start_line(&mut self) {
        if self.spans.is_empty() {
            let indent = self.indent();
            if !indent.is_empty() {
                self.spans.push(Span::styled(
                    indent,
                    Style::default().add_modifier(Modifier::DIM),
                ));
            }
            if let Some(bullet) = self.bullet.take() {
                self.spans
                    .push(Span::styled(bullet, Style::default().fg(Color::Cyan)));
            }
        }
    }

    fn push(&mut self, text: &str, style: Style) {
        for (i, part) in text.split('\n').enumerate() {
            if i > 0 {
                self.flush();
            }
            if part.is_empty() {
                continue;
            }
            self.start_line();
            self.spans.push(Span::styled(part.to_owned(), style));
        }
    }

    /// Ends the line being built, if any.
    fn flush(&mut self) {
        if !self.spans.is_empty() {
            self.lines.push(Line::from(std::mem::take(&mut self.spans)));
        }
    }

    /// A code block's lines behind a bar: coloured as `highlighted` has
    /// them, else plain.
    fn code_lines(&mut self, text: &str, highlighted: Option<Vec<Vec<Span<'static>>>>) {
        let bar = Style::default().add_modifier(Modifier::DIM);
        let plain = Style::default().fg(Color::Yellow);
        let mut highlighted = highlighted.map(Vec::into_iter);
        for line in text.split('\n') {
            self.start_line();
            self.spans.push(Span::styled("│ ", bar));
            match highlighted.as_mut().and_then(Iterator::next) {
                Some(spans) => self.spans.extend(spans),
                None => self.spans.push(Span::styled(line.to_owned(), plain)),
            }
            self.flush();
        }
    }

    fn blank(&mut self) {
        self.flush();
        if self.lines.last().is_some_and(|l| !l.spans.is_empty()) {
            self.lines.push(Line::default());
        }
    }

    fn event(&mut self, event: Event<'_>) {
        if let Some(table) = &mut self.table {
            match &event {
                Event::Text(text) | Event::Code(text) => return table.cell.push_str(text),
                Event::SoftBreak | Event::HardBreak => return table.cell.push(' '),
                _ => {}
            }
        }
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) if self.code.is_some() => {
                if let Some((_, code)) = &mut self.code {
                    code.push_str(&text);
                }
            }
            Event::Text(text) => self.push(&text, self.style()),
            Event::Code(code) => {
                let style = self.style().fg(Color::Cyan);
                self.push(&code, style);
            }
            Event::SoftBreak => self.push(" ", self.style()),
            Event::HardBreak => self.flush(),
            Event::Rule => {
                self.blank();
                self.lines.push(Line::styled(
                    "────────",
                    Style::default().add_modifier(Modifier::DIM),
                ));
                self.lines.push(Line::default());
            }
            Event::TaskListMarker(done) => {
                self.push(if done { "[x] " } else { "[ ] " }, self.style());
            }
            Event::Html(html) | Event::InlineHtml(html) => self.push(&html, self.style()),
            Event::FootnoteReference(name) => self.push(&format!("[{name}]"), self.style()),
            Event::InlineMath(m) | Event::DisplayMath(m) => self.push(&m, self.style()),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => {}
            Tag::Heading { level, .. } => {
                self.blank();
                let mut style = Style::default().add_modifier(Modifier::BOLD);
                if level == HeadingLevel::H1 {
                    style = style.add_modifier(Modifier::UNDERLINED);
                }
                self.styles.push(style);
            }
            Tag::BlockQuote(_) => {
                self.flush();
                self.quote += 1;
            }
            Tag::CodeBlock(kind) => {
                self.blank();
                let lang = match kind {
                    CodeBlockKind::Fenced(lang) => lang.to_string(),
                    CodeBlockKind::Indented => String::new(),
                };
                if !lang.is_empty() {
                    self.start_line();
                    self.spans.push(Span::styled(
                        format!("╭ {lang}"),
                        Style::default().add_modifier(Modifier::DIM),
                    ));
                    self.flush();
                }
                self.code = Some((lang, String::new()));
            }
            Tag::List(start) => {
                if self.lists.is_empty() {
                    self.blank();
                } else {
                    self.flush();
                }
                self.lists.push(start);
            }
            Tag::Item => {
                self.flush();
                let bullet = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        *n += 1;
                        format!("{}. ", *n - 1)
                    }
                    _ => "• ".to_string(),
                };
                self.bullet = Some(bullet);
            }
            Tag::Emphasis => self
                .styles
                .push(Style::default().add_modifier(Modifier::ITALIC)),
            Tag::Strong => self
                .styles
                .push(Style::default().add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => self
                .styles
                .push(Style::default().add_modifier(Modifier::CROSSED_OUT)),
            Tag::Link { dest_url, .. } => {
                self.link = Some(dest_url.to_string());
                self.styles
                    .push(Style::default().add_modifier(Modifier::UNDERLINED));
            }
            Tag::Image { dest_url, .. } => self.push(&format!("[image {dest_url}] "), self.style()),
            Tag::Table(alignments) => {
                self.blank();
                self.table = Some(Table {
                    alignments,
                    ..Table::default()
                });
            }
            Tag::TableHead | Tag::TableRow => {
                if let Some(table) = &mut self.table {
                    table.rows.push(Vec::new());
                }
            }
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => {
                if self.lists.is_empty() {
                    self.blank();
                } else {
                    self.flush();
                }
            }
            TagEnd::Heading(_) => {
                self.styles.pop();
                self.blank();
            }
            TagEnd::BlockQuote(_) => {
                self.flush();
                self.quote = self.quote.saturating_sub(1);
                self.blank();
            }
            TagEnd::CodeBlock => {
                if let Some((lang, text)) = self.code.take() {
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    self.code_lines(text, super::highlight::lines(&lang, text));
                }
                self.blank();
            }
            TagEnd::List(_) => {
                self.flush();
                self.lists.pop();
                if self.lists.is_empty() {
                    self.blank();
                }
            }
            TagEnd::Item => self.flush(),
            TagEnd::TableCell => {
                if let Some(table) = &mut self.table {
                    let cell = std::mem::take(&mut table.cell).trim().to_owned();
                    if let Some(row) = table.rows.last_mut() {
                        row.push(cell);
                    }
                }
            }
            TagEnd::Table => {
                if let Some(table) = self.table.take() {
                    for line in table.lines() {
                        let indent = self.indent();
                        let mut spans = Vec::new();
                        if !indent.is_empty() {
                            spans.push(Span::styled(
                                indent,
                                Style::default().add_modifier(Modifier::DIM),
                            ));
                        }
                        spans.extend(line.spans);
                        self.lines.push(Line::from(spans));
                    }
                }
                self.blank();
            }
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough => {
                self.styles.pop();
            }
            TagEnd::Link => {
                self.styles.pop();
                if let Some(url) = self.link.take() {
                    let shown: String = self.spans.iter().map(|s| s.content.as_ref()).collect();
                    if !shown.ends_with(&url) {
                        self.push(
                            &format!(" ({url})"),
                            Style::default().add_modifier(Modifier::DIM),
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    #[test]
    fn blocks_and_inlines() {
        let text = "# Title\n\nSome *soft* and **bold** `code`.\n\n- one\n- two\n  1. inner\n\n```rust\nfn main() {}\n```\n\n> quoted\n";
        let lines = render(text);
        assert_eq!(
            plain(&lines),
            [
                "Title",
                "",
                "Some soft and bold code.",
                "",
                "• one",
                "• two",
                "  1. inner",
                "",
                "╭ rust",
                "│ fn main() {}",
                "",
                "▎ quoted",
            ]
        );
        let bold = &lines[2].spans[3];
        assert_eq!(bold.content, "bold");
        assert!(bold.style.add_modifier.contains(Modifier::BOLD));
        assert_eq!(lines[2].spans[5].style.fg, Some(Color::Cyan));
    }

    #[test]
    fn tables_align_their_columns() {
        let text = "Sizes:\n\n| file | bytes | ok |\n|:-----|------:|:--:|\n| `a.rs` | 7 | yes |\n| bigger.rs | 12345 | no |\n\nDone.";
        assert_eq!(
            plain(&render(text)),
            [
                "Sizes:",
                "",
                "file      │ bytes │ ok ",
                "──────────┼───────┼────",
                "a.rs      │     7 │ yes",
                "bigger.rs │ 12345 │ no ",
                "",
                "Done.",
            ]
        );
        // A table still streaming (no rows yet) renders what it has.
        assert_eq!(plain(&render("| a | b |\n|---|---|")), ["a │ b", "──┼──"]);
    }

    #[test]
    fn an_unclosed_fence_renders_as_code() {
        assert_eq!(
            plain(&render("Look:\n```\nlet x = 1;\nlet y")),
            ["Look:", "", "│ let x = 1;", "│ let y"]
        );
    }

    #[test]
    fn links_show_their_target() {
        assert_eq!(
            plain(&render("see [docs](https://x.test/d) or <https://y.test>")),
            ["see docs (https://x.test/d) or https://y.test"]
        );
    }
}
