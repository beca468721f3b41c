//! Unit tests of the server machine's internals: the targeted invariant
//! check of release builds.
//!
//! Scenarios across the whole server live in the simulator (`sim/`); these
//! drive a server step by step and look inside it.

use super::*;
use crate::faux;
use crate::protocol::{
    Command, CreateParams, DeltaKind, Request, SessionPhase, ThinkingLevel, TranscriptProgress,
    decode_server_message, encode_client_message,
};
use crate::wire::frame::DEFAULT_MAX_FRAME_LEN;
use crate::worker::FromWorker;
use std::time::Duration;

fn config() -> Config {
    Config {
        server_id: "00000000-0000-4000-8000-000000000001".into(),
        token: None,
        seed: 7,
        models: faux::models(),
        limits: Limits::default(),
        idle_exit: None,
        adoption_grace: Duration::from_secs(30),
    }
}

fn client_frame(message: &ClientMessage) -> Vec<u8> {
    encode_frame(
        &encode_client_message(message).expect("encodes"),
        DEFAULT_MAX_FRAME_LEN,
    )
    .expect("fits")
}

fn snapshot(id: &str, revision: u64, phase: SessionPhase) -> SessionSnapshot {
    SessionSnapshot {
        id: id.to_string(),
        name: None,
        cwd: "/work".into(),
        created_at: 10,
        updated_at: 10,
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

/// A server driven step by step; every frame sent is acknowledged at once.
struct Harness {
    server: Server,
    now: u64,
    /// Frames sent, in order, per connection.
    sent: BTreeMap<ConnId, Vec<Frame>>,
}

impl Harness {
    fn new() -> Self {
        Self {
            server: Server::new(config()),
            now: 0,
            sent: BTreeMap::new(),
        }
    }

    /// One step; afterwards also runs the release build's targeted check
    /// (debug builds sweep everything), which must hold whenever the full
    /// sweep does. Send outputs are acknowledged; the rest are returned.
    fn step(&mut self, input: Input) -> Vec<Output> {
        self.now += 1;
        let scope = self.server.scope_of(&input);
        let outputs = self.server.step(Instant(self.now), input);
        if let Scope::Touched { conn, session } = &scope {
            self.server.check_touched(*conn, session.as_deref());
        }
        let mut rest = Vec::new();
        for output in outputs {
            match output {
                Output::Send { conn, frame } => {
                    self.sent.entry(conn).or_default().push(frame.clone());
                    self.step(Input::Written {
                        conn,
                        bytes: frame.len(),
                    });
                }
                other => rest.push(other),
            }
        }
        rest
    }

    fn connect(&mut self, conn: ConnId) {
        self.step(Input::Accepted { conn });
        let hello = client_frame(&ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: None,
        }));
        self.step(Input::Received { conn, bytes: hello });
        assert_eq!(self.server.connection_stage(conn), Some(Stage::Ready));
    }

    fn request(&mut self, conn: ConnId, id: &str, command: Command) -> Vec<Output> {
        let bytes = client_frame(&ClientMessage::Request(Request {
            id: id.into(),
            command,
        }));
        self.step(Input::Received { conn, bytes })
    }

    fn worker(&mut self, worker: WorkerId, message: FromWorker) -> Vec<Output> {
        self.step(Input::FromWorker {
            worker,
            message: Box::new(message),
        })
    }

    /// Creates a session from `conn` and brings its worker up.
    fn create(&mut self, conn: ConnId) -> (WorkerId, String) {
        let outputs = self.request(conn, "create", Command::Create(CreateParams::default()));
        let (worker, session) = outputs
            .iter()
            .find_map(|o| match o {
                Output::SpawnWorker {
                    worker, session_id, ..
                } => Some((*worker, session_id.clone())),
                _ => None,
            })
            .expect("spawns a worker");
        self.step(Input::WorkerSpawned { worker });
        self.worker(
            worker,
            FromWorker::Ready {
                snapshot: snapshot(&session, 1, SessionPhase::Idle),
            },
        );
        (worker, session)
    }

    /// The last message sent to `conn`, decoded.
    fn last(&self, conn: ConnId) -> ServerMessage {
        let frame = self.sent[&conn].last().expect("a frame was sent");
        decode_server_message(&frame[4..], &Default::default()).expect("decodes")
    }
}

/// A scenario touching connections, sessions and workers: the targeted
/// check of every step holds (the harness runs it after each step).
#[test]
fn targeted_checks_hold_along_a_session_lifecycle() {
    let mut h = Harness::new();
    h.step(Input::CatalogLoaded {
        sessions: Vec::new(),
    });
    let (a, b) = (ConnId(1), ConnId(2));
    h.connect(a);
    h.connect(b);
    let (worker, session) = h.create(a);
    h.request(
        b,
        "attach",
        Command::Attach {
            session_id: session.clone(),
        },
    );
    let outputs = h.request(
        a,
        "prompt",
        Command::Prompt {
            session_id: session.clone(),
            text: "hi".into(),
        },
    );
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
    h.worker(
        worker,
        FromWorker::Snapshot {
            snapshot: snapshot(&session, 2, SessionPhase::Turn),
        },
    );
    h.worker(
        worker,
        FromWorker::Progress {
            progress: TranscriptProgress::AssistantDelta {
                message_id: "item-2".into(),
                content_index: 0,
                kind: DeltaKind::Text,
                delta: "hello".into(),
            },
        },
    );
    h.worker(
        worker,
        FromWorker::OpDone {
            op,
            outcome: Ok(snapshot(&session, 3, SessionPhase::Idle)),
        },
    );
    h.request(
        a,
        "detach",
        Command::Detach {
            session_id: session.clone(),
        },
    );
    h.step(Input::Disconnected { conn: b });
    h.step(Input::WorkerExited { worker });
    assert!(h.server.live_sessions().is_empty());
    let outputs = h.request(
        a,
        "remove",
        Command::Remove {
            session_id: session.clone(),
        },
    );
    assert!(outputs.contains(&Output::RemoveSession {
        session_id: session.clone()
    }));
    h.step(Input::SessionRemoved {
        session_id: session,
        result: Ok(()),
    });
    assert!(matches!(
        h.last(a),
        ServerMessage::Event(ServerEvent::ServerSnapshot { .. })
    ));
    h.step(Input::Shutdown);
    h.step(Input::Disconnected { conn: a });
}

/// The targeted check sees a broken attachment of the connection a step touched.
#[test]
#[should_panic(expected = "dangling")]
fn targeted_check_catches_a_dangling_attachment() {
    let mut h = Harness::new();
    h.step(Input::CatalogLoaded {
        sessions: Vec::new(),
    });
    h.connect(ConnId(1));
    h.create(ConnId(1));
    let conn = h.server.conns.get_mut(&ConnId(1)).expect("connected");
    conn.attached.insert("no-such-session".into());
    h.server.check_touched(Some(ConnId(1)), None);
}

/// The targeted check sees a broken worker index of the session a step touched.
#[test]
#[should_panic(expected = "worker index")]
fn targeted_check_catches_a_broken_worker_index() {
    let mut h = Harness::new();
    h.step(Input::CatalogLoaded {
        sessions: Vec::new(),
    });
    h.connect(ConnId(1));
    let (worker, session) = h.create(ConnId(1));
    h.server.workers.remove(&worker);
    h.server.workers.insert(WorkerId(999), session.clone());
    h.server.check_touched(None, Some(&session));
}
