use super::*;
use crate::protocol::{
    ClientMessage, CommandResult, Content, ErrorCode, ModelRef, ProtocolError, Request, Response,
    ServerHello, ServerMessage, ServerSnapshot, SessionPhase, SessionSnapshot, ThinkingLevel,
    UserItem, decode_client_message, encode_server_message,
};
use crate::wire::CborLimits;
use crate::wire::frame::DEFAULT_MAX_FRAME_LEN;

/// The client machine, the server's side of its frames, and virtual time.
struct Harness {
    client: Client,
    now: Instant,
    /// What the client transmitted and the server has not read yet.
    sent: Vec<ClientMessage>,
    outputs: Vec<ClientOutput>,
    calls: u64,
}

fn server_snapshot(revision: u64) -> ServerSnapshot {
    ServerSnapshot {
        server_id: "01234567-89ab-4def-8123-456789abcdef".into(),
        protocol_version: 1,
        revision,
        sessions: Vec::new(),
        models: Vec::new(),
    }
}

fn session(revision: u64, phase: SessionPhase, prompts: &[&str]) -> SessionSnapshot {
    SessionSnapshot {
        id: "s1".into(),
        name: None,
        cwd: "/w".into(),
        created_at: 0,
        updated_at: 0,
        phase,
        model: ModelRef {
            provider: "p".into(),
            id: "m".into(),
        },
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision,
        transcript: prompts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                TranscriptItem::User(UserItem {
                    id: format!("item-{i}"),
                    content: vec![Content::Text {
                        text: (*text).to_owned(),
                    }],
                    timestamp: 0,
                })
            })
            .collect(),
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

impl Harness {
    fn new(reconnect: bool) -> Self {
        let config = ClientConfig {
            token: Some("secret".into()),
            reconnect,
            launch: false,
            limits: ClientLimits::default(),
        };
        Self {
            client: Client::new(config),
            now: Instant(0),
            sent: Vec::new(),
            outputs: Vec::new(),
            calls: 0,
        }
    }

    /// A harness whose first handshake completed.
    fn ready(reconnect: bool) -> Self {
        Self::ready_within(reconnect, ClientLimits::default())
    }

    /// [`Harness::ready`] under `limits`.
    fn ready_within(reconnect: bool, limits: ClientLimits) -> Self {
        let mut h = Self::new(reconnect);
        h.client.config.limits = limits;
        h.step(ClientInput::TransportUp);
        let hello = h.take_sent();
        assert_eq!(
            hello,
            vec![ClientMessage::Hello(ClientHello {
                version: 1,
                token: Some("secret".into())
            })]
        );
        h.server_hello("conn-1");
        h
    }

    fn step(&mut self, input: ClientInput) {
        let outputs = self.client.step(self.now, input);
        for output in &outputs {
            if let ClientOutput::Transmit(bytes) = output {
                let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
                let mut payloads = Vec::new();
                decoder.push(bytes, &mut payloads).unwrap();
                for payload in payloads {
                    self.sent
                        .push(decode_client_message(&payload, &CborLimits::default()).unwrap());
                }
            }
        }
        self.outputs.extend(outputs);
    }

    fn take_sent(&mut self) -> Vec<ClientMessage> {
        std::mem::take(&mut self.sent)
    }

    fn take_outputs(&mut self) -> Vec<ClientOutput> {
        std::mem::take(&mut self.outputs)
    }

