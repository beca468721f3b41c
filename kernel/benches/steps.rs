//! Kernel throughput: steps per second on one core.
//!
//! `cargo bench -p kernel --bench steps [-- SECTION...]`, sections (all by
//! default):
//!
//! - `mixed`: per round: accept, hello, create (the worker becomes ready), a
//!   prompt streaming 100 deltas, detach, disconnect, worker exit; every frame
//!   sent is acknowledged as written. Prints steps/s and frames/s. Each round
//!   leaves its session stored, so the catalog (which hellos and server
//!   snapshots carry) grows by one a round.
//! - `steady`: the same rounds on a catalog of 100 and of 1,000 stored
//!   sessions that does not grow: each round removes its session
//!   (`remove` after the detach, the worker's exit, the removal).
//! - `written`: the cost of one `Written` step (a write acknowledgement) with
//!   100 and 1,000 ready connections attached to one session, each
//!   acknowledging a broadcast progress event.
//! - `list`: the step answering `list` with 1,000 and 10,000 stored sessions,
//!   and the same right after a live session's `updatedAt` moved (a turn
//!   committed), so that the listed sessions changed since the last `list`.
//! - `hello`: the step answering a client hello (it carries the server
//!   snapshot, so the whole catalog) with 1,000 and 10,000 stored sessions.
//! - `attach`: the step answering `attach` to a live session (another
//!   connection holds it) whose transcript is empty, small (10 items, 1 kB) or long
//!   (500 items, about 1 MB); the connection detaches between attaches.
//!
//! - `requests`: the step answering a v1 `list` (one stored session) and the
//!   one answering a v8 `pi.session-management.detach` (not attached), on
//!   connections of their own: what the `v8` bench item compares, without
//!   the sockets.
//!
//! A benchmark, not a test: nothing is asserted about time.

