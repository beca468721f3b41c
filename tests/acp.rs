//! The ACP adapter with a real editor-side client: `tests/acp/acp.mjs` spawns
//! `pi-server acp` processes and drives them with the published
//! `@agentclientprotocol/sdk@2.4.0` (installed from the npm registry by
//! `tests/acp/install.sh` on first use). The script starts, replaces and
//! kills its own `pi-server serve` processes in the test root.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The whole script (about a dozen scenarios, several of which replace or
/// crash the server) on a loaded two-core machine.
const BOUND: Duration = Duration::from_secs(900);

/// Every scenario of the script but `i`: new, prompt, tool call, thinking,
/// cancel and steer, list, load after the adapter was killed, two adapters,
/// server replacement mid-prompt, bad input, resume/close/delete.
#[tokio::test(flavor = "multi_thread")]
async fn published_acp_client_drives_the_adapter() {
    run_script("a,b,c,d,e,f,g,h,j,k").await;
}

/// Scenario `l`: the editor's MCP servers (the reference server from npm),
/// offered to the model, called, and kept by a turn that outlives the editor.
#[tokio::test(flavor = "multi_thread")]
async fn the_editors_mcp_servers_run_in_the_session_and_outlive_the_editor() {
    run_script("l").await;
}

/// Scenario `i`: a server SIGKILLed mid-prompt and started again. The new
/// server waits for the orphan that still holds the session's lock, so the
/// adapter's re-attach is served by it and the prompt completes.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_crash_mid_prompt_is_invisible_to_the_editor() {
    run_script("i").await;
}

async fn run_script(scenarios: &str) {
    if !available("node") || !available("npm") {
        eprintln!("SKIPPED: the ACP test needs `node` and `npm` on PATH (Node 20+)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/acp");
    let install = run_bounded(
        Command::new(dir.join("install.sh")),
        Duration::from_secs(300),
        "tests/acp/install.sh",
    )
    .await;
    assert!(
        install.status.success(),
        "tests/acp/install.sh failed: {install:#?}"
    );
    mcp_servers().await;

    // Dropping the root kills every process mentioning it (servers,
    // workers, adapters, node) and removes it.
    let root = TestRoot::new("acp");
    let config = serde_json::json!({
        "bin": bin(),
        "serverDir": root.path.join("server"),
        "serverId": SERVER_ID,
        "sessionDir": root.path.join("sessions"),
    });
    let config_path = root.path.join("acp-config.json");
    std::fs::write(&config_path, config.to_string()).expect("write the ACP config");

    let mut node = Command::new("node");
    node.arg(dir.join("acp.mjs"))
        .arg(&config_path)
        .arg(scenarios)
        .current_dir(&dir);
    root.isolate(&mut node);
    let output = run_bounded(node, BOUND, "node tests/acp/acp.mjs").await;
    println!("{}", output.stdout);
    eprintln!("{}", output.stderr);
    if !output.status.success() {
        print_server_log_tail(&root.path);
    }
    assert!(
        output.status.success(),
        "acp.mjs failed ({}):\n{}\n{}",
        output.status,
        output.stdout,
        output.stderr
    );
    assert!(output.stdout.contains("acp: all checks passed"));
}
