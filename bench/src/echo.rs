//! The physical floor of a request round trip: a raw Unix-socket server that
//! answers the n-th frame it receives with a scripted reply (the exact frames
//! our server sent for the same request, captured beforehand). It runs on its
//! own thread and multi-threaded tokio runtime, like a separate server would.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::sync::oneshot;

/// A running echo server; stops on drop.
#[derive(Debug)]
pub(crate) struct Echo {
    /// Its socket.
    pub(crate) path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    /// Listens at `path`; the i-th frame received on a connection is answered
    /// with `script[i % script.len()]` (already framed bytes).
    pub(crate) fn start(path: &Path, script: Vec<Vec<u8>>) -> Self {
        let _ = std::fs::remove_file(path);
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let socket = path.to_path_buf();
        let script = Arc::new(script);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("echo runtime");
            runtime.block_on(async move {
                let listener = UnixListener::bind(&socket).expect("bind the echo socket");
                let _ = bound_tx.send(());
                let accept = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        tokio::spawn(serve(stream, Arc::clone(&script)));
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
            runtime.shutdown_background();
        });
        bound_rx.recv().expect("the echo server binds");
        Self {
            path: path.to_path_buf(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve(mut stream: tokio::net::UnixStream, script: Arc<Vec<Vec<u8>>>) {
    let mut buf = vec![0u8; 64 * 1024];
    let (mut start, mut end) = (0usize, 0usize);
    let mut n = 0usize;
    loop {
        // Answer every complete frame in the buffer.
        loop {
            if end - start < 4 {
                break;
            }
            let len = u32::from_be_bytes(buf[start..start + 4].try_into().expect("4")) as usize;
            if end - start < 4 + len {
                break;
            }
            start += 4 + len;
            let reply = &script[n % script.len()];
            n += 1;
            if stream.write_all(reply).await.is_err() {
                return;
            }
        }
        if start == end {
            start = 0;
            end = 0;
        } else if start > 0 {
            buf.copy_within(start..end, 0);
            end -= start;
            start = 0;
        }
        if buf.len() - end < 16 * 1024 {
            buf.resize(buf.len() * 2, 0);
        }
        match stream.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return,
            Ok(read) => end += read,
        }
    }
}
