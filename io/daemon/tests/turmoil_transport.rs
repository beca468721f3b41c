//! Network-fault tests of the real server and the client library, on
//! turmoil's simulated TCP network.
//!
//! Why turmoil serves here. turmoil runs several hosts in one process on
//! virtual time over a network it controls: latency, message order, held
//! and partitioned links, crashed and restarted hosts, all reproducible from
//! a seed. That is what the async client library (`pi_client`, reached
//! through [`Client::connect_stream`]) and the daemon (handshake deadline,
//! output accounting, fan-out, disconnects) need to be tested against: a
//! peer that goes quiet, a link that stalls, a server that vanishes
//! mid-turn. turmoil simulates TCP, not Unix sockets or child processes, so
//! the server host runs the daemon's own loop (`pi_daemon::server::run_on`) on
//! a simulated platform (`tests/support/mod.rs`): clients on simulated TCP,
//! each worker a task running the real worker loop (`pi_daemon::worker::run`)
//! with SQLite on the host's disk. A regression of either loop fails these
//! tests. Worker processes, the hand-off between servers and storage faults
//! are covered deterministically by the kernel-level simulator in `sim/`,
//! and the real binary by the end-to-end tests.
//!
//! Every test builds its simulation with a fixed seed, 1–20 ms of latency
//! per message and random host order; the determinism test checks that a
//! seed replays the exact same run.

mod support;

use kernel::limits::Limits;
use kernel::protocol::{
    AssistantStatus, Content, CreateParams, ErrorCode, ServerEvent, SessionPhase, SessionSnapshot,
    StopReason, TranscriptItem, TranscriptProgress,
};
use kernel::wire::CborLimits;
use pi_client::{Client, ClientError, ClientOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Log, PORT, note};
use tokio::sync::broadcast;
use turmoil::net::TcpStream;

const SEED: u64 = 0x7447;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn sim<'a>(seed: u64) -> turmoil::Sim<'a> {
    turmoil::Builder::new()
        .rng_seed(seed)
        .min_message_latency(ms(1))
        .max_message_latency(ms(20))
        .enable_random_order()
        .simulation_duration(Duration::from_secs(60))
        .build()
}

/// A server on a fresh disk; its steps are noted in `log` while the guard lives.
fn server_options(seed: u64, log: &Log) -> (support::Options, tracing::subscriber::DefaultGuard) {
    let options = support::Options {
        seed,
        limits: Limits::default(),
        faux_delay: ms(10),
        disk: support::Disk::fresh("server"),
    };
    (options, support::trace_steps(log))
}

/// Connects to the loopback server and runs the handshake.
async fn connect() -> Result<Client, ClientError> {
    let stream = TcpStream::connect(("server", PORT))
        .await
        .map_err(|e| pi_client::transport_error(&e))?;
    Client::connect_stream(stream, None, ClientOptions::default()).await
}

/// `n` short words: a prompt whose faux reply streams about `n / 2` deltas.
fn words(n: usize) -> String {
    let words: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    words.join(" ")
}

/// The status and text of the session's last assistant item.
fn last_reply(snapshot: &SessionSnapshot) -> Option<(AssistantStatus, String)> {
    snapshot
        .transcript
        .iter()
        .rev()
        .find_map(|item| match item {
            TranscriptItem::Assistant(a) => {
                let text = a.content.iter().filter_map(|c| match c {
                    Content::Text { text } => Some(text.as_str()),
                    _ => None,
                });
                Some((a.status, text.collect()))
            }
            _ => None,
        })
}

fn is_complete(snapshot: &SessionSnapshot) -> bool {
    matches!(
        last_reply(snapshot),
        Some((AssistantStatus::Complete(StopReason::Stop), _))
    )
}

/// Follows a client's events until the connection ends, noting each one.
/// Returns the streamed text deltas, concatenated, and how many there were.
fn follow(
    who: &'static str,
    mut events: broadcast::Receiver<ServerEvent>,
    log: &Log,
) -> tokio::task::JoinHandle<(String, usize)> {
    let log = log.clone();
    tokio::spawn(async move {
        let (mut text, mut deltas) = (String::new(), 0);
        while let Ok(event) = events.recv().await {
            let line = match event {
                ServerEvent::SessionProgress {
                    progress: TranscriptProgress::AssistantDelta { delta, .. },
                    ..
                } => {
                    text.push_str(&delta);
                    deltas += 1;
                    format!("delta {delta:?}")
                }
                ServerEvent::SessionProgress { progress, .. } => match progress {
                    TranscriptProgress::ItemStarted { .. } => "item started".into(),
                    TranscriptProgress::ItemUpdated { .. } => "item updated".into(),
                    _ => "item finished".into(),
                },
                ServerEvent::SessionSnapshot { snapshot } => {
                    format!("session r{} {:?}", snapshot.revision, snapshot.phase)
                }
                ServerEvent::ServerSnapshot { snapshot } => {
                    format!("server r{}", snapshot.revision)
                }
                ServerEvent::SessionRemoved { .. } => "session removed".into(),
            };
            note(&log, format!("{who} ← {line}"));
        }
        (text, deltas)
    })
}

