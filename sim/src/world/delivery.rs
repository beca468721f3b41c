//! Held deliveries: the pending hops a driver may carry out ([`Delivery`]),
//! how much of a channel one delivery moves ([`Amount`]), listing what is
//! pending ([`World::deliveries`]) and carrying one hop out
//! ([`World::deliver`]): client bytes, server frames, worker boots, messages
//! each way between server and workers, exit notices, the catalog load and
//! store removals.

use super::clients::Incoming;
use super::workers::{FakeWorker, WorkerStage};
use super::{Fact, World};
use crate::summary;
use kernel::ids::{ConnId, WorkerId};
use kernel::protocol::ServerMessage;
use kernel::server::Input;
use kernel::worker::FromWorker;

/// A pending hop, as offered to drivers by [`World::deliveries`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Delivery {
    /// Client bytes (or its end of stream) to the server.
    ToServer(ConnId),
    /// Server frames (or its close) to a reading client.
    ToClient(ConnId),
    /// A spawned worker opens its session.
    Boot(WorkerId),
    /// The next server message to a worker.
    ToWorker(WorkerId),
    /// The next worker message to the server.
    FromWorker(WorkerId),
    /// The server learns that a worker process exited.
    Exit(WorkerId),
    /// The new server's catalog finishes loading.
    Catalog,
    /// A store removal finishes.
    Removal(String),
    /// The kernel hears what its catalog rescan read.
    Scan,
    /// An orphan's announcement reaches the server.
    Announcement(WorkerId),
}

/// How much of a channel one [`World::deliver`] moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Amount {
    /// Everything queued (coalesced client bytes; all frames or messages).
    All,
    /// The first item (the first chunk of client bytes as it was written).
    One,
    /// At most this many client bytes, or this many frames or messages.
    Up(usize),
    /// Worker messages up to and including the first that is not progress.
    Significant,
}

impl World {
    /// Every pending hop with the sequence number of its oldest item, in a
    /// fixed order (channel kind, then id).
    pub fn deliveries(&self) -> Vec<(u64, Delivery)> {
        let mut out = Vec::new();
        for conn in &self.active {
            let c = &self.clients[conn];
            if let Some((seq, _)) = c.outbox.front() {
                out.push((*seq, Delivery::ToServer(*conn)));
            } else if let Some(seq) = c.eof {
                out.push((seq, Delivery::ToServer(*conn)));
            }
            let closing = matches!(c.inbox.front().map(|(_, m)| &**m), Some(Incoming::Close));
            if let Some((seq, _)) = c.inbox.front().filter(|_| c.reading || closing) {
                out.push((*seq, Delivery::ToClient(*conn)));
            }
        }
        for (id, w) in &self.workers {
            self.worker_deliveries(*id, w, &mut out);
        }
        if let Some(seq) = self.catalog_pending {
            out.push((seq, Delivery::Catalog));
        }
        if let Some((seq, _, _)) = &self.scan_pending {
            out.push((*seq, Delivery::Scan));
        }
        for (session, (seq, _)) in &self.removals {
            out.push((*seq, Delivery::Removal(session.clone())));
        }
        for (orphan, (seq, _)) in &self.announcing {
            out.push((*seq, Delivery::Announcement(*orphan)));
        }
        out
    }

    fn worker_deliveries(&self, id: WorkerId, w: &FakeWorker, out: &mut Vec<(u64, Delivery)>) {
        match w.stage {
            WorkerStage::Booting => out.push((w.since, Delivery::Boot(id))),
            WorkerStage::Running => {
                if let Some((seq, _)) = w.to_runtime.front() {
                    out.push((*seq, Delivery::ToWorker(id)));
                }
            }
            WorkerStage::Hung => {}
            WorkerStage::Dead => {
                if w.to_server.is_empty() || self.options.holds.exit_overtakes {
                    out.push((w.since, Delivery::Exit(id)));
                }
            }
        }
        if let Some((seq, _)) = w.to_server.front() {
            out.push((*seq, Delivery::FromWorker(id)));
        }
    }

    /// Carries out one pending hop (see [`World::deliveries`]). A hop that is
    /// not pending does nothing.
    pub fn deliver(&mut self, delivery: &Delivery, amount: Amount) {
        match delivery {
            Delivery::ToServer(conn) => self.deliver_to_server(*conn, amount),
            Delivery::ToClient(conn) => self.deliver_to_client(*conn, amount),
            Delivery::Boot(worker) => {
                trace!(self, "{worker} boots");
                self.boot_worker(*worker);
            }
            Delivery::ToWorker(worker) => self.deliver_to_worker(*worker),
            Delivery::FromWorker(worker) => self.deliver_from_worker(*worker, amount),
            Delivery::Exit(worker) => {
                let dead = self
                    .workers
                    .get(worker)
                    .is_some_and(|w| w.stage == WorkerStage::Dead);
                if dead {
                    self.report_exit(*worker);
                }
            }
            Delivery::Catalog => {
                if self.catalog_pending.is_some() {
                    self.load_catalog();
                }
            }
            Delivery::Removal(session_id) => {
                if let Some((_, generation)) = self.removals.remove(session_id) {
                    self.finish_removal(session_id.clone(), generation);
                }
            }
            Delivery::Scan => {
                if let Some((_, scan, sessions)) = self.scan_pending.take() {
                    trace!(self, "server hears its catalog scan");
                    self.finish_scan(scan, sessions);
                }
            }
            Delivery::Announcement(orphan) => self.deliver_announcement(*orphan),
        }
        self.run();
    }

