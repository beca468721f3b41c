//! Protocol v8 beside v1 (issue 40, "Measure"), side by side in one run on
//! one real server:
//!
//! 1. **Round trip**: a v8 `pi.session-management.detach` with no
//!    attachment (a void answer) and a `$chord.service.catalogue`, against
//!    v1 `list` of one stored session; alternated, one CPU (as `rtt`) and
//!    free. Target ≤ 1.25×.
//! 2. **A turn at turn 10 and at turn 1,000 of one session**: a v8 client
//!    attached to a session and subscribed to `pi.transcript` prompts it
//!    turn after turn through `pi.agent-controller.prompt` (the faux model,
//!    one delta a millisecond; each reply about 56 words, so a turn adds
//!    about the text of a `peers` turn); a v1 client does the same on a
//!    second session, turn by turn in alternation, measured as `peers`
//!    measures (`peers::v1_turn`). Per turn: bytes received from the
//!    prompt to the turn's end, and the time from the prompt to the first
//!    `service_update` whose ops carry reply text (v1: the first
//!    `assistant_delta`). The v8 client keeps a replica of the transcript
//!    (chord's decoder and ops) to see the turn end: the reply in
//!    `entries` and no `run` in `docs["pi.live"]`. "Turn 10" is the median
//!    of turns 6–15, "turn 1,000" of the last ten. Target: 1,000 / 10 ≤
//!    1.25× for both.
//! 3. **Fan-out**: 100 v8 clients attached to one session and subscribed to
//!    its transcript, against 100 v1 clients attached to another, the same
//!    prompt (a burst, `PI_FAUX_DELAY_MS=0`), rounds alternated. Reported as
//!    `fanout` reports: deliveries/s, skew p50/p99, CPU per delivery. A v8
//!    subscriber's updates are matched across clients by their bytes (every
//!    client subscribes under the same id, so its encoder emits the same
//!    bytes).
//! 4. **TypeScript**: the published `@earendil-works/pi-server@0.85.1` with
//!    `bench/node/host-v8.mjs`, an in-process host serving pi's services
//!    from chord's replicated state (no worker process, no store): the same
//!    v8 `detach` round trip, a turn at turns 10–19 and 1,000–1,009 of
//!    sessions whose history the host prepares, and the same burst to 100
//!    transcript subscribers, each against ours.

use crate::fanout::{Audience, FanoutResult, analyze, prompt_frame, prompt_text, summarize};
use crate::node::{NodeHost, record_updates};
use crate::peers::{Turn, v1_turn};
use crate::raw::{Kind, RawConn, kind, map, text, v1_request, value_frame};
use crate::rtt::{Pair, cycles};
use crate::server::{Server, create_sessions};
use crate::util::{
    Env, Placement, Report, Split, children, fmt_rate, fmt_us, median, rss_kib, schedstat, sorted,
    us, wait_no_children,
};
use kernel::chord::ops::{Op, Seg, apply_all};
use kernel::chord::wire::Decoder;
use kernel::protocol::Command;
use kernel::wire::{CborLimits, Value, cbor};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Time allowed for one turn or one fan-out round.
const TIMEOUT: Duration = Duration::from_secs(120);

async fn deadline<T>(what: &str, f: impl std::future::Future<Output = Res<T>>) -> Res<T> {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .map_err(|_| format!("{what}: nothing in {TIMEOUT:?}"))?
}

pub(crate) fn decode_value(payload: &[u8]) -> Res<Value> {
    cbor::decode(payload, &CborLimits::default()).map_err(err)
}

fn text_of(v: Option<&Value>) -> Option<&str> {
    match v {
        Some(Value::Text(s)) => Some(s),
        _ => None,
    }
}

// ---- a raw v8 client ---------------------------------------------------------------

/// A framed connection after a v8 hello: the server's id, and the session
/// target of its attachment once it has one.
#[derive(Debug)]
pub(crate) struct V8Client {
    pub(crate) conn: RawConn,
    pub(crate) server_id: String,
    route: Option<Value>,
}

impl V8Client {
    /// Connects and says hello with version 8.
    pub(crate) async fn connect(socket: &Path) -> Res<Self> {
        let mut conn = RawConn::connect(socket).await.map_err(err)?;
        let hello = map(vec![("type", text("hello")), ("version", Value::Int(8))]);
        conn.send(&value_frame(&hello)).await.map_err(err)?;
        let answer = decode_value(&conn.frame().await.map_err(err)?)?;
        match (text_of(answer.get("type")), text_of(answer.get("serverId"))) {
            (Some("hello"), Some(id)) => Ok(Self {
                server_id: id.to_string(),
                conn,
                route: None,
            }),
            _ => Err(format!("the v8 hello was answered with {answer:?}")),
        }
    }

    /// The server target.
    pub(crate) fn server(&self) -> Value {
        map(vec![("serverId", text(&self.server_id))])
    }

