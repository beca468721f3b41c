//! An incremental Server-Sent Events parser (the WHATWG event-stream format):
//! bytes in any split, `\n`, `\r\n` or `\r` line ends, comments, multi-line
//! `data`. Only `event` and `data` matter to the providers.

/// Longest line we buffer before declaring the stream malformed.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field, if any.
    pub(crate) event: Option<String>,
    /// The `data:` lines joined by `\n`.
    pub(crate) data: String,
}

#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds bytes; completed events are appended to `out`.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(rel) = self.buf[start..]
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
        {
            let end = start + rel;
            let next = if self.buf[end] == b'\r' {
                match self.buf.get(end + 1) {
                    Some(b'\n') => end + 2,
                    Some(_) => end + 1,
                    // A lone `\r` at the end: wait to see whether `\n` follows.
                    None => break,
                }
            } else {
                end + 1
            };
            let line = std::str::from_utf8(&self.buf[start..end])
                .map_err(|_| "invalid UTF-8 in the event stream".to_string())?
                .to_string();
            self.line(&line, out);
            start = next;
        }
        self.buf.drain(..start);
        if self.buf.len() > MAX_LINE {
            return Err(format!(
                "an event-stream line is longer than {MAX_LINE} bytes"
            ));
        }
        Ok(())
    }

    /// The stream ended. As the standard says, an event not ended by its
    /// blank line is discarded (and an unfinished line with it): a stream cut
    /// mid-event is then a stream that ended early, which the providers
    /// report as a retryable "stream ended unexpectedly", not as malformed.
    pub(crate) fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), String> {
        // A `\r` held back to see whether `\n` follows ended its line.
        if let Some((b'\r', line)) = self.buf.split_last() {
            let line = std::str::from_utf8(line)
                .map_err(|_| "invalid UTF-8 in the event stream".to_string())?
                .to_string();
            self.line(&line, out);
        }
        self.buf.clear();
        self.data = None;
        self.event = None;
        Ok(())
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(SseEvent {
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(text: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for chunk in text.chunks(piece) {
            p.push(chunk, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn any_split_and_line_ending_gives_the_same_events() {
        let text =
            "event: a\ndata: 1\n\n: comment\r\ndata:x\r\ndata: é\r\n\r\nevent: b\rdata: {}\r\r";
        let want = vec![
            SseEvent {
                event: Some("a".into()),
                data: "1".into(),
            },
            SseEvent {
                event: None,
                data: "x\né".into(),
            },
            SseEvent {
                event: Some("b".into()),
                data: "{}".into(),
            },
        ];
        for piece in 1..text.len() {
            assert_eq!(
                parse_in_pieces(text.as_bytes(), piece),
                want,
                "piece {piece}"
            );
        }
    }

    #[test]
    fn an_event_cut_before_its_blank_line_is_discarded() {
        assert_eq!(parse_in_pieces(b"data: [DONE]", 4), vec![]);
        assert_eq!(parse_in_pieces(b"data: {\"a\":\n", 3), vec![]);
        assert_eq!(
            parse_in_pieces(b"data: one\n\ndata: tw", 5),
            vec![SseEvent {
                event: None,
                data: "one".into()
            }],
            "the finished event before the cut is kept"
        );
        // A cut in the middle of a multi-byte character is not an error.
        let mut p = SseParser::default();
        let mut out = Vec::new();
        p.push(b"data: caf\xc3", &mut out).unwrap();
        p.finish(&mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: \xff\n", &mut Vec::new()).is_err());
    }
}
