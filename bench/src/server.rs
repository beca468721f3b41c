//! The real `pi-server serve` process, and stored sessions made with the store.

use crate::util::Env;
use kernel::faux;
use kernel::protocol::ThinkingLevel;
use kernel::runtime::StoredSession;
use pi_store::SessionStore;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `pi-server serve`. Stopped with SIGTERM (then SIGKILL) on drop.
#[derive(Debug)]
pub(crate) struct Server {
    child: Option<Child>,
    /// `perf record` attached to it (`BENCH_PERF=1`).
    perf: Option<Child>,
    /// Its process id.
    pub(crate) pid: u32,
    /// The client socket.
    pub(crate) socket: PathBuf,
    /// Its log (stderr).
    pub(crate) log: PathBuf,
    /// When it was spawned.
    pub(crate) spawned: Instant,
}

impl Server {
    /// Spawns a server on `session_dir` and waits until its socket is bound.
    pub(crate) fn start(
        env: &Env,
        session_dir: &Path,
        vars: &[(&str, String)],
    ) -> Result<Self, String> {
        let mut server = Self::spawn(env, session_dir, vars)?;
        server.wait_bound(Duration::from_secs(60))?;
        if std::env::var_os("BENCH_PERF").is_some_and(|v| v != "0") {
            server.perf = Some(start_perf(env, server.pid)?);
        }
        Ok(server)
    }

    /// Spawns a server on `session_dir` without waiting.
    pub(crate) fn spawn(
        env: &Env,
        session_dir: &Path,
        vars: &[(&str, String)],
    ) -> Result<Self, String> {
        let dir = env.fresh_dir("srv");
        let identity = (dir.join("s"), pi_config::new_uuid());
        Self::spawn_as(env, &identity, session_dir, vars, &dir.join("server.log"))
    }