    fn deliver(&mut self, message: ServerMessage) {
        let payload = encode_server_message(&message).unwrap();
        let frame = encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).unwrap();
        // Split, to show that framing is the machine's.
        let (a, b) = frame.split_at(3);
        self.step(ClientInput::Received(a.to_vec()));
        self.step(ClientInput::Received(b.to_vec()));
    }

    fn server_hello(&mut self, connection_id: &str) {
        self.deliver(ServerMessage::Hello(ServerHello {
            version: 1,
            connection_id: connection_id.into(),
            snapshot: server_snapshot(0),
        }));
    }

    fn call(&mut self, kind: Call) -> CallId {
        self.calls += 1;
        let call = CallId(self.calls);
        self.step(ClientInput::Call {
            call,
            call_kind: kind,
        });
        call
    }

    /// The one request the client sent since the last look.
    fn request(&mut self) -> Request {
        match self.take_sent().as_slice() {
            [ClientMessage::Request(request)] => request.clone(),
            other => panic!("expected one request, got {other:?}"),
        }
    }

    fn respond(&mut self, id: &str, outcome: Result<CommandResult, ProtocolError>) {
        self.deliver(ServerMessage::Response(Response {
            id: id.into(),
            outcome,
        }));
    }

    fn completion(&mut self, call: CallId) -> Option<Result<Completion, ClientError>> {
        self.outputs.iter().find_map(|o| match o {
            ClientOutput::Complete { call: c, result } if *c == call => Some(result.clone()),
            _ => None,
        })
    }

    /// Leases s1 exclusively and answers its attach with `snapshot`.
    fn lease(&mut self, snapshot: SessionSnapshot) -> LeaseId {
        let call = self.call(Call::Acquire {
            session_id: "s1".into(),
            mode: LeaseMode::Exclusive,
        });
        let attach = self.request();
        self.respond(&attach.id, Ok(CommandResult::Attach { session: snapshot }));
        match self.completion(call) {
            Some(Ok(Completion::Acquired { lease, .. })) => lease,
            other => panic!("expected a lease, got {other:?}"),
        }
    }

    fn prompt(&mut self, lease: LeaseId, text: &str) -> (CallId, Request) {
        let call = self.call(Call::Command {
            lease,
            command: SessionCommand::Prompt { text: text.into() },
        });
        (call, self.request())
    }

    /// Loses the transport (unless it is lost already), waits out the
    /// backoff and reconnects.
    fn reconnect(&mut self, connection_id: &str) {
        if self.client.is_ready() {
            self.step(ClientInput::TransportClosed {
                reason: "the server closed the connection".into(),
            });
            assert!(
                self.outputs
                    .iter()
                    .any(|o| matches!(o, ClientOutput::Status(Status::Reconnecting { .. })))
            );
        }
        let deadline = self.client.next_deadline().expect("a backoff deadline");
        self.now = deadline;
        self.step(ClientInput::Tick);
        assert!(self.outputs.contains(&ClientOutput::Connect));
        self.step(ClientInput::TransportUp);
        assert!(matches!(
            self.take_sent().as_slice(),
            [ClientMessage::Hello(_)]
        ));
        self.server_hello(connection_id);
        assert!(self.outputs.contains(&ClientOutput::Status(Status::Ready {
            connection_id: connection_id.into(),
            reconnected: true
        })));
    }
}

