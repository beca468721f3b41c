//! Unit tests of the server machine's internals: the targeted invariant
//! check of release builds, the cached session list, and the cached
//! encodings of session snapshots.
//!
//! Scenarios across the whole server live in the simulator (`sim/`); these
//! drive a server step by step and look inside it.

use super::*;
use crate::faux;
use crate::protocol::{
    AssistantItem, AssistantStatus, Command, CreateParams, DeltaKind, LiveState, Request,
    SessionPhase, ThinkingLevel, TranscriptItem, TranscriptProgress, decode_server_message,
    encode_client_message,
};
use crate::wire::frame::DEFAULT_MAX_FRAME_LEN;
use crate::worker::{FromWorker, TailSnapshot};
use std::sync::Arc;

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
        Self::with(config())
    }

    fn with(config: Config) -> Self {
        Self {
            server: Server::new(config),
            now: 0,
            sent: BTreeMap::new(),
        }
    }

    /// A server with an empty catalog that keeps transcripts of at most
    /// `kept` bytes, with these ready connections.
    fn keeping(kept: usize, conns: &[ConnId]) -> Self {
        let mut config = config();
        config.limits.kept_transcript_bytes = kept;
        let mut h = Self::with(config);
        h.step(Input::CatalogLoaded {
            sessions: Vec::new(),
            models: Vec::new(),
        });
        for &conn in conns {
            h.connect(conn);
        }
        h
    }

    /// Whether the server holds a live session's transcript.
    fn keeps_transcript(&self, session: &str) -> bool {
        let live = &self.server.sessions[session];
        live.snapshot.as_ref().expect("ready").has_transcript()
    }

    /// A server whose catalog holds `sessions`, with one ready connection.
    fn serving(sessions: Vec<SessionMetadata>, conn: ConnId) -> Self {
        let mut h = Self::new();
        h.step(Input::CatalogLoaded {
            sessions,
            models: Vec::new(),
        });
        h.connect(conn);
        h
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
        self.step(Input::Accepted { conn, peer: None });
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

    /// The worker sends `message`, its snapshot packed as a worker does.
    fn worker(
        &mut self,
        worker: WorkerId,
        message: FromWorker<impl Into<TailSnapshot>>,
    ) -> Vec<Output> {
        self.step(Input::FromWorker {
            worker,
            message: Box::new(message.pack().expect("packs")),
        })
    }

    /// Creates a session from `conn` and brings its worker up.
    fn create(&mut self, conn: ConnId) -> (WorkerId, String) {
        self.create_with(conn, |session| snapshot(session, 1, SessionPhase::Idle))
    }

    /// Creates a session from `conn` and brings its worker up with the
    /// snapshot `first` makes for the session's id.
    fn create_with(
        &mut self,
        conn: ConnId,
        first: impl FnOnce(&str) -> SessionSnapshot,
    ) -> (WorkerId, String) {
        let outputs = self.request(conn, "create", Command::Create(CreateParams::default()));
        let (worker, session) = spawned(&outputs);
        self.step(Input::WorkerSpawned {
            worker,
            token: String::new(),
        });
        let snapshot = first(&session);
        self.worker(worker, FromWorker::Ready { snapshot });
        (worker, session)
    }

    /// Asks for the list and checks the response against the normal
    /// encoding of the list built from scratch; returns the sessions.
    fn list(&mut self, conn: ConnId) -> Vec<SessionMetadata> {
        self.request(conn, "list", Command::List);
        let frame = self.sent[&conn].last().expect("a response").clone();
        let expected = self
            .server
            .encode(&ServerMessage::Response(Response {
                id: "list".into(),
                outcome: Ok(CommandResult::List {
                    sessions: self.server.server_snapshot().sessions,
                }),
            }))
            .expect("encodes");
        assert_eq!(
            frame, expected,
            "list response differs from a fresh encoding"
        );
        match self.last(conn) {
            ServerMessage::Response(Response {
                outcome: Ok(CommandResult::List { sessions }),
                ..
            }) => sessions,
            other => panic!("not a list response: {other:?}"),
        }
    }

    /// The session list's cached pieces.
    fn cached_list(&self) -> Vec<Arc<[u8]>> {
        let cache = self.server.list_cache.as_ref().expect("built");
        cache.encoded().expect("encodes").pieces().to_vec()
    }

    /// The last message sent to `conn`, decoded.
    fn last(&self, conn: ConnId) -> ServerMessage {
        let frame = self.sent[&conn].last().expect("a frame was sent");
        decode_server_message(&frame.bytes()[4..], &Default::default()).expect("decodes")
    }
}

