//! Deterministic simulation of pi-server: the real kernel in a fake world.
//!
//! - [`world`]: the fake world (clients, workers, store, virtual time).
//! - [`summary`]: one-line trace summaries with small ids.

pub mod summary;
pub mod world;