#[test]
fn handshake_then_matched_responses_and_cached_snapshots() {
    let mut h = Harness::ready(false);
    assert!(h.client.is_ready());
    assert_eq!(h.client.connection_id(), Some("conn-1"));
    assert_eq!(h.client.server_snapshot().unwrap().revision, 0);

    let list = h.call(Call::Request(Command::List));
    let attach = h.call(Call::Request(Command::Attach {
        session_id: "s1".into(),
    }));
    let sent = h.take_sent();
    let ids: Vec<String> = sent
        .iter()
        .map(|m| match m {
            ClientMessage::Request(r) => r.id.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ids, ["request-1", "request-2"]);
    // Out of order.
    h.respond(
        "request-2",
        Ok(CommandResult::Attach {
            session: session(4, SessionPhase::Idle, &[]),
        }),
    );
    h.respond(
        "request-1",
        Ok(CommandResult::List {
            sessions: Vec::new(),
        }),
    );
    assert!(matches!(
        h.completion(list),
        Some(Ok(Completion::Result(_)))
    ));
    assert!(matches!(
        h.completion(attach),
        Some(Ok(Completion::Result(_)))
    ));
    assert_eq!(h.client.session_snapshot("s1").unwrap().revision, 4);

    // An older snapshot does not replace a newer one, nor is it told (a
    // front end would follow it back in time).
    h.deliver(ServerMessage::Event(ServerEvent::SessionSnapshot {
        snapshot: session(3, SessionPhase::Turn, &[]),
    }));
    assert_eq!(h.client.session_snapshot("s1").unwrap().revision, 4);
    assert!(
        !h.outputs
            .iter()
            .any(|o| matches!(o, ClientOutput::Event(ServerEvent::SessionSnapshot { .. })))
    );
}

#[test]
fn a_mismatched_result_closes_without_reconnecting() {
    let mut h = Harness::ready(true);
    let call = h.call(Call::Request(Command::Attach {
        session_id: "s1".into(),
    }));
    let request = h.request();
    h.respond(
        &request.id,
        Ok(CommandResult::List {
            sessions: Vec::new(),
        }),
    );
    assert!(matches!(
        h.completion(call),
        Some(Err(ClientError::Protocol(_)))
    ));
    assert!(matches!(h.client.closed(), Some(ClientError::Protocol(_))));
    assert!(h.outputs.contains(&ClientOutput::CloseTransport));
    assert!(!h.outputs.contains(&ClientOutput::Connect));
    assert_eq!(h.client.next_deadline(), None);
}

#[test]
fn hello_error_and_handshake_timeout_end_the_first_connection() {
    let mut h = Harness::new(true);
    h.step(ClientInput::TransportUp);
    h.deliver(ServerMessage::HelloError(ProtocolError::new(
        ErrorCode::Auth,
        "bad token",
    )));
    assert!(matches!(h.client.closed(), Some(ClientError::Server(e)) if e.code == ErrorCode::Auth));

    let mut h = Harness::new(true);
    h.step(ClientInput::TransportUp);
    h.now = h.client.next_deadline().unwrap();
    h.step(ClientInput::Tick);
    match h.client.closed() {
        Some(ClientError::Disconnected(reason)) => {
            assert!(
                reason.contains("no hello from the server within 10000 ms"),
                "{reason}"
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(h.outputs.contains(&ClientOutput::CloseTransport));
}

#[test]
fn without_reconnect_a_lost_transport_fails_everything() {
    let mut h = Harness::ready(false);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    let (prompt, _) = h.prompt(lease, "hi");
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    assert!(matches!(
        h.completion(prompt),
        Some(Err(ClientError::Disconnected(reason))) if reason == "reset"
    ));
    assert_eq!(
        h.client.leases().status(lease),
        Some(LeaseStatus::Invalidated)
    );
}

#[test]
fn a_prompt_whose_turn_went_on_resolves_after_reconnecting() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    let (prompt, _) = h.prompt(lease, "hi");
    let list = h.call(Call::Request(Command::List));
    h.take_sent();
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    // The list cannot be known to have run: it fails, saying so.
    assert!(matches!(
        h.completion(list),
        Some(Err(ClientError::Disconnected(reason))) if reason.contains("reconnecting")
    ));
    assert_eq!(h.completion(prompt), None);
    // Commands during the outage fail at once.
    let steer = h.call(Call::Command {
        lease,
        command: SessionCommand::Steer { text: "x".into() },
    });
    assert!(matches!(
        h.completion(steer),
        Some(Err(ClientError::Disconnected(_)))
    ));
    h.take_outputs();

    h.reconnect("conn-2");
    let attach = h.request();
    assert_eq!(
        attach.command,
        Command::Attach {
            session_id: "s1".into()
        }
    );
    h.respond(
        &attach.id,
        Ok(CommandResult::Attach {
            session: session(5, SessionPhase::Turn, &["hi"]),
        }),
    );
    assert!(h.client.leases().is_active(lease));
    assert!(h.outputs.iter().any(|o| matches!(
        o,
        ClientOutput::Event(ServerEvent::SessionSnapshot { snapshot }) if snapshot.revision == 5
    )));
    assert_eq!(h.completion(prompt), None, "still running");
    h.deliver(ServerMessage::Event(ServerEvent::SessionSnapshot {
        snapshot: session(6, SessionPhase::Idle, &["hi"]),
    }));
    match h.completion(prompt) {
        Some(Ok(Completion::Session(snapshot))) => assert_eq!(snapshot.revision, 6),
        other => panic!("expected the prompt's final snapshot, got {other:?}"),
    }
    // Requests work on the new connection, in the same id space.
    h.call(Call::Request(Command::List));
    assert_eq!(h.request().id, "request-5");
}

/// A resumed prompt that ran waits for its session's idle snapshot; once
/// its lease is released (the session detached) none comes, so it ends as
/// lost rather than never (the lease swarm's front ends found it).
#[test]
fn a_resumed_prompt_ends_when_its_session_is_detached() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    let (prompt, _) = h.prompt(lease, "hi");
    h.take_sent();
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    h.take_outputs();
    h.reconnect("conn-2");
    let attach = h.request();
    h.respond(
        &attach.id,
        Ok(CommandResult::Attach {
            session: session(5, SessionPhase::Turn, &["hi"]),
        }),
    );
    assert_eq!(h.completion(prompt), None, "still running");
    let release = h.call(Call::Release {
        lease,
        kind: ReleaseKind::Dispose,
    });
    let detach = h.request();
    assert_eq!(
        detach.command,
        Command::Detach {
            session_id: "s1".into()
        }
    );
    h.respond(
        &detach.id,
        Ok(CommandResult::Detach {
            session_id: "s1".into(),
        }),
    );
    assert!(matches!(
        h.completion(release),
        Some(Ok(Completion::Released))
    ));
    assert!(matches!(
        h.completion(prompt),
        Some(Err(ClientError::Disconnected(reason))) if reason.contains("detached")
    ));
}

#[test]
fn a_prompt_the_server_never_took_fails_clearly_after_reconnecting() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &["earlier"]));
    let (prompt, _) = h.prompt(lease, "earlier");
    h.reconnect("conn-2");
    let attach = h.request();
    // The older identical message is before the prompt's base: not ours.
    h.respond(
        &attach.id,
        Ok(CommandResult::Attach {
            session: session(2, SessionPhase::Idle, &["earlier"]),
        }),
    );
    assert!(matches!(
        h.completion(prompt),
        Some(Err(ClientError::Disconnected(reason))) if reason.contains("before it took the prompt")
    ));
}

