//! Strict schema mapping between typed messages and [`Value`] trees, and the
//! one-call payload encoders/decoders built on [`crate::wire::cbor`].
//!
//! The schema is the reference's (`@earendil-works/pi-protocol@0.84.4`,
//! `schemas.js`): every object is closed (`additionalProperties: false`), ids
//! are non-empty strings, counters and timestamps are integers ≥ 0, costs are
//! finite numbers ≥ 0 and opaque fields are strict JSON. Two extensions are
//! accepted on top of it: an optional `token` in the client hello and the
//! `auth` error code.
//!
//! - [`Schema`]: `to_value` / `from_value` for every message and every data
//!   type that appears inside one, so other codecs (the worker channel) can
//!   embed them.
//! - [`Fields`] and the `read_*` helpers: the strict map reader the
//!   implementations are built from, public for those other codecs.
//! - [`encode_client_message`] and friends: schema plus CBOR in one call.
//! - [`direct`]: writers of the hot server messages straight to bytes (the
//!   same bytes, without the tree); [`spliced`]: messages around CBOR
//!   encoded earlier; [`read`]: a reader of the common client requests
//!   straight from bytes, which leaves everything else to the tree.
//!
//! Encoding writes map keys in the reference's schema order (the struct field
//! order of [`super::types`]), omits absent optionals, and validates the tree
//! it built with the decoder before writing a byte, as the reference encoder
//! does: a typed value that the schema forbids (an empty id, `errorMessage` on
//! a streaming item, a non-finite cost) is an error, never a bad frame.

pub mod direct;
mod fields;
mod items;
mod messages;
pub mod read;
pub mod spliced;

pub use fields::{
    Fields, MapBuilder, read_bool, read_id, read_json, read_list, read_number, read_object,
    read_string, read_uint, read_uint_min, uint_value,
};

use super::types::*;
use crate::wire::{CborLimits, Value, cbor};
use std::fmt;

/// The longest error message, in bytes, as in the reference codec.
pub const MAX_ERROR_LEN: usize = 500;

/// A payload that is not a valid message: bad CBOR or a schema violation.
/// The message names what was wrong and where (for example `request.sessionId`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    message: String,
}

impl SchemaError {
    /// An error with the given text, cut to [`MAX_ERROR_LEN`] bytes.
    pub fn new(message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_ERROR_LEN {
            let mut end = MAX_ERROR_LEN - 3;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("...");
        }
        Self { message }
    }

    /// An error about the value at `path`: `"<path>: <problem>"`.
    pub fn at(path: &Path<'_>, problem: impl fmt::Display) -> Self {
        Self::new(format!("{}: {problem}", path.label()))
    }

