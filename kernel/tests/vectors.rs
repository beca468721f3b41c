//! The shared wire vectors (`tests/vectors/cbor.json`) against the kernel's
//! own codec.
//!
//! The same file is the web client's reference (`tests/web/codec.test.mjs`
//! checks `io/daemon/src/web/assets/codec.js` against it), so this test is what ties
//! the browser's bytes to the kernel's: every vector must hold here first.
//! The vectors were extracted from `tests/wire.rs`; see the file's `format`
//! for what each section means.

use kernel::protocol::codec::{
    decode_client_message, decode_server_message, encode_client_message, encode_server_message,
};
use kernel::wire::cbor::{self, CborErrorKind};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, FrameErrorKind, encode_frame};
use kernel::wire::{CborLimits, FrameDecoder, Value};
use serde_json::Value as Json;
use std::collections::BTreeSet;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/cbor.json");

fn vectors() -> Json {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| panic!("{VECTORS}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{VECTORS}: {e}"))
}

fn section<'a>(doc: &'a Json, name: &str) -> &'a [Json] {
    doc[name]
        .as_array()
        .unwrap_or_else(|| panic!("section {name:?} is missing"))
}

fn field<'a>(vector: &'a Json, key: &str) -> &'a Json {
    vector
        .get(key)
        .unwrap_or_else(|| panic!("vector {vector} has no {key:?}"))
}

fn name(vector: &Json) -> &str {
    field(vector, "name").as_str().expect("a string name")
}

fn str_field<'a>(vector: &'a Json, key: &str) -> &'a str {
    field(vector, key)
        .as_str()
        .unwrap_or_else(|| panic!("{}: {key:?} is not a string", name(vector)))
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length: {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|e| panic!("{s}: {e}")))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The kernel's name of an error kind, as the vectors spell it.
fn kind_name(kind: CborErrorKind) -> &'static str {
    match kind {
        CborErrorKind::Truncated => "truncated",
        CborErrorKind::TrailingData => "trailing_data",
        CborErrorKind::Tag => "tag",
        CborErrorKind::IndefiniteLength => "indefinite_length",
        CborErrorKind::Break => "break",
        CborErrorKind::UnsupportedSimple => "unsupported_simple",
        CborErrorKind::MalformedAdditionalInfo => "malformed_additional_info",
        CborErrorKind::NonFiniteNumber => "non_finite_number",
        CborErrorKind::IntegerOutOfRange => "integer_out_of_range",
        CborErrorKind::ArgumentOutOfRange => "argument_out_of_range",
        CborErrorKind::NonTextKey => "non_text_key",
        CborErrorKind::DuplicateKey => "duplicate_key",
        CborErrorKind::InvalidUtf8 => "invalid_utf8",
        CborErrorKind::DepthLimit => "depth_limit",
        CborErrorKind::ContainerLimit => "container_limit",
        CborErrorKind::ByteLengthLimit => "byte_length_limit",
        CborErrorKind::Other => "other",
        _ => "unknown",
    }
}

/// Every kind a decoder can report for bad input (all but `other`).
const DECODE_KINDS: [&str; 16] = [
    "truncated",
    "trailing_data",
    "tag",
    "indefinite_length",
    "break",
    "unsupported_simple",
    "malformed_additional_info",
    "non_finite_number",
    "integer_out_of_range",
    "argument_out_of_range",
    "non_text_key",
    "duplicate_key",
    "invalid_utf8",
    "depth_limit",
    "container_limit",
    "byte_length_limit",
];

/// A float of the tagged form: a JSON number, or a decimal string (also
/// `-0`, `NaN`, `Infinity`, `-Infinity`) read exactly by `str::parse`.
fn float(json: &Json) -> f64 {
    match json {
        Json::Number(n) => n.as_f64().expect("a float"),
        Json::String(s) => s.parse().unwrap_or_else(|e| panic!("float {s:?}: {e}")),
        other => panic!("not a float: {other}"),
    }
}

