//! Deterministic simulation and model checking of pi-server: the real kernel
//! in a fake world.
//!
//! # The world
//!
//! [`world::World`] runs the real `kernel::server::Server` and, for every
//! session, the real `kernel::runtime::Runtime` inside a fake worker process
//! that streams the embedded faux model and fakes tool runs. Around them:
//! clients that speak bytes (protocol v1, or v8: [`world::v8`]), a durable
//! [`world::Store`] that survives workers
//! and servers, and virtual time (milliseconds; timers are the kernel's
//! deadlines, the faux stream's deltas, tool runs and retry backoffs). Every
//! hop between the kernel and its peers either happens at once (scripted
//! scenarios) or waits in its own FIFO until a driver delivers it (the swarm
//! and the model checker): client → server bytes, server → client frames,
//! server → worker and worker → server messages, worker boots, exit notices,
//! the catalog load and store removals. Order holds within a channel and is
//! free across channels. Nothing iterates a hash map; a run is a pure
//! function of the calls made on the world.
//!
//! # The fault model
//!
//! One `u64` seed derives every option of a run ([`options::SwarmOptions`]):
//! client and session counts, small kernel limits, and — TigerBeetle's
//! swarm testing — which [`options::FaultKind`]s are on, each with its own
//! probability (per step, delivery, action or connect) and stability (how
//! many steps an injected condition lasts): split client bytes, reordered
//! deliveries across channels, time passing with messages in flight,
//! disconnects at any point, garbage bytes, bad versions, requests before
//! hello, silent connections (handshake timeouts), slow consumers, worker
//! crashes at any point (opening, mid-turn, disposing), held worker boots
//! (start timeouts), spawn failures, store write failures, model failures
//! (retryable or not), server crash and restart, exit notices overtaking a
//! worker's last messages, and a late catalog load (hellos wait). The driver
//! ([`swarm`]) runs a safety phase with faults on for a number of kernel
//! steps, then a liveness phase with faults off in which the run must settle.
//!
//! # The checkers
//!
//! [`checkers`] are separate from the drivers and run after every step: at
//! most one live runtime and one worker per session, and the kernel's
//! workers are exactly the world's; every request gets exactly one response
//! while its connection lives; per connection and session, snapshot
//! revisions never go back (strictly increasing in events); a response's
//! `attached` is the requester's attachment after that kernel step; events
//! go only to attached connections; every terminal item a client is shown is
//! committed, and a committed item is never lost or changed (across crashes
//! and restarts); the busy rules, at the runtime and at the kernel (a
//! non-idle snapshot contains exactly one running prompt, `busy` only while
//! another prompt runs); no output queue passes its bound and the kernel's
//! byte count equals the world's; v8 clients' replicas, routes and answers
//! ([`checkers::v8`]); and, once faults stop, everything settles,
//! or [`checkers::pending`] says what is stuck. The kernel's own assertions
//! run at every step too; a panic is a failure of its own class.
//!
//! # Model checking
//!
//! [`model`] explores every interleaving of six small configurations (two
//! clients on one session; a worker crash and a server restart; every
//! command; a slow consumer, a failing store and a hand-off; a server crash
//! keeping its workers; a v8 client beside a v1 client) depth-first, branching by cloning states and merging
//! equal ones by fingerprint, with the same checkers and liveness at every
//! quiescent state.
//!
//! # Reproducing a failure
//!
//! A failing seed prints its class and `cargo run -p sim -- --seed S
//! --trace`, which replays the run exactly: the derived options first, then
//! one line per transition (virtual time, small ids `c3`, `w2`, `s1`, `op5`,
//! `r7`). `--steps`, `--clients`, `--faults kind,kind` and `--no-faults`
//! narrow a run down; a 40-digit commit hash is accepted as a seed. Exit
//! codes: 127 crash, 128 liveness, 129 correctness. Keep the seed, and a
//! scripted minimal reproduction, in `sim/tests/regressions.rs`.
//!
//! - [`world`]: the fake world.
//! - [`summary`]: one-line trace summaries with small ids.
//! - [`prng`]: the seeded generator everything random derives from.
//! - [`options`]: one seed → every option of a swarm run.
//! - [`swarm`]: the random driver (safety phase, liveness phase).
//! - [`checkers`]: the properties judged after every step.
//! - [`model`]: the explicit-state model checker.
//! - [`machines`]: the real client machines on world connections, and the
//!   lease swarm that drives them under faults.

pub mod checkers;
pub mod machines;
pub mod model;
pub mod options;
pub mod prng;
pub mod summary;
pub mod swarm;
pub mod typist;
pub mod v8;
pub mod world;
