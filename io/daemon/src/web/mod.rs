//! The web listener (`serve --listen http://HOST:PORT`): the web client's
//! page and assets at `/`, embedded in the binary, and pi protocol v1 over
//! a WebSocket at [`SOCKET_PATH`].
//!
//! HTTP and WebSocket are axum's (hyper and tungstenite underneath). Every
//! request is first judged by [`kernel::web::admit`] (the `Host` allow-list,
//! the `Origin`, trusted proxies); this module only reads the headers it
//! names and carries out its verdict. An upgraded socket becomes a
//! [`WebConn`], which the daemon's loop serves like any client connection:
//! the token is checked in the hello, by the server machine, never here.
//!
//! The web client itself (`assets/`) is plain ES modules: no build step,
//! vendored libraries under `assets/vendor/`.

mod conn;

pub use conn::WebConn;

use crate::limits::ACCEPT_BACKLOG;
use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use kernel::ids::PeerAddr;
use kernel::web::{Admitted, ListenAddr, SOCKET_PATH, WebPolicy, admit};
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Every file of `assets/`, by its path there (see `build.rs`).
static ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// What every security-relevant response carries: the page loads only its
/// own scripts and styles and talks only to its own origin, is never framed,
/// and sends no referrer.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

#[derive(Clone)]
struct Web {
    policy: Arc<WebPolicy>,
    /// The logical server's id, which a v8 client names in every request.
    server_id: Arc<str>,
    upgraded: mpsc::Sender<WebConn>,
    max_message: usize,
}

/// A bound web listener: the HTTP server and the sockets it upgraded.
///
/// The server runs inside [`WebListener::accept`], not in a task of its
/// own, so whoever owns the listener owns the port: dropping it (the daemon
/// aborting its accept task at hand-off) closes the listening socket, and
/// the successor can bind the same address. Connections already accepted
/// run in tasks of their own and end when the loop drops their [`WebConn`].
pub struct WebListener {
    server: Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>,
    upgraded: mpsc::Receiver<WebConn>,
    failed: bool,
}

impl WebListener {
    /// The next upgraded socket. The HTTP server makes progress only while
    /// this is awaited; if it fails, no more sockets arrive.
    pub async fn accept(&mut self) -> WebConn {
        loop {
            if self.failed {
                if let Some(conn) = self.upgraded.recv().await {
                    return conn;
                }
                std::future::pending::<()>().await;
            }
            tokio::select! {
                Some(conn) = self.upgraded.recv() => return conn,
                result = &mut self.server => {
                    self.failed = true;
                    match result {
                        Ok(()) => tracing::error!("the web server stopped; no more web clients are accepted"),
                        Err(e) => tracing::error!(error = %e, "the web server failed; no more web clients are accepted"),
                    }
                }
            }
        }
    }
}

/// Serves `listener` for logical server `server_id`. `max_frame_len`
/// bounds a message as a frame is bounded on the socket (plus its 4-byte
/// prefix).
pub fn serve(
    listener: tokio::net::TcpListener,
    policy: WebPolicy,
    max_frame_len: u32,
    server_id: &str,
) -> WebListener {
    let (tx, upgraded) = mpsc::channel(ACCEPT_BACKLOG);
    let app = router(policy, tx, max_frame_len, server_id);
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    WebListener {
        server: Box::pin(axum::serve(listener, service).into_future()),
        upgraded,
        failed: false,
    }
}

/// The kernel's view of where a listener is bound.
pub fn listen_addr(addr: SocketAddr) -> ListenAddr {
    let ip = addr.ip();
    ListenAddr {
        ip: ip.to_string(),
        v6: ip.is_ipv6(),
        local: ip.is_loopback() || ip.is_unspecified(),
        port: addr.port(),
    }
}

