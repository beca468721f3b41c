//! `cargo run -p sim -- --seed S`: replays one simulated run.
fn main() {}
