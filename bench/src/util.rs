//! Shared pieces: the environment (paths, the binary under test), statistics,
//! `/proc` readings, the machine description, the report table, and reading
//! one HTTP request for the mock model servers.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where things are and how hard to run.
#[derive(Debug)]
pub(crate) struct Env {
    /// The workspace root (holds the root `Cargo.toml`).
    pub(crate) workspace: PathBuf,
    /// Cargo's target directory (the parent of `release/bench`).
    pub(crate) target_dir: PathBuf,
    /// The `pi-server` binary under test.
    pub(crate) server_bin: PathBuf,
    /// A short private scratch directory (Unix socket paths must stay short).
    pub(crate) run_dir: PathBuf,
    /// Alternating rounds per pair.
    pub(crate) rounds: usize,
    /// Reduced sizes (for profiling under callgrind, or a smoke run).
    pub(crate) quick: bool,
}

impl Env {
    /// Finds the workspace and target directory, builds `pi-server` (release)
    /// unless `PI_SERVER_BIN` names one, and makes the scratch directory.
    pub(crate) fn discover() -> Result<Self, String> {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .ok_or("no workspace directory")?
            .to_path_buf();
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let target_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("cannot find the target directory from the bench binary's path")?
            .to_path_buf();
        let server_bin = match std::env::var_os("PI_SERVER_BIN") {
            Some(bin) => PathBuf::from(bin),
            None => {
                let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
                eprintln!("bench: building pi-server (release) ...");
                let status = Command::new(cargo)
                    .args([
                        "build",
                        "--release",
                        "-p",
                        "pi-server",
                        "--bin",
                        "pi-server",
                    ])
                    .env("CARGO_TARGET_DIR", &target_dir)
                    .current_dir(&workspace)
                    .status()
                    .map_err(|e| format!("cannot run cargo: {e}"))?;
                if !status.success() {
                    return Err(format!("cargo build of pi-server failed: {status}"));
                }
                target_dir.join("release").join("pi-server")
            }
        };
        if !server_bin.is_file() {
            return Err(format!("{} does not exist", server_bin.display()));
        }
        let run_dir = std::env::temp_dir().join(format!("pi-bench-{}", std::process::id()));
        std::fs::create_dir_all(&run_dir)
            .map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
        let quick = std::env::var_os("BENCH_QUICK").is_some_and(|v| v != "0");
        let rounds = std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if quick { 2 } else { 7 });
        Ok(Self {
            workspace,
            target_dir,
            server_bin,
            run_dir,
            rounds,
            quick,
        })
    }

    /// A fresh directory under the scratch directory.
    pub(crate) fn fresh_dir(&self, name: &str) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.run_dir.join(format!("{name}{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        dir
    }

    /// `quick` or `full` depending on the run size.
    pub(crate) fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("bench: kept {}", self.run_dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

// ---- statistics -------------------------------------------------------------

/// Percentile `p` (0..=100) of `sorted` by the nearest-rank method.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorted copy.
pub(crate) fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The median.
pub(crate) fn median(samples: &[f64]) -> f64 {
    percentile(&sorted(samples), 50.0)
}

/// Microseconds of a duration.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A compact human form of a number of microseconds.
pub(crate) fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

/// A rate with a k/M suffix.
pub(crate) fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A fast non-cryptographic hash of a frame payload (identifies a frame
/// across connections: the server encodes a broadcast once).
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    // Four independent lanes over 32-byte blocks: the readers of a fan-out
    // hash every delivery, and one multiply chain per byte string made the
    // instrument cost more per delivery than the server it measures.
    const MUL: u64 = 0x0000_0100_0000_01b3;
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let mut lanes = [
        0xcbf2_9ce4_8422_2325u64,
        0x9e37_79b9_7f4a_7c15,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
    ];
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (lane, w) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            *lane = (*lane ^ word(w)).wrapping_mul(MUL).rotate_left(29);
        }
    }
    let mut h =
        lanes[0] ^ lanes[1].rotate_left(7) ^ lanes[2].rotate_left(13) ^ lanes[3].rotate_left(19);
    for chunk in blocks.remainder().chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(MUL)
            .rotate_left(29);
    }
    h ^ bytes.len() as u64
}

