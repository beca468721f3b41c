//! Frames: a u32 big-endian payload length, then the payload.
//!
//! The length counts the payload only (not the 4 header bytes). A length equal
//! to the configured maximum is accepted. The decoder checks the length as soon
//! as the header is complete, before buffering any payload, and grows its
//! payload buffer only as bytes arrive, so a peer declaring a huge frame cannot
//! make it allocate. Error texts follow the reference implementation.

use std::fmt;
use std::sync::{Arc, OnceLock};

/// Default maximum payload length: 16 MiB.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// Bytes of the length prefix.
pub const FRAME_HEADER_LEN: usize = 4;

/// The most payload buffer the decoder reserves ahead of bytes that have arrived.
const PAYLOAD_BLOCK_LEN: usize = 64 * 1024;

/// What class of problem a [`FrameError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameErrorKind {
    /// A header declared, or a payload to encode has, more than the maximum.
    TooLong {
        /// The declared or actual payload length.
        len: u64,
        /// The configured maximum.
        max: u32,
    },
    /// The stream ended inside a header or a payload.
    Truncated,
    /// The decoder failed earlier and accepts nothing more.
    Failed,
    /// [`FrameDecoder::end`] was already called.
    Ended,
    /// Anything else.
    Other,
}

/// Why the byte stream cannot be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    kind: FrameErrorKind,
    message: String,
}

impl FrameError {
    /// An error of kind [`FrameErrorKind::Other`], for other modules of the crate.
    #[allow(dead_code)]
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self::with_kind(FrameErrorKind::Other, message)
    }

    fn with_kind(kind: FrameErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The class of problem.
    pub fn kind(&self) -> FrameErrorKind {
        self.kind
    }

    /// The human-readable message (the same text as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FrameError {}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Open,
    /// Holds the message of the error that failed the decoder.
    Failed(String),
    Ended,
}

/// Incremental frame decoder. Accepts any split or coalescing of the stream.
/// Once it has failed it stays failed.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame_len: u32,
    header: [u8; FRAME_HEADER_LEN],
    header_len: usize,
    /// The declared length of the payload being read, once its header is complete.
    expected: Option<usize>,
    payload: Vec<u8>,
    state: State,
}

impl FrameDecoder {
    /// A decoder accepting payloads up to `max_frame_len` bytes (inclusive).
    pub fn new(max_frame_len: u32) -> Self {
        Self {
            max_frame_len,
            header: [0; FRAME_HEADER_LEN],
            header_len: 0,
            expected: None,
            payload: Vec::new(),
            state: State::Open,
        }
    }

    /// The configured maximum payload length.
    pub fn max_frame_len(&self) -> u32 {
        self.max_frame_len
    }

    /// True once any error has occurred; every later call fails.
    pub fn is_failed(&self) -> bool {
        matches!(self.state, State::Failed(_))
    }

    /// Bytes of an incomplete header or payload currently held.
    pub fn buffered_len(&self) -> usize {
        self.header_len + self.payload.len()
    }

