//! Item 6: against the published TypeScript `@earendil-works/pi-server`
//! (protocol v8, 0.85.1; the v1 server was never published), run by Node
//! with the in-memory host `bench/node/host.mjs`.
//!
//! The same raw Rust clients drive both servers:
//! - round trip: v8 `request` of the host's `bench.list` (a server-scope
//!   service returning one session's metadata) vs our `list` (one stored
//!   session);
//! - fan-out: K clients subscribe to the host's `bench.stream` state member
//!   and client 0 asks it to publish N updates (one appended word each) to
//!   every subscriber, each in a turn of Node's event loop of its own (as a
//!   streamed reply's chunks arrive), vs our K attached clients receiving the
//!   N progress events of a prompt's reply (burst, `PI_FAUX_DELAY_MS=0`).
//!   Ours has one more hop (worker process → server) than the in-process
//!   host. Both report the time from the request to the first delivery.

use crate::fanout::{Audience, FanoutResult, analyze, prompt_frame, summarize};
use crate::raw::{Kind, RawConn, kind, map, text, v1_request, value_frame};
use crate::rtt::{Pair, cycles};
use crate::server::{Server, create_sessions};
use crate::util::{Env, Placement, Report, Split, fmt_rate, hash_bytes, median};
use kernel::protocol::Command;
use kernel::wire::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

const PACKAGES: &[&str] = &[
    "@earendil-works/pi-server@0.85.1",
    "@earendil-works/pi-client@0.85.1",
    "@earendil-works/chord@0.85.1",
];

const HOST: &str = include_str!("../node/host.mjs");
/// pi's v8 services for the same work as ours (`bench -- v8`).
const HOST_V8: &str = include_str!("../node/host-v8.mjs");

/// Installs the packages under `<target>/bench-node` (once) and writes the host there.
pub(crate) fn install(env: &Env) -> Result<PathBuf, String> {
    let dir = env.target_dir.join("bench-node");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let installed = dir.join("node_modules/@earendil-works/pi-server/package.json");
    let version = std::fs::read_to_string(&installed).unwrap_or_default();
    if !version.contains("\"version\": \"0.85.1\"") {
        std::fs::write(
            dir.join("package.json"),
            "{\n  \"name\": \"pi-bench-node\",\n  \"private\": true,\n  \"type\": \"module\"\n}\n",
        )
        .map_err(|e| e.to_string())?;
        println!(
            "  npm install {} in {} ...",
            PACKAGES.join(" "),
            dir.display()
        );
        let status = Process::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .args(PACKAGES)
            .current_dir(&dir)
            .status()
            .map_err(|e| format!("cannot run npm: {e}"))?;
        if !status.success() {
            return Err(format!("npm install failed: {status}"));
        }
    }
    std::fs::write(dir.join("host.mjs"), HOST).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("host-v8.mjs"), HOST_V8).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// The Node host process; killed on drop.
pub(crate) struct NodeHost {
    pub(crate) child: Child,
    pub(crate) socket: PathBuf,
    server_id: String,
}

impl NodeHost {
    fn start(dir: &Path, socket: &Path, sessions: usize) -> Result<Self, String> {
        Self::start_script(dir, "host.mjs", socket, &[sessions.to_string()])
    }