#[test]
fn a_session_removed_during_the_outage_invalidates_its_lease() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    let (prompt, _) = h.prompt(lease, "hi");
    h.reconnect("conn-2");
    let attach = h.request();
    h.respond(
        &attach.id,
        Err(ProtocolError::new(ErrorCode::NotFound, "Session not found")),
    );
    assert_eq!(
        h.client.leases().status(lease),
        Some(LeaseStatus::Invalidated)
    );
    assert!(matches!(
        h.completion(prompt),
        Some(Err(ClientError::Disconnected(reason))) if reason.contains("could not be re-attached")
    ));
}

#[test]
fn a_plain_attachment_is_restored_too() {
    let mut h = Harness::ready(true);
    h.call(Call::Request(Command::Attach {
        session_id: "s1".into(),
    }));
    let attach = h.request();
    h.respond(
        &attach.id,
        Ok(CommandResult::Attach {
            session: session(1, SessionPhase::Idle, &[]),
        }),
    );
    h.reconnect("conn-2");
    assert_eq!(
        h.request().command,
        Command::Attach {
            session_id: "s1".into()
        }
    );
}

/// A request about a session sent while its re-attachment is in flight
/// waits for the `attach` to be answered: the new server may take time to
/// attach (an orphan's adoption), and would refuse the prompt as not
/// attached if it came first.
#[test]
fn requests_wait_for_the_re_attachment_of_their_session() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    h.reconnect("conn-2");
    let reattach = h.request();
    assert!(matches!(reattach.command, Command::Attach { .. }));
    // A lease is not active until its session is attached again (the
    // reference client's rule): its commands fail at once, as they did.
    let call = h.call(Call::Command {
        lease,
        command: SessionCommand::Prompt {
            text: "early".into(),
        },
    });
    assert!(matches!(h.completion(call), Some(Err(_))));
    let prompt = h.call(Call::Request(Command::Prompt {
        session_id: "s1".into(),
        text: "go".into(),
    }));
    let plain = h.call(Call::Request(Command::Steer {
        session_id: "s1".into(),
        text: "also".into(),
    }));
    h.call(Call::Request(Command::List));
    assert!(
        matches!(h.take_sent().as_slice(), [ClientMessage::Request(r)] if r.command == Command::List),
        "only the request about another thing goes out"
    );
    h.respond(
        &reattach.id,
        Ok(CommandResult::Attach {
            session: session(2, SessionPhase::Idle, &[]),
        }),
    );
    let sent: Vec<Command> = h
        .take_sent()
        .into_iter()
        .map(|m| match m {
            ClientMessage::Request(r) => r.command,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        matches!(
            sent.as_slice(),
            [Command::Prompt { .. }, Command::Steer { .. }]
        ),
        "then the held ones, in order: {sent:?}"
    );
    assert!(h.completion(prompt).is_none() && h.completion(plain).is_none());
}