    /// Feeds `chunk`, appending each completed payload to `out`.
    ///
    /// Payloads completed before an error in the same chunk stay in `out`;
    /// after an error the decoder is permanently failed.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), FrameError> {
        self.check_open()?;
        let mut rest = chunk;
        while !rest.is_empty() {
            let Some(expected) = self.expected else {
                let wanted = FRAME_HEADER_LEN - self.header_len;
                let (head, tail) = rest.split_at(wanted.min(rest.len()));
                self.header[self.header_len..self.header_len + head.len()].copy_from_slice(head);
                self.header_len += head.len();
                rest = tail;
                if self.header_len < FRAME_HEADER_LEN {
                    break;
                }
                self.header_len = 0;
                let len = u32::from_be_bytes(self.header);
                if len > self.max_frame_len {
                    return Err(self.fail(FrameError::with_kind(
                        FrameErrorKind::TooLong {
                            len: u64::from(len),
                            max: self.max_frame_len,
                        },
                        format!(
                            "Frame length {len} exceeds configured limit of {}",
                            self.max_frame_len
                        ),
                    )));
                }
                // Lossless: usize is at least 32 bits on every supported target.
                let len = len as usize;
                if len == 0 {
                    out.push(Vec::new());
                } else {
                    // Reserve no more than has arrived, or one block, whichever is larger.
                    self.payload = Vec::with_capacity(len.min(rest.len().max(PAYLOAD_BLOCK_LEN)));
                    self.expected = Some(len);
                }
                continue;
            };
            let (head, tail) = rest.split_at((expected - self.payload.len()).min(rest.len()));
            self.append_payload(head, expected);
            rest = tail;
            if self.payload.len() == expected {
                out.push(std::mem::take(&mut self.payload));
                self.expected = None;
            }
        }
        Ok(())
    }

    /// Signals end of stream: a partial header or payload is an error.
    pub fn end(&mut self) -> Result<(), FrameError> {
        self.check_open()?;
        if self.header_len != 0 {
            let detail = format!("{} of {FRAME_HEADER_LEN} header bytes", self.header_len);
            return Err(self.fail(truncated(&detail)));
        }
        if let Some(expected) = self.expected {
            let detail = format!("{} of {expected} payload bytes", self.payload.len());
            return Err(self.fail(truncated(&detail)));
        }
        self.state = State::Ended;
        Ok(())
    }

    fn check_open(&self) -> Result<(), FrameError> {
        match &self.state {
            State::Open => Ok(()),
            State::Failed(cause) => Err(FrameError::with_kind(
                FrameErrorKind::Failed,
                format!("Frame decoder has failed (earlier error: {cause})"),
            )),
            State::Ended => Err(FrameError::with_kind(
                FrameErrorKind::Ended,
                "Frame decoder has ended",
            )),
        }
    }

    /// Appends to the payload, growing the buffer geometrically but never
    /// beyond the declared length.
    fn append_payload(&mut self, bytes: &[u8], expected: usize) {
        let needed = self.payload.len() + bytes.len();
        if needed > self.payload.capacity() {
            let target = needed
                .max(self.payload.capacity().saturating_mul(2))
                .min(expected);
            self.payload.reserve_exact(target - self.payload.len());
        }
        self.payload.extend_from_slice(bytes);
    }

    /// Drops all buffered state and records the failure.
    fn fail(&mut self, error: FrameError) -> FrameError {
        self.header_len = 0;
        self.expected = None;
        self.payload = Vec::new();
        self.state = State::Failed(error.message.clone());
        error
    }
}

fn truncated(detail: &str) -> FrameError {
    FrameError::with_kind(
        FrameErrorKind::Truncated,
        format!("Truncated frame at end of stream ({detail})"),
    )
}

/// Prefixes `payload` with its length. Fails when it exceeds `max_frame_len`.
pub fn encode_frame(payload: &[u8], max_frame_len: u32) -> Result<Vec<u8>, FrameError> {
    let len = payload_len(payload.len(), max_frame_len)?;
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(payload);
    Ok(frame)
}

/// Frames `head`, the `shared` pieces and `tail` without copying the shared
/// ones: for a large payload around parts that already exist (an envelope
/// around a cached session list or session snapshot), the frame holds those
/// parts instead of a copy of them. Fails as [`encode_frame`] does when the
/// payload exceeds `max_frame_len`.
pub fn frame_shared(
    head: &[u8],
    shared: &[Arc<[u8]>],
    tail: &[u8],
    max_frame_len: u32,
) -> Result<Frame, FrameError> {
    let payload = head.len() + shared.iter().map(|p| p.len()).sum::<usize>() + tail.len();
    let len = payload_len(payload, max_frame_len)?;
    // Collected from an iterator of known length: one allocation, no copy.
    let first: Arc<[u8]> = len.to_be_bytes().iter().chain(head).copied().collect();
    let mut pieces = Vec::with_capacity(shared.len() + 2);
    pieces.push(first);
    pieces.extend(shared.iter().filter(|p| !p.is_empty()).cloned());
    if !tail.is_empty() {
        pieces.push(Arc::from(tail));
    }
    Ok(Frame(Repr::Pieces(Arc::new(Pieces {
        len: FRAME_HEADER_LEN + payload,
        pieces,
        joined: OnceLock::new(),
    }))))
}

/// One frame to send (header and payload), shared by every connection it
/// goes to: one buffer, or shared pieces whose concatenation it is
/// ([`frame_shared`]). A driver writes the pieces in order (`writev`);
/// nothing in them is interpreted but their bytes. Frames are equal when
/// their bytes are, however they are cut.
#[derive(Clone)]
pub struct Frame(Repr);

