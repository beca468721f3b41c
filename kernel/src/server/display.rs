//! One-line descriptions of the server's inputs and outputs, for traces of
//! its steps (the daemon logs each step at trace level; the turmoil tests
//! read them). Secrets (worker tokens) and payloads are left out.

use super::{Input, Output};
use crate::worker::{FromWorker, ToWorker};
use std::fmt;

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tick => f.write_str("tick"),
            Self::CatalogLoaded { sessions, .. } => {
                write!(f, "catalog loaded ({})", sessions.len())
            }
            Self::CatalogChanged => f.write_str("catalog changed"),
            Self::CatalogUnwatched => f.write_str("catalog unwatched"),
            Self::CatalogScanned { scan, sessions, .. } => {
                write!(f, "catalog scan {scan} ({})", sessions.len())
            }
            Self::Accepted { conn, peer: None } => write!(f, "{conn} accepted"),
            Self::Accepted {
                conn,
                peer: Some(peer),
            } => write!(f, "{conn} accepted from {peer}"),
            Self::Presented { conn, .. } => write!(f, "{conn} presented a token"),
            Self::Received { conn, bytes } => write!(f, "{conn} received {}B", bytes.len()),
            Self::Written { conn, bytes } => write!(f, "{conn} wrote {bytes}B"),
            Self::Disconnected { conn } => write!(f, "{conn} disconnected"),
            Self::WorkerSpawned { worker, .. } => write!(f, "{worker} spawned"),
            Self::WorkerSpawnFailed { worker, error } => {
                write!(f, "{worker} spawn failed: {error}")
            }
            Self::FromWorker { worker, message } => {
                let kind = match message.as_ref() {
                    FromWorker::Ready { .. } => "ready",
                    FromWorker::Failed { .. } => "failed",
                    FromWorker::Snapshot { .. } => "snapshot",
                    FromWorker::Progress { .. } => "progress",
                    FromWorker::OpDone { .. } => "op done",
                    FromWorker::Fatal { .. } => "fatal",
                    FromWorker::Approvals { .. } => "approvals",
                };
                write!(f, "{worker} {kind}")
            }
            Self::WorkerExited { worker } => write!(f, "{worker} exited"),
            Self::SessionRemoved { session_id, result } => {
                let how = if result.is_ok() {
                    "removed"
                } else {
                    "not removed"
                };
                write!(f, "session {session_id} {how}")
            }
            Self::Shutdown => f.write_str("shutdown"),
            Self::WorkerHello {
                channel,
                session_id,
                pid,
                ..
            } => write!(f, "{channel} hello for {session_id} (pid {pid})"),
            Self::WorkerAnnounced {
                channel,
                session_id,
                pid,
                ..
            } => write!(f, "{channel} announces {session_id} (pid {pid})"),
            Self::HandoffRequested => f.write_str("hand-off requested"),
            Self::AdoptionsExpected { sessions } => {
                write!(f, "adoptions expected ({})", sessions.len())
            }
        }
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Send { conn, frame } => write!(f, "send {conn} {}B", frame.len()),
            Self::Close { conn, reason } => write!(f, "close {conn} ({reason})"),
            Self::SpawnWorker { worker, create, .. } => {
                let why = if create.is_some() { "create" } else { "open" };
                write!(f, "spawn {worker} ({why})")
            }
            Self::StartWorker {
                channel, worker, ..
            } => write!(f, "start {worker} on {channel}"),
            Self::ToWorker { worker, message } => match message {
                ToWorker::Operation { operation, .. } => {
                    write!(f, "{worker} ← {}", operation.name())
                }
                ToWorker::Dispose => write!(f, "{worker} ← dispose"),
                ToWorker::Snapshot => write!(f, "{worker} ← send snapshot"),
            },
            Self::KillWorker { worker } => write!(f, "kill {worker}"),
            Self::RemoveSession { session_id } => write!(f, "remove {session_id}"),
            Self::ScanCatalog { scan } => write!(f, "scan catalog {scan}"),
            Self::StopAccepting => f.write_str("stop accepting"),
            Self::ShutdownComplete => f.write_str("shutdown complete"),
            Self::AdoptWorker {
                channel, worker, ..
            } => write!(f, "adopt {worker} on {channel}"),
            Self::RejectWorker { channel, reason } => write!(f, "reject {channel}: {reason}"),
            Self::ReleaseWorker { worker } => write!(f, "release {worker}"),
        }
    }
}
