//! Strict CBOR subset: encoder and decoder of one data item.
//!
//! The subset is the one pi protocol v1 allows (RFC 8949, definite lengths
//! only): `null`, `true`, `false`, integers within ±(2^53 − 1) (major types 0
//! and 1), float64 (`0xfb`), UTF-8 text strings, byte strings, arrays and maps
//! whose keys are unique text strings.
//!
//! The decoder rejects everything else: tags, indefinite lengths, the break
//! code, `undefined`, float16/float32, other simple values, non-finite floats,
//! integers outside the safe range, duplicate or non-text map keys, invalid
//! UTF-8, truncated input and trailing bytes. It enforces [`CborLimits`] before
//! allocating anything sized by the input, and never panics.
//!
//! The encoder writes shortest-form integers, writes a number as float64 only
//! when it is not a safe integer (or is −0), and writes map keys in the order
//! given, so that its output is byte-exact with the reference implementation.
//! Error texts follow the reference implementation's `CborError` messages.

use super::Value;
use super::value::MAX_SAFE_INTEGER;
use std::collections::BTreeSet;
use std::fmt;

/// The largest nesting depth the decoder honours, whatever
/// [`CborLimits::max_depth`] says (the reference rejects a larger setting).
pub const MAX_CONFIGURABLE_DEPTH: usize = 512;

/// How many characters of an offending map key an error message quotes.
const MAX_QUOTED_KEY_CHARS: usize = 64;

/// Limits the decoder enforces on untrusted input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CborLimits {
    /// Maximum nesting depth (default 64, at most 512; a larger value acts as
    /// 512). The top-level item is at depth 0, so the default admits 64 levels
    /// of containers below the top-level one.
    pub max_depth: usize,
    /// Maximum elements of an array or entries of a map (default 1,000,000).
    pub max_container_len: usize,
    /// Maximum byte length of a text or byte string, and of the whole encoded
    /// item (default 16 MiB).
    pub max_byte_len: usize,
}

impl Default for CborLimits {
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_container_len: 1_000_000,
            max_byte_len: 16 * 1024 * 1024,
        }
    }
}

impl CborLimits {
    fn effective_max_depth(&self) -> usize {
        self.max_depth.min(MAX_CONFIGURABLE_DEPTH)
    }
}

/// What class of problem a [`CborError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CborErrorKind {
    /// The input ended inside an item (this includes empty input).
    Truncated,
    /// Bytes follow the single top-level item.
    TrailingData,
    /// A tag (major type 6).
    Tag,
    /// An indefinite-length item (additional information 31).
    IndefiniteLength,
    /// The break code `0xff`.
    Break,
    /// `undefined`, float16, float32 or another simple value.
    UnsupportedSimple,
    /// Additional information 28–30, which RFC 8949 reserves.
    MalformedAdditionalInfo,
    /// NaN or ±Infinity.
    NonFiniteNumber,
    /// An integer, or an integral float, outside ±(2^53 − 1).
    IntegerOutOfRange,
    /// An integer argument or length of 2^53 or more.
    ArgumentOutOfRange,
    /// A map key that is not a text string.
    NonTextKey,
    /// A map key that occurs twice in one map.
    DuplicateKey,
    /// A text string that is not valid UTF-8.
    InvalidUtf8,
    /// Nesting deeper than [`CborLimits::max_depth`].
    DepthLimit,
    /// An array or map longer than [`CborLimits::max_container_len`].
    ContainerLimit,
    /// A string, or the whole item, longer than [`CborLimits::max_byte_len`].
    ByteLengthLimit,
    /// Anything else.
    Other,
}

/// Why an item could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CborError {
    kind: CborErrorKind,
    message: String,
}

