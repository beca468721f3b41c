//! Several logical servers in one server dir: finding them, and finding the
//! one that holds a session.
//!
//! Discovery tries every `<uuid>.sock` in the server dir (a lowercase
//! UUIDv4 name and a socket; `<uuid>.workers.sock` and anything else is
//! skipped), a few at a time, each with a 1 s limit for connect and hello.
//! Stale sockets, servers that do not answer in time and servers that refuse
//! us are left out. A server answering with a version error (another build)
//! is replaced by this build, as [`super::activate`] describes. When no
//! server runs at all, the command's default server is cold-activated, so a
//! stored session can be found in its catalog.

use super::activate::{
    MODEL_ONLY_AT_ACTIVATION, Target, activate, connect, connect_error, no_server, version_refusal,
};
use crate::limits::{PROBE_PARALLELISM, PROBE_TIMEOUT};
use kernel::client::lookup::{Unresolved, latest_in, resolve};
use kernel::protocol::SessionMetadata;
use pi_client::{Client, ClientOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// A server that answered.
pub(super) struct Found {
    /// Its id (the socket's name).
    pub(super) server_id: String,
    pub(super) client: Client,
}

/// What trying one socket gave.
enum Probe {
    Ready(Client),
    /// A `hello_error` with code `version`: another build.
    OtherVersion,
    /// Stale (no reason), unresponsive or refusing: left out.
    Skipped(Option<String>),
}

/// The `(server id, socket)` of every candidate client socket in `dir`, by id.
pub(super) fn endpoints(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let id = name.to_str()?.strip_suffix(".sock")?;
            if !kernel::rng::is_uuid_v4(id) {
                return None; // `<uuid>.workers.sock`, private bind names, strangers
            }
            // `DirEntry::file_type` does not follow symlinks.
            let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
            is_socket.then(|| (id.to_owned(), entry.path()))
        })
        .collect();
    found.sort();
    found
}

async fn probe(
    server_id: &str,
    socket: &Path,
    token: Option<&str>,
    launcher: Option<pi_client::Launcher>,
) -> Probe {
    let options = ClientOptions {
        handshake_timeout: PROBE_TIMEOUT,
        ..ClientOptions::default()
    };
    let attempt = Client::connect_launching(socket, token, options, launcher);
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(client)) => Probe::Ready(client),
        Ok(Err(e)) => match version_refusal(&e) {
            Some(_) => Probe::OtherVersion,
            None if no_server(&e) => {
                tracing::debug!(server = server_id, "skipping a stale socket");
                Probe::Skipped(None)
            }
            None => Probe::Skipped(Some(connect_error(socket, e))),
        },
        Err(_) => Probe::Skipped(Some(format!(
            "the server did not answer within {} s",
            PROBE_TIMEOUT.as_secs()
        ))),
    }
}

/// Tries every endpoint of `dir`, a few at a time; results by server id.
/// A client of a server found there starts it again should it vanish
/// ([`super::activate::launcher`]).
async fn probe_all(target: &Target, dir: &Path) -> Vec<(String, Probe)> {
    let permits = Arc::new(Semaphore::new(PROBE_PARALLELISM));
    let mut tasks = JoinSet::new();
    for (server_id, socket) in endpoints(dir) {
        let permits = Arc::clone(&permits);
        let token = target.token.clone();
        let launcher = target
            .for_server(&server_id)
            .and_then(|t| super::activate::launcher(&t));
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let outcome = probe(&server_id, &socket, token.as_deref(), launcher).await;
            (server_id, outcome)
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Ok(result) = joined {
            results.push(result);
        }
    }
    results.sort_by(|a, b| a.0.cmp(&b.0));
    results
}

/// Closes clients we are done with, concurrently.
pub(super) async fn close_all(found: Vec<Found>) {
    let mut tasks = JoinSet::new();
    for f in found {
        tasks.spawn(f.client.close());
    }
    while tasks.join_next().await.is_some() {}
}

/// The servers a command without a chosen server works with, by id: every
/// discovered server (those of another version replaced first), or, when
/// none runs, the default server (started on demand). With a chosen server
/// (`--connect`, `--server-id`), that server alone.
pub(super) async fn servers(target: &Target) -> Result<Vec<Found>, String> {
    let launch = match &target.launch {
        Some(launch) if !target.explicit => launch,
        _ => {
            let client = connect(target).await?;
            let server_id = client.server_snapshot().server_id;
            return Ok(vec![Found { server_id, client }]);
        }
    };
    let mut found = Vec::new();
    let mut other_versions = Vec::new();
    let mut skipped = Vec::new();
    for (server_id, outcome) in probe_all(target, &launch.server_dir).await {
        match outcome {
            Probe::Ready(client) => found.push(Found { server_id, client }),
            Probe::OtherVersion => other_versions.push(server_id),
            Probe::Skipped(Some(reason)) => skipped.push((server_id, reason)),
            Probe::Skipped(None) => {}
        }
    }
    // Each skipped server is said once: the default server's reason is the
    // command's own error when no other server answered.
    let warn_skipped = |found: &[Found]| {
        for (server_id, reason) in &skipped {
            if found.is_empty() && *server_id == launch.server_id {
                continue;
            }
            tracing::warn!(server = server_id, "skipping: {reason}");
        }
    };
    if target.model.is_some() && !found.is_empty() {
        close_all(found).await;
        return Err(MODEL_ONLY_AT_ACTIVATION.into());
    }
    for server_id in other_versions {
        let replacement = target.for_server(&server_id).expect("has a launch");
        let launch = replacement.launch.as_ref().expect("has a launch");
        match activate(&replacement, launch).await {
            Ok(client) => found.push(Found { server_id, client }),
            Err(e) => {
                close_all(found).await;
                return Err(e);
            }
        }
    }
    warn_skipped(&found);
    if found.is_empty() {
        let client = connect(target).await?;
        found.push(Found {
            server_id: launch.server_id.clone(),
            client,
        });
    }
    found.sort_by(|a, b| a.server_id.cmp(&b.server_id));
    Ok(found)
}