/// Seconds of the (UTC) day of a log line's RFC 3339 timestamp.
pub(crate) fn log_time(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Seconds of the (UTC) day now, comparable with [`log_time`].
pub(crate) fn wall_sod() -> f64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() % 86_400) as f64 + f64::from(d.subsec_nanos()) / 1e9
}

// ---- /proc --------------------------------------------------------------------

/// Resident set size of a process in KiB (`VmRSS`).
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Nanoseconds a process's threads have run on a CPU and waited on a run
/// queue (sums of `/proc/<pid>/task/*/schedstat`).
pub(crate) fn schedstat(pid: u32) -> (u64, u64) {
    let (mut run, mut wait) = (0, 0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for task in tasks.flatten() {
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            let mut fields = stat
                .split_whitespace()
                .map(|f| f.parse::<u64>().unwrap_or(0));
            run += fields.next().unwrap_or(0);
            wait += fields.next().unwrap_or(0);
        }
    }
    (run, wait)
}

/// The workspace's commit, and whether the tree has uncommitted changes.
pub(crate) fn git_head(workspace: &Path) -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(workspace)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let head = run(&["rev-parse", "--short", "HEAD"]);
    let dirty = !run(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    format!(
        "{head}{}",
        if dirty { " + uncommitted changes" } else { "" }
    )
}

/// Context switches (voluntary + involuntary) of a process's threads.
pub(crate) fn ctx_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let mut total = 0;
    for task in tasks.flatten() {
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            total += status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
    }
    total
}

/// The load average line.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Child processes of `pid` (all threads).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Open file descriptors of a process.
pub(crate) fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Waits until `pid` has no child processes (a disposed worker exited).
pub(crate) fn wait_no_children(pid: u32, timeout: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        if children(pid).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// Raises the soft limit of open files to at least `want` (up to the hard limit).
pub(crate) fn raise_nofile(want: u64) -> (u64, u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let soft = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    if soft < want {
        let new = Rlimit {
            current: Some(want.min(hard)),
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, new).is_ok() {
            return (want.min(hard), hard);
        }
    }
    (soft, hard)
}

// ---- the machine ----------------------------------------------------------------

/// What the figures were measured on.
pub(crate) fn machine() -> String {
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{nproc} CPUs ({cpu}), {:.1} GiB RAM, Linux {}, {}",
        mem_kib as f64 / 1024.0 / 1024.0,
        kernel.trim(),
        today()
    )
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub(crate) fn today() -> String {
    let now = pi_daemon::worker::wall_now().as_millis();
    let stamp = kernel::time::format_utc(now);
    stamp.split(' ').next().unwrap_or_default().to_owned()
}

// ---- the report -------------------------------------------------------------------

/// One figure.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// Issue item (1..7).
    pub(crate) item: &'static str,
    /// What was measured.
    pub(crate) what: String,
    /// The figure.
    pub(crate) figure: String,
    /// The target, or "—".
    pub(crate) target: String,
    /// Met / missed / not applicable.
    pub(crate) met: Option<bool>,
}

/// Every figure of a run, printed as a Markdown table at the end.
#[derive(Debug, Default)]
pub(crate) struct Report {
    rows: Vec<Row>,
}

impl Report {
    /// Adds a figure with no target.
    pub(crate) fn info(&mut self, item: &'static str, what: impl Into<String>, figure: String) {
        self.push(item, what, figure, "—", None);
    }

    /// Adds a figure.
    pub(crate) fn push(
        &mut self,
        item: &'static str,
        what: impl Into<String>,
        figure: String,
        target: &str,
        met: Option<bool>,
    ) {
        let row = Row {
            item,
            what: what.into(),
            figure,
            target: target.into(),
            met,
        };
        println!(
            "  [{}] {}: {}   (target {}{})",
            row.item,
            row.what,
            row.figure,
            row.target,
            match row.met {
                Some(true) => ", met",
                Some(false) => ", MISSED",
                None => "",
            }
        );
        self.rows.push(row);
    }