/// A scenario touching connections, sessions and workers: the targeted
/// check of every step holds (the harness runs it after each step).
#[test]
fn targeted_checks_hold_along_a_session_lifecycle() {
    let mut h = Harness::new();
    h.step(Input::CatalogLoaded {
        sessions: Vec::new(),
        models: Vec::new(),
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
    let op = op_of(&outputs);
    h.runtime_snapshot(worker, &snapshot(&session, 2, SessionPhase::Turn));
    h.worker(
        worker,
        FromWorker::<SessionSnapshot>::Progress {
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
fn targeted_check_catches_a_dangling_attachment() {
    let mut h = Harness::new();
    h.step(Input::CatalogLoaded {
        sessions: Vec::new(),
        models: Vec::new(),
    });
    h.connect(ConnId(1));
    h.create(ConnId(1));
    assert_eq!(h.server.touched_invariants(Some(ConnId(1)), None), Ok(()));
    let conn = h.server.conns.get_mut(&ConnId(1)).expect("connected");
    conn.attached.insert("no-such-session".into());
    let broken = h.server.touched_invariants(Some(ConnId(1)), None);
    assert_eq!(broken, Err("c1: dangling no-such-session".to_string()));
    assert_eq!(h.server.invariants(), broken, "the full sweep sees it too");
}

/// The targeted check sees a broken worker index of the session a step touched.
#[test]
fn targeted_check_catches_a_broken_worker_index() {
    let mut h = Harness::new();
    h.step(Input::CatalogLoaded {
        sessions: Vec::new(),
        models: Vec::new(),
    });
    h.connect(ConnId(1));
    let (worker, session) = h.create(ConnId(1));
    h.server.workers.remove(&worker);
    h.server.workers.insert(WorkerId(999), session.clone());
    let broken = h
        .server
        .touched_invariants(None, Some(&session))
        .unwrap_err();
    assert!(
        broken.starts_with(&format!("{session}: worker index")),
        "{broken}"
    );
}

fn stored(i: u64) -> SessionMetadata {
    SessionMetadata {
        id: format!("stored-{i:05}"),
        created_at: i,
        updated_at: Some(1000 + i),
        parent_session_id: i.is_multiple_of(3).then(|| "parent".to_string()),
        session_name: i.is_multiple_of(2).then(|| format!("name {i}")),
        cwd: Some(format!("/work/{i}")),
    }
}

/// With a catalog of many pieces, a change re-encodes only the piece that
/// holds it, and through additions and removals that split, join and empty
/// pieces (and live sessions among them) every list equals its fresh
/// encoding (the server's debug check) and the catalog.
#[test]
fn a_large_list_is_re_encoded_piece_by_piece() {
    let a = ConnId(1);
    let mut h = Harness::serving((0..1_000).map(stored).collect(), a);
    let mut expected: BTreeMap<String, SessionMetadata> =
        (0..1_000).map(stored).map(|m| (m.id.clone(), m)).collect();
    let stored_only = |list: Vec<SessionMetadata>| -> Vec<SessionMetadata> {
        list.into_iter()
            .filter(|m| m.id.starts_with("stored-"))
            .collect()
    };
    assert_eq!(h.list(a), expected.values().cloned().collect::<Vec<_>>());
    let before = h.cached_list();
    assert!(before.len() >= 8, "cut into pieces: {}", before.len());

    let mut renamed = stored(500);
    renamed.session_name = Some("renamed".into());
    h.server.catalog.insert(renamed.clone());
    expected.insert(renamed.id.clone(), renamed);
    assert_eq!(h.list(a), expected.values().cloned().collect::<Vec<_>>());
    let after = h.cached_list();
    assert_eq!(before.len(), after.len());
    let renewed = before
        .iter()
        .zip(&after)
        .filter(|(x, y)| !Arc::ptr_eq(x, y))
        .count();
    assert_eq!(renewed, 1, "one piece re-encoded");

    let mut live = Vec::new();
    let mut x: u64 = 7;
    for round in 0..60u64 {
        for _ in 0..(round % 7) * 20 + 1 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let meta = stored((x >> 33) % 3_000);
            if (x >> 20).is_multiple_of(3) {
                h.server.catalog.remove(&meta.id);
                expected.remove(&meta.id);
            } else {
                h.server.catalog.insert(meta.clone());
                expected.insert(meta.id.clone(), meta);
            }
        }
        if round % 20 == 5 {
            live.push(h.create(a).1);
        }
        let list = h.list(a);
        for id in &live {
            assert!(entry(&list, id).is_some(), "{id} is listed");
        }
        assert_eq!(
            stored_only(list),
            expected.values().cloned().collect::<Vec<_>>()
        );
    }

    // Nearly everything goes: pieces empty and join.
    let ids: Vec<String> = expected.keys().cloned().collect();
    for id in ids.iter().skip(3) {
        h.server.catalog.remove(id);
        expected.remove(id);
    }
    assert_eq!(
        stored_only(h.list(a)),
        expected.values().cloned().collect::<Vec<_>>()
    );
    assert!(
        h.cached_list().len() <= 2,
        "joined: {}",
        h.cached_list().len()
    );
}

/// True when `a` and `b` are the same pieces (not only equal bytes).
fn same_pieces(a: &[Arc<[u8]>], b: &[Arc<[u8]>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| Arc::ptr_eq(a, b))
}

fn entry<'a>(list: &'a [SessionMetadata], id: &str) -> Option<&'a SessionMetadata> {
    list.iter().find(|m| m.id == id)
}

/// `list` after each kind of change equals the fresh encoding (the harness
/// compares bytes), shows the change, and reuses the cached bytes only while
/// nothing changed.
#[test]
fn list_follows_every_change_to_its_inputs() {
    let a = ConnId(1);
    let mut h = Harness::serving((0..5).map(stored).collect(), a);
    let first = h.list(a);
    assert_eq!(first.len(), 5);
    let cached = h.cached_list();
    assert_eq!(h.list(a), first);
    assert!(same_pieces(&cached, &h.cached_list()), "unchanged: reused");

    // create: a new live session, then in the catalog.
    let (worker, created) = h.create(a);
    let list = h.list(a);
    assert_eq!(list.len(), 6);
    assert!(entry(&list, &created).is_some());
    assert!(!same_pieces(&cached, &h.cached_list()), "changed: rebuilt");

    // rename: a snapshot with a new name.
    let mut renamed = snapshot(&created, 2, SessionPhase::Idle);
    renamed.name = Some("renamed".into());
    h.runtime_snapshot(worker, &renamed);
    let list = h.list(a);
    assert_eq!(
        entry(&list, &created).and_then(|m| m.session_name.as_deref()),
        Some("renamed")
    );

    // a snapshot that changes nothing listed keeps the cache.
    let cached = h.cached_list();
    let mut busy = renamed.clone();
    busy.revision = 3;
    busy.phase = SessionPhase::Idle;
    busy.queued_steer_count = 0;
    h.runtime_snapshot(worker, &busy);
    h.list(a);
    assert!(
        same_pieces(&cached, &h.cached_list()),
        "unlisted change: reused"
    );

    // turn commit: the operation's final snapshot moves updatedAt.
    let outputs = h.request(
        a,
        "prompt",
        Command::Prompt {
            session_id: created.clone(),
            text: "hi".into(),
        },
    );
    let op = op_of(&outputs);
    let mut committed = renamed.clone();
    committed.revision = 4;
    committed.updated_at = 99;
    h.worker(
        worker,
        FromWorker::OpDone {
            op,
            outcome: Ok(committed),
        },
    );
    let list = h.list(a);
    assert_eq!(entry(&list, &created).and_then(|m| m.updated_at), Some(99));

    // attach of a stored session: its live snapshot overrides the stored
    // metadata (the parent stays).
    let b = ConnId(2);
    h.connect(b);
    let outputs = h.request(
        b,
        "attach",
        Command::Attach {
            session_id: "stored-00003".into(),
        },
    );
    let opened = spawned(&outputs).0;
    h.step(Input::WorkerSpawned {
        worker: opened,
        token: String::new(),
    });
    let mut live = snapshot("stored-00003", 7, SessionPhase::Idle);
    live.name = Some("live name".into());
    live.updated_at = 5000;
    h.worker(opened, FromWorker::Ready { snapshot: live });
    let list = h.list(a);
    let listed = entry(&list, "stored-00003").expect("listed").clone();
    assert_eq!(listed.session_name.as_deref(), Some("live name"));
    assert_eq!(listed.updated_at, Some(5000));
    assert_eq!(listed.parent_session_id.as_deref(), Some("parent"));

    // detach: the session is disposed; once its worker exited the list
    // keeps what it last reported (not the metadata loaded at start).
    h.request(
        b,
        "detach",
        Command::Detach {
            session_id: "stored-00003".into(),
        },
    );
    h.step(Input::WorkerExited { worker: opened });
    let list = h.list(a);
    assert_eq!(entry(&list, "stored-00003"), Some(&listed));
    assert_ne!(entry(&list, "stored-00003"), Some(&stored(3)));

    // remove of a stored session.
    h.request(
        a,
        "remove",
        Command::Remove {
            session_id: "stored-00002".into(),
        },
    );
    h.step(Input::SessionRemoved {
        session_id: "stored-00002".into(),
        result: Ok(()),
    });
    let list = h.list(a);
    assert_eq!(list.len(), 5);
    assert!(entry(&list, "stored-00002").is_none());
    let ids: Vec<&str> = list.iter().map(|m| m.id.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "listed in id order");
}

/// The server snapshots broadcast after changes (checked against fresh
/// encodings in debug builds by the server itself) carry the current list.
#[test]
fn server_snapshots_carry_the_current_list() {
    let (a, b) = (ConnId(1), ConnId(2));
    let mut h = Harness::serving((0..3).map(stored).collect(), a);
    h.connect(b);
    let (_, created) = h.create(a);
    let ServerMessage::Event(ServerEvent::ServerSnapshot { snapshot }) = h.last(b) else {
        panic!("a server snapshot after create: {:?}", h.last(b));
    };
    assert_eq!(snapshot.sessions.len(), 4);
    assert!(entry(&snapshot.sessions, &created).is_some());
    assert_eq!(snapshot, h.server.server_snapshot());
}

/// Thousands of stored sessions (two-byte array header) and live ones among
/// them: the hello and `list` equal their fresh encodings.
#[test]
fn many_stored_sessions_list_as_freshly_encoded() {
    let a = ConnId(1);
    let mut h = Harness::serving((0..3000).map(stored).collect(), a);
    let ServerMessage::Hello(hello) =
        decode_server_message(&h.sent[&a][0].bytes()[4..], &Default::default()).expect("decodes")
    else {
        panic!("hello first");
    };
    assert_eq!(hello.snapshot.sessions.len(), 3000);
    assert_eq!(hello.snapshot.sessions[1234], stored(1234));
    let (_, created) = h.create(a);
    let list = h.list(a);
    assert_eq!(list.len(), 3001);
    assert!(entry(&list, &created).is_some());
    h.connect(ConnId(2));
}

/// A list too large for a frame cannot be sent: the connection is closed,
/// with the error the normal encoding reports.
#[test]
fn a_list_larger_than_a_frame_closes_the_connection() {
    let mut config = config();
    config.limits.max_frame_len = 16 * 1024;
    config.limits.max_output_bytes_per_connection = 64 * 1024;
    let mut h = Harness::with(config);
    h.step(Input::CatalogLoaded {
        sessions: (0..1000).map(stored).collect(),
        models: Vec::new(),
    });
    let conn = ConnId(1);
    h.step(Input::Accepted { conn, peer: None });
    let hello = client_frame(&ClientMessage::Hello(ClientHello {
        version: PROTOCOL_VERSION,
        token: None,
    }));
    let outputs = h.step(Input::Received { conn, bytes: hello });
    let reason = outputs
        .iter()
        .find_map(|o| match o {
            Output::Close { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .expect("closed");
    let CloseReason::Protocol(message) = reason else {
        panic!("{reason:?}");
    };
    assert!(
        message.starts_with("cannot send: Frame payload length") && message.ends_with("16384"),
        "{message}"
    );
}

/// The operation forwarded to the worker by a step.
fn op_of(outputs: &[Output]) -> OpId {
    outputs
        .iter()
        .find_map(|o| match o {
            Output::ToWorker {
                message: ToWorker::Operation { op, .. },
                ..
            } => Some(*op),
            _ => None,
        })
        .expect("an operation")
}

/// A snapshot with a transcript of `items` user items, not normalised (as a
/// runtime may report it).
fn with_transcript(id: &str, revision: u64, phase: SessionPhase, items: u64) -> SessionSnapshot {
    use crate::protocol::{Content, TranscriptItem, UserItem};
    let mut snap = snapshot(id, revision, phase);
    snap.locked = false;
    snap.transcript = (0..items)
        .map(|i| {
            TranscriptItem::User(UserItem {
                id: format!("u{i}"),
                content: vec![Content::Text {
                    text: format!("message {i}"),
                }],
                timestamp: 100 + i,
            })
        })
        .collect();
    snap
}

/// `snap` as sent to an audience that is (or is not) attached.
fn sent_as(snap: &SessionSnapshot, attached: bool) -> SessionSnapshot {
    let mut snap = snap.clone();
    snap.locked = true;
    snap.attached = attached;
    snap
}

/// The response to the request `command` (sent with that id) carrying
/// `snap` as sent to a requester that is (or is not) attached.
fn session_response(command: &str, snap: &SessionSnapshot, attached: bool) -> ServerMessage {
    let result = CommandResult::with_session(command, sent_as(snap, attached));
    ServerMessage::Response(Response {
        id: command.into(),
        outcome: Ok(result.expect("carries a session")),
    })
}

/// The session snapshot event carrying `snap`.
fn session_event(snap: &SessionSnapshot) -> ServerMessage {
    let snapshot = sent_as(snap, true);
    ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot })
}

impl Harness {
    /// The last frame sent to `conn` of the kind of `expected` (response or
    /// event of that type) is exactly the normal encoding of `expected`, which the test
    /// built from what it sent, not from the server's state.
    fn assert_sent(&self, conn: ConnId, expected: &ServerMessage) {
        let kind = |m: &ServerMessage| match m {
            ServerMessage::Event(e) => (std::mem::discriminant(m), Some(std::mem::discriminant(e))),
            _ => (std::mem::discriminant(m), None),
        };
        let frame = self.sent[&conn]
            .iter()
            .rev()
            .find(|f| {
                decode_server_message(&f.bytes()[4..], &Default::default())
                    .is_ok_and(|m| kind(&m) == kind(expected))
            })
            .expect("a frame of that kind was sent");
        let normal = self.server.encode(expected).expect("encodes");
        assert_eq!(*frame, normal, "{conn}: {expected:?}");
    }

    /// The runtime sends `snap` as its new snapshot.
    fn runtime_snapshot(&mut self, worker: WorkerId, snap: &SessionSnapshot) -> Vec<Output> {
        self.worker(
            worker,
            FromWorker::Snapshot {
                snapshot: snap.clone(),
            },
        )
    }

    /// The runtime finishes `op` with `snap`.
    fn op_done(&mut self, worker: WorkerId, op: OpId, snap: &SessionSnapshot) {
        let outcome = Ok(snap.clone());
        self.worker(worker, FromWorker::OpDone { op, outcome });
    }

    /// The cached encoding of a live session's snapshot.
    /// (The piece before the transcript, which is made with the rest.)
    fn cached_snapshot(&self, session: &str, attached: bool) -> Option<Arc<[u8]>> {
        let live = &self.server.sessions[session];
        let cached = live.snapshot.as_ref().expect("ready").cached(attached);
        cached.map(|[head, ..]| head)
    }

    fn frames(&self, conn: ConnId) -> usize {
        self.sent.get(&conn).map_or(0, Vec::len)
    }

    /// What `conn` was sent after its first `from` frames, by type,
    /// leaving out the server snapshots every ready connection gets.
    fn told(&self, conn: ConnId, from: usize) -> Vec<String> {
        let sent = self.sent.get(&conn).map_or(&[][..], Vec::as_slice);
        sent[from..]
            .iter()
            .filter_map(
                |f| match decode_server_message(&f.bytes()[4..], &Default::default()) {
                    Ok(ServerMessage::Event(ServerEvent::ServerSnapshot { .. })) => None,
                    Ok(ServerMessage::Event(ServerEvent::SessionSnapshot { .. })) => {
                        Some("session_snapshot".to_string())
                    }
                    Ok(ServerMessage::Response(_)) => Some("response".to_string()),
                    other => Some(format!("{other:?}")),
                },
            )
            .collect()
    }
}

/// Responses carrying a session (create, attach, prompt, steer, set_model)
/// and session snapshot events are written around the snapshot's CBOR,
/// encoded once per snapshot: reused while the snapshot stays, made anew
/// for a new one — also one with the same revision — and per audience
/// (`attached`). Every frame equals the normal encoding of what the test
/// sent (and, in debug builds, the server checks each against its own).
#[test]
fn session_frames_follow_every_snapshot() {
    let (a, b, c) = (ConnId(1), ConnId(2), ConnId(3));
    let mut h = Harness::serving(Vec::new(), a);
    h.connect(b);
    h.connect(c);

    // create: the response carries the first snapshot.
    let (worker, session) = h.create_with(a, |id| with_transcript(id, 1, SessionPhase::Idle, 3));
    let first = with_transcript(&session, 1, SessionPhase::Idle, 3);
    h.assert_sent(a, &session_response("create", &first, true));
    let cached = h.cached_snapshot(&session, true).expect("encoded");
    assert!(h.cached_snapshot(&session, false).is_none(), "made on use");

    // attach (twice: the second finds it attached): the same bytes.
    let attach = Command::Attach {
        session_id: session.clone(),
    };
    for _ in 0..2 {
        h.request(b, "attach", attach.clone());
        h.assert_sent(b, &session_response("attach", &first, true));
    }
    let reused = h.cached_snapshot(&session, true).expect("encoded");
    assert!(Arc::ptr_eq(&cached, &reused), "unchanged: reused");

    // a prompt; the runtime reports a new revision: an event to both.
    let prompt = Command::Prompt {
        session_id: session.clone(),
        text: "hi".into(),
    };
    let prompt = op_of(&h.request(a, "prompt", prompt));
    let turn = with_transcript(&session, 2, SessionPhase::Turn, 4);
    h.runtime_snapshot(worker, &turn);
    for conn in [a, b] {
        h.assert_sent(conn, &session_event(&turn));
    }
    let renewed = h.cached_snapshot(&session, true).expect("encoded");
    assert!(
        !Arc::ptr_eq(&cached, &renewed),
        "new snapshot: encoded anew"
    );

    // The same revision re-sent with other content: no event (deduplicated
    // by revision), but what is sent next carries the new content.
    let (before_a, before_b) = (h.frames(a), h.frames(b));
    let mut resent = turn.clone();
    resent.name = Some("renamed".into());
    resent.transcript.pop();
    h.runtime_snapshot(worker, &resent);
    assert_eq!((h.frames(a), h.frames(b)), (before_a, before_b));
    h.request(c, "attach", attach.clone());
    h.assert_sent(c, &session_response("attach", &resent, true));

    // steer: the response to b and the event to the others.
    let steer = Command::Steer {
        session_id: session.clone(),
        text: "also".into(),
    };
    let steer = op_of(&h.request(b, "steer", steer));
    let mut steered = with_transcript(&session, 3, SessionPhase::Turn, 4);
    steered.queued_steer_count = 1;
    h.op_done(worker, steer, &steered);
    h.assert_sent(b, &session_response("steer", &steered, true));
    for conn in [a, c] {
        h.assert_sent(conn, &session_event(&steered));
    }

    // b detaches; a and c stay attached and keep getting the snapshots.
    let detach = Command::Detach {
        session_id: session.clone(),
    };
    h.request(b, "detach", detach.clone());
    assert_eq!(h.server.attachments(a), vec![session.clone()]);
    assert_eq!(h.server.attachments(c), vec![session.clone()]);
    let before_b = h.frames(b);

    // set_model from a, which detaches before it is done: its response
    // carries the snapshot as seen from outside (attached false).
    let set_model = Command::SetModel {
        session_id: session.clone(),
        model: faux::default_model(),
    };
    let set_model = op_of(&h.request(a, "set_model", set_model));
    h.request(a, "detach", detach);
    let modelled = with_transcript(&session, 4, SessionPhase::Turn, 5);
    h.op_done(worker, set_model, &modelled);
    h.assert_sent(a, &session_response("set_model", &modelled, false));
    h.assert_sent(c, &session_event(&modelled));
    assert_ne!(
        h.cached_snapshot(&session, false),
        h.cached_snapshot(&session, true),
        "one encoding per audience"
    );

    // The prompt ends: its response to a (detached), the event to c.
    let done = with_transcript(&session, 5, SessionPhase::Idle, 6);
    h.op_done(worker, prompt, &done);
    h.assert_sent(a, &session_response("prompt", &done, false));
    h.assert_sent(c, &session_event(&done));
    for frame in &h.sent[&b][before_b..] {
        let message =
            decode_server_message(&frame.bytes()[4..], &Default::default()).expect("decodes");
        assert!(
            matches!(
                message,
                ServerMessage::Event(ServerEvent::ServerSnapshot { .. })
            ),
            "b, detached, gets only server snapshots: {message:?}"
        );
    }
}

/// A worker's hello is checked in the kernel: only the token its spawn was
/// given starts it, once; anything else is refused.
#[test]
fn a_worker_starts_only_with_its_own_token_and_only_once() {
    let a = ConnId(1);
    let mut h = Harness::serving(Vec::new(), a);
    let outputs = h.request(a, "create", Command::Create(CreateParams::default()));
    let (worker, session) = spawned(&outputs);
    let hello = |channel: u64, token: &str| Input::WorkerHello {
        channel: ChannelId(channel),
        session_id: session.clone(),
        token: token.into(),
        pid: 7,
    };
    // Before the driver reported the spawn (and its token), nothing matches.
    let out = h.step(hello(1, "secret"));
    assert!(
        matches!(
            out.as_slice(),
            [Output::RejectWorker {
                channel: ChannelId(1),
                ..
            }]
        ),
        "{out:?}"
    );
    h.step(Input::WorkerSpawned {
        worker,
        token: "secret".into(),
    });
    for wrong in ["secreT", "secret2", ""] {
        let out = h.step(hello(2, wrong));
        assert!(
            matches!(
                out.as_slice(),
                [Output::RejectWorker {
                    channel: ChannelId(2),
                    ..
                }]
            ),
            "{wrong:?}: {out:?}"
        );
    }
    let out = h.step(hello(3, "secret"));
    let [
        Output::StartWorker {
            channel: ChannelId(3),
            worker: started,
            create: Some(_),
            revision_floor: 0,
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}");
    };
    assert_eq!(*started, worker);
    let out = h.step(hello(4, "secret"));
    assert!(
        matches!(
            out.as_slice(),
            [Output::RejectWorker {
                channel: ChannelId(4),
                ..
            }]
        ),
        "a token starts one worker once: {out:?}"
    );
}

/// `status` (our extension): what each live session does and how many
/// clients it has; a session without a worker is absent.
#[test]
fn status_reports_every_session_its_clients_and_model() {
    let (a, b) = (ConnId(1), ConnId(2));
    let mut h = Harness::serving(Vec::new(), a);
    h.connect(b);
    let status = |h: &mut Harness, conn| {
        h.request(conn, "status", Command::Status);
        match h.last(conn) {
            ServerMessage::Response(Response {
                outcome: Ok(CommandResult::Status { sessions }),
                ..
            }) => sessions
                .into_iter()
                .map(|s| (s.session_id, s.state, s.clients))
                .collect::<Vec<_>>(),
            other => panic!("not a status response: {other:?}"),
        }
    };
    assert!(status(&mut h, a).is_empty(), "nothing live yet");

    let (worker, session) = h.create(a);
    h.request(
        b,
        "attach",
        Command::Attach {
            session_id: session.clone(),
        },
    );
    let idle = LiveState::Phase(SessionPhase::Idle);
    assert_eq!(status(&mut h, a), vec![(session.clone(), idle, 2)]);

    let outputs = h.request(
        a,
        "prompt",
        Command::Prompt {
            session_id: session.clone(),
            text: "hi".into(),
        },
    );
    let op = op_of(&outputs);
    h.runtime_snapshot(worker, &snapshot(&session, 2, SessionPhase::Turn));
    let turn = LiveState::Phase(SessionPhase::Turn);
    assert_eq!(status(&mut h, b), vec![(session.clone(), turn, 2)]);

    // The turn fails: idle again, but its last reply is an error.
    let mut failed = snapshot(&session, 3, SessionPhase::Idle);
    failed
        .transcript
        .push(TranscriptItem::Assistant(AssistantItem {
            id: "item-2".into(),
            content: Vec::new(),
            model: faux::default_model(),
            response_model: None,
            usage: None,
            timestamp: 10,
            status: AssistantStatus::Error,
            error_message: Some("rate limited".into()),
        }));
    h.worker(
        worker,
        FromWorker::OpDone {
            op,
            outcome: Ok(failed),
        },
    );
    h.step(Input::Disconnected { conn: b });
    assert_eq!(
        status(&mut h, a),
        vec![(session.clone(), LiveState::Error, 1)]
    );

    h.request(
        a,
        "detach",
        Command::Detach {
            session_id: session.clone(),
        },
    );
    assert_eq!(
        status(&mut h, a),
        vec![(session.clone(), LiveState::Closing, 0)],
        "disposed on its last detach, its worker still exiting"
    );
    h.step(Input::WorkerExited { worker });
    assert_eq!(
        status(&mut h, a),
        vec![(session.clone(), LiveState::Stored, 0)],
        "no worker: stored"
    );
    h.request(a, "status", Command::Status);
    let ServerMessage::Response(Response {
        outcome: Ok(CommandResult::Status { sessions }),
        ..
    }) = h.last(a)
    else {
        panic!("a status response");
    };
    assert_eq!(
        (sessions[0].model.clone(), sessions[0].thinking_level),
        (Some(faux::default_model()), Some(ThinkingLevel::Off)),
        "the model its worker last reported"
    );
}

/// A stored session's model is the one its `meta.json` records, from the
/// catalog's load and scans.
#[test]
fn status_reports_a_stored_sessions_model_from_the_catalog() {
    let a = ConnId(1);
    let mut h = Harness::new();
    let model = ModelRef {
        provider: "faux".into(),
        id: "faux-reasoner".into(),
    };
    h.step(Input::CatalogLoaded {
        sessions: vec![stored(7)],
        models: vec![crate::server::StoredDetails {
            session_id: stored(7).id,
            model: model.clone(),
            thinking_level: ThinkingLevel::High,
            preview: Some(crate::server::preview("fix the\n  failing   test")),
        }],
    });
    h.connect(a);
    h.request(a, "status", Command::Status);
    let ServerMessage::Response(Response {
        outcome: Ok(CommandResult::Status { sessions }),
        ..
    }) = h.last(a)
    else {
        panic!("a status response");
    };
    assert_eq!(
        sessions,
        vec![crate::protocol::LiveStatus {
            session_id: stored(7).id,
            state: LiveState::Stored,
            clients: 0,
            model: Some(model),
            thinking_level: Some(ThinkingLevel::High),
            preview: Some("fix the failing test".into()),
        }]
    );
    let long = crate::server::preview(&"word ".repeat(40));
    assert!(
        long.chars().count() <= crate::server::PREVIEW_CHARS + 1,
        "{long}"
    );
    assert!(long.ends_with("word…"), "{long}");
}

/// Wrong tokens from one address lock it out, doubling; the lock holds even
/// for the right token; other addresses and local clients are not affected;
/// after the lock, the right token is accepted and the failures forgotten.
/// The error a request got, as `(code, message)`.
fn refusal(h: &Harness, conn: ConnId) -> (ErrorCode, String) {
    match h.last(conn) {
        ServerMessage::Response(Response {
            outcome: Err(e), ..
        }) => (e.code, e.message),
        other => panic!("not a refusal: {other:?}"),
    }
}

/// A name belongs to one session: create and rename refuse a name a stored
/// session, a live one, a session being created or a rename on its way
/// holds, naming the holder; blank names and control characters are
/// refused; a session may keep its own name; the list shows a new name.
#[test]
fn names_are_unique_among_the_servers_sessions() {
    let a = ConnId(1);
    let mut h = Harness::serving(vec![stored(2)], a);
    let named = |name: &str| {
        Command::Create(CreateParams {
            name: Some(name.into()),
            ..CreateParams::default()
        })
    };
    h.request(a, "create", named("name 2"));
    assert_eq!(
        refusal(&h, a),
        (
            ErrorCode::InvalidRequest,
            "Name \"name 2\" is taken by session stored-00002".into()
        )
    );

    // A session being created holds its name before its worker is up.
    let outputs = h.request(a, "create", named("first"));
    let (worker, first) = spawned(&outputs);
    h.request(a, "again", named("first"));
    assert!(refusal(&h, a).1.contains(&first), "{:?}", refusal(&h, a));
    h.step(Input::WorkerSpawned {
        worker,
        token: String::new(),
    });
    let mut snap = snapshot(&first, 1, SessionPhase::Idle);
    snap.name = Some("first".into());
    h.worker(
        worker,
        FromWorker::Ready {
            snapshot: snap.clone(),
        },
    );

    let (second_worker, second) = h.create(a);
    let rename = |session: &str, name: &str| Command::Rename {
        session_id: session.into(),
        name: name.into(),
    };
    for (name, why) in [
        (
            "first",
            format!("Name \"first\" is taken by session {first}"),
        ),
        ("  ", "A session name must not be blank".into()),
        (
            "a\nb",
            "A session name must not hold control characters".into(),
        ),
    ] {
        h.request(a, "rename", rename(&second, name));
        assert_eq!(refusal(&h, a), (ErrorCode::InvalidRequest, why));
    }
    // Its own name again is no conflict.
    let outputs = h.request(a, "rename", rename(&first, "first"));
    let op = op_of(&outputs);
    h.op_done(worker, op, &snap);

    // A rename on its way claims the name.
    let outputs = h.request(a, "rename", rename(&second, "second"));
    let op = op_of(&outputs);
    h.request(a, "rename", rename(&first, "second"));
    assert!(refusal(&h, a).1.contains(&second), "{:?}", refusal(&h, a));
    let mut renamed = snapshot(&second, 2, SessionPhase::Idle);
    renamed.name = Some("second".into());
    h.op_done(second_worker, op, &renamed);
    let listed = h.list(a);
    let name_of = |id: &str| entry(&listed, id).and_then(|m| m.session_name.clone());
    assert_eq!(name_of(&second).as_deref(), Some("second"));
    assert_eq!(name_of(&first).as_deref(), Some("first"));
    h.request(a, "rename", rename(&first, "second"));
    assert!(refusal(&h, a).1.contains(&second));
}

/// A token that guards network listeners leaves local clients alone (their
/// socket's permissions guard them) unless asked to guard them too.
#[test]
fn a_token_guards_local_clients_only_when_asked() {
    for local_token in [false, true] {
        let mut config = config();
        config.token = Some("secret".into());
        config.local_token = local_token;
        let mut h = Harness::with(config);
        h.step(Input::CatalogLoaded {
            sessions: vec![],
            models: Vec::new(),
        });
        let hello = |h: &mut Harness, conn, peer: Option<crate::ids::PeerAddr>| {
            h.step(Input::Accepted { conn, peer });
            let frame = client_frame(&ClientMessage::Hello(ClientHello {
                version: PROTOCOL_VERSION,
                token: None,
            }));
            h.step(Input::Received { conn, bytes: frame });
            matches!(h.last(conn), ServerMessage::Hello(_))
        };
        assert_eq!(hello(&mut h, ConnId(1), None), !local_token, "local");
        let remote = Some(crate::ids::PeerAddr("192.0.2.7".into()));
        assert!(!hello(&mut h, ConnId(2), remote), "remote");
    }
}

#[test]
fn failed_tokens_back_off_per_address() {
    let mut config = config();
    config.token = Some("secret".into());
    let mut h = Harness::with(config);
    h.step(Input::CatalogLoaded {
        sessions: vec![],
        models: Vec::new(),
    });
    let guesser = Some(crate::ids::PeerAddr("192.0.2.7".into()));
    let other = Some(crate::ids::PeerAddr("192.0.2.8".into()));
    let mut next = 0;
    let mut hello = |h: &mut Harness, peer, token: &str| {
        next += 1;
        let conn = ConnId(next);
        h.step(Input::Accepted { conn, peer });
        let frame = client_frame(&ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: Some(token.into()),
        }));
        h.step(Input::Received { conn, bytes: frame });
        match h.last(conn) {
            ServerMessage::Hello(_) => Ok(()),
            ServerMessage::HelloError(e) => {
                assert_eq!(e.code, ErrorCode::Auth);
                Err(e.message)
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        hello(&mut h, guesser.clone(), "guess"),
        Err("Invalid token".into())
    );
    let locked = hello(&mut h, guesser.clone(), "secret").unwrap_err();
    assert!(locked.starts_with("Too many failed tokens"), "{locked}");
    assert_eq!(hello(&mut h, other.clone(), "secret"), Ok(()));
    assert_eq!(hello(&mut h, None, "secret"), Ok(()));
    h.now += 250;
    assert_eq!(
        hello(&mut h, guesser.clone(), "guess"),
        Err("Invalid token".into())
    );
    h.now += 250;
    assert!(
        hello(&mut h, guesser.clone(), "secret").is_err(),
        "the second lock is 500 ms"
    );
    h.now += 250;
    assert_eq!(hello(&mut h, guesser.clone(), "secret"), Ok(()));
    assert_eq!(
        hello(&mut h, guesser.clone(), "guess"),
        Err("Invalid token".into())
    );
    h.now += 250;
    assert_eq!(
        hello(&mut h, guesser.clone(), "secret"),
        Ok(()),
        "forgotten after a success: 250 ms again"
    );
}

/// A catalog change that is due when the shutdown begins is never scanned,
/// and so is no deadline: one left in the past would spin the driver's loop.
#[test]
fn a_shutting_down_server_reports_no_scan_deadline() {
    let a = ConnId(1);
    let mut h = Harness::serving(vec![stored(1)], a);
    let (_worker, _session) = h.create(a);
    h.step(Input::CatalogChanged);
    let due = h.server.next_deadline().expect("the scan settles");
    h.step(Input::Shutdown);
    h.now = due.0 + 1;
    h.step(Input::Tick);
    assert!(
        h.server.next_deadline().is_none_or(|d| d.0 > h.now),
        "a deadline in the past after the tick: {:?} at {}",
        h.server.next_deadline(),
        h.now
    );
}

/// The server keeps a transcript longer than `kept_transcript_bytes` only
/// while a version 1 client is attached (its protocol sends it whole with
/// every snapshot): a client attaching later waits for the worker to send
/// it again, and every attach then gets the snapshot as it stands.
#[test]
fn a_long_transcript_is_let_go_when_no_v1_client_needs_it_and_asked_for_again() {
    let (a, b, c) = (ConnId(1), ConnId(2), ConnId(3));
    let mut h = Harness::keeping(100, &[a, b, c]);
    let (worker, session) = h.create_with(a, |id| with_transcript(id, 1, SessionPhase::Idle, 20));
    let first = with_transcript(&session, 1, SessionPhase::Idle, 20);
    h.assert_sent(a, &session_response("create", &first, true));
    assert!(h.keeps_transcript(&session), "a is attached");
    // A turn runs (so the session stays live with nobody attached).
    let busy = with_transcript(&session, 2, SessionPhase::Turn, 20);
    h.runtime_snapshot(worker, &busy);
    let detach = Command::Detach {
        session_id: session.clone(),
    };
    h.request(a, "detach", detach.clone());
    assert!(!h.keeps_transcript(&session), "nobody needs it");

    // A tail of a transcript let go: its length is followed, no more.
    let mut tail = with_transcript(&session, 2, SessionPhase::Turn, 21);
    tail.transcript.drain(..20);
    h.worker(
        worker,
        FromWorker::Snapshot {
            snapshot: TailSnapshot {
                snapshot: tail,
                from: 20,
            },
        },
    );
    assert!(!h.keeps_transcript(&session));

    // Two attaches: one request to the worker; nobody is answered yet.
    let attach = Command::Attach {
        session_id: session.clone(),
    };
    let asked = Output::ToWorker {
        worker,
        message: ToWorker::Snapshot,
    };
    let before = (h.frames(b), h.frames(c));
    assert_eq!(h.request(b, "attach", attach.clone()), vec![asked.clone()]);
    assert_eq!(h.request(c, "attach", attach.clone()), vec![]);
    assert_eq!((h.frames(b), h.frames(c)), before, "nobody answered yet");
    // `status` needs no transcript.
    h.request(b, "status", Command::Status);
    assert_eq!(h.frames(b), before.0 + 1);

    // The worker sends its snapshot as it stands (streamed text shows
    // under the same revision): both are answered with it.
    let now = with_transcript(&session, 2, SessionPhase::Turn, 21);
    h.runtime_snapshot(worker, &now);
    h.assert_sent(b, &session_response("attach", &now, true));
    h.assert_sent(c, &session_response("attach", &now, true));
    assert_eq!(h.server.attachments(b), vec![session.clone()]);
    assert!(h.keeps_transcript(&session), "b and c are attached");

    // A tail extends the kept transcript: b and c get it whole.
    let next = with_transcript(&session, 3, SessionPhase::Turn, 23);
    let mut tail = next.clone();
    tail.transcript.drain(..21);
    h.worker(
        worker,
        FromWorker::Snapshot {
            snapshot: TailSnapshot {
                snapshot: tail,
                from: 21,
            },
        },
    );
    for conn in [b, c] {
        h.assert_sent(conn, &session_event(&next));
    }
    for conn in [b, c] {
        h.request(conn, "detach", detach.clone());
    }
    assert!(!h.keeps_transcript(&session), "let go again");

    // A short transcript is kept: an attach is answered at once.
    let short = with_transcript(&session, 4, SessionPhase::Turn, 1);
    h.runtime_snapshot(worker, &short);
    assert!(h.keeps_transcript(&session));
    assert_eq!(h.request(a, "attach", attach), vec![]);
    h.assert_sent(a, &session_response("attach", &short, true));
}

/// An attach during a turn is answered with a snapshot current as of the
/// deltas that follow it: after progress the cached one lags what
/// streamed, so the worker is asked for its snapshot as it stands.
#[test]
fn an_attach_after_progress_waits_for_the_current_snapshot() {
    let (a, b, c) = (ConnId(1), ConnId(2), ConnId(3));
    let mut h = Harness::keeping(1 << 20, &[a, b, c]);
    let (worker, session) = h.create_with(a, |id| with_transcript(id, 1, SessionPhase::Idle, 1));
    let turn = with_transcript(&session, 2, SessionPhase::Turn, 1);
    h.runtime_snapshot(worker, &turn);
    let attach = Command::Attach {
        session_id: session.clone(),
    };
    // No progress since the snapshot: it is current.
    assert_eq!(h.request(b, "attach", attach.clone()), vec![]);
    h.assert_sent(b, &session_response("attach", &turn, true));

    h.worker(
        worker,
        FromWorker::<SessionSnapshot>::Progress {
            progress: TranscriptProgress::AssistantDelta {
                message_id: "item-2".into(),
                content_index: 0,
                kind: DeltaKind::Text,
                delta: "hello".into(),
            },
        },
    );
    let before = h.frames(c);
    let asked = Output::ToWorker {
        worker,
        message: ToWorker::Snapshot,
    };
    assert_eq!(h.request(c, "attach", attach), vec![asked]);
    assert_eq!(
        h.frames(c),
        before,
        "not answered with the lagging snapshot"
    );
    let mut now = with_transcript(&session, 2, SessionPhase::Turn, 2);
    now.transcript[1] = crate::protocol::TranscriptItem::User(crate::protocol::UserItem {
        id: "u1".into(),
        content: vec![crate::protocol::Content::Text {
            text: "hello".into(),
        }],
        timestamp: 101,
    });
    let before_b = h.frames(b);
    h.runtime_snapshot(worker, &now);
    h.assert_sent(c, &session_response("attach", &now, true));
    assert_eq!(h.frames(b), before_b, "b saw revision 2");
}

/// A worker that exits while attaches wait for its snapshot: they fail as
/// the attached connections do, and the next attach opens the session anew.
#[test]
fn attaches_waiting_for_a_transcript_fail_with_their_worker() {
    let (a, b) = (ConnId(1), ConnId(2));
    let mut h = Harness::keeping(0, &[a, b]);
    let (worker, session) = h.create_with(a, |id| with_transcript(id, 1, SessionPhase::Idle, 2));
    h.runtime_snapshot(worker, &with_transcript(&session, 2, SessionPhase::Turn, 2));
    let detach = Command::Detach {
        session_id: session.clone(),
    };
    h.request(a, "detach", detach);
    let attach = Command::Attach {
        session_id: session.clone(),
    };
    h.request(b, "attach", attach.clone());
    h.step(Input::WorkerExited { worker });
    let message = "Session worker exited unexpectedly";
    let failed = ServerMessage::Response(Response {
        id: "attach".into(),
        outcome: Err(ProtocolError::new(ErrorCode::InternalError, message)),
    });
    h.assert_sent(b, &failed);
    let (again, reopened) = spawned(&h.request(b, "attach", attach));
    assert_eq!(reopened, session);
    h.step(Input::WorkerSpawned {
        worker: again,
        token: String::new(),
    });
    let snapshot = with_transcript(&session, 2, SessionPhase::Idle, 2);
    h.worker(
        again,
        FromWorker::Ready {
            snapshot: snapshot.clone(),
        },
    );
    h.assert_sent(b, &session_response("attach", &snapshot, true));
}

/// An adopted worker of channel version 1 cannot send its snapshot again:
/// the server keeps its transcript, however long.
#[test]
fn the_transcript_of_a_version_1_worker_is_kept() {
    let mut h = Harness::keeping(0, &[]);
    for (version, channel, id) in [(1, 1, "s-old"), (2, 2, "s-new")] {
        let snapshot = with_transcript(id, 4, SessionPhase::Idle, 3);
        h.step(Input::WorkerAnnounced {
            channel: ChannelId(channel),
            session_id: id.into(),
            pid: 9,
            version,
            snapshot: Box::new(PackedSnapshot::pack(snapshot).expect("packs")),
        });
        assert_eq!(h.keeps_transcript(id), version == 1, "version {version}");
    }
}

mod v8;

/// A removal is one step for the version 1 clients attached to the session:
/// they hear nothing until the store answers. When the deletion fails, the
/// requester is told why, the session opens again and they are attached
/// again, sent its snapshot as news; a client that detached meanwhile stays
/// detached. When a deletion succeeds, they hear `session_removed`.
#[test]
fn a_failed_removal_leaves_every_client_attached() {
    let (a, b, c) = (ConnId(1), ConnId(2), ConnId(3));
    let mut h = Harness::keeping(usize::MAX, &[a, b, c]);
    let (worker, session) = h.create(a);
    let attach = Command::Attach {
        session_id: session.clone(),
    };
    h.request(b, "attach", attach.clone());
    let remove = Command::Remove {
        session_id: session.clone(),
    };
    let (before_a, before_b) = (h.frames(a), h.frames(b));
    h.request(c, "remove", remove.clone());
    let detach = Command::Detach {
        session_id: session.clone(),
    };
    h.request(b, "detach", detach);
    let outputs = h.step(Input::WorkerExited { worker });
    assert!(outputs.contains(&Output::RemoveSession {
        session_id: session.clone()
    }));
    assert_eq!(
        h.told(a, before_a),
        Vec::<String>::new(),
        "held: told nothing"
    );
    let outputs = h.step(Input::SessionRemoved {
        session_id: session.clone(),
        result: Err("disk full".into()),
    });
    assert_eq!(
        refusal(&h, c),
        (
            ErrorCode::InternalError,
            "Could not remove session: disk full".into()
        )
    );
    let (again, reopened) = spawned(&outputs);
    assert_eq!(reopened, session);
    h.step(Input::WorkerSpawned {
        worker: again,
        token: String::new(),
    });
    let snap = snapshot(&session, 2, SessionPhase::Idle);
    h.worker(
        again,
        FromWorker::Ready {
            snapshot: snap.clone(),
        },
    );
    assert_eq!(h.told(a, before_a), ["session_snapshot"]);
    h.assert_sent(a, &session_event(&snap));
    assert!(h.server.conns[&a].attached.contains(&session));
    assert_eq!(h.server.conns[&a].in_flight, 0);
    assert!(!h.server.conns[&b].attached.contains(&session));
    assert_eq!(h.told(b, before_b), ["response"], "b: its detach's answer");

    // The same removal again, and the store deletes it this time.
    h.request(c, "remove", remove);
    let before_a = h.frames(a);
    h.step(Input::WorkerExited { worker: again });
    assert_eq!(h.told(a, before_a), Vec::<String>::new());
    h.step(Input::SessionRemoved {
        session_id: session.clone(),
        result: Ok(()),
    });
    let removed = ServerEvent::SessionRemoved {
        session_id: session,
    };
    h.assert_sent(a, &ServerMessage::Event(removed));
    assert!(h.server.conns[&a].attached.is_empty());
}
