//! Client machines in the world, and the lease swarm that drives them.
//!
//! A [`Machine`] hosts the real client-connection machine
//! (`kernel::client::Client`, the one under the CLI, the terminal UI and the
//! ACP adapter) on a world connection: its `Transmit` bytes are a client's
//! writes, the frames that connection reads are its `Received` input, and a
//! `Connect` opens a new connection. So the lease and reconnect rules run
//! against the real server under the world's held deliveries and faults.
//!
//! [`run`] is the lease swarm: from one seed, one to three machines create,
//! lease, command and release sessions while the network reorders and
//! delays every hop, servers are replaced (hand-off) or crash and restart
//! (some keeping their workers as orphans for a while), a sibling server
//! writes sessions into the shared directory, machines remove sessions
//! (leased ones too), plain attaches come and go, connections drop, and
//! reconnections are lost again before or right after their hello. Then
//! faults stop and everything must settle.
//! Besides every world checker (their facts include the machines'
//! requests), it judges the client side:
//!
//! - every call completes exactly once, and none is left outstanding once
//!   the run settles;
//! - a prompt that succeeds answers with an idle snapshot holding its text
//!   (also when it resolved across a reconnection);
//! - a granted lease is new, and a released one is gone;
//! - once settled, every machine that is connected is attached, on the
//!   server, to each session one of its active leases holds, and its cached
//!   snapshot of it is the server's latest revision; each plain attachment
//!   of a stored session is attached, or was asked for on this connection;
//! - each outage reconnects afresh: the first retry within the initial
//!   backoff, the window counted from that loss;
//! - a follower per followed session (the machine's reader falls behind in
//!   a third of the seeds, losing events and telling its followers of the
//!   gap) tells reply text that the cached snapshot's extends, or cuts;
//! - in a third of the seeds, a front end per leased session types lines
//!   into the real `Front` ([`crate::typist`]): none is lost or taken twice.
//!
//! A failing seed replays with its trace:
//! `cargo run -p sim --example lease_seed -- SEED [STEPS]`.

use crate::checkers::{self, Checkers, Violation};
use crate::prng::{Prng, Ratio};
use crate::typist::{self, Lines, Typist};
use crate::world::{Amount, Holds, Options, World};
use kernel::client::follow::{Follower, Update};
use kernel::client::front::{self, Input as FrontInput, Output as FrontOutput, Request};
use kernel::client::{
    Call, CallId, Client, ClientConfig, ClientError, ClientInput, ClientOutput, Completion,
    LeaseId, LeaseMode, LeaseStatus, ReleaseKind, SessionCommand, Status,
};
use kernel::ids::ConnId;
use kernel::protocol::{
    Command, Content, CreateParams, ServerEvent, ServerMessage, SessionPhase, ThinkingLevel,
    TranscriptItem,
};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// A broken client-side rule.
fn violation(message: String) -> Violation {
    Violation::new("machines", message)
}

/// One client machine on the world.
pub struct Machine {
    /// Its name in messages (`m1`, `m2`, …).
    pub name: String,
    /// The machine under test.
    pub client: Client,
    /// Its current connection, while it has one.
    pub conn: Option<ConnId>,
    next_call: u64,
    /// Calls not completed yet, with what they asked.
    pub outstanding: BTreeMap<CallId, Call>,
    /// Leases granted and not released: lease → session.
    pub leases: BTreeMap<LeaseId, String>,
    /// Sessions a plain `attach` attached (no lease), not detached since.
    pub plain: std::collections::BTreeSet<String>,
    /// Sessions whose plain `attach`, `detach` or `remove` failed with the
    /// connection: the server may or may not have taken it.
    unsure: std::collections::BTreeSet<String>,
    /// Sessions it sent an `attach` of on the current connection (a
    /// re-attachment the server may refuse, as it may any attach).
    attach_sent: std::collections::BTreeSet<String>,
    /// The `attach` requests on the current connection not answered yet:
    /// id → session.
    attach_ids: BTreeMap<String, String>,
    /// The revision of each leased session's cached snapshot, as last seen
    /// on the current connection (judged from outside the machine: it
    /// never goes back within a connection).
    cached: BTreeMap<String, u64>,
    /// `session_snapshot` frames read on the current connection (the
    /// newest few, with their session and revision), which a replay fault
    /// delivers again once a newer revision of their session was read.
    snapshot_frames: VecDeque<(String, u64, Vec<u8>)>,
    /// The newest revision read of each session on the current connection.
    newest: BTreeMap<String, u64>,
    /// Delivers an old snapshot frame again with this probability per pump
    /// (a generator of its own, so other seeds keep their runs).
    replay: Option<(Prng, Ratio)>,
    /// A transcript follower per session it follows, leased or plainly
    /// attached (what a front end would show), with the reply text each
    /// told per assistant item.
    followers: BTreeMap<String, (Follower, BTreeMap<String, String>)>,
    /// Its front end's reader falls behind with this probability per
    /// event (a generator of its own): the events it misses are lost, and
    /// it tells its followers of the gap, as a host does on `Lagged`.
    lagging: Option<(Prng, Ratio)>,
    /// Events still to lose in the current lag.
    lag_left: u64,
    /// A reconnection's transport is lost again with this probability,
    /// before its hello is answered or right after (a generator of its own).
    flaky: Option<(Prng, Ratio)>,
    /// When the current outage began (a `Reconnecting` status after a
    /// handshake succeeded), until the next handshake succeeds.
    outage: Option<kernel::time::Instant>,
    /// Its front ends type a line with this probability per step (a
    /// generator of its own); `None`: no front ends.
    typing: Option<(Prng, Ratio)>,
    /// A front end per leased session, while typing.
    typists: BTreeMap<String, Typist>,
    /// What became of every line typed.
    pub lines: Lines,
    /// Calls made for a front: call → (session, the front's call, request).
    front_calls: BTreeMap<CallId, (String, u64, Request)>,
    /// Inputs for the front ends not given yet, by session.
    front_inbox: VecDeque<(String, FrontInput)>,
    /// The front ends are being given their inputs (no nested round).
    draining: bool,
    /// Counters.
    pub stats: MachineStats,
}