    fn deliver_to_server(&mut self, conn: ConnId, amount: Amount) {
        let Some(c) = self.clients.get_mut(&conn) else {
            return;
        };
        let mut bytes = Vec::new();
        let max = match amount {
            Amount::All => usize::MAX,
            Amount::One | Amount::Significant => c.outbox.front().map_or(0, |(_, b)| b.len()),
            Amount::Up(n) => n.max(1),
        };
        while bytes.len() < max {
            let Some((_, chunk)) = c.outbox.front_mut() else {
                break;
            };
            let take = chunk.len().min(max - bytes.len());
            bytes.extend(chunk.drain(..take));
            if chunk.is_empty() {
                c.outbox.pop_front();
            }
        }
        if !bytes.is_empty() {
            c.delivered += bytes.len() as u64;
            let mut frames = 0;
            while c.frame_ends.front().is_some_and(|end| *end <= c.delivered) {
                c.frame_ends.pop_front();
                frames += 1;
            }
            if frames > 1 {
                self.multi_frame.insert(conn);
            }
            trace!(self, "{conn} ⇒ server {} bytes", bytes.len());
            self.push(Input::Received { conn, bytes });
            return;
        }
        if c.eof.take().is_some() {
            self.active.remove(&conn);
            trace!(self, "{conn} ⇒ server end of stream");
            self.push(Input::Disconnected { conn });
        }
    }

    fn deliver_to_client(&mut self, conn: ConnId, amount: Amount) {
        let count = match amount {
            Amount::All => usize::MAX,
            Amount::One | Amount::Significant => 1,
            Amount::Up(n) => n.max(1),
        };
        let keep = self.options.keep_received;
        let mut written = 0;
        let mut closed = false;
        let mut v8_read = Vec::new();
        let Some(c) = self.clients.get_mut(&conn) else {
            return;
        };
        for _ in 0..count {
            let reading = c.reading;
            match c.inbox.front().map(|(_, m)| &**m) {
                Some(Incoming::Frame { .. }) if reading => {}
                Some(Incoming::Close) => {}
                _ => break,
            }
            match c.inbox.pop_front().expect("checked").1.into_inner() {
                Incoming::Frame {
                    len,
                    message,
                    bytes,
                    v8,
                } => {
                    written += len;
                    v8_read.extend(v8);
                    if let (Some(tap), Some(bytes)) = (&mut c.tap, bytes) {
                        tap.push(bytes);
                    }
                    if let Some(message) = message {
                        if let ServerMessage::Hello(_) = message.as_ref() {
                            c.ready = true;
                        }
                        if keep {
                            c.received.push(message.as_ref().clone());
                        }
                    }
                }
                Incoming::Close => {
                    closed = true;
                    break;
                }
            }
        }
        for message in &v8_read {
            self.v8_read(conn, message);
        }
        if written > 0 {
            self.push(Input::Written {
                conn,
                bytes: written,
            });
        }
        if closed {
            trace!(self, "{conn} sees the server close");
            self.client_closed(conn);
            self.push(Input::Disconnected { conn });
        }
    }

    fn deliver_to_worker(&mut self, worker: WorkerId) {
        let Some(w) = self
            .workers
            .get_mut(&worker)
            .filter(|w| w.stage == WorkerStage::Running)
        else {
            return;
        };
        let Some(message) = w.to_runtime.pop_front().map(|(_, m)| m.into_inner()) else {
            return;
        };
        trace!(self, "server ⇒ {worker} {}", summary::to_worker(&message));
        self.worker_receive(worker, message);
    }

    fn deliver_from_worker(&mut self, worker: WorkerId, amount: Amount) {
        let count = match amount {
            Amount::All => usize::MAX,
            Amount::One => 1,
            Amount::Up(n) => n.max(1),
            Amount::Significant => usize::MAX,
        };
        for _ in 0..count {
            let Some(w) = self.workers.get_mut(&worker) else {
                return;
            };
            let Some(message) = w.to_server.pop_front().map(|(_, m)| m.into_inner()) else {
                break;
            };
            let significant = !matches!(message, FromWorker::Progress { .. });
            if self.options.trace && significant {
                let line = summary::from_worker(&mut self.names, &message);
                trace!(self, "{worker} ⇒ server {line}");
            }
            self.push(Input::FromWorker {
                worker,
                message: Box::new(message),
            });
            if significant && amount == Amount::Significant {
                break;
            }
        }
        let drained = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.to_server.is_empty());
        let dead = self
            .workers
            .get(&worker)
            .is_some_and(|w| w.stage == WorkerStage::Dead);
        if drained && dead && !self.options.holds.exit {
            self.report_exit(worker);
        }
    }

    /// The store removes a session server generation `generation` asked to
    /// remove. A removal that outlives a hand-off is news to the new server
    /// only through its watcher: the directory changed.
    pub(super) fn finish_removal(&mut self, session_id: String, generation: u64) {
        let result = if self.store.fail_writes {
            Err("simulated storage failure while removing".to_string())
        } else {
            match self.store.remove(&session_id) {
                Some(_) => Ok(()),
                None => Err("no such session directory".to_string()),
            }
        };
        if result.is_ok() {
            self.reached.insert(super::Milestone::Removed);
            self.removed.insert(session_id.clone());
            self.fact(Fact::StoreRemoved {
                session_id: session_id.clone(),
            });
        }
        if generation == self.generation {
            self.push(Input::SessionRemoved { session_id, result });
        } else if result.is_ok() {
            trace!(
                self,
                "the store removes {} for an earlier server",
                self.names.session(&session_id)
            );
            self.unscanned.insert(session_id);
            self.push(Input::CatalogChanged);
        }
    }
}
