//! Kill loops (issue #15): a turn streams while its worker is SIGKILLed, its
//! server is SIGKILLed and started again, or its server is replaced
//! gracefully, `rounds` times each, on one session whose transcript grows.
//!
//! After each round, every transcript item that was terminal before the
//! round must still be there, unchanged ("committed items checked / lost").
//! Also counted: attaches refused after a restart, the time from starting
//! the new server to the first attach answered, and, for a worker killed
//! mid-reply, the streamed characters a client was shown and the recovered
//! (aborted) reply does not keep, against the checkpoint bound (4 KiB or
//! 250 ms of text).

use crate::server::{Server, create_sessions, signal};
use crate::util::{Env, Report, fmt_us, percentile, sorted, us};
use kernel::protocol::{
    AssistantStatus, DeltaKind, ServerEvent, SessionPhase, SessionSnapshot, TranscriptItem,
    TranscriptProgress,
};
use pi_io::client::Client;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Streamed characters a client has been shown when the fault comes: from
/// this many, varied per round over about one reply.
const SHOWN_BEFORE_FAULT: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    WorkerKill,
    ServerKill,
    Replace,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::WorkerKill => "worker SIGKILL mid-turn",
            Self::ServerKill => "server SIGKILL mid-turn, immediate re-attach",
            Self::Replace => "graceful replacement mid-turn",
        }
    }
}

#[derive(Default)]
struct Tally {
    rounds: usize,
    checked: usize,
    lost: usize,
    refused: usize,
    to_first_snapshot: Vec<f64>,
    shown_not_kept: Vec<f64>,
    completed: usize,
}

