//! See [`kernel_fuzz::decode`].

#![no_main]
// `fuzz_target!` expands to a debug hook that writes a file; kernel/clippy.toml
// (which applies here too) disallows that for the kernel itself.
#![allow(clippy::disallowed_methods)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kernel_fuzz::decode(data));
