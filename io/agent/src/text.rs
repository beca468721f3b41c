//! Text helpers shared by the providers and the tools.

/// At most `max` bytes of `text` (cut at a character boundary), with `…`
/// when it was cut.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
