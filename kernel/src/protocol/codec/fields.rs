//! The strict map reader and scalar readers every schema is built from, and
//! the matching [`Value`] builders.

use super::{Path, SchemaError};
use crate::wire::{MAX_SAFE_INTEGER, Value};
use std::fmt;

/// The most distinct keys a closed map may allow (the bit set's width).
const MAX_ALLOWED_KEYS: usize = 32;

/// The most characters of a foreign string (an unknown key or enum value)
/// quoted in an error.
const QUOTE_CHARS_MAX: usize = 64;

/// `"text"`, escaped and cut short, for quoting untrusted strings in errors.
pub(super) fn quote(text: &str) -> impl fmt::Display + '_ {
    struct Quoted<'a>(&'a str);
    impl fmt::Display for Quoted<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.0.char_indices().nth(QUOTE_CHARS_MAX) {
                Some((end, _)) => write!(f, "{:?}...", &self.0[..end]),
                None => write!(f, "{:?}", self.0),
            }
        }
    }
    Quoted(text)
}

/// A closed map being read: every key is known, none repeats.
///
/// [`Fields::new`] rejects non-maps, unknown keys and duplicate keys up
/// front; [`Fields::required`] and [`Fields::optional`] then read the allowed
/// keys with a reader such as [`read_id`], giving it the key's path.
#[derive(Debug, Clone, Copy)]
pub struct Fields<'v, 'p> {
    entries: &'v [(String, Value)],
    path: &'p Path<'p>,
}

impl<'v, 'p> Fields<'v, 'p> {
    /// Checks that `value` is a map whose keys all appear in `allowed` (at
    /// most 32 keys), each at most once.
    pub fn new(
        value: &'v Value,
        path: &'p Path<'p>,
        allowed: &[&str],
    ) -> Result<Self, SchemaError> {
        assert!(
            allowed.len() <= MAX_ALLOWED_KEYS,
            "too many keys in one schema"
        );
        let Value::Map(entries) = value else {
            return Err(SchemaError::at(
                path,
                format_args!("expected a map, got {}", value.kind()),
            ));
        };
        let mut seen: u32 = 0;
        for (key, _) in entries {
            let Some(position) = allowed.iter().position(|k| k == key) else {
                return Err(SchemaError::new(format!(
                    "unknown field {} in {}",
                    quote(key),
                    path.label()
                )));
            };
            let bit = 1u32 << position;
            if seen & bit != 0 {
                return Err(SchemaError::new(format!(
                    "duplicate field {} in {}",
                    quote(key),
                    path.label()
                )));
            }
            seen |= bit;
        }
        Ok(Self { entries, path })
    }

    /// The path of the map itself.
    pub fn path(&self) -> &'p Path<'p> {
        self.path
    }

    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&'v Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Reads the required `key` with `read`; a missing key is an error.
    pub fn required<T>(
        &self,
        key: &str,
        read: impl FnOnce(&'v Value, &Path<'_>) -> Result<T, SchemaError>,
    ) -> Result<T, SchemaError> {
        match self.get(key) {
            Some(value) => read(value, &self.path.key(key)),
            None => Err(SchemaError::new(format!(
                "missing field \"{key}\" in {}",
                self.path.label()
            ))),
        }
    }

    /// Reads the optional `key` with `read`; a missing key is `None`.
    pub fn optional<T>(
        &self,
        key: &str,
        read: impl FnOnce(&'v Value, &Path<'_>) -> Result<T, SchemaError>,
    ) -> Result<Option<T>, SchemaError> {
        self.get(key)
            .map(|value| read(value, &self.path.key(key)))
            .transpose()
    }

    /// Checks that the required `key` holds exactly the string `expected`.
    pub fn literal(&self, key: &str, expected: &str) -> Result<(), SchemaError> {
        self.required(key, |value, path| match value {
            Value::Text(text) if text == expected => Ok(()),
            _ => Err(SchemaError::at(
                path,
                format_args!("expected \"{expected}\""),
            )),
        })
    }
}