/// Runs the simulation to its end, then prints what was noted (shown when a
/// test fails, or with `--nocapture`).
fn run(sim: &mut turmoil::Sim<'_>, log: &Log) {
    let outcome = sim.run();
    println!("{}", log.lock().unwrap().join("\n"));
    outcome.unwrap();
}

/// Polls `slot` (filled by another host) every few ms of simulated time.
async fn wait_for<T: Clone>(slot: &Arc<Mutex<Option<T>>>) -> T {
    loop {
        if let Some(value) = slot.lock().unwrap().clone() {
            return value;
        }
        tokio::time::sleep(ms(5)).await;
    }
}

/// Scenario of the first and the determinism tests: handshake, create, one
/// prompt. Returns everything the server and the client noted, in order.
fn prompt_scenario(seed: u64) -> Vec<String> {
    let log = Log::default();
    let mut sim = sim(seed);
    let (options, _steps) = server_options(seed, &log);
    sim.host("server", move || support::serve(options.clone()));
    let client_log = log.clone();
    sim.client("client", async move {
        let log = client_log;
        let client = connect().await?;
        note(&log, format!("client hello {}", client.connection_id()));
        let events = follow("client", client.events(), &log);
        let session = client.create(CreateParams::default()).await?;
        assert_eq!(session.phase, SessionPhase::Idle);
        let done = client
            .prompt(&session.id, "hello over simulated tcp")
            .await?;
        note(&log, format!("client prompt done r{}", done.revision));
        client.close().await;
        let (streamed, deltas) = events.await?;

        assert_eq!(done.phase, SessionPhase::Idle);
        let (status, text) = last_reply(&done).expect("an assistant item");
        assert_eq!(status, AssistantStatus::Complete(StopReason::Stop));
        assert!(text.contains("hello over simulated tcp"), "{text}");
        assert!(deltas >= 4, "the reply streamed in {deltas} deltas");
        assert_eq!(streamed, text, "the deltas add up to the reply");
        Ok(())
    });
    run(&mut sim, &log);
    log.lock().unwrap().clone()
}

/// The assertions are in [`prompt_scenario`].
#[test]
fn prompt_streams_deltas_and_completes_over_a_jittery_network() {
    prompt_scenario(SEED);
}

#[test]
fn a_seed_replays_the_same_run() {
    let first = prompt_scenario(SEED);
    let second = prompt_scenario(SEED);
    assert!(
        first.len() > 50,
        "a trace worth comparing: {} lines",
        first.len()
    );
    if first != second {
        let at = first.iter().zip(&second).position(|(a, b)| a != b);
        panic!("the runs diverge at line {at:?}");
    }
    let other = prompt_scenario(SEED + 1);
    assert_ne!(first, other, "another seed draws other latencies");
}

/// The client is partitioned from the server after the first delta. Its
/// prompt cannot complete; it gives up, the link is repaired and it hangs
/// up while the turn still runs. The turn completes anyway, is stored when
/// the session is disposed, and a client on another host finds it.
#[test]
fn a_partitioned_client_loses_its_prompt_but_not_the_turn() {
    let log = Log::default();
    let mut sim = sim(SEED);
    let (options, _steps) = server_options(SEED, &log);
    sim.host("server", move || support::serve(options.clone()));
    let slot: Arc<Mutex<Option<String>>> = Arc::default();
    let prompt_text = words(60);

    let (a_log, a_slot) = (log.clone(), slot.clone());
    sim.client("client-a", async move {
        let client = connect().await?;
        let mut events = client.events();
        let session = client.create(CreateParams::default()).await?;
        let mut prompt = Box::pin(client.prompt(&session.id, &prompt_text));
        loop {
            tokio::select! {
                biased;
                outcome = &mut prompt => panic!("the prompt ended before the partition: {outcome:?}"),
                event = events.recv() => {
                    if let ServerEvent::SessionProgress {
                        progress: TranscriptProgress::AssistantDelta { .. }, ..
                    } = event?
                    {
                        break;
                    }
                }
            }
        }
        turmoil::partition("client-a", "server");
        note(&a_log, "client-a partitioned");
        let outcome = tokio::time::timeout(ms(100), &mut prompt).await;
        assert!(outcome.is_err(), "no answer crosses a partition: {outcome:?}");
        drop(prompt);
        turmoil::repair("client-a", "server");
        note(&a_log, "client-a repaired, hangs up");
        client.close().await;
        *a_slot.lock().unwrap() = Some(session.id);
        Ok(())
    });

    let b_log = log.clone();
    sim.client("client-b", async move {
        let session_id = wait_for(&slot).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let client = connect().await?;
        let snapshot = client.attach(&session_id).await?;
        note(&b_log, format!("client-b attached r{}", snapshot.revision));
        assert_eq!(snapshot.phase, SessionPhase::Idle);
        let (status, text) = last_reply(&snapshot).expect("the assistant item");
        assert_eq!(status, AssistantStatus::Complete(StopReason::Stop));
        assert!(text.contains("w0 w1") && text.contains("w59"), "{text}");
        client.close().await;
        Ok(())
    });
    run(&mut sim, &log);

    let log = log.lock().unwrap();
    let position = |what: &str| {
        log.iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in\n{}", log.join("\n")))
    };
    // Client A's connection (c1) is gone while the prompt is in flight; the
    // turn finishes after it, and its worker is disposed once idle.
    let hung_up = position("c1 disconnected");
    let turn_done = position("w1 op done");
    assert!(hung_up < turn_done, "{}", log.join("\n"));
    assert!(log[turn_done..].iter().any(|l| l.contains("w1 ← dispose")));
    // Client B's attach reopened the stored session in a new worker.
    assert!(log.iter().any(|l| l.contains("spawn w2 (open)")));
}

