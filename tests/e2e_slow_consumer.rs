//! A client that stops reading is cut off at its output bound (64 MiB of
//! queued output) while the other clients keep receiving.

mod common;

use common::*;
use kernel::protocol::{ClientMessage, Command, Request, ServerMessage};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

const CUT_OFF: &str = "cut off at its output bound";

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_stops_reading_is_cut_off() {
    let options = Options {
        faux_delay_ms: 1,
        ..Options::default()
    };
    let server = TestServer::start_with("slow", options).await;
    let good = server.connect().await;
    let session = good.create(params("big")).await.unwrap().id;

    // The slow client: a real handshake and attach, then it never reads again.
    let mut slow = server.raw().await;
    slow.hello(1, None).await;
    assert!(matches!(slow.recv().await, Some(ServerMessage::Hello(_))));
    slow.send(&ClientMessage::Request(Request {
        id: "attach-1".into(),
        command: Command::Attach {
            session_id: session.clone(),
        },
    }))
    .await;
    // A bystander on another session keeps receiving too.
    let bystander = server.connect().await;
    let other = bystander.create(params("small")).await.unwrap().id;

    // Each turn echoes a 1 MiB word, and every snapshot carries the whole
    // transcript, so the slow client's queue grows by several MiB a turn.
    let started = Instant::now();
    let mut turns = 0;
    let mut snapshot_len = 0;
    while !server.log().contains(CUT_OFF) {
        assert!(
            turns < 12,
            "not cut off after {turns} turns:\n{}",
            server.log()
        );
        let text = format!("{turns}{}", "x".repeat(1 << 20));
        let done = within("a big turn", good.prompt(&session, &text))
            .await
            .expect("the reading client is served");
        snapshot_len = done.transcript.len();
        bystander.prompt(&other, "still here").await.unwrap();
        turns += 1;
    }
    let elapsed = started.elapsed();
    eprintln!("cut off after {turns} turns in {elapsed:?} ({snapshot_len} transcript items)");

    // The slow client finds its connection closed once it reads what was buffered.
    within("the slow client's end of stream", async {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match slow.stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;

    // Everyone else is still served, live.
    let mut events = good.events();
    let done = good.prompt(&session, "after the cut").await.unwrap();
    assert!(text_of(assistants(&done).last().unwrap()).contains("after the cut"));
    next_event(&mut events, "the good client's snapshot", |e| {
        is_session_event_of(e, &session)
    })
    .await;
    bystander.prompt(&other, "me too").await.unwrap();
    let late = server.connect().await;
    assert_eq!(late.list().await.unwrap().len(), 2);
    assert!(
        elapsed < Duration::from_secs(20),
        "took {elapsed:?} to reach the bound"
    );
    good.close().await;
    bystander.close().await;
}
