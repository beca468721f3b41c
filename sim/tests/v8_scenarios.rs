//! Protocol v8 clients in the simulated world, scripted: attach and detach
//! racing another client's attach, a worker crash mid-turn, a server
//! replacement, and a v1 and a v8 client on one session. Every checker
//! (the v8 ones included) runs after every action; each trace is an insta
//! snapshot in `snapshots/v8/`.

use kernel::chord::call::CallError;
use kernel::ids::ConnId;
use kernel::protocol::{Command, CommandResult, CreateParams, ServerEvent, ServerMessage};
use kernel::wire::Value;
use sim::checkers::Checkers;
use sim::checkers::busy::prompt_text;
use sim::world::v8::{AGENT, MANAGEMENT, MODELS, Route, TRANSCRIPT, V8Message, prompt_request};
use sim::world::{Amount, Delivery, Holds, Options, World};
use std::time::Duration;

/// A world and its checkers, judged after every action.
struct Run {
    w: World,
    checkers: Checkers,
}

impl Run {
    fn new(holds: Holds) -> Self {
        let w = World::new(Options {
            holds,
            record_facts: true,
            ..Options::default()
        });
        let mut run = Self {
            w,
            checkers: Checkers::new(),
        };
        run.check();
        run
    }

    /// Runs every checker on what happened since the last call.
    fn check(&mut self) {
        if let Err(v) = self.checkers.observe(&mut self.w) {
            panic!("{v}\ntrace:\n{}", self.w.trace_text());
        }
    }

    /// `f` on the world, then the checkers.
    fn act<T>(&mut self, f: impl FnOnce(&mut World) -> T) -> T {
        let out = f(&mut self.w);
        self.check();
        out
    }

    /// Delivers every held hop, oldest first, checking after each.
    fn deliver_all(&mut self) {
        while let Some((_, d)) = self.w.deliveries().into_iter().min() {
            self.act(|w| w.deliver(&d, Amount::All));
        }
    }

    /// Delivers the held hops that match, oldest first.
    fn deliver_where(&mut self, wanted: impl Fn(&Delivery) -> bool) {
        while let Some((_, d)) = self
            .w
            .deliveries()
            .into_iter()
            .filter(|(_, d)| wanted(d))
            .min()
        {
            self.act(|w| w.deliver(&d, Amount::All));
        }
    }

    /// Lets virtual time pass, checking after each deadline.
    fn advance(&mut self, d: Duration) {
        let until = self.w.now + d;
        while let Some(at) = self.w.next_event().filter(|at| *at <= until) {
            let step = Duration::from_millis(at.as_millis() - self.w.now.as_millis());
            self.act(|w| w.advance(step));
        }
        let rest = Duration::from_millis(until.as_millis() - self.w.now.as_millis());
        self.act(|w| w.advance(rest));
    }