/// Builds the [`Value`] a tagged JSON value stands for.
fn value(json: &Json) -> Value {
    let object = json
        .as_object()
        .filter(|o| o.len() == 1)
        .unwrap_or_else(|| panic!("not a tagged value: {json}"));
    let (tag, inner) = object.iter().next().expect("one entry");
    match tag.as_str() {
        "null" => Value::Null,
        "bool" => Value::Bool(inner.as_bool().expect("a bool")),
        "int" => Value::Int(
            inner
                .as_i64()
                .unwrap_or_else(|| panic!("int {inner} does not fit an i64")),
        ),
        "float" => Value::Float(float(inner)),
        "text" => Value::Text(inner.as_str().expect("a string").to_owned()),
        "bytes" => Value::Bytes(unhex(inner.as_str().expect("a hex string"))),
        "array" => Value::Array(
            inner
                .as_array()
                .expect("an array")
                .iter()
                .map(value)
                .collect(),
        ),
        "map" => Value::Map(
            inner
                .as_array()
                .expect("an array of entries")
                .iter()
                .map(|entry| match entry.as_array().map(Vec::as_slice) {
                    Some([Json::String(key), item]) => (key.clone(), value(item)),
                    _ => panic!("not a [key, value] entry: {entry}"),
                })
                .collect(),
        ),
        "nest" => {
            let levels = inner["levels"].as_u64().expect("levels");
            let mut nested = value(&inner["value"]);
            for _ in 0..levels {
                nested = Value::Array(vec![nested]);
            }
            nested
        }
        other => panic!("unknown tag {other:?} in {json}"),
    }
}

/// Equality that tells −0 from 0 (and compares floats bit for bit).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| same(x, y))
        }
        (Value::Map(xs), Value::Map(ys)) => {
            xs.len() == ys.len()
                && xs
                    .iter()
                    .zip(ys)
                    .all(|((kx, x), (ky, y))| kx == ky && same(x, y))
        }
        _ => a == b,
    }
}

/// The file's default limits, which must be the kernel's.
fn default_limits(doc: &Json) -> (CborLimits, u32) {
    let limits = &doc["limits"];
    let get = |key: &str| {
        limits[key]
            .as_u64()
            .unwrap_or_else(|| panic!("limits.{key} is missing"))
    };
    let cbor = CborLimits {
        max_depth: get("max_depth") as usize,
        max_container_len: get("max_container_len") as usize,
        max_byte_len: get("max_byte_len") as usize,
    };
    (cbor, get("max_frame_len") as u32)
}

/// The limits a vector runs under: the defaults, overridden by its own.
fn limits_of(vector: &Json) -> (CborLimits, u32) {
    let mut cbor = CborLimits::default();
    let mut frame = DEFAULT_MAX_FRAME_LEN;
    if let Some(own) = vector.get("limits").and_then(Json::as_object) {
        for (key, n) in own {
            let n = n.as_u64().expect("a limit is a number");
            match key.as_str() {
                "max_depth" => cbor.max_depth = n as usize,
                "max_container_len" => cbor.max_container_len = n as usize,
                "max_byte_len" => cbor.max_byte_len = n as usize,
                "max_frame_len" => frame = u32::try_from(n).expect("a u32 frame limit"),
                other => panic!("{}: unknown limit {other:?}", name(vector)),
            }
        }
    }
    (cbor, frame)
}

