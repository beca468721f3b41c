//! Interop with the real client: `tests/interop/interop.mjs` drives the
//! daemon with the published `@earendil-works/pi-client@0.84.4` (installed
//! from the npm registry by `tests/interop/install.sh` on first use).

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

fn available(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn published_client_drives_the_daemon() {
    if !available("node") || !available("npm") {
        eprintln!("SKIPPED: the interop test needs `node` and `npm` on PATH (Node 20+)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop");
    let install = run(Command::new(dir.join("install.sh"))).await;
    assert!(
        install.status.success(),
        "tests/interop/install.sh failed: {install:#?}"
    );

    // The script steers 60 ms into a turn of about a dozen deltas: they
    // must not be too fast (the default is 30 ms; more leaves room on a
    // loaded machine).
    let options = Options {
        faux_delay_ms: 50,
        ..Options::default()
    };
    let server = TestServer::start_with("interop", options).await;
    let mut node = Command::new("node");
    node.arg(dir.join("interop.mjs"))
        .arg(&server.socket)
        .current_dir(&dir);
    let output = run(node).await;
    println!("{}", output.stdout);
    eprintln!("{}", output.stderr);
    assert!(
        output.status.success(),
        "interop.mjs failed ({}):\n{}\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    assert!(output.stdout.contains("interop: all checks passed"));
}