/// The server holding session `id`: the chosen one, or the only discovered
/// server whose catalog lists it.
/// The server holding the session `query` names, and the session's id.
///
/// `query` is a session id, a unique prefix of one, or a session name (see
/// [`kernel::client::lookup::resolve`]); the sessions searched are those of every discovered server
/// (or of the one `--server-id`/`--connect` picked).
pub(super) async fn session_server(
    target: &Target,
    query: &str,
) -> Result<(Client, String), String> {
    let none = format!("No session matches {query}");
    session_server_by(target, query, &none, |sessions| resolve(sessions, query)).await
}

/// The server holding the most recently active session of the working
/// directory (`--last`), and the session's id.
pub(super) async fn latest_here(target: &Target) -> Result<(Client, String), String> {
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the working directory: {e}"))?;
    let cwd = cwd.to_string_lossy().into_owned();
    let none = format!("No session works in {cwd}");
    session_server_by(target, &cwd, &none, |sessions| latest_in(sessions, &cwd)).await
}

/// [`session_server`] with `pick` choosing the session among those of the
/// servers searched; `none` says that it found none.
async fn session_server_by(
    target: &Target,
    query: &str,
    none: &str,
    pick: impl Fn(&[SessionMetadata]) -> Result<String, Unresolved>,
) -> Result<(Client, String), String> {
    let found = if target.explicit {
        let client = connect(target).await?;
        vec![Found {
            server_id: client.server_snapshot().server_id,
            client,
        }]
    } else {
        servers(target).await?
    };
    let searched = found.len();
    let sessions: Vec<SessionMetadata> = found
        .iter()
        .flat_map(|f| f.client.server_snapshot().sessions)
        .collect();
    let id = match pick(&sessions) {
        Ok(id) => id,
        Err(Unresolved::None) => {
            close_all(found).await;
            return Err(format!(
                "{none}\n  \
                 (searched {searched} running server{}; see `pi-server list`)",
                if searched == 1 { "" } else { "s" }
            ));
        }
        Err(Unresolved::Ambiguous(candidates)) => {
            close_all(found).await;
            return Err(format!(
                "{query} names more than one session; give more of the id:\n  {}",
                candidates.join("\n  ")
            ));
        }
    };
    let (mut holders, others): (Vec<Found>, Vec<Found>) = found.into_iter().partition(|f| {
        f.client
            .server_snapshot()
            .sessions
            .iter()
            .any(|s| s.id == id)
    });
    close_all(others).await;
    match holders.len() {
        1 => Ok((holders.pop().expect("one").client, id)),
        _ => {
            let ids: Vec<String> = holders.iter().map(|f| f.server_id.clone()).collect();
            close_all(holders).await;
            Err(format!(
                "Session {id} is available from more than one server\n  \
                 (servers {}; choose one with --server-id)",
                ids.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_uuid_named_sockets_only() {
        let dir = std::env::temp_dir().join(format!("pi-discover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = "0a1b2c3d-0000-4000-8000-000000000001";
        let b = "0a1b2c3d-0000-4000-8000-000000000002";
        let _la = std::os::unix::net::UnixListener::bind(dir.join(format!("{a}.sock"))).unwrap();
        let _lb = std::os::unix::net::UnixListener::bind(dir.join(format!("{b}.sock"))).unwrap();
        let _lw =
            std::os::unix::net::UnixListener::bind(dir.join(format!("{a}.workers.sock"))).unwrap();
        let _lx = std::os::unix::net::UnixListener::bind(dir.join("not-a-uuid.sock")).unwrap();
        let _lu =
            std::os::unix::net::UnixListener::bind(dir.join(format!("{}.sock", a.to_uppercase())))
                .unwrap();
        std::fs::write(
            dir.join("0a1b2c3d-0000-4000-8000-000000000003.sock"),
            "file",
        )
        .unwrap();
        std::os::unix::fs::symlink(
            dir.join(format!("{a}.sock")),
            dir.join("0a1b2c3d-0000-4000-8000-000000000004.sock"),
        )
        .unwrap();
        let ids: Vec<String> = endpoints(&dir).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, [a, b]);
        assert!(endpoints(&dir.join("missing")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