struct Setup {
    identity: (PathBuf, String),
    sessions: PathBuf,
    log: PathBuf,
    vars: Vec<(&'static str, String)>,
    session: String,
}

pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let rounds = env.pick(20, 100);
    let dir = env.fresh_dir("killloop");
    let sessions = dir.join("sessions");
    let session = create_sessions(&sessions, 1, 1)?.remove(0);
    let setup = Setup {
        identity: (dir.join("servers"), pi_io::config::new_uuid()),
        sessions,
        log: dir.join("server.log"),
        vars: vec![("PI_FAUX_DELAY_MS", "2".into())],
        session,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut server = setup.start(env)?;
    for fault in [Fault::WorkerKill, Fault::ServerKill, Fault::Replace] {
        let mut tally = Tally::default();
        let started = Instant::now();
        for round in 0..rounds {
            runtime
                .block_on(one_round(env, &setup, &mut server, fault, &mut tally))
                .map_err(|e| format!("{} round {round}: {e}", fault.name()))?;
        }
        let name = fault.name();
        report.push(
            "killloop",
            format!(
                "{name}: committed items checked / lost ({} rounds)",
                tally.rounds
            ),
            format!("{} / {}", tally.checked, tally.lost),
            "0 lost",
            Some(tally.lost == 0),
        );
        if fault != Fault::WorkerKill {
            let s = sorted(&tally.to_first_snapshot);
            report.info(
                "killloop",
                format!(
                    "{name}: attaches refused; new server start → first attach answered p50 / p99"
                ),
                format!(
                    "{} refused; {} / {}",
                    tally.refused,
                    fmt_us(percentile(&s, 50.0)),
                    fmt_us(percentile(&s, 99.0))
                ),
            );
            report.push(
                "killloop",
                format!("{name}: turns that completed"),
                format!("{} / {}", tally.completed, tally.rounds),
                "all",
                Some(tally.completed == tally.rounds),
            );
        } else {
            let s = sorted(&tally.shown_not_kept);
            report.push(
                "killloop",
                format!("{name}: streamed chars shown and not kept, p50 / max"),
                format!(
                    "{:.0} / {:.0}",
                    percentile(&s, 50.0),
                    s.last().copied().unwrap_or(0.0)
                ),
                "≤ 4096 (checkpoint)",
                Some(s.last().copied().unwrap_or(0.0) <= 4096.0),
            );
        }
        println!(
            "  {name}: {rounds} rounds in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    server.stop();
    Ok(())
}

impl Setup {
    fn start(&self, env: &Env) -> Result<Server, String> {
        let mut server =
            Server::spawn_as(env, &self.identity, &self.sessions, &self.vars, &self.log)?;
        server.wait_bound(Duration::from_secs(30))?;
        Ok(server)
    }

    fn socket(&self) -> PathBuf {
        pi_io::config::socket_path(&self.identity.0, &self.identity.1)
    }
}

/// The terminal items of a snapshot, as text to compare.
fn committed(snapshot: &SessionSnapshot) -> Vec<String> {
    snapshot
        .transcript
        .iter()
        .filter(|item| match item {
            TranscriptItem::Assistant(a) => !matches!(a.status, AssistantStatus::Streaming),
            _ => true,
        })
        .map(|item| format!("{item:?}"))
        .collect()
}

async fn connect(socket: &Path) -> Result<Client, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect(socket, None).await {
            Ok(client) => return Ok(client),
            Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Attaches until answered; counts refusals.
async fn attach(
    client: &Client,
    session: &str,
    refused: &mut usize,
) -> Result<SessionSnapshot, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.attach(session).await {
            Ok(snapshot) => return Ok(snapshot),
            Err(e) if Instant::now() > deadline => return Err(format!("attach: {e}")),
            Err(_) => {
                *refused += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

async fn one_round(
    env: &Env,
    setup: &Setup,
    server: &mut Server,
    fault: Fault,
    tally: &mut Tally,
) -> Result<(), String> {
    let fault_at = SHOWN_BEFORE_FAULT + (tally.rounds * 97) % 600;
    let socket = setup.socket();
    let client = connect(&socket).await?;
    let mut ignored = 0;
    let before = attach(&client, &setup.session, &mut ignored).await?;
    let kept_before = committed(&before);
    let mut events = client.events();
    let prompt = {
        let client = client.clone();
        let session = setup.session.clone();
        let text = (0..150)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        tokio::spawn(async move { client.prompt(&session, &text).await })
    };
    // Wait until the reply has shown enough text.
    let mut shown = String::new();
    let wait = tokio::time::timeout(Duration::from_secs(30), async {
        while shown.len() < fault_at {
            match events.recv().await {
                Ok(ServerEvent::SessionProgress {
                    progress:
                        TranscriptProgress::AssistantDelta {
                            kind: DeltaKind::Text,
                            delta,
                            ..
                        },
                    ..
                }) => shown.push_str(&delta),
                Ok(_) => {}
                Err(e) => return Err(format!("events: {e}")),
            }
        }
        Ok(())
    });
    wait.await
        .map_err(|_| "the reply did not stream".to_string())??;

    let after = match fault {
        Fault::WorkerKill => {
            let holder = pi_io::store::live_holder(&setup.sessions, &setup.session)
                .ok_or("no live worker holds the session")?;
            signal(holder.pid, rustix::process::Signal::KILL);
            let _ = prompt.await;
            let mut refused = 0;
            let snapshot = attach(&client, &setup.session, &mut refused).await?;
            let kept = match snapshot.transcript.last() {
                Some(TranscriptItem::Assistant(a)) => kernel::client::follow::text_of(&a.content),
                _ => String::new(),
            };
            if !shown.starts_with(&kept) && !kept.starts_with(&shown) {
                return Err(format!(
                    "kept text {kept:?} is not what was shown {shown:?}"
                ));
            }
            tally
                .shown_not_kept
                .push(shown.len().saturating_sub(kept.len()) as f64);
            client.close().await;
            snapshot
        }
        Fault::ServerKill | Fault::Replace => {
            let started = Instant::now();
            if fault == Fault::ServerKill {
                server.kill();
            }
            let mut next = setup.start(env)?;
            if fault == Fault::Replace {
                // The old server hands its workers over and exits.
                server.wait_exit(Duration::from_secs(30))?;
            }
            std::mem::swap(server, &mut next);
            drop(next);
            let fresh = connect(&socket).await?;
            let first = attach(&fresh, &setup.session, &mut tally.refused).await?;
            tally.to_first_snapshot.push(us(started.elapsed()));
            // The turn goes on in the surviving worker; wait for its end.
            let mut events = fresh.events();
            let mut last = first;
            let deadline = Instant::now() + Duration::from_secs(60);
            while last.phase != SessionPhase::Idle {
                if Instant::now() > deadline {
                    return Err("the turn did not end".into());
                }
                if let Ok(Ok(ServerEvent::SessionSnapshot { snapshot })) =
                    tokio::time::timeout(Duration::from_millis(200), events.recv()).await
                    && snapshot.id == setup.session
                {
                    last = snapshot;
                } else if let Some(s) = fresh.session_snapshot(&setup.session) {
                    last = s;
                }
            }
            if matches!(last.transcript.last(), Some(TranscriptItem::Assistant(a)) if matches!(a.status, AssistantStatus::Complete(_)))
            {
                tally.completed += 1;
            }
            prompt.abort();
            client.close().await;
            fresh.close().await;
            last
        }
    };
    let kept_after = committed(&after);
    tally.rounds += 1;
    tally.checked += kept_before.len();
    tally.lost += kept_before
        .iter()
        .zip(kept_after.iter().chain(std::iter::repeat(&String::new())))
        .filter(|(a, b)| a != b)
        .count();
    Ok(())
}
