//! `pi-server demo`: a throwaway server in a temporary directory, one
//! session, a streamed reply, and a second client that attaches and sees the
//! same snapshot and the same live deltas. Output lines say who speaks
//! (`[demo]`, `[client 1]`, `[client 2]`).

use super::activate::{connect_error, log_tail, no_server};
use super::stream::{Stream, stream_prompt, turn_outcome};
use crate::limits::{DEMO_POLL, DEMO_REPLY_WAIT, DEMO_REVISION_WAIT, DEMO_STOP_WAIT};
use crate::limits::{START_POLL_INTERVAL, START_TIMEOUT};
use kernel::protocol::{CreateParams, DeltaKind, ServerEvent, SessionSnapshot, TranscriptProgress};
use pi_client::Client;
use pi_config as config;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Instant;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::broadcast;

/// Delay between faux model deltas (slow enough to see the streaming).
const DEMO_FAUX_DELAY_MS: &str = "40";

pub(super) async fn run_demo() -> Result<(), String> {
    let name = format!("pi-demo-{:08x}", config::random_u64() as u32);
    let root = std::env::temp_dir().join(name);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    outln!(
        "[demo] a throwaway server in {} (embedded faux model, no network)",
        root.display()
    );
    let result = demo_in(&root).await;
    let removed = fs::remove_dir_all(&root);
    match &removed {
        Ok(()) => outln!("[demo] removed {}", root.display()),
        Err(e) => eprintln!("[demo] cannot remove {}: {e}", root.display()),
    }
    result?;
    outln!(
        "[demo] done. Try `pi-server create`, `pi-server prompt <id> <text>` and `pi-server attach <id>`."
    );
    Ok(())
}

/// Paths of the demo's server.
struct DemoServer {
    socket: PathBuf,
    log: PathBuf,
}

async fn demo_in(root: &Path) -> Result<(), String> {
    let server_dir = root.join("server");
    let server_id = config::new_uuid();
    let demo = DemoServer {
        socket: config::socket_path(&server_dir, &server_id),
        log: root.join("server.log"),
    };
    let log = fs::File::create(&demo.log).map_err(|e| format!("cannot create the log: {e}"))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot create the log: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut child = std::process::Command::new(exe)
        .arg("serve")
        .arg("--server-dir")
        .arg(&server_dir)
        .arg("--server-id")
        .arg(&server_id)
        .arg("--session-dir")
        .arg(root.join("sessions"))
        .env("PI_FAUX_DELAY_MS", DEMO_FAUX_DELAY_MS)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    outln!(
        "[demo] started `pi-server serve` (pid {}), log in {}",
        child.id(),
        demo.log.display()
    );
    let mut sigint =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle Ctrl-C: {e}"))?;
    let result = tokio::select! {
        result = demo_script(&demo, &mut child) => result,
        _ = sigint.recv() => Err("interrupted".to_owned()),
    };
    stop_demo_server(&mut child).await;
    result
}

async fn stop_demo_server(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    outln!("[demo] stopping the server (SIGTERM)");
    let pid = rustix::process::Pid::from_child(child);
    if rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_err() {
        let _ = child.kill();
    }
    let deadline = Instant::now() + DEMO_STOP_WAIT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            outln!("[demo] server stopped ({status})");
            return;
        }
        if Instant::now() >= deadline {
            eprintln!("[demo] the server did not stop within 5 s; killing it");
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        tokio::time::sleep(DEMO_POLL).await;
    }
}

async fn demo_connect(demo: &DemoServer, child: &mut Child) -> Result<Client, String> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match Client::connect(&demo.socket, None).await {
            Ok(client) => return Ok(client),
            Err(e) if no_server(&e) => {}
            Err(e) => return Err(connect_error(&demo.socket, e)),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the server exited during startup ({status}):{}",
                log_tail(&demo.log)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the server did not answer within {} s",
                START_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(START_POLL_INTERVAL).await;
    }
}

