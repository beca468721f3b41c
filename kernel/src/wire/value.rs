//! The data model of the strict CBOR subset that pi protocol v1 allows.
//!
//! A [`Value`] is what one frame's payload decodes to before the schema layer
//! ([`crate::protocol`]) turns it into typed messages. Maps keep their keys in
//! insertion order, because the encoder must write keys in schema order to be
//! byte-exact with the reference implementation.

/// The largest integer magnitude the protocol carries: JavaScript's
/// `Number.MAX_SAFE_INTEGER` (2^53 − 1).
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// One decoded CBOR data item of the protocol's strict subset.
///
/// Numbers are normalised: a finite float64 with an integral value inside
/// ±[`MAX_SAFE_INTEGER`] (other than −0) is an [`Value::Int`], so that the
/// number `2` has one representation however it was encoded. [`Value::Float`]
/// therefore holds a non-integral number, −0, or an integral number that is
/// only representable as a float.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// CBOR `null` (0xf6).
    Null,
    /// CBOR `false` / `true` (0xf4 / 0xf5).
    Bool(bool),
    /// An integer within ±(2^53 − 1) (major types 0 and 1).
    Int(i64),
    /// A finite float64 (0xfb) that is not a safe integer.
    Float(f64),
    /// A UTF-8 text string (major type 3).
    Text(String),
    /// A byte string (major type 2). It decodes, but no protocol schema accepts it.
    Bytes(Vec<u8>),
    /// A definite-length array (major type 4).
    Array(Vec<Value>),
    /// A definite-length map with unique text keys, in wire order (major type 5).
    Map(Vec<(String, Value)>),
}

impl Value {
    /// Equal as JSON is: maps hold the same keys with equal values, in any
    /// order (`==` also compares the wire order, as a replica that added a
    /// key later holds it last).
    pub fn same_as(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Map(a), Self::Map(b)) => {
                a.len() == b.len()
                    && a.iter().all(|(key, value)| {
                        b.iter()
                            .find(|(k, _)| k == key)
                            .is_some_and(|(_, v)| value.same_as(v))
                    })
            }
            (Self::Array(a), Self::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_as(y))
            }
            _ => self == other,
        }
    }

    /// Builds a number value, normalising integral floats to [`Value::Int`].
    pub fn number(n: f64) -> Self {
        if n.fract() == 0.0
            && n.abs() <= MAX_SAFE_INTEGER as f64
            && !(n == 0.0 && n.is_sign_negative())
        {
            Self::Int(n as i64)
        } else {
            Self::Float(n)
        }
    }

    /// A map of `pairs`, in that order (the protocol's objects).
    pub fn object(pairs: Vec<(&str, Value)>) -> Self {
        Self::Map(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// The value as JSON-like text, for messages, traces and test assertions
    /// (strings in Rust's escaping; a byte string as `<bytes>`).
    pub fn json_text(&self) -> String {
        match self {
            Self::Null => "null".into(),
            Self::Bool(b) => b.to_string(),
            Self::Int(n) => n.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Text(s) => format!("{s:?}"),
            Self::Bytes(_) => "<bytes>".into(),
            Self::Array(items) => {
                let items: Vec<String> = items.iter().map(Self::json_text).collect();
                format!("[{}]", items.join(","))
            }
            Self::Map(entries) => {
                let entries: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{k:?}:{}", v.json_text()))
                    .collect();
                format!("{{{}}}", entries.join(","))
            }
        }
    }

    /// A text value.
    pub fn text(s: impl Into<String>) -> Self {
        Self::Text(s.into())
    }

    /// Short name of the value's kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "boolean",
            Self::Int(_) => "integer",
            Self::Float(_) => "number",
            Self::Text(_) => "string",
            Self::Bytes(_) => "byte string",
            Self::Array(_) => "array",
            Self::Map(_) => "map",
        }
    }

    /// Looks up a key of a map value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Self::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Looks up a key of a map value, to change it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        match self {
            Self::Map(entries) => entries.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// True when the value is strict JSON: no byte strings anywhere inside.
    pub fn is_json(&self) -> bool {
        match self {
            Self::Bytes(_) => false,
            Self::Array(items) => items.iter().all(Self::is_json),
            Self::Map(entries) => entries.iter().all(|(_, v)| v.is_json()),
            _ => true,
        }
    }
}

/// Builds a [`Value::Map`] from `key => value` pairs, in the order written.
#[macro_export]
macro_rules! map {
    ($($key:expr => $value:expr),* $(,)?) => {
        $crate::wire::Value::Map(vec![$(($key.to_string(), $value)),*])
    };
}
