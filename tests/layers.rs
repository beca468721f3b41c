//! The crates are floors, and no crate links one above it:
//!
//! | floor | crates |
//! |---|---|
//! | 3 | `pi-server` (the binary: dispatches) |
//! | 2 | `pi-daemon` (server loop, worker, web listener), `pi-front` (CLI, TUI, ACP) |
//! | 1 | `pi-agent` (providers, tools, MCP) |
//! | 0 | `pi-client`, `pi-store`, `pi-config` |
//! | – | `kernel` (no dependency at all) |
//!
//! The client library (`io/client`) links the kernel and tokio only, so a
//! front end built on it carries no server-side crate; the front ends link
//! no daemon, store, agent, SQLite, HTTP server or HTTP client; the store
//! links no async runtime or network crate. `cargo tree -p pi-front -e
//! normal` shows the same from outside.

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
            ![
                "tokio",
                "axum",
                "reqwest",
                "pi-client",
                "pi-daemon",
                "pi-front"
            ]
            .contains(&name.as_str()),
            "io/store depends on {name}"
        );
    }
}

/// What a front end must never link: the server side and its crates.
const SERVER_SIDE: [&str; 8] = [
    "pi-daemon",
    "pi-store",
    "pi-agent",
    "rusqlite",
    "axum",
    "reqwest",
    "rmcp",
    "notify",
];

#[test]
fn the_front_ends_link_no_server_side_crate() {
    for name in dependencies("io/front/Cargo.toml") {
        assert!(
            !SERVER_SIDE.contains(&name.as_str()),
            "io/front depends on {name}"
        );
    }
}

#[test]
fn the_configuration_links_no_runtime_network_or_sqlite_crate() {
    assert_eq!(
        dependencies("io/config/Cargo.toml"),
        ["kernel", "serde_json", "rustix", "tracing"]
    );
}

#[test]
fn the_kernel_links_nothing() {
    assert!(dependencies("kernel/Cargo.toml").is_empty());
}

#[test]
fn the_daemon_links_no_front_end() {
    for name in dependencies("io/daemon/Cargo.toml") {
        assert!(
            !["pi-front", "pi-client", "clap", "ratatui", "crossterm"].contains(&name.as_str()),
            "io/daemon depends on {name}"
        );
    }
}
