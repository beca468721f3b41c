//! pi protocol v1: typed messages ([`types`]) and their strict schema mapping
//! to and from [`crate::wire::Value`] ([`codec`]).

pub mod codec;
pub mod packed;
pub mod types;
pub mod v8;
pub mod worker;

pub use codec::{
    SchemaError, decode_client_message, decode_server_message, encode_client_message,
    encode_server_message, encode_trusted_server_message,
};
pub use packed::{Gap, PackedSnapshot, PackedTranscript, Transcript};
pub use types::*;
