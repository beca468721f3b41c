//! Frames: a u32 big-endian payload length, then the payload.

use std::fmt;

/// Default maximum payload length: 16 MiB.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// Why the byte stream cannot be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    message: String,
}

impl FrameError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FrameError {}

/// Incremental frame decoder. Accepts any split or coalescing of the stream.
/// Once it has failed it stays failed.
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame_len: u32,
}

impl FrameDecoder {
    /// A decoder accepting payloads up to `max_frame_len` bytes (inclusive).
    pub fn new(max_frame_len: u32) -> Self {
        Self { max_frame_len }
    }

    /// Feeds `chunk`, appending each completed payload to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), FrameError> {
        let _ = (chunk, out, self.max_frame_len);
        Err(FrameError::new("not yet implemented"))
    }

    /// Signals end of stream: a partial header or payload is an error.
    pub fn end(&mut self) -> Result<(), FrameError> {
        Err(FrameError::new("not yet implemented"))
    }
}

/// Prefixes `payload` with its length. Fails when it exceeds `max_frame_len`.
pub fn encode_frame(payload: &[u8], max_frame_len: u32) -> Result<Vec<u8>, FrameError> {
    let _ = (payload, max_frame_len);
    Err(FrameError::new("not yet implemented"))
}