/// Held requests never reached a server: a lost transport fails them.
#[test]
fn held_requests_fail_when_the_transport_is_lost_again() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    h.reconnect("conn-2");
    let _reattach = h.request();
    let _ = lease;
    let call = h.call(Call::Request(Command::Steer {
        session_id: "s1".into(),
        text: "x".into(),
    }));
    assert!(h.take_sent().is_empty(), "held");
    assert!(h.completion(call).is_none());
    h.step(ClientInput::TransportClosed {
        reason: "gone again".into(),
    });
    assert!(
        matches!(h.completion(call), Some(Err(ClientError::Disconnected(_)))),
        "{:?}",
        h.completion(call)
    );
}

/// A client that can start its server does so when a reconnection finds
/// nothing listening, once per reconnection, and says so; a server that is
/// there but refuses is not started again.
#[test]
fn a_reconnection_that_finds_no_server_starts_one_once() {
    let mut h = Harness::ready(true);
    h.client.config.launch = true;
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    let mut launches = 0;
    for (absent, round) in [(false, 0), (true, 1), (true, 2), (true, 3)] {
        h.now = h.client.next_deadline().expect("backing off");
        h.step(ClientInput::Tick);
        h.take_outputs();
        h.step(ClientInput::ConnectFailed {
            reason: "connection refused".into(),
            absent,
        });
        let outputs = h.take_outputs();
        if outputs.contains(&ClientOutput::Launch) {
            launches += 1;
            assert_eq!(round, 1, "the first absent attempt starts it");
            assert!(outputs.iter().any(|o| matches!(
                o,
                ClientOutput::Status(Status::Reconnecting { reason }) if reason.contains("starting a server")
            )));
        }
    }
    assert_eq!(launches, 1);
    // Back, then lost again: a new reconnection may start it again.
    h.now = h.client.next_deadline().expect("backing off");
    h.step(ClientInput::Tick);
    h.step(ClientInput::TransportUp);
    h.server_hello("c2");
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    h.now = h.client.next_deadline().expect("backing off");
    h.step(ClientInput::Tick);
    h.take_outputs();
    h.step(ClientInput::ConnectFailed {
        reason: "no such socket".into(),
        absent: true,
    });
    assert!(h.take_outputs().contains(&ClientOutput::Launch));
}

#[test]
fn reconnection_backs_off_and_gives_up_after_its_window() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    let (prompt, _) = h.prompt(lease, "hi");
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    let mut delays = Vec::new();
    let mut last = h.now;
    while h.client.closed().is_none() {
        let deadline = h.client.next_deadline().expect("backing off");
        delays.push((deadline - last).as_millis());
        h.now = deadline;
        last = deadline;
        h.step(ClientInput::Tick);
        assert_eq!(h.outputs.last(), Some(&ClientOutput::Connect));
        h.step(ClientInput::ConnectFailed {
            reason: "connection refused".into(),
            absent: true,
        });
        assert!(
            !h.outputs.contains(&ClientOutput::Launch),
            "a client that cannot start its server does not try"
        );
    }
    assert_eq!(&delays[..6], &[50, 100, 200, 400, 800, 1000]);
    assert!(delays.iter().all(|&d| d <= 1000));
    assert!(h.now.as_millis() >= 30_000);
    match h.client.closed() {
        Some(ClientError::Disconnected(reason)) => {
            assert!(reason.contains("did not come back within 30 s"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        h.completion(prompt),
        Some(Err(ClientError::Disconnected(_)))
    ));
    assert_eq!(
        h.client.leases().status(lease),
        Some(LeaseStatus::Invalidated)
    );
    assert_eq!(h.client.next_deadline(), None);
}

#[test]
fn dispose_closes_and_fails_what_waits() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    let (prompt, _) = h.prompt(lease, "hi");
    h.step(ClientInput::Dispose);
    assert!(matches!(
        h.completion(prompt),
        Some(Err(ClientError::Disconnected(_)))
    ));
    assert!(h.outputs.contains(&ClientOutput::CloseTransport));
    // Later calls fail at once; nothing is sent.
    let list = h.call(Call::Request(Command::List));
    assert!(matches!(
        h.completion(list),
        Some(Err(ClientError::Disconnected(_)))
    ));
    assert!(h.take_sent().is_empty());
}

