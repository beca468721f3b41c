//! The server's life: graceful shutdown, crash and restart, and the durable
//! server — hand-off to a replacement, a crash that leaves workers running as
//! orphans, a new server starting and expecting them, their announcements,
//! adoption or rejection, and sibling servers changing the shared store.

use super::{Fact, Holds, Memo, Store, WorkerStage, World};
use kernel::host::{HostInput, HostOutput};
use kernel::ids::{ChannelId, ConnId, WorkerId};
use kernel::protocol::worker::WorkerFrame;
use kernel::server::{Input, Server};

/// Orphans are keyed above every id a kernel allocates.
pub(super) const ORPHAN_BASE: u64 = 1 << 40;

impl World {
    /// Graceful close of the server.
    pub fn shutdown(&mut self) {
        trace!(self, "server shutdown requested");
        self.push(Input::Shutdown);
        self.run();
    }

    /// The server process dies and a new one starts on the same store. Every
    /// client is disconnected and every worker dies with it.
    pub fn restart_server(&mut self) {
        trace!(self, "server crashes and restarts");
        self.expected_since = None;
        self.inbox.clear();
        self.scan_pending = None;
        self.workers.clear();
        self.removals.clear();
        self.unwritten.clear();
        let conns: Vec<ConnId> = self.clients.keys().copied().collect();
        for conn in conns {
            if self.options.holds == Holds::none() {
                self.clients.get_mut(&conn).expect("listed").closed = true;
            } else {
                self.client_closed(conn);
            }
        }
        self.fact(Fact::ServerRestarted);
        self.generation += 1;
        self.shut_down = false;
        self.server = Memo::new(Server::new(Self::config(&self.options, self.generation)));
        if self.options.holds.catalog {
            self.catalog_pending = Some(self.next_seq());
        } else {
            self.load_catalog();
        }
    }

    /// A new server with this id replaces the current one: the old server
    /// hands its workers over (they keep running as orphans) and exits; the
    /// new one loads its catalog, expects the released sessions, and each
    /// orphan announces itself to it and is adopted (or rejected).
    pub fn replace_server(&mut self) {
        self.replace_server_then(|_| {});
    }

    /// [`World::replace_server`], running `between` after the new server
    /// expects the adoptions and before any orphan announces itself.
    pub fn replace_server_then(&mut self, between: impl FnOnce(&mut World)) {
        self.replace_server_quietly();
        between(self);
        self.announce_orphans();
    }

    /// [`World::replace_server`] up to the new server expecting the
    /// adoptions: the orphans announce themselves at their next retry, or
    /// when [`World::announce_orphans`] says the server appeared.
    pub fn replace_server_quietly(&mut self) {
        self.reached.insert(super::Milestone::HandOff);
        trace!(self, "server replacement requested");
        self.push(Input::HandoffRequested);
        self.run();
        self.next_server();
        self.expect_orphans();
    }

    /// The server process dies; its workers survive as orphans (no server
    /// runs until [`World::start_server`]). Every client is disconnected.
    pub fn crash_server_keep_workers(&mut self) {
        trace!(self, "server crashes; its workers survive");
        self.inbox.clear();
        self.scan_pending = None;
        self.removals.clear();
        self.unwritten.clear();
        let conns: Vec<ConnId> = self.clients.keys().copied().collect();
        for conn in conns {
            self.client_closed(conn);
        }
        let ids: Vec<WorkerId> = self
            .workers
            .keys()
            .copied()
            .filter(|w| !self.orphans.contains_key(w))
            .collect();
        for worker in ids {
            if self.workers[&worker].runtime().is_some() {
                self.orphan(worker);
            } else {
                trace!(self, "{worker} dies with its server (not open yet)");
                self.workers.remove(&worker);
            }
        }
        self.server_down = true;
        self.shut_down = true;
        self.fail_announcements();
    }

    /// A new server starts (after [`World::crash_server_keep_workers`]);
    /// the orphans announce themselves and are adopted.
    pub fn start_server(&mut self) {
        self.start_server_then(|_| {});
    }

    /// [`World::start_server`], running `between` after the new server read
    /// the session locks and before any orphan announces itself.
    pub fn start_server_then(&mut self, between: impl FnOnce(&mut World)) {
        self.start_server_quietly();
        between(self);
        self.announce_orphans();
    }

