//! Draws a [`View`]: the transcript (scrollable, newest at the bottom), a
//! status line, and the input box whose title says what Enter sends.

use super::markdown;
use super::view::{Block, Level, SPINNER, View};
use kernel::protocol::{SessionPhase, ToolStatus};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Position, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block as Border, Borders, Paragraph};
use unicode_width::UnicodeWidthStr;

/// Output lines of a tool shown under its header.
const TOOL_LINES: usize = 5;
/// Rows the input box may grow to, borders included.
const INPUT_MAX: u16 = 10;

/// Draws `view` on the whole frame.
/// Draws `view`; true when the transcript's first block is in the window.
pub(crate) fn draw(frame: &mut Frame<'_>, view: &View) -> bool {
    let area = frame.area();
    let width = area.width.saturating_sub(2).max(1) as usize;
    let input = input_lines(view.editor.text(), width);
    let input_height = (input.len() as u16 + 2).clamp(3, INPUT_MAX);
    let asked_height = view.asked.as_ref().map_or(0, |l| l.len() as u16 + 2);
    let [transcript, asked, status, input_area] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(asked_height),
        Constraint::Length(1),
        Constraint::Length(input_height),
    ])
    .areas(area);
    let top = draw_transcript(frame, view, transcript);
    if let Some(lines) = &view.asked {
        draw_question(frame, lines, asked);
    }
    frame.render_widget(Paragraph::new(status_line(view)), status);
    draw_input(frame, view, input_area, &input);
    top
}

/// Resets every cell's colours (for `NO_COLOR`), keeping its modifiers.
pub(crate) fn strip_colour(buffer: &mut ratatui::buffer::Buffer) {
    for cell in &mut buffer.content {
        cell.fg = Color::Reset;
        cell.bg = Color::Reset;
    }
}

fn dim() -> Style {
    Style::default().add_modifier(Modifier::DIM)
}

fn spinner(view: &View) -> &'static str {
    SPINNER[(view.tick as usize) % SPINNER.len()]
}

/// Draws the transcript; true when its first block shows in the window.
fn draw_transcript(frame: &mut Frame<'_>, view: &View, area: Rect) -> bool {
    let width = area.width.max(1) as usize;
    let height = area.height as usize;
    // From the newest block back, only as far as the window needs.
    let want = height + view.scroll;
    let mut rows: Vec<Line<'static>> = Vec::new();
    let mut all = true;
    for (i, block) in view.blocks.iter().enumerate().rev() {
        let mut lines = Vec::new();
        let last = i + 1 == view.blocks.len();
        block_lines(view, block, last, &mut lines);
        if lines.is_empty() {
            continue; // a reply that only called tools
        }
        lines.push(Line::default());
        let mut wrapped = Vec::new();
        for line in lines {
            wrap(line, width, &mut wrapped);
        }
        wrapped.append(&mut rows);
        rows = wrapped;
        if rows.len() >= want {
            all = i == 0;
            break;
        }
    }
    // The blank line after the newest block is not needed.
    if rows.last().is_some_and(|l| l.spans.is_empty()) {
        rows.pop();
    }
    let scroll = view.scroll.min(rows.len().saturating_sub(height));
    let end = rows.len() - scroll;
    let start = end.saturating_sub(height);
    let top = all && start == 0;
    let mut shown: Vec<Line<'static>> = rows.drain(start..end).collect();
    if scroll > 0
        && let Some(last) = shown.last_mut()
    {
        *last = Line::styled(
            format!("── {scroll} lines below (PageDown, Ctrl-End) ──"),
            Style::default().fg(Color::Yellow),
        );
    }
    frame.render_widget(Paragraph::new(shown), area);
    top
}

