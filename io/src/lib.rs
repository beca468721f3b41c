//! The io layer of pi-server: carries out the kernel's outputs on real sockets,
//! processes and SQLite, and feeds back inputs. It makes no protocol decisions.

mod acp;
pub mod agent;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod duplex;
pub mod settings;
pub mod socket;
pub mod store;
mod tui;
pub mod web;
pub mod worker;
