//! Conversions between the kernel's strict [`Value`] and `serde_json`.

use kernel::wire::Value;
use serde_json::Value as Json;

/// A kernel value as JSON. Byte strings (never strict JSON) become `null`.
pub fn to_json(value: &Value) -> Json {
    match value {
        Value::Null | Value::Bytes(_) => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Value::Text(s) => Json::String(s.clone()),
        Value::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v)))
                .collect(),
        ),
    }
}

/// JSON as a kernel value. Integers beyond ±(2^53−1) become floats.
pub fn from_json(json: &Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) if i.unsigned_abs() < (1 << 53) => Value::Int(i),
            _ => Value::number(n.as_f64().unwrap_or(0.0)),
        },
        Json::String(s) => Value::Text(s.clone()),
        Json::Array(items) => Value::Array(items.iter().map(from_json).collect()),
        Json::Object(map) => {
            Value::Map(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_strict_json() {
        let json: Json =
            serde_json::from_str(r#"{"a":[1,-2.5,"x",null,true],"b":{"c":9007199254740991}}"#)
                .unwrap();
        let value = from_json(&json);
        assert!(value.is_json());
        assert_eq!(to_json(&value), json);
        assert_eq!(from_json(&serde_json::json!(3.0)), Value::Int(3));
        assert!(matches!(
            from_json(&serde_json::json!(1u64 << 60)),
            Value::Float(_)
        ));
    }
}
