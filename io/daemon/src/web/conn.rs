//! One WebSocket as a client connection of the daemon's loop.
//!
//! Each binary message carries one whole pi protocol v1 frame (length
//! prefix included), both ways, so the kernel sees the bytes it sees on a
//! socket. The socket itself is served by a task of its own
//! ([`bridge`]): messages in become [`WebConn::read`]'s bytes, frames the
//! loop writes go out one per message. The outgoing queue is bounded in
//! frames; when it is full a write takes nothing (`WouldBlock`), and the
//! kernel's output bound then decides, as for a socket whose buffer is full.

use crate::limits::{IN_MESSAGES, OUT_FRAMES};
use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::SinkExt;
use kernel::ids::PeerAddr;
use kernel::server::Frame;
use std::io;
use std::sync::Mutex;
use tokio::sync::mpsc;

enum Out {
    Frame(Frame),
    /// Our direction ends: a close frame, then nothing.
    Close,
}

/// The loop's side of one WebSocket.
pub struct WebConn {
    peer: PeerAddr,
    /// The bearer token of its upgrade request, if it had one.
    credential: Option<String>,
    incoming: Mutex<mpsc::Receiver<Vec<u8>>>,
    outgoing: mpsc::Sender<Out>,
}

impl WebConn {
    /// The client's address (behind a trusted proxy, the one it reported).
    pub fn peer(&self) -> PeerAddr {
        self.peer.clone()
    }

    /// The bearer token its upgrade request carried.
    pub fn credential(&self) -> Option<String> {
        self.credential.clone()
    }

    /// The next message's bytes, if one is there; `None` once the socket
    /// closed. Only the loop reads, so the lock is never contended.
    pub(crate) fn poll_read(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Vec<u8>>> {
        self.incoming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .poll_recv(cx)
    }

    /// Queues the whole frames the queue takes now.
    pub(crate) fn try_write_frames(&self, frames: &[Frame], skip: usize) -> io::Result<usize> {
        // Frames are taken whole, so a first frame is never part-written.
        debug_assert_eq!(skip, 0, "a WebSocket frame was split");
        let mut taken = 0;
        for frame in frames {
            match self.outgoing.try_send(Out::Frame(frame.clone())) {
                Ok(()) => taken += frame.len(),
                Err(mpsc::error::TrySendError::Full(_)) => break,
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
            }
        }
        if taken == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(taken - skip)
    }

    /// Queues every frame, waiting for room.
    pub(crate) async fn write_frames(&self, frames: Vec<Frame>, skip: usize) -> io::Result<()> {
        debug_assert_eq!(skip, 0, "a WebSocket frame was split");
        for frame in frames {
            self.outgoing
                .send(Out::Frame(frame))
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        }
        Ok(())
    }

    /// Sends a close frame after what is queued.
    pub(crate) async fn shutdown_write(&self) {
        let _ = self.outgoing.send(Out::Close).await;
    }
}

/// A connection for the loop and the task that serves `socket` for it.
pub(super) fn bridge(
    socket: WebSocket,
    peer: PeerAddr,
    credential: Option<String>,
) -> (WebConn, impl Future<Output = ()> + Send) {
    let (in_tx, in_rx) = mpsc::channel(IN_MESSAGES);
    let (out_tx, out_rx) = mpsc::channel(OUT_FRAMES);
    let conn = WebConn {
        peer,
        credential,
        incoming: Mutex::new(in_rx),
        outgoing: out_tx,
    };
    (conn, serve(socket, in_tx, out_rx))
}

/// Moves messages both ways until either side ends.
async fn serve(
    mut socket: WebSocket,
    in_tx: mpsc::Sender<Vec<u8>>,
    mut out_rx: mpsc::Receiver<Out>,
) {
    // Dropped when the peer is done sending: the loop then reads the end.
    let mut in_tx = Some(in_tx);
    loop {
        tokio::select! {
            received = socket.recv(), if in_tx.is_some() => match received {
                Some(Ok(Message::Binary(bytes))) => {
                    let tx = in_tx.as_ref().expect("reading");
                    if tx.send(bytes.into()).await.is_err() {
                        break; // the loop dropped the connection
                    }
                }
                Some(Ok(Message::Text(_))) => {
                    let _ = socket
                        .send(Message::Close(Some(CloseFrame {
                            code: close_code::UNSUPPORTED,
                            reason: "pi protocol frames are binary messages".into(),
                        })))
                        .await;
                    break;
                }
                // Pings are answered by the socket itself.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => in_tx = None,
            },
            queued = out_rx.recv() => {
                // Everything queued goes out in one flush: a burst to many
                // sockets costs a write per socket per batch, as on a socket,
                // not one per frame.
                let mut next = queued;
                let mut fed = 0;
                let closing = loop {
                    match next {
                        Some(Out::Frame(frame)) => {
                            let message = Message::Binary(axum::body::Bytes::from_owner(
                                frame.into_contiguous(),
                            ));
                            if socket.feed(message).await.is_err() {
                                return;
                            }
                            fed += 1;
                        }
                        Some(Out::Close) | None => break true,
                    }
                    if fed == OUT_FRAMES {
                        break false;
                    }
                    match out_rx.try_recv() {
                        Ok(out) => next = Some(out),
                        Err(mpsc::error::TryRecvError::Empty) => break false,
                        Err(mpsc::error::TryRecvError::Disconnected) => next = None,
                    }
                };
                if socket.flush().await.is_err() {
                    break;
                }
                if closing {
                    let _ = socket.send(Message::Close(None)).await;
                    break;
                }
            },
        }
    }
}