fn router(
    policy: WebPolicy,
    upgraded: mpsc::Sender<WebConn>,
    max_frame_len: u32,
    server_id: &str,
) -> Router {
    let state = Web {
        policy: Arc::new(policy),
        server_id: server_id.into(),
        upgraded,
        max_message: max_frame_len as usize + 4,
    };
    Router::new()
        .route(SOCKET_PATH, axum::routing::get(socket))
        .route(CLIENT_PATH, axum::routing::get(client))
        .fallback(asset)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Admits or refuses a request by the kernel's rules, before any handler.
async fn guard(
    State(web): State<Web>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let peer_addr = PeerAddr(peer.ip().to_string());
    let facts = kernel::web::Request {
        peer: &peer_addr,
        host: text(header::HOST.as_str()),
        origin: text(header::ORIGIN.as_str()),
        forwarded_proto: text("x-forwarded-proto"),
        forwarded_host: text("x-forwarded-host"),
        forwarded_for: text("x-forwarded-for"),
        socket: request.uri().path() == SOCKET_PATH,
    };
    match admit(&web.policy, &facts) {
        Ok(admitted) => {
            request.extensions_mut().insert(admitted);
            let mut response = next.run(request).await;
            secure(response.headers_mut());
            response
        }
        Err(refusal) => {
            tracing::info!(peer = %peer, status = refusal.status, reason = %refusal.reason, "web request refused");
            let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::FORBIDDEN);
            plain(status, refusal.reason + "\n")
        }
    }
}

/// The WebSocket; a request that is not an upgrade gets a plain 426.
async fn socket(
    State(web): State<Web>,
    axum::Extension(admitted): axum::Extension<Admitted>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let protocols: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let offered = (!protocols.is_empty()).then(|| protocols.join(","));
    let kernel::web::Upgrade {
        credential,
        protocol,
    } = kernel::web::upgrade(authorization, offered.as_deref());
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => {
            let mut response = plain(
                StatusCode::UPGRADE_REQUIRED,
                format!(
                    "{SOCKET_PATH} is pi protocol v1 or v8 over a WebSocket ({rejection}); open / for the web client\n"
                ),
            );
            response
                .headers_mut()
                .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            return response;
        }
    };
    let upgraded = web.upgraded.clone();
    upgrade
        .protocols(protocol)
        .max_message_size(web.max_message)
        .max_frame_size(web.max_message)
        .on_upgrade(move |socket| async move {
            let (conn, serve) = conn::bridge(socket, admitted.client, credential);
            if upgraded.send(conn).await.is_ok() {
                serve.await;
            }
        })
}

/// Where the page reads what it needs to connect.
pub const CLIENT_PATH: &str = "/client.json";

/// The server's id (a v8 client names it in every request) and the
/// reconnection policy every Rust client runs (`ClientLimits`), for the
/// page's connection to run the same: one policy, its numbers in one place.
async fn client(State(web): State<Web>) -> Response {
    let limits = kernel::limits::ClientLimits::default();
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let body = serde_json::json!({
        "serverId": &*web.server_id,
        "handshakeTimeoutMs": ms(limits.handshake_timeout),
        "reconnectBackoffInitialMs": ms(limits.reconnect_backoff_initial),
        "reconnectBackoffMaxMs": ms(limits.reconnect_backoff_max),
        "reconnectWindowMs": ms(limits.reconnect_window),
        "maxFrameLen": limits.max_frame_len,
    });
    let mut response = (StatusCode::OK, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `/` is the page; any other path is the embedded file of that name.
async fn asset(uri: Uri) -> Response {
    let path = match uri.path() {
        "/" => "index.html",
        path => path.trim_start_matches('/'),
    };
    match ASSETS.iter().find(|(name, _)| *name == path) {
        Some((name, bytes)) => {
            let mut response = (StatusCode::OK, *bytes).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(content_type(name)),
            );
            // Small files, and a new binary may bring new ones: always revalidate.
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
        None => plain(
            StatusCode::NOT_FOUND,
            format!("no such file: {}\n", uri.path()),
        ),
    }
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        _ => "text/plain; charset=utf-8",
    }
}

fn plain(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    secure(response.headers_mut());
    response
}

fn secure(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

#[cfg(test)]
mod tests;
