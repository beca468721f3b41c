//! The io layer of pi-server: carries out the kernel's outputs on real sockets,
//! processes and SQLite, and feeds back inputs. It makes no protocol decisions.

mod acp;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod duplex;
pub mod socket;
mod tui;
pub mod web;
pub mod worker;

/// The ACP fuzz target's body (`io/fuzz`).
#[doc(hidden)]
pub use acp::fuzz_stdin as fuzz_acp_stdin;

/// The agent back-ends and settings (their own crate, `io/agent`).
pub use pi_agent as agent;
pub use pi_agent::settings;
/// The client library (its own crate, `io/client`: kernel and tokio only).
pub use pi_client as client;
/// A session's storage (its own crate, `io/store`).
pub use pi_store as store;
