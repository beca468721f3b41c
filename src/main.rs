//! The `pi-server` binary.
fn main() {}