    /// The Markdown table.
    pub(crate) fn markdown(&self) -> String {
        let mut out = String::new();
        out.push_str("| # | what | figure | target | met |\n|---|---|---|---|---|\n");
        for r in &self.rows {
            let met = match r.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "—",
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                r.item, r.what, r.figure, r.target, met
            );
        }
        out
    }
}

/// CPU placement for round-trip pairs: every thread of the processes
/// involved on one CPU, or back where the scheduler wants them.
///
/// A round trip between two processes on this 2-CPU VM is fast when they
/// take turns on one CPU and several times slower when each wake-up crosses
/// to the other, idle, CPU; left free, which one a pair gets flips with
/// timing (BENCHMARKS.md, item 1). On one CPU both sides of a ratio pay the
/// same, so the ratio measures the software.
#[derive(Debug)]
pub(crate) struct Placement {
    free: rustix::thread::CpuSet,
    one: rustix::thread::CpuSet,
    /// The CPU that "one" means.
    pub(crate) cpu: usize,
}

impl Placement {
    /// The current thread's mask is "free"; its first CPU is "one".
    pub(crate) fn discover() -> Result<Self, String> {
        let free = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
        let cpu = (0..rustix::thread::CpuSet::MAX_CPU)
            .find(|&cpu| free.is_set(cpu))
            .ok_or("no CPU in this process's affinity mask")?;
        let mut one = rustix::thread::CpuSet::new();
        one.set(cpu);
        Ok(Self { free, one, cpu })
    }

    /// Puts the calling thread (and what it spawns from now on) and every
    /// thread of `pids` on one CPU (`true`) or frees them.
    pub(crate) fn apply(&self, pinned: bool, pids: &[u32]) -> Result<(), String> {
        let set = if pinned { &self.one } else { &self.free };
        rustix::thread::sched_setaffinity(None, set).map_err(affinity_error)?;
        for &pid in pids {
            pin_threads(pid, set);
        }
        Ok(())
    }
}

fn affinity_error(e: rustix::io::Errno) -> String {
    format!("sched_setaffinity: {e}")
}

/// Puts every thread of process `pid` on `set`; threads it starts later
/// inherit the mask of the thread that starts them.
fn pin_threads(pid: u32, set: &rustix::thread::CpuSet) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().parse::<i32>().ok();
        if let Some(tid) = tid.and_then(rustix::process::Pid::from_raw) {
            // A thread may have exited since the listing.
            let _ = rustix::thread::sched_setaffinity(Some(tid), set);
        }
    }
}

/// `BENCH_SPLIT=<server CPUs>/<client CPUs>` (CPU lists as `taskset -c`
/// takes them: `0-1/2-3`, `0/1,2,3`): the servers under test, and the
/// workers they start, run on the first set; the bench's clients on the
/// second, read by one thread per CPU of it.
///
/// For the fan-out skew: where clients and server share the CPUs, the skew
/// measures when the clients get one (BENCHMARKS.md, item 3). Unset,
/// everything runs where the scheduler puts it and one thread reads every
/// client.
#[derive(Debug)]
pub(crate) struct Split {
    server: rustix::thread::CpuSet,
    clients: rustix::thread::CpuSet,
    client_cpus: usize,
    spec: String,
}

impl Split {
    /// `None` when `BENCH_SPLIT` is unset; an error names what is wrong with it.
    pub(crate) fn from_env() -> Result<Option<Self>, String> {
        let Ok(spec) = std::env::var("BENCH_SPLIT") else {
            return Ok(None);
        };
        let bad = |why: String| format!("BENCH_SPLIT={spec:?}: {why}");
        let (server, clients) = spec
            .split_once('/')
            .ok_or_else(|| bad("expected <server CPUs>/<client CPUs>, e.g. 0-1/2-3".into()))?;
        let allowed = rustix::thread::sched_getaffinity(None).map_err(|e| e.to_string())?;
        let (server, _) = cpu_list(server, &allowed).map_err(&bad)?;
        let (clients, client_cpus) = cpu_list(clients, &allowed).map_err(&bad)?;
        if let Some(cpu) =
            (0..rustix::thread::CpuSet::MAX_CPU).find(|&c| server.is_set(c) && clients.is_set(c))
        {
            return Err(bad(format!("CPU {cpu} is in both sets")));
        }
        Ok(Some(Self {
            server,
            clients,
            client_cpus,
            spec,
        }))
    }

