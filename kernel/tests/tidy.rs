//! The kernel stays sans-IO: no runtime, socket, database or OS crates, no
//! clock, no entropy, nothing hash-ordered. Clippy's `disallowed-methods` and
//! `disallowed-types` (`kernel/clippy.toml`) say the same to the linter; this
//! test makes `cargo test` say it too, so a later change cannot slip it in.

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn kernel_has_no_runtime_dependencies() {
    let manifest =
        fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).expect("manifest");
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .expect("its body");
    let declared: Vec<&str> = deps
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        declared.is_empty(),
        "the kernel must not depend on anything: {declared:?}"
    );
}

#[test]
fn kernel_sources_use_no_clock_entropy_io_or_hash_order() {
    let forbidden = [
        "Instant::now",
        "SystemTime",
        "UNIX_EPOCH",
        "HashMap",
        "HashSet",
        "thread_rng",
        "getrandom",
        "std::fs",
        "std::net",
        "std::os",
        "std::env",
        "std::process",
        "std::thread",
        "tokio",
        "mio",
        "rusqlite",
        "libc",
    ];
    let mut files = Vec::new();
    sources(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        &mut files,
    );
    assert!(files.len() > 10, "found the kernel sources");
    let mut hits = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                if code.contains(word) {
                    hits.push(format!(
                        "{}:{}: {word}: {}",
                        file.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "the kernel is sans-IO; found:\n{}",
        hits.join("\n")
    );
}
