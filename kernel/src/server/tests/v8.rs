//! Protocol v8 connections, step by step: the handshake, routing and its
//! error table, attachments and their fencing, pi's services, and what a
//! turn costs a subscriber.

use super::*;
use crate::protocol::v8::PROTOCOL_VERSION_V8;
use crate::protocol::{AssistantItem, Content, ModelRef, StopReason, UserItem};
use crate::wire::{Value, cbor};
use crate::worker::Operation;

const SERVER: &str = "00000000-0000-4000-8000-000000000001";

fn server_target() -> Value {
    Value::object(vec![("serverId", Value::text(SERVER))])
}

fn call(service: &str, member: &str, args: Vec<Value>) -> Value {
    Value::object(vec![
        ("serviceId", Value::text(service)),
        ("member", Value::text(member)),
        ("args", Value::Array(args)),
    ])
}

fn raw(message: Value) -> Vec<u8> {
    let payload = cbor::to_vec(&message).expect("encodes");
    encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("fits")
}

impl Harness {
    /// A v8 connection, handshake done.
    fn connect_v8(&mut self, conn: ConnId) {
        self.step(Input::Accepted { conn, peer: None });
        let hello = Value::object(vec![
            ("type", Value::text("hello")),
            ("version", Value::Int(PROTOCOL_VERSION_V8 as i64)),
        ]);
        self.step(Input::Received {
            conn,
            bytes: raw(hello),
        });
        assert_eq!(self.server.connection_stage(conn), Some(Stage::Ready));
    }

    fn send_v8(&mut self, conn: ConnId, id: &str, target: Value, call: Value) -> Vec<Output> {
        let request = Value::object(vec![
            ("type", Value::text("request")),
            ("id", Value::text(id)),
            ("target", target),
            ("call", call),
        ]);
        self.step(Input::Received {
            conn,
            bytes: raw(request),
        })
    }

