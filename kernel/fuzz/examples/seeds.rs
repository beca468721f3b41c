//! Writes the seed inputs of each target's corpus (`corpus/<target>/seed-*`):
//! well-formed messages of each decoder, which libFuzzer then mutates. Run
//! from kernel/fuzz: `cargo run --example seeds`.

use kernel::chord::ops::{Op, Seg};
use kernel::chord::wire::Encoder;
use kernel::protocol::worker::{WorkerFrame, frame_worker_message};
use kernel::protocol::{
    AssistantItem, AssistantStatus, ClientHello, ClientMessage, Command, Content, ModelRef,
    Request, SessionPhase, SessionSnapshot, StopReason, ThinkingLevel, TranscriptItem, UserItem,
    encode_client_message,
};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{Value, cbor};
use kernel::worker::{FromWorker, TailSnapshot};
use std::path::Path;

fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![0x07]; // chunks of 8 bytes, the default frame limit
    for p in payloads {
        out.extend(encode_frame(p, DEFAULT_MAX_FRAME_LEN).expect("fits"));
    }
    out
}

fn client(message: &ClientMessage) -> Vec<u8> {
    encode_client_message(message).expect("encodes")
}

fn snapshot() -> SessionSnapshot {
    let model = ModelRef {
        provider: "faux".into(),
        id: "faux-1".into(),
    };
    SessionSnapshot {
        id: "s1".into(),
        name: Some("seed".into()),
        cwd: "/work".into(),
        created_at: 1,
        updated_at: 2,
        phase: SessionPhase::Idle,
        model: model.clone(),
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision: 3,
        transcript: vec![
            TranscriptItem::User(UserItem {
                id: "item-1".into(),
                content: vec![Content::Text { text: "hi".into() }],
                timestamp: 1,
            }),
            TranscriptItem::Assistant(AssistantItem {
                id: "item-2".into(),
                content: vec![
                    Content::Thinking {
                        thinking: "hmm".into(),
                        redacted: None,
                        signature: None,
                    },
                    Content::Text {
                        text: "hello".into(),
                    },
                ],
                model,
                response_model: None,
                usage: None,
                timestamp: 2,
                status: AssistantStatus::Complete(StopReason::Stop),
                error_message: None,
            }),
        ],
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed written");
}

fn main() {
    let hello = client(&ClientMessage::Hello(ClientHello {
        version: 1,
        token: None,
    }));
    let list = client(&ClientMessage::Request(Request {
        id: "r1".into(),
        command: Command::List,
    }));
    let prompt = client(&ClientMessage::Request(Request {
        id: "r2".into(),
        command: Command::Prompt {
            session_id: "s1".into(),
            text: "hi".into(),
        },
    }));
    write("decode", "v1", &framed(&[hello, list, prompt]));

    let ready = FromWorker::Ready {
        snapshot: TailSnapshot::from(snapshot()),
    };
    let ready = WorkerFrame::FromWorker(ready.pack().expect("packs"));
    let frame = frame_worker_message(&ready).expect("encodes");
    let mut seed = vec![0x07];
    seed.extend(frame);
    write("worker", "ready", &seed);

    let server = Value::object(vec![(
        "serverId",
        Value::text("00000000-0000-4000-8000-000000000001"),
    )]);
    let call = Value::object(vec![
        ("serviceId", Value::text("pi.session-management")),
        ("member", Value::text("attach")),
        ("args", Value::Array(vec![Value::text("s1")])),
    ]);
    let request = Value::object(vec![
        ("type", Value::text("request")),
        ("id", Value::text("1")),
        ("target", server),
        ("call", call),
    ]);
    let mut payload = Vec::new();
    cbor::encode(&request, &mut payload).expect("encodes");
    write("v8", "attach", &framed(&[payload]));

    let mut encoder = Encoder::new();
    let entries = vec![Seg::Key("entries".into())];
    let batches = [
        vec![Op::Replace(Value::object(vec![(
            "entries",
            Value::Array(Vec::new()),
        )]))],
        vec![Op::Splice(
            entries.clone(),
            0,
            0,
            vec![Value::object(vec![("text", Value::text("he"))])],
        )],
        vec![
            Op::Append(
                vec![
                    Seg::Key("entries".into()),
                    Seg::Index(0),
                    Seg::Key("text".into()),
                ],
                "llo".into(),
            ),
            Op::Trim(
                vec![
                    Seg::Key("entries".into()),
                    Seg::Index(0),
                    Seg::Key("text".into()),
                ],
                1,
            ),
        ],
        vec![Op::Delete(entries)],
    ];
    let mut seed = Vec::new();
    for ops in batches {
        let mut bytes = Vec::new();
        cbor::encode(&encoder.encode(&ops), &mut bytes).expect("encodes");
        seed.push(u8::try_from(bytes.len()).expect("a short batch"));
        seed.extend(bytes);
    }
    write("chord_ops", "stream", &seed);
}