/// The client's hello is held on the link for 6 s: the server's 5 s
/// handshake deadline fires, and once the link is released the client reads
/// `hello_error invalid_request "Handshake timeout"`.
#[test]
fn a_held_hello_meets_the_handshake_deadline() {
    let log = Log::default();
    let mut sim = sim(SEED);
    let (options, _steps) = server_options(SEED, &log);
    sim.host("server", move || support::serve(options.clone()));
    let client_log = log.clone();
    sim.client("client", async move {
        let stream = TcpStream::connect(("server", PORT)).await?;
        turmoil::hold("client", "server");
        let held_at = turmoil::sim_elapsed().unwrap();
        tokio::spawn(async {
            tokio::time::sleep(Duration::from_secs(6)).await;
            turmoil::release("client", "server");
        });
        let options = ClientOptions {
            handshake_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        };
        let outcome = Client::connect_stream(stream, None, options).await;
        note(&client_log, format!("client handshake: {outcome:?}"));
        match outcome {
            Err(ClientError::Server(error)) => {
                assert_eq!(error.code, ErrorCode::InvalidRequest);
                assert_eq!(error.message, "Handshake timeout");
            }
            other => panic!("expected hello_error, got {other:?}"),
        }
        let waited = turmoil::sim_elapsed().unwrap() - held_at;
        assert!(
            waited >= Duration::from_secs(6),
            "answered after {waited:?}"
        );
        Ok(())
    });
    run(&mut sim, &log);
    let log = log.lock().unwrap();
    assert!(
        log.iter()
            .any(|l| l.contains("tick") && l.contains("Handshake timeout")),
        "{}",
        log.join("\n")
    );
    assert!(
        !log.iter().any(|l| l.contains("c1 received")),
        "the hello stayed on the link"
    );
}

