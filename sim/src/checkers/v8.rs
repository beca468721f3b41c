//! Protocol v8 clients, judged from what the kernel queues for them.
//!
//! The checker keeps a mirror of every v8 connection ([`V8Client`], the
//! client's own machine) fed with each message as the kernel queues it,
//! so it knows at every step what the client will have seen once it has
//! read everything; a connection's frames are read in the order they are
//! queued. Judged at every message, or after every step:
//!
//! - **(a) sequence.** Per subscription, each `state` update's `sequence`
//!   is the previous one + 1, from the snapshot's.
//! - **(b) decode and apply.** Every update decodes (path ids, short
//!   forms) and applies to the replica; so does everything a client read
//!   ([`Fact::V8Broken`]); every message is a well-formed v8 message.
//! - **(c) replica = server.** After every step, the replica of each
//!   live `pi.transcript` subscription equals the kernel's own state of
//!   that session ([`kernel::server::Server::v8_transcript`]): the same
//!   sequence, the same value.
//! - **(d) fencing.** No update of a subscription arrives after the
//!   `attachment` envelope that ended or replaced the route it was made
//!   under, nor after its unsubscribe was answered, nor before its
//!   subscribe was.
//! - **(f) envelope first.** An `attach` is answered only once the
//!   envelope announcing its session went out, a `detach` once `attachment
//!   null` did, a `remove` once no v8 client's route is the removed
//!   session. With no attach, detach or remove in flight, the route a
//!   client was told is the kernel's attachment of that connection, and
//!   a connection whose session's worker died was told its route is gone.
//!   An envelope naming a route answers an `attach` of that session in
//!   flight: a cancelled or an answered attach routes nothing.
//! - **(f') management in order.** `create`, `attach`, `detach` and
//!   `remove` of one connection are answered in the order they were sent:
//!   pi's server runs them one at a time (pi-v8.md §3.2), so a client's
//!   last one decides its route. A call answered without running (a
//!   cancel, a refusal of its shape, target or the connection's limits)
//!   may be answered at once.
//! - **(g) vocabulary.** Only the op verbs `r s d a t p #` and the update
//!   types `state unavailable replaced spawned closed` (never `m` or
//!   `reset`), a snapshot's state as one `r`.
//!
//! (e), one response per request while the connection lives, is
//! [`super::requests`]'s, for v8 requests too.

use super::{Check, Violation};
use crate::world::v8::{Asked, Route, TRANSCRIPT, V8Client, V8Message};
use crate::world::{Fact, World};
use kernel::ids::ConnId;
use kernel::server::Stage;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};

/// See the module documentation.
#[derive(Debug, Default, Clone)]
pub struct V8 {
    mirrors: BTreeMap<ConnId, V8Client>,
    /// Connections that ended: what is queued for them afterwards is not judged.
    closed: BTreeSet<ConnId>,
    /// Connections whose session's worker died while they were routed to
    /// it, with that route: by the end of the step they must be told.
    lost: BTreeMap<ConnId, Route>,
    /// Per (connection, subscription): the (server, replica) sequences last
    /// found equal, so an unchanged pair is not compared again.
    compared: BTreeMap<(ConnId, String), (u64, u64)>,
    /// Per connection, its management calls not answered yet, in the order sent.
    management: BTreeMap<ConnId, VecDeque<String>>,
    /// Updates judged.
    pub updates: u64,
    /// Replica comparisons with the kernel's state.
    pub comparisons: u64,
}

fn violation(message: String) -> Check {
    Err(Violation::new("v8", message))
}

