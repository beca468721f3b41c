//! A byte stream in two owned halves, one for a reader task and one for a
//! writer task.
//!
//! A worker channel carries every delta of a turn, so its halves must not
//! share a lock: a Unix stream splits into halves that need none
//! ([`UnixStream::into_split`]). Any other stream (a simulated TCP stream,
//! an in-memory pipe) is wrapped in [`Locked`], which splits it with
//! [`tokio::io::split`] and its lock.

use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A stream that splits into a read half and a write half.
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The half that reads.
    type Read: AsyncRead + Unpin + Send + 'static;
    /// The half that writes.
    type Write: AsyncWrite + Unpin + Send + 'static;

    /// Splits the stream.
    fn into_halves(self) -> (Self::Read, Self::Write);
}

impl Duplex for UnixStream {
    type Read = OwnedReadHalf;
    type Write = OwnedWriteHalf;

    fn into_halves(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        self.into_split()
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