/// The server host crashes while a reply streams (its worker with it, as
/// on a machine that lost power): the client's prompt fails with the
/// connection. Once the host is back, a new connection (the same first
/// connection id: the kernel's ids come from the same seed) finds the
/// session on disk with the prompt it committed, and the interrupted reply
/// is not left streaming.
#[test]
fn a_server_crash_mid_prompt_ends_the_connection_and_a_bounce_finds_what_was_committed() {
    let log = Log::default();
    let mut sim = sim(SEED);
    let (options, _steps) = server_options(SEED, &log);
    sim.host("server", move || support::serve(options.clone()));
    let streaming = Arc::new(AtomicBool::new(false));

    let (client_log, flag) = (log.clone(), streaming.clone());
    sim.client("client", async move {
        let client = connect().await?;
        let first_id = client.connection_id().to_owned();
        let mut events = client.events();
        let session = client.create(CreateParams::default()).await?;
        let prompt = client.prompt(&session.id, "this reply will not finish");
        let watch = async {
            while let Ok(event) = events.recv().await {
                if let ServerEvent::SessionProgress {
                    progress: TranscriptProgress::AssistantDelta { .. },
                    ..
                } = event
                {
                    flag.store(true, Ordering::SeqCst);
                }
            }
        };
        let (outcome, ()) = tokio::join!(prompt, watch);
        note(&client_log, format!("client prompt: {outcome:?}"));
        assert!(
            matches!(
                outcome,
                Err(ClientError::Disconnected(_) | ClientError::Transport { .. })
            ),
            "{outcome:?}"
        );
        assert!(client.closed_reason().is_some());

        // Retry until the server is back.
        let client = loop {
            tokio::time::sleep(ms(50)).await;
            match connect().await {
                Ok(client) => break client,
                Err(error) => note(&client_log, format!("client reconnect: {error:?}")),
            }
        };
        assert_eq!(client.connection_id(), first_id);
        let listed = client.list().await?;
        assert!(
            listed.iter().any(|s| s.id == session.id),
            "the session survived the crash: {listed:?}"
        );
        let snapshot = client.attach(&session.id).await?;
        note(
            &client_log,
            format!("client attached r{}", snapshot.revision),
        );
        let prompted = snapshot.transcript.iter().any(|item| {
            matches!(item, TranscriptItem::User(u) if u.content.iter().any(|c| matches!(
                c, Content::Text { text } if text == "this reply will not finish"
            )))
        });
        assert!(prompted, "the committed prompt is there: {snapshot:?}");
        let (status, _) = last_reply(&snapshot).expect("the interrupted reply");
        assert_ne!(status, AssistantStatus::Streaming, "{snapshot:?}");
        assert_eq!(snapshot.phase, SessionPhase::Idle);
        client.close().await;
        Ok(())
    });

    let (mut crashed_at, mut bounced) = (None, false);
    while !sim
        .step()
        .unwrap_or_else(|e| panic!("{e}\n{}", log.lock().unwrap().join("\n")))
    {
        if crashed_at.is_none() && streaming.load(Ordering::SeqCst) {
            sim.crash("server");
            let at = sim.elapsed().as_millis();
            log.lock().unwrap().push(format!("{at:>6} server crashed"));
            crashed_at = Some(sim.elapsed());
        }
        if let Some(at) = crashed_at
            && !bounced
            && sim.elapsed() >= at + ms(200)
        {
            sim.bounce("server");
            bounced = true;
        }
    }
    println!("{}", log.lock().unwrap().join("\n"));
    assert!(bounced);
}

/// Two clients on two hosts follow one session; B is partitioned away.
/// A's reply still streams to the end (fan-out does not wait for B), and B
/// is cut off as a slow consumer once its unwritten output passes the bound.
#[test]
fn a_partitioned_follower_neither_blocks_fan_out_nor_buffers_without_bound() {
    const FRAME: u32 = 16 * 1024;
    let log = Log::default();
    let mut sim = sim(SEED);
    let (base, _steps) = server_options(SEED, &log);
    let options = support::Options {
        limits: Limits {
            max_frame_len: FRAME,
            max_output_bytes_per_connection: FRAME as usize + 4,
            cbor: CborLimits {
                max_byte_len: FRAME as usize,
                ..CborLimits::default()
            },
            ..Limits::default()
        },
        faux_delay: ms(1),
        ..base
    };
    sim.host("server", move || support::serve(options.clone()));
    let session: Arc<Mutex<Option<String>>> = Arc::default();
    let b_away: Arc<Mutex<Option<()>>> = Arc::default();
    let prompt_text = words(500);

    let (b_log, b_session, away) = (log.clone(), session.clone(), b_away.clone());
    sim.client("client-b", async move {
        let session_id = wait_for(&b_session).await;
        let client = connect().await?;
        client.attach(&session_id).await?;
        turmoil::partition("client-b", "server");
        note(&b_log, "client-b partitioned");
        *away.lock().unwrap() = Some(());
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(client);
        Ok(())
    });

    let a_log = log.clone();
    sim.client("client-a", async move {
        let client = connect().await?;
        let events = follow("client-a", client.events(), &a_log);
        let created = client.create(CreateParams::default()).await?;
        *session.lock().unwrap() = Some(created.id.clone());
        wait_for(&b_away).await;
        let done = client.prompt(&created.id, &prompt_text).await?;
        note(&a_log, "client-a prompt done");
        client.close().await;
        let (streamed, deltas) = events.await?;
        assert!(is_complete(&done));
        let (_, text) = last_reply(&done).unwrap();
        assert!(deltas > 200, "{deltas} deltas");
        assert_eq!(streamed, text, "A saw every delta");
        Ok(())
    });
    run(&mut sim, &log);

    let log = log.lock().unwrap();
    let position = |what: &str| {
        log.iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in\n{}", log.join("\n")))
    };
    let cut_off = position("close c2 (slow consumer)");
    let turn_done = position("w1 op done");
    assert!(cut_off < turn_done, "B is cut off while the reply streams");
    assert!(
        !log.iter().any(|l| l.contains("close c1")),
        "A is never closed"
    );
}
