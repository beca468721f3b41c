//! The web listener's HTTP rules, over a real socket: what the page and the
//! socket path answer, and who is refused (the rules themselves are the
//! kernel's, unit-tested in `kernel::web`).

use super::*;
use kernel::server::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn listener() -> (SocketAddr, mpsc::Receiver<WebConn>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let policy = WebPolicy::for_listener(&listen_addr(addr), false, &[], &[], &[]);
    let mut web = serve(listener, policy, 1 << 20, SERVER_ID);
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move { while tx.send(web.accept().await).await.is_ok() {} });
    (addr, rx)
}

/// Sends `head` (request line and headers, without the blank line) and
/// returns the status code, the headers and the body.
async fn exchange(addr: SocketAddr, head: &str) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = Vec::new();
    // An upgraded socket stays open: read what the response head holds.
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        stream.read_to_end(&mut response),
    )
    .await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn upgrade(addr: SocketAddr, host: &str, origin: &str) -> String {
    let _ = addr;
    format!(
        "GET /ws HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
    )
}

#[tokio::test]
async fn the_page_is_served_with_its_security_headers() {
    let (addr, _rx) = listener().await;
    let (status, head, body) = exchange(addr, &format!("GET / HTTP/1.1\r\nHost: {addr}")).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(body.contains("<html"), "{body}");
    let (status, _, _) = exchange(addr, &format!("GET /nothing.js HTTP/1.1\r\nHost: {addr}")).await;
    assert_eq!(status, 404);
    let (status, _, _) = exchange(
        addr,
        &format!("GET /../Cargo.toml HTTP/1.1\r\nHost: {addr}"),
    )
    .await;
    assert!(status == 404 || status == 400, "{status}");
}

#[tokio::test]
async fn a_foreign_host_is_refused_with_a_plain_403() {
    let (addr, _rx) = listener().await;
    let (status, head, body) = exchange(
        addr,
        &format!("GET / HTTP/1.1\r\nHost: rebound.example:{}", addr.port()),
    )
    .await;
    assert_eq!(status, 403, "{head}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    assert!(body.contains("--allow-host rebound.example"), "{body}");
}

#[tokio::test]
async fn the_socket_path_without_an_upgrade_is_a_plain_426() {
    let (addr, _rx) = listener().await;
    let (status, head, body) = exchange(addr, &format!("GET /ws HTTP/1.1\r\nHost: {addr}")).await;
    assert_eq!(status, 426, "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(
        body.contains("pi protocol v1 or v8 over a WebSocket"),
        "{body}"
    );
}

#[tokio::test]
async fn a_socket_from_a_foreign_origin_is_refused_and_the_page_origin_upgrades() {
    let (addr, mut rx) = listener().await;
    let (status, _, body) = exchange(
        addr,
        &upgrade(addr, &addr.to_string(), "http://evil.example"),
    )
    .await;
    assert_eq!(status, 403);
    assert!(
        body.contains("Origin http://evil.example is not allowed"),
        "{body}"
    );
    assert!(rx.try_recv().is_err(), "no connection reached the loop");
    let (status, head, _) = exchange(
        addr,
        &upgrade(addr, &addr.to_string(), &format!("http://{addr}")),
    )
    .await;
    assert_eq!(status, 101, "{head}");
    let conn = tokio::time::timeout(std::time::Duration::from_secs(2), rx.recv())
        .await
        .expect("the upgraded socket reaches the loop")
        .unwrap();
    assert_eq!(conn.peer(), PeerAddr("127.0.0.1".into()));
    assert_eq!(conn.credential(), None);
}

/// A bearer token at the upgrade travels with the connection, for a v8
/// hello (which has none) to be checked with.
#[tokio::test]
async fn the_upgrade_s_bearer_token_goes_with_the_connection() {
    let (addr, mut rx) = listener().await;
    let head = upgrade(addr, &addr.to_string(), &format!("http://{addr}"));
    let (status, head, _) =
        exchange(addr, &format!("{head}\r\nAuthorization: Bearer s3cret")).await;
    assert_eq!(status, 101, "{head}");
    let conn = rx.recv().await.unwrap();
    assert_eq!(conn.credential().as_deref(), Some("s3cret"));
}

/// A browser page offers `pi.v8` and its token as a subprotocol (it cannot
/// set `Authorization`): the answer selects `pi.v8`, and the token travels
/// with the connection.
#[tokio::test]
async fn a_page_s_subprotocol_token_goes_with_the_connection_and_v8_is_selected() {
    let (addr, mut rx) = listener().await;
    let head = upgrade(addr, &addr.to_string(), &format!("http://{addr}"));
    // "s3cret" in base64url.
    let offer = "Sec-WebSocket-Protocol: pi.v8, pi.token.czNjcmV0";
    let (status, head, _) = exchange(addr, &format!("{head}\r\n{offer}")).await;
    assert_eq!(status, 101, "{head}");
    let selected = head
        .lines()
        .find_map(|l| l.strip_prefix("sec-websocket-protocol: "));
    assert_eq!(selected, Some("pi.v8"), "{head}");
    let conn = rx.recv().await.unwrap();
    assert_eq!(conn.credential().as_deref(), Some("s3cret"));
}

/// One message is one frame, both ways, and the end of the socket is the
/// end of the connection's bytes.
#[tokio::test]
async fn messages_carry_whole_frames_both_ways() {
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let (addr, mut rx) = listener().await;
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("origin", format!("http://{addr}").parse().unwrap());
    let (mut client, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let conn = rx.recv().await.unwrap();
    use futures_util::{SinkExt, StreamExt};
    client
        .send(Message::binary(vec![0, 0, 0, 1, 0xf6]))
        .await
        .unwrap();
    assert_eq!(
        std::future::poll_fn(|cx| conn.poll_read(cx)).await,
        Some(vec![0, 0, 0, 1, 0xf6])
    );
    let frames: Vec<Frame> = vec![
        Frame::from(&[0u8, 0, 0, 1, 1][..]),
        Frame::from(&[0u8, 0, 0, 1, 2][..]),
    ];
    assert_eq!(conn.try_write_frames(&frames, 0).unwrap(), 10);
    for expected in [[0u8, 0, 0, 1, 1], [0, 0, 0, 1, 2]] {
        let message = client.next().await.unwrap().unwrap();
        assert_eq!(message.into_data().as_ref(), &expected);
    }
    client.close(None).await.unwrap();
    assert_eq!(std::future::poll_fn(|cx| conn.poll_read(cx)).await, None);
}

const SERVER_ID: &str = "00000000-0000-4000-8000-0000000000c1";

/// The page reads the server's id and the kernel's client policy here, so
/// that it names the server and reconnects as every Rust client does.
#[tokio::test]
async fn the_client_policy_is_served_from_the_kernel_s_limits() {
    let (addr, _rx) = listener().await;
    let (status, head, body) =
        exchange(addr, &format!("GET {CLIENT_PATH} HTTP/1.1\r\nHost: {addr}")).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(served["serverId"], SERVER_ID);
    let limits = kernel::limits::ClientLimits::default();
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    assert_eq!(
        served["reconnectBackoffInitialMs"],
        ms(limits.reconnect_backoff_initial)
    );
    assert_eq!(
        served["reconnectBackoffMaxMs"],
        ms(limits.reconnect_backoff_max)
    );
    assert_eq!(served["reconnectWindowMs"], ms(limits.reconnect_window));
    assert_eq!(served["handshakeTimeoutMs"], ms(limits.handshake_timeout));
}