/// What a machine did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MachineStats {
    /// Calls made.
    pub calls: u64,
    /// Calls that succeeded.
    pub ok: u64,
    /// Calls that failed with `Disconnected`.
    pub disconnected: u64,
    /// Calls that failed otherwise.
    pub failed: u64,
    /// Transports opened after the first.
    pub reconnects: u64,
    /// Prompts that succeeded.
    pub prompts_done: u64,
    /// Stale snapshot frames delivered again.
    pub replays: u64,
    /// Times its reader fell behind and lost events.
    pub lags: u64,
    /// Reconnections lost again before or right after their hello.
    pub flakes: u64,
    /// Lines typed into its front ends.
    pub typed: u64,
    /// Failed calls by kind (`busy`, `detached`, `disconnected`, …).
    pub errors: BTreeMap<String, u64>,
}

impl MachineStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &MachineStats) {
        self.calls += other.calls;
        self.ok += other.ok;
        self.disconnected += other.disconnected;
        self.failed += other.failed;
        self.reconnects += other.reconnects;
        self.prompts_done += other.prompts_done;
        self.replays += other.replays;
        self.lags += other.lags;
        self.flakes += other.flakes;
        self.typed += other.typed;
        for (kind, n) in &other.errors {
            *self.errors.entry(kind.clone()).or_insert(0) += n;
        }
    }
}

impl Machine {
    /// A machine connected to the world's server (reconnecting after a loss).
    pub fn connect(world: &mut World, name: &str) -> Result<Self, Violation> {
        let token = world.options().token.clone();
        Self::connect_with(world, name, token)
    }

    /// [`Machine::connect`] saying `token` in its hellos.
    pub fn connect_with(
        world: &mut World,
        name: &str,
        token: Option<String>,
    ) -> Result<Self, Violation> {
        Self::connect_limited(world, name, token, Default::default())
    }

    /// [`Machine::connect_with`] under `limits`.
    pub fn connect_limited(
        world: &mut World,
        name: &str,
        token: Option<String>,
        limits: kernel::limits::ClientLimits,
    ) -> Result<Self, Violation> {
        let conn = world.connect_tapped();
        let config = ClientConfig {
            token,
            reconnect: true,
            launch: false,
            limits,
        };
        let mut machine = Self {
            name: name.to_owned(),
            client: Client::new(config),
            conn: Some(conn),
            next_call: 1,
            outstanding: BTreeMap::new(),
            leases: BTreeMap::new(),
            plain: Default::default(),
            unsure: Default::default(),
            attach_sent: Default::default(),
            attach_ids: BTreeMap::new(),
            cached: BTreeMap::new(),
            snapshot_frames: VecDeque::new(),
            newest: BTreeMap::new(),
            replay: None,
            outage: None,
            followers: BTreeMap::new(),
            lagging: None,
            lag_left: 0,
            flaky: None,
            typing: None,
            typists: BTreeMap::new(),
            lines: Lines::default(),
            front_calls: BTreeMap::new(),
            front_inbox: VecDeque::new(),
            draining: false,
            stats: MachineStats::default(),
        };
        machine.feed(world, ClientInput::TransportUp)?;
        Ok(machine)
    }

    /// Whether this reconnection's transport is lost again now.
    fn flake(&mut self) -> bool {
        let flaked = self
            .flaky
            .as_mut()
            .is_some_and(|(prng, ratio)| prng.chance(*ratio));
        self.stats.flakes += u64::from(flaked);
        flaked
    }

    /// Whether `session_id` is leased, may be, or is about to be (a create
    /// under way leases a session not yet named): no plain attach then.
    fn leased(&self, session_id: &str) -> bool {
        self.unsure.contains(session_id)
            || self.leases.values().any(|l| l == session_id)
            || self.outstanding.values().any(|c| match c {
                Call::Create(_) => true,
                Call::Acquire { session_id: s, .. } => s == session_id,
                _ => false,
            })
    }

    /// Whether `session_id` is plainly attached, may be, or is being.
    fn plainly_attached(&self, session_id: &str) -> bool {
        self.plain.contains(session_id)
            || self.unsure.contains(session_id)
            || self.outstanding.values().any(|c| {
                matches!(c, Call::Request(Command::Attach { session_id: s }) if s == session_id)
            })
    }

    /// Makes `call`.
    pub fn call(&mut self, world: &mut World, call_kind: Call) -> Result<(), Violation> {
        let call = CallId(self.next_call);
        self.next_call += 1;
        self.stats.calls += 1;
        self.outstanding.insert(call, call_kind.clone());
        self.feed(world, ClientInput::Call { call, call_kind })
    }