/// Reads the discriminator `key` of a union's map, before its variant (and so
/// its set of allowed keys) is known.
pub(super) fn discriminator<'v>(
    value: &'v Value,
    path: &Path<'_>,
    key: &str,
) -> Result<&'v str, SchemaError> {
    let Value::Map(_) = value else {
        return Err(SchemaError::at(
            path,
            format_args!("expected a map, got {}", value.kind()),
        ));
    };
    match value.get(key) {
        Some(Value::Text(text)) => Ok(text),
        Some(other) => Err(SchemaError::at(&path.key(key), expected("a string", other))),
        None => Err(SchemaError::new(format!(
            "missing field \"{key}\" in {}",
            path.label()
        ))),
    }
}

/// The error for an unknown discriminator value: `<path>: unknown <key> "<value>"`.
pub(super) fn unknown_variant(path: &Path<'_>, key: &str, value: &str) -> SchemaError {
    SchemaError::at(path, format_args!("unknown {key} {}", quote(value)))
}

fn expected<'a>(what: &'a str, got: &'a Value) -> impl fmt::Display + 'a {
    struct Expected<'a>(&'a str, &'a Value);
    impl fmt::Display for Expected<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "expected {}, got {}", self.0, self.1.kind())
        }
    }
    Expected(what, got)
}

/// Reads an `Id`: a non-empty string.
pub fn read_id(value: &Value, path: &Path<'_>) -> Result<String, SchemaError> {
    match value {
        Value::Text(text) if !text.is_empty() => Ok(text.clone()),
        Value::Text(_) => Err(SchemaError::at(path, "expected a non-empty string")),
        other => Err(SchemaError::at(path, expected("a non-empty string", other))),
    }
}

/// Reads any string.
pub fn read_string(value: &Value, path: &Path<'_>) -> Result<String, SchemaError> {
    match value {
        Value::Text(text) => Ok(text.clone()),
        other => Err(SchemaError::at(path, expected("a string", other))),
    }
}

/// Reads a boolean.
pub fn read_bool(value: &Value, path: &Path<'_>) -> Result<bool, SchemaError> {
    match value {
        Value::Bool(b) => Ok(*b),
        other => Err(SchemaError::at(path, expected("a boolean", other))),
    }
}

/// Reads an integer ≥ 0 (and ≤ 2^53 − 1).
pub fn read_uint(value: &Value, path: &Path<'_>) -> Result<u64, SchemaError> {
    read_uint_min(value, path, 0)
}

/// Reads an integer ≥ `min` (and ≤ 2^53 − 1).
///
/// A float holding an integral value counts as an integer, as in the
/// reference (JavaScript has one number type); decoded CBOR never holds one,
/// because [`Value`] normalises numbers.
pub fn read_uint_min(value: &Value, path: &Path<'_>, min: u64) -> Result<u64, SchemaError> {
    let n = match value {
        Value::Int(n) => *n,
        Value::Float(x) if x.fract() == 0.0 && x.abs() <= MAX_SAFE_INTEGER as f64 => *x as i64,
        Value::Float(x) if x.fract() == 0.0 => i64::MAX,
        Value::Float(_) => {
            return Err(SchemaError::at(
                path,
                "expected an integer, got a non-integral number",
            ));
        }
        other => return Err(SchemaError::at(path, expected("an integer", other))),
    };
    if n > MAX_SAFE_INTEGER {
        return Err(SchemaError::at(
            path,
            format_args!("expected an integer ≤ {MAX_SAFE_INTEGER}"),
        ));
    }
    match u64::try_from(n) {
        Ok(n) if n >= min => Ok(n),
        _ => Err(SchemaError::at(
            path,
            format_args!("expected an integer ≥ {min}, got {n}"),
        )),
    }
}

/// True for a number CBOR can carry: finite, and within ±(2^53 − 1) when integral.
fn is_representable(x: f64) -> bool {
    x.is_finite() && (x.fract() != 0.0 || x.abs() <= MAX_SAFE_INTEGER as f64)
}