    /// Runs until nothing is held and no deadline is pending.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            self.deliver_all();
            if !self.w.advance_to_next() {
                self.check();
                assert!(self.w.deliveries().is_empty());
                return;
            }
            self.check();
        }
        panic!("did not settle");
    }

    fn route(&self, conn: ConnId) -> Option<Route> {
        self.w.v8_client(conn).route.clone()
    }

    fn answer(&self, conn: ConnId, id: &str) -> Result<Option<Value>, CallError> {
        match self.w.v8_answer(conn, id) {
            Some(answer) => answer.clone(),
            None => panic!("{conn}: request {id} unanswered\n{}", self.w.trace_text()),
        }
    }

    fn ok(&self, conn: ConnId, id: &str) -> Option<Value> {
        self.answer(conn, id)
            .unwrap_or_else(|e| panic!("{conn}: {id} failed: {e:?}"))
    }

    fn err(&self, conn: ConnId, id: &str) -> String {
        match self.answer(conn, id) {
            Err(e) => e.code,
            Ok(v) => panic!("{conn}: {id} succeeded: {v:?}"),
        }
    }

    /// The entries of the client's transcript replica, by kind.
    fn entries(&self, conn: ConnId) -> Vec<String> {
        let state = self.w.v8_client(conn).state(TRANSCRIPT).expect("a replica");
        match state.get("entries") {
            Some(Value::Array(entries)) => entries
                .iter()
                .map(|e| match e.get("kind") {
                    Some(Value::Text(k)) => k.clone(),
                    _ => "?".into(),
                })
                .collect(),
            _ => panic!("no entries"),
        }
    }

    /// The client's transcript replica equals the kernel's state.
    fn replica_is_the_kernels(&self, conn: ConnId, session: &str) {
        let replica = self
            .w
            .v8_client(conn)
            .replica(TRANSCRIPT)
            .expect("a replica");
        let (sequence, value) = replica.state.as_ref().expect("a state");
        let kernel = self.w.server.v8_transcript(session).expect("kept");
        assert_eq!(*sequence, kernel.sequence());
        assert!(value.same_as(kernel.value()));
    }

    fn attach(&mut self, conn: ConnId, session: &str) -> String {
        self.act(|w| w.v8_server_call(conn, MANAGEMENT, "attach", vec![Value::text(session)]))
    }

    fn detach(&mut self, conn: ConnId) -> String {
        self.act(|w| w.v8_server_call(conn, MANAGEMENT, "detach", vec![]))
    }

    fn subscribe(&mut self, conn: ConnId, service: &str) -> String {
        self.act(|w| w.v8_subscribe(conn, service))
    }

    fn prompt(&mut self, conn: ConnId) -> String {
        let id = self.w.next_request_id(conn);
        let text = prompt_text(conn, &id, false);
        self.act(|w| w.v8_session_call(conn, AGENT, "prompt", vec![prompt_request(&text)]))
    }

    /// The operation id a prompt was given.
    fn operation(&self, conn: ConnId, prompt: &str) -> String {
        match self.ok(conn, prompt) {
            Some(result) => match result.get("operationId") {
                Some(Value::Text(op)) => op.clone(),
                other => panic!("prompt {prompt} not accepted: {other:?}"),
            },
            None => panic!("a void prompt answer"),
        }
    }

    fn wait_for(&mut self, conn: ConnId, op: &str) -> String {
        self.act(|w| w.v8_session_call(conn, AGENT, "waitForPrompt", vec![Value::text(op)]))
    }

    /// A session stored and not live, made by a v1 client that leaves.
    fn stored_session(&mut self) -> String {
        let c = self.act(World::connect_ready);
        let r = self.act(|w| w.request(c, Command::Create(CreateParams::default())));
        self.deliver_all();
        let s = self.w.created(c, &r);
        self.act(|w| w.disconnect(c));
        self.settle();
        assert!(self.w.worker_of(&s).is_none(), "disposed");
        s
    }

    fn snapshot(&self, name: &str) {
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/v8"));
        settings.set_prepend_module_to_snapshot(false);
        settings.bind(|| insta::assert_snapshot!(name, self.w.trace_text()));
    }
}

/// Two v8 clients attach one cold session at once (both wait for its one
/// worker, both are admitted when it boots, each with its own route). One
/// prompts; the other detaches mid-turn (`attachment null` before the
/// answer, no update of its old subscription after it), attaches again
/// mid-turn under a new route while the first detaches, and replicates the
/// rest of the turn from its new snapshot. Once both leave, the worker is
/// disposed.
#[test]
fn v8_01_attach_and_detach_race_another_attach() {
    let mut r = Run::new(Holds {
        boot: true,
        to_client: true,
        ..Holds::none()
    });
    let s = r.stored_session();
    let a = r.act(World::connect_v8);
    let b = r.act(World::connect_v8);
    r.deliver_all();
    let attach_a = r.attach(a, &s);
    let attach_b = r.attach(b, &s);
    // Both wait for the one worker's boot.
    assert_eq!(r.w.workers().len(), 1, "one worker for both");
    r.deliver_where(|d| matches!(d, Delivery::Boot(_)));
    r.deliver_all();
    assert_eq!(r.ok(a, &attach_a), None);
    assert_eq!(r.ok(b, &attach_b), None);
    let (ra, rb) = (r.route(a).unwrap(), r.route(b).unwrap());
    assert_eq!(ra.session_id, s);
    assert_ne!(ra.attachment_id, rb.attachment_id, "a route each");
    r.subscribe(a, TRANSCRIPT);
    r.subscribe(b, TRANSCRIPT);
    r.deliver_all();
    let p = r.prompt(b);
    r.deliver_all();
    let op = r.operation(b, &p);
    r.advance(Duration::from_millis(25));
    // `a` leaves mid-turn and comes back under a new route, while `b` leaves.
    let d = r.detach(a);
    r.deliver_all();
    assert_eq!(r.ok(a, &d), None);
    assert_eq!(r.route(a), None);
    assert!(
        r.w.v8_client(a).subs.is_empty(),
        "its session subscription ended with the route"
    );
    let again = r.attach(a, &s);
    let leave = r.detach(b);
    r.deliver_all();
    assert_eq!(r.ok(a, &again), None);
    assert_eq!(r.ok(b, &leave), None);
    let ra2 = r.route(a).unwrap();
    assert_ne!(ra2, ra, "a fresh attachment id");
    r.subscribe(a, TRANSCRIPT);
    r.deliver_all();
    let wait = r.wait_for(a, &op);
    r.settle();
    let done = r.ok(a, &wait).expect("a result");
    assert_eq!(done.get("status"), Some(&Value::text("done")));
    assert_eq!(r.entries(a), ["pi.user", "pi.assistant"]);
    r.replica_is_the_kernels(a, &s);
    // The worker stays while `a` is attached, and goes once it leaves.
    assert!(r.w.worker_of(&s).is_some());
    r.detach(a);
    r.settle();
    assert!(r.w.worker_of(&s).is_none(), "disposed once both left");
    r.snapshot("v8_01_attach_and_detach_race_another_attach");
}