async fn demo_script(demo: &DemoServer, child: &mut Child) -> Result<(), String> {
    let first = demo_connect(demo, child).await?;
    let server = first.server_snapshot();
    let models: Vec<String> = server
        .models
        .iter()
        .map(|m| format!("{}/{}", m.provider, m.id))
        .collect();
    outln!(
        "[demo] the server answers at unix://{}",
        demo.socket.display()
    );
    outln!(
        "[client 1] connected: server {}, models {}",
        server.server_id,
        models.join(", ")
    );

    let params = CreateParams {
        cwd: Some(std::env::temp_dir().display().to_string()),
        name: Some("demo".into()),
        ..CreateParams::default()
    };
    let session = first
        .create(params)
        .await
        .map_err(|e| format!("create failed: {e}"))?;
    let id = session.id.clone();
    outln!(
        "[client 1] created session {id} (model {}/{})",
        session.model.provider,
        session.model.id
    );
    let snapshot = demo_prompt(&first, &id, "Hello, pi-server!", "[client 1]").await?;
    outln!(
        "[client 1] turn complete: revision {}, {} transcript items",
        snapshot.revision,
        snapshot.transcript.len()
    );

    let second = demo_connect(demo, child).await?;
    outln!("[client 2] connected");
    let theirs = second
        .attach(&id)
        .await
        .map_err(|e| format!("attach failed: {e}"))?;
    outln!(
        "[client 2] attached to the session: revision {}, {} transcript items, phase {}",
        theirs.revision,
        theirs.transcript.len(),
        theirs.phase.as_str()
    );
    let ours = wait_for_revision(&first, &id, theirs.revision).await;
    outln!(
        "[client 1] has its own copy: revision {}, {} transcript items",
        ours.revision,
        ours.transcript.len()
    );
    if ours.transcript != theirs.transcript {
        return Err("the two clients disagree about the transcript".into());
    }
    outln!("[demo] both clients hold the same session snapshot");

    let mut watching = second.events();
    let snapshot = demo_prompt(&first, &id, "Can both of you see this?", "[client 1]").await?;
    let seen = collect_reply(&mut watching, &id, snapshot.revision).await;
    outln!(
        "[client 2] saw the same reply live, in {} deltas: {seen:?}",
        seen.len()
    );
    let _ = second.detach(&id).await;
    outln!("[client 2] detached");
    second.close().await;
    first.close().await;
    Ok(())
}

async fn demo_prompt(
    client: &Client,
    id: &str,
    text: &str,
    label: &str,
) -> Result<SessionSnapshot, String> {
    outln!("{label} > {text}");
    let mut stream = Stream::new(false);
    stream.write(&format!("{label} < "));
    let snapshot = stream_prompt(client, id, text, &mut stream, None).await?;
    turn_outcome(&snapshot)?;
    Ok(snapshot)
}

/// The client's latest snapshot of `id` once it has reached `revision`
/// (or whatever it has after two seconds).
async fn wait_for_revision(client: &Client, id: &str, revision: u64) -> SessionSnapshot {
    let deadline = Instant::now() + DEMO_REVISION_WAIT;
    loop {
        if let Some(snapshot) = client.session_snapshot(id)
            && (snapshot.revision >= revision || Instant::now() >= deadline)
        {
            return snapshot;
        }
        tokio::time::sleep(DEMO_POLL).await;
    }
}

/// The text deltas of `id` received until a snapshot reaches `revision`.
async fn collect_reply(
    events: &mut broadcast::Receiver<ServerEvent>,
    id: &str,
    revision: u64,
) -> Vec<String> {
    let mut deltas = Vec::new();
    let deadline = tokio::time::Instant::now() + DEMO_REPLY_WAIT;
    while let Ok(Ok(event)) = tokio::time::timeout_at(deadline, events.recv()).await {
        match event {
            ServerEvent::SessionProgress {
                session_id,
                progress:
                    TranscriptProgress::AssistantDelta {
                        kind: DeltaKind::Text,
                        delta,
                        ..
                    },
            } if session_id == id => deltas.push(delta),
            ServerEvent::SessionSnapshot { snapshot }
                if snapshot.id == id && snapshot.revision >= revision =>
            {
                break;
            }
            _ => {}
        }
    }
    deltas
}
