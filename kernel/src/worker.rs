//! The server's view of one worker process, and the messages between them.
//!
//! One worker process hosts one live session (its runtime and its storage).
//! The server never opens a session's storage itself; it spawns a worker,
//! forwards control operations to it and relays what it reports.
//!
//! ```text
//!   spawn ──► Spawning ──spawned──► Starting ──ready──► Idle ◄──► Busy
//!                │                     │                  │        │
//!                │ (start deadline)    │ (start deadline) └─dispose┴──► Retiring ──exit──► Exited
//!                └─────────────── crash or failure at any point ────────────────────────────► Exited
//! ```
//!
//! Deadlines: `Spawning`/`Starting` must reach ready within
//! [`Limits::worker_start_timeout`](crate::limits::Limits); `Retiring` must exit
//! within [`Limits::worker_dispose_timeout`](crate::limits::Limits), after which
//! the kernel asks the driver to kill the process.

use crate::ids::{OpId, WorkerId};
use crate::protocol::{
    ModelRef, ProtocolError, SessionSnapshot, ThinkingLevel, TranscriptProgress,
};
use crate::time::Instant;

/// What a new session starts with. `None` fields take the worker's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSpec {
    /// Working directory.
    pub cwd: Option<String>,
    /// Display name.
    pub name: Option<String>,
    /// Initial model.
    pub model: Option<ModelRef>,
    /// Initial thinking level.
    pub thinking_level: Option<ThinkingLevel>,
}

/// A control operation the server forwards to a worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// Run a turn; completes when the turn ends (also when aborted).
    Prompt { text: String },
    /// Queue text into the running turn.
    Steer { text: String },
    /// End the running turn with an aborted item.
    Abort,
    /// Select a model (idle only).
    SetModel { model: ModelRef },
    /// Select a thinking level (idle only).
    SetThinking { level: ThinkingLevel },
}

impl Operation {
    /// The protocol command name this operation serves.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Prompt { .. } => "prompt",
            Self::Steer { .. } => "steer",
            Self::Abort => "abort",
            Self::SetModel { .. } => "set_model",
            Self::SetThinking { .. } => "set_thinking",
        }
    }
}

/// Server → worker.
#[derive(Debug, Clone, PartialEq)]
pub enum ToWorker {
    /// Start operation `op`; the worker answers with [`FromWorker::OpDone`].
    Operation { op: OpId, operation: Operation },
    /// Finish: flush storage and exit. Sent when the session is disposed.
    Dispose,
}

/// Worker → server.
#[derive(Debug, Clone, PartialEq)]
pub enum FromWorker {
    /// The session is open; its first snapshot.
    Ready { snapshot: SessionSnapshot },
    /// The session could not be opened or created (for example `session_locked`
    /// when another worker holds it). The worker exits after sending it.
    Failed { error: ProtocolError },
    /// The runtime state changed.
    Snapshot { snapshot: SessionSnapshot },
    /// A transient streaming hint.
    Progress { progress: TranscriptProgress },
    /// Operation `op` finished.
    OpDone {
        op: OpId,
        outcome: Result<SessionSnapshot, ProtocolError>,
    },
    /// The runtime hit a fatal error (for example storage failed). The worker exits.
    Fatal { message: String },
}

/// Lifecycle of one worker incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkerState {
    /// Asked the driver to spawn the process; not yet running.
    Spawning,
    /// The process runs; waiting for [`FromWorker::Ready`].
    Starting,
    /// Ready, nothing running.
    Idle,
    /// Ready, an operation or turn is running.
    Busy,
    /// Asked to dispose; waiting for the process to exit.
    Retiring,
    /// The process is gone.
    Exited,
}

/// What the driver must do when a worker deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerTimeout {
    /// It did not become ready in time: kill it and fail the opening.
    Start,
    /// It did not exit after dispose: kill it.
    Dispose,
}

/// The server-side lifecycle machine of one worker process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    id: WorkerId,
    state: WorkerState,
    deadline: Option<Instant>,
    killed: bool,
}

