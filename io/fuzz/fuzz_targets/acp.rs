//! See `pi_io::fuzz_acp_stdin`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pi_io::fuzz_acp_stdin(data));