fn block_lines(view: &View, block: &Block, last: bool, out: &mut Vec<Line<'static>>) {
    match block {
        Block::User { text, other } => {
            let label = if *other {
                "› (another client) "
            } else {
                "› "
            };
            let style = Style::default()
                .fg(Color::Cyan)
                .add_modifier(Modifier::BOLD);
            for (i, line) in text.split('\n').enumerate() {
                let prefix = if i == 0 { label } else { "  " };
                out.push(Line::from(vec![
                    Span::styled(prefix, style),
                    Span::styled(
                        line.to_owned(),
                        Style::default().add_modifier(Modifier::BOLD),
                    ),
                ]));
            }
        }
        Block::Reply {
            text,
            thinking,
            ended,
            problem,
            ..
        } => {
            if !thinking.is_empty() {
                let style = dim().add_modifier(Modifier::ITALIC);
                if view.show_thinking {
                    for line in thinking.trim_end().split('\n') {
                        out.push(Line::styled(format!("┊ {line}"), style));
                    }
                } else {
                    let n = thinking.trim_end().lines().count().max(1);
                    let s = if n == 1 { "" } else { "s" };
                    out.push(Line::styled(
                        format!("┊ thinking, {n} line{s} (Ctrl-T shows)"),
                        style,
                    ));
                }
            }
            out.extend(markdown::render(text));
            if !*ended && last && view.busy() && text.is_empty() {
                out.push(Line::styled(format!("{} …", spinner(view)), dim()));
            }
            if let Some(problem) = problem {
                let style = if problem.starts_with('✗') {
                    Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
                } else {
                    Style::default().fg(Color::Yellow)
                };
                out.push(Line::styled(problem.clone(), style));
            }
        }
        Block::Tool {
            call_id,
            title,
            status,
            output,
        } => {
            let (mark, style) = match status {
                None => ("·".to_string(), dim()),
                Some(ToolStatus::Running) => (
                    spinner(view).to_string(),
                    Style::default().fg(Color::Yellow),
                ),
                Some(ToolStatus::Complete) => ("✓".into(), Style::default().fg(Color::Green)),
                Some(ToolStatus::Error) => ("✗".into(), Style::default().fg(Color::Red)),
            };
            let selected = view.selected.as_ref() == Some(call_id);
            let title_style = match selected {
                true => Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED),
                false => Style::default().add_modifier(Modifier::BOLD),
            };
            out.push(Line::from(vec![
                Span::styled("▸ ", Style::default().fg(Color::Magenta)),
                Span::styled(title.clone(), title_style),
                Span::raw(" "),
                Span::styled(mark, style),
            ]));
            let lines: Vec<&str> = output.trim_end().lines().collect();
            let shown = if view.expand_tools || view.expanded.contains(call_id) {
                lines.len()
            } else {
                TOOL_LINES
            };
            for line in lines.iter().take(shown) {
                out.push(Line::styled(format!("  {line}"), dim()));
            }
            if lines.len() > shown {
                out.push(Line::styled(
                    format!("  … {} more lines (Ctrl-O shows them)", lines.len() - shown),
                    dim(),
                ));
            }
        }
        Block::Notice { level, text } => {
            let style = match level {
                Level::Info => dim(),
                Level::Warn => Style::default().fg(Color::Yellow),
                Level::Error => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
            };
            for line in text.split('\n') {
                out.push(Line::styled(line.to_owned(), style));
            }
        }
    }
}

fn status_line(view: &View) -> Line<'static> {
    let s = &view.status;
    let phase = match (&view.reconnecting, s.phase) {
        (Some(_), _) => format!("{} reconnecting", spinner(view)),
        (None, SessionPhase::Idle) if view.busy() => format!("{} sending", spinner(view)),
        (None, SessionPhase::Idle) => "idle".into(),
        (None, phase) => format!("{} {}", spinner(view), phase.as_str()),
    };
    let name = s.name.clone().unwrap_or_else(|| short_id(&s.session));
    let mut parts = vec![
        phase,
        name,
        s.model.clone(),
        format!("thinking {}", s.thinking.as_str()),
        format!("{} tokens ${:.4}", s.tokens, s.cost),
    ];
    // How full the context window was at the latest model call.
    if let Some(window) = view.windows.get(&s.model).filter(|w| **w > 0)
        && s.context > 0
    {
        let percent = (s.context * 100).div_ceil(*window).min(100);
        parts.push(format!("context {percent}% of {}", thousands(*window)));
    }
    if s.queued_steers > 0 {
        parts.push(format!("{} steer queued", s.queued_steers));
    }
    Line::styled(
        format!(" {} ", parts.join(" │ ")),
        Style::default().add_modifier(Modifier::REVERSED),
    )
}

/// `200000` as `200k`, `1048576` as `1.0M`.
fn thousands(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{}k", n / 1000),
        _ => format!("{:.1}M", n as f64 / 1_000_000.0),
    }
}

fn short_id(id: &str) -> String {
    id.chars().take(8).collect()
}

/// The question waiting, with the keys that answer it.
fn draw_question(frame: &mut Frame<'_>, lines: &[String], area: Rect) {
    let block = Border::default()
        .borders(Borders::ALL)
        .border_style(Style::default().fg(Color::Yellow))
        .title(" approve? ")
        .title_bottom(Line::styled(
            " y allow · a allow always · n deny (with nothing typed) ",
            dim(),
        ));
    let text: Vec<Line<'static>> = lines.iter().map(|l| Line::raw(l.clone())).collect();
    frame.render_widget(Paragraph::new(text).block(block), area);
}

