//! The io layer of pi-server: carries out the kernel's outputs on real sockets,
//! processes and SQLite, and feeds back inputs. It makes no protocol decisions.

mod acp;
pub mod agent;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod duplex;
pub mod settings;
pub mod socket;
mod tui;
pub mod web;
pub mod worker;

/// The client library (its own crate, `io/client`: kernel and tokio only).
pub use pi_client as client;
/// A session's storage (its own crate, `io/store`).
pub use pi_store as store;
