//! A minimal framed connection (u32 big-endian length + payload) that does
//! no decoding on its own, and the few protocol messages the benches send.
//!
//! The same client code drives our server, the echo server and the
//! TypeScript server, so client-side costs are equal on both sides of every
//! ratio.

use futures_util::{SinkExt, StreamExt};
use kernel::protocol::{
    ClientHello, ClientMessage, Command, PROTOCOL_VERSION, Request, ServerMessage,
    decode_server_message, encode_client_message,
};
use kernel::wire::frame::{DEFAULT_MAX_FRAME_LEN, encode_frame};
use kernel::wire::{CborLimits, Value, cbor};
use std::io;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Bytes the read buffer keeps free before a read.
const READ_SPACE: usize = 64 * 1024;

/// What a [`RawConn`] carries its frames over.
#[derive(Debug)]
enum Transport {
    Unix(UnixStream),
    /// The web listener's WebSocket: one frame per binary message.
    Web(Box<WebSocketStream<MaybeTlsStream<TcpStream>>>),
}

/// A framed connection (a Unix socket or the web listener's WebSocket).
#[derive(Debug)]
pub(crate) struct RawConn {
    stream: Transport,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Sent in hello (the web listener requires one).
    token: Option<String>,
}

impl RawConn {
    /// Connects to `path`.
    pub(crate) async fn connect(path: &Path) -> io::Result<Self> {
        Ok(Self::new(UnixStream::connect(path).await?))
    }

    /// Connects to the WebSocket of the web listener at `addr` (`host:port`)
    /// as the served page does (its `Origin`), with `token` for the hello.
    pub(crate) async fn connect_web(addr: &str, token: &str) -> io::Result<Self> {
        let mut request = format!("ws://{addr}/ws")
            .into_client_request()
            .map_err(io::Error::other)?;
        let origin = format!("http://{addr}").parse().map_err(io::Error::other)?;
        request.headers_mut().insert("origin", origin);
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .map_err(io::Error::other)?;
        if let MaybeTlsStream::Plain(tcp) = socket.get_ref() {
            tcp.set_nodelay(true)?;
        }
        let mut conn = Self::with(Transport::Web(Box::new(socket)));
        conn.token = Some(token.into());
        Ok(conn)
    }

    /// Connects to a Unix socket whose server wants `token` in the hello.
    pub(crate) async fn connect_with_token(path: &Path, token: &str) -> io::Result<Self> {
        let mut conn = Self::connect(path).await?;
        conn.token = Some(token.into());
        Ok(conn)
    }

    /// Wraps a stream.
    pub(crate) fn new(stream: UnixStream) -> Self {
        Self::with(Transport::Unix(stream))
    }

    fn with(stream: Transport) -> Self {
        Self {
            stream,
            buf: vec![0; READ_SPACE],
            start: 0,
            end: 0,
            token: None,
        }
    }