/// Panics listing every failure, after all vectors of a section ran.
fn report(section: &str, checked: usize, failures: Vec<String>) {
    assert!(checked > 0, "section {section} is empty");
    assert!(
        failures.is_empty(),
        "{} of {checked} {section} vectors fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_file_assumes_the_kernel_default_limits() {
    let (cbor, frame) = default_limits(&vectors());
    assert_eq!(cbor, CborLimits::default());
    assert_eq!(frame, DEFAULT_MAX_FRAME_LEN);
}

#[test]
fn encode_vectors_are_byte_exact_and_decode_back() {
    let doc = vectors();
    let vectors = section(&doc, "encode");
    let mut failures = Vec::new();
    for v in vectors {
        let input = value(field(v, "value"));
        let expected = str_field(v, "hex");
        match cbor::to_vec(&input) {
            Ok(bytes) if hex(&bytes) == expected => {}
            Ok(bytes) => failures.push(format!(
                "{}: encodes to {}, expected {expected}",
                name(v),
                hex(&bytes)
            )),
            Err(e) => failures.push(format!("{}: encode failed: {e}", name(v))),
        }
        let decoded = value(v.get("decoded").unwrap_or(field(v, "value")));
        match cbor::decode(&unhex(expected), &CborLimits::default()) {
            Ok(got) if same(&got, &decoded) => {}
            Ok(got) => failures.push(format!(
                "{}: decodes to {got:?}, expected {decoded:?}",
                name(v)
            )),
            Err(e) => failures.push(format!("{}: decode failed: {e}", name(v))),
        }
    }
    report("encode", vectors.len(), failures);
}

#[test]
fn decode_vectors_decode_to_their_value() {
    let doc = vectors();
    let vectors = section(&doc, "decode");
    let mut failures = Vec::new();
    for v in vectors {
        let expected = value(field(v, "value"));
        let (limits, _) = limits_of(v);
        match cbor::decode(&unhex(str_field(v, "hex")), &limits) {
            Ok(got) if same(&got, &expected) => {}
            Ok(got) => failures.push(format!(
                "{}: decodes to {got:?}, expected {expected:?}",
                name(v)
            )),
            Err(e) => failures.push(format!("{}: decode failed: {e}", name(v))),
        }
    }
    report("decode", vectors.len(), failures);
}

#[test]
fn reject_vectors_fail_with_their_kind_and_message() {
    let doc = vectors();
    let vectors = section(&doc, "reject");
    let mut failures = Vec::new();
    for v in vectors {
        let (limits, _) = limits_of(v);
        let (kind, message) = (str_field(v, "kind"), str_field(v, "message"));
        match cbor::decode(&unhex(str_field(v, "hex")), &limits) {
            Ok(got) => failures.push(format!("{}: decodes to {got:?}", name(v))),
            Err(e) if kind_name(e.kind()) == kind && e.message() == message => {}
            Err(e) => failures.push(format!(
                "{}: fails with {} {:?}, expected {kind} {message:?}",
                name(v),
                kind_name(e.kind()),
                e.message()
            )),
        }
    }
    report("reject", vectors.len(), failures);
}

#[test]
fn every_rejection_class_has_a_vector_under_the_default_limits() {
    let doc = vectors();
    let covered: BTreeSet<&str> = section(&doc, "reject")
        .iter()
        .filter(|v| v.get("limits").is_none())
        .map(|v| str_field(v, "kind"))
        .collect();
    let missing: Vec<&str> = DECODE_KINDS
        .into_iter()
        .filter(|k| !covered.contains(k))
        .collect();
    assert!(missing.is_empty(), "no reject vector of kind {missing:?}");
    for v in section(&doc, "reject") {
        assert!(
            DECODE_KINDS.contains(&str_field(v, "kind")),
            "{}: unknown kind",
            name(v)
        );
    }
}

#[test]
fn encode_reject_vectors_fail_with_their_kind_and_message() {
    let doc = vectors();
    let vectors = section(&doc, "encode_reject");
    let mut failures = Vec::new();
    for v in vectors {
        let input = value(field(v, "value"));
        let (kind, message) = (str_field(v, "kind"), str_field(v, "message"));
        match cbor::to_vec(&input) {
            Ok(bytes) => failures.push(format!("{}: encodes to {}", name(v), hex(&bytes))),
            Err(e) if kind_name(e.kind()) == kind && e.message() == message => {}
            Err(e) => failures.push(format!(
                "{}: fails with {} {:?}, expected {kind} {message:?}",
                name(v),
                kind_name(e.kind()),
                e.message()
            )),
        }
    }
    report("encode_reject", vectors.len(), failures);
}

/// Feeds one whole WebSocket message to a fresh frame decoder.
fn frame_payloads(
    bytes: &[u8],
    max_frame_len: u32,
) -> (Vec<Vec<u8>>, Result<(), kernel::wire::FrameError>) {
    let mut decoder = FrameDecoder::new(max_frame_len);
    let mut payloads = Vec::new();
    let result = decoder
        .push(bytes, &mut payloads)
        .and_then(|()| decoder.end());
    (payloads, result)
}

/// Checks that `payload` is a v1 message of the named schema, re-encoded
/// byte for byte by the kernel's message codec.
fn check_schema(message: &str, payload: &[u8]) -> Result<(), String> {
    let limits = CborLimits::default();
    let again = match message {
        "client" => decode_client_message(payload, &limits)
            .and_then(|m| encode_client_message(&m))
            .map_err(|e| format!("not a client message: {e}"))?,
        "server" => decode_server_message(payload, &limits)
            .and_then(|m| encode_server_message(&m))
            .map_err(|e| format!("not a server message: {e}"))?,
        other => return Err(format!("unknown schema {other:?}")),
    };
    if again == payload {
        Ok(())
    } else {
        Err(format!(
            "the {message} message re-encodes as {}",
            hex(&again)
        ))
    }
}

#[test]
fn frame_vectors_are_byte_exact_whole_frames() {
    let doc = vectors();
    let vectors = section(&doc, "frames");
    let mut failures = Vec::new();
    for v in vectors {
        let input = value(field(v, "value"));
        let expected = str_field(v, "hex");
        let (_, max_frame_len) = limits_of(v);
        let framed = cbor::to_vec(&input)
            .map_err(|e| e.to_string())
            .and_then(|payload| encode_frame(&payload, max_frame_len).map_err(|e| e.to_string()));
        match framed {
            Ok(bytes) if hex(&bytes) == expected => {}
            Ok(bytes) => failures.push(format!(
                "{}: frames as {}, expected {expected}",
                name(v),
                hex(&bytes)
            )),
            Err(e) => failures.push(format!("{}: cannot frame: {e}", name(v))),
        }
        let (payloads, result) = frame_payloads(&unhex(expected), max_frame_len);
        if let Err(e) = result {
            failures.push(format!("{}: the frame decoder fails: {e}", name(v)));
            continue;
        }
        let [payload] = payloads.as_slice() else {
            failures.push(format!("{}: {} payloads, not one", name(v), payloads.len()));
            continue;
        };
        match cbor::decode(payload, &CborLimits::default()) {
            Ok(got) if same(&got, &input) => {}
            Ok(got) => failures.push(format!("{}: the payload decodes to {got:?}", name(v))),
            Err(e) => failures.push(format!("{}: the payload fails: {e}", name(v))),
        }
        if let Some(message) = v.get("message").and_then(Json::as_str)
            && let Err(e) = check_schema(message, payload)
        {
            failures.push(format!("{}: {e}", name(v)));
        }
    }
    report("frames", vectors.len(), failures);
}

/// What the kernel makes of a message that should hold one whole frame: the
/// framing problem (kind, the kernel's message if it has one), or the one
/// payload.
fn frame_outcome(bytes: &[u8], max_frame_len: u32) -> Result<Vec<u8>, (&'static str, String)> {
    let mut decoder = FrameDecoder::new(max_frame_len);
    let mut payloads = Vec::new();
    if let Err(e) = decoder.push(bytes, &mut payloads) {
        return match e.kind() {
            FrameErrorKind::TooLong { .. } => Err(("too_long", e.message().to_owned())),
            _ => Err(("other", e.message().to_owned())),
        };
    }
    let end = decoder.end();
    match (payloads.len(), end) {
        (0, Ok(())) => Err(("truncated", String::new())),
        (0, Err(e)) if e.kind() == FrameErrorKind::Truncated => {
            Err(("truncated", e.message().to_owned()))
        }
        // One whole frame, then more bytes: a partial second frame or a whole one.
        (1, Err(e)) if e.kind() == FrameErrorKind::Truncated => {
            Err(("trailing_data", String::new()))
        }
        (n, _) if n > 1 => Err(("trailing_data", String::new())),
        (1, Ok(())) => Ok(payloads.remove(0)),
        (_, Err(e)) => Err(("other", e.message().to_owned())),
        (_, Ok(())) => Err(("other", String::new())),
    }
}

#[test]
fn frame_reject_vectors_fail_in_their_layer() {
    let doc = vectors();
    let vectors = section(&doc, "frame_reject");
    let mut failures = Vec::new();
    for v in vectors {
        let (_, max_frame_len) = limits_of(v);
        let kind = str_field(v, "kind");
        let message = v.get("message").and_then(Json::as_str);
        let outcome = frame_outcome(&unhex(str_field(v, "hex")), max_frame_len);
        match (str_field(v, "layer"), outcome) {
            ("frame", Err((got, text))) => {
                if got != kind || message.is_some_and(|m| m != text) {
                    failures.push(format!(
                        "{}: framing fails with {got} {text:?}, expected {kind} {message:?}",
                        name(v)
                    ));
                }
            }
            ("cbor", Ok(payload)) => match cbor::decode(&payload, &CborLimits::default()) {
                Ok(got) => failures.push(format!("{}: the payload decodes to {got:?}", name(v))),
                Err(e) => {
                    if kind_name(e.kind()) != kind || message.is_some_and(|m| m != e.message()) {
                        failures.push(format!(
                            "{}: the payload fails with {} {:?}, expected {kind} {message:?}",
                            name(v),
                            kind_name(e.kind()),
                            e.message()
                        ));
                    }
                }
            },
            (layer, outcome) => failures.push(format!(
                "{}: expected a {layer} error, got {outcome:?}",
                name(v)
            )),
        }
    }
    report("frame_reject", vectors.len(), failures);
}