    /// The error text.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SchemaError {}

/// Where a value sits inside a message, rendered like `request.request.sessionId`
/// or `event.event.snapshot.transcript[2].content[0]`.
///
/// Paths are built on the stack while decoding and only rendered into a
/// string when an error is reported.
#[derive(Debug, Clone, Copy)]
pub enum Path<'a> {
    /// The outermost name; may be empty (the message itself).
    Root(&'a str),
    /// A map key below a parent.
    Key(&'a Path<'a>, &'a str),
    /// An array index below a parent.
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    /// The path of `key` inside this map.
    pub fn key(&'a self, key: &'a str) -> Self {
        Self::Key(self, key)
    }

    /// The path of item `index` inside this array.
    pub fn index(&'a self, index: usize) -> Self {
        Self::Index(self, index)
    }

    fn is_empty(&self) -> bool {
        matches!(self, Self::Root(s) if s.is_empty())
    }

    /// The rendered path, or `message` for the empty root.
    pub fn label(&self) -> String {
        if self.is_empty() {
            "message".to_owned()
        } else {
            self.to_string()
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Root(name) => f.write_str(name),
            Self::Key(parent, key) => {
                if !parent.is_empty() {
                    write!(f, "{parent}.")?;
                }
                f.write_str(key)
            }
            Self::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// A type with a strict wire schema: it maps to a [`Value`] tree and back.
pub trait Schema: Sized {
    /// The wire form: keys in schema order, absent optionals omitted.
    ///
    /// This does not validate; a value the schema forbids (say an empty id)
    /// maps to a tree that [`Schema::from_value`] rejects.
    fn to_value(&self) -> Value;

    /// Parses and validates a wire form; errors name positions below `path`.
    fn from_value_at(value: &Value, path: &Path<'_>) -> Result<Self, SchemaError>;

    /// Parses and validates a wire form; `path` names the value in errors
    /// (`""` for a whole message).
    fn from_value(value: &Value, path: &str) -> Result<Self, SchemaError> {
        Self::from_value_at(value, &Path::Root(path))
    }

    /// [`Schema::to_value`], then checks the result against the schema.
    fn to_checked_value(&self) -> Result<Value, SchemaError> {
        let value = self.to_value();
        Self::from_value(&value, "")?;
        Ok(value)
    }
}

/// Decodes one CBOR payload and parses it as a `T`.
pub fn decode_payload<T: Schema>(payload: &[u8], limits: &CborLimits) -> Result<T, SchemaError> {
    let value = cbor::decode(payload, limits)
        .map_err(|error| SchemaError::new(format!("invalid CBOR: {error}")))?;
    T::from_value(&value, "")
}

/// Validates `message` against its schema and encodes it as one CBOR payload.
pub fn encode_payload<T: Schema>(message: &T) -> Result<Vec<u8>, SchemaError> {
    let value = message.to_checked_value()?;
    let mut out = Vec::new();
    cbor::encode(&value, &mut out).map_err(cbor_error)?;
    Ok(out)
}

/// The error of a payload encoder whose CBOR could not be written.
pub(crate) fn cbor_error(error: cbor::CborError) -> SchemaError {
    SchemaError::new(format!("cannot encode CBOR: {error}"))
}

/// Decodes one client frame payload: a common request through
/// [`read::client_request`], anything else (and every error) through the
/// tree. Debug builds check that the two agree.
pub fn decode_client_message(
    payload: &[u8],
    limits: &CborLimits,
) -> Result<ClientMessage, SchemaError> {
    let Some(message) = read::client_request(payload, limits) else {
        return decode_payload(payload, limits);
    };
    if cfg!(debug_assertions) {
        let tree = decode_payload::<ClientMessage>(payload, limits);
        assert_eq!(
            tree.as_ref(),
            Ok(&message),
            "the direct request reader disagrees with the tree"
        );
    }
    Ok(message)
}

/// Decodes one server frame payload.
pub fn decode_server_message(
    payload: &[u8],
    limits: &CborLimits,
) -> Result<ServerMessage, SchemaError> {
    decode_payload(payload, limits)
}

/// Encodes a client message payload (no frame header).
pub fn encode_client_message(message: &ClientMessage) -> Result<Vec<u8>, SchemaError> {
    encode_payload(message)
}

/// Encodes a server message payload (no frame header).
pub fn encode_server_message(message: &ServerMessage) -> Result<Vec<u8>, SchemaError> {
    encode_payload(message)
}

/// Encodes a server message the server built itself from validated parts
/// (decoded worker frames, its own state). The schema check of
/// [`encode_server_message`] then re-proves what is already known and costs
/// about as much as the encoding; it runs in debug builds (every test) and
/// is skipped in release. Values the CBOR encoder cannot write (a non-finite
/// number, an integer beyond 2^53) are still errors.
pub fn encode_trusted_server_message(message: &ServerMessage) -> Result<Vec<u8>, SchemaError> {
    let value = if cfg!(debug_assertions) {
        message.to_checked_value()?
    } else {
        message.to_value()
    };
    let mut out = Vec::new();
    cbor::encode(&value, &mut out).map_err(cbor_error)?;
    Ok(out)
}
