//! Deterministic simulation of pi-server: the real kernel in a fake world.
//!
//! - [`world`]: the fake world (clients, workers, store, virtual time).
//! - [`summary`]: one-line trace summaries with small ids.
//! - [`prng`]: the seeded generator everything random derives from.

pub mod prng;
pub mod summary;
pub mod world;