    /// Every message sent to `conn`, decoded, as JSON text.
    fn v8_sent(&self, conn: ConnId) -> Vec<String> {
        self.sent
            .get(&conn)
            .map(|frames| {
                frames
                    .iter()
                    .map(|f| {
                        cbor::decode(&f.bytes()[4..], &Default::default())
                            .unwrap()
                            .json_text()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The messages sent to `conn` since the `from`th.
    fn v8_since(&self, conn: ConnId, from: usize) -> Vec<String> {
        self.v8_sent(conn).split_off(from)
    }

    /// The worker streams `text` into reply `message_id`'s first part.
    fn text_delta(&mut self, worker: WorkerId, message_id: &str, text: &str) {
        self.worker(
            worker,
            FromWorker::<SessionSnapshot>::Progress {
                progress: TranscriptProgress::AssistantDelta {
                    message_id: message_id.into(),
                    content_index: 0,
                    kind: DeltaKind::Text,
                    delta: text.into(),
                },
            },
        );
    }

    /// The session target of the route the last `attachment` envelope announced.
    fn route(&self, conn: ConnId) -> Value {
        let frame = self.sent[&conn]
            .iter()
            .rev()
            .map(|f| cbor::decode(&f.bytes()[4..], &Default::default()).unwrap())
            .find(|m| m.get("type") == Some(&Value::text("attachment")))
            .expect("an attachment envelope");
        frame.get("attachment").unwrap().clone()
    }

    /// Attaches a v8 connection to a stored session and brings its worker up.
    fn attach_v8(&mut self, conn: ConnId, session: &str, first: &SessionSnapshot) -> WorkerId {
        let outputs = self.send_v8(
            conn,
            "attach",
            server_target(),
            call(
                "pi.session-management",
                "attach",
                vec![Value::text(session)],
            ),
        );
        let (worker, _) = spawned(&outputs);
        self.step(Input::WorkerSpawned {
            worker,
            token: String::new(),
        });
        self.worker(
            worker,
            FromWorker::Ready {
                snapshot: first.clone(),
            },
        );
        worker
    }
}

fn result_of(messages: &[String], id: &str) -> String {
    let key = format!("\"id\":{id:?}");
    messages
        .iter()
        .find(|m| m.contains("\"type\":\"response\"") && m.contains(&key))
        .unwrap_or_else(|| panic!("no response to {id} in {messages:#?}"))
        .clone()
}

#[test]
fn the_handshake_picks_the_protocol_and_the_error_table_holds() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    h.connect_v8(ConnId(2));
    assert_eq!(
        h.v8_sent(ConnId(2)),
        [format!(
            r#"{{"type":"hello","version":8,"serverId":"{SERVER}"}}"#
        )]
    );
    let c = ConnId(2);
    h.send_v8(
        c,
        "cat",
        server_target(),
        call("$chord.service", "catalogue", vec![]),
    );
    let other = Value::object(vec![(
        "serverId",
        Value::text("00000000-0000-4000-8000-000000000002"),
    )]);
    h.send_v8(
        c,
        "wrong",
        other,
        call("$chord.service", "catalogue", vec![]),
    );
    h.send_v8(c, "bad", server_target(), Value::text("not a call"));
    h.send_v8(c, "unknown", server_target(), call("no.such", "x", vec![]));
    h.send_v8(
        c,
        "state",
        server_target(),
        call("pi.session-directory", "state", vec![]),
    );
    h.send_v8(
        c,
        "member",
        server_target(),
        call("pi.session-management", "nope", vec![]),
    );
    let keyed = vec![
        Value::text("s1"),
        Value::text("pi.session-directory"),
        Value::text("keyed"),
    ];
    h.send_v8(
        c,
        "keyed",
        server_target(),
        call("$chord.service", "subscribe", keyed),
    );
    let session = Value::object(vec![
        ("serverId", Value::text(SERVER)),
        ("sessionId", Value::text("s1")),
        ("attachmentId", Value::text("a1")),
    ]);
    h.send_v8(c, "fenced", session, call("pi.models", "refresh", vec![]));
    h.send_v8(
        c,
        "missing",
        server_target(),
        call("pi.session-management", "attach", vec![Value::text("nope")]),
    );
    h.send_v8(
        c,
        "unsub",
        server_target(),
        call("$chord.service", "unsubscribe", vec![Value::text("x")]),
    );
    let sent = h.v8_sent(c);
    let expect = [
        (
            "cat",
            r#""result":[{"serviceId":"pi.session-directory","mode":"singleton"},{"serviceId":"pi.session-management","mode":"singleton"},{"serviceId":"pi.presentation-plugins","mode":"singleton"},{"serviceId":"pi-server.session-status","mode":"singleton"},{"serviceId":"pi-server.sessions","mode":"singleton"}]"#,
        ),
        (
            "wrong",
            r#"{"code":"wrong_server","message":"Request was addressed to another server"}"#,
        ),
        (
            "bad",
            r#"{"code":"invalid_request","message":"Invalid service call"}"#,
        ),
        (
            "unknown",
            r#"{"code":"service_not_allowed","message":"Remote service no.such is not allowlisted"}"#,
        ),
        (
            "state",
            r#"{"code":"service_member_mismatch","message":"Remote service member pi.session-directory.state is not a method"}"#,
        ),
        (
            "member",
            r#"{"code":"service_member_not_found","message":"Unknown remote service member pi.session-management.nope"}"#,
        ),
        (
            "keyed",
            r#"{"code":"service_mode_mismatch","message":"Remote service pi.session-directory is singleton, not keyed"}"#,
        ),
        (
            "fenced",
            r#"{"code":"session_not_attached","message":"Session is not attached to this client"}"#,
        ),
        ("missing", r#""code":"session_not_found""#),
        (
            "unsub",
            r#"{"code":"internal_error","message":"Internal server error"}"#,
        ),
    ];
    for (id, fragment) in expect {
        let response = result_of(&sent, id);
        assert!(response.contains(fragment), "{id}: {response}");
    }

    // A broken envelope ends the connection (and only it).
    let outputs = h.step(Input::Received {
        conn: c,
        bytes: raw(Value::object(vec![("type", Value::text("request"))])),
    });
    assert!(
        outputs
            .iter()
            .any(|o| matches!(o, Output::Close { conn, .. } if *conn == c))
    );
    assert_eq!(h.server.connection_stage(ConnId(1)), Some(Stage::Ready));
}

#[test]
fn a_remote_v8_hello_needs_the_transport_to_have_checked_a_token() {
    let mut config = config();
    config.token = Some("secret".into());
    let mut h = Harness::with(config);
    h.step(Input::CatalogLoaded {
        sessions: vec![],
        models: Vec::new(),
    });
    let conn = ConnId(1);
    h.step(Input::Accepted {
        conn,
        peer: Some(PeerAddr("203.0.113.9".into())),
    });
    let hello = Value::object(vec![
        ("type", Value::text("hello")),
        ("version", Value::Int(8)),
    ]);
    let outputs = h.step(Input::Received {
        conn,
        bytes: raw(hello),
    });
    assert!(h.v8_sent(conn)[0].contains(r#""code":"auth""#));
    assert!(outputs.iter().any(|o| matches!(o, Output::Close { .. })));
    assert!(h.v8_sent(conn)[0].contains("present it at the transport"));
    // Over the Unix socket, its permissions are the check.
    h.connect_v8(ConnId(2));
    // A remote client that presented the token at its transport is in; a
    // wrong one is refused as a wrong v1 token is, and backs off.
    let hello = || {
        raw(Value::object(vec![
            ("type", Value::text("hello")),
            ("version", Value::Int(8)),
        ]))
    };
    for (conn, token, admitted) in [(ConnId(3), "secret", true), (ConnId(4), "guess", false)] {
        h.step(Input::Accepted {
            conn,
            peer: Some(PeerAddr("203.0.113.10".into())),
        });
        h.step(Input::Presented {
            conn,
            token: Secret(token.into()),
        });
        h.step(Input::Received {
            conn,
            bytes: hello(),
        });
        let first = &h.v8_sent(conn)[0];
        assert_eq!(
            first.contains(r#""type":"hello","version":8"#),
            admitted,
            "{first}"
        );
        if !admitted {
            assert!(first.contains("Invalid token"), "{first}");
        }
    }
    assert!(
        !format!(
            "{:?}",
            Input::Presented {
                conn: ConnId(9),
                token: Secret("secret".into())
            }
        )
        .contains("secret\"")
    );
}

fn reply(id: &str, text: &str) -> TranscriptItem {
    TranscriptItem::Assistant(AssistantItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        model: ModelRef {
            provider: "faux".into(),
            id: "faux-1".into(),
        },
        response_model: None,
        usage: None,
        timestamp: 50,
        status: AssistantStatus::Complete(StopReason::Stop),
        error_message: None,
    })
}

fn user(id: &str, text: &str) -> TranscriptItem {
    TranscriptItem::User(UserItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        timestamp: 40,
    })
}

/// `n` finished turns of history.
fn history(id: &str, revision: u64, n: usize) -> SessionSnapshot {
    let mut snap = snapshot(id, revision, SessionPhase::Idle);
    for i in 0..n {
        snap.transcript
            .push(user(&format!("u{i}"), &format!("question {i}")));
        snap.transcript
            .push(reply(&format!("a{i}"), &"answer ".repeat(40)));
    }
    snap
}

#[test]
fn attach_announces_the_route_first_and_fences_the_old_one() {
    let mut h = Harness::serving(vec![stored(1), stored(2)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let first = stored(1).id;
    let second = stored(2).id;
    h.attach_v8(c, &first, &history(&first, 1, 0));
    let sent = h.v8_sent(c);
    let n = sent.len();
    assert!(
        sent[n - 2].starts_with(r#"{"type":"attachment","attachment":{"serverId""#),
        "{sent:#?}"
    );
    assert_eq!(
        sent[n - 1],
        r#"{"type":"response","id":"attach","ok":true}"#
    );
    let old = h.route(c);

    // The same session again: nothing changes, no new envelope.
    h.send_v8(
        c,
        "again",
        server_target(),
        call("pi.session-management", "attach", vec![Value::text(&first)]),
    );
    assert_eq!(
        h.v8_since(c, n),
        [r#"{"type":"response","id":"again","ok":true}"#]
    );

    // Another session: a new route; the old one is fenced.
    h.attach_v8(c, &second, &history(&second, 1, 0));
    assert_ne!(h.route(c), old);
    let before = h.frames(c);
    h.send_v8(c, "late", old, call("pi.models", "refresh", vec![]));
    assert!(h.v8_since(c, before)[0].contains("session_not_attached"));

    // Detach: `attachment: null` before the answer; a second detach is a no-op.
    let before = h.frames(c);
    h.send_v8(
        c,
        "d1",
        server_target(),
        call("pi.session-management", "detach", vec![]),
    );
    h.send_v8(
        c,
        "d2",
        server_target(),
        call("pi.session-management", "detach", vec![]),
    );
    assert_eq!(
        h.v8_since(c, before),
        [
            r#"{"type":"attachment","attachment":null}"#,
            r#"{"type":"response","id":"d1","ok":true}"#,
            r#"{"type":"response","id":"d2","ok":true}"#,
        ]
    );
    assert!(h.server.attachments(c).is_empty());
}

#[test]
fn session_status_is_replicated_state_that_follows_attachments_and_turns() {
    let mut h = Harness::serving(vec![stored(1), stored(2)], ConnId(1));
    let watcher = ConnId(2);
    let user = ConnId(3);
    h.connect_v8(watcher);
    h.connect_v8(user);
    let args = vec![
        Value::text("st"),
        Value::text("pi-server.session-status"),
        Value::text("singleton"),
    ];
    h.send_v8(
        watcher,
        "st",
        server_target(),
        call("$chord.service", "subscribe", args),
    );
    let snapshot = result_of(&h.v8_sent(watcher), "st");
    let (one, two) = (stored(1).id, stored(2).id);
    for id in [&one, &two] {
        assert!(
            snapshot.contains(&format!(
                r#"{{"sessionId":"{id}","state":"stored","clients":0"#
            )),
            "{snapshot}"
        );
    }

    // An attach shows the session live, with its client, model and level.
    let before = h.frames(watcher);
    let worker = h.attach_v8(user, &one, &history(&one, 1, 0));
    let updates = h.v8_since(watcher, before);
    let last = updates.last().expect("the attach is published");
    assert!(last.contains("service_update"), "{updates:#?}");
    let state = h.server.status_state.as_ref().unwrap().value().json_text();
    assert!(
        state.contains(&format!(
            r#"{{"sessionId":"{one}","state":"idle","clients":1,"model":{{"provider":"#
        )),
        "{state}"
    );

    // A reply's progress changes nothing it shows: no update.
    let before = h.frames(watcher);
    h.text_delta(worker, "a0", "x");
    assert!(h.v8_since(watcher, before).is_empty());

    // Detach: back to no clients, by a small op, not the whole list again.
    let before = h.frames(watcher);
    h.send_v8(
        user,
        "d",
        server_target(),
        call("pi.session-management", "detach", vec![]),
    );
    let updates = h.v8_since(watcher, before);
    assert_eq!(updates.len(), 1, "{updates:#?}");
    assert!(!updates[0].contains(&two), "{}", updates[0]);

    // An unsubscribed connection is told nothing more.
    h.send_v8(
        watcher,
        "un",
        server_target(),
        call("$chord.service", "unsubscribe", vec![Value::text("st")]),
    );
    let before = h.frames(watcher);
    h.attach_v8(user, &two, &history(&two, 1, 0));
    assert!(h.v8_since(watcher, before).is_empty());
    assert!(h.server.status_watchers.is_empty());
}

/// Subscribes `conn` to a session service and returns the snapshot response.
fn subscribe(h: &mut Harness, conn: ConnId, sub: &str, service: &str) -> String {
    let route = h.route(conn);
    let args = vec![
        Value::text(sub),
        Value::text(service),
        Value::text("singleton"),
    ];
    let before = h.frames(conn);
    h.send_v8(conn, sub, route, call("$chord.service", "subscribe", args));
    result_of(&h.v8_since(conn, before), sub)
}

#[test]
fn a_prompt_answers_at_once_streams_small_ops_and_is_waited_for() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let session = stored(1).id;
    let worker = h.attach_v8(c, &session, &history(&session, 1, 0));
    let snapshot = subscribe(&mut h, c, "t", "pi.transcript");
    assert!(
        snapshot.contains(r#"["r",{"conversation":{"id":1},"entries":[],"docs":{"pi.agent""#),
        "{snapshot}"
    );
    let route = h.route(c);
    let prompt = call(
        "pi.agent-controller",
        "prompt",
        vec![Value::object(vec![
            ("message", Value::text("hi")),
            ("images", Value::Null),
        ])],
    );
    let outputs = h.send_v8(c, "p", route.clone(), prompt.clone());
    let op = op_of(&outputs);
    let answer = result_of(&h.v8_sent(c), "p");
    assert!(
        answer.contains(&format!(
            r#""result":{{"accepted":true,"operationId":"{}","error":null}}"#,
            op.0
        )),
        "{answer}"
    );
    h.send_v8(
        c,
        "w",
        route.clone(),
        call(
            "pi.agent-controller",
            "waitForPrompt",
            vec![Value::text(op.0.to_string())],
        ),
    );
    // Busy now: a second prompt is refused in band.
    h.send_v8(c, "p2", route.clone(), prompt);
    assert!(
        result_of(&h.v8_sent(c), "p2")
            .contains(r#""accepted":false,"operationId":null,"error":{"code":"busy""#)
    );

    let mut turn = history(&session, 2, 0);
    turn.phase = SessionPhase::Turn;
    turn.transcript.push(user("u0", "hi"));
    h.runtime_snapshot(worker, &turn);
    let streaming = TranscriptItem::Assistant(AssistantItem {
        content: vec![],
        status: AssistantStatus::Streaming,
        ..match reply("a0", "") {
            TranscriptItem::Assistant(a) => a,
            _ => unreachable!(),
        }
    });
    let before = h.frames(c);
    h.worker(
        worker,
        FromWorker::<SessionSnapshot>::Progress {
            progress: TranscriptProgress::ItemStarted { item: streaming },
        },
    );
    for word in ["Hello", " there"] {
        h.text_delta(worker, "a0", word);
    }
    let updates = h.v8_since(c, before);
    assert!(updates[1].contains(r#"["p",["docs","pi.live","generation","message","content"],0,0,[{"type":"text","text":"Hello"}]]"#), "{updates:#?}");
    assert!(updates[2].ends_with(r#""ops":[["a",["docs","pi.live","generation","message","content",0,"text"]," there"]]}}"#), "{updates:#?}");

    let mut done = history(&session, 3, 0);
    done.transcript.push(user("u0", "hi"));
    done.transcript.push(reply("a0", "Hello there"));
    h.op_done(worker, op, &done);
    let w = result_of(&h.v8_sent(c), "w");
    assert!(
        w.contains(r#""result":{"status":"done","text":"Hello there","reason":null}"#),
        "{w}"
    );
    let sent = h.v8_sent(c);
    let last_update = sent
        .iter()
        .rev()
        .find(|m| m.contains("service_update"))
        .unwrap();
    assert!(
        !last_update.contains("question"),
        "no history is re-sent: {last_update}"
    );
    assert!(
        h.server.sessions[&session]
            .v8
            .as_ref()
            .unwrap()
            .transcript_value()
            .contains("pi.assistant")
    );
}

#[test]
fn a_turn_costs_a_subscriber_what_it_adds_not_the_history() {
    let bytes_of_a_turn = |history_turns: usize| {
        let mut h = Harness::serving(vec![stored(1)], ConnId(1));
        let c = ConnId(2);
        h.connect_v8(c);
        let session = stored(1).id;
        let worker = h.attach_v8(c, &session, &history(&session, 1, history_turns));
        subscribe(&mut h, c, "t", "pi.transcript");
        let route = h.route(c);
        let prompt = call(
            "pi.agent-controller",
            "prompt",
            vec![Value::object(vec![
                ("message", Value::text("next")),
                ("images", Value::Null),
            ])],
        );
        let before: usize = h.sent[&c].iter().map(Frame::len).sum();
        let op = op_of(&h.send_v8(c, "p", route, prompt));
        let mut turn = history(&session, 2, history_turns);
        turn.phase = SessionPhase::Turn;
        turn.transcript.push(user("un", "next"));
        h.runtime_snapshot(worker, &turn);
        let mut done = history(&session, 3, history_turns);
        done.transcript.push(user("un", "next"));
        done.transcript.push(reply("an", "a short answer"));
        h.op_done(worker, op, &done);
        let after: usize = h.sent[&c].iter().map(Frame::len).sum();
        after - before
    };
    let small = bytes_of_a_turn(10);
    let large = bytes_of_a_turn(1_000);
    // Only the entry ids' and indices' digits grow.
    assert!(
        large <= small + 16,
        "a turn after 1,000 turns costs {large} bytes, after 10 {small}"
    );
    assert!(small < 2_000, "{small} bytes for a short turn");
}

#[test]
fn a_dead_worker_fails_the_calls_then_drops_the_route_and_keeps_the_connection() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let session = stored(1).id;
    let worker = h.attach_v8(c, &session, &history(&session, 1, 0));
    let route = h.route(c);
    let prompt = call(
        "pi.agent-controller",
        "prompt",
        vec![Value::object(vec![
            ("message", Value::text("hi")),
            ("images", Value::Null),
        ])],
    );
    let op = op_of(&h.send_v8(c, "p", route.clone(), prompt));
    h.send_v8(
        c,
        "w",
        route.clone(),
        call(
            "pi.agent-controller",
            "waitForPrompt",
            vec![Value::text(op.0.to_string())],
        ),
    );
    h.send_v8(
        c,
        "w2",
        route.clone(),
        call(
            "pi.agent-controller",
            "waitForPrompt",
            vec![Value::text(op.0.to_string())],
        ),
    );
    // A cancel names the request and its target; the answer is `cancelled`, once.
    let cancel = Value::object(vec![
        ("type", Value::text("cancel")),
        ("id", Value::text("w2")),
        ("target", route.clone()),
    ]);
    h.step(Input::Received {
        conn: c,
        bytes: raw(cancel),
    });
    let before = h.frames(c);
    h.step(Input::WorkerExited { worker });
    let sent = h.v8_since(c, before);
    assert_eq!(
        sent,
        [
            // The prompt settled: unanswered, in band.
            r#"{"type":"response","id":"w","ok":true,"result":{"status":"unanswered","text":null,"reason":"Internal server error"}}"#,
            r#"{"type":"attachment","attachment":null}"#,
        ]
    );
    assert!(result_of(&h.v8_sent(c), "w2").contains(r#""code":"cancelled""#));
    assert_eq!(h.server.connection_stage(c), Some(Stage::Ready));
    assert!(h.server.attachments(c).is_empty());
}

#[test]
fn v1_and_v8_clients_share_a_session() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let v8 = ConnId(2);
    h.connect_v8(v8);
    let session = stored(1).id;
    let worker = h.attach_v8(v8, &session, &history(&session, 1, 0));
    h.request(
        ConnId(1),
        "attach",
        Command::Attach {
            session_id: session.clone(),
        },
    );
    assert_eq!(
        h.server.attachments(ConnId(1)),
        std::slice::from_ref(&session)
    );
    // The v1 client prompts; the v8 client sees the turn as ops.
    subscribe(&mut h, v8, "t", "pi.transcript");
    let outputs = h.request(
        ConnId(1),
        "prompt",
        Command::Prompt {
            session_id: session.clone(),
            text: "from v1".into(),
        },
    );
    let op = op_of(&outputs);
    // Busy for both.
    h.send_v8(
        v8,
        "p",
        h.route(v8),
        call(
            "pi.agent-controller",
            "prompt",
            vec![Value::object(vec![
                ("message", Value::text("x")),
                ("images", Value::Null),
            ])],
        ),
    );
    assert!(result_of(&h.v8_sent(v8), "p").contains(r#""code":"busy""#));
    let mut done = history(&session, 2, 0);
    done.transcript.push(user("u0", "from v1"));
    done.transcript.push(reply("a0", "answered"));
    h.op_done(worker, op, &done);
    let last = h
        .v8_sent(v8)
        .into_iter()
        .rev()
        .find(|m| m.contains("service_update"))
        .unwrap();
    assert!(
        last.contains("from v1") && last.contains("answered"),
        "{last}"
    );
    // The v8 client leaves; the v1 client stays attached.
    h.send_v8(
        v8,
        "d",
        server_target(),
        call("pi.session-management", "detach", vec![]),
    );
    assert!(
        h.v8_sent(v8)
            .iter()
            .any(|m| m == r#"{"type":"attachment","attachment":null}"#)
    );
    assert_eq!(h.server.attachments(ConnId(1)), [session]);
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Pieces v8 requests are made of: real service and member names, and
    /// arguments of every shape, so that both the routing and the services'
    /// argument checks are reached.
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-3i64..5).prop_map(Value::Int),
            prop::sample::select(vec!["", "s1", "demo-1", "1", "x", "probe", "hi"])
                .prop_map(Value::text),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec![
                        "id",
                        "message",
                        "images",
                        "provider",
                        "modelId",
                        "packagePaths",
                    ]),
                    inner,
                    0..3
                )
                .prop_map(|pairs| Value::object(pairs.into_iter().collect())),
            ]
        })
    }

    fn request() -> impl Strategy<Value = (u8, String, String, Vec<Value>, bool)> {
        (
            0u8..4,
            prop::sample::select(vec![
                "$chord.service",
                "pi.session-directory",
                "pi.session-management",
                "pi.presentation-plugins",
                "pi.agent-controller",
                "pi.models",
                "pi.transcript",
                "pi.session-plugins",
                "pi-server.sessions",
                "no.such",
            ])
            .prop_map(String::from),
            prop::sample::select(vec![
                "catalogue",
                "subscribe",
                "unsubscribe",
                "create",
                "attach",
                "detach",
                "remove",
                "prompt",
                "steer",
                "abort",
                "waitForPrompt",
                "select",
                "selectThinking",
                "cycleThinking",
                "getThinkingLevels",
                "prepareSession",
                "reload",
                "models",
                "state",
                "x",
            ])
            .prop_map(String::from),
            prop::collection::vec(value(), 0..3),
            any::<bool>(),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any sequence of well-framed v8 requests, to either scope, with
        /// any arguments: the server never panics (debug builds check every
        /// invariant after each step), every request is answered or still
        /// active, and a v1 client beside it is still served.
        #[test]
        fn any_requests_leave_the_server_whole(requests in prop::collection::vec(request(), 1..24)) {
            let mut h = Harness::serving(vec![stored(1)], ConnId(1));
            let c = ConnId(2);
            h.connect_v8(c);
            let session = stored(1).id;
            h.attach_v8(c, &session, &history(&session, 1, 1));
            for (i, (target, service, member, args, bad_id)) in requests.into_iter().enumerate() {
                let target = match target {
                    0 | 1 => server_target(),
                    2 => h.route(c),
                    _ => Value::object(vec![
                        ("serverId", Value::text(SERVER)),
                        ("sessionId", Value::text(&session)),
                        ("attachmentId", Value::text("stale")),
                    ]),
                };
                let id = if bad_id { "same".to_string() } else { format!("r{i}") };
                let args = match (service.as_str(), member.as_str()) {
                    ("$chord.service", "subscribe") if args.is_empty() => vec![
                        Value::text(format!("sub{i}")),
                        Value::text("pi.transcript"),
                        Value::text("singleton"),
                    ],
                    _ => args,
                };
                h.send_v8(c, &id, target.clone(), call(&service, &member, args));
                if h.server.connection_stage(c) != Some(Stage::Ready) {
                    break;
                }
            }
            let outputs = h.request(ConnId(1), "list", Command::List);
            let closed = outputs
                .iter()
                .any(|o| matches!(o, Output::Close { conn, .. } if *conn == ConnId(1)));
            prop_assert!(!closed, "the v1 client was closed");
            prop_assert!(matches!(h.last(ConnId(1)), ServerMessage::Response(_)));
        }
    }
}

/// A turn ends with its idle snapshot, then the prompt's answer: a prompt
/// sent between the two is taken, not refused as busy.
#[test]
fn a_prompt_right_after_the_idle_snapshot_is_taken() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let session = stored(1).id;
    let worker = h.attach_v8(c, &session, &history(&session, 1, 0));
    let route = h.route(c);
    let prompt = call(
        "pi.agent-controller",
        "prompt",
        vec![Value::object(vec![
            ("message", Value::text("hi")),
            ("images", Value::Null),
        ])],
    );
    let first = op_of(&h.send_v8(c, "p1", route.clone(), prompt.clone()));
    let mut turn = history(&session, 2, 0);
    turn.phase = SessionPhase::Turn;
    turn.transcript.push(user("u0", "hi"));
    h.runtime_snapshot(worker, &turn);
    let mut done = history(&session, 3, 0);
    done.transcript.push(user("u0", "hi"));
    done.transcript.push(reply("a0", "hello"));
    h.runtime_snapshot(worker, &done);
    // The answer to the first prompt has not come yet.
    h.send_v8(c, "p2", route, prompt);
    let answer = result_of(&h.v8_sent(c), "p2");
    assert!(answer.contains(r#""accepted":true"#), "{answer}");
    h.op_done(worker, first, &done);
}

/// Ours beside pi's management: a session created with its working
/// directory, name, model and thinking level (the name unique, bad
/// arguments refused in band), and the models offered.
#[test]
fn our_sessions_service_creates_with_v1_s_parameters_and_lists_models() {
    let mut h = Harness::serving(vec![stored(1), stored(2)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let ours = |member: &str, args: Vec<Value>| call("pi-server.sessions", member, args);
    let params = Value::object(vec![
        ("cwd", Value::text("/work/x")),
        ("name", Value::text("fresh")),
        (
            "model",
            Value::object(vec![
                ("provider", Value::text("faux")),
                ("modelId", Value::text("faux-reasoner")),
            ]),
        ),
        ("thinkingLevel", Value::text("high")),
    ]);
    let outputs = h.send_v8(c, "c1", server_target(), ours("create", vec![params]));
    let spec = outputs
        .iter()
        .find_map(|o| match o {
            Output::SpawnWorker { create, .. } => create.clone(),
            _ => None,
        })
        .expect("a worker is spawned to create it");
    assert_eq!(spec.cwd.as_deref(), Some("/work/x"));
    assert_eq!(spec.name.as_deref(), Some("fresh"));
    assert_eq!(
        spec.model,
        Some(ModelRef {
            provider: "faux".into(),
            id: "faux-reasoner".into()
        })
    );
    assert_eq!(spec.thinking_level, Some(ThinkingLevel::High));

    // The name of a stored session is taken; bad arguments are refused.
    let taken = stored(2).session_name.expect("stored sessions are named");
    let refusals = [
        (
            "c2",
            vec![Value::object(vec![("name", Value::text(&taken))])],
            "is taken",
        ),
        (
            "c3",
            vec![Value::object(vec![("cwd", Value::Int(1))])],
            "cwd must be",
        ),
        (
            "c4",
            vec![Value::object(vec![("id", Value::text("x"))])],
            "expected",
        ),
        (
            "c5",
            vec![Value::object(vec![("thinkingLevel", Value::text("loud"))])],
            "no thinking level",
        ),
        (
            "c6",
            vec![Value::object(vec![("model", Value::text("faux"))])],
            "model must be",
        ),
    ];
    for (id, args, why) in refusals {
        h.send_v8(c, id, server_target(), ours("create", args));
        let answer = result_of(&h.v8_sent(c), id);
        assert!(
            answer.contains(r#""ok":false"#) && answer.contains(why),
            "{id}: {answer}"
        );
    }

    // The models offered, in v1's shape.
    h.send_v8(c, "m", server_target(), ours("models", vec![]));
    let models = result_of(&h.v8_sent(c), "m");
    assert!(
        models.contains(r#""provider":"#) && models.contains(r#""supportedThinkingLevels":"#),
        "{models}"
    );
}

/// A prompt's images go to the worker with its text; what a model cannot
/// take, or the request does not say right, is refused before anything runs.
#[test]
fn a_prompt_carries_its_images_and_bad_ones_are_refused() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let session = stored(1).id;
    h.attach_v8(c, &session, &history(&session, 1, 0));
    let route = h.route(c);
    let image = |mime: &str, data: &str| {
        Value::object(vec![
            ("type", Value::text("image")),
            ("data", Value::text(data)),
            ("mimeType", Value::text(mime)),
        ])
    };
    let request = |member: &str, images: Vec<Value>| {
        call(
            "pi.agent-controller",
            member,
            vec![Value::object(vec![
                ("message", Value::text("look")),
                ("images", Value::Array(images)),
            ])],
        )
    };
    let refusals = [
        (
            "gif?",
            request("prompt", vec![image("image/bmp", "AAAA")]),
            "models take",
        ),
        (
            "b64",
            request("prompt", vec![image("image/png", "not base64!")]),
            "not base64",
        ),
        (
            "many",
            request("prompt", vec![image("image/png", "AAAA"); 17]),
            "at most 16",
        ),
        (
            "shape",
            request("prompt", vec![Value::text("x")]),
            "must be {type",
        ),
    ];
    for (id, call, why) in refusals {
        h.send_v8(c, id, route.clone(), call);
        let answer = result_of(&h.v8_sent(c), id);
        assert!(answer.contains(why), "{id}: {answer}");
    }
    let outputs = h.send_v8(
        c,
        "ok",
        route.clone(),
        request("prompt", vec![image("image/png", "iVBORw0KGgo=")]),
    );
    let operation = outputs
        .iter()
        .find_map(|o| match o {
            Output::ToWorker {
                message: ToWorker::Operation { operation, .. },
                ..
            } => Some(operation.clone()),
            _ => None,
        })
        .expect("the prompt goes to the worker");
    assert_eq!(
        operation,
        Operation::Prompt {
            text: "look".into(),
            images: vec![Content::Image {
                data: "iVBORw0KGgo=".into(),
                mime_type: "image/png".into()
            }],
        }
    );
    assert!(result_of(&h.v8_sent(c), "ok").contains(r#""accepted":true"#));
}

/// Our own v8 client side (`client::v8::Connection` and `Conversation`)
/// against this server: it attaches a session, follows a turn by its
/// replicas, loses its transport mid-reply, reconnects, is attached again
/// and reads the same transcript, with nothing told twice or lost.
#[test]
fn our_v8_client_follows_a_turn_across_a_reconnection() {
    use crate::client::v8::connection::{
        Changed, Config as ClientConfig, Connection, Input as In, Output as Out, Request, STATUS,
        TRANSCRIPT,
    };
    use crate::client::v8::conversation::Conversation;
    use crate::client::{CallId, Status};

    struct Pair {
        h: Harness,
        client: Connection,
        conn: ConnId,
        read: usize,
        worker: Option<WorkerId>,
        completed: BTreeMap<u64, bool>,
        changes: Vec<Changed>,
        statuses: Vec<Status>,
    }
    impl Pair {
        /// Steps the client and carries its outputs to the server, and
        /// what the server sends back, until both are quiet.
        fn client(&mut self, input: In) {
            let mut inputs = vec![input];
            while let Some(input) = inputs.pop() {
                let now = Instant(self.h.now);
                for output in self.client.step(now, input) {
                    match output {
                        Out::Transmit(bytes) => {
                            let outputs = self.h.step(Input::Received {
                                conn: self.conn,
                                bytes,
                            });
                            if let Some(worker) = outputs.iter().find_map(|o| match o {
                                Output::SpawnWorker { worker, .. } => Some(*worker),
                                _ => None,
                            }) {
                                self.worker = Some(worker);
                                self.h.step(Input::WorkerSpawned {
                                    worker,
                                    token: String::new(),
                                });
                                let first = history(&stored(1).id, 1, 1);
                                self.h.worker(worker, FromWorker::Ready { snapshot: first });
                            }
                        }
                        Out::Complete { call, result } => {
                            self.completed.insert(call.0, result.is_ok());
                        }
                        Out::Changed(c) => self.changes.push(c),
                        Out::Status(s) => self.statuses.push(s),
                        Out::Connect | Out::Launch | Out::CloseTransport => {}
                    }
                }
                let sent = self.h.sent.get(&self.conn).map_or(0, Vec::len);
                if sent > self.read {
                    let bytes: Vec<u8> = self.h.sent[&self.conn][self.read..]
                        .iter()
                        .flat_map(|f| f.bytes().to_vec())
                        .collect();
                    self.read = sent;
                    inputs.push(In::Received(bytes));
                }
            }
        }
        fn transcript(&self) -> Conversation {
            Conversation::new(self.client.session_state(TRANSCRIPT).expect("followed"))
        }
    }

    let session = stored(1).id;
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    h.step(Input::Accepted {
        conn: ConnId(2),
        peer: None,
    });
    let client = Connection::new(ClientConfig {
        server_id: SERVER.into(),
        follow: vec![STATUS],
        reconnect: true,
        launch: false,
        limits: Default::default(),
    });
    let mut p = Pair {
        h,
        client,
        conn: ConnId(2),
        read: 0,
        worker: None,
        completed: BTreeMap::new(),
        changes: Vec::new(),
        statuses: Vec::new(),
    };
    p.client(In::TransportUp);
    assert!(matches!(
        p.statuses[..],
        [Status::Ready {
            reconnected: false,
            ..
        }]
    ));
    assert!(
        p.client.server_state(STATUS).is_some(),
        "the status is followed"
    );

    p.client(In::Call {
        call: CallId(1),
        request: Request::Attach(session.clone()),
    });
    assert_eq!(p.completed.get(&1), Some(&true), "attached, states in");
    // A v1 client stays attached too, so the session stays live while
    // ours reconnects (with nobody attached it would be disposed).
    let v1 = Command::Attach {
        session_id: session.clone(),
    };
    p.h.request(ConnId(1), "v1", v1);
    assert_eq!(p.transcript().finished().len(), 2, "the history");

    // A turn: the prompt, then the reply streams.
    let worker = p.worker.expect("a worker");
    let mut turn = history(&session, 2, 1);
    turn.phase = SessionPhase::Turn;
    turn.transcript.push(user("u1", "next"));
    let mut reply = match self::reply("a1", "half") {
        TranscriptItem::Assistant(mut a) => {
            a.status = AssistantStatus::Streaming;
            TranscriptItem::Assistant(a)
        }
        other => other,
    };
    turn.transcript.push(reply.clone());
    p.h.runtime_snapshot(worker, &turn);
    p.client(In::Tick);
    p.h.text_delta(worker, "a1", " more");
    p.client(In::Tick);
    let seen = p.transcript();
    assert!(seen.busy());
    let TranscriptItem::Assistant(live) = seen.live().last().expect("the reply streams") else {
        panic!()
    };
    assert_eq!(
        live.content,
        vec![Content::Text {
            text: "half more".into()
        }]
    );

    // The transport goes mid-reply: the route and replicas go with it.
    p.client(In::TransportClosed {
        message: "reset".into(),
    });
    p.h.step(Input::Disconnected { conn: ConnId(2) });
    assert!(p.client.session_state(TRANSCRIPT).is_none());
    assert!(matches!(
        p.statuses.last(),
        Some(Status::Reconnecting { .. })
    ));
    // The reply goes on meanwhile.
    p.h.text_delta(worker, "a1", " and the end");
    if let TranscriptItem::Assistant(a) = &mut reply {
        a.content = vec![Content::Text {
            text: "half more and the end".into(),
        }];
        a.status = AssistantStatus::Complete(StopReason::Stop);
    }
    let mut done = history(&session, 3, 1);
    done.transcript.push(user("u1", "next"));
    done.transcript.push(reply);
    p.h.runtime_snapshot(worker, &done);

    // Reconnect: a new transport, the hello, the same session attached again.
    p.h.now += 10_000;
    p.client(In::Tick);
    p.conn = ConnId(3);
    p.read = 0;
    p.h.step(Input::Accepted {
        conn: ConnId(3),
        peer: None,
    });
    p.client(In::TransportUp);
    assert!(matches!(
        p.statuses.last(),
        Some(Status::Ready {
            reconnected: true,
            ..
        })
    ));
    let seen = p.transcript();
    assert!(!seen.busy());
    let texts: Vec<String> = seen
        .items()
        .iter()
        .map(|i| match i {
            TranscriptItem::User(u) => crate::client::follow::text_of(&u.content),
            TranscriptItem::Assistant(a) => crate::client::follow::text_of(&a.content),
            TranscriptItem::Tool(t) => t.tool_name.clone(),
        })
        .collect();
    assert_eq!(
        texts,
        [
            "question 0",
            &"answer ".repeat(40),
            "next",
            "half more and the end"
        ]
    );
    assert!(p.changes.contains(&Changed::Route(Some(session.clone()))));
}

/// A reply streams from the worker before the snapshot that commits the
/// prompt it answers: the transcript holds it back until that snapshot,
/// which shows the prompt, then the reply so far. No subscriber ever sees a
/// reply without its prompt before it.
#[test]
fn a_reply_is_not_shown_before_the_prompt_it_answers() {
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let c = ConnId(2);
    h.connect_v8(c);
    let session = stored(1).id;
    let worker = h.attach_v8(c, &session, &history(&session, 1, 1));
    subscribe(&mut h, c, "t", "pi.transcript");
    let streaming = match reply("a1", "so") {
        TranscriptItem::Assistant(mut a) => {
            a.status = AssistantStatus::Streaming;
            TranscriptItem::Assistant(a)
        }
        other => other,
    };
    let before = h.frames(c);
    h.worker(
        worker,
        FromWorker::<SessionSnapshot>::Progress {
            progress: TranscriptProgress::ItemStarted {
                item: streaming.clone(),
            },
        },
    );
    h.text_delta(worker, "a1", " far");
    assert!(
        h.v8_since(c, before).is_empty(),
        "held: the newest entry is a finished reply, not the prompt"
    );
    let mut turn = history(&session, 2, 1);
    turn.phase = SessionPhase::Turn;
    turn.transcript.push(user("u1", "next"));
    turn.transcript.push(streaming);
    h.runtime_snapshot(worker, &turn);
    let updates = h.v8_since(c, before).join("\n");
    let (prompt, reply) = (
        updates.find(r#""text":"next""#),
        updates.find(r#""text":"so"#),
    );
    assert!(
        prompt.is_some() && reply.is_some() && prompt < reply,
        "{updates}"
    );
    // From there the reply streams by small ops.
    let before = h.frames(c);
    h.text_delta(worker, "a1", " on");
    assert_eq!(h.v8_since(c, before).len(), 1);
}

/// `pi-server.approvals`: the worker's approvals are replicated state (two
/// clients see one question), and `answer` and `setPolicy` become worker
/// operations; bad arguments are refused without reaching it.
#[test]
fn approvals_are_replicated_and_answered_through_our_service() {
    use crate::approval::{ApprovalPolicy, Approvals, Decision, Question};
    let mut h = Harness::serving(vec![stored(1)], ConnId(1));
    let (a, b) = (ConnId(2), ConnId(3));
    h.connect_v8(a);
    h.connect_v8(b);
    let session = stored(1).id;
    let worker = h.attach_v8(a, &session, &history(&session, 1, 0));
    h.send_v8(
        b,
        "attach",
        server_target(),
        call(
            "pi.session-management",
            "attach",
            vec![Value::text(&session)],
        ),
    );
    let first = subscribe(&mut h, a, "q", "pi-server.approvals");
    assert!(
        first.contains(r#"{"policy":"auto","own":false,"always":[],"pending":[]}"#),
        "{first}"
    );
    subscribe(&mut h, b, "q", "pi-server.approvals");
    let question = Question {
        id: "item-3".into(),
        call_id: "c1".into(),
        tool: "bash".into(),
        input: Value::object(vec![("command", Value::text("ls"))]),
        asked_at: 7,
    };
    let (before_a, before_b) = (h.frames(a), h.frames(b));
    h.worker(
        worker,
        FromWorker::<SessionSnapshot>::Approvals {
            approvals: Approvals {
                policy: None,
                always: vec![],
                pending: vec![question],
            },
            policy: ApprovalPolicy::Ask,
        },
    );
    for (conn, before) in [(a, before_a), (b, before_b)] {
        let update = h.v8_since(conn, before).join("\n");
        assert!(
            update.contains(r#"["r",["policy"],"ask"]"#) || update.contains(r#""ask""#),
            "{update}"
        );
        assert!(update.contains(r#""tool":"bash""#), "{update}");
    }
    let route = h.route(b);
    let answer = |decision: &str| {
        call(
            "pi-server.approvals",
            "answer",
            vec![Value::object(vec![
                ("id", Value::text("item-3")),
                ("decision", Value::text(decision)),
            ])],
        )
    };
    let refused = h.send_v8(b, "bad", route.clone(), answer("maybe"));
    assert!(!refused.iter().any(|o| matches!(o, Output::ToWorker { .. })));
    assert!(result_of(&h.v8_sent(b), "bad").contains("allow"));
    let outputs = h.send_v8(b, "yes", route.clone(), answer("always"));
    let sent = outputs.iter().find_map(|o| match o {
        Output::ToWorker {
            message: ToWorker::Operation { operation, .. },
            ..
        } => Some(operation.clone()),
        _ => None,
    });
    assert_eq!(
        sent,
        Some(Operation::Answer {
            id: "item-3".into(),
            decision: Decision::Always
        })
    );
    let policy = call(
        "pi-server.approvals",
        "setPolicy",
        vec![Value::object(vec![("policy", Value::text("read-only"))])],
    );
    let outputs = h.send_v8(b, "ro", route, policy);
    assert!(outputs.iter().any(|o| matches!(
        o,
        Output::ToWorker {
            message: ToWorker::Operation {
                operation: Operation::SetApprovals {
                    policy: Some(ApprovalPolicy::ReadOnly)
                },
                ..
            },
            ..
        }
    )));
}
