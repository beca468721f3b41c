//! The lease layer of the client library (`pi_client::leases`) against
//! the real `pi-server serve` with faux models.

mod common;

use common::*;
use kernel::protocol::{ErrorCode, ModelRef, ThinkingLevel};
use pi_client::ClientError;
use pi_client::leases::{LeaseMode, Sessions};

#[tokio::test(flavor = "multi_thread")]
async fn leases_against_a_real_server() {
    let mut server = TestServer::start("client-leases").await;
    let sessions = Sessions::new(server.connect_once().await);
    let mut events = sessions.events();

    // create: an exclusive lease; a shared one beside it is refused.
    let owner = within("create", sessions.create(params("leased")))
        .await
        .unwrap();
    let id = owner.session_id().to_owned();
    assert!(matches!(
        sessions.acquire(&id, LeaseMode::Shared).await,
        Err(ClientError::Ownership { .. })
    ));

    // A prompt through the lease streams deltas and completes.
    let snapshot = within("prompt", owner.prompt(&long_text(20)))
        .await
        .unwrap();
    assert!(!assistants(&snapshot).is_empty());
    let seen = drain(&mut events);
    assert!(seen.iter().any(|e| is_delta_of(e, &id)), "{seen:?}");
    let reasoner = ModelRef {
        provider: "faux".into(),
        id: "faux-reasoner".into(),
    };
    within("set_model", owner.set_model(reasoner))
        .await
        .unwrap();
    let snapshot = within("set_thinking", owner.set_thinking(ThinkingLevel::High))
        .await
        .unwrap();
    assert_eq!(snapshot.thinking_level, ThinkingLevel::High);

    // Release, then two shared leases share the session.
    within("release", owner.release()).await.unwrap();
    assert!(matches!(
        owner.prompt("x").await,
        Err(ClientError::Detached { .. })
    ));
    let a = within("acquire a", sessions.acquire(&id, LeaseMode::Shared))
        .await
        .unwrap();
    let b = within("acquire b", sessions.acquire(&id, LeaseMode::Shared))
        .await
        .unwrap();
    assert!(matches!(
        sessions.acquire(&id, LeaseMode::Exclusive).await,
        Err(ClientError::Ownership { .. })
    ));
    within("dispose a", a.dispose()).await.unwrap();
    within("dispose a again", a.dispose()).await.unwrap();
    // b still works (the session stayed attached): the server's refusal of
    // an idle abort arrives as a server error with its code.
    match within("abort", b.abort()).await {
        Err(ClientError::Server(e)) => assert_eq!(e.code, ErrorCode::Busy),
        other => panic!("expected busy, got {other:?}"),
    }
    let listed = within("list", sessions.list()).await.unwrap();
    assert!(listed.iter().any(|s| s.id == id));

    // The server going away invalidates every lease.
    server.terminate().await;
    within("closed", async {
        while sessions.client().closed_reason().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    let mut outcome = b.prompt("x").await;
    for _ in 0..100 {
        if matches!(outcome, Err(ClientError::Disconnected(_))) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        outcome = b.prompt("x").await;
    }
    assert!(
        matches!(outcome, Err(ClientError::Disconnected(_))),
        "{outcome:?}"
    );
}
