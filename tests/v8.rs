//! Protocol v8 with the published client: `tests/v8/seed.mjs` ports pi's
//! durable-server seed scenarios onto `@earendil-works/pi-client@0.85.1`
//! and `@earendil-works/chord@0.85.1` (installed from the npm registry by
//! `tests/v8/install.sh` on first use) and drives the real binary; it
//! starts, replaces and kills its own servers and workers. `tests/v8/mixed.mjs`
//! puts the published v1 client (0.84.4, `tests/interop/install.sh`) and the
//! v8 one on one session.

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

fn install(dir: &str) -> Option<PathBuf> {
    if !available("node") || !available("npm") {
        eprintln!("SKIPPED: the v8 tests need `node` and `npm` on PATH (Node 20+)");
        return None;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(dir);
    let status = std::process::Command::new(dir.join("install.sh"))
        .status()
        .expect("runs install.sh");
    assert!(status.success(), "{}/install.sh failed", dir.display());
    Some(dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn published_v8_client_passes_the_seed_scenarios() {
    let Some(dir) = install("v8") else {
        return;
    };
    let mut node = Command::new("node");
    node.arg(dir.join("seed.mjs")).arg(bin()).current_dir(&dir);
    let output = run(node).await;
    println!("{}", output.stdout);
    eprintln!("{}", output.stderr);
    assert!(
        output.status.success(),
        "seed.mjs failed ({}):\n{}\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    assert!(output.stdout.contains(" passed, 0 failed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn v1_and_v8_clients_share_one_session() {
    let (Some(dir), Some(_)) = (install("v8"), install("interop")) else {
        return;
    };
    let options = Options {
        faux_delay_ms: 30,
        ..Options::default()
    };
    let server = TestServer::start_with("mixed", options).await;
    let mut node = Command::new("node");
    node.arg(dir.join("mixed.mjs"))
        .arg(&server.socket)
        .arg(SERVER_ID)
        .current_dir(&dir);
    let output = run(node).await;
    println!("{}", output.stdout);
    eprintln!("{}", output.stderr);
    assert!(
        output.status.success(),
        "mixed.mjs failed ({}):\n{}\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    assert!(output.stdout.contains("mixed: all checks passed"));
}
