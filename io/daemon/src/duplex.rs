//! A byte stream in two owned halves, one for a reader task and one for a
//! writer task.
//!
//! A worker channel carries every delta of a turn, so its halves must not
//! share a lock: a [`UnixChannel`] splits into halves that need none. Any
//! other stream (a simulated TCP stream, an in-memory pipe) is wrapped in
//! [`Locked`], which splits it with [`tokio::io::split`] and its lock.

use std::io::{self, Write as _};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::UnixStream;

/// A stream that splits into a read half and a write half.
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The half that reads.
    type Read: AsyncRead + Unpin + Send + 'static;
    /// The half that writes.
    type Write: AsyncWrite + Unpin + Send + 'static;

    /// Splits the stream.
    fn into_halves(self) -> (Self::Read, Self::Write);
}

/// Registers `socket` with the runtime for `interest` only.
///
/// tokio 1.54 deprecates `with_interest` for `register_with_interest`,
/// which is `unsafe` (its contract: the descriptor stays open and the same
/// while registered); this workspace forbids unsafe code. The contract holds
/// here by ownership: the `AsyncFd` owns the socket, which owns its
/// descriptor.
pub(crate) fn registered<S: AsRawFd>(socket: S, interest: Interest) -> io::Result<AsyncFd<S>> {
    #[allow(deprecated)]
    AsyncFd::with_interest(socket, interest)
}

/// One `read`; a short one reports would-block after it (`*got` holds the
/// count), so tokio clears the readiness: the socket is drained, and the
/// reader is spared a second `read` that would only find nothing. Data that
/// arrives meanwhile is a new readiness event, which the clearing keeps.
fn read_draining(
    fd: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
    got: &mut usize,
) -> io::Result<usize> {
    let len = buf.len();
    let n = rustix::io::read(fd, buf)?;
    *got = n;
    if n > 0 && n < len {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Ok(n)
}

/// One read of what is ready on `socket` into `buf`: the count, 0 at its
/// end. Waits (registering `cx`) while nothing is there; a short read
/// clears the readiness ([`read_draining`]).
pub(crate) fn poll_read_ready_into<S: AsRawFd + AsFd>(
    socket: &AsyncFd<S>,
    cx: &mut Context<'_>,
    buf: &mut [u8],
) -> Poll<io::Result<usize>> {
    loop {
        let mut guard = ready!(socket.poll_read_ready(cx))?;
        let mut got = 0;
        match guard.try_io(|s| read_draining(s.get_ref().as_fd(), buf, &mut got)) {
            Ok(read) => return Poll::Ready(read),
            // A short read: the data, and the readiness cleared.
            Err(_drained) if got > 0 => return Poll::Ready(Ok(got)),
            // Nothing read cleared the readiness: polled again, it registers the waker.
            Err(_would_block) => {}
        }
    }
}

/// A registration for writing of a duplicate of `fd`, to wait on while a
/// socket registered for reading only is full; it lives only while it waits.
pub(crate) fn write_watch(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<AsyncFd<OwnedFd>> {
    registered(fd.try_clone_to_owned()?, Interest::WRITABLE)
}

/// A Unix stream registered with the runtime for reading only, as the
/// server's client sockets are.
///
/// Registered for writing as well (as tokio's streams are), each read the
/// peer makes of what we sent wakes this side for nothing: a worker
/// streaming deltas woke once more per delta. A write that finds the socket
/// full waits on a registration of a duplicate descriptor, which lives only
/// while it waits. Both halves share the socket; each uses one direction.
pub struct UnixChannel {
    socket: Arc<AsyncFd<std::os::unix::net::UnixStream>>,
    /// Set while a write waits for room.
    waiting: Option<AsyncFd<OwnedFd>>,
}

impl UnixChannel {
    /// Re-registers `stream` for reading only.
    pub fn new(stream: UnixStream) -> io::Result<Self> {
        let socket = registered(stream.into_std()?, Interest::READABLE)?;
        Ok(Self {
            socket: Arc::new(socket),
            waiting: None,
        })
    }
}

impl Duplex for UnixChannel {
    type Read = UnixChannel;
    type Write = UnixChannel;

    fn into_halves(self) -> (UnixChannel, UnixChannel) {
        let read = Self {
            socket: Arc::clone(&self.socket),
            waiting: None,
        };
        (read, self)
    }
}

impl AsyncRead for UnixChannel {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = ready!(poll_read_ready_into(
            &self.socket,
            cx,
            buf.initialize_unfilled()
        ))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for UnixChannel {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if let Some(watch) = &this.waiting {
                ready!(watch.poll_write_ready(cx))?.retain_ready();
                this.waiting = None;
            }
            match this.socket.get_ref().write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Registering reports the state it finds: a socket that
                    // drained meanwhile is ready at once.
                    this.waiting = Some(write_watch(this.socket.get_ref().as_fd())?);
                }
                done => return Poll::Ready(done),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

/// Any stream, split with tokio's lock: for streams off the hot path.
pub struct Locked<S>(pub S);

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Duplex for Locked<S> {
    type Read = ReadHalf<S>;
    type Write = WriteHalf<S>;

    fn into_halves(self) -> (ReadHalf<S>, WriteHalf<S>) {
        tokio::io::split(self.0)
    }
}

/// A worker's hello is read, and a successor's hand-off written, before
/// the stream is split.
impl<S: AsyncRead + Unpin> AsyncRead for Locked<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Locked<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A write that finds the socket full waits on a registration of its
    /// own; more than a socket buffer holds then goes through whole and in
    /// order while the reader lags, and the reader sees the end after the
    /// writer's shutdown.
    #[tokio::test(flavor = "current_thread")]
    async fn unix_channel_waits_for_room_and_loses_nothing() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_, mut write) = UnixChannel::new(a).unwrap().into_halves();
        let (mut read, _keep) = UnixChannel::new(b).unwrap().into_halves();
        let sent: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();

        // Nobody reads yet: the socket fills, and the next write waits.
        let mut at = 0;
        while let Ok(n) =
            tokio::time::timeout(Duration::from_millis(20), write.write(&sent[at..])).await
        {
            at += n.unwrap();
        }
        assert!(
            at > 0 && at < sent.len(),
            "the socket took {at} bytes before it was full"
        );
        assert!(
            write.waiting.is_some(),
            "the full socket's write waits on its own registration"
        );

        let expected = sent.clone();
        let writer = tokio::spawn(async move {
            write.write_all(&sent[at..]).await.unwrap();
            write.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        let mut chunk = vec![0; 64 * 1024];
        loop {
            tokio::time::sleep(Duration::from_micros(200)).await;
            let n = read.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        writer.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "the bytes arrive in order");
    }
}