// A benchmark measures wall time; the kernel's no-clock rule is for the kernel itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use kernel::faux;
use kernel::ids::{ConnId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::{
    ClientHello, ClientMessage, Command, Content, CreateParams, DeltaKind, PackedSnapshot, Request,
    SessionMetadata, SessionPhase, SessionSnapshot, ThinkingLevel, TranscriptItem,
    TranscriptProgress, UserItem, encode_client_message,
};
use kernel::server::{Config, Input, Output, Server};
use kernel::time::Instant;
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::worker::{FromWorker, ToWorker};
use std::time::Duration;

fn frame(message: &ClientMessage) -> Vec<u8> {
    encode_frame(
        &encode_client_message(message).unwrap(),
        DEFAULT_MAX_FRAME_LEN,
    )
    .unwrap()
}

/// A snapshot as its worker sends it.
fn packed(snapshot: SessionSnapshot) -> PackedSnapshot {
    PackedSnapshot::pack(snapshot).expect("packs")
}

fn snapshot(id: &str, revision: u64, phase: SessionPhase) -> SessionSnapshot {
    SessionSnapshot {
        id: id.to_string(),
        name: None,
        cwd: "/bench".into(),
        created_at: 0,
        updated_at: 0,
        phase,
        model: faux::default_model(),
        thinking_level: ThinkingLevel::Off,
        attached: false,
        locked: true,
        revision,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

struct Bench {
    server: Server,
    now: u64,
    steps: u64,
    frames: u64,
}

impl Bench {
    fn step(&mut self, input: Input) -> Vec<Output> {
        self.now += 1;
        self.steps += 1;
        let outputs = self.server.step(Instant(self.now), input);
        let mut rest = Vec::new();
        for o in outputs {
            match o {
                Output::Send { conn, frame } => {
                    self.frames += 1;
                    self.steps += 1;
                    let _ = self.server.step(
                        Instant(self.now),
                        Input::Written {
                            conn,
                            bytes: frame.len(),
                        },
                    );
                }
                other => rest.push(other),
            }
        }
        rest
    }

    fn round(&mut self, n: u64) {
        let (conn, worker, _) = self.turn(n);
        self.step(Input::Disconnected { conn });
        self.step(Input::WorkerExited { worker });
    }

    /// A round that removes its session at the end (`remove` after the
    /// detach), so the catalog stays as large as it was.
    fn steady_round(&mut self, n: u64) {
        let (conn, worker, session) = self.turn(n);
        let remove = frame(&ClientMessage::Request(Request {
            id: "r".into(),
            command: Command::Remove {
                session_id: session.clone(),
            },
        }));
        self.step(Input::Received {
            conn,
            bytes: remove,
        });
        let outputs = self.step(Input::WorkerExited { worker });
        assert!(
            outputs
                .iter()
                .any(|o| matches!(o, Output::RemoveSession { .. })),
            "the exit removes the session"
        );
        self.step(Input::SessionRemoved {
            session_id: session,
            result: Ok(()),
        });
        self.step(Input::Disconnected { conn });
    }

    /// A round up to its detach: accept, hello, create, a prompt streaming
    /// 100 deltas, detach. Returns the connection, worker and session.
    fn turn(&mut self, n: u64) -> (ConnId, WorkerId, String) {
        let conn = ConnId(n);
        self.step(Input::Accepted { conn, peer: None });
        let hello = frame(&ClientMessage::Hello(ClientHello {
            version: 1,
            token: None,
        }));
        self.step(Input::Received { conn, bytes: hello });
        let create = frame(&ClientMessage::Request(Request {
            id: "c".into(),
            command: Command::Create(CreateParams::default()),
        }));
        let outputs = self.step(Input::Received {
            conn,
            bytes: create,
        });
        let (worker, session) = spawned(&outputs);
        self.step(Input::WorkerSpawned {
            worker,
            token: String::new(),
        });
        self.worker(
            worker,
            FromWorker::Ready {
                snapshot: packed(snapshot(&session, 1, SessionPhase::Idle)),
            },
        );
        let prompt = frame(&ClientMessage::Request(Request {
            id: "p".into(),
            command: Command::Prompt {
                session_id: session.clone(),
                text: "bench".into(),
            },
        }));
        let outputs = self.step(Input::Received {
            conn,
            bytes: prompt,
        });
        let op = outputs
            .iter()
            .find_map(|o| match o {
                Output::ToWorker {
                    message: ToWorker::Operation { op, .. },
                    ..
                } => Some(*op),
                _ => None,
            })
            .expect("operation");
        self.worker(
            worker,
            FromWorker::Snapshot {
                snapshot: packed(snapshot(&session, 2, SessionPhase::Turn)),
            },
        );
        for i in 0..100 {
            let progress = TranscriptProgress::AssistantDelta {
                message_id: "item-2".into(),
                content_index: 0,
                kind: DeltaKind::Text,
                delta: format!("word{i} "),
            };
            self.worker(worker, FromWorker::Progress { progress });
        }
        self.worker(
            worker,
            FromWorker::OpDone {
                op,
                outcome: Ok(packed(snapshot(&session, 3, SessionPhase::Idle))),
            },
        );
        let detach = frame(&ClientMessage::Request(Request {
            id: "d".into(),
            command: Command::Detach {
                session_id: session.clone(),
            },
        }));
        self.step(Input::Received {
            conn,
            bytes: detach,
        });
        (conn, worker, session)
    }

    fn worker(&mut self, worker: WorkerId, message: FromWorker) {
        self.step(Input::FromWorker {
            worker,
            message: Box::new(message),
        });
    }
}

fn config() -> Config {
    Config {
        server_id: "00000000-0000-4000-8000-000000000001".into(),
        token: None,
        seed: 7,
        models: faux::models(),
        limits: Limits::default(),
        idle_exit: None,
        local_token: true,
    }
}

fn hello_frame() -> Vec<u8> {
    frame(&ClientMessage::Hello(ClientHello {
        version: 1,
        token: None,
    }))
}

/// The worker and session of the `SpawnWorker` among `outputs`.
fn spawned(outputs: &[Output]) -> (WorkerId, String) {
    outputs
        .iter()
        .find_map(|o| match o {
            Output::SpawnWorker {
                worker, session_id, ..
            } => Some((*worker, session_id.clone())),
            _ => None,
        })
        .expect("spawns a worker")
}

/// Sends frames are acknowledged at once; other outputs are returned.
fn ack_all(server: &mut Server, now: Instant, outputs: Vec<Output>) -> Vec<Output> {
    let mut rest = Vec::new();
    for o in outputs {
        match o {
            Output::Send { conn, frame } => {
                server.step(
                    now,
                    Input::Written {
                        conn,
                        bytes: frame.len(),
                    },
                );
            }
            other => rest.push(other),
        }
    }
    rest
}

/// Accepts `conn` and completes its handshake.
fn connect(server: &mut Server, now: Instant, conn: ConnId) {
    let out = server.step(now, Input::Accepted { conn, peer: None });
    ack_all(server, now, out);
    let out = server.step(
        now,
        Input::Received {
            conn,
            bytes: hello_frame(),
        },
    );
    ack_all(server, now, out);
}

/// `conn` creates a session, whose worker comes up with the snapshot `first`
/// makes for the session's id; returns the worker and the id.
fn create(
    server: &mut Server,
    now: Instant,
    conn: ConnId,
    first: impl FnOnce(&str) -> SessionSnapshot,
) -> (WorkerId, String) {
    let create = frame(&ClientMessage::Request(Request {
        id: "c".into(),
        command: Command::Create(CreateParams::default()),
    }));
    let out = server.step(
        now,
        Input::Received {
            conn,
            bytes: create,
        },
    );
    let (worker, session) = spawned(&ack_all(server, now, out));
    let out = server.step(
        now,
        Input::WorkerSpawned {
            worker,
            token: String::new(),
        },
    );
    ack_all(server, now, out);
    let ready = FromWorker::Ready {
        snapshot: first(&session),
    };
    let out = server.step(
        now,
        Input::FromWorker {
            worker,
            message: Box::new(ready.pack().expect("packs")),
        },
    );
    ack_all(server, now, out);
    (worker, session)
}

/// `Written` steps with `n` ready connections attached to one session.
fn bench_written(n: u64) {
    let mut server = Server::new(config());
    let now = Instant(1);
    server.step(
        now,
        Input::CatalogLoaded {
            sessions: Vec::new(),
            models: Vec::new(),
        },
    );
    connect(&mut server, now, ConnId(1));
    let (worker, session) = create(&mut server, now, ConnId(1), |id| {
        snapshot(id, 1, SessionPhase::Idle)
    });
    for c in 2..=n {
        let conn = ConnId(c);
        connect(&mut server, now, conn);
        let attach = frame(&ClientMessage::Request(Request {
            id: "a".into(),
            command: Command::Attach {
                session_id: session.clone(),
            },
        }));
        let out = server.step(
            now,
            Input::Received {
                conn,
                bytes: attach,
            },
        );
        ack_all(&mut server, now, out);
    }
    assert_eq!(server.connection_count() as u64, n);
    let mut acks = 0u64;
    let mut spent = Duration::ZERO;
    let started = std::time::Instant::now();
    let mut i = 0u64;
    while started.elapsed() < Duration::from_secs(2) || acks < 10 * n {
        i += 1;
        let progress = TranscriptProgress::AssistantDelta {
            message_id: "item-2".into(),
            content_index: 0,
            kind: DeltaKind::Text,
            delta: format!("word{i} "),
        };
        let out = server.step(
            now,
            Input::FromWorker {
                worker,
                message: Box::new(FromWorker::Progress { progress }),
            },
        );
        let writes: Vec<(ConnId, usize)> = out
            .iter()
            .filter_map(|o| match o {
                Output::Send { conn, frame } => Some((*conn, frame.len())),
                _ => None,
            })
            .collect();
        assert_eq!(writes.len() as u64, n, "one event per attached connection");
        let t = std::time::Instant::now();
        for (conn, bytes) in writes {
            std::hint::black_box(server.step(now, Input::Written { conn, bytes }));
        }
        spent += t.elapsed();
        acks += n;
    }
    println!(
        "written step, {n} attached connections: {:.2} µs/step ({acks} steps)",
        spent.as_secs_f64() * 1e6 / acks as f64
    );
}

/// A stored session as the catalog holds it (about 120 bytes of CBOR).
fn stored(i: u64) -> SessionMetadata {
    SessionMetadata {
        id: format!("{:08x}-0000-4000-8000-{:012x}", i, i),
        created_at: 1_700_000_000_000 + i,
        updated_at: Some(1_700_000_500_000 + i),
        parent_session_id: None,
        session_name: Some(format!("session {i}")),
        cwd: Some(format!("/home/user/projects/project-{}", i % 97)),
    }
}

/// A server whose catalog holds `n` stored sessions.
fn with_catalog(n: u64) -> Server {
    let mut server = Server::new(config());
    server.step(
        Instant(1),
        Input::CatalogLoaded {
            sessions: (0..n).map(stored).collect(),
            models: Vec::new(),
        },
    );
    server
}

/// A v8 client frame: `value` as CBOR, framed.
fn v8_frame(value: &kernel::wire::Value) -> Vec<u8> {
    let payload = kernel::wire::cbor::to_vec(value).expect("a client value encodes");
    encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("fits")
}

/// A v1 `list` and a v8 `detach`, each the only request of its connection
/// (`STEPS_ROUNDS=N`: N of each, for instruction counts under callgrind).
fn bench_requests() {
    use kernel::wire::Value;
    let mut server = with_catalog(1);
    let now = Instant(1);
    connect(&mut server, now, ConnId(1));
    let out = server.step(
        now,
        Input::Accepted {
            conn: ConnId(2),
            peer: None,
        },
    );
    ack_all(&mut server, now, out);
    let hello = Value::object(vec![
        ("type", Value::text("hello")),
        ("version", Value::Int(8)),
    ]);
    let out = server.step(
        now,
        Input::Received {
            conn: ConnId(2),
            bytes: v8_frame(&hello),
        },
    );
    ack_all(&mut server, now, out);
    let list = frame(&ClientMessage::Request(Request {
        id: "l".into(),
        command: Command::List,
    }));
    let call = Value::object(vec![
        ("kind", Value::text("call")),
        ("service", Value::text("pi.session-management")),
        ("method", Value::text("detach")),
        (
            "args",
            Value::Array(vec![Value::object(vec![(
                "sessionId",
                Value::text("nope"),
            )])]),
        ),
    ]);
    let detach = v8_frame(&Value::object(vec![
        ("type", Value::text("request")),
        ("id", Value::text("d")),
        (
            "target",
            Value::object(vec![("serverId", Value::text(config().server_id))]),
        ),
        ("call", call),
    ]));
    let fixed: Option<u64> = std::env::var("STEPS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut bytes = 0;
    if let Some(rounds) = fixed {
        for _ in 0..rounds {
            timed_request(&mut server, now, ConnId(1), &list, &mut bytes);
            timed_request(&mut server, now, ConnId(2), &detach, &mut bytes);
        }
        return;
    }
    let (list_ms, runs) = time_ms(|| timed_request(&mut server, now, ConnId(1), &list, &mut bytes));
    println!(
        "v1 list step, 1 stored session: {:.2} µs/step ({runs} runs, {bytes} B frame)",
        list_ms * 1e3
    );
    let (detach_ms, runs) =
        time_ms(|| timed_request(&mut server, now, ConnId(2), &detach, &mut bytes));
    println!(
        "v8 detach step (not attached): {:.2} µs/step ({runs} runs, {bytes} B frame); {:.2}× list",
        detach_ms * 1e3,
        detach_ms / list_ms
    );
}

/// Times `f` over repeated runs for about a second; returns ms per run.
fn time_ms(mut f: impl FnMut() -> Duration) -> (f64, u64) {
    let started = std::time::Instant::now();
    let mut spent = Duration::ZERO;
    let mut runs = 0u64;
    while started.elapsed() < Duration::from_secs(2) || runs < 5 {
        spent += f();
        runs += 1;
    }
    (spent.as_secs_f64() * 1e3 / runs as f64, runs)
}

/// Times the step receiving `request` on `conn`; `bytes` gets the length of
/// the last frame it sent. The frames are acknowledged afterwards.
fn timed_request(
    server: &mut Server,
    now: Instant,
    conn: ConnId,
    request: &[u8],
    bytes: &mut usize,
) -> Duration {
    let request = request.to_vec();
    let t = std::time::Instant::now();
    let out = server.step(
        now,
        Input::Received {
            conn,
            bytes: request,
        },
    );
    let spent = t.elapsed();
    for o in &out {
        if let Output::Send { frame, .. } = o {
            *bytes = frame.len();
        }
    }
    ack_all(server, now, out);
    spent
}

/// The step answering `list` with `n` stored sessions.
fn bench_list(n: u64) {
    let mut server = with_catalog(n);
    let now = Instant(1);
    connect(&mut server, now, ConnId(1));
    let list = frame(&ClientMessage::Request(Request {
        id: "l".into(),
        command: Command::List,
    }));
    let mut bytes = 0;
    let (ms, runs) = time_ms(|| timed_request(&mut server, now, ConnId(1), &list, &mut bytes));
    println!("list step, {n} stored sessions: {ms:.3} ms/step ({runs} runs, {bytes} B frame)");
}

/// The step answering `list` with `n` stored sessions when a live session's
/// `updatedAt` moved since the previous one.
fn bench_list_after_change(n: u64) {
    let mut server = with_catalog(n);
    let now = Instant(1);
    connect(&mut server, now, ConnId(1));
    let attach = frame(&ClientMessage::Request(Request {
        id: "a".into(),
        command: Command::Attach {
            session_id: stored(n / 2).id,
        },
    }));
    let out = server.step(
        now,
        Input::Received {
            conn: ConnId(1),
            bytes: attach,
        },
    );
    let worker = spawned(&ack_all(&mut server, now, out)).0;
    let out = server.step(
        now,
        Input::WorkerSpawned {
            worker,
            token: String::new(),
        },
    );
    ack_all(&mut server, now, out);
    let mut live = snapshot(&stored(n / 2).id, 1, SessionPhase::Idle);
    let ready = FromWorker::Ready {
        snapshot: live.clone(),
    };
    let out = server.step(
        now,
        Input::FromWorker {
            worker,
            message: Box::new(ready.pack().expect("packs")),
        },
    );
    ack_all(&mut server, now, out);
    let list = frame(&ClientMessage::Request(Request {
        id: "l".into(),
        command: Command::List,
    }));
    let (ms, runs) = time_ms(|| {
        live.revision += 1;
        live.updated_at += 1;
        let changed = FromWorker::Snapshot {
            snapshot: live.clone(),
        };
        let out = server.step(
            now,
            Input::FromWorker {
                worker,
                message: Box::new(changed.pack().expect("packs")),
            },
        );
        ack_all(&mut server, now, out);
        let t = std::time::Instant::now();
        let out = server.step(
            now,
            Input::Received {
                conn: ConnId(1),
                bytes: list.clone(),
            },
        );
        let spent = t.elapsed();
        ack_all(&mut server, now, out);
        spent
    });
    println!("list step after a change, {n} stored sessions: {ms:.3} ms/step ({runs} runs)");
}

/// The step answering a hello (server snapshot) with `n` stored sessions.
fn bench_hello(n: u64) {
    let mut server = with_catalog(n);
    let now = Instant(1);
    let mut c = 0;
    let mut bytes = 0;
    let (ms, runs) = time_ms(|| {
        c += 1;
        let conn = ConnId(c);
        let out = server.step(now, Input::Accepted { conn, peer: None });
        ack_all(&mut server, now, out);
        let hello = hello_frame();
        let t = std::time::Instant::now();
        let out = server.step(now, Input::Received { conn, bytes: hello });
        let spent = t.elapsed();
        for o in &out {
            if let Output::Send { frame, .. } = o {
                bytes = frame.len();
            }
        }
        ack_all(&mut server, now, out);
        server.step(now, Input::Disconnected { conn });
        spent
    });
    println!("hello step, {n} stored sessions: {ms:.3} ms/step ({runs} runs, {bytes} B frame)");
}

/// A transcript of `n` user items of `len` bytes of text each.
fn transcript(n: u64, len: usize) -> Vec<TranscriptItem> {
    (0..n)
        .map(|i| {
            let mut text = format!("message {i}: ");
            while text.len() < len {
                text.push_str("lorem ipsum dolor sit amet ");
            }
            text.truncate(len);
            TranscriptItem::User(UserItem {
                id: format!("item-{i}"),
                content: vec![Content::Text { text }],
                timestamp: 1_700_000_000_000 + i,
            })
        })
        .collect()
}

/// The step answering `attach` to a live session with a transcript of
/// `items` items of `len` bytes, which another connection keeps live.
fn bench_attach(items: u64, len: usize) {
    let mut server = with_catalog(0);
    let now = Instant(1);
    connect(&mut server, now, ConnId(1));
    connect(&mut server, now, ConnId(2));
    let (_, session) = create(&mut server, now, ConnId(1), |id| SessionSnapshot {
        transcript: transcript(items, len),
        ..snapshot(id, 1, SessionPhase::Idle)
    });
    let attach = frame(&ClientMessage::Request(Request {
        id: "a".into(),
        command: Command::Attach {
            session_id: session.clone(),
        },
    }));
    let detach = frame(&ClientMessage::Request(Request {
        id: "d".into(),
        command: Command::Detach {
            session_id: session.clone(),
        },
    }));
    let mut bytes = 0;
    let (ms, runs) = time_ms(|| {
        let spent = timed_request(&mut server, now, ConnId(2), &attach, &mut bytes);
        let out = server.step(
            now,
            Input::Received {
                conn: ConnId(2),
                bytes: detach.clone(),
            },
        );
        ack_all(&mut server, now, out);
        spent
    });
    println!(
        "attach step, {items} transcript items: {:.2} µs/step ({runs} runs, {bytes} B frame)",
        ms * 1e3
    );
}

fn main() {
    // `cargo bench` passes `--bench`; other arguments name the sections to run.
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let run = |name: &str| sections.is_empty() || sections.iter().any(|s| s == name);
    if run("mixed") {
        bench_mixed();
    }
    if run("steady") {
        bench_steady(100);
        bench_steady(1_000);
    }
    if run("written") {
        bench_written(100);
        bench_written(1_000);
    }
    if run("list") {
        bench_list(1_000);
        bench_list(10_000);
        bench_list_after_change(1_000);
        bench_list_after_change(10_000);
    }
    if run("hello") {
        bench_hello(1_000);
        bench_hello(10_000);
    }
    if run("requests") {
        bench_requests();
    }
    if run("attach") {
        bench_attach(0, 0);
        bench_attach(10, 100);
        bench_attach(500, 2_000);
    }
}

/// The mixed workload: rounds for about three seconds after a warm-up.
fn bench_mixed() {
    run_rounds(Vec::new(), Bench::round, "kernel mixed workload");
}

/// The mixed workload on a catalog that does not grow: `stored` sessions
/// stored, and each round removes the session it created.
fn bench_steady(stored_sessions: u64) {
    let what = format!(
        "kernel mixed workload, steady catalog of {stored_sessions} stored sessions \
         (each round removes its session)"
    );
    let sessions = (0..stored_sessions).map(stored).collect();
    run_rounds(sessions, Bench::steady_round, &what);
}

/// Loads `sessions`, warms up with 200 rounds of `round`, then runs it for
/// about three seconds (or `STEPS_ROUNDS` rounds) and prints the rates
/// under the heading `what`.
fn run_rounds(sessions: Vec<SessionMetadata>, round: fn(&mut Bench, u64), what: &str) {
    let mut bench = Bench {
        server: Server::new(config()),
        now: 0,
        steps: 0,
        frames: 0,
    };
    bench.step(Input::CatalogLoaded {
        sessions,
        models: Vec::new(),
    });
    for n in 1..=200 {
        round(&mut bench, n); // warm up
    }
    let (steps0, frames0) = (bench.steps, bench.frames);
    // `STEPS_ROUNDS=N` runs a fixed number of rounds (for instruction counts under callgrind).
    let fixed: Option<u64> = std::env::var("STEPS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let started = std::time::Instant::now();
    let mut n = 200;
    while fixed.map_or(started.elapsed() < Duration::from_secs(3), |rounds| {
        n < 200 + rounds
    }) {
        for _ in 0..100 {
            n += 1;
            round(&mut bench, n);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let steps = bench.steps - steps0;
    let frames = bench.frames - frames0;
    println!("{what}: {} rounds, {steps} steps in {secs:.2} s", n - 200);
    println!(
        "  {:.0} steps/s, {:.0} frames out/s, {:.1} µs/round",
        steps as f64 / secs,
        frames as f64 / secs,
        secs * 1e6 / (n - 200) as f64
    );
}
