//! The daemon's loop in-process: `bind` then `run`, stopped through its
//! stop channel instead of a signal.

use pi_client::Client;
use pi_daemon::server::{ServeOptions, bind, run};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// A fresh, not yet existing directory under the system's temporary one.
fn fresh_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    std::env::temp_dir().join(format!("pi-{name}-{}-{nanos}", std::process::id()))
}

fn options(root: &std::path::Path) -> ServeOptions {
    ServeOptions {
        server_dir: root.join("server"),
        server_id: "00000000-0000-4000-8000-00000000a11a".into(),
        session_dir: root.join("sessions"),
        token: None,
        idle_exit: None,
        listen_tcp: None,
        listen_web: None,
        web_access: Default::default(),
    }
}

#[tokio::test]
async fn bind_then_run_serves_and_a_stop_request_shuts_it_down() {
    let root = fresh_dir("run");
    let opts = options(&root);
    let socket = pi_config::socket_path(&opts.server_dir, &opts.server_id);
    let bound = bind(opts).await.expect("binds");
    assert!(socket.exists(), "bound before it runs");
    let (stop, stops) = mpsc::channel(2);
    let server = tokio::spawn(run(bound, stops));

    let client = Client::connect(&socket, None).await.expect("connects");
    assert!(client.list().await.expect("lists").is_empty());

    stop.send(()).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("stops within 10 s")
        .expect("the loop did not panic");
    assert_eq!(result, Ok(()));
    assert!(!socket.exists(), "its socket is removed");
    client.close().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn bind_refuses_tcp_without_a_token_and_leaves_nothing_behind() {
    let root = fresh_dir("bind");
    let mut opts = options(&root);
    opts.listen_tcp = Some("127.0.0.1:0".into());
    let Err(e) = bind(opts).await else {
        panic!("a TCP listener without a token must be refused");
    };
    assert!(e.contains("--token-file"), "{e}");
    assert!(!root.exists(), "refused before anything was created");
}

#[tokio::test]
async fn a_failed_tcp_bind_removes_the_unix_sockets() {
    let root = fresh_dir("tcp");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut opts = options(&root);
    opts.token = Some("t".into());
    opts.listen_tcp = Some(taken.local_addr().unwrap().to_string());
    let socket = pi_config::socket_path(&opts.server_dir, &opts.server_id);
    let Err(e) = bind(opts).await else {
        panic!("the port is taken");
    };
    assert!(e.contains("cannot listen on tcp://"), "{e}");
    assert!(!socket.exists(), "no socket left that nobody serves");
    let _ = std::fs::remove_dir_all(&root);
}
