//! Issue 19 item 5 first: the direct writer of a delta event against a
//! bare writer of the same bytes (its floor).
//!
//! The suspected cost: the kernel's encoder validates every message it
//! builds (`encode_server_message` → `Schema::to_checked_value`, which
//! parses the tree back). Measured three ways:
//!
//! 1. one progress event (an assistant delta) and one session snapshot
//!    event: encode with the check vs `to_value` + CBOR without it;
//! 2. the kernel's whole step for one progress event fanned out to K
//!    attached connections (in process, no IO), so the check's share of the
//!    server's per-event work is visible;
//! 3. the server's decode of the worker frame carrying that event (the
//!    decoder validates too, which it must: the bytes come from another
//!    process).

use crate::util::{Env, Report, fmt_us, median, us};
use kernel::faux;
use kernel::ids::{ConnId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::codec::Schema;
use kernel::protocol::codec::direct::encode_progress_event;
use kernel::protocol::worker::{WorkerFrame, decode_worker_frame, encode_worker_frame};
use kernel::protocol::{
    ClientHello, ClientMessage, Command, CommandResult, CreateParams, DeltaKind, PackedSnapshot,
    Request, Response, ServerEvent, ServerMessage, SessionMetadata, SessionPhase, SessionSnapshot,
    ThinkingLevel, TranscriptItem, TranscriptProgress, encode_client_message,
    encode_server_message,
};
use kernel::server::{Config, Input, Output, Server};
use kernel::time::Instant as KInstant;
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{CborLimits, cbor};
use kernel::worker::{FromWorker, ToWorker};
use std::time::Instant;

fn progress(i: usize) -> TranscriptProgress {
    TranscriptProgress::AssistantDelta {
        message_id: "item-2".into(),
        content_index: 0,
        kind: DeltaKind::Text,
        delta: format!("w{i:04} "),
    }
}

fn snapshot(id: &str, revision: u64, items: usize) -> SessionSnapshot {
    let transcript = (0..items)
        .map(|i| crate::commit::assistant_item(&format!("item-{i}"), 400))
        .collect::<Vec<TranscriptItem>>();
    SessionSnapshot {
        id: id.into(),
        name: None,
        cwd: "/bench".into(),
        created_at: 0,
        updated_at: 0,
        phase: SessionPhase::Idle,
        model: faux::default_model(),
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision,
        transcript,
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

/// µs per call of `f`, median of 5 batches of `reps`.
fn per_call(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut batches = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..reps {
            f();
        }
        batches.push(us(start.elapsed()) / reps as f64);
    }
    median(&batches)
}

fn unchecked(message: &ServerMessage) -> Vec<u8> {
    let mut out = Vec::new();
    cbor::encode(&message.to_value(), &mut out).expect("encodes");
    out
}

/// A kernel server with `k` ready connections attached to one ready session.
struct Fan {
    server: Server,
    now: u64,
    worker: WorkerId,
    session: String,
}

fn frame(message: &ClientMessage) -> Vec<u8> {
    encode_frame(
        &encode_client_message(message).expect("encodes"),
        DEFAULT_MAX_FRAME_LEN,
    )
    .expect("fits")
}

impl Fan {
    /// One step; every frame sent is acknowledged as written (one
    /// `Written` step per frame), untimed.
    fn step(&mut self, input: Input) -> Vec<Output> {
        let outputs = self.step_only(input);
        self.ack(&outputs);
        outputs
    }

    fn step_only(&mut self, input: Input) -> Vec<Output> {
        self.now += 1;
        self.server.step(KInstant(self.now), input)
    }

    fn ack(&mut self, outputs: &[Output]) {
        for o in outputs {
            if let Output::Send { conn, frame } = o {
                let _ = self.server.step(
                    KInstant(self.now),
                    Input::Written {
                        conn: *conn,
                        bytes: frame.len(),
                    },
                );
            }
        }
    }

    /// A server whose catalog holds `sessions`, with no connection yet.
    fn serving(sessions: Vec<SessionMetadata>) -> Self {
        let config = Config {
            server_id: "00000000-0000-4000-8000-000000000001".into(),
            token: None,
            seed: 7,
            models: faux::models(),
            limits: Limits::default(),
            idle_exit: None,
            local_token: true,
        };
        let mut fan = Self {
            server: Server::new(config),
            now: 0,
            worker: WorkerId(0),
            session: String::new(),
        };
        fan.step(Input::CatalogLoaded {
            sessions,
            models: Vec::new(),
        });
        fan
    }

    /// Accepts `conn` and completes its handshake.
    fn connect(&mut self, conn: ConnId) {
        self.step(Input::Accepted { conn, peer: None });
        self.step(Input::Received {
            conn,
            bytes: frame(&ClientMessage::Hello(ClientHello {
                version: 1,
                token: None,
            })),
        });
    }

    fn new(k: u64) -> Self {
        let mut fan = Self::serving(Vec::new());
        for c in 1..=k {
            fan.connect(ConnId(c));
        }
        let create = frame(&ClientMessage::Request(Request {
            id: "c".into(),
            command: Command::Create(CreateParams::default()),
        }));
        let outputs = fan.step(Input::Received {
            conn: ConnId(1),
            bytes: create,
        });
        let (worker, session) = outputs
            .iter()
            .find_map(|o| match o {
                Output::SpawnWorker {
                    worker, session_id, ..
                } => Some((*worker, session_id.clone())),
                _ => None,
            })
            .expect("spawn");
        fan.worker = worker;
        fan.session = session.clone();
        fan.step(Input::WorkerSpawned {
            worker,
            token: String::new(),
        });
        fan.step(Input::FromWorker {
            worker,
            message: Box::new(FromWorker::Ready {
                snapshot: PackedSnapshot::pack(snapshot(&session, 1, 0)).expect("packs"),
            }),
        });
        for c in 2..=k {
            let attach = frame(&ClientMessage::Request(Request {
                id: "a".into(),
                command: Command::Attach {
                    session_id: session.clone(),
                },
            }));
            fan.step(Input::Received {
                conn: ConnId(c),
                bytes: attach,
            });
        }
        // A running prompt, so progress is expected.
        let prompt = frame(&ClientMessage::Request(Request {
            id: "p".into(),
            command: Command::Prompt {
                session_id: session,
                text: "x".into(),
            },
        }));
        let outputs = fan.step(Input::Received {
            conn: ConnId(1),
            bytes: prompt,
        });
        assert!(
            outputs.iter().any(|o| matches!(
                o,
                Output::ToWorker {
                    message: ToWorker::Operation { .. },
                    ..
                }
            )),
            "the prompt reached the worker"
        );
        fan
    }

    /// Per progress event: µs of the step itself, frames it produced, µs
    /// per `Written` step acknowledging one of them, and µs of one
    /// `check_invariants` (which every step runs at its end).
    fn per_event(&mut self, reps: usize) -> (f64, usize, f64, f64) {
        let (mut step, mut written, mut acks) = (0.0, 0.0, 0usize);
        let mut sends = 0;
        for _ in 0..reps {
            let input = Input::FromWorker {
                worker: self.worker,
                message: Box::new(FromWorker::Progress {
                    progress: progress(7),
                }),
            };
            let start = Instant::now();
            let outputs = self.step_only(input);
            step += us(start.elapsed());
            sends = outputs.len();
            let start = Instant::now();
            self.ack(&outputs);
            written += us(start.elapsed());
            acks += sends;
        }
        let invariants = per_call((reps / 10).max(10), || self.server.check_invariants());
        (
            step / reps as f64,
            sends,
            written / acks.max(1) as f64,
            invariants,
        )
    }
}

/// A stored session's catalog entry.
fn metadata(i: usize) -> SessionMetadata {
    SessionMetadata {
        id: format!("0b7d3c2e-5f7a-4c1e-9a55-{i:012}"),
        created_at: 1_700_000_000_000 + i as u64,
        updated_at: Some(1_700_000_000_000 + i as u64),
        parent_session_id: None,
        session_name: Some(format!("bench {i}")),
        cwd: Some("/work/bench".into()),
    }
}

/// `list` in the kernel with `n` stored sessions: µs of the step that
/// answers it, of encoding the response with and without the check, and of
/// copying the encoded bytes (what a cached encoding would cost).
fn list_step(n: usize, reps: usize) -> (f64, f64, f64, f64, usize) {
    let mut fan = Fan::serving((0..n).map(metadata).collect());
    let conn = ConnId(1);
    fan.connect(conn);
    let list = frame(&ClientMessage::Request(Request {
        id: "l".into(),
        command: Command::List,
    }));
    let step = per_call(reps, || {
        let outputs = fan.step_only(Input::Received {
            conn,
            bytes: list.clone(),
        });
        fan.ack(&outputs);
    });
    let response = ServerMessage::Response(Response {
        id: "l".into(),
        outcome: Ok(CommandResult::List {
            sessions: (0..n).map(metadata).collect(),
        }),
    });
    let checked = per_call(reps, || {
        std::hint::black_box(encode_server_message(&response).expect("valid"));
    });
    let plain = per_call(reps, || {
        std::hint::black_box(unchecked(&response));
    });
    let bytes = unchecked(&response);
    let copy = per_call(reps, || {
        std::hint::black_box(bytes.clone());
    });
    (step, checked, plain, copy, bytes.len())
}

/// µs of the kernel steps answering `attach` and `detach` of a live session
/// that another connection holds (as in item 1), and the frames they send.
fn attach_detach_steps(reps: usize) -> (f64, f64, usize, usize) {
    let mut fan = Fan::new(2);
    let session = fan.session.clone();
    let conn = ConnId(3);
    fan.connect(conn);
    let attach = frame(&ClientMessage::Request(Request {
        id: "a".into(),
        command: Command::Attach {
            session_id: session.clone(),
        },
    }));
    let detach = frame(&ClientMessage::Request(Request {
        id: "d".into(),
        command: Command::Detach {
            session_id: session,
        },
    }));
    let (mut a, mut d, mut a_bytes, mut d_bytes) = (0.0, 0.0, 0, 0);
    for _ in 0..reps {
        let start = Instant::now();
        let outputs = fan.step_only(Input::Received {
            conn,
            bytes: attach.clone(),
        });
        a += us(start.elapsed());
        a_bytes = sent_bytes(&outputs);
        fan.ack(&outputs);
        let start = Instant::now();
        let outputs = fan.step_only(Input::Received {
            conn,
            bytes: detach.clone(),
        });
        d += us(start.elapsed());
        d_bytes = sent_bytes(&outputs);
        fan.ack(&outputs);
    }
    (a / reps as f64, d / reps as f64, a_bytes, d_bytes)
}

fn sent_bytes(outputs: &[Output]) -> usize {
    outputs
        .iter()
        .map(|o| match o {
            Output::Send { frame, .. } => frame.len(),
            _ => 0,
        })
        .sum()
}

/// Nanoseconds, from µs.
fn ns(us: f64) -> String {
    format!("{:.0} ns", us * 1000.0)
}

/// The bytes of `payload` split around `strings` (which occur in it in this
/// order): the constant pieces before, between and after them.
fn pieces_around<'a>(payload: &'a [u8], strings: &[&[u8]]) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut at = 0;
    for s in strings {
        let found = payload[at..]
            .windows(s.len())
            .position(|w| w == *s)
            .expect("the string is in the payload");
        pieces.push(&payload[at..at + found]);
        at += found + s.len();
    }
    pieces.push(&payload[at..]);
    pieces
}