    /// Spawns a server that also serves the web listener on a free loopback
    /// port, with a token; waits until it is bound. Returns the server, the
    /// listener's `host:port` and the token.
    pub(crate) fn start_web(
        env: &Env,
        session_dir: &Path,
        vars: &[(&str, String)],
    ) -> Result<(Self, String, String), String> {
        let dir = env.fresh_dir("srv");
        let (args, addr, token) = web_listener(&dir)?;
        let identity = (dir.join("s"), pi_config::new_uuid());
        let mut server = Self::spawn_with(
            env,
            &identity,
            session_dir,
            vars,
            &dir.join("server.log"),
            &args,
        )?;
        server.wait_bound(Duration::from_secs(60))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            if Instant::now() > deadline {
                return Err(format!("the web listener at {addr} never answered"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((server, addr, token))
    }

    /// Spawns a server with this `(server dir, server id)`, as a restart or
    /// a replacement does, logging to `log` (appended).
    pub(crate) fn spawn_as(
        env: &Env,
        identity: &(PathBuf, String),
        session_dir: &Path,
        vars: &[(&str, String)],
        log: &Path,
    ) -> Result<Self, String> {
        Self::spawn_with(env, identity, session_dir, vars, log, &[])
    }

    pub(crate) fn spawn_with(
        env: &Env,
        (server_dir, server_id): &(PathBuf, String),
        session_dir: &Path,
        vars: &[(&str, String)],
        log: &Path,
        args: &[String],
    ) -> Result<Self, String> {
        let log = log.to_owned();
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(&env.server_bin);
        cmd.arg("serve")
            .arg("--server-dir")
            .arg(server_dir)
            .arg("--session-dir")
            .arg(session_dir)
            .arg("--server-id")
            .arg(server_id)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let spawned = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn {}: {e}", env.server_bin.display()))?;
        Ok(Self {
            pid: child.id(),
            child: Some(child),
            perf: None,
            socket: pi_config::socket_path(server_dir, server_id),
            log,
            spawned,
        })
    }

    /// A pi v1 client of this server (the library every front end uses),
    /// on a one-thread runtime of its own; `who` names it in errors.
    pub(crate) fn client(
        &self,
        who: &str,
    ) -> Result<(tokio::runtime::Runtime, pi_client::Client), String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = runtime
            .block_on(pi_client::Client::connect(&self.socket, None))
            .map_err(|e| format!("{who}: {e}"))?;
        Ok((runtime, client))
    }

    /// Waits until the client socket exists.
    pub(crate) fn wait_bound(&mut self, timeout: Duration) -> Result<(), String> {
        while !self.socket.exists() {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "pi-server exited ({status}) before binding; log: {}",
                    self.log_tail()
                ));
            }
            if self.spawned.elapsed() > timeout {
                return Err("pi-server did not bind its socket in time".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// The last lines of the log.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    /// The log text.
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until it exits by itself (after handing over to a successor).
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Result<(), String> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(format!(
            "pi-server {} did not exit within {timeout:?}",
            self.pid
        ))
    }

    /// SIGKILL, and reap it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL if it is still running after `grace`.
    pub(crate) fn stop(&mut self) {
        if let Some(mut perf) = self.perf.take() {
            signal(perf.id(), rustix::process::Signal::INT);
            let _ = perf.wait();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(self.pid, rustix::process::Signal::TERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `perf record` (software clock, DWARF call graphs unless `BENCH_PERF=flat`) of process `pid`, into
/// `<target>/bench-perf/server-<pid>.data`.
fn start_perf(env: &Env, pid: u32) -> Result<Child, String> {
    let dir = env.target_dir.join("bench-perf");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let out = dir.join(format!("server-{pid}.data"));
    println!("  perf record of server pid {pid} -> {}", out.display());
    // `BENCH_PERF=flat`: no call graphs (less overhead, self time only).
    let graph: &[&str] = if std::env::var("BENCH_PERF").is_ok_and(|v| v == "flat") {
        &[]
    } else {
        &["--call-graph", "dwarf,32768"]
    };
    let child = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "4999"])
        .args(graph)
        .arg("-p")
        .arg(pid.to_string())
        .arg("-o")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run perf: {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(child)
}

/// A web listener on a free loopback port with a token written (private)
/// under `dir`: `serve`'s arguments for it, its `host:port` and the token.
pub(crate) fn web_listener(dir: &Path) -> Result<(Vec<String>, String, String), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let token = pi_config::new_uuid();
    let token_file = dir.join("token");
    std::fs::write(&token_file, &token).map_err(|e| e.to_string())?;
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .map_err(|e| e.to_string())?;
    let args = vec![
        "--listen".to_string(),
        format!("http://{addr}"),
        "--token-file".to_string(),
        token_file.display().to_string(),
    ];
    Ok((args, addr, token))
}

/// Sends `sig` to `pid`.
pub(crate) fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// A new session's stored state.
pub(crate) fn stored_session(id: &str, created_at: u64) -> StoredSession {
    StoredSession {
        id: id.into(),
        name: Some(format!("bench {}", &id[..8.min(id.len())])),
        cwd: "/work/bench".into(),
        created_at,
        updated_at: created_at,
        model: faux::default_model(),
        thinking_level: ThinkingLevel::Off,
        revision: 1,
        transcript: Vec::new(),
        queued_steer: Vec::new(),
        summary: None,
        approvals: Default::default(),
    }
}

/// Creates `n` stored sessions under `dir` with the store (in `threads`
/// threads); returns their ids. Their working directory is `cwd` beside
/// `dir` (created), so a tool a bench runs there finds it.
pub(crate) fn create_sessions(dir: &Path, n: usize, threads: usize) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cwd = dir.parent().unwrap_or(dir).join("cwd");
    std::fs::create_dir_all(&cwd).map_err(|e| format!("{}: {e}", cwd.display()))?;
    let cwd = cwd.to_str().ok_or("a scratch path that is not UTF-8")?;
    let ids: Vec<String> = (0..n).map(|_| pi_config::new_uuid()).collect();
    let chunk = n.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = ids
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || -> Result<(), String> {
                    for (i, id) in part.iter().enumerate() {
                        let stored = StoredSession {
                            cwd: cwd.into(),
                            ..stored_session(id, 1_700_000_000_000 + i as u64)
                        };
                        let store =
                            SessionStore::create(dir, &stored).map_err(|e| e.to_string())?;
                        drop(store);
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| "a creating thread panicked".to_string())?
        })
    })?;
    Ok(ids)
}