    /// Writes already framed bytes (on a WebSocket: one message per call,
    /// so callers send one frame at a time).
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.stream {
            Transport::Unix(s) => s.write_all(bytes).await,
            Transport::Web(ws) => ws
                .send(Message::binary(bytes.to_vec()))
                .await
                .map_err(io::Error::other),
        }
    }

    /// The range of the next complete payload in the buffer, if any.
    fn complete(&self) -> Option<(usize, usize)> {
        let have = self.end - self.start;
        if have < 4 {
            return None;
        }
        let header: [u8; 4] = self.buf[self.start..self.start + 4]
            .try_into()
            .expect("4 bytes");
        let len = u32::from_be_bytes(header) as usize;
        (have >= 4 + len).then_some((self.start + 4, self.start + 4 + len))
    }

    /// Reads at least one more byte. `UnexpectedEof` when the peer closed.
    pub(crate) async fn fill(&mut self) -> io::Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < READ_SPACE && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_SPACE {
            self.buf.resize(self.end + READ_SPACE, 0);
        }
        let n = match &mut self.stream {
            Transport::Unix(s) => s.read(&mut self.buf[self.end..]).await?,
            Transport::Web(ws) => loop {
                match ws.next().await {
                    Some(Ok(Message::Binary(bytes))) => {
                        if self.buf.len() - self.end < bytes.len() {
                            self.buf.resize(self.end + bytes.len(), 0);
                        }
                        self.buf[self.end..self.end + bytes.len()].copy_from_slice(&bytes);
                        break bytes.len();
                    }
                    Some(Ok(Message::Close(_))) | None => break 0,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(io::Error::other(e)),
                }
            },
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.end += n;
        Ok(())
    }

    /// Hands every complete payload in the buffer to `f`, in order.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&[u8])) {
        while let Some((s, e)) = self.complete() {
            f(&self.buf[s..e]);
            self.start = e;
        }
    }

    /// The next payload.
    pub(crate) async fn frame(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some((s, e)) = self.complete() {
                self.start = e;
                return Ok(self.buf[s..e].to_vec());
            }
            self.fill().await?;
        }
    }

    /// Reads frames until one of kind `Response`; returns it.
    pub(crate) async fn until_response(&mut self) -> io::Result<Vec<u8>> {
        loop {
            let payload = self.frame().await?;
            if kind(&payload) == Kind::Response {
                return Ok(payload);
            }
        }
    }

    /// v1 handshake: sends hello, returns the server's first message.
    pub(crate) async fn hello_v1(&mut self) -> io::Result<ServerMessage> {
        self.send(&v1_frame(&ClientMessage::Hello(ClientHello {
            version: PROTOCOL_VERSION,
            token: self.token.clone(),
        })))
        .await?;
        let payload = self.frame().await?;
        decode(&payload).map_err(io::Error::other)
    }
}

/// Frames a v1 client message.
pub(crate) fn v1_frame(message: &ClientMessage) -> Vec<u8> {
    let payload = encode_client_message(message).expect("a bench message encodes");
    encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("a bench frame fits")
}

/// Frames a v1 request.
pub(crate) fn v1_request(id: &str, command: Command) -> Vec<u8> {
    v1_frame(&ClientMessage::Request(Request {
        id: id.into(),
        command,
    }))
}

/// Decodes a v1 server payload.
pub(crate) fn decode(payload: &[u8]) -> Result<ServerMessage, String> {
    decode_server_message(payload, &CborLimits::default()).map_err(|e| e.to_string())
}

/// Frames an arbitrary CBOR value (for protocol v8).
pub(crate) fn value_frame(value: &Value) -> Vec<u8> {
    let mut payload = Vec::new();
    cbor::encode(value, &mut payload).expect("a bench value encodes");
    encode_frame(&payload, DEFAULT_MAX_FRAME_LEN).expect("a bench frame fits")
}

/// A CBOR map from pairs.
pub(crate) fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// A CBOR text value.
pub(crate) fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// What a server frame is, judged from its first bytes (every message of
/// both protocol versions is a map whose first key is `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Hello,
    Response,
    Event,
    ServiceUpdate,
    Other,
}

/// The kind of a payload, without decoding it.
pub(crate) fn kind(payload: &[u8]) -> Kind {
    let rest = payload.get(1..).unwrap_or_default();
    let Some(rest) = rest.strip_prefix(b"\x64type") else {
        return Kind::Other;
    };
    if rest.starts_with(b"\x68response") {
        Kind::Response
    } else if rest.starts_with(b"\x65event") {
        Kind::Event
    } else if rest.starts_with(b"\x65hello") {
        Kind::Hello
    } else if rest.starts_with(b"\x6eservice_update") {
        Kind::ServiceUpdate
    } else {
        Kind::Other
    }
}

/// True for a v1 `session_progress` event (the type tag sits in the first bytes).
pub(crate) fn is_progress(payload: &[u8]) -> bool {
    // Where our encoder's key order puts it: `{type: event, event: {type: …`.
    const TAG_AT: usize = 25;
    if payload.get(TAG_AT..TAG_AT + 16) == Some(b"session_progress") {
        return true;
    }
    kind(payload) == Kind::Event
        && payload
            .get(..48.min(payload.len()))
            .is_some_and(|head| head.windows(16).any(|w| w == b"session_progress"))
}