/// The floor of the direct writer: the same bytes from pieces computed
/// beforehand, each appended with `extend_from_slice` (constant runs and
/// heads, then each string), with nothing decided at run time.
fn bare_writer(out: &mut Vec<u8>, pieces: &[&[u8]], strings: &[&[u8]]) {
    for (piece, s) in pieces.iter().zip(strings) {
        out.extend_from_slice(piece);
        out.extend_from_slice(s);
    }
    out.extend_from_slice(pieces[strings.len()]);
}

/// Issue 19 item 5: one delta event by the direct writer
/// (`codec::direct::encode_progress_event`) vs the bare writer of the same
/// bytes, into a reused buffer and into a fresh one; alternating rounds.
fn direct_vs_floor(env: &Env, report: &mut Report, reps: usize) {
    let session_id = "0b7d3c2e-5f7a-4c1e-9a55-2f0d4b1c8e11";
    let progress = progress(7);
    let TranscriptProgress::AssistantDelta {
        message_id, delta, ..
    } = &progress
    else {
        unreachable!("a delta")
    };
    let mut direct = Vec::new();
    encode_progress_event(session_id, &progress, &mut direct).expect("encodes");
    let message = ServerMessage::Event(ServerEvent::SessionProgress {
        session_id: session_id.into(),
        progress: progress.clone(),
    });
    assert_eq!(direct, unchecked(&message), "the tree path's bytes");
    let strings: [&[u8]; 3] = [
        session_id.as_bytes(),
        message_id.as_bytes(),
        delta.as_bytes(),
    ];
    let pieces = pieces_around(&direct, &strings);
    let mut bare = Vec::new();
    bare_writer(&mut bare, &pieces, &strings);
    assert_eq!(bare, direct, "the floor writes the same bytes");

    let mut buffer = Vec::with_capacity(256);
    let (mut reused, mut fresh) = (Vec::new(), Vec::new());
    let (mut direct_us, mut bare_us, mut direct_fresh_us, mut bare_fresh_us, mut tree_us) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..env.rounds {
        let d = per_call(reps, || {
            buffer.clear();
            let (id, p) = std::hint::black_box((session_id, &progress));
            encode_progress_event(id, p, &mut buffer).expect("encodes");
            std::hint::black_box(&buffer);
        });
        let b = per_call(reps, || {
            buffer.clear();
            let (p, s) = std::hint::black_box((&pieces, &strings));
            bare_writer(&mut buffer, p, s);
            std::hint::black_box(&buffer);
        });
        reused.push(d / b);
        direct_us.push(d);
        bare_us.push(b);
        let d = per_call(reps, || {
            let mut out = Vec::new();
            let (id, p) = std::hint::black_box((session_id, &progress));
            encode_progress_event(id, p, &mut out).expect("encodes");
            std::hint::black_box(out);
        });
        let b = per_call(reps, || {
            let mut out = Vec::with_capacity(direct.len());
            let (p, s) = std::hint::black_box((&pieces, &strings));
            bare_writer(&mut out, p, s);
            std::hint::black_box(out);
        });
        fresh.push(d / b);
        direct_fresh_us.push(d);
        bare_fresh_us.push(b);
        tree_us.push(per_call(reps, || {
            std::hint::black_box(unchecked(std::hint::black_box(&message)));
        }));
    }
    let ratio = median(&reused);
    let spread = |r: &[f64]| {
        let s = crate::util::sorted(r);
        format!("rounds {:.2}–{:.2}", s[0], s[s.len() - 1])
    };
    report.push(
        "19.5",
        format!(
            "one delta event ({} B): the direct writer vs a bare writer of the same precomputed pieces, into a reused buffer",
            direct.len()
        ),
        format!(
            "direct {} / bare {} → **{ratio:.2}×** ({}); the tree path (`to_value` + CBOR) {}",
            ns(median(&direct_us)),
            ns(median(&bare_us)),
            spread(&reused),
            ns(median(&tree_us)),
        ),
        "≤ 2×",
        Some(ratio <= 2.0),
    );
    report.info(
        "19.5",
        "the same, each into a fresh buffer (allocation included)",
        format!(
            "direct {} / bare {} → {:.2}× ({})",
            ns(median(&direct_fresh_us)),
            ns(median(&bare_fresh_us)),
            median(&fresh),
            spread(&fresh),
        ),
    );
}