/// A worker crash mid-turn, as a v8 client sees it: the calls in flight
/// fail (`select` with `internal_error`; `waitForPrompt` answers the
/// prompt unanswered), then `attachment null`; the connection stays. The
/// next attach spawns a new worker, under a new route, and the transcript
/// shows the interrupted reply.
#[test]
fn v8_02_worker_crash_mid_turn() {
    let mut r = Run::new(Holds {
        to_worker: true,
        ..Holds::none()
    });
    let c = r.act(World::connect_v8);
    let create = r.act(|w| w.v8_server_call(c, MANAGEMENT, "create", vec![Value::Null]));
    r.deliver_all();
    let s = match r.ok(c, &create).and_then(|v| v.get("sessionId").cloned()) {
        Some(Value::Text(s)) => s,
        other => panic!("create answered {other:?}"),
    };
    r.settle();
    r.attach(c, &s);
    r.deliver_all();
    let first = r.w.worker_of(&s).expect("a worker");
    r.subscribe(c, TRANSCRIPT);
    r.subscribe(c, MODELS);
    let p = r.prompt(c);
    r.deliver_all();
    let op = r.operation(c, &p);
    r.advance(Duration::from_millis(25));
    let wait = r.wait_for(c, &op);
    let model = kernel::faux::models()[1].clone();
    let select = r.act(|w| {
        let args = vec![Value::Map(vec![
            ("provider".into(), Value::text(&model.provider)),
            ("modelId".into(), Value::text(&model.id)),
        ])];
        w.v8_session_call(c, MODELS, "select", args)
    });
    assert!(
        r.w.v8_answer(c, &select).is_none(),
        "select waits at the worker"
    );
    r.act(|w| w.crash_worker(first));
    r.deliver_all();
    assert_eq!(r.err(c, &select), "internal_error");
    let unanswered = r.ok(c, &wait).expect("a result");
    assert_eq!(unanswered.get("status"), Some(&Value::text("unanswered")));
    assert_eq!(r.route(c), None, "attachment null");
    let received = &r.w.v8_client(c).received;
    let null = received
        .iter()
        .position(|m| *m == V8Message::Attachment(None))
        .expect("told");
    let failed = received
        .iter()
        .position(|m| matches!(m, V8Message::Response { id, .. } if *id == select))
        .expect("answered");
    assert!(failed < null, "the calls fail first, then the route goes");
    assert!(!r.w.client(c).closed, "the connection stays");
    let back = r.attach(c, &s);
    r.deliver_all();
    assert_eq!(r.ok(c, &back), None);
    let second = r.w.worker_of(&s).expect("a new worker");
    assert_ne!(second, first);
    r.subscribe(c, TRANSCRIPT);
    r.settle();
    let entries = r.entries(c);
    assert_eq!(
        entries,
        ["pi.user", "pi.assistant"],
        "the interrupted reply"
    );
    r.replica_is_the_kernels(c, &s);
    r.snapshot("v8_02_worker_crash_mid_turn");
}

