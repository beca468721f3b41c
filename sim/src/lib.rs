//! Deterministic simulation of pi-server: the real kernel in a fake world.
//!
//! - [`world`]: the fake world (clients, workers, store, virtual time).
//! - [`summary`]: one-line trace summaries with small ids.
//! - [`prng`]: the seeded generator everything random derives from.
//! - [`options`]: one seed → every option of a swarm run.
//! - [`swarm`]: the random driver (safety phase, liveness phase).
//! - [`checkers`]: the properties judged after every step.

pub mod checkers;
pub mod options;
pub mod prng;
pub mod summary;
pub mod swarm;
pub mod world;
