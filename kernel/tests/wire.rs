//! Wire codec: frames and the strict CBOR subset of pi protocol v1.
//!
//! The byte vectors come from the reference spec and from the reference
//! TypeScript implementation (`@earendil-works/pi-protocol` 0.84.4:
//! `encodeFrame`, `encodeCbor`, `decodeCbor`).

use kernel::map;
use kernel::wire::cbor::{self, CborErrorKind};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, FrameErrorKind, encode_frame};
use kernel::wire::{CborLimits, FrameDecoder, MAX_SAFE_INTEGER, Value};
use proptest::prelude::*;

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length: {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn enc(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    cbor::encode(value, &mut out).unwrap_or_else(|e| panic!("encode {value:?}: {e}"));
    out
}

fn dec(bytes: &[u8]) -> Result<Value, cbor::CborError> {
    cbor::decode(bytes, &CborLimits::default())
}

/// Decodes `hex`, expecting an error of `kind` whose message contains `needle`.
fn reject(hex_input: &str, kind: CborErrorKind, needle: &str) {
    reject_with(hex_input, &CborLimits::default(), kind, needle);
}

fn reject_with(hex_input: &str, limits: &CborLimits, kind: CborErrorKind, needle: &str) {
    reject_bytes(&unhex(hex_input), limits, kind, needle);
}

fn reject_bytes(input: &[u8], limits: &CborLimits, kind: CborErrorKind, needle: &str) {
    let short = hex(&input[..input.len().min(32)]);
    match cbor::decode(input, limits) {
        Ok(value) => {
            panic!("{short}… decoded to {value:?}, expected an error mentioning {needle:?}")
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.contains(needle),
                "{short}…: message {message:?} does not mention {needle:?}"
            );
            assert_eq!(error.kind(), kind, "{short}…: {message}");
        }
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    encode_frame(payload, DEFAULT_MAX_FRAME_LEN).unwrap()
}

// ---------------------------------------------------------------------------
// Reference vectors, byte for byte
// ---------------------------------------------------------------------------

#[test]
fn v1_client_hello_frame_is_byte_exact() {
    let hello = Value::Map(vec![
        ("type".to_string(), Value::text("hello")),
        ("version".to_string(), Value::Int(1)),
    ]);
    let framed = frame(&enc(&hello));
    assert_eq!(
        hex(&framed),
        "00000015a264747970656568656c6c6f6776657273696f6e01"
    );
    assert_eq!(framed.len(), 25);

    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let mut out = Vec::new();
    decoder.push(&framed, &mut out).unwrap();
    decoder.end().unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(dec(&out[0]).unwrap(), hello);
}

#[test]
fn v8_server_hello_frame_is_byte_exact() {
    let hello = map! {
        "type" => Value::text("hello"),
        "version" => Value::Int(8),
        "serverId" => Value::text("01234567-89ab-4def-8123-456789abcdef"),
    };
    let expected = "00000044a364747970656568656c6c6f6776657273696f6e08687365727665724964782430313233343536372d\
                    383961622d346465662d383132332d343536373839616263646566";
    let framed = frame(&enc(&hello));
    assert_eq!(hex(&framed), expected);
    assert_eq!(framed.len(), 72);
    assert_eq!(dec(&framed[4..]).unwrap(), hello);
}

#[test]
fn v8_void_response_frame_is_byte_exact() {
    let response = map! {
        "type" => Value::text("response"),
        "id" => Value::text("request-1"),
        "ok" => Value::Bool(true),
    };
    let framed = frame(&enc(&response));
    assert_eq!(
        hex(&framed),
        "00000020a3647479706568726573706f6e736562696469726571756573742d31626f6bf5"
    );
    assert_eq!(dec(&framed[4..]).unwrap(), response);
}

#[test]
fn scalar_vectors_are_byte_exact() {
    assert_eq!(hex(&enc(&Value::number(1.5))), "fb3ff8000000000000");
    assert_eq!(hex(&enc(&Value::Float(1.5))), "fb3ff8000000000000");
    assert_eq!(hex(&enc(&Value::number(2.0))), "02");
    assert_eq!(
        hex(&enc(&Value::Float(2.0))),
        "02",
        "an integral Float encodes as an integer, as in JS"
    );
    assert_eq!(hex(&enc(&Value::Int(-1))), "20");
    assert_eq!(hex(&enc(&Value::Float(-1.0))), "20");
    assert_eq!(hex(&enc(&Value::number(-0.0))), "fb8000000000000000");
    assert_eq!(hex(&enc(&Value::Float(-0.0))), "fb8000000000000000");
    assert_eq!(hex(&enc(&Value::Float(0.0))), "00");

    assert_eq!(
        dec(&unhex("fb3ff8000000000000")).unwrap(),
        Value::Float(1.5)
    );
    assert_eq!(dec(&unhex("02")).unwrap(), Value::Int(2));
    assert_eq!(dec(&unhex("20")).unwrap(), Value::Int(-1));
    match dec(&unhex("fb8000000000000000")).unwrap() {
        Value::Float(f) => assert!(f == 0.0 && f.is_sign_negative(), "expected -0, got {f}"),
        other => panic!("expected Float(-0.0), got {other:?}"),
    }
}

/// Encodings produced by the reference `encodeCbor`.
#[test]
fn encoder_matches_reference_vectors() {
    let safe = MAX_SAFE_INTEGER;
    let cases: Vec<(Value, &str)> = vec![
        (Value::Int(0), "00"),
        (Value::Int(23), "17"),
        (Value::Int(24), "1818"),
        (Value::Int(255), "18ff"),
        (Value::Int(256), "190100"),
        (Value::Int(65535), "19ffff"),
        (Value::Int(65536), "1a00010000"),
        (Value::Int(4_294_967_295), "1affffffff"),
        (Value::Int(4_294_967_296), "1b0000000100000000"),
        (Value::Int(safe), "1b001fffffffffffff"),
        (Value::Int(-1), "20"),
        (Value::Int(-24), "37"),
        (Value::Int(-25), "3818"),
        (Value::Int(-256), "38ff"),
        (Value::Int(-257), "390100"),
        (Value::Int(-65536), "39ffff"),
        (Value::Int(-65537), "3a00010000"),
        (Value::Int(-4_294_967_296), "3affffffff"),
        (Value::Int(-4_294_967_297), "3b0000000100000000"),
        (Value::Int(-safe), "3b001ffffffffffffe"),
        (Value::Float(1.5), "fb3ff8000000000000"),
        (Value::Float(-0.0), "fb8000000000000000"),
        (Value::Float(0.1), "fb3fb999999999999a"),
        (Value::Float(-2.5e-300), "fb81bac9a7b3b7302f"),
        (Value::Float(5e-324), "fb0000000000000001"),
        (Value::Float(2.0), "02"),
        (Value::Float(1e15), "1b00038d7ea4c68000"),
        (Value::Null, "f6"),
        (Value::Bool(true), "f5"),
        (Value::Bool(false), "f4"),
        (Value::text(""), "60"),
        (Value::text("a"), "6161"),
        (
            Value::text("héllo ✓ 😀"),
            "6f68c3a96c6c6f20e29c9320f09f9880",
        ),
        (
            Value::text("x".repeat(23)),
            "777878787878787878787878787878787878787878787878",
        ),
        (
            Value::text("x".repeat(24)),
            "7818787878787878787878787878787878787878787878787878",
        ),
        (Value::Bytes(vec![1, 2, 3]), "43010203"),
        (Value::Bytes(vec![]), "40"),
        (Value::Array(vec![]), "80"),
        (Value::Map(vec![]), "a0"),
        (
            Value::Array((0..24).map(Value::Int).collect()),
            "9818000102030405060708090a0b0c0d0e0f1011121314151617",
        ),
        (
            map! {
                "b" => Value::Array(vec![Value::Int(1), map! { "c" => Value::Null }]),
                "a" => Value::text("z"),
                "" => Value::Array(vec![Value::Array(vec![])]),
            },
            "a361628201a16163f66161617a608180",
        ),
    ];
    for (value, expected) in cases {
        assert_eq!(hex(&enc(&value)), expected, "encoding {value:?}");
    }
    let long = enc(&Value::text("y".repeat(256)));
    assert_eq!(hex(&long[..3]), "790100");
    assert_eq!(long.len(), 3 + 256);
}

/// Decoder outcomes of the reference `decodeCbor` on the same inputs: either
/// the reference's re-encoding of the decoded value, or its error message,
/// which ours must start with (ours may add detail after it).
#[test]
fn decoder_matches_reference_outcomes() {
    const OK: bool = true;
    const ERR: bool = false;
    let cases: &[(&str, bool, &str)] = &[
        ("", ERR, "Truncated CBOR payload"),
        ("00", OK, "00"),
        ("1817", OK, "17"),
        ("190001", OK, "01"),
        ("1a00000001", OK, "01"),
        ("1b0000000000000001", OK, "01"),
        ("1b001fffffffffffff", OK, "1b001fffffffffffff"),
        (
            "1b0020000000000000",
            ERR,
            "Decoded CBOR integer or length is outside the safe range",
        ),
        ("3b001ffffffffffffe", OK, "3b001ffffffffffffe"),
        (
            "3b001fffffffffffff",
            ERR,
            "Decoded CBOR integer is outside the safe range",
        ),
        ("1c", ERR, "Malformed CBOR additional information"),
        ("1d", ERR, "Malformed CBOR additional information"),
        ("1e", ERR, "Malformed CBOR additional information"),
        ("1f", ERR, "Indefinite-length CBOR items are not supported"),
        ("3f", ERR, "Indefinite-length CBOR items are not supported"),
        (
            "5f",
            ERR,
            "Indefinite-length CBOR byte strings are not supported",
        ),
        (
            "7f",
            ERR,
            "Indefinite-length CBOR text strings are not supported",
        ),
        ("9f", ERR, "Indefinite-length CBOR arrays are not supported"),
        ("bf", ERR, "Indefinite-length CBOR maps are not supported"),
        ("c0", ERR, "CBOR tags are not supported"),
        ("d82000", ERR, "CBOR tags are not supported"),
        ("ff", ERR, "CBOR break marker is not supported"),
        (
            "f7",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "f8",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "f820",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "f9",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "f93c00",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "fa3f800000",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        ("fb", ERR, "Truncated CBOR payload"),
        (
            "fb7ff8000000000000",
            ERR,
            "Decoded CBOR number must be finite",
        ),
        (
            "fb7ff0000000000000",
            ERR,
            "Decoded CBOR number must be finite",
        ),
        (
            "fbfff0000000000000",
            ERR,
            "Decoded CBOR number must be finite",
        ),
        (
            "fb4340000000000000",
            ERR,
            "Decoded CBOR integer is outside the safe range",
        ),
        ("fb433fffffffffffff", OK, "1b001fffffffffffff"),
        ("fbc33fffffffffffff", OK, "3b001ffffffffffffe"),
        ("fb4000000000000000", OK, "02"),
        ("fb8000000000000000", OK, "fb8000000000000000"),
        ("fbc000000000000000", OK, "21"),
        (
            "e0",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "f0",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "f3",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "fc",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "fd",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        (
            "fe",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        ("0000", ERR, "CBOR payload contains trailing data"),
        ("a10000", ERR, "CBOR map keys must be strings"),
        ("a1f600", ERR, "CBOR map keys must be strings"),
        ("a14100", ERR, "CBOR map keys must be strings"),
        ("a1800001", ERR, "CBOR map keys must be strings"),
        ("a2616101616102", ERR, "CBOR map contains a duplicate key"),
        ("a261610161", ERR, "Truncated CBOR payload"),
        ("a161", ERR, "Truncated CBOR payload"),
        ("a1616180", OK, "a1616180"),
        ("62c328", ERR, "CBOR text string contains invalid UTF-8"),
        ("62c3a9", OK, "62c3a9"),
        ("63eda080", ERR, "CBOR text string contains invalid UTF-8"),
        ("62efbb", ERR, "CBOR text string contains invalid UTF-8"),
        ("63efbbbf", OK, "63efbbbf"),
        ("6161", OK, "6161"),
        ("810101", ERR, "CBOR payload contains trailing data"),
        ("81", ERR, "Truncated CBOR payload"),
        ("8181818100", OK, "8181818100"),
        ("a161618100", OK, "a161618100"),
        ("a1c0", ERR, "CBOR tags are not supported"),
        ("a1c000", ERR, "CBOR tags are not supported"),
        (
            "a1f7",
            ERR,
            "Unsupported CBOR simple value or floating-point width",
        ),
        ("a1ff", ERR, "CBOR break marker is not supported"),
        (
            "5b0020000000000000",
            ERR,
            "Decoded CBOR integer or length is outside the safe range",
        ),
        (
            "9b001fffffffffffff",
            ERR,
            "CBOR array length exceeds configured limit of 1000000",
        ),
        ("bb0000000000000001", ERR, "Truncated CBOR payload"),
        (
            "7bffffffffffffffff",
            ERR,
            "Decoded CBOR integer or length is outside the safe range",
        ),
        ("a16161fb3ff8000000000000", OK, "a16161fb3ff8000000000000"),
        ("f4", OK, "f4"),
        ("f5", OK, "f5"),
        ("f6", OK, "f6"),
        ("4100", OK, "4100"),
    ];
    for &(input, ok, expected) in cases {
        match (dec(&unhex(input)), ok) {
            (Ok(value), true) => {
                assert_eq!(hex(&enc(&value)), expected, "{input} decoded to {value:?}")
            }
            (Err(error), false) => {
                assert!(
                    error.to_string().starts_with(expected),
                    "{input}: got {:?}, reference says {expected:?}",
                    error.to_string()
                )
            }
            (Ok(value), false) => {
                panic!("{input}: decoded to {value:?}, reference rejects: {expected}")
            }
            (Err(error), true) => panic!("{input}: rejected ({error}), reference decodes it"),
        }
    }
}

#[test]
fn decoded_values_have_the_expected_shape() {
    assert_eq!(
        dec(&unhex("a361628201a16163f66161617a608180")).unwrap(),
        map! {
            "b" => Value::Array(vec![Value::Int(1), map! { "c" => Value::Null }]),
            "a" => Value::text("z"),
            "" => Value::Array(vec![Value::Array(vec![])]),
        }
    );
    assert_eq!(
        dec(&unhex("43010203")).unwrap(),
        Value::Bytes(vec![1, 2, 3])
    );
    // Map keys keep wire order (the JS reference would reorder integer-like keys).
    let value = dec(&unhex("a2616201613102")).unwrap();
    assert_eq!(value, map! { "b" => Value::Int(1), "1" => Value::Int(2) });
    assert_eq!(value.get("1"), Some(&Value::Int(2)));
}

#[test]
fn non_minimal_integers_and_lengths_are_accepted() {
    assert_eq!(dec(&unhex("1b0000000000000017")).unwrap(), Value::Int(23));
    assert_eq!(dec(&unhex("3900ff")).unwrap(), Value::Int(-256));
    assert_eq!(dec(&unhex("780161")).unwrap(), Value::text("a"));
    assert_eq!(
        dec(&unhex("9a0000000101")).unwrap(),
        Value::Array(vec![Value::Int(1)])
    );
    assert_eq!(
        dec(&unhex("b9000161610a")).unwrap(),
        map! { "a" => Value::Int(10) }
    );
}

#[test]
fn integral_floats_decode_as_integers() {
    assert_eq!(dec(&unhex("fb4000000000000000")).unwrap(), Value::Int(2));
    assert_eq!(
        dec(&unhex("fb433fffffffffffff")).unwrap(),
        Value::Int(MAX_SAFE_INTEGER)
    );
    assert_eq!(
        dec(&unhex("fbc33fffffffffffff")).unwrap(),
        Value::Int(-MAX_SAFE_INTEGER)
    );
    assert_eq!(dec(&unhex("fb0000000000000000")).unwrap(), Value::Int(0));
    // The hello `version: 8.0` case.
    assert_eq!(
        dec(&unhex(
            "a264747970656568656c6c6f6776657273696f6efb4020000000000000"
        ))
        .unwrap(),
        map! { "type" => Value::text("hello"), "version" => Value::Int(8) }
    );
}

// ---------------------------------------------------------------------------
// Decoder rejections, one class at a time
// ---------------------------------------------------------------------------

#[test]
fn rejects_tags() {
    reject(
        "c074323031332d30332d32315432303a30343a30305a",
        CborErrorKind::Tag,
        "tags are not supported",
    );
    reject("d818456449455446", CborErrorKind::Tag, "tags");
    reject("81c100", CborErrorKind::Tag, "tags");
}

#[test]
fn rejects_indefinite_lengths() {
    reject(
        "5f42010243030405ff",
        CborErrorKind::IndefiniteLength,
        "Indefinite-length CBOR byte strings",
    );
    reject(
        "7f657374726561646d696e67ff",
        CborErrorKind::IndefiniteLength,
        "Indefinite-length CBOR text strings",
    );
    reject(
        "9f0102ff",
        CborErrorKind::IndefiniteLength,
        "Indefinite-length CBOR arrays",
    );
    reject(
        "bf61610161629f0203ffff",
        CborErrorKind::IndefiniteLength,
        "Indefinite-length CBOR maps",
    );
    reject("1f", CborErrorKind::IndefiniteLength, "Indefinite-length");
}

#[test]
fn rejects_break_code() {
    reject("ff", CborErrorKind::Break, "break");
    reject("8201ff", CborErrorKind::Break, "break");
}

#[test]
fn rejects_undefined() {
    reject("f7", CborErrorKind::UnsupportedSimple, "undefined");
    reject("a16161f7", CborErrorKind::UnsupportedSimple, "simple value");
}

#[test]
fn rejects_float16_and_float32() {
    reject("f93c00", CborErrorKind::UnsupportedSimple, "float16");
    reject("fa47c35000", CborErrorKind::UnsupportedSimple, "float32");
    reject(
        "fa3f800000",
        CborErrorKind::UnsupportedSimple,
        "floating-point width",
    );
}

#[test]
fn rejects_other_simple_values() {
    for byte in (0xe0..=0xf3).chain([0xf8, 0xfc, 0xfd, 0xfe]) {
        reject_bytes(
            &[byte, 0x20],
            &CborLimits::default(),
            CborErrorKind::UnsupportedSimple,
            "simple value",
        );
    }
    reject("f820", CborErrorKind::UnsupportedSimple, "0xf8");
}

#[test]
fn rejects_nan_and_infinities() {
    reject(
        "fb7ff8000000000000",
        CborErrorKind::NonFiniteNumber,
        "finite",
    );
    reject(
        "fb7ff8000000000001",
        CborErrorKind::NonFiniteNumber,
        "finite",
    );
    reject(
        "fb7ff0000000000000",
        CborErrorKind::NonFiniteNumber,
        "finite",
    );
    reject(
        "fbfff0000000000000",
        CborErrorKind::NonFiniteNumber,
        "finite",
    );
}

#[test]
fn rejects_integral_floats_outside_safe_range() {
    reject(
        "fb4340000000000000",
        CborErrorKind::IntegerOutOfRange,
        "safe range",
    ); // 2^53
    reject(
        "fbc340000000000000",
        CborErrorKind::IntegerOutOfRange,
        "safe range",
    ); // -2^53
    reject(
        "fb7fefffffffffffff",
        CborErrorKind::IntegerOutOfRange,
        "safe range",
    ); // f64::MAX
    reject(
        "fb4415af1d78b58c40",
        CborErrorKind::IntegerOutOfRange,
        "safe range",
    ); // 1e20
}

#[test]
fn rejects_integers_outside_safe_range() {
    reject(
        "1b0020000000000000",
        CborErrorKind::ArgumentOutOfRange,
        "outside the safe range",
    ); // 2^53
    reject(
        "1bffffffffffffffff",
        CborErrorKind::ArgumentOutOfRange,
        "outside the safe range",
    );
    reject(
        "3b001fffffffffffff",
        CborErrorKind::IntegerOutOfRange,
        "integer is outside the safe range",
    ); // -2^53
    reject(
        "3bffffffffffffffff",
        CborErrorKind::ArgumentOutOfRange,
        "outside the safe range",
    );
}

#[test]
fn rejects_lengths_outside_safe_range() {
    let unlimited = CborLimits {
        max_depth: 64,
        max_container_len: usize::MAX,
        max_byte_len: usize::MAX,
    };
    for head in ["5b", "7b", "9b", "bb"] {
        reject_with(
            &format!("{head}0020000000000000"),
            &unlimited,
            CborErrorKind::ArgumentOutOfRange,
            "length",
        );
    }
}

#[test]
fn rejects_reserved_additional_information() {
    for head in ["1c", "3d", "5e", "7c", "9d", "be"] {
        reject(
            head,
            CborErrorKind::MalformedAdditionalInfo,
            "additional information",
        );
    }
}

#[test]
fn rejects_duplicate_map_keys() {
    reject(
        "a264747970656568656c6c6f64747970656568656c6c6f",
        CborErrorKind::DuplicateKey,
        "CBOR map contains a duplicate key \"type\"",
    );
    // Deep inside, and in a map large enough to need the ordered set.
    let mut bytes = unhex("81b818");
    for i in 0..23u8 {
        bytes.extend([0x61, b'a' + (i % 26), 0x00]);
    }
    bytes.extend([0x61, b'c', 0x00]);
    reject_bytes(
        &bytes,
        &CborLimits::default(),
        CborErrorKind::DuplicateKey,
        "duplicate key \"c\"",
    );
    // A long key is quoted shortened.
    let key = "k".repeat(1000);
    let mut bytes = unhex("a2");
    for _ in 0..2 {
        bytes.extend(unhex("7903e8"));
        bytes.extend(key.as_bytes());
        bytes.push(0xf6);
    }
    let error = dec(&bytes).unwrap_err();
    assert_eq!(error.kind(), CborErrorKind::DuplicateKey);
    assert!(error.to_string().len() < 200, "{error}");
}

#[test]
fn rejects_non_text_map_keys() {
    reject(
        "a10102",
        CborErrorKind::NonTextKey,
        "keys must be strings, got integer",
    );
    reject(
        "a1416102",
        CborErrorKind::NonTextKey,
        "keys must be strings, got byte string",
    );
    reject(
        "a1f602",
        CborErrorKind::NonTextKey,
        "keys must be strings, got null",
    );
    reject(
        "a18001",
        CborErrorKind::NonTextKey,
        "keys must be strings, got array",
    );
    reject(
        "a1a00001",
        CborErrorKind::NonTextKey,
        "keys must be strings, got map",
    );
}

#[test]
fn rejects_invalid_utf8() {
    reject("62c328", CborErrorKind::InvalidUtf8, "invalid UTF-8");
    reject("63eda080", CborErrorKind::InvalidUtf8, "invalid UTF-8"); // a surrogate
    reject("62c0af", CborErrorKind::InvalidUtf8, "invalid UTF-8"); // overlong
    reject("61ff", CborErrorKind::InvalidUtf8, "invalid UTF-8");
    reject("a161ff00", CborErrorKind::InvalidUtf8, "invalid UTF-8"); // as a map key
}

#[test]
fn rejects_truncated_input() {
    let whole = unhex("a3647479706568726573706f6e736562696469726571756573742d31626f6bf5");
    for len in 0..whole.len() {
        reject_bytes(
            &whole[..len],
            &CborLimits::default(),
            CborErrorKind::Truncated,
            "Truncated CBOR payload",
        );
    }
    for input in [
        "18",
        "19ff",
        "1a000000",
        "1b00000000000000",
        "fb3ff8",
        "43ffff",
        "9a00000002",
    ] {
        reject(input, CborErrorKind::Truncated, "Truncated");
    }
}

#[test]
fn rejects_trailing_bytes() {
    reject(
        "0000",
        CborErrorKind::TrailingData,
        "trailing data (1 bytes after the item)",
    );
    reject("a0f6f6f6", CborErrorKind::TrailingData, "trailing data");
    reject("80ff", CborErrorKind::TrailingData, "trailing data");
}

#[test]
fn rejects_nesting_deeper_than_max_depth() {
    // The top-level item is at depth 0: 65 nested arrays reach depth 64.
    let nested = |levels: usize| {
        let mut bytes = vec![0x81; levels - 1];
        bytes.push(0x80);
        bytes
    };
    assert!(dec(&nested(65)).is_ok());
    reject_bytes(
        &nested(66),
        &CborLimits::default(),
        CborErrorKind::DepthLimit,
        "nesting depth exceeds configured limit of 64",
    );

    let shallow = CborLimits {
        max_depth: 2,
        ..CborLimits::default()
    };
    assert!(cbor::decode(&unhex("818100"), &shallow).is_ok());
    reject_with(
        "81818100",
        &shallow,
        CborErrorKind::DepthLimit,
        "limit of 2",
    );
    // Map keys count as one level down.
    let flat = CborLimits {
        max_depth: 0,
        ..CborLimits::default()
    };
    assert!(cbor::decode(&unhex("a0"), &flat).is_ok());
    reject_with(
        "a1616100",
        &flat,
        CborErrorKind::DepthLimit,
        "nesting depth",
    );

    // Configured depths above 512 act as 512: no stack overflow.
    let deep = CborLimits {
        max_depth: usize::MAX,
        ..CborLimits::default()
    };
    assert!(cbor::decode(&nested(513), &deep).is_ok());
    reject_bytes(
        &nested(100_000),
        &deep,
        CborErrorKind::DepthLimit,
        "limit of 512",
    );
}

#[test]
fn rejects_containers_over_the_limit_before_allocating() {
    let small = CborLimits {
        max_container_len: 3,
        ..CborLimits::default()
    };
    assert!(cbor::decode(&unhex("83010203"), &small).is_ok());
    reject_with(
        "8401020304",
        &small,
        CborErrorKind::ContainerLimit,
        "CBOR array length exceeds configured limit of 3",
    );
    reject_with(
        "a4",
        &small,
        CborErrorKind::ContainerLimit,
        "CBOR map length exceeds configured limit of 3",
    );
    // Default limit 1,000,000: the header alone is enough to reject.
    reject(
        "9a000f4241",
        CborErrorKind::ContainerLimit,
        "array length exceeds configured limit of 1000000",
    );
    reject("ba000f4241", CborErrorKind::ContainerLimit, "map length");
    // Within the limit but absent: truncated, without reserving a million slots.
    reject("9a000f4240", CborErrorKind::Truncated, "Truncated");
    reject("ba000f4240", CborErrorKind::Truncated, "Truncated");
    let huge = CborLimits {
        max_container_len: usize::MAX,
        ..CborLimits::default()
    };
    reject_with(
        "9b001fffffffffffff",
        &huge,
        CborErrorKind::Truncated,
        "Truncated",
    );
    reject_with(
        "bb001fffffffffffff00",
        &huge,
        CborErrorKind::NonTextKey,
        "keys must be strings",
    );
}

#[test]
fn rejects_strings_over_the_limit() {
    let small = CborLimits {
        max_byte_len: 4,
        ..CborLimits::default()
    };
    assert!(
        cbor::decode(&unhex("6461626364"), &small).is_err(),
        "the whole item is over 4 bytes"
    );
    let small = CborLimits {
        max_byte_len: 6,
        ..CborLimits::default()
    };
    assert_eq!(
        cbor::decode(&unhex("6461626364"), &small).unwrap(),
        Value::text("abcd")
    );
    reject_with(
        "67616263",
        &small,
        CborErrorKind::ByteLengthLimit,
        "text string length exceeds configured limit of 6",
    );
    reject_with(
        "5a00000007",
        &small,
        CborErrorKind::ByteLengthLimit,
        "byte string length exceeds configured limit of 6",
    );
    reject_with(
        "0000000000000000",
        &small,
        CborErrorKind::ByteLengthLimit,
        "CBOR byte length exceeds configured limit of 6",
    );
    // Default 16 MiB: a declared 4 GiB string is rejected from its header.
    reject(
        "7affffffff",
        CborErrorKind::ByteLengthLimit,
        "text string length exceeds configured limit of 16777216",
    );
    reject(
        "5b0000000100000000",
        CborErrorKind::ByteLengthLimit,
        "byte string length",
    );
}

// ---------------------------------------------------------------------------
// Encoder errors
// ---------------------------------------------------------------------------

fn encode_err(value: &Value) -> cbor::CborError {
    let mut out = vec![0xaa];
    let error = cbor::encode(value, &mut out).expect_err("encoding should fail");
    assert_eq!(out, [0xaa], "a failed encode leaves the buffer as it was");
    error
}

#[test]
fn encoder_rejects_non_finite_numbers() {
    for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let error = encode_err(&Value::Float(f));
        assert_eq!(error.kind(), CborErrorKind::NonFiniteNumber);
        assert!(error.to_string().contains("must be finite"), "{error}");
    }
    let error = encode_err(&Value::Array(vec![Value::Int(1), Value::Float(f64::NAN)]));
    assert_eq!(error.kind(), CborErrorKind::NonFiniteNumber);
}

#[test]
fn encoder_rejects_unsafe_integers() {
    for value in [
        Value::Int(MAX_SAFE_INTEGER + 1),
        Value::Int(-MAX_SAFE_INTEGER - 1),
        Value::Int(i64::MAX),
        Value::Int(i64::MIN),
        Value::Float(1e20),
        Value::Float(9_007_199_254_740_992.0),
        Value::Float(-1.7976931348623157e308),
    ] {
        let error = encode_err(&value);
        assert_eq!(error.kind(), CborErrorKind::IntegerOutOfRange, "{value:?}");
        assert!(
            error.to_string().contains("safe JavaScript integers"),
            "{error}"
        );
    }
    assert_eq!(
        hex(&enc(&Value::Int(-MAX_SAFE_INTEGER))),
        "3b001ffffffffffffe"
    );
    assert_eq!(
        hex(&enc(&Value::Float(-(MAX_SAFE_INTEGER as f64)))),
        "3b001ffffffffffffe"
    );
}

#[test]
fn encoder_enforces_depth_limit() {
    let mut value = Value::Array(vec![]);
    for _ in 0..64 {
        value = Value::Array(vec![value]);
    }
    assert_eq!(
        dec(&enc(&value)).unwrap(),
        value,
        "65 levels (depth 64) encode"
    );
    let value = map! { "x" => value };
    let error = encode_err(&value);
    assert_eq!(error.kind(), CborErrorKind::DepthLimit);
    assert!(
        error
            .to_string()
            .contains("nesting depth exceeds configured limit of 64"),
        "{error}"
    );
}

#[test]
fn encoder_rejects_duplicate_keys() {
    let error = encode_err(&map! { "a" => Value::Null, "b" => Value::Null, "a" => Value::Int(1) });
    assert_eq!(error.kind(), CborErrorKind::DuplicateKey);
    assert!(error.to_string().contains("duplicate key \"a\""), "{error}");
    let mut entries: Vec<(String, Value)> =
        (0..100).map(|i| (format!("k{i}"), Value::Int(i))).collect();
    entries.push(("k42".to_string(), Value::Null));
    let error = encode_err(&Value::Map(entries));
    assert!(
        error.to_string().contains("duplicate key \"k42\""),
        "{error}"
    );
}

#[test]
fn encoder_enforces_explicit_limits() {
    let limits = CborLimits {
        max_depth: 64,
        max_container_len: 2,
        max_byte_len: 8,
    };
    let mut out = Vec::new();
    let error = cbor::encode_with_limits(&Value::Array(vec![Value::Null; 3]), &mut out, &limits)
        .unwrap_err();
    assert_eq!(error.kind(), CborErrorKind::ContainerLimit);
    let error = cbor::encode_with_limits(&Value::text("123456789"), &mut out, &limits).unwrap_err();
    assert!(error.to_string().contains("text string length"), "{error}");
    let error = cbor::encode_with_limits(&Value::Bytes(vec![0; 9]), &mut out, &limits).unwrap_err();
    assert!(error.to_string().contains("byte string length"), "{error}");
    let error = cbor::encode_with_limits(&Value::text("12345678"), &mut out, &limits).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("CBOR byte length exceeds configured limit of 8"),
        "{error}"
    );
    assert!(out.is_empty());
    cbor::encode_with_limits(&Value::text("1234567"), &mut out, &limits).unwrap();
    assert_eq!(out.len(), 8);
}

#[test]
fn encode_appends_to_the_buffer() {
    let mut out = vec![0x01];
    cbor::encode(&Value::Int(2), &mut out).unwrap();
    cbor::encode(&Value::Null, &mut out).unwrap();
    assert_eq!(out, [0x01, 0x02, 0xf6]);
    assert_eq!(cbor::to_vec(&Value::Bool(true)).unwrap(), [0xf5]);
}

// ---------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------

fn sample_payloads() -> Vec<Vec<u8>> {
    vec![
        unhex("a264747970656568656c6c6f6776657273696f6e01"),
        vec![],
        vec![0xf6],
        (0..=255).collect(),
        unhex("a3647479706568726573706f6e736562696469726571756573742d31626f6bf5"),
    ]
}

fn stream_of(payloads: &[Vec<u8>]) -> Vec<u8> {
    payloads.iter().flat_map(|p| frame(p)).collect()
}

#[test]
fn frame_decoder_handles_every_split_point() {
    let payloads = sample_payloads();
    let stream = stream_of(&payloads);
    for i in 0..=stream.len() {
        for j in (i..=stream.len()).step_by(7).chain([stream.len()]) {
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
            let mut out = Vec::new();
            for chunk in [&stream[..i], &stream[i..j], &stream[j..]] {
                decoder.push(chunk, &mut out).unwrap();
            }
            decoder.end().unwrap();
            assert_eq!(out, payloads, "split at {i} and {j}");
        }
    }
}

#[test]
fn frame_decoder_handles_one_byte_at_a_time() {
    let payloads = sample_payloads();
    let stream = stream_of(&payloads);
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let mut out = Vec::new();
    for (i, byte) in stream.iter().enumerate() {
        decoder.push(std::slice::from_ref(byte), &mut out).unwrap();
        let complete: usize = payloads
            .iter()
            .scan(0, |end, p| {
                *end += 4 + p.len();
                Some(*end)
            })
            .filter(|&end| end <= i + 1)
            .count();
        assert_eq!(out.len(), complete, "after byte {i}");
    }
    decoder.end().unwrap();
    assert_eq!(out, payloads);
}

#[test]
fn frame_decoder_handles_coalesced_frames() {
    let payloads = sample_payloads();
    let stream = stream_of(&payloads);
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let mut out = vec![b"earlier".to_vec()];
    decoder.push(&stream, &mut out).unwrap();
    decoder.push(&[], &mut out).unwrap();
    assert_eq!(decoder.buffered_len(), 0);
    decoder.end().unwrap();
    assert_eq!(out[0], b"earlier");
    assert_eq!(&out[1..], &payloads[..]);
}

#[test]
fn zero_length_frame_yields_empty_payload_that_cbor_rejects() {
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let mut out = Vec::new();
    decoder.push(&[0, 0, 0, 0], &mut out).unwrap();
    assert_eq!(out, vec![Vec::<u8>::new()]);
    let error = dec(&out[0]).unwrap_err();
    assert_eq!(error.kind(), CborErrorKind::Truncated);
    assert!(error.to_string().contains("Truncated CBOR payload"));
    decoder.end().unwrap();
}

#[test]
fn oversize_frame_is_rejected_after_exactly_four_header_bytes() {
    let mut decoder = FrameDecoder::new(100);
    let mut out = Vec::new();
    decoder.push(&[0, 0, 0], &mut out).unwrap();
    assert_eq!(decoder.buffered_len(), 3);
    let error = decoder.push(&[101], &mut out).unwrap_err();
    assert_eq!(
        error.to_string(),
        "Frame length 101 exceeds configured limit of 100"
    );
    assert_eq!(error.kind(), FrameErrorKind::TooLong { len: 101, max: 100 });
    assert!(decoder.is_failed());
    assert_eq!(decoder.buffered_len(), 0);
    assert!(out.is_empty());

    // The default limit, against a declared 4 GiB frame.
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let error = decoder
        .push(&[0xff, 0xff, 0xff, 0xff], &mut out)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Frame length 4294967295 exceeds configured limit of 16777216"
    );
    assert!(decoder.is_failed());
}

#[test]
fn frame_length_equal_to_the_limit_is_accepted() {
    let payload = vec![7u8; 100];
    let framed = encode_frame(&payload, 100).unwrap();
    let mut decoder = FrameDecoder::new(100);
    let mut out = Vec::new();
    decoder.push(&framed, &mut out).unwrap();
    assert_eq!(out, vec![payload]);

    let mut decoder = FrameDecoder::new(0);
    decoder.push(&[0, 0, 0, 0], &mut out).unwrap();
    assert!(decoder.push(&[0, 0, 0, 1], &mut out).is_err());
}

#[test]
fn a_huge_declared_frame_buffers_only_what_arrived() {
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let mut out = Vec::new();
    decoder
        .push(&DEFAULT_MAX_FRAME_LEN.to_be_bytes(), &mut out)
        .unwrap();
    assert_eq!(decoder.buffered_len(), 0);
    decoder.push(&[1, 2, 3], &mut out).unwrap();
    assert_eq!(decoder.buffered_len(), 3);
    assert!(out.is_empty());
    let error = decoder.end().unwrap_err();
    assert_eq!(error.kind(), FrameErrorKind::Truncated);
    assert!(
        error
            .to_string()
            .starts_with("Truncated frame at end of stream"),
        "{error}"
    );
    assert!(
        error.to_string().contains("3 of 16777216 payload bytes"),
        "{error}"
    );
}

#[test]
fn payloads_before_an_error_in_the_same_chunk_are_kept() {
    let mut chunk = frame(b"\xf6");
    chunk.extend(frame(b"\xf5"));
    chunk.extend([0, 0, 1, 0]); // 256 > 10
    chunk.extend(frame(b"\xf4"));
    let mut decoder = FrameDecoder::new(10);
    let mut out = Vec::new();
    let error = decoder.push(&chunk, &mut out).unwrap_err();
    assert_eq!(
        error.to_string(),
        "Frame length 256 exceeds configured limit of 10"
    );
    assert_eq!(out, vec![vec![0xf6], vec![0xf5]]);
}

#[test]
fn a_failed_decoder_stays_failed() {
    let mut decoder = FrameDecoder::new(10);
    let mut out = Vec::new();
    decoder.push(&[0, 0, 0, 11], &mut out).unwrap_err();
    for _ in 0..2 {
        let error = decoder.push(&frame(b"\xf6"), &mut out).unwrap_err();
        assert_eq!(error.kind(), FrameErrorKind::Failed);
        assert!(
            error.to_string().starts_with("Frame decoder has failed"),
            "{error}"
        );
        assert!(
            error.to_string().contains("Frame length 11 exceeds"),
            "{error}"
        );
        let error = decoder.push(&[], &mut out).unwrap_err();
        assert_eq!(error.kind(), FrameErrorKind::Failed);
        let error = decoder.end().unwrap_err();
        assert_eq!(error.kind(), FrameErrorKind::Failed);
        assert!(decoder.is_failed());
    }
    assert!(out.is_empty());
}

#[test]
fn end_reports_a_truncated_header_or_payload() {
    let framed = frame(b"\x83\x01\x02\x03");
    for cut in 1..framed.len() {
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
        let mut out = Vec::new();
        decoder.push(&framed[..cut], &mut out).unwrap();
        // A complete header is parsed, not held.
        assert_eq!(decoder.buffered_len(), if cut < 4 { cut } else { cut - 4 });
        let error = decoder.end().unwrap_err();
        assert_eq!(error.kind(), FrameErrorKind::Truncated);
        assert!(
            error
                .to_string()
                .starts_with("Truncated frame at end of stream"),
            "{error}"
        );
        let detail = if cut < 4 {
            "header bytes"
        } else {
            "payload bytes"
        };
        assert!(error.to_string().contains(detail), "{error}");
        assert!(decoder.is_failed());
        assert!(
            decoder
                .end()
                .unwrap_err()
                .to_string()
                .starts_with("Frame decoder has failed")
        );
        assert!(out.is_empty());
    }
}

#[test]
fn end_on_a_frame_boundary_succeeds_and_ends_the_decoder() {
    let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
    let mut out = Vec::new();
    decoder.end().unwrap();
    let error = decoder.push(&frame(b"\xf6"), &mut out).unwrap_err();
    assert_eq!(error.kind(), FrameErrorKind::Ended);
    assert_eq!(error.to_string(), "Frame decoder has ended");
    assert_eq!(decoder.end().unwrap_err().kind(), FrameErrorKind::Ended);
    assert!(!decoder.is_failed());
}

#[test]
fn encode_frame_checks_the_limit() {
    assert_eq!(encode_frame(&[1, 2, 3], 3).unwrap(), [0, 0, 0, 3, 1, 2, 3]);
    assert_eq!(encode_frame(&[], 0).unwrap(), [0, 0, 0, 0]);
    let error = encode_frame(&[1, 2, 3], 2).unwrap_err();
    assert_eq!(error.kind(), FrameErrorKind::TooLong { len: 3, max: 2 });
    assert_eq!(
        error.to_string(),
        "Frame payload length 3 exceeds configured limit of 2"
    );
    let big = vec![0u8; 70_000];
    assert_eq!(
        encode_frame(&big, DEFAULT_MAX_FRAME_LEN).unwrap()[..4],
        [0, 1, 0x11, 0x70]
    );
}

#[test]
fn frame_shared_frames_their_concatenation_without_copying() {
    use kernel::wire::frame::{Frame, frame_shared};
    use std::sync::Arc;
    let shared: [Arc<[u8]>; 3] = [
        Arc::from(&[3u8][..]),
        Arc::from(&[][..]),
        Arc::from(&[4u8, 5][..]),
    ];
    let frame = frame_shared(&[1, 2], &shared, &[6], 6).unwrap();
    let whole = encode_frame(&[1, 2, 3, 4, 5, 6], 6).unwrap();
    assert_eq!(frame.len(), whole.len());
    assert_eq!(&frame.bytes()[..], &whole[..]);
    assert_eq!(
        frame,
        Frame::from(whole.clone()),
        "equal bytes, however cut"
    );
    assert_ne!(
        frame,
        Frame::from(encode_frame(&[1, 2, 3, 4, 5, 7], 6).unwrap())
    );
    assert!(
        frame.pieces().iter().any(|p| Arc::ptr_eq(p, &shared[2])),
        "a shared piece is held, not copied"
    );
    assert!(frame.ptr_eq(&frame.clone()));
    let joined = frame.clone().into_contiguous();
    assert_eq!(&joined[..], &whole[..]);
    assert!(
        Arc::ptr_eq(&joined, &frame.clone().into_contiguous()),
        "joined once for every clone"
    );
    assert!(!frame.ptr_eq(&Frame::from(whole)));
    assert_eq!(
        &frame_shared(&[], &[], &[], 0).unwrap().bytes()[..],
        [0, 0, 0, 0]
    );
    assert_eq!(
        frame_shared(&[1, 2], &shared, &[6], 5).unwrap_err(),
        encode_frame(&[1, 2, 3, 4, 5, 6], 5).unwrap_err()
    );
}

/// The piecewise encoder writes what `encode` writes for the same item,
/// with pre-encoded items spliced in, and enforces the same limits.
#[test]
fn encoder_pieces_equal_whole_items() {
    let inner = map! { "a" => Value::Int(1), "b" => Value::Array(vec![Value::Null]) };
    let whole = map! {
        "x" => Value::text("y"),
        "list" => Value::Array(vec![inner.clone(); 30]),
        "n" => Value::Int(-500),
    };
    let limits = CborLimits::default();
    let item = enc(&inner);
    let mut out = vec![0xaa]; // appends after what is there
    let mut e = cbor::Encoder::new(&mut out, &limits);
    e.map_header(3).unwrap();
    e.text("x").unwrap();
    e.item(&Value::text("y")).unwrap();
    e.text("list").unwrap();
    e.array_header(30).unwrap();
    for _ in 0..30 {
        e.raw(&item);
    }
    e.text("n").unwrap();
    e.item(&Value::Int(-500)).unwrap();
    e.finish().unwrap();
    assert_eq!(out[0], 0xaa);
    assert_eq!(hex(&out[1..]), hex(&enc(&whole)));

    let small = CborLimits {
        max_byte_len: 4,
        max_container_len: 2,
        ..CborLimits::default()
    };
    let mut out = Vec::new();
    let mut e = cbor::Encoder::new(&mut out, &small);
    assert_eq!(
        e.array_header(3).unwrap_err().kind(),
        CborErrorKind::ContainerLimit
    );
    e.array_header(1).unwrap();
    e.raw(&enc(&Value::text("long")));
    assert_eq!(
        e.finish().unwrap_err().kind(),
        CborErrorKind::ByteLengthLimit
    );
    assert_eq!(
        cbor::check_item_len(5, &small).unwrap_err(),
        cbor::encode_with_limits(
            &Value::Array(vec![Value::text("long")]),
            &mut Vec::new(),
            &small
        )
        .unwrap_err()
    );
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

/// Finite numbers as the decoder produces them: normalised by `Value::number`.
fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER).prop_map(Value::Int),
        (-1000i64..1000).prop_map(Value::Int),
        any::<f64>()
            .prop_filter("finite, and a safe integer if integral", |f| {
                f.is_finite() && (f.fract() != 0.0 || f.abs() <= MAX_SAFE_INTEGER as f64)
            })
            .prop_map(Value::number),
        Just(Value::Float(-0.0)),
        (-1e6f64..1e6).prop_map(Value::number),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        ".{0,12}".prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,6}", inner, 0..8).prop_map(|entries| {
                // Unique keys, in an order other than sorted.
                let mut entries: Vec<(String, Value)> = entries.into_iter().collect();
                entries.reverse();
                Value::Map(entries)
            }),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn values_round_trip(value in arb_value()) {
        let bytes = enc(&value);
        let decoded = dec(&bytes).unwrap();
        prop_assert_eq!(&decoded, &value);
        prop_assert_eq!(enc(&decoded), bytes);
    }

    #[test]
    fn frame_streams_survive_any_chunking(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..12),
    ) {
        let stream = stream_of(&payloads);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.push(0);
        points.push(stream.len());
        points.sort_unstable();
        let mut decoder = FrameDecoder::new(300);
        let mut out = Vec::new();
        for pair in points.windows(2) {
            decoder.push(&stream[pair[0]..pair[1]], &mut out).unwrap();
        }
        decoder.end().unwrap();
        prop_assert_eq!(out, payloads);
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = dec(&bytes);
        let tight = CborLimits { max_depth: 3, max_container_len: 4, max_byte_len: 16 };
        let _ = cbor::decode(&bytes, &tight);
    }

    #[test]
    fn decode_never_panics_on_mutated_encodings(
        value in arb_value(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<proptest::sample::Index>(),
    ) {
        let mut bytes = enc(&value);
        for (at, byte) in edits {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        let _ = dec(&bytes);
        let _ = dec(&bytes[..cut.index(bytes.len() + 1)]);
    }

    /// Whatever decodes re-encodes, and decodes again to the same value.
    #[test]
    fn decoded_values_re_encode(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(value) = dec(&bytes) {
            let again = enc(&value);
            prop_assert_eq!(dec(&again).unwrap(), value);
        }
    }

    #[test]
    fn frame_decoder_never_panics(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..8),
        max in 0u32..64,
    ) {
        let mut decoder = FrameDecoder::new(max);
        let mut out = Vec::new();
        let mut failed = false;
        for chunk in &chunks {
            let result = decoder.push(chunk, &mut out);
            prop_assert!(!failed || result.is_err(), "a failed decoder accepted input");
            failed |= result.is_err();
            prop_assert!(out.iter().all(|p| p.len() <= max as usize));
        }
        let _ = decoder.end();
    }
}