/// Reads a finite number ≥ 0 (an integer or a float).
pub fn read_number(value: &Value, path: &Path<'_>) -> Result<f64, SchemaError> {
    match value {
        Value::Int(n) if (0..=MAX_SAFE_INTEGER).contains(n) => Ok(*n as f64),
        Value::Float(x) if is_representable(*x) && *x >= 0.0 => Ok(*x),
        Value::Int(_) | Value::Float(_) => {
            Err(SchemaError::at(path, "expected a finite number ≥ 0"))
        }
        other => Err(SchemaError::at(path, expected("a number", other))),
    }
}

/// Reads strict JSON: no byte strings, finite numbers, safe integers.
pub fn read_json(value: &Value, path: &Path<'_>) -> Result<Value, SchemaError> {
    check_json(value, path)?;
    Ok(value.clone())
}

/// Reads a strict JSON object.
pub fn read_object(value: &Value, path: &Path<'_>) -> Result<Value, SchemaError> {
    match value {
        Value::Map(_) => read_json(value, path),
        other => Err(SchemaError::at(path, expected("an object", other))),
    }
}

fn check_json(value: &Value, path: &Path<'_>) -> Result<(), SchemaError> {
    match value {
        Value::Null | Value::Bool(_) | Value::Text(_) => Ok(()),
        Value::Int(n) if n.unsigned_abs() <= MAX_SAFE_INTEGER as u64 => Ok(()),
        Value::Float(x) if is_representable(*x) => Ok(()),
        Value::Int(_) | Value::Float(_) => Err(SchemaError::at(
            path,
            "expected strict JSON, found an unrepresentable number",
        )),
        Value::Bytes(_) => Err(SchemaError::at(
            path,
            "expected strict JSON, found a byte string",
        )),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(index, item)| check_json(item, &path.index(index))),
        Value::Map(entries) => entries
            .iter()
            .try_for_each(|(key, item)| check_json(item, &path.key(key))),
    }
}

/// Reads an array, each item with `read` at its indexed path.
pub fn read_list<'v, T>(
    value: &'v Value,
    path: &Path<'_>,
    mut read: impl FnMut(&'v Value, &Path<'_>) -> Result<T, SchemaError>,
) -> Result<Vec<T>, SchemaError> {
    let Value::Array(items) = value else {
        return Err(SchemaError::at(path, expected("an array", value)));
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| read(item, &path.index(index)))
        .collect()
}

/// Reads one of a closed set of strings, by its wire name.
pub(super) fn read_enum<T: Copy>(
    value: &Value,
    path: &Path<'_>,
    all: &[T],
    name: impl Fn(T) -> &'static str,
) -> Result<T, SchemaError> {
    let Value::Text(text) = value else {
        return Err(SchemaError::at(path, expected("a string", value)));
    };
    if let Some(found) = all.iter().copied().find(|item| name(*item) == text) {
        return Ok(found);
    }
    let names: Vec<String> = all
        .iter()
        .map(|item| format!("\"{}\"", name(*item)))
        .collect();
    Err(SchemaError::at(
        path,
        format_args!("expected one of {}, got {}", names.join(", "), quote(text)),
    ))
}

/// The wire form of an integer field. Values above 2^53 − 1 map to a float,
/// which every integer reader rejects.
pub fn uint_value(n: u64) -> Value {
    match i64::try_from(n) {
        Ok(i) if i <= MAX_SAFE_INTEGER => Value::Int(i),
        _ => Value::Float(n as f64),
    }
}

/// Builds a map value in the order keys are put.
#[derive(Debug, Clone, Default)]
pub struct MapBuilder {
    entries: Vec<(String, Value)>,
}

impl MapBuilder {
    /// An empty builder with room for `capacity` keys.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Vec::with_capacity(capacity),
        }
    }

    /// Appends `key`.
    pub fn put(mut self, key: &str, value: Value) -> Self {
        self.entries.push((key.to_owned(), value));
        self
    }

    /// Appends `key` if `value` is present.
    pub fn put_opt(self, key: &str, value: Option<Value>) -> Self {
        match value {
            Some(value) => self.put(key, value),
            None => self,
        }
    }

    /// The finished map.
    pub fn build(self) -> Value {
        Value::Map(self.entries)
    }
}
