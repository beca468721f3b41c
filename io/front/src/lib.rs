//! pi-server's front ends, on the client library ([`pi_client`]): the
//! command line ([`cli`]), the terminal UI and the ACP adapter. Every line
//! a user types goes through the kernel's client-side machines
//! (`kernel::client::front`); the front ends present what they decide.
//! Nothing here links the daemon: `serve` and the hidden `worker` run what
//! the binary hands in ([`cli::Daemon`]).

mod acp;
pub mod cli;
mod limits;
mod text;
mod tui;

/// The ACP fuzz target's body (`io/front/fuzz`).
#[doc(hidden)]
pub use acp::fuzz_stdin as fuzz_acp_stdin;