impl CborError {
    /// An error of kind [`CborErrorKind::Other`], for other modules of the crate.
    #[allow(dead_code)]
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self::with_kind(CborErrorKind::Other, message)
    }

    fn with_kind(kind: CborErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The class of problem.
    pub fn kind(&self) -> CborErrorKind {
        self.kind
    }

    /// The human-readable message (the same text as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CborError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CborError {}

/// Quotes a map key for an error message, shortened to a bounded length.
fn quote_key(key: &str) -> String {
    let mut chars = key.chars();
    let head: String = chars.by_ref().take(MAX_QUOTED_KEY_CHARS).collect();
    if chars.next().is_some() {
        format!("{head:?}…")
    } else {
        format!("{head:?}")
    }
}

fn depth_error(max_depth: usize) -> CborError {
    CborError::with_kind(
        CborErrorKind::DepthLimit,
        format!("CBOR nesting depth exceeds configured limit of {max_depth}"),
    )
}

fn duplicate_key_error(key: &str) -> CborError {
    CborError::with_kind(
        CborErrorKind::DuplicateKey,
        format!("CBOR map contains a duplicate key {}", quote_key(key)),
    )
}

// ---------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------

/// Appends the encoding of `value` to `out`, enforcing the default
/// [`CborLimits`] (so that whatever is encoded also decodes).
///
/// On error nothing is appended: `out` is left as it was.
pub fn encode(value: &Value, out: &mut Vec<u8>) -> Result<(), CborError> {
    encode_with_limits(value, out, &CborLimits::default())
}

/// Like [`encode`], with explicit limits on depth, container length, string
/// length and the total encoded length.
pub fn encode_with_limits(
    value: &Value,
    out: &mut Vec<u8>,
    limits: &CborLimits,
) -> Result<(), CborError> {
    let start = out.len();
    let result = {
        let mut encoder = Encoder::new(out, limits);
        encoder.item(value).and_then(|()| encoder.finish())
    };
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// Checks the length of a whole encoded item against the limits, as
/// [`encode_with_limits`] does (for an item assembled from pieces).
pub fn check_item_len(len: usize, limits: &CborLimits) -> Result<(), CborError> {
    if len > limits.max_byte_len {
        return Err(CborError::with_kind(
            CborErrorKind::ByteLengthLimit,
            format!(
                "CBOR byte length exceeds configured limit of {}",
                limits.max_byte_len
            ),
        ));
    }
    Ok(())
}

/// Encodes `value` into a fresh buffer (see [`encode`]).
pub fn to_vec(value: &Value) -> Result<Vec<u8>, CborError> {
    let mut out = Vec::new();
    encode(value, &mut out)?;
    Ok(out)
}

/// Writes one item piece by piece, for messages built around pre-encoded
/// parts (see [`Encoder::raw`]).
///
/// Containers are written as a header ([`Encoder::map_header`],
/// [`Encoder::array_header`]) followed by their entries; map keys with
/// [`Encoder::text`]. The bytes are those [`encode_with_limits`] writes for
/// the same item, provided the caller writes what a [`Value`] would hold:
/// as many entries as the header says, unique keys in the wanted order.
/// [`Encoder::finish`] enforces the total length.
#[derive(Debug)]
pub struct Encoder<'o, 'l> {
    out: &'o mut Vec<u8>,
    limits: &'l CborLimits,
    max_depth: usize,
    /// Length of `out` before this encoder wrote anything.
    start: usize,
}

impl<'o, 'l> Encoder<'o, 'l> {
    /// An encoder appending to `out` under `limits`.
    pub fn new(out: &'o mut Vec<u8>, limits: &'l CborLimits) -> Self {
        let start = out.len();
        Self {
            out,
            limits,
            max_depth: limits.effective_max_depth(),
            start,
        }
    }

    /// Writes one complete item. Its depth is counted from itself: the
    /// containers opened with headers around it are not (the protocol's
    /// envelopes are a few levels deep, far below any depth limit).
    pub fn item(&mut self, value: &Value) -> Result<(), CborError> {
        self.value(value, 0)
    }

    /// Writes one complete item that the whole message nests `depth`
    /// containers deep, counting its depth from the message as
    /// [`encode_with_limits`] does (for parts encoded on their own that may
    /// nest deeply, like a session snapshot's JSON fields).
    pub fn nested_item(&mut self, value: &Value, depth: usize) -> Result<(), CborError> {
        self.value(value, depth)
    }

    /// Writes the header of a map of `len` entries; the entries (key, value)
    /// follow.
    pub fn map_header(&mut self, len: usize) -> Result<(), CborError> {
        self.container_len("map", len)?;
        self.head(5, len as u64);
        Ok(())
    }

    /// Writes the header of an array of `len` items; the items follow.
    pub fn array_header(&mut self, len: usize) -> Result<(), CborError> {
        self.container_len("array", len)?;
        self.head(4, len as u64);
        Ok(())
    }

    /// Copies one item encoded before (by an encoder with the same limits,
    /// for example into a cache) as it is: nothing is checked.
    pub fn raw(&mut self, item: &[u8]) {
        self.out.extend_from_slice(item);
    }

    /// How many bytes this encoder has written.
    pub fn written(&self) -> usize {
        self.out.len() - self.start
    }

    /// Checks the total length written against the limits. An error leaves
    /// what was written in place: the caller discards it.
    pub fn finish(&self) -> Result<(), CborError> {
        check_item_len(self.out.len() - self.start, self.limits)
    }

    /// Writes an initial byte and argument in the shortest form.
    fn head(&mut self, major: u8, argument: u64) {
        let prefix = major << 5;
        if argument < 24 {
            // Lossless: argument < 24.
            self.out.push(prefix | argument as u8);
        } else if let Ok(byte) = u8::try_from(argument) {
            self.out.extend_from_slice(&[prefix | 24, byte]);
        } else if let Ok(short) = u16::try_from(argument) {
            self.out.push(prefix | 25);
            self.out.extend_from_slice(&short.to_be_bytes());
        } else if let Ok(word) = u32::try_from(argument) {
            self.out.push(prefix | 26);
            self.out.extend_from_slice(&word.to_be_bytes());
        } else {
            self.out.push(prefix | 27);
            self.out.extend_from_slice(&argument.to_be_bytes());
        }
    }

    fn integer(&mut self, n: i64) -> Result<(), CborError> {
        if !(-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).contains(&n) {
            return Err(CborError::with_kind(
                CborErrorKind::IntegerOutOfRange,
                format!(
                    "CBOR integers must be safe JavaScript integers (within ±(2^53 − 1)), got {n}"
                ),
            ));
        }
        match u64::try_from(n) {
            Ok(positive) => self.head(0, positive),
            // n is in [-(2^53 - 1), -1], so -1 - n is in [0, 2^53 - 2].
            Err(_) => self.head(1, (-1 - n).unsigned_abs()),
        }
        Ok(())
    }

    fn float(&mut self, f: f64) -> Result<(), CborError> {
        if !f.is_finite() {
            return Err(CborError::with_kind(
                CborErrorKind::NonFiniteNumber,
                format!("CBOR numbers must be finite, got {f}"),
            ));
        }
        let negative_zero = f == 0.0 && f.is_sign_negative();
        if f.fract() == 0.0 && !negative_zero {
            if f.abs() > MAX_SAFE_INTEGER as f64 {
                return Err(CborError::with_kind(
                    CborErrorKind::IntegerOutOfRange,
                    format!(
                        "CBOR integers must be safe JavaScript integers (within ±(2^53 − 1)), got {f:e}"
                    ),
                ));
            }
            // Lossless: f is integral and within ±(2^53 - 1).
            return self.integer(f as i64);
        }
        self.out.push(0xfb);
        self.out.extend_from_slice(&f.to_be_bytes());
        Ok(())
    }

    /// Writes an unsigned integer field as the schema layer maps it
    /// (`uint_value`): an integer up to 2^53 − 1, and beyond that the float
    /// it would become, which is an error.
    pub fn uint(&mut self, n: u64) -> Result<(), CborError> {
        if n <= MAX_SAFE_INTEGER as u64 {
            self.head(0, n);
            Ok(())
        } else {
            self.float(n as f64)
        }
    }

    /// Writes a number as [`Value::number`] holds it: an integral value as
    /// an integer, anything else as float64 (non-finite numbers and integral
    /// ones beyond ±(2^53 − 1) are errors).
    pub fn number(&mut self, n: f64) -> Result<(), CborError> {
        self.float(n)
    }

    /// Writes `true` or `false`.
    pub fn boolean(&mut self, b: bool) {
        self.out.push(if b { 0xf5 } else { 0xf4 });
    }

    /// Writes a text string (a map key, or a text item).
    pub fn text(&mut self, s: &str) -> Result<(), CborError> {
        if s.len() > self.limits.max_byte_len {
            return Err(CborError::with_kind(
                CborErrorKind::ByteLengthLimit,
                format!(
                    "CBOR text string length exceeds configured limit of {}",
                    self.limits.max_byte_len
                ),
            ));
        }
        self.head(3, s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn container_len(&self, kind: &str, len: usize) -> Result<(), CborError> {
        if len > self.limits.max_container_len {
            return Err(CborError::with_kind(
                CborErrorKind::ContainerLimit,
                format!(
                    "CBOR {kind} length exceeds configured limit of {}",
                    self.limits.max_container_len
                ),
            ));
        }
        Ok(())
    }

    fn value(&mut self, value: &Value, depth: usize) -> Result<(), CborError> {
        if depth > self.max_depth {
            return Err(depth_error(self.max_depth));
        }
        match value {
            Value::Null => self.out.push(0xf6),
            Value::Bool(false) => self.out.push(0xf4),
            Value::Bool(true) => self.out.push(0xf5),
            Value::Int(n) => self.integer(*n)?,
            Value::Float(f) => self.float(*f)?,
            Value::Text(s) => self.text(s)?,
            Value::Bytes(bytes) => {
                if bytes.len() > self.limits.max_byte_len {
                    return Err(CborError::with_kind(
                        CborErrorKind::ByteLengthLimit,
                        format!(
                            "CBOR byte string length exceeds configured limit of {}",
                            self.limits.max_byte_len
                        ),
                    ));
                }
                self.head(2, bytes.len() as u64);
                self.out.extend_from_slice(bytes);
            }
            Value::Array(items) => {
                self.container_len("array", items.len())?;
                self.head(4, items.len() as u64);
                for item in items {
                    self.value(item, depth + 1)?;
                }
            }
            Value::Map(entries) => {
                self.container_len("map", entries.len())?;
                check_unique_keys(entries)?;
                self.head(5, entries.len() as u64);
                for (key, item) in entries {
                    self.text(key)?;
                    self.value(item, depth + 1)?;
                }
            }
        }
        Ok(())
    }
}

/// A [`Value::Map`] may hold the same key twice; the wire format may not.
fn check_unique_keys(entries: &[(String, Value)]) -> Result<(), CborError> {
    const LINEAR_SCAN_MAX: usize = 16;
    if entries.len() <= LINEAR_SCAN_MAX {
        for (i, (key, _)) in entries.iter().enumerate() {
            if entries[..i].iter().any(|(earlier, _)| earlier == key) {
                return Err(duplicate_key_error(key));
            }
        }
    } else {
        let mut seen = BTreeSet::new();
        for (key, _) in entries {
            if !seen.insert(key.as_str()) {
                return Err(duplicate_key_error(key));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------

/// Decodes exactly one item from `bytes`; trailing bytes are an error.
///
/// Integral float64 values within the safe range (other than −0) come back as
/// [`Value::Int`] (see [`Value::number`]). Non-minimal integer and length
/// encodings are accepted.
pub fn decode(bytes: &[u8], limits: &CborLimits) -> Result<Value, CborError> {
    decode_whole(bytes, limits, None)
}

/// Decodes exactly one item like [`decode`] (the same checks, the same
/// errors), except for the arrays at `at(outer, inner)`: an array under key
/// `inner` of a map that is the value of key `outer` of the top-level map.
/// Each element of such an array is passed to `element` with its index,
/// the array's length (bounded by the bytes left, so a hint to reserve) and
/// where its bytes lie in `bytes`, as soon as it is decoded, and the array
/// appears in the returned tree empty.
///
/// So a large array of records (a snapshot's transcript in a worker frame)
/// is never held as one tree: the caller parses each element and drops its
/// tree before the next is built.
pub fn decode_streaming(
    bytes: &[u8],
    limits: &CborLimits,
    at: &dyn Fn(&str, &str) -> bool,
    element: &mut dyn FnMut(usize, usize, Value, std::ops::Range<usize>),
) -> Result<Value, CborError> {
    decode_whole(bytes, limits, Some(Stream { at, element }))
}

/// [`decode`] and [`decode_streaming`]: the length limit, then one item.
fn decode_whole(
    bytes: &[u8],
    limits: &CborLimits,
    stream: Option<Stream<'_>>,
) -> Result<Value, CborError> {
    if bytes.len() > limits.max_byte_len {
        return Err(CborError::with_kind(
            CborErrorKind::ByteLengthLimit,
            format!(
                "CBOR byte length exceeds configured limit of {}",
                limits.max_byte_len
            ),
        ));
    }
    let mut decoder = Decoder {
        bytes,
        pos: 0,
        limits,
        max_depth: limits.effective_max_depth(),
        stream,
        root_key: None,
    };
    decoder.whole()
}

struct Decoder<'a, 'l, 's> {
    bytes: &'a [u8],
    pos: usize,
    limits: &'l CborLimits,
    max_depth: usize,
    /// Set by [`decode_streaming`].
    stream: Option<Stream<'s>>,
    /// The key of the top-level map whose value is being decoded.
    root_key: Option<&'a str>,
}

/// Which arrays [`decode_streaming`] hands out element by element, and to what.
struct Stream<'s> {
    at: &'s dyn Fn(&str, &str) -> bool,
    element: &'s mut dyn FnMut(usize, usize, Value, std::ops::Range<usize>),
}

fn truncated() -> CborError {
    CborError::with_kind(CborErrorKind::Truncated, "Truncated CBOR payload")
}

impl<'a> Decoder<'a, '_, '_> {
    /// The one item of the payload, with no trailing bytes.
    fn whole(&mut self) -> Result<Value, CborError> {
        let value = self.item(0)?;
        let trailing = self.bytes.len() - self.pos;
        if trailing != 0 {
            return Err(CborError::with_kind(
                CborErrorKind::TrailingData,
                format!("CBOR payload contains trailing data ({trailing} bytes after the item)"),
            ));
        }
        Ok(value)
    }

    /// Whether the value about to be read, under `key` of a map at `depth`,
    /// is an array [`decode_streaming`] hands out.
    fn streams(&self, depth: usize, key: &str) -> bool {
        let next_is_array = self.bytes.get(self.pos).is_some_and(|b| b >> 5 == 4);
        match (&self.stream, self.root_key) {
            (Some(stream), Some(outer)) if depth == 1 && next_is_array => (stream.at)(outer, key),
            _ => false,
        }
    }

    /// An array at `depth` whose elements go to the stream one by one; the
    /// tree gets it empty. The checks are [`Decoder::item`]'s.
    fn streamed_array(&mut self, depth: usize) -> Result<Value, CborError> {
        if depth > self.max_depth {
            return Err(depth_error(self.max_depth));
        }
        let info = self.byte()? & 0x1f;
        let len = self.length(info, "array", self.limits.max_container_len)?;
        // Every element takes at least one byte: never hint more than could arrive.
        let hint = len.min(self.remaining());
        for index in 0..len {
            let start = self.pos;
            let element = self.item(depth + 1)?;
            if let Some(stream) = &mut self.stream {
                (stream.element)(index, hint, element, start..self.pos);
            }
        }
        Ok(Value::Array(Vec::new()))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8, CborError> {
        let byte = *self.bytes.get(self.pos).ok_or_else(truncated)?;
        self.pos += 1;
        Ok(byte)
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], CborError> {
        if len > self.remaining() {
            return Err(truncated());
        }
        let bytes: &'a [u8] = self.bytes;
        let slice = &bytes[self.pos..self.pos + len];
        self.pos += len;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CborError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    /// Reads the argument that follows an initial byte (integer value or length).
    fn argument(&mut self, info: u8) -> Result<u64, CborError> {
        let argument = match info {
            0..=23 => u64::from(info),
            24 => u64::from(self.byte()?),
            25 => u64::from(u16::from_be_bytes(self.array()?)),
            26 => u64::from(u32::from_be_bytes(self.array()?)),
            27 => u64::from_be_bytes(self.array()?),
            31 => {
                return Err(CborError::with_kind(
                    CborErrorKind::IndefiniteLength,
                    "Indefinite-length CBOR items are not supported",
                ));
            }
            _ => {
                return Err(CborError::with_kind(
                    CborErrorKind::MalformedAdditionalInfo,
                    format!("Malformed CBOR additional information ({info})"),
                ));
            }
        };
        if argument > MAX_SAFE_INTEGER as u64 {
            return Err(CborError::with_kind(
                CborErrorKind::ArgumentOutOfRange,
                "Decoded CBOR integer or length is outside the safe range",
            ));
        }
        Ok(argument)
    }

    /// Reads the length of a string or container and checks it against `limit`.
    fn length(&mut self, info: u8, kind: &str, limit: usize) -> Result<usize, CborError> {
        if info == 31 {
            return Err(CborError::with_kind(
                CborErrorKind::IndefiniteLength,
                format!("Indefinite-length CBOR {kind}s are not supported"),
            ));
        }
        let length = self.argument(info)?;
        match usize::try_from(length) {
            Ok(length) if length <= limit => Ok(length),
            _ => {
                let error_kind = if kind == "array" || kind == "map" {
                    CborErrorKind::ContainerLimit
                } else {
                    CborErrorKind::ByteLengthLimit
                };
                Err(CborError::with_kind(
                    error_kind,
                    format!("CBOR {kind} length exceeds configured limit of {limit}"),
                ))
            }
        }
    }

    fn item(&mut self, depth: usize) -> Result<Value, CborError> {
        if depth > self.max_depth {
            return Err(depth_error(self.max_depth));
        }
        let initial = self.byte()?;
        let info = initial & 0x1f;
        match initial >> 5 {
            0 => {
                // Lossless: argument() caps at 2^53 - 1.
                Ok(Value::Int(self.argument(info)? as i64))
            }
            1 => {
                let argument = self.argument(info)?;
                if argument >= MAX_SAFE_INTEGER as u64 {
                    return Err(CborError::with_kind(
                        CborErrorKind::IntegerOutOfRange,
                        "Decoded CBOR integer is outside the safe range",
                    ));
                }
                // Lossless: argument < 2^53 - 1.
                Ok(Value::Int(-1 - argument as i64))
            }
            2 => {
                let len = self.length(info, "byte string", self.limits.max_byte_len)?;
                Ok(Value::Bytes(self.take(len)?.to_vec()))
            }
            3 => Ok(Value::Text(self.text(info)?.to_owned())),
            4 => {
                let len = self.length(info, "array", self.limits.max_container_len)?;
                // Every element takes at least one byte: never reserve more than could arrive.
                let mut items = Vec::with_capacity(len.min(self.remaining()));
                for _ in 0..len {
                    items.push(self.item(depth + 1)?);
                }
                Ok(Value::Array(items))
            }
            5 => self.map(info, depth),
            6 => Err(CborError::with_kind(
                CborErrorKind::Tag,
                "CBOR tags are not supported",
            )),
            _ => self.simple(info),
        }
    }

    /// Reads the length and bytes of a text string whose initial byte is read.
    fn text(&mut self, info: u8) -> Result<&'a str, CborError> {
        let len = self.length(info, "text string", self.limits.max_byte_len)?;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|error| {
            CborError::with_kind(
                CborErrorKind::InvalidUtf8,
                format!(
                    "CBOR text string contains invalid UTF-8 (at byte {})",
                    error.valid_up_to()
                ),
            )
        })
    }

    fn map(&mut self, info: u8, depth: usize) -> Result<Value, CborError> {
        let len = self.length(info, "map", self.limits.max_container_len)?;
        // Every entry takes at least two bytes.
        let mut entries = Vec::with_capacity(len.min(self.remaining() / 2));
        // Keys borrow the input: valid UTF-8 compares equal exactly when its bytes do.
        let mut seen: BTreeSet<&'a str> = BTreeSet::new();
        for _ in 0..len {
            let key = self.key(depth + 1)?;
            if !seen.insert(key) {
                return Err(duplicate_key_error(key));
            }
            if depth == 0 {
                self.root_key = Some(key);
            }
            let value = if self.streams(depth, key) {
                self.streamed_array(depth + 1)?
            } else {
                self.item(depth + 1)?
            };
            entries.push((key.to_owned(), value));
        }
        Ok(Value::Map(entries))
    }

    /// Reads a map key, which must be a text string.
    fn key(&mut self, depth: usize) -> Result<&'a str, CborError> {
        if depth > self.max_depth {
            return Err(depth_error(self.max_depth));
        }
        let initial = *self.bytes.get(self.pos).ok_or_else(truncated)?;
        if initial >> 5 == 3 {
            self.pos += 1;
            return self.text(initial & 0x1f);
        }
        // Decode the item anyway so that a malformed key reports what is wrong
        // with it (as the reference does), and otherwise name its kind.
        let key = self.item(depth)?;
        Err(CborError::with_kind(
            CborErrorKind::NonTextKey,
            format!("CBOR map keys must be strings, got {}", key.kind()),
        ))
    }

    fn simple(&mut self, info: u8) -> Result<Value, CborError> {
        match info {
            20 => Ok(Value::Bool(false)),
            21 => Ok(Value::Bool(true)),
            22 => Ok(Value::Null),
            27 => {
                let f = f64::from_be_bytes(self.array()?);
                if !f.is_finite() {
                    return Err(CborError::with_kind(
                        CborErrorKind::NonFiniteNumber,
                        format!("Decoded CBOR number must be finite, got {f}"),
                    ));
                }
                if f.fract() == 0.0 && f.abs() > MAX_SAFE_INTEGER as f64 {
                    return Err(CborError::with_kind(
                        CborErrorKind::IntegerOutOfRange,
                        format!("Decoded CBOR integer is outside the safe range ({f:e})"),
                    ));
                }
                Ok(Value::number(f))
            }
            31 => Err(CborError::with_kind(
                CborErrorKind::Break,
                "CBOR break marker is not supported",
            )),
            _ => {
                let what = match info {
                    23 => "undefined",
                    24 => "one-byte simple value",
                    25 => "float16",
                    26 => "float32",
                    28..=30 => "reserved additional information",
                    _ => "unassigned simple value",
                };
                Err(CborError::with_kind(
                    CborErrorKind::UnsupportedSimple,
                    format!(
                        "Unsupported CBOR simple value or floating-point width: 0x{:02x} ({what})",
                        0xe0 | info
                    ),
                ))
            }
        }
    }
}