/// A server replacement with a v8 client attached, its own prompt mid-turn
/// (a v1 client attached too): the old server closes both connections;
/// the v8 client reconnects, attaches again (the adopted worker, no new
/// one) under a new route, and replicates the turn's end. The old
/// server's operation id means nothing to the new one.
#[test]
fn v8_03_server_replacement() {
    let mut r = Run::new(Holds::none());
    let s = r.stored_session();
    let c = r.act(World::connect_v8);
    r.attach(c, &s);
    r.subscribe(c, TRANSCRIPT);
    let v1 = r.act(World::connect_ready);
    r.act(|w| {
        w.request(
            v1,
            Command::Attach {
                session_id: s.clone(),
            },
        )
    });
    let p = r.prompt(c);
    let op = r.operation(c, &p);
    r.advance(Duration::from_millis(25));
    let worker = r.w.worker_of(&s).expect("a worker");
    assert!(r.w.is_streaming(worker), "mid-turn");
    r.act(World::replace_server);
    assert!(
        r.w.client(c).closed,
        "the replaced server's clients are closed"
    );
    assert!(r.w.client(v1).closed);
    let c2 = r.act(World::connect_v8);
    let again = r.attach(c2, &s);
    assert_eq!(r.ok(c2, &again), None);
    assert_eq!(
        r.w.worker_count(),
        1,
        "the orphan was adopted, none spawned"
    );
    r.subscribe(c2, TRANSCRIPT);
    let stale = r.wait_for(c2, &op);
    assert_eq!(r.err(c2, &stale), "internal_error");
    r.settle();
    assert_eq!(r.entries(c2), ["pi.user", "pi.assistant"]);
    r.replica_is_the_kernels(c2, &s);
    r.snapshot("v8_03_server_replacement");
}

/// A v1 and a v8 client on one session: the v8 client replicates the v1
/// client's turn as ops; a session busy for one is busy for the other; the
/// v1 client sees the v8 client's turn; a removal ends the v8 client's
/// route before the remover is answered.
#[test]
fn v8_04_v1_and_v8_on_one_session() {
    let mut r = Run::new(Holds::none());
    let v1 = r.act(World::connect_ready);
    let create = r.act(|w| w.request(v1, Command::Create(CreateParams::default())));
    let s = r.w.created(v1, &create);
    let v8 = r.act(World::connect_v8);
    r.attach(v8, &s);
    r.subscribe(v8, TRANSCRIPT);
    let text = prompt_text(v1, &r.w.next_request_id(v1), false);
    let prompt = r.act(|w| {
        w.request(
            v1,
            Command::Prompt {
                session_id: s.clone(),
                text,
            },
        )
    });
    r.advance(Duration::from_millis(15));
    let busy = r.prompt(v8);
    let refused = r.ok(v8, &busy).expect("a result");
    assert_eq!(refused.get("accepted"), Some(&Value::Bool(false)));
    assert_eq!(
        refused.get("error").and_then(|e| e.get("code")),
        Some(&Value::text("busy"))
    );
    r.settle();
    assert!(matches!(
        r.w.response(v1, &prompt).map(|r| &r.outcome),
        Some(Ok(CommandResult::Prompt { .. }))
    ));
    assert_eq!(r.entries(v8), ["pi.user", "pi.assistant"]);
    let p = r.prompt(v8);
    let op = r.operation(v8, &p);
    let wait = r.wait_for(v8, &op);
    r.settle();
    let done = r.ok(v8, &wait).expect("a result");
    assert_eq!(done.get("status"), Some(&Value::text("done")));
    assert_eq!(
        r.entries(v8),
        ["pi.user", "pi.assistant", "pi.user", "pi.assistant"]
    );
    r.replica_is_the_kernels(v8, &s);
    let v1_saw = r.w.client(v1).received.iter().any(|m| {
        matches!(m, ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot })
            if snapshot.transcript.len() == 4)
    });
    assert!(v1_saw, "the v1 client saw the v8 client's turn");
    let remove = r.act(|w| {
        w.request(
            v1,
            Command::Remove {
                session_id: s.clone(),
            },
        )
    });
    r.settle();
    assert!(matches!(
        r.w.response(v1, &remove).map(|r| &r.outcome),
        Some(Ok(CommandResult::Remove { .. }))
    ));
    assert_eq!(r.route(v8), None, "the removal reached the v8 client");
    r.snapshot("v8_04_v1_and_v8_on_one_session");
}