    /// [`World::start_server`] up to the new server expecting the orphans'
    /// sessions: they announce themselves at their next retry, or when
    /// [`World::announce_orphans`] says the server appeared.
    pub fn start_server_quietly(&mut self) {
        self.next_server();
        self.expect_orphans();
    }

    /// What a starting server learns from the session locks (or, after a
    /// hand-off, from its predecessor): the sessions a live orphan holds will
    /// be announced, so it expects them.
    fn expect_orphans(&mut self) {
        let held: Vec<String> = self
            .orphans
            .keys()
            .filter_map(|o| self.workers.get(o).map(|w| w.session_id.clone()))
            .collect();
        if !held.is_empty() {
            self.expected_since = Some(self.now);
            self.push(Input::AdoptionsExpected { sessions: held });
            self.run();
        }
    }

    /// [`World::start_server`], but the catalog finishes loading only after
    /// the orphans announced themselves (a large directory scans slowly).
    pub fn start_server_catalog_late(&mut self) {
        self.new_generation(" (catalog late)");
        self.expect_orphans();
        self.announce_orphans();
        self.load_catalog();
    }

    /// A sibling server sharing the session directory changes the store
    /// (creates, renames or removes sessions); this server's watcher sees it.
    pub fn sibling_changes(&mut self, change: impl FnOnce(&mut Store) -> Vec<String>) {
        let changed = change(&mut self.store);
        trace!(self, "a sibling server changes {} sessions", changed.len());
        self.unscanned.extend(changed);
        self.push(Input::CatalogChanged);
        self.run();
    }

    /// Pids of the orphans, with their sessions.
    pub fn orphans(&self) -> Vec<(u64, String)> {
        self.orphans
            .iter()
            .map(|(o, pid)| (*pid, self.workers[o].session_id.clone()))
            .collect()
    }

    fn next_server(&mut self) {
        self.expected_since = None;
        self.fact(Fact::NewServer);
        // Workers the old server did not hand over (it killed those that
        // were still starting) died with it: none of them reaches the new one.
        let orphans = &self.orphans;
        let dead: Vec<WorkerId> = self
            .workers
            .keys()
            .copied()
            .filter(|w| !orphans.contains_key(w))
            .collect();
        for worker in dead {
            trace!(self, "{worker} died with the old server");
            self.workers.remove(&worker);
        }
        self.new_generation("");
        self.load_catalog();
    }

    /// A new server process, its catalog not loaded yet; `note` goes into
    /// the trace line.
    fn new_generation(&mut self, note: &str) {
        self.expected_since = None;
        self.fail_announcements();
        self.generation += 1;
        self.shut_down = false;
        self.server_down = false;
        self.inbox.clear();
        self.scan_pending = None;
        // The old process's output queues went with it.
        self.unwritten.clear();
        trace!(self, "server generation {} starts{note}", self.generation);
        self.server = Memo::new(Server::new(Self::config(&self.options, self.generation)));
    }

    /// The worker loses its server: it keeps its session (and model stream)
    /// under an orphan key, and its host starts counting the grace.
    pub(super) fn orphan(&mut self, worker: WorkerId) {
        // A socket is read to its end before its loss is seen: what the old
        // server wrote reaches the runtime first.
        while let Some(w) = self.workers.get_mut(&worker)
            && w.stage == WorkerStage::Running
            && let Some(message) = w.to_runtime.pop_front().map(|(_, m)| m.into_inner())
        {
            trace!(
                self,
                "server ⇒ {worker} {} (before the channel ends)",
                super::summary::to_worker(&message)
            );
            self.worker_receive(worker, message);
        }
        let Some(mut w) = self.workers.remove(&worker) else {
            return;
        };
        if w.stage == WorkerStage::Dead {
            // It was exiting when it was let go: nothing is left to adopt.
            trace!(self, "{worker} released after it exited");
            return;
        }
        let pid = ORPHAN_BASE + (self.generation << 20) + worker.0;
        let key = WorkerId(pid);
        trace!(self, "{worker} released: orphan pid {}", pid - ORPHAN_BASE);
        // Its first announcement finds no server to adopt it: the old one is
        // leaving (or dead), and the new one does not listen yet.
        let now = self.now;
        let mut outputs = Vec::new();
        // What the old server asked is no longer anyone's to answer, and
        // what it did not read is lost with its end of the channel: the
        // announcement's snapshot covers it.
        w.asked.clear();
        w.to_server.clear();
        if let Some(host) = w.host.as_mut() {
            outputs = host.step(now, HostInput::ChannelLost);
            if outputs.iter().any(|o| matches!(o, HostOutput::Announce(_))) {
                outputs.retain(|o| !matches!(o, HostOutput::Announce(_)));
                outputs.extend(host.step(now, HostInput::Announced(None)));
            }
        }
        self.workers.insert(key, w);
        self.orphans.insert(key, pid);
        self.orphaned_at.insert(key, now);
        self.apply_host(key, outputs);
    }

