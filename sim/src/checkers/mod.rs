//! Checkers: what must hold after every step, judged from the outside.
//!
//! They are separate from the drivers (the swarm and the model checker call
//! [`Checkers::observe`] after every step and [`pending`] at the end) and read
//! only what the world reports: its [`Fact`]s, the store, the fake workers,
//! and the kernel's public queries. Each module checks one property:
//!
//! | module | property |
//! |---|---|
//! | [`requests`] | every request gets exactly one response while its connection lives |
//! | [`snapshots`] | revisions never go back; responses and events reflect the attachment; what is broadcast is committed |
//! | [`store`] | a committed (terminal) transcript item is never lost or changed |
//! | [`listed`] | every session list a client is sent names every stored session the kernel can know of |
//! | [`rules`] | a session command from a connection not attached is `invalid_request`; disposal only of an idle runtime with nothing on its way; a dead worker's attached connections closed; every handshake answered by its deadline; no hello without the right token accepted, none with it refused; an orphan retires only idle after its grace; no `not_found` for a stored session the kernel can know of |
//! | [`streams`] | a reply a client rebuilds from its snapshot and the deltas after it has no hole: it is a prefix of the next text it is sent |
//! | [`shown`] | streamed text a client was shown is stored, within the checkpoint bound (250 ms, 4 KiB) |
//! | [`turns`] | a turn retries a failed model call no more and no less than `max_attempts` allows; acknowledged steer text reaches the model unless the reply failed |
//! | [`busy`] | the busy rules: one prompt per session at a time, `busy` only when one runs |
//! | [`processes`] | at most one live runtime and one worker per session; world and kernel agree on workers |
//! | [`bounds`] | no output queue passes its bound; the world and the kernel count the same bytes |
//! | [`v8`] | v8 clients: update sequences, decoding, replicas equal to the kernel's state, fencing, envelopes before answers, chord 0.85.1's vocabulary |
//! | [`liveness`] | once faults stop, everything settles ([`pending`] says why not) |

pub mod bounds;
pub mod busy;
pub mod listed;
pub mod liveness;
pub mod processes;
pub mod requests;
pub mod rules;
pub mod shown;
pub mod snapshots;
pub mod store;
pub mod streams;
pub mod turns;
pub mod v8;

pub use liveness::pending;

use crate::world::{Fact, World};
use std::fmt;
use std::hash::Hasher;

/// A broken property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The checker that found it.
    pub checker: &'static str,
    /// What is wrong, with connection, request and session ids.
    pub message: String,
}

impl Violation {
    pub(crate) fn new(checker: &'static str, message: String) -> Self {
        Self { checker, message }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.checker, self.message)
    }
}

/// The result of one check.
pub type Check = Result<(), Violation>;

/// Every checker, fed in order.
#[derive(Debug, Default, Clone)]
pub struct Checkers {
    /// Requests and responses.
    pub requests: requests::Requests,
    /// Snapshot revisions, attachments, commit-before-broadcast.
    pub snapshots: snapshots::Snapshots,
    /// Committed transcript items.
    pub store: store::StoreChecker,
    /// Streamed text shown is stored within the checkpoint bound.
    pub shown: shown::Shown,
    /// Replies rebuilt by each connection have no hole.
    pub streams: streams::Streams,
    /// Response codes against the attachment rule.
    pub rules: rules::Rules,
    /// Busy rules.
    pub busy: busy::Busy,
    /// Model attempts per turn, steer delivery.
    pub turns: turns::Turns,
    /// Protocol v8 clients.
    pub v8: v8::V8,
    /// Facts seen so far.
    pub facts_seen: u64,
}

impl Checkers {
    /// Fresh checkers for a fresh world.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consumes the world's new facts and checks every property. Call after every step.
    pub fn observe(&mut self, world: &mut World) -> Check {
        let facts = world.take_facts();
        for fact in &facts {
            self.facts_seen += 1;
            self.observe_fact(world, fact)?;
        }
        self.store.check(&mut world.store)?;
        self.shown.check(world)?;
        self.rules.check_handshakes(world)?;
        self.rules.check_disposals(world)?;
        self.v8.check(world)?;
        processes::check(world)?;
        bounds::check(world)
    }

    fn observe_fact(&mut self, world: &World, fact: &Fact) -> Check {
        self.requests.observe(fact)?;
        self.snapshots.observe(world, fact)?;
        self.store.observe(fact);
        self.shown.observe(world, fact);
        self.streams.observe(fact)?;
        self.rules.observe(world, fact)?;
        listed::observe(fact)?;
        self.v8.observe(fact)?;
        let max_attempts = World::worker_policy().max_attempts;
        self.turns.observe(fact, max_attempts)?;
        self.busy.observe(fact)
    }

    /// Folds the checkers' state into a model-checking fingerprint.
    pub fn fingerprint(&self, hasher: &mut impl Hasher) {
        self.requests.fingerprint(hasher);
        self.busy.fingerprint(hasher);
        self.snapshots.fingerprint(hasher);
        self.v8.fingerprint(hasher);
    }
}
