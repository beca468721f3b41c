//! The sans-IO core of pi-server.
//!
//! Everything that decides anything lives here, as plain values driven by
//! inputs: the pi protocol v1 codec ([`wire`], [`protocol`]), the server's
//! connection and session machines ([`server`]), the worker-side session
//! runtime ([`runtime`]) and the worker process around it ([`host`]), and
//! the client-connection machine with its leases ([`client`]).
//!
//! Calling protocol, shared by every machine: the driver owns the machine by
//! `&mut`, feeds it one input at a time together with `now`
//! ([`time::Instant`], virtual milliseconds), carries out the returned outputs
//! in order, and wakes it at [`next_deadline`](server::Server::next_deadline)
//! with a tick. Nothing here reads a clock, draws entropy, touches a file or a
//! socket, or iterates a hash map into an output.

pub mod approval;
pub mod chord;
pub mod client;
pub mod faux;
pub mod host;
pub mod ids;
pub mod limits;
pub mod link;
pub mod mcp;
pub mod protocol;
pub mod rng;
pub mod runtime;
pub mod server;
pub mod time;
pub mod web;
pub mod wire;
pub mod worker;