impl Worker {
    /// A worker about to be spawned, which must be ready by `start_deadline`.
    pub fn spawning(id: WorkerId, start_deadline: Instant) -> Self {
        Self {
            id,
            state: WorkerState::Spawning,
            deadline: Some(start_deadline),
            killed: false,
        }
    }

    /// A running worker of another server, adopted as it is (ready).
    pub fn adopted(id: WorkerId) -> Self {
        Self {
            id,
            state: WorkerState::Idle,
            deadline: None,
            killed: false,
        }
    }

    /// This incarnation's id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Current state.
    pub fn state(&self) -> WorkerState {
        self.state
    }

    /// When [`Worker::on_tick`] has something to do.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once ready and until retiring.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, WorkerState::Idle | WorkerState::Busy)
    }

    /// The driver started the process.
    pub fn on_spawned(&mut self) {
        if self.state == WorkerState::Spawning {
            self.state = WorkerState::Starting;
        }
    }

    /// The worker reported ready. Returns false when that is out of order.
    pub fn on_ready(&mut self) -> bool {
        match self.state {
            WorkerState::Spawning | WorkerState::Starting => {
                self.state = WorkerState::Idle;
                self.deadline = None;
                true
            }
            _ => false,
        }
    }

    /// Busy ↔ idle, as derived from the session's phase and operations in flight.
    pub fn set_busy(&mut self, busy: bool) {
        if self.is_ready() {
            self.state = if busy {
                WorkerState::Busy
            } else {
                WorkerState::Idle
            };
        }
    }

    /// Ask it to finish. Returns true when a dispose message must be sent
    /// (it is running); false when it is already retiring or gone.
    pub fn retire(&mut self, now: Instant, dispose_timeout: std::time::Duration) -> bool {
        match self.state {
            WorkerState::Retiring | WorkerState::Exited => false,
            _ => {
                self.state = WorkerState::Retiring;
                self.deadline = Some(now + dispose_timeout);
                true
            }
        }
    }

    /// The process exited (cleanly or not).
    pub fn on_exit(&mut self) {
        self.state = WorkerState::Exited;
        self.deadline = None;
    }

    /// Deadline handling. Returns what expired, at most once per deadline.
    pub fn on_tick(&mut self, now: Instant) -> Option<WorkerTimeout> {
        let deadline = self.deadline?;
        if now < deadline {
            return None;
        }
        self.deadline = None;
        self.killed = true;
        match self.state {
            WorkerState::Spawning | WorkerState::Starting => Some(WorkerTimeout::Start),
            WorkerState::Retiring => Some(WorkerTimeout::Dispose),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn lifecycle_and_deadlines() {
        let mut w = Worker::spawning(WorkerId(1), Instant(100));
        assert_eq!(w.state(), WorkerState::Spawning);
        assert_eq!(w.on_tick(Instant(99)), None);
        w.on_spawned();
        assert_eq!(w.state(), WorkerState::Starting);
        assert!(w.on_ready());
        assert!(!w.on_ready(), "a second ready is out of order");
        assert_eq!(w.deadline(), None);
        w.set_busy(true);
        assert_eq!(w.state(), WorkerState::Busy);
        w.set_busy(false);
        assert!(w.retire(Instant(200), Duration::from_millis(50)));
        assert!(
            !w.retire(Instant(210), Duration::from_millis(50)),
            "retiring is idempotent"
        );
        w.set_busy(true);
        assert_eq!(
            w.state(),
            WorkerState::Retiring,
            "busy does not leave retiring"
        );
        assert_eq!(w.on_tick(Instant(250)), Some(WorkerTimeout::Dispose));
        assert_eq!(w.on_tick(Instant(300)), None, "a deadline fires once");
        w.on_exit();
        assert_eq!(w.state(), WorkerState::Exited);
    }

    #[test]
    fn start_deadline_expires_before_ready() {
        let mut w = Worker::spawning(WorkerId(2), Instant(10));
        assert_eq!(w.on_tick(Instant(10)), Some(WorkerTimeout::Start));
        w.on_exit();
        assert!(!w.on_ready());
    }
}