/// Our own v8 client machine (`kernel::client::v8::Connection`, under the
/// terminal UI, `prompt` and `exec`) on a world connection, judged by every
/// checker: it attaches, prompts, loses its server to a replacement
/// mid-turn, reconnects on its own, attaches the session again, and its
/// replica, read as the items a front end draws, ends as the kernel's
/// state, the whole reply once. Every call completes exactly once.
#[test]
fn v8_05_our_client_machine_across_a_replacement() {
    use kernel::client::CallId;
    use kernel::client::v8::calls::{self, Outcome};
    use kernel::client::v8::connection::{
        Config, Connection, Input as In, Output as Out, Request, STATUS,
    };
    use kernel::client::v8::conversation::Conversation;
    use kernel::protocol::TranscriptItem;

    /// The machine on its connection, pumped by hand.
    struct Ours {
        conn: ConnId,
        client: Connection,
        answers: std::collections::BTreeMap<u64, Result<Option<Value>, String>>,
        /// Connections whose end was fed.
        lost: Vec<ConnId>,
        /// What a front end shows, told from each change as the hosts do.
        conversation: Conversation,
        follower: kernel::client::follow::Follower,
        told: String,
    }
    impl Ours {
        fn feed(&mut self, r: &mut Run, input: In) {
            let mut inputs = std::collections::VecDeque::from([input]);
            while let Some(input) = inputs.pop_front() {
                let outputs = self.client.step(r.w.now, input);
                self.client.invariants();
                for output in outputs {
                    match output {
                        Out::Transmit(bytes) => {
                            if !r.w.client(self.conn).closed {
                                r.act(|w| w.send_frame(self.conn, bytes));
                            }
                        }
                        Out::Connect => {
                            self.conn = r.act(World::connect_v8_tapped);
                            inputs.push_back(In::TransportUp);
                        }
                        Out::CloseTransport => r.act(|w| w.disconnect(self.conn)),
                        Out::Complete { call, result } => {
                            let first = self
                                .answers
                                .insert(call.0, result.map_err(|e| e.to_string()));
                            assert!(first.is_none(), "call {} completed twice", call.0);
                        }
                        Out::Changed(_) => self.tell(),
                        Out::Status(kernel::client::Status::Reconnecting { .. }) => {
                            self.follower.gap()
                        }
                        Out::Launch | Out::Status(_) => {}
                    }
                }
            }
        }
        /// Brings the conversation in step and tells what changed.
        fn tell(&mut self) {
            let Some(session) = self.client.route().map(|r| r.session_id.clone()) else {
                return;
            };
            let Some((_, from)) = self.conversation.follow(&self.client, &session) else {
                return;
            };
            for update in self.follower.tell(&self.conversation.items()[from..]) {
                if let kernel::client::follow::Update::Text { delta, .. } = update {
                    self.told.push_str(&delta);
                }
            }
        }
        /// Feeds what its connection read, its end, and a deadline due,
        /// until nothing more is there.
        fn pump(&mut self, r: &mut Run) {
            loop {
                let frames = r.w.take_read(self.conn);
                let mut fed = !frames.is_empty();
                if fed {
                    let bytes: Vec<u8> = frames.iter().flat_map(|f| f.bytes().to_vec()).collect();
                    self.feed(r, In::Received(bytes));
                }
                if r.w.client(self.conn).closed && !self.lost.contains(&self.conn) {
                    self.lost.push(self.conn);
                    self.feed(
                        r,
                        In::TransportClosed {
                            message: "closed".into(),
                        },
                    );
                    fed = true;
                }
                if self.client.next_deadline().is_some_and(|at| at <= r.w.now) {
                    self.feed(r, In::Tick);
                    fed = true;
                }
                if !fed {
                    return;
                }
            }
        }
        /// Delivers, pumps and lets time pass until nothing is left to do.
        fn settle(&mut self, r: &mut Run) {
            for _ in 0..10_000 {
                r.deliver_all();
                self.pump(r);
                if !r.w.deliveries().is_empty() {
                    continue;
                }
                let due = [r.w.next_event(), self.client.next_deadline()]
                    .into_iter()
                    .flatten()
                    .min();
                match due {
                    Some(at) if at > r.w.now => {
                        let d = Duration::from_millis(at.as_millis() - r.w.now.as_millis());
                        r.act(|w| w.advance(d));
                    }
                    Some(_) => r.act(|w| {
                        w.advance(Duration::ZERO);
                    }),
                    None => return,
                }
                self.pump(r);
                if r.w.deliveries().is_empty()
                    && r.w.next_event().is_none()
                    && self.client.next_deadline().is_none()
                {
                    return;
                }
            }
            panic!("did not settle\n{}", r.w.trace_text());
        }
        fn call(&mut self, r: &mut Run, n: u64, request: Request) {
            self.feed(
                r,
                In::Call {
                    call: CallId(n),
                    request,
                },
            );
        }
        fn items(&self) -> Vec<TranscriptItem> {
            let view = self
                .client
                .session_state(kernel::client::v8::connection::TRANSCRIPT)
                .expect("the transcript followed");
            Conversation::new(view).items().to_vec()
        }
    }

    let mut r = Run::new(Holds::none());
    let s = r.stored_session();
    let conn = r.act(World::connect_v8_tapped);
    let mut ours = Ours {
        conn,
        client: Connection::new(Config {
            server_id: sim::world::SERVER_ID.into(),
            follow: vec![STATUS],
            reconnect: true,
            launch: false,
            limits: Default::default(),
        }),
        answers: Default::default(),
        lost: Vec::new(),
        conversation: Conversation::default(),
        follower: kernel::client::follow::Follower::new(s.clone()),
        told: String::new(),
    };
    ours.feed(&mut r, In::TransportUp);
    ours.settle(&mut r);
    ours.call(&mut r, 1, Request::Attach(s.clone()));
    ours.settle(&mut r);
    assert_eq!(
        ours.answers.get(&1),
        Some(&Ok(None)),
        "attached\n{}",
        r.w.trace_text()
    );
    // A v1 client keeps the session live across the replacement.
    let v1 = r.act(World::connect_ready);
    r.act(|w| {
        w.request(
            v1,
            Command::Attach {
                session_id: s.clone(),
            },
        )
    });
    r.deliver_all();

    let prompt = kernel::client::front::Request::Prompt("across the replacement".into());
    ours.call(&mut r, 2, calls::request_of(&s, &prompt));
    for _ in 0..20 {
        r.deliver_all();
        ours.pump(&mut r);
    }
    let admitted = ours
        .answers
        .get(&2)
        .cloned()
        .expect("admitted")
        .expect("ok");
    let Outcome::Wait(wait) = calls::outcome_of(&prompt, Ok(admitted)) else {
        panic!("the prompt was not admitted")
    };
    ours.call(&mut r, 3, wait);
    r.advance(Duration::from_millis(25));
    ours.pump(&mut r);
    let worker = r.w.worker_of(&s).expect("a worker");
    assert!(r.w.is_streaming(worker), "mid-turn");
    r.act(World::replace_server);
    ours.settle(&mut r);

    // The wait was cut off with its connection; the replica says the turn ended.
    assert!(
        matches!(ours.answers.get(&3), Some(Err(e)) if e.contains("disconnected")),
        "{:?}",
        ours.answers.get(&3)
    );
    assert_eq!(
        ours.client.route().map(|r| r.session_id.clone()),
        Some(s.clone()),
        "attached again; closed: {:?}\n{}",
        ours.client.closed(),
        r.w.trace_text()
    );
    let view = ours
        .client
        .session_state(kernel::client::v8::connection::TRANSCRIPT)
        .expect("followed again");
    let kernel = r.w.server.v8_transcript(&s).expect("kept");
    assert!(
        view.same_as(kernel.value()),
        "the replica is the kernel's state"
    );
    let items = ours.items();
    let conversation = Conversation::new(view);
    assert!(conversation.settled(0, "across the replacement"));
    let replies: Vec<_> = items
        .iter()
        .filter(|i| matches!(i, TranscriptItem::Assistant(_)))
        .collect();
    assert_eq!(replies.len(), 1, "{items:#?}");
    let TranscriptItem::Assistant(reply) = replies[0] else {
        unreachable!()
    };
    assert_eq!(
        ours.told,
        kernel::client::follow::text_of(&reply.content),
        "the reply told once, whole, across the replacement\n{}",
        r.w.trace_text()
    );
    assert_eq!(ours.answers.len(), 3, "every call answered once");
}