    /// A new server listens: every orphan announces itself to it now.
    pub fn announce_orphans(&mut self) {
        let keys: Vec<WorkerId> = self.orphans.keys().copied().collect();
        for key in keys {
            self.host_step(key, HostInput::ServerAppeared);
            self.run();
        }
    }

    /// An orphan's host announces it: the server hears it if one runs
    /// (later, with [`Holds::announce`](super::Holds::announce));
    /// otherwise the attempt fails at once.
    pub(super) fn announce(&mut self, key: WorkerId, hello: WorkerFrame) -> Option<HostInput> {
        if self.server_down || self.shut_down {
            return Some(HostInput::Announced(None));
        }
        if self.options.holds.announce {
            let seq = self.next_seq();
            self.announcing.insert(key, (seq, hello));
            return None;
        }
        self.hear_announcement(key, hello)
    }

    /// A held announcement arrives: a server that started meanwhile hears
    /// it; a dead one never answers it.
    pub(super) fn deliver_announcement(&mut self, key: WorkerId) {
        let Some((_, hello)) = self.announcing.remove(&key) else {
            return;
        };
        if !self.workers.contains_key(&key) {
            // The orphan died on the way: the server reads its hello and
            // then the end of its channel, which is no adoption.
            trace!(self, "an announcement of a dead orphan is lost");
            return;
        }
        trace!(self, "an announcement reaches the server");
        let answer = if self.server_down || self.shut_down {
            Some(HostInput::Announced(None))
        } else {
            self.hear_announcement(key, hello)
        };
        if let Some(answer) = answer {
            self.host_step(key, answer);
        }
    }

    /// The server reads an orphan's hello.
    fn hear_announcement(&mut self, key: WorkerId, hello: WorkerFrame) -> Option<HostInput> {
        let failed = Some(HostInput::Announced(None));
        let (
            Some(&pid),
            WorkerFrame::Hello {
                resume: Some(snapshot),
                version,
                ..
            },
        ) = (self.orphans.get(&key), hello)
        else {
            return failed;
        };
        let channel = ChannelId(self.next_channel);
        self.next_channel += 1;
        self.channels.insert(channel, key);
        let session_id = self.workers[&key].session_id.clone();
        let short = self.names_session(&session_id);
        trace!(
            self,
            "orphan pid {} announces {short} on {channel}",
            pid - ORPHAN_BASE
        );
        self.push(Input::WorkerAnnounced {
            channel,
            session_id,
            pid,
            version,
            snapshot,
        });
        None
    }

    /// Announcements no server will answer (it died, or a new one started):
    /// they fail, and their orphans announce again later.
    fn fail_announcements(&mut self) {
        let pending = std::mem::take(&mut self.channels);
        let travelling = std::mem::take(&mut self.announcing);
        for key in pending.into_values().chain(travelling.into_keys()) {
            self.host_step(key, HostInput::Announced(None));
        }
    }

    pub(super) fn on_adopt(&mut self, channel: ChannelId, worker: WorkerId) {
        let Some(key) = self.channels.remove(&channel) else {
            return;
        };
        let Some(pid) = self.orphans.remove(&key) else {
            // The orphan retired while its announcement was on the way: the
            // server adopted a process that is gone, and learns it at once.
            trace!(self, "{worker} was adopted gone");
            self.push(Input::WorkerExited { worker });
            return;
        };
        self.orphaned_at.remove(&key);
        let w = self.workers.remove(&key).expect("orphan");
        self.reached.insert(super::Milestone::OrphanAdopted);
        if self.options.record_facts {
            self.fact(Fact::Adopted {
                session_id: w.session_id.clone(),
                at: self.now,
                phase: w.runtime().map(|r| r.phase()),
            });
        }
        trace!(
            self,
            "server adopts orphan pid {} as {worker}",
            pid - ORPHAN_BASE
        );
        self.workers.insert(worker, w);
        self.host_step(worker, HostInput::Announced(Some(WorkerFrame::Adopted)));
    }
}