    /// The session target of the current attachment.
    pub(crate) fn session(&self) -> Res<Value> {
        self.route.clone().ok_or_else(|| "not attached".into())
    }

    /// A framed `request`.
    pub(crate) fn request(
        id: &str,
        target: Value,
        service: &str,
        member: &str,
        args: Vec<Value>,
    ) -> Vec<u8> {
        value_frame(&map(vec![
            ("type", text("request")),
            ("id", text(id)),
            ("target", target),
            (
                "call",
                map(vec![
                    ("serviceId", text(service)),
                    ("member", text(member)),
                    ("args", Value::Array(args)),
                ]),
            ),
        ]))
    }

    /// Sends a request and reads up to its response: its `result` (`Null`
    /// for a void one), or its error. An `attachment` envelope on the way
    /// sets the route; other frames are skipped.
    pub(crate) async fn call(
        &mut self,
        id: &str,
        target: Value,
        service: &str,
        member: &str,
        args: Vec<Value>,
    ) -> Res<Value> {
        let frame = Self::request(id, target, service, member, args);
        self.conn.send(&frame).await.map_err(err)?;
        loop {
            let payload = self.conn.frame().await.map_err(err)?;
            match kind(&payload) {
                Kind::ServiceUpdate => {}
                Kind::Response => {
                    let v = decode_value(&payload)?;
                    if text_of(v.get("id")) != Some(id) {
                        continue;
                    }
                    return match v.get("ok") {
                        Some(Value::Bool(true)) => {
                            Ok(v.get("result").cloned().unwrap_or(Value::Null))
                        }
                        _ => Err(format!("{service}.{member}: {:?}", v.get("error"))),
                    };
                }
                _ => {
                    let v = decode_value(&payload)?;
                    if text_of(v.get("type")) == Some("attachment") {
                        self.route = match v.get("attachment") {
                            Some(Value::Null) | None => None,
                            Some(route) => Some(route.clone()),
                        };
                    }
                }
            }
        }
    }

    /// `pi.session-management.attach(session)`.
    pub(crate) async fn attach(&mut self, session: &str) -> Res<()> {
        let server = self.server();
        self.call(
            "attach",
            server,
            "pi.session-management",
            "attach",
            vec![text(session)],
        )
        .await?;
        self.session().map(|_| ())
    }

    /// Subscribes to a singleton service of the attached session; returns the snapshot.
    pub(crate) async fn subscribe(&mut self, subscription: &str, service: &str) -> Res<Value> {
        let target = self.session()?;
        let args = vec![text(subscription), text(service), text("singleton")];
        self.call(subscription, target, "$chord.service", "subscribe", args)
            .await
    }
}

/// A prompt of the agent controller.
fn prompt_request(id: &str, target: Value, message: &str) -> Vec<u8> {
    let request = map(vec![("message", text(message)), ("images", Value::Null)]);
    V8Client::request(id, target, "pi.agent-controller", "prompt", vec![request])
}

/// A `$chord.service.catalogue` request, answered after everything the
/// server had already sent to this connection.
fn barrier_frame(server_id: &str) -> Vec<u8> {
    let server = map(vec![("serverId", text(server_id))]);
    V8Client::request("b", server, "$chord.service", "catalogue", vec![])
}

/// Sends a barrier and reads up to its answer; returns the service updates
/// that came before it.
async fn barrier(conn: &mut RawConn, server_id: &str) -> Res<usize> {
    conn.send(&barrier_frame(server_id)).await.map_err(err)?;
    let mut updates = 0;
    loop {
        let payload = conn.frame().await.map_err(err)?;
        match kind(&payload) {
            Kind::ServiceUpdate => updates += 1,
            Kind::Response if text_of(decode_value(&payload)?.get("id")) == Some("b") => {
                return Ok(updates);
            }
            _ => {}
        }
    }
}

// ---- a replica of the transcript ------------------------------------------------------

/// What a client of `pi.transcript` holds: the state, and the wire decoder
/// of its one stream.
#[derive(Debug)]
pub(crate) struct Replica {
    value: Value,
    decoder: Decoder,
}

impl Replica {
    /// From a subscription snapshot (one state member, `[["r", value]]`).
    pub(crate) fn from_snapshot(snapshot: &Value) -> Res<Self> {
        let members = snapshot
            .get("instances")
            .and_then(|i| match i {
                Value::Array(items) => items.first(),
                _ => None,
            })
            .and_then(|i| i.get("members"));
        let Some(Value::Array(members)) = members else {
            return Err(format!("not a singleton snapshot: {snapshot:?}"));
        };
        let state = members
            .iter()
            .find(|m| text_of(m.get("kind")) == Some("state"))
            .ok_or("no state member")?;
        let mut decoder = Decoder::new();
        let ops = decoder
            .decode(state.get("ops").ok_or("no ops")?)
            .map_err(|e| e.0)?;
        let mut value = Value::Null;
        apply_all(&mut value, &ops).map_err(err)?;
        Ok(Self { value, decoder })
    }