/// On a reconnection, a `hello_error` of the moment (the hello came after
/// the server's deadline, a hand-off is under way) is retried; one for good
/// (`auth`, `version`) ends the client.
#[test]
fn a_reconnection_retries_a_passing_hello_error_but_not_a_refusal() {
    let mut h = Harness::ready(true);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    h.now = h.client.next_deadline().expect("a backoff");
    h.step(ClientInput::Tick);
    h.step(ClientInput::TransportUp);
    h.take_sent();
    h.take_outputs();
    h.deliver(ServerMessage::HelloError(ProtocolError::new(
        ErrorCode::InvalidRequest,
        "Handshake timeout",
    )));
    assert_eq!(h.client.closed(), None, "not the end");
    assert!(h.outputs.contains(&ClientOutput::CloseTransport));
    assert!(
        h.client.next_deadline().is_some(),
        "it backs off and retries"
    );
    h.reconnect("conn-3");
    assert_eq!(
        h.request().command,
        Command::Attach {
            session_id: "s1".into()
        },
        "the lease re-attaches"
    );
    assert_eq!(h.client.leases().status(lease), Some(LeaseStatus::Active));

    h.step(ClientInput::TransportClosed {
        reason: "reset".into(),
    });
    h.now = h.client.next_deadline().expect("a backoff");
    h.step(ClientInput::Tick);
    h.step(ClientInput::TransportUp);
    h.deliver(ServerMessage::HelloError(ProtocolError::new(
        ErrorCode::Auth,
        "bad token",
    )));
    assert!(matches!(h.client.closed(), Some(ClientError::Server(e)) if e.code == ErrorCode::Auth));
}

/// A call past one of the client's own bounds is refused at once and sends
/// nothing; once calls complete (or sessions are let go), calls go again.
#[test]
fn calls_past_the_clients_bounds_are_refused_at_once() {
    let limits = ClientLimits {
        max_calls_in_flight: 2,
        max_sessions: 1,
        ..ClientLimits::default()
    };
    let mut h = Harness::ready_within(true, limits);
    let lease = h.lease(session(1, SessionPhase::Idle, &[]));
    // One session is held: attaching another is refused, nothing sent.
    let other = h.call(Call::Request(Command::Attach {
        session_id: "s2".into(),
    }));
    assert!(
        matches!(h.completion(other), Some(Err(ClientError::TooMany(m))) if m.contains("1 sessions are held"))
    );
    assert!(h.take_sent().is_empty());
    // Two calls outstanding: a third is refused, nothing sent.
    let first = h.call(Call::Request(Command::List));
    let list = h.request();
    h.prompt(lease, "hi");
    let third = h.call(Call::Request(Command::List));
    assert!(matches!(
        h.completion(third),
        Some(Err(ClientError::TooMany(m))) if m.contains("2 calls are outstanding")
    ));
    assert!(h.take_sent().is_empty());
    // The list is answered: the next call goes out.
    h.respond(&list.id, Ok(CommandResult::List { sessions: vec![] }));
    assert!(matches!(h.completion(first), Some(Ok(_))));
    let fourth = h.call(Call::Request(Command::List));
    assert_eq!(h.completion(fourth), None);
    assert!(matches!(h.request().command, Command::List));
}
