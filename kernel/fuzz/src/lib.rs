//! The fuzz targets' bodies: every decoder that reads another process's
//! bytes. Each takes any input and must not panic; each also checks what
//! must hold of whatever decodes. The `fuzz_targets/` binaries hand them to
//! libFuzzer; `kernel/tests/fuzz_corpus.rs` runs them over the kept corpora
//! (`corpus/<target>/`) and mutations of them on the stable toolchain, as
//! CI's short run.

use kernel::chord::call::{Control, ServiceCall};
use kernel::chord::ops::apply_all;
use kernel::chord::wire::Decoder;
use kernel::protocol::worker::decode_worker_frame;
use kernel::protocol::{decode_client_message, decode_server_message, v8};
use kernel::wire::{CborLimits, FrameDecoder, Value, cbor};

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("decode", decode),
    ("worker", worker),
    ("v8", v8_request),
    ("chord_ops", chord_ops),
];

fn tight() -> CborLimits {
    CborLimits {
        max_depth: 4,
        max_container_len: 8,
        max_byte_len: 256,
    }
}

/// The first byte picks how the rest is chunked and the frame limit; the
/// payloads the frame decoder yields go to `payload`, and so does the whole
/// input, so that unframed inputs still reach the decoders.
fn framed(data: &[u8], payload: impl Fn(&[u8])) {
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
    for p in &payloads {
        assert!(p.len() <= max_frame_len as usize);
        payload(p);
    }
    payload(stream);
}

fn round_trip(value: &Value) {
    let mut bytes = Vec::new();
    cbor::encode(value, &mut bytes).expect("a decoded value re-encodes");
    let again = cbor::decode(&bytes, &CborLimits::default()).expect("a re-encoded value decodes");
    assert_eq!(&again, value);
}

/// Protocol v1 both ways: frames, CBOR (which re-encodes to itself), a
/// client's messages as the server reads them and the server's as a
/// client reads them.
pub fn decode(data: &[u8]) {
    framed(data, |payload| {
        let limits = CborLimits::default();
        if let Ok(value) = cbor::decode(payload, &limits) {
            round_trip(&value);
        }
        let _ = cbor::decode(payload, &tight());
        let _ = decode_client_message(payload, &limits);
        let _ = decode_server_message(payload, &limits);
    });
}

/// The worker channel, both ways: a frame that decodes has snapshots whose
/// kept transcript unpacks (it was checked item by item on the way in).
pub fn worker(data: &[u8]) {
    framed(data, |payload| {
        for limits in [CborLimits::default(), tight()] {
            let Ok(frame) = decode_worker_frame(payload, &limits) else {
                continue;
            };
            match frame {
                kernel::protocol::worker::WorkerFrame::Hello {
                    resume: Some(snapshot),
                    ..
                } => {
                    snapshot.unpack().expect("a decoded resume unpacks");
                }
                kernel::protocol::worker::WorkerFrame::FromWorker(message) => {
                    message
                        .try_map_snapshot(|s| s.unpack())
                        .expect("a decoded snapshot unpacks");
                }
                _ => {}
            }
        }
    });
}

/// A v8 client's messages as the server reads them: the direct reader
/// agrees with the value tree wherever it answers (`decode_client_message`
/// compares them), and a request's call goes through the service layer's
/// parse.
pub fn v8_request(data: &[u8]) {
    framed(data, |payload| {
        for limits in [CborLimits::default(), tight()] {
            let direct = kernel::protocol::codec::read::v8_request(payload, &limits);
            let decoded = v8::decode_client_message(payload, &limits);
            if let Some(direct) = direct
                && !direct.id.is_empty()
                && v8::is_server_id(direct.server_id)
                && direct.call.is_json()
                && direct
                    .session
                    .is_none_or(|(s, a)| !s.is_empty() && !a.is_empty())
            {
                match &decoded {
                    Ok(v8::ClientMessage::Request { id, call, .. }) => {
                        assert_eq!((id.as_str(), call), (direct.id, &direct.call));
                    }
                    other => panic!("the direct reader read a request, the tree {other:?}"),
                }
            }
            if let Ok(v8::ClientMessage::Request { call, .. }) = decoded
                && let Some(call) = ServiceCall::parse(&call)
            {
                let _ = Control::of(&call);
                assert_eq!(ServiceCall::parse(&call.to_value()), Some(call));
            }
        }
    });
}

/// A state stream's op batches as a replica reads them, applied in turn to
/// one replica: each CBOR value in the input is a batch.
pub fn chord_ops(data: &[u8]) {
    let mut decoder = Decoder::new();
    let mut replica = Value::Null;
    let mut rest = data;
    while !rest.is_empty() {
        let len = usize::from(rest[0]).min(rest.len() - 1);
        let (batch, tail) = rest[1..].split_at(len);
        rest = tail;
        let Ok(batch) = cbor::decode(batch, &tight()) else {
            continue;
        };
        if let Ok(ops) = decoder.decode(&batch) {
            let _ = apply_all(&mut replica, &ops);
        }
    }
}
