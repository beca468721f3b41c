//! See `pi_front::fuzz_acp_stdin`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pi_front::fuzz_acp_stdin(data));