/// The encode check's cost.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let reps = env.pick(2_000, 50_000);
    direct_vs_floor(env, report, reps);
    let delta = ServerMessage::Event(ServerEvent::SessionProgress {
        session_id: "0b7d3c2e-5f7a-4c1e-9a55-2f0d4b1c8e11".into(),
        progress: progress(7),
    });
    let snap = ServerMessage::Event(ServerEvent::SessionSnapshot {
        snapshot: snapshot("0b7d3c2e-5f7a-4c1e-9a55-2f0d4b1c8e11", 9, 20),
    });
    assert_eq!(
        encode_server_message(&delta).expect("valid"),
        unchecked(&delta)
    );
    let d_checked = per_call(reps, || {
        std::hint::black_box(encode_server_message(&delta).expect("valid"));
    });
    let d_unchecked = per_call(reps, || {
        std::hint::black_box(unchecked(&delta));
    });
    let s_reps = (reps / 50).max(50);
    let s_checked = per_call(s_reps, || {
        std::hint::black_box(encode_server_message(&snap).expect("valid"));
    });
    let s_unchecked = per_call(s_reps, || {
        std::hint::black_box(unchecked(&snap));
    });
    let worker_frame = encode_worker_frame(&WorkerFrame::FromWorker(FromWorker::Progress {
        progress: progress(7),
    }))
    .expect("encodes");
    let limits = CborLimits::default();
    let decode = per_call(reps, || {
        std::hint::black_box(decode_worker_frame(&worker_frame, &limits).expect("decodes"));
    });
    report.info(
        "2",
        "encode check (`encode_server_message` = `to_checked_value` + CBOR) vs `to_value` + CBOR",
        format!(
            "delta event ({} B): {} vs {} (check = {:.0} %); snapshot event with 20 items ({:.1} kB): {} vs {} (check = {:.0} %); server decode of the worker's delta frame: {}",
            unchecked(&delta).len(),
            fmt_us(d_checked),
            fmt_us(d_unchecked),
            100.0 * (d_checked - d_unchecked) / d_checked,
            unchecked(&snap).len() as f64 / 1000.0,
            fmt_us(s_checked),
            fmt_us(s_unchecked),
            100.0 * (s_checked - s_unchecked) / s_checked,
            fmt_us(decode)
        ),
    );
    let (a, d, a_bytes, d_bytes) = attach_detach_steps(reps / 10);
    report.info(
        "1",
        "kernel, in process: the steps answering `attach` and `detach` of a live session (item 1's cycle)",
        format!(
            "attach {} (sends {a_bytes} B), detach {} (sends {d_bytes} B: the response, and a server snapshot to both connections)",
            fmt_us(a),
            fmt_us(d)
        ),
    );
    for n in [1usize, 1000, 10_000] {
        let reps = env.pick(20, 200) * 10 / (1 + n / 1000);
        let (step, checked, plain, copy, len) = list_step(n, reps.max(5));
        report.info(
            "5",
            format!("kernel, in process: `list` with {n} stored session(s) ({:.1} kB response)", len as f64 / 1000.0),
            format!(
                "step {}; of which encoding the response {} ({} without the check); copying cached bytes instead: {}",
                fmt_us(step),
                fmt_us(checked),
                fmt_us(plain),
                fmt_us(copy)
            ),
        );
    }
    for k in [1u64, 100, 1000] {
        let mut fan = Fan::new(k);
        // Each event is followed by k `Written` steps, each O(k): keep k = 1000 short.
        let reps = if k == 1000 { env.pick(5, 20) } else { reps / 2 };
        let (step, sends, written, invariants) = fan.per_event(reps.max(5));
        let check = d_checked - d_unchecked;
        report.info(
            "2",
            format!("kernel, in process: one progress event fanned out to {k} attached connection(s)"),
            format!(
                "step {} ({sends} frames; the encode check is {:.0} % of it); each `Written` step {}; the full invariant sweep (`check_invariants`: every step in debug builds, every 1,024 steps in release) {}",
                fmt_us(step),
                100.0 * check / step,
                fmt_us(written),
                fmt_us(invariants)
            ),
        );
    }
    Ok(())
}
