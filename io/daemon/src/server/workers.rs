//! The loop's worker processes: spawning and starting them, their private
//! channels, adopting another server's and releasing ours to the next,
//! and their exits.

use super::*;

impl<P: Platform> Daemon<P> {
    /// Kills a worker that missed its deadline.
    pub(super) fn kill_worker(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get(&worker) {
            tracing::warn!(%worker, pid = w.pid, "killing worker that missed its deadline");
            self.platform.kill_worker(w.pid, w.task.as_ref());
        }
    }

    /// Takes an announced worker of another server as ours.
    pub(super) fn adopt_worker(
        &mut self,
        channel: ChannelId,
        worker: WorkerId,
        session_id: String,
    ) {
        let Some((stream, pid)) = self.announced.remove(&channel) else {
            return;
        };
        tracing::info!(%worker, session = %session_id, pid, "adopted a worker");
        self.workers.insert(
            worker,
            WorkerProc {
                session_id,
                pid: u32::try_from(pid).ok(),
                task: None,
                channel: None,
                reader: None,
                queued: Vec::new(),
                adopted: true,
                exit_status: None,
            },
        );
        self.bind_worker_channel(worker, stream);
        self.send_to_worker(worker, &WorkerFrame::Adopted);
    }

    /// Refuses an announced worker, telling it why.
    pub(super) fn reject_worker(&mut self, channel: ChannelId, reason: String) {
        let Some((mut stream, pid)) = self.announced.remove(&channel) else {
            return;
        };
        tracing::warn!(pid, %reason, "refused a worker channel");
        if let Ok(bytes) = frame_worker_message(&WorkerFrame::Rejected { reason }) {
            tokio::spawn(async move {
                let _ = stream.write_all(&bytes).await;
            });
        }
    }

    /// Lets a worker go to the next server: dropping its channel closes it,
    /// and the worker, an orphan, announces itself.
    pub(super) fn release_worker(&mut self, worker: WorkerId) {
        if let Some(mut w) = self.workers.remove(&worker) {
            tracing::info!(%worker, session = %w.session_id, "released a worker to the next server");
            self.released.push(w.session_id.clone());
            if let Some(reader) = w.reader.take() {
                reader.abort();
            }
            if self.stopping {
                self.let_go.push((w.pid, w.task.take()));
            }
        }
    }

    pub(super) fn spawn_worker(&mut self, worker: WorkerId, session_id: String) {
        let spawned = config::secret().and_then(|token| {
            let spawned = self.platform.spawn_worker(&session_id, &token)?;
            Ok((token, spawned))
        });
        match spawned {
            Ok((token, Spawned { pid, exited, task })) => {
                tracing::info!(%worker, session = %session_id, pid, "worker spawned");
                self.workers.insert(
                    worker,
                    WorkerProc {
                        session_id,
                        pid,
                        task,
                        channel: None,
                        reader: None,
                        queued: Vec::new(),
                        adopted: false,
                        exit_status: None,
                    },
                );
                let tx = self.events.clone();
                tokio::spawn(async move {
                    let status = exited.await;
                    let _ = tx.send(Event::WorkerExited { worker, status }).await;
                });
                self.step(Input::WorkerSpawned { worker, token });
            }
            Err(e) => self.step(Input::WorkerSpawnFailed {
                worker,
                error: e.to_string(),
            }),
        }
    }

    /// The kernel matched a hello to `worker`: its channel is bound and it
    /// gets its start, then whatever was queued for it.
    pub(super) fn start_worker(
        &mut self,
        channel: ChannelId,
        worker: WorkerId,
        create: Option<Box<CreateSpec>>,
        revision_floor: u64,
    ) {
        let Some((stream, pid)) = self.announced.remove(&channel) else {
            return;
        };
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.pid = w.pid.or(u32::try_from(pid).ok());
        self.bind_worker_channel(worker, stream);
        let start = WorkerFrame::Start {
            create: create.map(|c| *c),
            revision_floor,
        };
        self.send_to_worker(worker, &start);
        let w = self.workers.get_mut(&worker).expect("bound above");
        if let Some(ch) = &w.channel {
            for bytes in std::mem::take(&mut w.queued) {
                to_worker_channel(ch, bytes);
            }
        }
    }

