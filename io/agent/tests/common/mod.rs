//! A tiny HTTP/1.1 server on 127.0.0.1 for the agent tests: it records each
//! request and answers with a scripted reply (recorded SSE streams from
//! `tests/fixtures/sse/`, errors, stalls, disconnects).

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the body of a reply is sent.
#[derive(Clone)]
pub enum Body {
    /// Chunked, in pieces of `piece` bytes with `delay` between them; without
    /// the final chunk when `complete` is false (a disconnect mid-stream).
    Chunked {
        bytes: Vec<u8>,
        piece: usize,
        delay: Duration,
        complete: bool,
    },
    /// Delimited by closing the connection.
    UntilClose(Vec<u8>),
    /// Headers, one chunk, then silence.
    Stall(Vec<u8>),
}

#[derive(Clone)]
pub enum Reply {
    Respond {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Body,
    },
    /// Read the request and never answer.
    Hang,
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

pub struct Mock {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    /// When the client closed its connection.
    pub closed_at: Arc<Mutex<Option<Instant>>>,
}

impl Mock {
    pub async fn start(reply: Reply) -> Self {
        Self::sequence(vec![reply]).await
    }

    /// The n-th request gets the n-th reply; the last one repeats.
    pub async fn sequence(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let closed_at = Arc::new(Mutex::new(None));
        let (r, c) = (requests.clone(), closed_at.clone());
        let mut replies: VecDeque<Reply> = replies.into();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let reply = if replies.len() > 1 {
                    replies.pop_front().unwrap()
                } else {
                    replies.front().cloned().expect("a reply")
                };
                tokio::spawn(serve(socket, reply, r.clone(), c.clone()));
            }
        });
        Self {
            base: format!("http://{addr}"),
            requests,
            closed_at,
        }
    }

    pub fn request(&self) -> Recorded {
        self.requests
            .lock()
            .unwrap()
            .first()
            .cloned()
            .expect("a request arrived")
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(
    socket: TcpStream,
    reply: Reply,
    requests: Arc<Mutex<Vec<Recorded>>>,
    closed_at: Arc<Mutex<Option<Instant>>>,
) {
    let (mut rd, mut wr) = socket.into_split();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let header_end = loop {
        let n = rd.read(&mut tmp).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next().unwrap().split(' ').nth(1).unwrap().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    while buf.len() < header_end + length {
        let n = rd.read(&mut tmp).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = serde_json::from_slice(&buf[header_end..header_end + length]).unwrap();
    requests.lock().unwrap().push(Recorded {
        path,
        headers,
        body,
    });
    // Note when the client goes away.
    tokio::spawn(async move {
        let mut sink = [0u8; 64];
        while rd.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        *closed_at.lock().unwrap() = Some(Instant::now());
    });
    let (status, extra, body) = match reply {
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
        Reply::Respond {
            status,
            headers,
            body,
        } => (status, headers, body),
    };
    let content_type = match &body {
        Body::UntilClose(_) | Body::Chunked { .. } | Body::Stall(_) if status == 200 => {
            "text/event-stream"
        }
        _ => "application/json",
    };
    let mut head = format!("HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n");
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match body {
        Body::UntilClose(bytes) => {
            head.push_str("connection: close\r\n\r\n");
            let _ = wr.write_all(head.as_bytes()).await;
            let _ = wr.write_all(&bytes).await;
            let _ = wr.shutdown().await;
        }
        Body::Stall(bytes) => {
            head.push_str("transfer-encoding: chunked\r\n\r\n");
            let _ = wr.write_all(head.as_bytes()).await;
            let _ = wr.write_all(&chunk(&bytes)).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Body::Chunked {
            bytes,
            piece,
            delay,
            complete,
        } => {
            head.push_str("transfer-encoding: chunked\r\n\r\n");
            if wr.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for part in bytes.chunks(piece.max(1)) {
                if wr.write_all(&chunk(part)).await.is_err() {
                    return;
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
            }
            if complete {
                let _ = wr.write_all(b"0\r\n\r\n").await;
            }
            let _ = wr.shutdown().await;
        }
    }
}

pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

pub fn fixture(name: &str) -> Vec<u8> {
    // From the agent crate and from the daemon crate, which shares this module.
    let path = format!(
        "{}/../agent/tests/fixtures/sse/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A 200 event stream of a fixture, sent in 7-byte pieces (splitting lines and characters).
pub fn sse(name: &str) -> Reply {
    let body = Body::Chunked {
        bytes: fixture(name),
        piece: 7,
        delay: Duration::ZERO,
        complete: true,
    };
    Reply::Respond {
        status: 200,
        headers: vec![],
        body,
    }
}

pub fn error(status: u16, name: &str, headers: Vec<(&'static str, String)>) -> Reply {
    Reply::Respond {
        status,
        headers,
        body: Body::UntilClose(fixture(name)),
    }
}