    /// Applies one `service_update`'s `update`; returns its ops.
    fn apply(&mut self, update: &Value) -> Res<Vec<Op>> {
        let ops = self
            .decoder
            .decode(update.get("ops").ok_or("an update without ops")?)
            .map_err(|e| e.0)?;
        apply_all(&mut self.value, &ops).map_err(err)?;
        Ok(ops)
    }

    fn entries(&self) -> usize {
        self.entry_list().len()
    }

    /// The transcript's entries (pi's `ConversationView`).
    pub(crate) fn entry_list(&self) -> &[Value] {
        match self.value.get("entries") {
            Some(Value::Array(e)) => e,
            _ => &[],
        }
    }

    /// A turn runs: `docs["pi.live"].run` is there.
    fn busy(&self) -> bool {
        self.value
            .get("docs")
            .and_then(|d| d.get("pi.live"))
            .and_then(|l| l.get("run"))
            .is_some()
    }
}

/// A value holding a non-empty text part (`{type: "text", text}`).
fn has_text(v: &Value) -> bool {
    match v {
        Value::Map(pairs) => {
            (text_of(v.get("type")) == Some("text")
                && text_of(v.get("text")).is_some_and(|t| !t.is_empty()))
                || pairs.iter().any(|(_, v)| has_text(v))
        }
        Value::Array(items) => items.iter().any(has_text),
        _ => false,
    }
}

/// Ops that carry reply text: under `docs["pi.live"]` (the streaming
/// reply), an append, or a text part set or spliced in.
fn carries_text(ops: &[Op]) -> bool {
    let live = [Seg::Key("docs".into()), Seg::Key("pi.live".into())];
    ops.iter().any(|op| {
        op.path().is_some_and(|p| p.starts_with(&live))
            && match op {
                Op::Append(_, t) => !t.is_empty(),
                Op::Set(_, v) => has_text(v),
                Op::Splice(_, _, _, items) => items.iter().any(has_text),
                _ => false,
            }
    })
}

/// One v8 turn: prompt through the agent controller, read until the
/// replica shows the reply in `entries` and the run gone. Also returns how
/// many transcript updates it read.
async fn v8_turn(
    c: &mut V8Client,
    replica: &mut Replica,
    n: usize,
    message: &str,
) -> Res<(Turn, usize)> {
    let frame = prompt_request(&format!("p{n}"), c.session()?, message);
    let entries0 = replica.entries();
    let start = Instant::now();
    c.conn.send(&frame).await.map_err(err)?;
    let (mut first, mut end, mut answered) = (None, None, false);
    let (mut deltas, mut bytes, mut updates) = (0, 0, 0);
    loop {
        c.conn.fill().await.map_err(err)?;
        let now = Instant::now();
        let mut failure: Option<String> = None;
        c.conn.drain(|payload| {
            bytes += payload.len();
            let mut step = || -> Res<()> {
                match kind(payload) {
                    Kind::ServiceUpdate => {
                        let v = decode_value(payload)?;
                        if text_of(v.get("subscriptionId")) != Some("t") {
                            return Ok(());
                        }
                        updates += 1;
                        let ops = replica.apply(v.get("update").ok_or("no update")?)?;
                        if carries_text(&ops) {
                            deltas += 1;
                            first.get_or_insert(now);
                        }
                        if !replica.busy() && replica.entries() >= entries0 + 2 {
                            end.get_or_insert(now);
                        }
                    }
                    Kind::Response => {
                        let v = decode_value(payload)?;
                        let accepted = v.get("result").and_then(|r| r.get("accepted"));
                        if accepted != Some(&Value::Bool(true)) {
                            return Err(format!("the prompt was refused: {v:?}"));
                        }
                        answered = true;
                    }
                    _ => {}
                }
                Ok(())
            };
            if let Err(e) = step() {
                failure.get_or_insert(e);
            }
        });
        if let Some(f) = failure {
            return Err(f);
        }
        if answered && let Some(end) = end {
            let first = first.ok_or("the turn ended without reply text")?;
            let turn = Turn {
                first: first - start,
                total: end - start,
                deltas,
                bytes,
            };
            return Ok((turn, updates));
        }
    }
}

// ---- 1. round trips ------------------------------------------------------------------

/// [`cycles`], and the server's CPU µs per cycle meanwhile.
async fn timed_cycles(
    conn: &mut RawConn,
    requests: &[Vec<u8>],
    n: usize,
    pid: u32,
) -> Res<(Vec<f64>, f64)> {
    let before = schedstat(pid).0;
    let samples = cycles(conn, requests, n).await.map_err(err)?;
    Ok((samples, (schedstat(pid).0 - before) as f64 / 1e3 / n as f64))
}