    /// Moves every thread of `pids` and of their child processes to the
    /// server CPUs, and every thread of this process to the client CPUs.
    pub(crate) fn place(&self, pids: &[u32]) {
        for &pid in pids {
            pin_threads(pid, &self.server);
            for child in children(pid) {
                pin_threads(child, &self.server);
            }
        }
        pin_threads(std::process::id(), &self.clients);
    }

    /// The runtime that reads the clients: one thread, or with a split one
    /// per client CPU, kept on those CPUs.
    pub(crate) fn client_runtime(split: Option<&Self>) -> Result<tokio::runtime::Runtime, String> {
        let Some(split) = split else {
            return tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string());
        };
        let set = split.clients;
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(split.client_cpus)
            .on_thread_start(move || {
                let _ = rustix::thread::sched_setaffinity(None, &set);
            })
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    }

    /// For a figure's description: `` (`BENCH_SPLIT=0-1/2-3`: …)``, or
    /// nothing without a split.
    pub(crate) fn describe(split: Option<&Self>) -> String {
        split.map_or_else(String::new, |s| {
            format!(
                " (`BENCH_SPLIT={}`: server and worker on their CPUs, clients read by {} thread{} on theirs)",
                s.spec,
                s.client_cpus,
                if s.client_cpus == 1 { "" } else { "s" }
            )
        })
    }
}

/// Parses a CPU list (`0-1,3`), each CPU one this process may use; returns
/// the set and how many CPUs it holds.
fn cpu_list(
    text: &str,
    allowed: &rustix::thread::CpuSet,
) -> Result<(rustix::thread::CpuSet, usize), String> {
    let mut set = rustix::thread::CpuSet::new();
    let mut count = 0;
    for item in text.split(',') {
        let item = item.trim();
        let (from, to) = item.split_once('-').unwrap_or((item, item));
        let parse = |n: &str| {
            n.trim()
                .parse::<usize>()
                .map_err(|_| format!("{item:?} is not a CPU number or range"))
        };
        let (from, to) = (parse(from)?, parse(to)?);
        if from > to {
            return Err(format!("{item:?} is an empty range"));
        }
        for cpu in from..=to {
            if cpu >= rustix::thread::CpuSet::MAX_CPU || !allowed.is_set(cpu) {
                return Err(format!("CPU {cpu} is not one this process may use"));
            }
            if !set.is_set(cpu) {
                set.set(cpu);
                count += 1;
            }
        }
    }
    Ok((set, count))
}

/// Reads one HTTP/1.1 request from `reader`: its request line and its body
/// (`content-length` bytes). `None` when the peer closed before a full head.
pub(crate) fn read_http_request(
    reader: &mut impl std::io::BufRead,
) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line)? == 0 {
        return Ok(None);
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some((request_line, body)))
}

/// A connection drained (and counted) by a thread of its own.
#[derive(Debug)]
pub(crate) struct Drain {
    stream: std::os::unix::net::UnixStream,
    thread: Option<std::thread::JoinHandle<()>>,
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Drain {
    /// Drains `stream` until it closes.
    pub(crate) fn start(stream: std::os::unix::net::UnixStream) -> std::io::Result<Self> {
        let mut reader = stream.try_clone()?;
        let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = std::sync::Arc::clone(&received);
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 256 * 1024];
            while let Ok(n @ 1..) = std::io::Read::read(&mut reader, &mut buf) {
                count.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Ok(Self {
            stream,
            thread: Some(thread),
            received,
        })
    }

    /// Bytes drained so far.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
