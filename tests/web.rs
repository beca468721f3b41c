//! The web client in a real browser: `tests/web/web.mjs` starts
//! `pi-server serve --listen http://…` and drives the served page in Debian's
//! headless `chromium` with `playwright-core` (installed from the npm
//! registry by `tests/web/install.sh` on first use). Each scenario saves a
//! screenshot under the test root's `screens/` (kept with
//! `PI_WEB_SCREENS=DIR`). The page's own unit tests (`tests/web/*.test.mjs`,
//! `node --test`: its WebSocket transport and what it draws of a
//! transcript replica) run here too.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Six scenarios, one of which replaces the server, on a loaded two-core machine.
const BOUND: Duration = Duration::from_secs(600);

const CHROMIUM: &str = "/usr/bin/chromium";

/// Node and npm are needed; so is chromium, which `.ci/run` installs: on CI
/// its absence fails the test, elsewhere it skips with a message.
fn prerequisites(chromium: bool) -> bool {
    let mut missing = Vec::new();
    if !available("node") || !available("npm") {
        missing.push("`node` and `npm` (Node 20+)");
    }
    if chromium && !Path::new(CHROMIUM).exists() {
        missing.push("Debian's chromium (`apt-get install chromium`)");
    }
    if missing.is_empty() {
        return true;
    }
    let message = format!("the web tests need {}", missing.join(" and "));
    assert!(std::env::var_os("CI").is_none(), "{message}");
    eprintln!("SKIPPED: {message}");
    false
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/web")
}

/// The page's WebSocket transport against a fake socket, and what it draws
/// of a transcript replica.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_s_transport_and_view_pass_their_unit_tests() {
    if !prerequisites(false) {
        return;
    }
    let mut node = Command::new("node");
    node.arg("--test").arg(".").current_dir(dir());
    let output = run_bounded(node, Duration::from_secs(120), "node --test tests/web").await;
    assert!(
        output.status.success(),
        "node --test failed:\n{}\n{}",
        output.stdout,
        output.stderr
    );
    assert!(output.stdout.contains("# fail 0"), "{}", output.stdout);
}

/// Every scenario of the script: token entry, create, prompt with
/// streaming, the phone-sized list; a second browser watching; steer,
/// abort, model and thinking; a reload mid-turn; a server replacement
/// mid-turn; a wrong token, a foreign origin and host; a turn's frames
/// holding nothing of earlier turns; an image sent with a prompt; a worker
/// killed mid-turn.
#[tokio::test(flavor = "multi_thread")]
async fn the_web_client_works_in_a_real_browser() {
    if !prerequisites(true) {
        return;
    }
    let install = run_bounded(
        Command::new(dir().join("install.sh")),
        Duration::from_secs(300),
        "tests/web/install.sh",
    )
    .await;
    assert!(
        install.status.success(),
        "tests/web/install.sh failed: {install:#?}"
    );

    let root = TestRoot::new("web");
    let screens = std::env::var_os("PI_WEB_SCREENS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.path.join("screens"));
    let config = serde_json::json!({
        "bin": bin(),
        "serverDir": root.path.join("server"),
        "serverId": SERVER_ID,
        "sessionDir": root.path.join("sessions"),
        "screens": screens,
    });
    let config_path = root.path.join("web-config.json");
    std::fs::write(&config_path, config.to_string()).expect("write the web config");
    let mut node = Command::new("node");
    node.arg(dir().join("web.mjs"))
        .arg(&config_path)
        .current_dir(dir());
    root.isolate(&mut node);
    let output = run_bounded(node, BOUND, "node tests/web/web.mjs").await;
    println!("{}", output.stdout);
    eprintln!("{}", output.stderr);
    if !output.status.success() {
        print_server_log_tail(&root.path);
    }
    assert!(
        output.status.success(),
        "web.mjs failed ({}):\n{}",
        output.status,
        output.stdout
    );
    assert!(output.stdout.contains("web: all checks passed"));
    for name in [
        "a-session-mid-turn",
        "a-list-phone",
        "b-watcher-mid-turn",
        "c-aborted",
        "d-after-reload",
        "e-after-replacement",
        "f-wrong-token",
        "f-foreign-origin",
        "g-keyboard",
        "h-deltas",
        "i-image",
        "j-worker-killed",
    ] {
        assert!(
            screens.join(format!("{name}.png")).exists(),
            "screenshot {name}.png saved"
        );
    }
}
