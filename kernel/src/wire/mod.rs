//! Bytes on the wire: length-prefixed frames carrying one strict-subset CBOR item.
//!
//! - [`value`]: the data model ([`Value`]).
//! - [`cbor`]: strict encoder and decoder of one item.
//! - [`frame`]: the u32 big-endian length prefix and the incremental [`FrameDecoder`].

pub mod cbor;
pub mod frame;
pub mod value;

pub use cbor::{CborError, CborLimits};
pub use frame::{FrameDecoder, FrameError};
pub use value::{MAX_SAFE_INTEGER, Value};
