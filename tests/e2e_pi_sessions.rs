//! Sessions pi's own durable server wrote: a directory whose `meta.json`
//! holds only `{createdAt, cwd}` is listed and, attached, starts with the
//! server's default model, keeping pi's creation time and cwd; one with
//! pi-durable storage is refused with a clear reason and left untouched.

mod common;

use common::*;
use kernel::protocol::{AssistantStatus, TranscriptItem};

#[tokio::test(flavor = "multi_thread")]
async fn a_session_pi_listed_is_listed_attached_and_kept() {
    let mut server = TestServer::new("pimeta", Options::default());
    let fresh = server.session_dir.join("demo-1");
    let durable = server.session_dir.join("demo-2");
    for dir in [&fresh, &durable] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("meta.json"),
            r#"{"createdAt":1700000000000,"cwd":"/tmp"}"#,
        )
        .unwrap();
    }
    let pi_database = b"SQLite format 3\0 (pi-durable)".to_vec();
    std::fs::write(durable.join("session.sqlite"), &pi_database).unwrap();
    server.spawn();
    server.wait_ready().await;

    let client = server.connect().await;
    let listed = client.list().await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["demo-1", "demo-2"]);
    assert!(listed.iter().all(|m| m.created_at == 1_700_000_000_000));

    let attached = client.attach("demo-1").await.unwrap();
    assert_eq!(attached.created_at, 1_700_000_000_000);
    assert_eq!(attached.cwd, "/tmp");
    assert_eq!(
        attached.model.provider, "faux",
        "the server's default model"
    );
    let done = client.prompt("demo-1", "hello pi").await.unwrap();
    assert!(matches!(
        done.transcript.last(),
        Some(TranscriptItem::Assistant(a)) if matches!(a.status, AssistantStatus::Complete(_))
    ));
    let meta = std::fs::read_to_string(fresh.join("meta.json")).unwrap();
    assert!(
        meta.contains("\"createdAt\": 1700000000000") && meta.contains("\"model\""),
        "{meta}"
    );

    let refused = client.attach("demo-2").await.unwrap_err().to_string();
    assert!(refused.contains("pi's own durable server"), "{refused}");
    assert_eq!(
        std::fs::read(durable.join("session.sqlite")).unwrap(),
        pi_database
    );
    assert_eq!(
        std::fs::read_to_string(durable.join("meta.json")).unwrap(),
        r#"{"createdAt":1700000000000,"cwd":"/tmp"}"#
    );
    client.close().await;
}