    /// Runs `script` (in `dir`) with the socket, a new server id and `args`;
    /// waits for its "ready".
    pub(crate) fn start_script(
        dir: &Path,
        script: &str,
        socket: &Path,
        args: &[String],
    ) -> Result<Self, String> {
        let server_id = pi_config::new_uuid();
        let mut child = Process::new("node")
            .arg(dir.join(script))
            .arg(socket)
            .arg(&server_id)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run node: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            let _ = child.kill();
            let status = child.wait().map_err(|e| e.to_string())?;
            return Err(format!(
                "the Node host did not start ({status}); see its stderr above"
            ));
        }
        Ok(Self {
            child,
            socket: socket.to_path_buf(),
            server_id,
        })
    }

    fn target(&self) -> Value {
        map(vec![("serverId", text(&self.server_id))])
    }

    fn request(&self, id: &str, service: &str, member: &str, args: Vec<Value>) -> Vec<u8> {
        value_frame(&map(vec![
            ("type", text("request")),
            ("id", text(id)),
            ("target", self.target()),
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

    /// A v8 connection after its hello.
    async fn connect(&self) -> Result<RawConn, String> {
        let mut conn = RawConn::connect(&self.socket)
            .await
            .map_err(|e| e.to_string())?;
        conn.send(&value_frame(&map(vec![
            ("type", text("hello")),
            ("version", Value::Int(8)),
        ])))
        .await
        .map_err(|e| e.to_string())?;
        let hello = conn.frame().await.map_err(|e| e.to_string())?;
        if kind(&hello) != Kind::Hello {
            return Err(format!(
                "the Node server answered hello with {:?}",
                kind(&hello)
            ));
        }
        Ok(conn)
    }

    /// Checks that a response is `ok: true`.
    fn ok(payload: &[u8]) -> Result<(), String> {
        let value = kernel::wire::cbor::decode(payload, &kernel::wire::CborLimits::default())
            .map_err(|e| e.to_string())?;
        match &value {
            Value::Map(pairs)
                if pairs
                    .iter()
                    .any(|(k, v)| k == "ok" && *v == Value::Bool(true)) =>
            {
                Ok(())
            }
            _ => Err(format!("the Node server refused: {value:?}")),
        }
    }
}

impl Drop for NodeHost {
    fn drop(&mut self) {
        crate::server::signal(self.child.id(), rustix::process::Signal::TERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// K subscribers of the Node host's stream.
struct Subscribers {
    conns: Vec<RawConn>,
}

impl Subscribers {
    async fn subscribe(host: &NodeHost, k: usize) -> Result<Self, String> {
        let mut conns = Vec::with_capacity(k);
        for _ in 0..k {
            let mut conn = host.connect().await?;
            let subscribe = host.request(
                "s",
                "$chord.service",
                "subscribe",
                vec![text("sub-1"), text("bench.stream"), text("singleton")],
            );
            conn.send(&subscribe).await.map_err(|e| e.to_string())?;
            let response = conn.until_response().await.map_err(|e| e.to_string())?;
            NodeHost::ok(&response)?;
            conns.push(conn);
        }
        Ok(Self { conns })
    }

    async fn round(
        &mut self,
        host: &NodeHost,
        n: usize,
        delay_ms: i64,
        pid: u32,
    ) -> Result<FanoutResult, String> {
        let run = host.request(
            "run",
            "bench.stream",
            "run",
            vec![Value::Int(n as i64), Value::Int(delay_ms)],
        );
        let cpu0 = crate::fanout::tree_cpu(pid);
        let started = Instant::now();
        let me0 = crate::util::schedstat(std::process::id()).0;
        let conns = std::mem::take(&mut self.conns);
        let k = conns.len();
        let mut tasks = Vec::with_capacity(k);
        for (i, conn) in conns.into_iter().enumerate().rev() {
            let first = (i == 0).then(|| run.clone());
            tasks.push(tokio::spawn(record_updates(conn, n, first)));
        }
        let mut per_client = Vec::with_capacity(k);
        let mut back = Vec::with_capacity(k);
        for task in tasks {
            let (conn, arrivals) = task
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            back.push(conn);
            per_client.push(arrivals);
        }
        back.reverse();
        per_client.reverse();
        self.conns = back;
        let mut result = analyze(&per_client, started);
        result.server_cpu = crate::fanout::tree_cpu(pid) - cpu0;
        result.client_cpu = (crate::util::schedstat(std::process::id()).0 - me0) as f64 / 1e9;
        Ok(result)
    }
}

/// One subscriber's reader: records `n` service updates.
pub(crate) async fn record_updates(
    mut conn: RawConn,
    n: usize,
    first: Option<Vec<u8>>,
) -> std::io::Result<(RawConn, crate::fanout::Arrivals)> {
    if let Some(bytes) = first {
        conn.send(&bytes).await?;
    }
    let mut arrivals = Vec::with_capacity(n);
    while arrivals.len() < n {
        conn.fill().await?;
        let now = Instant::now();
        conn.drain(|payload| {
            if kind(payload) == Kind::ServiceUpdate {
                arrivals.push((hash_bytes(payload), now));
            }
        });
    }
    Ok((conn, arrivals))
}

/// The per-round range of A/B (how many times faster B is).
fn inverse_spread(pair: &Pair) -> String {
    let inv: Vec<f64> = pair.ratios.iter().map(|r| 1.0 / r).collect();
    let s = crate::util::sorted(&inv);
    format!(
        "rounds {:.2}–{:.2}",
        s.first().copied().unwrap_or(f64::NAN),
        s.last().copied().unwrap_or(f64::NAN)
    )
}

/// Item 6.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let node_version = Process::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("node is not installed: {e}"))?;
    let node_version = String::from_utf8_lossy(&node_version.stdout)
        .trim()
        .to_string();
    let split = Split::from_env()?;
    let dir = install(env)?;
    let host = NodeHost::start(&dir, &env.fresh_dir("node").join("node.sock"), 1)?;
    let host_pid = host.child.id();

    let sessions = env.fresh_dir("node-sessions");
    // A fresh session for each fan-out: every turn grows the transcript and
    // the snapshots around the next turn (see fanout.rs).
    let ids = create_sessions(&sessions, 3, 1)?;
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "0".into())])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        // Round trips.
        let mut theirs = host.connect().await?;
        let list_v8 = vec![host.request("l", "bench", "list", Vec::new())];
        theirs.send(&list_v8[0]).await.map_err(|e| e.to_string())?;
        NodeHost::ok(&theirs.until_response().await.map_err(|e| e.to_string())?)?;
        let mut ours = RawConn::connect(&server.socket).await.map_err(|e| e.to_string())?;
        ours.hello_v1().await.map_err(|e| e.to_string())?;
        let list_v1 = vec![v1_request("l", Command::List)];
        let n = env.pick(200, 2000);
        cycles(&mut theirs, &list_v8, n / 5).await.map_err(|e| e.to_string())?;
        cycles(&mut ours, &list_v1, n / 5).await.map_err(|e| e.to_string())?;
        let placement = Placement::discover()?;
        for pinned in [true, false] {
            placement.apply(pinned, &[host_pid, server.pid])?;
            let mut pair = Pair::default();
            for _ in 0..env.rounds {
                let a = cycles(&mut theirs, &list_v8, n).await.map_err(|e| e.to_string())?;
                let b = cycles(&mut ours, &list_v1, n).await.map_err(|e| e.to_string())?;
                pair.round(a, b);
            }
            placement.apply(false, &[host_pid, server.pid])?;
            let (ours_rps, theirs_rps) = (1e6 / median(&pair.b), 1e6 / median(&pair.a));
            let where_ = if pinned {
                format!("all on CPU {}", placement.cpu)
            } else {
                "free placement".to_string()
            };
            report.info(
                "6",
                format!("request round trips/s, one client, sequential, {where_}: our `list` vs TypeScript pi-server 0.85.1 `bench.list` (Node {node_version})"),
                format!(
                    "ours {}/s ({}) vs TS {}/s ({}) → **ours {:.2}× theirs** ({})",
                    fmt_rate(ours_rps),
                    Pair::describe(&pair.b),
                    fmt_rate(theirs_rps),
                    Pair::describe(&pair.a),
                    ours_rps / theirs_rps,
                    inverse_spread(&pair)
                ),
            );
        }
        Ok::<(), String>(())
    })?;

    // Fan-out.
    let clients = Split::client_runtime(split.as_ref())?;
    if let Some(split) = &split {
        split.place(&[host_pid, server.pid]);
    }
    clients.block_on(async {
        let words = env.pick(300, 2000);
        for (k, id) in [(10usize, &ids[0]), (100, &ids[1])] {
            let prompt = prompt_frame(id, words);
            let mut audience = Audience::attach(&server.socket, id, k).await?;
            let warm = audience.round(&prompt, server.pid).await?;
            let n_events = warm.events;
            let mut subs = Subscribers::subscribe(&host, k).await?;
            subs.round(&host, n_events, 0, host_pid).await?;
            let mut theirs = Vec::new();
            let mut ours = Vec::new();
            for _ in 0..env.rounds.min(5) {
                theirs.push(subs.round(&host, n_events, 0, host_pid).await?);
                ours.push(audience.round(&prompt, server.pid).await?);
            }
            let (t, o) = (summarize(&theirs), summarize(&ours));
            report.info(
                "6",
                format!("event fan-out to {k} clients, {n_events} events: our progress fan-out vs TS subscription updates{}", Split::describe(split.as_ref())),
                format!(
                    "ours {}/s (first delivery after {}; skew p99 {}; first/last tenth of the clients {}/{}; {:.2} µs CPU/delivery) vs TS {}/s ({}; {}; {}/{}; {:.2} µs CPU/delivery) → **ours {:.2}× theirs**",
                    fmt_rate(o.rate),
                    crate::util::fmt_us(o.first_delivery),
                    crate::util::fmt_us(o.p99),
                    crate::util::fmt_us(o.p99_first),
                    crate::util::fmt_us(o.p99_last),
                    o.cpu_per_delivery_us,
                    fmt_rate(t.rate),
                    crate::util::fmt_us(t.first_delivery),
                    crate::util::fmt_us(t.p99),
                    crate::util::fmt_us(t.p99_first),
                    crate::util::fmt_us(t.p99_last),
                    t.cpu_per_delivery_us,
                    o.rate / t.rate
                ),
            );
            drop(subs);
            drop(audience);
            crate::util::wait_no_children(server.pid, Duration::from_secs(15));
        }
        Ok::<(), String>(())
    })?;
    drop(server);

    // Paced: one event per millisecond (the model's pace) to 100 clients; the latency they see.
    let server = Server::start(env, &sessions, &[("PI_FAUX_DELAY_MS", "1".into())])?;
    if let Some(split) = &split {
        split.place(&[host_pid, server.pid]);
    }
    clients.block_on(async {
        let k = 100;
        let prompt = prompt_frame(&ids[2], env.pick(200, 1000));
        let mut audience = Audience::attach(&server.socket, &ids[2], k).await?;
        let n_events = audience.round(&prompt, server.pid).await?.events;
        let mut subs = Subscribers::subscribe(&host, k).await?;
        subs.round(&host, n_events, 1, host_pid).await?;
        let (mut theirs, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..env.rounds.min(5) {
            theirs.push(subs.round(&host, n_events, 1, host_pid).await?);
            ours.push(audience.round(&prompt, server.pid).await?);
        }
        let (t, o) = (summarize(&theirs), summarize(&ours));
        report.info(
            "6",
            format!("paced fan-out (1 event/ms) to {k} clients, {n_events} events: delivery skew, ours vs TS{}", Split::describe(split.as_ref())),
            format!(
                "ours p50 {} p99 {} ({}/s, {:.2} µs CPU/delivery) vs TS p50 {} p99 {} ({}/s, {:.2} µs CPU/delivery) (medians of {} rounds)",
                crate::util::fmt_us(o.p50),
                crate::util::fmt_us(o.p99),
                fmt_rate(o.rate),
                o.cpu_per_delivery_us,
                crate::util::fmt_us(t.p50),
                crate::util::fmt_us(t.p99),
                fmt_rate(t.rate),
                t.cpu_per_delivery_us,
                theirs.len()
            ),
        );
        Ok::<(), String>(())
    })
}