fn draw_input(frame: &mut Frame<'_>, view: &View, area: Rect, lines: &[(String, usize)]) {
    let title = if view.busy() {
        " steer › (a turn is running; Enter adds this to it) "
    } else {
        " prompt › "
    };
    let hint = " Enter send · Alt-Enter newline · Esc abort · Ctrl-D detach · /help ";
    let block = Border::default()
        .borders(Borders::ALL)
        .border_style(if view.busy() {
            Style::default().fg(Color::Yellow)
        } else {
            Style::default().fg(Color::Cyan)
        })
        .title(title)
        .title_bottom(Line::styled(hint, dim()));
    let inner = block.inner(area);
    if inner.height == 0 || inner.width == 0 {
        // A terminal too small for an input line (or one of no size yet).
        frame.render_widget(block, area);
        return;
    }
    let height = inner.height as usize;
    // The cursor's row, and the rows shown around it.
    let cursor = view.editor.cursor();
    let (row, col) = cursor_position(view.editor.text(), cursor, inner.width.max(1) as usize);
    let first = (row + 1).saturating_sub(height);
    let shown: Vec<Line<'static>> = lines
        .iter()
        .skip(first)
        .take(height)
        .map(|(l, _)| Line::raw(l.clone()))
        .collect();
    frame.render_widget(Paragraph::new(shown).block(block), area);
    frame.set_cursor_position(Position::new(
        inner.x + col as u16,
        inner.y + (row - first) as u16,
    ));
}

/// The input's text wrapped at `width`: each row and the byte offset it starts at.
fn input_lines(text: &str, width: usize) -> Vec<(String, usize)> {
    let mut rows = Vec::new();
    let mut offset = 0;
    for line in text.split('\n') {
        let mut row = String::new();
        let mut start = offset;
        let mut used = 0;
        for (i, c) in line.char_indices() {
            let w = UnicodeWidthStr::width(c.encode_utf8(&mut [0; 4]) as &str);
            if used + w > width {
                rows.push((std::mem::take(&mut row), start));
                start = offset + i;
                used = 0;
            }
            row.push(c);
            used += w;
        }
        rows.push((row, start));
        offset += line.len() + 1;
    }
    rows
}

/// Row and column of byte offset `cursor` in the wrapped input.
fn cursor_position(text: &str, cursor: usize, width: usize) -> (usize, usize) {
    let rows = input_lines(text, width);
    let row = rows
        .iter()
        .rposition(|(_, start)| *start <= cursor)
        .unwrap_or(0);
    let start = rows[row].1;
    let col = UnicodeWidthStr::width(&text[start..cursor.max(start)]);
    if col >= width {
        return (row + 1, 0);
    }
    (row, col)
}

/// Wraps a styled line at `width` columns, breaking after spaces where it can.
fn wrap(line: Line<'static>, width: usize, out: &mut Vec<Line<'static>>) {
    if line.width() <= width {
        out.push(line);
        return;
    }
    let mut row: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    // Pieces: words with their trailing spaces, each with its span's style.
    for span in line.spans {
        let style = span.style;
        for piece in split_words(&span.content) {
            let w = UnicodeWidthStr::width(piece);
            if used + w > width && used > 0 {
                out.push(Line::from(std::mem::take(&mut row)));
                used = 0;
                if piece.trim().is_empty() {
                    continue;
                }
            }
            if w > width {
                // A word longer than the row: cut it.
                let mut part = String::new();
                for c in piece.chars() {
                    let cw = UnicodeWidthStr::width(c.encode_utf8(&mut [0; 4]) as &str);
                    if used + cw > width {
                        row.push(Span::styled(std::mem::take(&mut part), style));
                        out.push(Line::from(std::mem::take(&mut row)));
                        used = 0;
                    }
                    part.push(c);
                    used += cw;
                }
                row.push(Span::styled(part, style));
                continue;
            }
            row.push(Span::styled(piece.to_owned(), style));
            used += w;
        }
    }
    if !row.is_empty() {
        out.push(Line::from(row));
    }
}

/// `"ab  cd e"` → `["ab  ", "cd ", "e"]`.
fn split_words(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut in_space = false;
    for (i, c) in text.char_indices() {
        if c == ' ' {
            in_space = true;
        } else if in_space {
            pieces.push(&text[start..i]);
            start = i;
            in_space = false;
        }
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}
