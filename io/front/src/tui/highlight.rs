//! Syntax highlighting of a reply's code blocks, with syntect (Sublime
//! Text's grammars and themes, pure Rust with `fancy-regex`): a block is
//! highlighted once its fence closes (a streaming one stays plain), and
//! the highlighted lines are kept, so a redraw costs a lookup.

use ratatui::style::{Color, Style};
use ratatui::text::Span;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{LazyLock, Mutex};
use syntect::easy::HighlightLines;
use syntect::highlighting::{Theme, ThemeSet};
use syntect::parsing::SyntaxSet;

/// Highlighted blocks kept; past it the memo starts again.
const KEPT_BLOCKS: usize = 256;

static SYNTAXES: LazyLock<SyntaxSet> = LazyLock::new(SyntaxSet::load_defaults_nonewlines);
static THEME: LazyLock<Theme> = LazyLock::new(|| {
    let mut themes = ThemeSet::load_defaults().themes;
    themes.remove("base16-eighties.dark").unwrap_or_default()
});
/// A block's lines, each as coloured spans.
type Coloured = Vec<Vec<Span<'static>>>;

static KEPT: LazyLock<Mutex<HashMap<u64, Option<Coloured>>>> = LazyLock::new(Default::default);

/// The lines of `code` as spans coloured for `lang` (a fence's info
/// string: `rust`, `py`, `sh`, …), or `None` for a language syntect does
/// not know.
pub(crate) fn lines(lang: &str, code: &str) -> Option<Coloured> {
    let mut hasher = DefaultHasher::new();
    (lang, code).hash(&mut hasher);
    let key = hasher.finish();
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(lines) = kept.get(&key) {
        return lines.clone();
    }
    let lines = highlight(lang, code);
    if kept.len() >= KEPT_BLOCKS {
        kept.clear();
    }
    kept.insert(key, lines.clone());
    lines
}

fn highlight(lang: &str, code: &str) -> Option<Coloured> {
    let token = lang.split([',', ' ', '{']).next().unwrap_or("").trim();
    let syntax = SYNTAXES
        .find_syntax_by_token(token)
        .filter(|_| !token.is_empty())?;
    let mut lines = HighlightLines::new(syntax, &THEME);
    code.split('\n')
        .map(|line| {
            let ranges = lines.highlight_line(line, &SYNTAXES).ok()?;
            Some(
                ranges
                    .into_iter()
                    .map(|(style, text)| {
                        let fg = style.foreground;
                        Span::styled(
                            text.to_owned(),
                            Style::default().fg(Color::Rgb(fg.r, fg.g, fg.b)),
                        )
                    })
                    .collect(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_language_is_coloured_and_an_unknown_one_is_not() {
        let rust = lines("rust", "fn main() {\n    let x = 1;\n}").expect("rust is known");
        assert_eq!(rust.len(), 3);
        let text: String = rust[0].iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "fn main() {");
        let colours: std::collections::BTreeSet<String> = (rust.iter().flatten())
            .map(|s| format!("{:?}", s.style.fg))
            .collect();
        assert!(colours.len() > 1, "more than one colour: {colours:?}");
        assert!(lines("no-such-language", "x").is_none());
        assert!(lines("", "x").is_none());
        // Kept: the same block again is the same lines.
        assert_eq!(lines("rust", "fn main() {\n    let x = 1;\n}"), Some(rust));
    }
}
