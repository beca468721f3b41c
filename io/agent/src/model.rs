//! The model-call interface, as the kernel runtime defines it.

pub use kernel::runtime::{ModelEvent, ModelRequest, Purpose};