    /// Starts the reader and writer tasks of a worker's channel.
    pub(super) fn bind_worker_channel(&mut self, worker: WorkerId, stream: P::Channel) {
        let (mut read, mut write) = stream.into_halves();
        let capacity = worker_writer_capacity(&self.server.config().limits);
        let (wtx, mut wrx) = mpsc::channel::<Vec<u8>>(capacity);
        tokio::spawn(async move {
            while let Some(bytes) = wrx.recv().await {
                if write.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        });
        let tx = self.events.clone();
        let reader = tokio::spawn(async move {
            let mut decoder = FrameDecoder::new(kernel::wire::frame::DEFAULT_MAX_FRAME_LEN);
            let mut buf = vec![0u8; 64 * 1024];
            let limits = CborLimits::default();
            'read: loop {
                let n = match read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut payloads = Vec::new();
                let failed = decoder.push(&buf[..n], &mut payloads).is_err();
                for payload in payloads {
                    match decode_worker_frame(&payload, &limits) {
                        Ok(frame) => {
                            if tx.send(Event::FromWorker { worker, frame }).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::error!(%worker, error = %e, "worker sent an invalid frame");
                            break 'read;
                        }
                    }
                }
                if failed {
                    break;
                }
            }
            let _ = tx.send(Event::WorkerChannelClosed { worker }).await;
        });
        let w = self
            .workers
            .get_mut(&worker)
            .expect("bound to a known worker");
        w.channel = Some(wtx);
        w.reader = Some(reader);
    }

    pub(super) fn send_to_worker(&mut self, worker: WorkerId, frame: &WorkerFrame) {
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        let bytes = match frame_worker_message(frame) {
            Ok(b) => b,
            Err(e) => return tracing::error!(%worker, error = %e, "cannot encode a worker frame"),
        };
        match &w.channel {
            Some(ch) => to_worker_channel(ch, bytes),
            None => w.queued.push(bytes),
        }
    }

    /// Tells the kernel a worker is gone (once).
    pub(super) fn report_exit(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.remove(&worker) {
            let status = w.exit_status.as_deref().unwrap_or("channel closed");
            tracing::info!(%worker, session = %w.session_id, %status, "worker exited");
            if let Some(reader) = w.reader {
                reader.abort();
            }
            self.step(Input::WorkerExited { worker });
        }
    }
}

/// `max_hello_len` bounds a worker's first frame ([`read_worker_hello`]).
pub(super) async fn accept_workers<P: Platform>(
    mut listener: P::Workers,
    tx: mpsc::Sender<Event<P>>,
    max_hello_len: usize,
    hello_timeout: Duration,
) {
    loop {
        let Ok(stream) = listener.accept().await else {
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let hello =
                tokio::time::timeout(hello_timeout, read_worker_hello(stream, max_hello_len)).await;
            match hello {
                Ok(Ok((
                    stream,
                    WorkerFrame::Hello {
                        version,
                        token,
                        session_id,
                        pid,
                        resume,
                    },
                ))) => {
                    let _ = tx
                        .send(Event::WorkerHello {
                            stream,
                            token,
                            session_id,
                            pid,
                            version,
                            resume,
                        })
                        .await;
                }
                Ok(Ok((stream, WorkerFrame::Replace { .. }))) => {
                    let _ = tx.send(Event::HandoffRequested { stream }).await;
                }
                Ok(Ok(_)) => tracing::warn!("worker channel: first frame was not hello"),
                Ok(Err(e)) => tracing::warn!(error = %e, "worker channel: bad hello"),
                Err(_) => tracing::warn!(
                    timeout_ms = hello_timeout.as_millis() as u64,
                    "worker channel: no hello in time"
                ),
            }
        });
    }
}

/// Reads exactly one frame, of at most `max_len` bytes, from a fresh worker
/// channel. The bound is [`Limits::max_frame_len`]: an orphan's
/// announcement carries its session's whole snapshot, which clients get in
/// one frame too.
pub(super) async fn read_worker_hello<S: AsyncRead + Unpin>(
    mut stream: S,
    max_len: usize,
) -> Result<(S, WorkerFrame), String> {
    let mut header = [0u8; 4];
    stream
        .read_exact(&mut header)
        .await
        .map_err(|e| e.to_string())?;
    let len = u32::from_be_bytes(header) as usize;
    if len > max_len {
        return Err(format!("hello frame of {len} bytes (at most {max_len})"));
    }
    let mut payload = vec![0u8; len];
    stream
        .read_exact(&mut payload)
        .await
        .map_err(|e| e.to_string())?;
    let frame = decode_worker_frame(&payload, &CborLimits::default()).map_err(|e| e.to_string())?;
    Ok((stream, frame))
}

/// Queues bytes on a worker channel's writer (gone with its channel: dropped).
pub(super) fn to_worker_channel(channel: &mpsc::Sender<Vec<u8>>, bytes: Vec<u8>) {
    if let Err(mpsc::error::TrySendError::Full(_)) = channel.try_send(bytes) {
        unreachable!("a worker channel holds more than the kernel admitted");
    }
}

/// Messages a worker channel's writer can hold: the kernel sends a worker
/// one message per operation it admitted (each answered before it goes),
/// bounded by the requests in flight of every connection, plus its start,
/// a snapshot request and the dispose.
pub(super) fn worker_writer_capacity(limits: &Limits) -> usize {
    limits.max_connections * limits.max_requests_in_flight_per_connection + 8
}