fn rtt(env: &Env, report: &mut Report) -> Res<()> {
    let sessions = env.fresh_dir("v8-rtt-sessions");
    create_sessions(&sessions, 1, 1)?;
    let server = Server::start(env, &sessions, &[])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(err)?;
    runtime.block_on(async {
        let mut v1 = RawConn::connect(&server.socket).await.map_err(err)?;
        v1.hello_v1().await.map_err(err)?;
        let mut v8 = V8Client::connect(&server.socket).await?;
        let list = vec![v1_request("l", Command::List)];
        let detach = vec![V8Client::request(
            "d",
            v8.server(),
            "pi.session-management",
            "detach",
            vec![],
        )];
        let catalogue = vec![V8Client::request(
            "c",
            v8.server(),
            "$chord.service",
            "catalogue",
            vec![],
        )];
        let n = env.pick(300, 3000);
        let io = |e: std::io::Error| e.to_string();
        cycles(&mut v1, &list, n / 5).await.map_err(io)?;
        cycles(&mut v8.conn, &detach, n / 5).await.map_err(io)?;
        cycles(&mut v8.conn, &catalogue, n / 5).await.map_err(io)?;
        let placement = Placement::discover()?;
        for pinned in [true, false] {
            placement.apply(pinned, &[server.pid])?;
            let (mut detach_pair, mut catalogue_pair) = (Pair::default(), Pair::default());
            // Server CPU µs per request: v1 list, v8 detach, v8 catalogue.
            let mut cpu = [Vec::new(), Vec::new(), Vec::new()];
            for _ in 0..env.rounds {
                let (a, cpu_a) = timed_cycles(&mut v1, &list, n, server.pid).await?;
                let (b, cpu_b) = timed_cycles(&mut v8.conn, &detach, n, server.pid).await?;
                let (c, cpu_c) = timed_cycles(&mut v8.conn, &catalogue, n, server.pid).await?;
                cpu[0].push(cpu_a);
                cpu[1].push(cpu_b);
                cpu[2].push(cpu_c);
                detach_pair.round(a.clone(), b);
                catalogue_pair.round(a, c);
            }
            placement.apply(false, &[server.pid])?;
            let where_ = if pinned {
                format!("one CPU ({})", placement.cpu)
            } else {
                "free placement".into()
            };
            let figure = |pair: &Pair, slot: usize| {
                format!(
                    "v8 {} vs v1 `list` {} → **{:.2}×** ({}); server CPU per request {} vs {}",
                    Pair::describe(&pair.b),
                    Pair::describe(&pair.a),
                    pair.ratio(),
                    pair.spread(),
                    fmt_us(median(&cpu[slot])),
                    fmt_us(median(&cpu[0])),
                )
            };
            let what = format!(
                "v8 `pi.session-management.detach` (not attached) round trip vs v1 `list` (1 session), {where_}"
            );
            let ratio = detach_pair.ratio();
            if pinned {
                report.push("v8", what, figure(&detach_pair, 1), "≤ 1.25×", Some(ratio <= 1.25));
            } else {
                report.info("v8", what, figure(&detach_pair, 1));
            }
            report.info(
                "v8",
                format!("v8 `$chord.service.catalogue` (server scope) round trip vs v1 `list`, {where_}"),
                figure(&catalogue_pair, 2),
            );
        }
        Ok::<(), String>(())
    })
}

// ---- 2. a turn at turn 10 and at turn 1,000 --------------------------------------------

/// The prompt of turn `t`: 44 words, so the faux reply (which repeats it)
/// has about 56, and a turn adds about 100 words of text.
fn long_prompt(t: usize) -> String {
    let mut words = vec![format!("turn {t}:")];
    words.extend((0..42).map(|i| format!("w{i:02}")));
    words.join(" ")
}

/// Run time (ns) of one process.
fn run_ns(pid: u32) -> u64 {
    schedstat(pid).0
}

/// Per-turn figures of one protocol.
#[derive(Debug, Default)]
struct Series {
    bytes: Vec<f64>,
    first: Vec<f64>,
    total: Vec<f64>,
    server_us: Vec<f64>,
    worker_us: Vec<f64>,
}

impl Series {
    fn push(&mut self, turn: &Turn, server_us: f64, worker_us: f64) {
        self.bytes.push(turn.bytes as f64);
        self.first.push(us(turn.first));
        self.total.push(us(turn.total));
        self.server_us.push(server_us);
        self.worker_us.push(worker_us);
    }
}

/// Median of `v[range]`, with its min–max.
fn window(v: &[f64], range: std::ops::Range<usize>) -> (f64, f64, f64) {
    let s = sorted(&v[range]);
    (
        median(&s),
        s.first().copied().unwrap_or(f64::NAN),
        s.last().copied().unwrap_or(f64::NAN),
    )
}

fn kib(bytes: f64) -> String {
    if bytes >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", bytes / 1024.0 / 1024.0)
    } else {
        format!("{:.1} KiB", bytes / 1024.0)
    }
}

