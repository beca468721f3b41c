//! Kernel throughput: steps per second on one core for a mixed workload.
//!
//! `cargo bench -p kernel --bench steps` — per round: accept, hello, create
//! (the worker becomes ready), a prompt streaming 100 deltas, detach,
//! disconnect, worker exit; every frame sent is acknowledged as written.
//! Prints steps/s and frames/s. A benchmark, not a test: nothing is asserted
//! about time.

// A benchmark measures wall time; the kernel's no-clock rule is for the kernel itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use kernel::faux;
use kernel::ids::{ConnId, WorkerId};
use kernel::limits::Limits;
use kernel::protocol::{
    ClientHello, ClientMessage, Command, CreateParams, DeltaKind, Request, SessionPhase,
    SessionSnapshot, ThinkingLevel, TranscriptProgress, encode_client_message,
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
        let conn = ConnId(n);
        self.step(Input::Accepted { conn });
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
        let (worker, session) = outputs
            .iter()
            .find_map(|o| match o {
                Output::SpawnWorker {
                    worker, session_id, ..
                } => Some((*worker, session_id.clone())),
                _ => None,
            })
            .expect("spawn");
        self.step(Input::WorkerSpawned { worker });
        self.worker(
            worker,
            FromWorker::Ready {
                snapshot: snapshot(&session, 1, SessionPhase::Idle),
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
                snapshot: snapshot(&session, 2, SessionPhase::Turn),
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
                outcome: Ok(snapshot(&session, 3, SessionPhase::Idle)),
            },
        );
        let detach = frame(&ClientMessage::Request(Request {
            id: "d".into(),
            command: Command::Detach {
                session_id: session,
            },
        }));
        self.step(Input::Received {
            conn,
            bytes: detach,
        });
        self.step(Input::Disconnected { conn });
        self.step(Input::WorkerExited { worker });
    }

    fn worker(&mut self, worker: WorkerId, message: FromWorker) {
        self.step(Input::FromWorker {
            worker,
            message: Box::new(message),
        });
    }
}

fn main() {
    let config = Config {
        server_id: "00000000-0000-4000-8000-000000000001".into(),
        token: None,
        seed: 7,
        models: faux::models(),
        limits: Limits::default(),
        idle_exit: None,
        adoption_grace: Duration::from_secs(30),
    };
    let mut bench = Bench {
        server: Server::new(config),
        now: 0,
        steps: 0,
        frames: 0,
    };
    bench.step(Input::CatalogLoaded {
        sessions: Vec::new(),
    });
    for n in 1..=200 {
        bench.round(n); // warm up
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
            bench.round(n);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let steps = bench.steps - steps0;
    let frames = bench.frames - frames0;
    println!(
        "kernel mixed workload: {} rounds, {steps} steps in {secs:.2} s",
        n - 200
    );
    println!(
        "  {:.0} steps/s, {:.0} frames out/s, {:.1} µs/round",
        steps as f64 / secs,
        frames as f64 / secs,
        secs * 1e6 / (n - 200) as f64
    );
}
