//! Permissions of the server directory and socket, socket binding rules, and
//! hostile handshakes: each gets `hello_error` and a close while another
//! client keeps being served.

mod common;

use common::*;
use kernel::protocol::{ErrorCode, ServerMessage};
use pi_client::{Address, Client, ClientOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o777
}

/// Runs `serve` for the server's directories to completion and returns its
/// exit status and output (for configurations it must refuse).
fn serve_once(server: &TestServer) -> (std::process::ExitStatus, String) {
    let mut command = server.serve_command();
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // A serve that does not refuse would run forever: bound it.
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        signal(pid, Sig::Kill);
    });
    let output = child.wait_with_output().unwrap();
    let _ = killer.join();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status, text)
}

/// A session's directory is 0700 and its files 0600, whatever the umask.
#[tokio::test(flavor = "multi_thread")]
async fn session_files_are_private() {
    let server = TestServer::start("session-perm").await;
    let client = server.connect().await;
    let id = client.create(params("private")).await.unwrap().id;
    client.prompt(&id, "write something").await.unwrap();
    let dir = server.session_path(&id);
    assert_eq!(mode(&dir), 0o700, "session dir mode");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{} mode", path.display());
    }
    client.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_dir_is_private_and_sockets_are_0600() {
    let server = TestServer::start("perm").await;
    assert_eq!(mode(&server.server_dir), 0o700, "server dir mode");
    let meta = std::fs::symlink_metadata(&server.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o777, 0o600, "socket mode");
    let workers = server.server_dir.join(format!("{SERVER_ID}.workers.sock"));
    assert_eq!(mode(&workers), 0o600, "worker socket mode");
    let uid = std::fs::metadata(&server.root.path).unwrap().uid();
    assert_eq!(meta.uid(), uid);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_server_dir_is_refused_with_the_fix_not_chmod_ed() {
    let server = TestServer::new("open", Options::default());
    std::fs::create_dir_all(&server.server_dir).unwrap();
    std::fs::set_permissions(&server.server_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (status, output) = serve_once(&server);
    assert!(!status.success());
    assert!(
        output.contains("open to other users") && output.contains("chmod 700"),
        "{output}"
    );
    assert_eq!(
        mode(&server.server_dir),
        0o777,
        "never chmod-ed behind the user's back"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn non_directory_server_dir_is_refused() {
    let server = TestServer::new("notdir", Options::default());
    std::fs::write(&server.server_dir, "not a directory").unwrap();
    let (status, output) = serve_once(&server);
    assert!(!status.success());
    assert!(output.contains("is not a directory"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn server_dir_of_another_user_is_refused() {
    let server = TestServer::new("owner", Options::default());
    std::fs::create_dir_all(&server.server_dir).unwrap();
    std::fs::set_permissions(&server.server_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    if std::os::unix::fs::chown(&server.server_dir, Some(65534), Some(65534)).is_err() {
        eprintln!(
            "skipping: cannot chown the server dir (not root); ownership is checked by io/config/src/lib.rs"
        );
        return;
    }
    let (status, output) = serve_once(&server);
    assert!(!status.success());
    assert!(output.contains("owned by uid 65534"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn socket_binding_rules() {
    // A non-socket at the socket path is refused.
    let server = TestServer::new("bind", Options::default());
    std::fs::create_dir_all(&server.server_dir).unwrap();
    std::fs::set_permissions(&server.server_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(&server.socket, "x").unwrap();
    let (status, output) = serve_once(&server);
    assert!(!status.success(), "{output}");
    assert!(
        output.contains(&*server.socket.to_string_lossy()),
        "{output}"
    );
    assert_eq!(
        std::fs::read_to_string(&server.socket).unwrap(),
        "x",
        "left alone"
    );
    std::fs::remove_file(&server.socket).unwrap();

    // A stale socket (nobody listening) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&server.socket).unwrap());
    assert!(server.socket.exists());
    let mut server = server;
    server.spawn();
    server.wait_ready().await;

    // A live server there: a second one takes over by a hand-off (the
    // durable server), and at no moment do two serve the id.
    let client = server.connect().await;
    let session = client.create(params("kept")).await.unwrap().id;
    let status = server.replace().await;
    assert!(
        status.success(),
        "the replaced server exits 0, got {status}"
    );
    // The client reconnects to the new server by itself.
    until_reconnected(&client).await;
    assert_eq!(serve_count(&server), 1);
    assert_eq!(mode(&server.socket), 0o600);
    assert!(client.list().await.unwrap().iter().any(|m| m.id == session));
    client.close().await;
}

/// `serve` processes of this test.
fn serve_count(server: &TestServer) -> usize {
    server
        .root
        .processes()
        .into_iter()
        .filter(|pid| cmdline_of(*pid).get(1).map(String::as_str) == Some("serve"))
        .count()
}

/// Keeps prompting a session until `stop`, counting completed turns; any
/// failure panics the task.
fn witness(
    client: Arc<Client>,
    session: String,
    stop: Arc<AtomicBool>,
    turns: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let n = turns.load(Ordering::SeqCst);
            let text = format!("witness turn {n}");
            let done = within("a witness turn", client.prompt(&session, &text))
                .await
                .expect("the witness is served");
            assert!(text_of(assistants(&done).last().unwrap()).contains(&text));
            turns.fetch_add(1, Ordering::SeqCst);
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_handshakes_are_refused_while_others_are_served() {
    let options = Options {
        token: Some(TOKEN.into()),
        ..Options::default()
    };
    let server = TestServer::start_with("hostile", options).await;
    let good = Arc::new(server.connect().await);
    let session = good.create(params("witness")).await.unwrap().id;
    let stop = Arc::new(AtomicBool::new(false));
    let turns = Arc::new(AtomicUsize::new(0));
    let task = witness(
        Arc::clone(&good),
        session.clone(),
        Arc::clone(&stop),
        Arc::clone(&turns),
    );

    // The slow loris: one byte of a frame header, then nothing.
    let started = Instant::now();
    let mut loris = server.raw().await;
    loris.write(&[0]).await;

    // Each of these is refused at once, with the right code.
    let mut bad_token = server.raw().await;
    bad_token.hello(1, Some("wrong")).await;
    assert_eq!(bad_token.expect_hello_error().await.code, ErrorCode::Auth);
    good.list().await.unwrap();

    let mut no_token = server.raw().await;
    no_token.hello(1, None).await;
    assert_eq!(no_token.expect_hello_error().await.code, ErrorCode::Auth);

    let mut bad_version = server.raw().await;
    bad_version.hello(99, Some(TOKEN)).await;
    assert_eq!(
        bad_version.expect_hello_error().await.code,
        ErrorCode::Version
    );
    good.list().await.unwrap();

    // Garbage: a small frame whose payload is not CBOR.
    let mut garbage = server.raw().await;
    garbage.write(&[0, 0, 0, 4, 0xff, 0xfe, 0xfd, 0xfc]).await;
    let error = garbage.expect_hello_error().await;
    assert_eq!(error.code, ErrorCode::InvalidRequest, "{error:?}");
    good.list().await.unwrap();

    // Garbage: text where a frame header belongs (declares ~1.2 GB).
    let mut http = server.raw().await;
    http.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let error = http.expect_hello_error().await;
    assert_eq!(error.code, ErrorCode::InvalidRequest, "{error:?}");

    // A header declaring one byte more than 16 MiB, refused before any payload.
    let mut oversize = server.raw().await;
    oversize
        .write(&(16 * 1024 * 1024 + 1u32).to_be_bytes())
        .await;
    let error = oversize.expect_hello_error().await;
    assert_eq!(error.code, ErrorCode::InvalidRequest, "{error:?}");
    good.list().await.unwrap();

    // A valid hello, then a second hello.
    let mut twice = server.raw().await;
    twice.hello(1, Some(TOKEN)).await;
    assert!(matches!(twice.recv().await, Some(ServerMessage::Hello(_))));
    twice.hello(1, Some(TOKEN)).await;
    let error = twice.expect_hello_error().await;
    assert_eq!(error.code, ErrorCode::InvalidRequest, "{error:?}");
    good.list().await.unwrap();

    // The loris is cut off at the handshake deadline, not before.
    let error = loris.expect_hello_error().await;
    assert!(started.elapsed() >= Duration::from_millis(4900));
    assert_eq!(error.code, ErrorCode::InvalidRequest);
    assert!(error.message.contains("Handshake timeout"), "{error:?}");

    // Meanwhile (about 5 s) the witness kept being served.
    let during = turns.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    within("the witness", task).await.unwrap();
    assert!(
        during >= 3,
        "the witness completed only {during} turns while the loris stalled"
    );
    // And new clients are still welcome.
    let late = server.connect().await;
    assert!(late.list().await.unwrap().iter().any(|m| m.id == session));
    late.close().await;
}

/// A free TCP port on the loopback interface (bound, then released).
/// A token strong enough for a network listener.
const TOKEN: &str = "remote-token-0123456789abcdef";

/// A running server with [`TOKEN`] and a TCP listener, and its address.
async fn tcp_server(name: &str) -> (TestServer, String) {
    let address = format!("127.0.0.1:{}", free_port());
    let mut server = TestServer::new(
        name,
        Options {
            token: Some(TOKEN.into()),
            serve_args: vec!["--listen".into(), format!("tcp://{address}")],
            ..Options::default()
        },
    );
    server.spawn();
    server.wait_ready().await;
    (server, address)
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `serve --listen tcp://…` serves remote clients that bring the token and
/// refuses the others; without a token it refuses to start at all, leaving
/// nothing bound.
#[tokio::test(flavor = "multi_thread")]
async fn remote_clients_over_tcp_need_the_token() {
    let open = TestServer::new(
        "tcp-open",
        Options {
            serve_args: vec!["--listen".into(), "tcp://127.0.0.1:0".into()],
            ..Options::default()
        },
    );
    let (status, text) = serve_once(&open);
    assert!(!status.success(), "{text}");
    assert!(text.contains("it needs --token-file"), "{text}");
    assert!(!open.socket.exists(), "nothing is bound: {text}");

    let (server, address) = tcp_server("tcp").await;

    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let remote = Client::connect_stream(stream, Some(TOKEN), ClientOptions::default())
        .await
        .unwrap();
    let id = remote.create(params("remote")).await.unwrap().id;
    let done = remote.prompt(&id, "hello over tcp").await.unwrap();
    assert!(matches!(
        last_assistant_status(&done),
        Some(kernel::protocol::AssistantStatus::Complete(_))
    ));
    let listed = remote.list().await.unwrap();
    assert!(listed.iter().any(|m| m.id == id));
    // A local client sees the remote client's session.
    let local = server.connect().await;
    assert!(local.list().await.unwrap().iter().any(|m| m.id == id));

    for token in [Some("wrong"), None] {
        let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        let refused = Client::connect_stream(stream, token, ClientOptions::default()).await;
        let error = code(refused);
        assert_eq!(error.code, ErrorCode::Auth, "{token:?}: {error:?}");
    }
    remote
        .list()
        .await
        .expect("the remote client is still served");
    // Two failures lock this address for twice the back-off's base; the
    // right token is looked at again after that.
    tokio::time::sleep(
        kernel::limits::Limits::default().auth_backoff_base * 2 + Duration::from_millis(100),
    )
    .await;

    // The CLI reaches it too, with `--connect tcp://…` and the token file.
    let token_file = server.token_file.clone().unwrap();
    let token_file = token_file.to_str().unwrap();
    let connect = format!("tcp://{address}");
    let remote_cli = |args: &[&str]| {
        let mut command = std::process::Command::new(bin());
        command.arg("--connect").arg(&connect).args(args);
        server.root.isolate(&mut command);
        run(command)
    };
    let out = remote_cli(&[
        "--token-file",
        token_file,
        "prompt",
        &id,
        "and from the cli",
    ])
    .await
    .success();
    assert!(!out.stdout.trim().is_empty(), "{out:?}");
    let out = remote_cli(&["--token-file", token_file, "list", "-q"])
        .await
        .success();
    assert_eq!(out.stdout.trim(), id);
    let out = remote_cli(&["list"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("needs --token-file"), "{out:?}");

    remote.close().await;
    local.close().await;
}

/// A token guards the network listeners, not the user's own socket: with
/// `--listen`, local commands need no token while remote ones do (and find
/// it in `$PI_SERVER_TOKEN_FILE`); a token file others may read, or a weak
/// token, is refused for a network listener with the fix in the message.
#[tokio::test(flavor = "multi_thread")]
async fn a_network_token_leaves_the_local_socket_alone_and_must_be_strong() {
    for (token, mode, why) in [
        (TOKEN, 0o644, "chmod 600"),
        ("secret", 0o600, "bits of entropy"),
    ] {
        let weak = TestServer::new(
            "tcp-weak",
            Options {
                token: Some(token.into()),
                serve_args: vec!["--listen".into(), "tcp://127.0.0.1:0".into()],
                ..Options::default()
            },
        );
        let file = weak.token_file.clone().unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let (status, text) = serve_once(&weak);
        assert!(!status.success(), "{text}");
        assert!(
            text.contains("cannot guard a network listener") && text.contains(why),
            "{text}"
        );
        assert!(!weak.socket.exists(), "nothing is bound: {text}");
    }

    let (server, address) = tcp_server("tcp-local").await;
    // Local: no token, through the library and the CLI.
    let socket = Address::Unix(server.socket.clone());
    let local = Client::connect(&socket, None)
        .await
        .expect("no token needed");
    let id = local.create(params("local")).await.unwrap().id;
    let mut command = std::process::Command::new(bin());
    command
        .arg("--connect")
        .arg(format!("unix://{}", server.socket.display()))
        .args(["list", "-q"]);
    server.root.isolate(&mut command);
    let out = run(command).await.success();
    assert_eq!(out.stdout.trim(), id);
    // Remote: the token, from the environment.
    let remote = |env: Option<&std::path::Path>| {
        let mut command = std::process::Command::new(bin());
        command
            .arg("--connect")
            .arg(format!("tcp://{address}"))
            .args(["list", "-q"]);
        server.root.isolate(&mut command);
        if let Some(file) = env {
            command.env("PI_SERVER_TOKEN_FILE", file);
        }
        run(command)
    };
    let out = remote(server.token_file.as_deref()).await.success();
    assert_eq!(out.stdout.trim(), id);
    let out = remote(None).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("PI_SERVER_TOKEN_FILE"), "{out:?}");
    local.close().await;
}

/// Protocol v8 has no token in its hello: over the WebSocket, a remote
/// client presents it at the upgrade (`Authorization: Bearer`). With it
/// the v8 hello is answered; without it, or with a wrong one, `auth`.
#[tokio::test(flavor = "multi_thread")]
async fn v8_over_a_websocket_authenticates_at_the_upgrade() {
    use futures_util::{SinkExt, StreamExt};
    use kernel::wire::{Value, cbor};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

    let address = format!("127.0.0.1:{}", free_port());
    let mut server = TestServer::new(
        "ws-v8",
        Options {
            token: Some(TOKEN.into()),
            serve_args: vec!["--listen".into(), format!("http://{address}")],
            ..Options::default()
        },
    );
    server.spawn();
    server.wait_ready().await;
    let hello = {
        let value = Value::Map(vec![
            ("type".into(), Value::text("hello")),
            ("version".into(), Value::Int(8)),
        ]);
        let payload = cbor::to_vec(&value).unwrap();
        kernel::wire::frame::encode_frame(&payload, kernel::wire::frame::DEFAULT_MAX_FRAME_LEN)
            .unwrap()
    };
    for (token, expected) in [
        (Some(TOKEN), r#"Text("hello")"#),
        (Some("wrong"), "Invalid token"),
        (None, "present it at the transport"),
    ] {
        let mut request = format!("ws://{address}/ws").into_client_request().unwrap();
        let headers = request.headers_mut();
        headers.insert("origin", format!("http://{address}").parse().unwrap());
        if let Some(token) = token {
            headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        socket.send(Message::binary(hello.clone())).await.unwrap();
        let answer = tokio::time::timeout(WAIT, socket.next())
            .await
            .expect("an answer")
            .unwrap()
            .unwrap()
            .into_data();
        let value = cbor::decode(&answer[4..], &Default::default()).unwrap();
        let text = format!("{value:?}");
        assert!(text.contains(expected), "{token:?}: {text}");
        if token == Some(TOKEN) {
            assert!(text.contains("Int(8)"), "{text}");
        }
        // Failed tokens back off per address: let the next one be looked at.
        tokio::time::sleep(kernel::limits::Limits::default().auth_backoff_base * 2).await;
    }
}
