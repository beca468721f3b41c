//! Untrusted bytes through the whole inbound path: frames, CBOR, schema.
//!
//! The first input byte picks how the rest is chunked and which frame limit
//! applies; the rest is the byte stream. The whole input is also decoded as
//! one CBOR payload, so that unframed inputs still exercise the decoder.
//! Besides "never panics", it checks that whatever decodes re-encodes and
//! decodes to the same value.

#![no_main]
// `fuzz_target!` expands to a debug hook that writes a file; kernel/clippy.toml
// (which applies here too) disallows that for the kernel itself.
#![allow(clippy::disallowed_methods)]

use kernel::protocol::decode_client_message;
use kernel::wire::{CborLimits, FrameDecoder, Value, cbor};
use libfuzzer_sys::fuzz_target;

fn check_payload(payload: &[u8]) {
    let limits = CborLimits::default();
    let tight = CborLimits {
        max_depth: 4,
        max_container_len: 8,
        max_byte_len: 256,
    };
    if let Ok(value) = cbor::decode(payload, &limits) {
        round_trip(&value);
    }
    let _ = cbor::decode(payload, &tight);
    let _ = decode_client_message(payload, &limits);
}

fn round_trip(value: &Value) {
    let mut bytes = Vec::new();
    cbor::encode(value, &mut bytes).expect("a decoded value re-encodes");
    let again = cbor::decode(&bytes, &CborLimits::default()).expect("a re-encoded value decodes");
    assert_eq!(&again, value);
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let chunk_len = usize::from(control & 0x0f) + 1;
    let max_frame_len = if control & 0x10 == 0 {
        1 << 16
    } else {
        u32::from(control >> 5) * 8
    };

    let mut decoder = FrameDecoder::new(max_frame_len);
    let mut payloads = Vec::new();
    let mut failed = false;
    for chunk in stream.chunks(chunk_len) {
        let result = decoder.push(chunk, &mut payloads);
        assert!(
            !failed || result.is_err(),
            "a failed decoder accepted input"
        );
        failed |= result.is_err();
    }
    let ended = decoder.end();
    assert!(!failed || ended.is_err());
    for payload in &payloads {
        assert!(payload.len() <= max_frame_len as usize);
        check_payload(payload);
    }
    check_payload(stream);
});
