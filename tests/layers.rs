//! The crates are floors: the client library (`io/client`) links the kernel
//! and tokio only, so a front end built on it carries no server-side crate
//! (no rusqlite, axum or reqwest); the store (`io/store`) links no async
//! runtime or network crate. `cargo tree -p pi-client -e normal` shows the
//! same from outside.

use std::path::Path;

/// The `[dependencies]` table of a crate's manifest, one name per entry.
fn dependencies(manifest: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(manifest);
    let text = std::fs::read_to_string(&path).expect("the manifest");
    text.split("\n[dependencies]\n")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .expect("its body")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split([' ', '=']).next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn the_client_library_links_the_kernel_and_tokio_only() {
    assert_eq!(
        dependencies("io/client/Cargo.toml"),
        ["kernel", "tokio", "tracing"]
    );
}

#[test]
fn the_store_links_no_runtime_or_network_crate() {
    for name in dependencies("io/store/Cargo.toml") {
        assert!(
            !["tokio", "axum", "reqwest", "pi-client", "pi-io"].contains(&name.as_str()),
            "io/store depends on {name}"
        );
    }
}