#[derive(Clone)]
enum Repr {
    Whole(Arc<[u8]>),
    Pieces(Arc<Pieces>),
}

/// A frame in pieces, shared by its recipients.
struct Pieces {
    len: usize,
    pieces: Vec<Arc<[u8]>>,
    /// The bytes in one buffer, once a recipient needed them so (a
    /// WebSocket message): made once for all of them.
    joined: OnceLock<Arc<[u8]>>,
}

impl Frame {
    /// Its length in bytes, header included.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Whole(bytes) => bytes.len(),
            Repr::Pieces(pieces) => pieces.len,
        }
    }

    /// True for no bytes at all (a frame always has its header).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces, in order: their concatenation is the frame.
    pub fn pieces(&self) -> &[Arc<[u8]>] {
        match &self.0 {
            Repr::Whole(bytes) => std::slice::from_ref(bytes),
            Repr::Pieces(pieces) => &pieces.pieces,
        }
    }

    /// The bytes in one buffer: the frame's own if it is one, else a copy.
    pub fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self.pieces() {
            [one] => std::borrow::Cow::Borrowed(one),
            pieces => std::borrow::Cow::Owned(pieces.concat()),
        }
    }

    /// The bytes in one shared buffer: the frame's own if it is one, else a
    /// copy, made once and shared by every clone of the frame.
    pub fn into_contiguous(self) -> Arc<[u8]> {
        match self.0 {
            Repr::Whole(bytes) => bytes,
            Repr::Pieces(pieces) => pieces
                .joined
                .get_or_init(|| pieces.pieces.concat().into())
                .clone(),
        }
    }

    /// True when both are the same frame (clones of one), not only equal bytes.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Repr::Whole(a), Repr::Whole(b)) => Arc::ptr_eq(a, b),
            (Repr::Pieces(a), Repr::Pieces(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl From<Arc<[u8]>> for Frame {
    fn from(bytes: Arc<[u8]>) -> Self {
        Self(Repr::Whole(bytes))
    }
}

impl From<Vec<u8>> for Frame {
    fn from(bytes: Vec<u8>) -> Self {
        Self(Repr::Whole(bytes.into()))
    }
}

impl From<&[u8]> for Frame {
    fn from(bytes: &[u8]) -> Self {
        Self(Repr::Whole(bytes.into()))
    }
}

/// Equal bytes, however the frames are cut into pieces.
impl PartialEq for Frame {
    fn eq(&self, other: &Self) -> bool {
        if self.len() != other.len() {
            return false;
        }
        let (mut a, mut b) = (self.pieces().iter(), other.pieces().iter());
        let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
        loop {
            if x.is_empty() {
                match a.next() {
                    Some(piece) => x = piece,
                    // The lengths are equal: `other` is done too.
                    None => return true,
                }
                continue;
            }
            if y.is_empty() {
                match b.next() {
                    Some(piece) => y = piece,
                    None => return false,
                }
                continue;
            }
            let n = x.len().min(y.len());
            if x[..n] != y[..n] {
                return false;
            }
            (x, y) = (&x[n..], &y[n..]);
        }
    }
}

impl Eq for Frame {}

/// The bytes, as one slice would show them.
impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.pieces().iter().flat_map(|p| p.iter()))
            .finish()
    }
}

/// Completes a frame whose payload was written after [`FRAME_HEADER_LEN`]
/// placeholder bytes (a payload encoded straight into its frame, with no
/// copy): writes the header. Fails as [`encode_frame`] does when the payload
/// exceeds `max_frame_len`.
pub fn write_header(frame: &mut [u8], max_frame_len: u32) -> Result<(), FrameError> {
    assert!(
        frame.len() >= FRAME_HEADER_LEN,
        "a frame has room for its header"
    );
    let len = payload_len(frame.len() - FRAME_HEADER_LEN, max_frame_len)?;
    frame[..FRAME_HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// The header of a payload of `len` bytes, or why it cannot be sent.
fn payload_len(len: usize, max_frame_len: u32) -> Result<u32, FrameError> {
    match u32::try_from(len) {
        Ok(len) if len <= max_frame_len => Ok(len),
        _ => Err(FrameError::with_kind(
            FrameErrorKind::TooLong {
                len: len as u64,
                max: max_frame_len,
            },
            format!("Frame payload length {len} exceeds configured limit of {max_frame_len}"),
        )),
    }
}
