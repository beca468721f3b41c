//! The pi-server daemon: the server loop that binds the kernel's `Server`
//! to Unix sockets, TCP and the web listener ([`server`]), and the session
//! worker process that binds `WorkerHost` to SQLite, the model providers
//! and the tools ([`worker`]). It carries out the kernel's outputs and feeds
//! back inputs; it makes no protocol decisions.

pub mod duplex;
mod limits;
pub mod server;
pub mod socket;
pub mod web;
pub mod worker;

pub use server::{ServeOptions, WebAccess, serve};