    /// Feeds what happened on its connection since the last pump: frames
    /// read, the connection's end, a deadline that passed.
    pub fn pump(&mut self, world: &mut World) -> Result<(), Violation> {
        if let Some(conn) = self.conn {
            for frame in world.take_read(conn) {
                let bytes = frame.bytes().into_owned();
                let message = server_message(&bytes);
                if self.replay.is_some()
                    && let Some(ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot })) =
                        &message
                {
                    let (session, revision) = (snapshot.id.clone(), snapshot.revision);
                    let newest = self.newest.entry(session.clone()).or_insert(revision);
                    *newest = (*newest).max(revision);
                    if self.snapshot_frames.len() == 8 {
                        self.snapshot_frames.pop_front();
                    }
                    self.snapshot_frames
                        .push_back((session, revision, bytes.clone()));
                }
                // A refused attach ends a plain attachment (a re-attachment
                // the server refused is not asked again).
                if let Some(ServerMessage::Response(response)) = &message
                    && let Some(session_id) = self.attach_ids.remove(&response.id)
                    && response.outcome.is_err()
                {
                    self.plain.remove(&session_id);
                }
                self.feed(world, ClientInput::Received(bytes))?;
            }
            // Only a frame older than what was read since: the same
            // revision again is no stale news (and no server resends it).
            // Nor while an attach of its session is on its way: the server
            // sends a session nothing between a detach and the next attach's
            // answer, and the client takes that answer whatever its revision.
            let attaching = |session: &String| self.attach_ids.values().any(|s| s == session);
            let stale: Vec<usize> = (0..self.snapshot_frames.len())
                .filter(|i| {
                    let (session, revision, _) = &self.snapshot_frames[*i];
                    self.newest.get(session).is_some_and(|n| revision < n) && !attaching(session)
                })
                .collect();
            if let Some((prng, ratio)) = self.replay.as_mut()
                && !stale.is_empty()
                && prng.chance(*ratio)
            {
                let i = stale[prng.below(stale.len() as u64) as usize];
                let frame = self.snapshot_frames[i].2.clone();
                self.stats.replays += 1;
                self.feed(world, ClientInput::Received(frame))?;
            }
            if self.conn == Some(conn) && world.client(conn).closed {
                self.conn = None;
                let reason = "the connection ended".to_owned();
                self.feed(world, ClientInput::TransportClosed { reason })?;
            }
        }
        if self
            .client
            .next_deadline()
            .is_some_and(|at| at <= world.now)
        {
            self.feed(world, ClientInput::Tick)?;
        }
        Ok(())
    }

    /// The network drops its connection.
    pub fn drop_connection(&mut self, world: &mut World) {
        if let Some(conn) = self.conn {
            world.disconnect(conn);
        }
    }

    fn feed(&mut self, world: &mut World, input: ClientInput) -> Result<(), Violation> {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let outputs = self.client.step(world.now, input);
            self.check_reconnection(world, &outputs)?;
            self.tell_fronts_of_link(&outputs);
            for output in outputs {
                match output {
                    ClientOutput::Transmit(bytes) => {
                        if let Some((id, session_id)) = attach_of(&bytes) {
                            self.attach_sent.insert(session_id.clone());
                            self.attach_ids.insert(id, session_id);
                        }
                        if let Some(conn) = self.conn.filter(|c| !world.client(*c).closed) {
                            world.send_frame(conn, bytes);
                        }
                    }
                    ClientOutput::Connect => {
                        self.attach_sent.clear();
                        self.attach_ids.clear();
                        self.cached.clear();
                        self.snapshot_frames.clear();
                        self.newest.clear();
                        let conn = world.connect_tapped();
                        self.conn = Some(conn);
                        self.stats.reconnects += 1;
                        inputs.push_back(ClientInput::TransportUp);
                        if self.flake() {
                            // Lost again before the server answers its hello.
                            world.disconnect(conn);
                        }
                    }
                    ClientOutput::Status(Status::Ready {
                        reconnected: true, ..
                    }) if self.flake() => {
                        // Lost right after the reconnection succeeded.
                        if let Some(conn) = self.conn {
                            world.disconnect(conn);
                        }
                    }
                    ClientOutput::CloseTransport => {
                        if let Some(conn) = self.conn.take() {
                            world.disconnect(conn);
                        }
                    }
                    ClientOutput::Complete { call, result } => self.complete(call, result)?,
                    ClientOutput::Event(event) => self.follow(&event),
                    ClientOutput::Status(Status::Reconnecting { .. }) => self.gap(),
                    // These machines never launch their server (`launch: false`).
                    ClientOutput::Status(_) | ClientOutput::Launch => {}
                }
            }
            self.check_cache()?;
            self.check_followers()?;
        }
        if !self.draining {
            self.drain_fronts(world)?;
        }
        Ok(())
    }

    /// The connection's changes, for every front end.
    fn tell_fronts_of_link(&mut self, outputs: &[ClientOutput]) {
        for output in outputs {
            let link = match output {
                ClientOutput::Status(Status::Ready { .. }) => front::Link::Up,
                ClientOutput::Status(Status::Reconnecting { .. }) => front::Link::Reconnecting,
                ClientOutput::Status(Status::Closed { .. }) => front::Link::Closed,
                _ => continue,
            };
            for session_id in self.typists.keys() {
                self.front_inbox
                    .push_back((session_id.clone(), FrontInput::Link(link)));
            }
        }
    }

    /// Gives the front ends their inputs (the session's news first) and
    /// carries out what they decide, until none is left.
    fn drain_fronts(&mut self, world: &mut World) -> Result<(), Violation> {
        self.draining = true;
        loop {
            for (session_id, typist) in &mut self.typists {
                if let Some(news) = typist.session_news(self.client.session_snapshot(session_id)) {
                    self.front_inbox.push_back((session_id.clone(), news));
                }
            }
            let Some((session_id, input)) = self.front_inbox.pop_front() else {
                break;
            };
            let Some(typist) = self.typists.get_mut(&session_id) else {
                continue;
            };
            let outputs = typist.front.step(input);
            let lease = typist.lease;
            for output in outputs {
                self.lines.output(&output);
                let FrontOutput::Send {
                    call: front_call,
                    request,
                    ..
                } = output
                else {
                    continue;
                };
                let command = match &request {
                    Request::Prompt(text) => SessionCommand::Prompt { text: text.clone() },
                    Request::Steer(text) => SessionCommand::Steer { text: text.clone() },
                    Request::Abort => SessionCommand::Abort,
                    other => {
                        self.draining = false;
                        return Err(violation(format!(
                            "{}: its front sent {other:?}, though no command was typed",
                            self.name
                        )));
                    }
                };
                let call = CallId(self.next_call);
                self.front_calls
                    .insert(call, (session_id.clone(), front_call, request));
                self.call(world, Call::Command { lease, command })?;
            }
        }
        self.draining = false;
        Ok(())
    }

    /// A front end types a line into one of its sessions, or asks for an
    /// abort (one time in six), with the typing probability.
    pub fn type_something(&mut self, world: &mut World) -> Result<(), Violation> {
        let Some((prng, ratio)) = self.typing.as_mut() else {
            return Ok(());
        };
        if self.typists.is_empty() || !prng.chance(*ratio) {
            return Ok(());
        }
        let i = prng.below(self.typists.len() as u64) as usize;
        let abort = prng.below(6) == 0;
        let session_id = self.typists.keys().nth(i).expect("in range").clone();
        let input = if abort {
            FrontInput::Abort
        } else {
            let text = format!("{}-t{}", self.name, self.lines.len() + 1);
            self.lines.typed(&session_id, &text);
            self.stats.typed += 1;
            FrontInput::Typed(text)
        };
        self.front_inbox.push_back((session_id, input));
        self.drain_fronts(world)
    }

    /// A front end starts following `session_id` once attached: from the
    /// cached snapshot, all of it told (a `session/load`, a terminal
    /// attaching); it stops when it lets the session go.
    fn start_following(&mut self, session_id: &str) {
        if self.followers.contains_key(session_id) {
            return;
        }
        let mut follower = Follower::new(session_id);
        let mut told: BTreeMap<String, String> = BTreeMap::new();
        if let Some(snapshot) = self.client.session_snapshot(session_id) {
            note_told(&mut told, follower.replay(snapshot));
        }
        self.followers
            .insert(session_id.to_owned(), (follower, told));
    }

    /// Stops following `session_id` unless a lease or a plain attachment
    /// still holds it.
    fn stop_following(&mut self, session_id: &str) {
        let held = self.plain.contains(session_id) || self.leases.values().any(|s| s == session_id);
        if !held {
            self.followers.remove(session_id);
        }
    }

    /// Tells `event` to its session's follower, noting the reply text told.
    fn follow(&mut self, event: &ServerEvent) {
        if self.lag_left == 0
            && let Some((prng, ratio)) = self.lagging.as_mut()
            && prng.chance(*ratio)
        {
            self.lag_left = prng.range_inclusive(1, 6);
            self.stats.lags += 1;
        }
        if self.lag_left > 0 {
            self.lag_left -= 1;
            if self.lag_left == 0 {
                self.gap();
            }
            return;
        }
        let session_id = match event {
            ServerEvent::SessionSnapshot { snapshot } => &snapshot.id,
            ServerEvent::SessionProgress { session_id, .. } => session_id,
            // A front end stops following a removed session (a sibling
            // server may write another under its id).
            ServerEvent::SessionRemoved { session_id } => {
                self.followers.remove(session_id);
                return;
            }
            ServerEvent::ServerSnapshot { .. } => return,
        };
        // Only sessions it follows: attached (a lease or a plain attach).
        let Some((follower, told)) = self.followers.get_mut(session_id) else {
            return;
        };
        note_told(told, follower.on_event(event));
    }

    /// Progress may have been lost: every follower is told of the gap.
    fn gap(&mut self) {
        for (follower, _) in self.followers.values_mut() {
            follower.gap();
        }
    }

    /// What a follower told of a reply and the reply's text in the cached
    /// snapshot agree: one is a prefix of the other (DESIGN.md, `Follower`:
    /// text is told in order, once, with no hole, never from deltas of a
    /// reply joined mid-way or across a gap; a reply cut back by a worker's
    /// crash may hold less than was told).
    fn check_followers(&self) -> Result<(), Violation> {
        for (session_id, (_, told)) in &self.followers {
            let Some(snapshot) = self.client.session_snapshot(session_id) else {
                continue;
            };
            for item in &snapshot.transcript {
                let TranscriptItem::Assistant(reply) = item else {
                    continue;
                };
                let Some(told) = told.get(&reply.id) else {
                    continue;
                };
                let text = kernel::client::follow::text_of(&reply.content);
                if !text.starts_with(told.as_str()) && !told.starts_with(&text) {
                    return Err(violation(format!(
                        "{}: its follower told {told:?} of reply {} in {session_id}, \
                         which holds {text:?}",
                        self.name, reply.id
                    )));
                }
            }
        }
        Ok(())
    }

    /// Each outage is a fresh reconnection (DESIGN.md, `Client`): a
    /// successful handshake resets the backoff, so the first attempt after a
    /// loss waits at most the initial delay, and the window counts from that
    /// loss, not from an earlier one.
    fn check_reconnection(
        &mut self,
        world: &World,
        outputs: &[ClientOutput],
    ) -> Result<(), Violation> {
        let limits = kernel::limits::ClientLimits::default();
        let now = world.now;
        for output in outputs {
            match output {
                ClientOutput::Status(Status::Ready { .. }) => self.outage = None,
                ClientOutput::Status(Status::Reconnecting { reason }) => {
                    self.outage = Some(now);
                    let first = now + limits.reconnect_backoff_initial;
                    if self.client.next_deadline().is_none_or(|at| at > first) {
                        return Err(violation(format!(
                            "{}: lost its connection at {now} ({reason}) and retries at {:?}, \
                             later than the first backoff ({} ms) allows",
                            self.name,
                            self.client.next_deadline(),
                            limits.reconnect_backoff_initial.as_millis()
                        )));
                    }
                }
                ClientOutput::Status(Status::Closed {
                    error: ClientError::Disconnected(why),
                }) if why.contains("did not come back") => {
                    let since = self.outage.unwrap_or(now);
                    if now.saturating_since(since) < limits.reconnect_window {
                        return Err(violation(format!(
                            "{}: gave up at {now} on an outage that began at {since}, \
                             within the reconnection window: {why}",
                            self.name
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The cached snapshot of every leased session never goes back in
    /// revision while one connection lasts (DESIGN.md, `Client`).
    fn check_cache(&mut self) -> Result<(), Violation> {
        for session in self.leases.values() {
            let Some(snapshot) = self.client.session_snapshot(session) else {
                continue;
            };
            let seen = self
                .cached
                .entry(session.clone())
                .or_insert(snapshot.revision);
            if snapshot.revision < *seen {
                return Err(violation(format!(
                    "{}: the cached snapshot of {session} went back from revision {} to {} \
                     within one connection",
                    self.name, *seen, snapshot.revision
                )));
            }
            *seen = snapshot.revision;
        }
        Ok(())
    }

    /// Judges one completion against what the call asked.
    fn complete(
        &mut self,
        call: CallId,
        result: Result<Completion, ClientError>,
    ) -> Result<(), Violation> {
        let name = &self.name;
        let Some(asked) = self.outstanding.remove(&call) else {
            return Err(violation(format!(
                "{name}: call {call} completed twice, or was never made: {result:?}"
            )));
        };
        if let Some((session_id, front_call, request)) = self.front_calls.remove(&call) {
            let snapshot = match &result {
                Ok(Completion::Session(snapshot)) => Ok(Some(&**snapshot)),
                Ok(_) => Ok(None),
                Err(e) => Err(e.clone()),
            };
            let outcome = typist::answer(&request, snapshot);
            self.lines.answered(&request, outcome.is_ok());
            let answered = FrontInput::Answered {
                call: front_call,
                outcome,
            };
            self.front_inbox.push_back((session_id, answered));
        }
        match &result {
            Err(ClientError::Disconnected(_)) => self.stats.disconnected += 1,
            Err(_) => self.stats.failed += 1,
            Ok(_) => self.stats.ok += 1,
        }
        if let Err(e) = &result {
            let kind = match e {
                ClientError::Server(e) => e.code.as_str().to_owned(),
                ClientError::Transport { .. } => "transport".to_owned(),
                ClientError::TooMany(_) => "too many".to_owned(),
                ClientError::Protocol(_) => "protocol".to_owned(),
                ClientError::Disconnected(_) => "disconnected".to_owned(),
                ClientError::Ownership { .. } => "ownership".to_owned(),
                ClientError::Detached { .. } => "detached".to_owned(),
            };
            *self
                .stats
                .errors
                .entry(format!("{} {kind}", call_name(&asked)))
                .or_insert(0) += 1;
        }
        match (asked, result) {
            (Call::Acquire { .. } | Call::Create(_), Ok(completion)) => {
                let Completion::Acquired { lease, session_id } = completion else {
                    return Err(violation(format!(
                        "{name}: {call} granted no lease: {completion:?}"
                    )));
                };
                if self.leases.insert(lease, session_id.clone()).is_some() {
                    return Err(violation(format!("{name}: lease {lease} granted twice")));
                }
                self.start_following(&session_id);
                if self.typing.is_some() && !self.typists.contains_key(&session_id) {
                    let snapshot = self.client.session_snapshot(&session_id);
                    self.typists
                        .insert(session_id.clone(), Typist::new(lease, snapshot));
                }
            }
            (Call::Release { lease, .. }, Ok(_)) => {
                if let Some(session_id) = self.leases.remove(&lease) {
                    self.stop_following(&session_id);
                    if self
                        .typists
                        .get(&session_id)
                        .is_some_and(|t| t.lease == lease)
                    {
                        // Its calls' answers reach no front: a new front
                        // on the session numbers its calls afresh.
                        self.typists.remove(&session_id);
                        self.front_calls.retain(|_, (s, ..)| *s != session_id);
                        self.front_inbox.retain(|(s, _)| *s != session_id);
                        self.lines.abandon(&session_id);
                    }
                }
            }
            (Call::Request(Command::Attach { session_id }), Ok(_)) => {
                self.unsure.remove(&session_id);
                self.start_following(&session_id);
                self.plain.insert(session_id);
            }
            (
                Call::Request(Command::Detach { session_id } | Command::Remove { session_id }),
                Ok(_),
            ) => {
                self.unsure.remove(&session_id);
                self.plain.remove(&session_id);
                self.stop_following(&session_id);
            }
            (
                Call::Request(
                    Command::Attach { session_id }
                    | Command::Detach { session_id }
                    | Command::Remove { session_id },
                ),
                Err(ClientError::Disconnected(_)),
            ) => {
                self.plain.remove(&session_id);
                self.unsure.insert(session_id);
            }
            // A failed release leaves the lease as the machine says.
            (Call::Release { lease, .. }, Err(_))
                if self.client.leases().status(lease).is_none() =>
            {
                self.leases.remove(&lease);
            }
            (
                Call::Command {
                    command: SessionCommand::Prompt { text },
                    ..
                },
                Ok(completion),
            ) => {
                let Completion::Session(snapshot) = completion else {
                    return Err(violation(format!(
                        "{name}: prompt {call} answered without a snapshot: {completion:?}"
                    )));
                };
                if snapshot.phase != SessionPhase::Idle {
                    return Err(violation(format!(
                        "{name}: prompt {call} answered while the session is {:?}",
                        snapshot.phase
                    )));
                }
                let holds_text = snapshot.transcript.iter().any(|item| {
                    matches!(item, TranscriptItem::User(u) if u.content.iter().any(
                        |c| matches!(c, Content::Text { text: t } if *t == text)))
                });
                if !holds_text {
                    return Err(violation(format!(
                        "{name}: prompt {call} answered with a snapshot without its text {text:?}"
                    )));
                }
                self.stats.prompts_done += 1;
            }
            _ => {}
        }
        Ok(())
    }

    /// The rules of a settled run: nothing outstanding, every active lease
    /// attached on the server with the latest snapshot cached, and every
    /// plain attachment of a session still stored attached too (a
    /// reconnection re-attaches both kinds).
    pub fn check_settled(&self, world: &World) -> Result<(), Violation> {
        let name = &self.name;
        if let Some((call, asked)) = self.outstanding.iter().next() {
            return Err(violation(format!(
                "{name}: call {call} ({asked:?}) never completed"
            )));
        }
        let open = |session_id: &str| {
            self.client.is_ready()
                && self.typists.get(session_id).is_some_and(|t| {
                    self.client.leases().status(t.lease) == Some(LeaseStatus::Active)
                })
        };
        self.lines
            .check(world, open)
            .map_err(|e| violation(format!("{name}: {e}")))?;
        let Some(conn) = self.conn.filter(|_| self.client.is_ready()) else {
            return Ok(());
        };
        let attached = world.server.attachments(conn);
        let granted =
            |lease: &LeaseId| self.client.leases().status(*lease) == Some(LeaseStatus::Active);
        // Attached exactly where a granted lease holds: a re-attach after a
        // reconnection that never went out, or a last release that sent no
        // detach, leaves the two apart.
        for session_id in &attached {
            if !self.plain.contains(session_id)
                && !self.unsure.contains(session_id)
                && !self
                    .leases
                    .iter()
                    .any(|(l, s)| s == session_id && granted(l))
            {
                return Err(violation(format!(
                    "{name}: {conn} is attached to {session_id}, which no granted lease holds \
                     and no plain attach attached (leases: {:?}, plain: {:?})",
                    self.leases, self.plain
                )));
            }
        }
        // A plain attachment is re-attached on every new connection: the
        // server may refuse it (its worker did not start), never may the
        // client forget to ask.
        for session_id in &self.plain {
            let stored = world.store.sessions.contains_key(session_id);
            if stored
                && !attached.iter().any(|s| s == session_id)
                && !self.attach_sent.contains(session_id)
            {
                return Err(violation(format!(
                    "{name}: {conn} attached {session_id} with a plain attach, and is neither \
                     attached to it nor asked to be again (attached: {attached:?})"
                )));
            }
        }
        for (lease, session_id) in &self.leases {
            if !granted(lease) {
                continue;
            }
            if !attached.iter().any(|s| s == session_id) {
                return Err(violation(format!(
                    "{name}: lease {lease} is granted but {conn} is not attached to {session_id} \
                     (attached: {attached:?})"
                )));
            }
            let cached = self.client.session_snapshot(session_id).map(|s| s.revision);
            let latest = world.server.session_revision(session_id);
            if latest.is_some() && cached != latest {
                return Err(violation(format!(
                    "{name}: lease {lease} caches revision {cached:?} of {session_id}, \
                     the server is at {latest:?}"
                )));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The lease swarm

/// Adds the reply text among `updates` to what was `told` per item.
fn note_told(told: &mut BTreeMap<String, String>, updates: Vec<Update>) {
    for update in updates {
        if let Update::Text { item_id, delta } = update {
            told.entry(item_id).or_default().push_str(&delta);
        }
    }
}

/// The request id and session of a client frame that is an `attach`.
fn attach_of(frame: &[u8]) -> Option<(String, String)> {
    let payload = frame.get(kernel::wire::frame::FRAME_HEADER_LEN..)?;
    match kernel::protocol::decode_client_message(payload, &Default::default()).ok()? {
        kernel::protocol::ClientMessage::Request(kernel::protocol::Request {
            id,
            command: Command::Attach { session_id },
        }) => Some((id, session_id)),
        _ => None,
    }
}

/// A fault of a third of the seeds, from a generator of its own seeded with
/// `seed`: its probability in percent, drawn from `percent`, or none; and
/// the generator, which goes on to seed each machine's own.
fn a_third(seed: u64, percent: std::ops::RangeInclusive<u64>) -> (Prng, Option<Ratio>) {
    let mut prng = Prng::new(seed);
    let ratio = prng.below(3).eq(&0).then(|| {
        Ratio::new(
            prng.range_inclusive(*percent.start(), *percent.end()) as u32,
            100,
        )
    });
    (prng, ratio)
}

/// A server frame, decoded.
fn server_message(frame: &[u8]) -> Option<ServerMessage> {
    let payload = frame.get(kernel::wire::frame::FRAME_HEADER_LEN..)?;
    kernel::protocol::decode_server_message(payload, &Default::default()).ok()
}

/// What one seed of the lease swarm did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Machines in the run.
    pub machines: u64,
    /// Driver steps.
    pub steps: u64,
    /// Kernel steps.
    pub kernel_steps: u64,
    /// Server replacements (hand-offs).
    pub replacements: u64,
    /// Server crashes (with restart; some keep their workers as orphans).
    pub crashes: u64,
    /// Dropped connections.
    pub drops: u64,
    /// Strangers that said hello with no token or a wrong one.
    pub strangers: u64,
    /// Sessions a sibling server wrote into the shared directory.
    pub sibling_sessions: u64,
    /// `remove` calls made.
    pub removes: u64,
    /// Plain `attach` and `detach` calls made.
    pub plain_attaches: u64,
    /// Every machine's counters, summed.
    pub totals: MachineStats,
}

/// Runs seed `seed` of the lease swarm for `steps` driver steps, then
/// settles it. `Err` names the broken rule, or how the run failed to settle.
pub fn run(seed: u64, steps: u64) -> Result<Report, String> {
    run_traced(seed, steps, None)
}

/// [`run`], keeping the world's trace in `trace` when given.
pub fn run_traced(
    seed: u64,
    steps: u64,
    trace: Option<&mut Vec<String>>,
) -> Result<Report, String> {
    let mut world = None;
    let result = drive(seed, steps, trace.is_some(), &mut world);
    if let (Some(out), Some(world)) = (trace, world) {
        *out = world.trace;
    }
    result
}

fn drive(seed: u64, steps: u64, trace: bool, slot: &mut Option<World>) -> Result<Report, String> {
    let mut prng = Prng::new(seed ^ 0x1ea5e);
    // Half the seeds run a server that requires a token.
    let token = prng.coin().then(|| format!("token-{}", prng.below(1000)));
    // Draws added later come from a generator of their own, so the others
    // stay as they were. A quarter of the seeds give orphans a grace shorter
    // than a turn: an orphan whose turn outlasts it must wait for the turn.
    let mut side = Prng::new(seed ^ 0x0a9a);
    // Removals have a generator of their own too, and plain attaches.
    let mut removing = Prng::new(seed ^ 0x5e40);
    let mut attaching = Prng::new(seed ^ 0x9a77);
    let mut worker_limits = kernel::limits::WorkerLimits::default();
    if side.below(4) == 0 {
        worker_limits.orphan_grace = Duration::from_millis(20);
    }
    let options = Options {
        seed,
        token,
        trace,
        keep_received: false,
        record_facts: true,
        holds: Holds {
            // Announcements that travel, from a generator of their own:
            // half the seeds (not the pinned seed 1, which keeps its trace).
            announce: Prng::new(seed ^ 0xa771).coin(),
            ..Holds::all()
        },
        faux_delay: Duration::from_millis(5),
        worker_limits,
        ..Options::default()
    };
    let world = slot.insert(World::new(options));
    let mut checkers = Checkers::new();
    let mut report = Report {
        machines: prng.range_inclusive(1, 3),
        ..Report::default()
    };
    let fault_rate =
        [Ratio::new(0, 1), Ratio::new(1, 500), Ratio::new(1, 100)][prng.below(3) as usize];
    let mut machines = Vec::new();
    // A third of the seeds deliver stale snapshot frames again, from a
    // generator of their own: a machine must not take an older revision.
    let (mut replaying, replay) = a_third(seed ^ 0x4e91, 1..=20);
    // A third of the seeds have readers that fall behind (their own generator).
    let (mut lagging, lag) = a_third(seed ^ 0x1a66, 1..=10);
    // A third of the seeds lose reconnections again, before their hello is
    // answered or right after (their own generator).
    let (mut flaking, flake) = a_third(seed ^ 0xf1a4, 10..=50);
    // A third of the seeds type lines into front ends (their own generator;
    // not the pinned seed 1, which keeps its trace).
    let (mut typing, typer) = a_third(seed ^ 0x7e9e, 1..=5);
    // A third of the seeds give their machines tight bounds of their own
    // (calls in flight, sessions held), from a generator of their own: a
    // call past them is refused at once, and nothing else changes.
    let mut bounding = Prng::new(seed ^ 0xb0d5);
    let bounded = bounding.below(3) == 0;
    for i in 1..=report.machines {
        let mut limits = kernel::limits::ClientLimits::default();
        if bounded {
            limits.max_calls_in_flight = bounding.range_inclusive(1, 4) as usize;
            limits.max_sessions = bounding.range_inclusive(1, 3) as usize;
        }
        let token = world.options().token.clone();
        let mut machine = Machine::connect_limited(world, &format!("m{i}"), token, limits)
            .map_err(|v| v.to_string())?;
        machine.flaky = flake.map(|ratio| (Prng::new(flaking.next_u64()), ratio));
        machine.replay = replay.map(|ratio| (Prng::new(replaying.next_u64()), ratio));
        machine.lagging = lag.map(|ratio| (Prng::new(lagging.next_u64()), ratio));
        machine.typing = typer.map(|ratio| (Prng::new(typing.next_u64()), ratio));
        machines.push(machine);
    }
    // Some seeds add a machine whose first handshake fails (a generator of
    // its own): its token is wrong, or its first connection drops before the
    // server answers its hello. It must end there, never reconnecting, its
    // calls failing once each.
    let mut intruding = Prng::new(seed ^ 0x1b7d);
    let mut intruder = match intruding.below(3) {
        0 if world.options().token.is_some() => Some(
            Machine::connect_with(world, "x1", Some("not-the-token".into()))
                .map_err(|v| v.to_string())?,
        ),
        1 => {
            let token = world.options().token.clone();
            let mut x = Machine::connect_with(world, "x1", token).map_err(|v| v.to_string())?;
            x.drop_connection(world);
            Some(x)
        }
        _ => None,
    };
    let fail = |v: Violation, step: u64| format!("step {step}: {v}");
    for step in 1..=steps {
        if let Some(x) = intruder.as_mut() {
            if intruding.chance(Ratio::new(1, 50)) {
                x.call(world, Call::Request(Command::List))
                    .map_err(|v| fail(v, step))?;
            }
            x.pump(world).map_err(|v| fail(v, step))?;
            if x.stats.reconnects > 0 {
                return Err(fail(
                    violation(format!(
                        "{}: reconnected though no handshake ever succeeded",
                        x.name
                    )),
                    step,
                ));
            }
        }
        report.steps = step;
        if prng.chance(fault_rate) {
            match prng.below(3) {
                0 => {
                    world.replace_server();
                    report.replacements += 1;
                }
                1 if side.coin() => {
                    // The server dies and its workers live on as orphans for
                    // a while (their turns run, their grace may pass) until
                    // a new server starts and adopts those still there.
                    world.crash_server_keep_workers();
                    world.advance(Duration::from_millis(side.range_inclusive(1, 100)));
                    world.start_server();
                    report.crashes += 1;
                }
                1 => {
                    world.restart_server();
                    report.crashes += 1;
                }
                _ => {
                    let i = prng.below(machines.len() as u64) as usize;
                    machines[i].drop_connection(world);
                    report.drops += 1;
                }
            }
        }
        if side.chance(Ratio::new(1, 300)) {
            sibling_creates(world, &mut side);
            report.sibling_sessions += 1;
        }
        if removing.chance(Ratio::new(1, 100)) {
            // A machine removes a stored session: one it or another may
            // lease, or one a sibling wrote; refused while a turn runs.
            let stored: Vec<String> = world.store.sessions.keys().cloned().collect();
            if !stored.is_empty() {
                let session_id = stored[removing.below(stored.len() as u64) as usize].clone();
                let i = removing.below(machines.len() as u64) as usize;
                let call = Call::Request(Command::Remove { session_id });
                machines[i].call(world, call).map_err(|v| fail(v, step))?;
                report.removes += 1;
            }
        }
        if attaching.chance(Ratio::new(1, 60)) {
            // A plain attach or detach, outside the lease rules, of a session
            // the machine holds no lease on (nor is acquiring).
            let i = attaching.below(machines.len() as u64) as usize;
            let m = &machines[i];
            let free: Vec<String> = world
                .store
                .sessions
                .keys()
                .filter(|s| !m.leased(s))
                .cloned()
                .collect();
            if !free.is_empty() {
                let session_id = free[attaching.below(free.len() as u64) as usize].clone();
                let command = if m.plain.contains(&session_id) && attaching.coin() {
                    Command::Detach { session_id }
                } else {
                    Command::Attach { session_id }
                };
                machines[i]
                    .call(world, Call::Request(command))
                    .map_err(|v| fail(v, step))?;
                report.plain_attaches += 1;
            }
        }
        if prng.chance(Ratio::new(1, 200)) {
            // A stranger: no token, a wrong one, or (the server has none) any.
            let conn = world.connect();
            let token = [None, Some("wrong")][prng.below(2) as usize];
            world.hello(conn, 1, token);
            report.strangers += 1;
        }
        if prng.chance(Ratio::new(1, 20)) {
            let i = prng.below(machines.len() as u64) as usize;
            let call = pick_call(&mut prng, &machines[i], world);
            machines[i].call(world, call).map_err(|v| fail(v, step))?;
        }
        for m in &mut machines {
            m.type_something(world).map_err(|v| fail(v, step))?;
        }
        network(&mut prng, world, &machines);
        for m in &mut machines {
            m.pump(world).map_err(|v| fail(v, step))?;
        }
        checkers.observe(world).map_err(|v| fail(v, step))?;
    }
    settle(world, &mut machines, &mut checkers).map_err(|e| format!("settling: {e}"))?;
    if let Some(x) = intruder.as_mut() {
        x.pump(world).map_err(|v| v.to_string())?;
        if x.client.closed().is_none() || x.stats.reconnects > 0 || !x.outstanding.is_empty() {
            return Err(format!(
                "{}: its first handshake failed, yet it is {:?} after {} reconnections with \
                 {} calls outstanding",
                x.name,
                x.client.closed(),
                x.stats.reconnects,
                x.outstanding.len()
            ));
        }
    }
    report.kernel_steps = world.kernel_steps();
    for m in &machines {
        report.totals.add(&m.stats);
    }
    Ok(report)
}

/// A sibling server sharing the session directory creates a session (a
/// copy of a stored one under a new id); this server's watcher sees it and
/// rescans, while its own sessions come and go.
fn sibling_creates(world: &mut World, side: &mut Prng) {
    let Some(template) = world.store.sessions.values().next().cloned() else {
        return;
    };
    let id = format!("5b1b0000-0000-4000-8000-{:012x}", side.below(1 << 48));
    world.sibling_changes(|store| {
        let mut created = template;
        created.id = id.clone();
        created.name = Some("from a sibling".into());
        store.sessions.insert(id.clone(), created);
        store.touch(&id);
        vec![id]
    });
}

/// A call's name, for counters.
fn call_name(call: &Call) -> &'static str {
    match call {
        Call::Request(command) => command.name(),
        Call::Acquire { .. } => "acquire",
        Call::Create(_) => "create",
        Call::Release { .. } => "release",
        Call::Command { command, .. } => match command {
            SessionCommand::Prompt { .. } => "prompt",
            SessionCommand::Steer { .. } => "steer",
            SessionCommand::Abort => "abort",
            SessionCommand::SetModel { .. } => "set_model",
            SessionCommand::SetThinking { .. } => "set_thinking",
        },
    }
}

/// A random call a machine could make now.
fn pick_call(prng: &mut Prng, machine: &Machine, world: &World) -> Call {
    let stored: Vec<String> = world.store.sessions.keys().cloned().collect();
    let leases: Vec<LeaseId> = machine.leases.keys().copied().collect();
    match prng.below(10) {
        0 | 1 if stored.len() < 3 => Call::Create(CreateParams::default()),
        0 | 1 => Call::Request(Command::List),
        2 | 3 if !stored.is_empty() => {
            let session_id = stored[prng.below(stored.len() as u64) as usize].clone();
            if machine.plainly_attached(&session_id) {
                // Leases and plain attachments of one session are not mixed.
                return Call::Request(Command::List);
            }
            let mode = if prng.coin() {
                LeaseMode::Exclusive
            } else {
                LeaseMode::Shared
            };
            Call::Acquire { session_id, mode }
        }
        4 if !leases.is_empty() => Call::Release {
            lease: leases[prng.below(leases.len() as u64) as usize],
            kind: ReleaseKind::Dispose,
        },
        5..=9 if !leases.is_empty() => {
            let lease = leases[prng.below(leases.len() as u64) as usize];
            let command = match prng.below(6) {
                // Unique texts: the busy checker tells prompts apart by them.
                0..=2 => SessionCommand::Prompt {
                    text: format!("{}-p{}", machine.name, machine.next_call),
                },
                3 => SessionCommand::Steer {
                    text: format!("{}-s{}", machine.name, machine.next_call),
                },
                4 => SessionCommand::Abort,
                _ => SessionCommand::SetThinking {
                    thinking_level: ThinkingLevel::Off,
                },
            };
            Call::Command { lease, command }
        }
        _ if stored.len() < 3 => Call::Create(CreateParams::default()),
        _ => Call::Request(Command::List),
    }
}

/// One hop delivered at random, or time passing (also to a machine's deadline).
fn network(prng: &mut Prng, world: &mut World, machines: &[Machine]) {
    let deliveries = world.deliveries();
    if deliveries.is_empty() || prng.chance(Ratio::new(1, 10)) {
        advance(world, machines);
        return;
    }
    let (_, delivery) = deliveries[prng.below(deliveries.len() as u64) as usize].clone();
    let amount = if prng.coin() {
        Amount::One
    } else {
        Amount::All
    };
    world.deliver(&delivery, amount);
}

/// Jumps to the earliest deadline of the world or of a machine.
fn advance(world: &mut World, machines: &[Machine]) -> bool {
    let machine = machines
        .iter()
        .filter_map(|m| m.client.next_deadline())
        .min();
    match (world.next_event(), machine) {
        (next, Some(at)) if next.is_none_or(|w| at < w) => {
            let wait = at.as_millis().saturating_sub(world.now.as_millis());
            world.advance(Duration::from_millis(wait));
            true
        }
        _ => world.advance_to_next(),
    }
}

/// Faults are over: deliver everything in order and let time pass until
/// nothing is pending, then judge the settled run.
fn settle(
    world: &mut World,
    machines: &mut [Machine],
    checkers: &mut Checkers,
) -> Result<(), String> {
    for _ in 0..200_000 {
        for m in machines.iter_mut() {
            m.pump(world).map_err(|v| v.to_string())?;
        }
        checkers.observe(world).map_err(|v| v.to_string())?;
        match world.deliveries().into_iter().min() {
            Some((_, delivery)) => world.deliver(&delivery, Amount::All),
            None => {
                if !advance(world, machines) {
                    break;
                }
            }
        }
    }
    for m in machines.iter_mut() {
        m.pump(world).map_err(|v| v.to_string())?;
    }
    if let Some(reason) = checkers::pending(world, checkers) {
        return Err(reason);
    }
    for m in machines.iter() {
        m.check_settled(world).map_err(|v| v.to_string())?;
    }
    Ok(())
}