impl V8 {
    /// Applies one fact.
    pub fn observe(&mut self, fact: &Fact) -> Check {
        match fact {
            Fact::V8RequestSent {
                conn,
                id,
                target,
                call,
            } => {
                if !self.closed.contains(conn) {
                    let asked = Asked::of(target, call);
                    if asked.serialised() {
                        self.management
                            .entry(*conn)
                            .or_default()
                            .push_back(id.clone());
                    }
                    self.mirrors.entry(*conn).or_default().sent(id, asked);
                }
                Ok(())
            }
            Fact::V8Emitted { conn, message, .. } => {
                if self.closed.contains(conn) {
                    return Ok(());
                }
                self.emitted(*conn, message)
            }
            Fact::V8Broken { conn, problem } => {
                violation(format!("{conn} read what it cannot use: {problem}"))
            }
            Fact::ConnClosed { conn } => {
                self.closed.insert(*conn);
                self.mirrors.remove(conn);
                self.lost.remove(conn);
                self.management.remove(conn);
                self.compared.retain(|(c, _), _| c != conn);
                Ok(())
            }
            Fact::ServerRestarted => {
                let conns: Vec<ConnId> = self.mirrors.keys().copied().collect();
                self.closed.extend(conns);
                self.mirrors.clear();
                self.lost.clear();
                self.management.clear();
                self.compared.clear();
                Ok(())
            }
            Fact::WorkerLost { session_id, .. } => {
                for (conn, mirror) in &self.mirrors {
                    if let Some(route) = mirror
                        .route
                        .as_ref()
                        .filter(|r| r.session_id == *session_id)
                    {
                        self.lost.insert(*conn, route.clone());
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn emitted(&mut self, conn: ConnId, message: &V8Message) -> Check {
        self.mirrors.entry(conn).or_default();
        if let V8Message::Response { id, outcome } = message
            && let Some(queue) = self.management.get_mut(&conn)
            && let Some(at) = queue.iter().position(|q| q == id)
        {
            // A cancel, and a call refused before it runs (its shape, its
            // target, the connection's limits), are answered at once.
            let ran = !matches!(outcome, Err(e) if e.code == "cancelled"
                || e.code == "invalid_request"
                || e.code == "wrong_server"
                || e.code.starts_with("service_"));
            if at > 0 && ran {
                return violation(format!(
                    "{conn}: management call {id} answered before {} sent earlier \
                     (pi's server runs them in order)",
                    queue[0]
                ));
            }
            queue.remove(at);
        }
        let mirror = &self.mirrors[&conn];
        match message {
            V8Message::Update {
                subscription_id, ..
            } => {
                self.updates += 1;
                if !mirror.subs.contains_key(subscription_id) {
                    let why = match mirror.ended.get(subscription_id) {
                        Some(why) => format!("after it was {why}"),
                        None => "that was never subscribed (or not yet answered)".to_string(),
                    };
                    return violation(format!(
                        "{conn}: an update of {subscription_id} {why} (fencing)"
                    ));
                }
            }
            V8Message::Attachment(Some(route))
                if !mirror
                    .pending
                    .values()
                    .any(|a| *a == Asked::Attach(route.session_id.clone())) =>
            {
                return violation(format!(
                    "{conn}: routed to {} ({}) with no attach of it in flight \
                     (a cancelled or an answered attach does not route)",
                    route.session_id, route.attachment_id
                ));
            }
            V8Message::Response { id, outcome: Ok(_) } => match mirror.pending.get(id) {
                Some(Asked::Attach(session))
                    if mirror.route.as_ref().map(|r| &r.session_id) != Some(session) =>
                {
                    return violation(format!(
                        "{conn}: attach {id} of {session} answered while its route is {:?} \
                         (the attachment envelope goes first)",
                        mirror.route
                    ));
                }
                Some(Asked::Detach) if mirror.route.is_some() => {
                    return violation(format!(
                        "{conn}: detach {id} answered while its route is {:?} \
                         (attachment null goes first)",
                        mirror.route
                    ));
                }
                Some(Asked::Remove(session)) => {
                    let routed: Vec<ConnId> = self
                        .mirrors
                        .iter()
                        .filter(|(_, m)| m.route.as_ref().is_some_and(|r| r.session_id == *session))
                        .map(|(c, _)| *c)
                        .collect();
                    if !routed.is_empty() {
                        return violation(format!(
                            "{conn}: remove {id} of {session} answered while {routed:?} \
                             are still routed to it (attachment null goes first)"
                        ));
                    }
                }
                _ => {}
            },
            _ => {}
        }
        let mirror = self.mirrors.get_mut(&conn).expect("made above");
        let read = mirror.read(message, false);
        match read.problems.first() {
            Some(problem) => violation(format!("{conn}: {problem}")),
            None => Ok(()),
        }
    }

    /// What must hold after every step: routes agree with the kernel's
    /// attachments, a lost worker's clients were told, and every live
    /// transcript replica equals the kernel's state.
    pub fn check(&mut self, world: &World) -> Check {
        let lost = std::mem::take(&mut self.lost);
        for (conn, route) in lost {
            if !self.serves(world, conn) {
                continue;
            }
            let mirror = &self.mirrors[&conn];
            if mirror.route.as_ref() == Some(&route) {
                return violation(format!(
                    "{conn}: the worker of {} died and the connection still has its route {}",
                    route.session_id, route.attachment_id
                ));
            }
        }
        let conns: Vec<ConnId> = self.mirrors.keys().copied().collect();
        for conn in conns {
            if !self.serves(world, conn) {
                continue;
            }
            let mirror = &self.mirrors[&conn];
            if mirror.pending.values().any(Asked::routes) {
                continue;
            }
            let told = mirror.route.as_ref().map(|r| r.session_id.clone());
            let kernel = world.server.attachments(conn);
            if kernel.len() > 1 || told.as_ref() != kernel.first() {
                return violation(format!(
                    "{conn}: told its route is {told:?}, the kernel has it attached to {kernel:?} \
                     (no attach, detach or remove in flight)"
                ));
            }
            let Some(route) = mirror.route.clone() else {
                continue;
            };
            self.compare(world, conn, &route)?;
        }
        Ok(())
    }

    /// True while the kernel serves `conn` (ready, not closing).
    fn serves(&self, world: &World, conn: ConnId) -> bool {
        self.mirrors.contains_key(&conn)
            && world.server.connection_stage(conn) == Some(Stage::Ready)
    }

    /// (c) for the transcript subscriptions of `conn` under `route`.
    fn compare(&mut self, world: &World, conn: ConnId, route: &Route) -> Check {
        let mirror = &self.mirrors[&conn];
        for (sub, replica) in &mirror.subs {
            if replica.service != TRANSCRIPT || replica.route.as_ref() != Some(route) {
                continue;
            }
            let Some((sequence, value)) = &replica.state else {
                continue;
            };
            let Some(state) = world.server.v8_transcript(&route.session_id) else {
                return violation(format!(
                    "{conn}: {sub} replicates {}'s transcript, which the kernel does not keep",
                    route.session_id
                ));
            };
            let key = (conn, sub.clone());
            let pair = (state.sequence(), *sequence);
            if self.compared.get(&key) == Some(&pair) {
                continue;
            }
            self.comparisons += 1;
            if state.sequence() != *sequence {
                return violation(format!(
                    "{conn}: {sub} is at sequence {sequence}, {}'s transcript at {}",
                    route.session_id,
                    state.sequence()
                ));
            }
            if !state.value().same_as(value) {
                return violation(format!(
                    "{conn}: {sub} at sequence {sequence} differs from {}'s transcript:\n  \
                     replica {}\n  kernel  {}",
                    route.session_id,
                    value.json_text(),
                    state.value().json_text()
                ));
            }
            self.compared.insert(key, pair);
        }
        Ok(())
    }

    /// Once everything settled: each v8 client read what the kernel sent
    /// (its replicas are the mirror's), and each transcript state a client
    /// replicates shows its session idle with every item of its runtime's
    /// transcript an entry.
    pub fn settled(&self, world: &World) -> Option<String> {
        for (conn, mirror) in &self.mirrors {
            let Some(client) = world.clients().find(|(c, _)| c == conn).map(|(_, c)| c) else {
                continue;
            };
            let Some(v8) = client.v8.as_deref().filter(|_| !client.closed) else {
                continue;
            };
            if v8.route != mirror.route {
                return Some(format!(
                    "{conn}: read route {:?}, was sent {:?}",
                    v8.route, mirror.route
                ));
            }
            for (sub, replica) in &mirror.subs {
                let read = v8.subs.get(sub).and_then(|r| r.state.as_ref());
                let sent = replica.state.as_ref();
                let equal = match (read, sent) {
                    (Some((a, x)), Some((b, y))) => a == b && x.same_as(y),
                    (None, None) => true,
                    _ => false,
                };
                if !equal {
                    return Some(format!("{conn}: {sub} read differs from what was sent"));
                }
                if replica.service != TRANSCRIPT {
                    continue;
                }
                let (Some(route), Some((_, value))) = (&replica.route, sent) else {
                    continue;
                };
                if let Some(stuck) = unsettled_transcript(world, &route.session_id, value) {
                    return Some(format!("{conn}: {sub}: {stuck}"));
                }
            }
        }
        None
    }

    /// Folds the mirrors into a model-checking fingerprint.
    pub fn fingerprint(&self, hasher: &mut impl Hasher) {
        if self.mirrors.is_empty() {
            return;
        }
        let mut text = String::new();
        for (conn, mirror) in &self.mirrors {
            conn.hash(hasher);
            mirror.fingerprint(&mut text);
        }
        text.hash(hasher);
    }
}

/// Why a settled session's transcript state is not what its runtime
/// holds: `docs["pi.live"]` must be `{}` and every item an entry.
fn unsettled_transcript(
    world: &World,
    session_id: &str,
    value: &kernel::wire::Value,
) -> Option<String> {
    use kernel::wire::Value;
    let items = world.runtime_items(session_id)?;
    let live = value.get("docs").and_then(|d| d.get("pi.live"));
    if live != Some(&Value::Map(Vec::new())) {
        return Some(format!(
            "{session_id} settled with docs[\"pi.live\"] = {}",
            live.map_or("absent".into(), Value::json_text)
        ));
    }
    let entries = match value.get("entries") {
        Some(Value::Array(entries)) => entries.len(),
        _ => return Some(format!("{session_id}: no entries")),
    };
    if entries != items {
        return Some(format!(
            "{session_id} settled with {entries} entries; its runtime holds {items} items"
        ));
    }
    None
}