fn the_new_child(pid: u32, before: &[u32]) -> Res<u32> {
    let after = children(pid);
    after
        .into_iter()
        .find(|c| !before.contains(c))
        .ok_or_else(|| "no worker process appeared".into())
}

fn turns(env: &Env, report: &mut Report) -> Res<()> {
    let sessions = env.fresh_dir("v8-turn-sessions");
    let ids = create_sessions(&sessions, 2, 1)?;
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "1".into())])?;
    // `BENCH_V8_TURNS=n`: the long session's length.
    let total = std::env::var("BENCH_V8_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(env.pick(100, 1000))
        .max(20);
    let mut rss = (0, 0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(err)?;
    let (v8, v1, v8_worker, v1_worker) = runtime.block_on(async {
        let before = children(server.pid);
        let mut c8 = V8Client::connect(&server.socket).await?;
        c8.attach(&ids[0]).await?;
        let w8 = the_new_child(server.pid, &before)?;
        let snapshot = c8.subscribe("t", "pi.transcript").await?;
        let mut replica = Replica::from_snapshot(&snapshot)?;
        let before = children(server.pid);
        let mut c1 = RawConn::connect(&server.socket).await.map_err(err)?;
        c1.hello_v1().await.map_err(err)?;
        crate::peers::attach(&mut c1, &ids[1]).await?;
        let w1 = the_new_child(server.pid, &before)?;
        let (mut v8, mut v1) = (Series::default(), Series::default());
        let started = Instant::now();
        for t in 1..=total {
            let message = long_prompt(t);
            let (s0, w0) = (run_ns(server.pid), run_ns(w8));
            let (turn, _) =
                deadline("a v8 turn", v8_turn(&mut c8, &mut replica, t, &message)).await?;
            let (s1, w1_) = (run_ns(server.pid), run_ns(w8));
            v8.push(&turn, (s1 - s0) as f64 / 1e3, (w1_ - w0) as f64 / 1e3);
            let (s0, w0) = (run_ns(server.pid), run_ns(w1));
            let turn = deadline("a v1 turn", v1_turn(&mut c1, &ids[1], &message)).await?;
            let (s1, w1_) = (run_ns(server.pid), run_ns(w1));
            v1.push(&turn, (s1 - s0) as f64 / 1e3, (w1_ - w0) as f64 / 1e3);
            if t == 15 {
                rss.0 = rss_kib(server.pid).unwrap_or(0);
            }
            if t % 100 == 0 {
                println!(
                    "  turn {t}: v8 {} in {}, v1 {} in {} ({:.0} s)",
                    kib(v8.bytes[t - 1]),
                    fmt_us(v8.total[t - 1]),
                    kib(v1.bytes[t - 1]),
                    fmt_us(v1.total[t - 1]),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        if replica.entries() != 2 * total {
            return Err(format!(
                "the v8 replica holds {} entries after {total} turns",
                replica.entries()
            ));
        }
        rss.1 = rss_kib(server.pid).unwrap_or(0);
        Ok::<_, String>((v8, v1, w8, w1))
    })?;
    let _ = (v8_worker, v1_worker);
    report.info(
        "v8",
        format!("the server process (both sessions live) after turn 15 → turn {total}"),
        format!(
            "RSS {} → {}",
            kib(rss.0 as f64 * 1024.0),
            kib(rss.1 as f64 * 1024.0)
        ),
    );
    let early = 5..15;
    let late = total - 10..total;
    for (name, s) in [("v8", &v8), ("v1", &v1)] {
        let (b10, b10_lo, b10_hi) = window(&s.bytes, early.clone());
        let (b1k, b1k_lo, b1k_hi) = window(&s.bytes, late.clone());
        let (f10, f10_lo, f10_hi) = window(&s.first, early.clone());
        let (f1k, f1k_lo, f1k_hi) = window(&s.first, late.clone());
        let (t10, t1k) = (
            window(&s.total, early.clone()).0,
            window(&s.total, late.clone()).0,
        );
        let (sv10, sv1k) = (
            window(&s.server_us, early.clone()).0,
            window(&s.server_us, late.clone()).0,
        );
        let (wk10, wk1k) = (
            window(&s.worker_us, early.clone()).0,
            window(&s.worker_us, late.clone()).0,
        );
        let bytes_ratio = b1k / b10;
        let first_ratio = f1k / f10;
        let what = format!(
            "{name}: a turn at turn 10 → turn {total} of one session ({})",
            if name == "v8" {
                "subscribed to `pi.transcript`, prompting through `pi.agent-controller`"
            } else {
                "attached, prompting with `prompt`"
            }
        );
        let figure = format!(
            "bytes per turn **{} → {} ({bytes_ratio:.2}×)** (ranges {}–{} / {}–{}); prompt → first reply text **{} → {} ({first_ratio:.2}×)** ({}–{} / {}–{}); turn {} → {}; server CPU per turn {} → {}, the session's worker {} → {}",
            kib(b10),
            kib(b1k),
            kib(b10_lo),
            kib(b10_hi),
            kib(b1k_lo),
            kib(b1k_hi),
            fmt_us(f10),
            fmt_us(f1k),
            fmt_us(f10_lo),
            fmt_us(f10_hi),
            fmt_us(f1k_lo),
            fmt_us(f1k_hi),
            fmt_us(t10),
            fmt_us(t1k),
            fmt_us(sv10),
            fmt_us(sv1k),
            fmt_us(wk10),
            fmt_us(wk1k),
        );
        if name == "v8" {
            report.push(
                "v8",
                what,
                figure,
                "≤ 1.25× (bytes and time)",
                Some(bytes_ratio <= 1.25 && first_ratio <= 1.25),
            );
        } else {
            report.info("v8", what, figure);
        }
    }
    Ok(())
}

// ---- 3. fan-out --------------------------------------------------------------------------

/// K v8 clients attached to one session, each subscribed to its transcript as "t".
struct Subscribers {
    conns: Vec<RawConn>,
    server_id: String,
    /// Client 0's prompt (its route).
    prompt: Vec<u8>,
    /// Transcript updates per turn, counted in the warm-up round.
    updates: usize,
}

impl Subscribers {
    /// Connects, attaches and subscribes `k` clients, then runs a warm-up
    /// turn: client 0 follows it with a replica and counts its updates
    /// (then the ones a barrier finds after it); the others read until
    /// they have as many, and must have no more.
    async fn join(socket: &Path, session: &str, k: usize, message: &str) -> Res<Self> {
        let mut first = V8Client::connect(socket).await?;
        first.attach(session).await?;
        let snapshot = first.subscribe("t", "pi.transcript").await?;
        let mut replica = Replica::from_snapshot(&snapshot)?;
        let mut others = Vec::with_capacity(k - 1);
        for _ in 1..k {
            let mut c = V8Client::connect(socket).await?;
            c.attach(session).await?;
            c.subscribe("t", "pi.transcript").await?;
            others.push(c.conn);
        }
        let prompt = prompt_request("p", first.session()?, message);
        let target = Arc::new(AtomicUsize::new(usize::MAX));
        let mut readers = Vec::with_capacity(k - 1);
        for mut conn in others {
            let target = target.clone();
            readers.push(tokio::spawn(async move {
                let mut got = 0;
                while got < target.load(Ordering::Relaxed) {
                    if let Ok(read) =
                        tokio::time::timeout(Duration::from_millis(20), conn.fill()).await
                    {
                        read.map_err(err)?;
                        conn.drain(|p| got += usize::from(kind(p) == Kind::ServiceUpdate));
                    }
                }
                Ok::<_, String>((conn, got))
            }));
        }
        let server_id = first.server_id.clone();
        let updates = deadline("the v8 warm-up turn", async {
            let (_, counted) = v8_turn(&mut first, &mut replica, 0, message).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(counted + barrier(&mut first.conn, &server_id).await?)
        })
        .await?;
        target.store(updates, Ordering::Relaxed);
        let mut conns = vec![first.conn];
        let mut counts = Vec::new();
        for r in readers {
            let (conn, got) = r.await.map_err(err)??;
            counts.push(got);
            conns.push(conn);
        }
        if counts.iter().any(|&c| c != updates) {
            return Err(format!(
                "v8 subscribers got other update counts than client 0's {updates}: {counts:?}"
            ));
        }
        Ok(Self {
            conns,
            server_id,
            prompt,
            updates,
        })
    }

    async fn round(&mut self, server_pid: u32) -> Res<FanoutResult> {
        let (cpu0, wait0) = crate::fanout::tree_sched(server_pid);
        let (me0, me_wait0) = schedstat(std::process::id());
        let conns = std::mem::take(&mut self.conns);
        let k = conns.len();
        let mut tasks = Vec::with_capacity(k);
        let started = Instant::now();
        // Client 0 is spawned last, so every other reader is waiting before the prompt goes out.
        for (i, conn) in conns.into_iter().enumerate().rev() {
            let first = (i == 0).then(|| self.prompt.clone());
            tasks.push(tokio::spawn(record_updates(conn, self.updates, first)));
        }
        let mut per_client = Vec::with_capacity(k);
        let mut back = Vec::with_capacity(k);
        for task in tasks {
            let (conn, arrivals) = deadline("a v8 fan-out round", async {
                task.await.map_err(err)?.map_err(err)
            })
            .await?;
            back.push(conn);
            per_client.push(arrivals);
        }
        back.reverse();
        per_client.reverse();
        self.conns = back;
        let mut result = analyze(&per_client, started);
        let (cpu1, wait1) = crate::fanout::tree_sched(server_pid);
        result.server_cpu = cpu1 - cpu0;
        result.server_wait = wait1 - wait0;
        let (me1, me_wait1) = schedstat(std::process::id());
        result.client_cpu = (me1 - me0) as f64 / 1e9;
        result.client_wait = (me_wait1 - me_wait0) as f64 / 1e9;
        // The turn is over for the server too (the next prompt must not
        // find it busy), and it sent nothing more.
        let extra = barrier(&mut self.conns[0], &self.server_id).await?;
        if extra > 0 {
            return Err(format!(
                "a v8 turn sent {} transcript updates, not {}",
                self.updates + extra,
                self.updates
            ));
        }
        Ok(result)
    }
}

fn fanout(env: &Env, report: &mut Report) -> Res<()> {
    let split = Split::from_env()?;
    let runtime = Split::client_runtime(split.as_ref())?;
    let sessions = env.fresh_dir("v8-fanout-sessions");
    let ids = create_sessions(&sessions, 2, 1)?;
    let words = env.pick(300, 2000);
    let k = 100;
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "0".into())])?;
    let message = prompt_text(words);
    runtime.block_on(async {
        let mut v8 = Subscribers::join(&server.socket, &ids[0], k, &message).await?;
        let mut v1 = Audience::attach(&server.socket, &ids[1], k).await?;
        let prompt_v1 = prompt_frame(&ids[1], words);
        v1.round(&prompt_v1, server.pid).await?;
        if let Some(split) = &split {
            split.place(&[server.pid]);
        }
        let (mut ours8, mut ours1) = (Vec::new(), Vec::new());
        for _ in 0..env.rounds.min(5) {
            ours8.push(v8.round(server.pid).await?);
            ours1.push(v1.round(&prompt_v1, server.pid).await?);
        }
        let (a, b) = (summarize(&ours8), summarize(&ours1));
        let line = |s: &crate::fanout::Summary| {
            format!(
                "{}/s (first delivery after {}; skew p50 {} p99 {}; {:.2} µs server+worker CPU/delivery; {} events/turn)",
                fmt_rate(s.rate),
                fmt_us(s.first_delivery),
                fmt_us(s.p50),
                fmt_us(s.p99),
                s.cpu_per_delivery_us,
                s.events
            )
        };
        report.info(
            "v8",
            format!(
                "fan-out burst to {k} clients: v8 transcript subscribers vs v1 `session_progress` ({words}-word prompt, {} alternated rounds){}",
                ours8.len(),
                Split::describe(split.as_ref())
            ),
            format!(
                "v8 **{}** vs v1 **{}** → v8 delivers {:.2}× v1's rate, skew p99 {:.2}× v1's",
                line(&a),
                line(&b),
                a.rate / b.rate,
                a.p99 / b.p99
            ),
        );
        drop(v8);
        drop(v1);
        wait_no_children(server.pid, Duration::from_secs(15));
        Ok::<(), String>(())
    })
}

// ---- 4. the TypeScript pi-server 0.85.1 on the same work -----------------------------------

/// `n` v8 turns on each of two TS sessions (history `h` and `H` turns),
/// alternated; per-turn series.
async fn ts_turns(socket: &Path, h: usize, big: usize, n: usize) -> Res<(Series, Series)> {
    let mut sides = Vec::new();
    for turns in [h, big] {
        let mut c = V8Client::connect(socket).await?;
        c.attach(&format!("s{turns}d1")).await?;
        let snapshot = c.subscribe("t", "pi.transcript").await?;
        let replica = Replica::from_snapshot(&snapshot)?;
        sides.push((c, replica, Series::default(), turns));
    }
    for i in 1..=n {
        for (c, replica, series, turns) in &mut sides {
            let t = *turns + i;
            let (turn, _) =
                deadline("a TS v8 turn", v8_turn(c, replica, t, &long_prompt(t))).await?;
            series.push(&turn, 0.0, 0.0);
        }
    }
    let big = sides.pop().expect("two").2;
    let small = sides.pop().expect("two").2;
    Ok((small, big))
}

fn typescript(env: &Env, report: &mut Report) -> Res<()> {
    let node_version = match std::process::Command::new("node").arg("--version").output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Err(e) => {
            report.info(
                "v8",
                "TypeScript pi-server 0.85.1",
                format!("not run: no node ({e})"),
            );
            return Ok(());
        }
    };
    let dir = crate::node::install(env)?;
    let host = NodeHost::start_script(
        &dir,
        "host-v8.mjs",
        &env.fresh_dir("v8-node").join("node.sock"),
        &[],
    )?;
    let host_pid = host.child.id();
    let ts = format!("TypeScript pi-server 0.85.1 (Node {node_version}, `bench/node/host-v8.mjs`)");
    let sessions = env.fresh_dir("v8-ts-sessions");
    let ids = create_sessions(&sessions, 1, 1)?;
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "0".into())])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(err)?;
    runtime.block_on(async {
        // Round trips: the same call on both.
        let mut theirs = V8Client::connect(&host.socket).await?;
        let mut ours = V8Client::connect(&server.socket).await?;
        let detach = |c: &V8Client| {
            vec![V8Client::request(
                "d",
                c.server(),
                "pi.session-management",
                "detach",
                vec![],
            )]
        };
        let (d_theirs, d_ours) = (detach(&theirs), detach(&ours));
        let n = env.pick(200, 2000);
        let io = |e: std::io::Error| e.to_string();
        cycles(&mut theirs.conn, &d_theirs, n / 5).await.map_err(io)?;
        cycles(&mut ours.conn, &d_ours, n / 5).await.map_err(io)?;
        let placement = Placement::discover()?;
        placement.apply(true, &[host_pid, server.pid])?;
        let mut pair = Pair::default();
        for _ in 0..env.rounds {
            let a = cycles(&mut theirs.conn, &d_theirs, n).await.map_err(io)?;
            let b = cycles(&mut ours.conn, &d_ours, n).await.map_err(io)?;
            pair.round(a, b);
        }
        placement.apply(false, &[host_pid, server.pid])?;
        report.info(
            "v8",
            format!("v8 `pi.session-management.detach` round trip, one CPU: ours vs {ts}"),
            format!(
                "ours {} vs TS {} → **ours {:.2}× TS's time** ({})",
                Pair::describe(&pair.b),
                Pair::describe(&pair.a),
                pair.ratio(),
                pair.spread()
            ),
        );

        // A turn at turn 10 and turn 1,000 (TS: sessions with 9 and 999
        // turns of history, then 10 turns each, alternated).
        let (small, big) = ts_turns(&host.socket, 9, env.pick(99, 999), 10).await?;
        let all = 0..10;
        let (b10, b1k) = (window(&small.bytes, all.clone()).0, window(&big.bytes, all.clone()).0);
        let (f10, f1k) = (window(&small.first, all.clone()).0, window(&big.first, all.clone()).0);
        let (t10, t1k) = (window(&small.total, all.clone()).0, window(&big.total, all).0);
        report.info(
            "v8",
            format!(
                "{ts}: a turn at turns 10–19 → {}–{} of a session (history prepared in the host, 1 word/ms)",
                env.pick(100, 1000),
                env.pick(109, 1009)
            ),
            format!(
                "bytes per turn {} → {} ({:.2}×); prompt → first reply text {} → {} ({:.2}×); turn {} → {}",
                kib(b10),
                kib(b1k),
                b1k / b10,
                fmt_us(f10),
                fmt_us(f1k),
                f1k / f10,
                fmt_us(t10),
                fmt_us(t1k)
            ),
        );
        Ok::<(), String>(())
    })?;

    // Fan-out: 100 subscribers of one session's transcript on each, the same
    // prompt, burst (each TS word in an event-loop turn of its own).
    let split = Split::from_env()?;
    let clients = Split::client_runtime(split.as_ref())?;
    if let Some(split) = &split {
        split.place(&[host_pid, server.pid]);
    }
    let words = env.pick(300, 2000);
    let message = prompt_text(words);
    clients.block_on(async {
        let k = 100;
        let mut theirs = Subscribers::join(&host.socket, "s0d0-fanout", k, &message).await?;
        let mut ours = Subscribers::join(&server.socket, &ids[0], k, &message).await?;
        let (mut t, mut o) = (Vec::new(), Vec::new());
        for _ in 0..env.rounds.min(5) {
            t.push(theirs.round(host_pid).await?);
            o.push(ours.round(server.pid).await?);
        }
        let (t, o) = (summarize(&t), summarize(&o));
        let line = |s: &crate::fanout::Summary| {
            format!(
                "{}/s (first delivery after {}; skew p50 {} p99 {}; {:.2} µs CPU/delivery; {} updates/turn)",
                fmt_rate(s.rate),
                fmt_us(s.first_delivery),
                fmt_us(s.p50),
                fmt_us(s.p99),
                s.cpu_per_delivery_us,
                s.events
            )
        };
        report.info(
            "v8",
            format!(
                "v8 fan-out burst to {k} transcript subscribers, {words}-word prompt: ours vs {ts}{}",
                Split::describe(split.as_ref())
            ),
            format!(
                "ours **{}** vs TS **{}** → ours {:.2}× TS's rate",
                line(&o),
                line(&t),
                o.rate / t.rate
            ),
        );
        Ok::<(), String>(())
    })
}

/// Issue 40's measures; `BENCH_V8=rtt,turns,fanout,ts` runs some of them.
pub(crate) fn run(env: &Env, report: &mut Report) -> Res<()> {
    let wanted = |part: &str| {
        std::env::var("BENCH_V8").map_or(true, |v| v.split(',').any(|p| p.trim() == part))
    };
    if wanted("rtt") {
        rtt(env, report)?;
    }
    if wanted("turns") {
        turns(env, report)?;
    }
    if wanted("fanout") {
        fanout(env, report)?;
    }
    if wanted("ts") {
        typescript(env, report)?;
    }
    Ok(())
}
