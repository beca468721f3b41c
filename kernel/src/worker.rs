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

use crate::approval::{ApprovalPolicy, Approvals, Decision};
use crate::ids::{OpId, WorkerId};
use crate::protocol::{
    Content, JsonValue, ModelRef, PackedSnapshot, ProtocolError, SessionSnapshot, ThinkingLevel,
    TranscriptProgress,
};
use crate::time::Instant;
use std::time::Duration;

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
    /// Run a turn; completes when the turn ends (also when aborted). The
    /// images (only [`Content::Image`] parts, checked by the server) go
    /// with the text, after it.
    Prompt { text: String, images: Vec<Content> },
    /// Queue text into the running turn.
    Steer { text: String },
    /// End the running turn with an aborted item.
    Abort,
    /// Select a model (idle only).
    SetModel { model: ModelRef },
    /// Select a thinking level (idle only).
    SetThinking { level: ThinkingLevel },
    /// Name the session (the server checked the name).
    Rename { name: String },
    /// Remember the editor's MCP servers (an object of named servers).
    SetMcpServers { servers: JsonValue },
    /// Summarise the older conversation now (idle only), as `instructions`
    /// ask, if any.
    Compact { instructions: Option<String> },
    /// Answer the question about tool item `id`.
    Answer { id: String, decision: Decision },
    /// Set the session's approval policy (`None`: follow the settings).
    SetApprovals { policy: Option<ApprovalPolicy> },
}

impl Operation {
    /// A prompt of text alone.
    pub fn prompt(text: impl Into<String>) -> Self {
        Self::Prompt {
            text: text.into(),
            images: Vec::new(),
        }
    }

    /// The protocol command name this operation serves.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Prompt { .. } => "prompt",
            Self::Steer { .. } => "steer",
            Self::Abort => "abort",
            Self::SetModel { .. } => "set_model",
            Self::SetThinking { .. } => "set_thinking",
            Self::Rename { .. } => "rename",
            Self::SetMcpServers { .. } => "set_mcp_servers",
            Self::Compact { .. } => "compact",
            Self::Answer { .. } => "answer",
            Self::SetApprovals { .. } => "set_approvals",
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
    /// Send the session's current snapshot ([`FromWorker::Snapshot`]): the
    /// server let go of the transcript and a client needs it. Workers of
    /// channel version 1 do not know it.
    Snapshot,
}

/// Worker → server: with the transcript packed on the channel and in the
/// server ([`PackedSnapshot`]), typed as the worker's runtime produces it
/// ([`RuntimeMessage`]).
// The lint sizes the generic variants without their snapshot; with either
// snapshot type they are within a few words of `Progress`, and the server
// takes every message boxed (`Input::FromWorker`).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum FromWorker<S = PackedSnapshot> {
    /// The session is open; its first snapshot.
    Ready { snapshot: S },
    /// The session could not be opened or created (for example `session_locked`
    /// when another worker holds it). The worker exits after sending it.
    Failed { error: ProtocolError },
    /// The runtime state changed (or the server asked, [`ToWorker::Snapshot`]).
    Snapshot { snapshot: S },
    /// A transient streaming hint.
    Progress { progress: TranscriptProgress },
    /// Operation `op` finished.
    OpDone {
        op: OpId,
        outcome: Result<S, ProtocolError>,
    },
    /// The runtime hit a fatal error (for example storage failed). The worker exits.
    Fatal { message: String },
    /// The session's approvals as they stand (after `Ready`, on adoption,
    /// and whenever they change). Not in the snapshot: v1 clients do not
    /// know them.
    Approvals {
        approvals: Approvals,
        /// The policy in force (the session's, else the settings').
        policy: ApprovalPolicy,
    },
}

/// A snapshot as the runtime publishes it: every field, and of the
/// transcript the items from `from` on (`snapshot.transcript`). The items
/// before `from` are those of the runtime's previous publications, which
/// the server has, so a snapshot costs what changed, not the history.
#[derive(Debug, Clone, PartialEq)]
pub struct TailSnapshot {
    /// The snapshot, its transcript from `from` on.
    pub snapshot: SessionSnapshot,
    /// Where its transcript starts: 0 when it is whole.
    pub from: usize,
}

impl From<SessionSnapshot> for TailSnapshot {
    /// The whole snapshot.
    fn from(snapshot: SessionSnapshot) -> Self {
        Self { snapshot, from: 0 }
    }
}

impl TailSnapshot {
    /// `later`'s snapshot, its transcript extended back to where `self`'s
    /// starts (if earlier): what a server that saw neither needs.
    pub fn merged(self, mut later: Self) -> Self {
        if later.from > self.from {
            debug_assert!(
                later.from - self.from <= self.snapshot.transcript.len(),
                "a tail starts within what the earlier one covers"
            );
            let mut items = self.snapshot.transcript;
            items.truncate(later.from - self.from);
            items.append(&mut later.snapshot.transcript);
            later.snapshot.transcript = items;
            later.from = self.from;
        }
        later
    }
}

/// A worker message as the runtime produces it: its snapshots typed, their
/// transcripts from where they changed.
pub type RuntimeMessage = FromWorker<TailSnapshot>;

impl<S> FromWorker<S> {
    /// The same message with `f` applied to the snapshot it carries.
    pub fn try_map_snapshot<T, E>(
        self,
        f: impl FnOnce(S) -> Result<T, E>,
    ) -> Result<FromWorker<T>, E> {
        Ok(match self {
            Self::Ready { snapshot } => FromWorker::Ready {
                snapshot: f(snapshot)?,
            },
            Self::Failed { error } => FromWorker::Failed { error },
            Self::Snapshot { snapshot } => FromWorker::Snapshot {
                snapshot: f(snapshot)?,
            },
            Self::Progress { progress } => FromWorker::Progress { progress },
            Self::OpDone { op, outcome } => FromWorker::OpDone {
                op,
                outcome: match outcome {
                    Ok(snapshot) => Ok(f(snapshot)?),
                    Err(error) => Err(error),
                },
            },
            Self::Fatal { message } => FromWorker::Fatal { message },
            Self::Approvals { approvals, policy } => FromWorker::Approvals { approvals, policy },
        })
    }

    /// The snapshot it carries, if any, taken.
    pub fn into_snapshot(self) -> Option<S> {
        match self {
            Self::Ready { snapshot }
            | Self::Snapshot { snapshot }
            | Self::OpDone {
                outcome: Ok(snapshot),
                ..
            } => Some(snapshot),
            _ => None,
        }
    }

    /// The snapshot it carries, if any.
    pub fn snapshot(&self) -> Option<&S> {
        match self {
            Self::Ready { snapshot }
            | Self::Snapshot { snapshot }
            | Self::OpDone {
                outcome: Ok(snapshot),
                ..
            } => Some(snapshot),
            _ => None,
        }
    }
}

impl<S: Into<TailSnapshot>> FromWorker<S> {
    /// Packs the snapshot it carries for the channel.
    pub fn pack(self) -> Result<FromWorker, crate::wire::CborError> {
        self.try_map_snapshot(|s| {
            let TailSnapshot { snapshot, from } = s.into();
            PackedSnapshot::pack_tail(snapshot, from)
        })
    }
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

/// A deadline of a worker that passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerTimeout {
    /// It did not become ready in time: kill it and fail the opening.
    Start,
    /// It did not exit after dispose: kill it.
    Dispose,
}

/// What happened to a worker, as the server learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerInput {
    /// The driver started the process.
    Spawned,
    /// The worker reported ready.
    Ready,
    /// The session became busy (`true`) or idle, as derived from its phase
    /// and the operations in flight.
    Busy(bool),
    /// The server wants it to finish.
    Retire,
    /// The process exited (cleanly or not).
    Exited,
    /// Time passed.
    Tick,
}

/// What the server must do about a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerOutput {
    /// [`WorkerInput::Ready`] was in order: the session is open.
    Started,
    /// Send it [`ToWorker::Dispose`] (it is running and was not retiring).
    SendDispose,
    /// A deadline passed (reported once per deadline): kill it.
    Expired(WorkerTimeout),
}

/// The server-side lifecycle machine of one worker process: `step(now,
/// input)` and `next_deadline()`, as every kernel machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    id: WorkerId,
    state: WorkerState,
    deadline: Option<Instant>,
    dispose_timeout: Duration,
}

impl Worker {
    /// A worker about to be spawned, which must be ready by `start_deadline`
    /// and, once asked to dispose, exit within `dispose_timeout`.
    pub fn spawning(id: WorkerId, start_deadline: Instant, dispose_timeout: Duration) -> Self {
        Self {
            id,
            state: WorkerState::Spawning,
            deadline: Some(start_deadline),
            dispose_timeout,
        }
    }

    /// A running worker of another server, adopted as it is (ready).
    pub fn adopted(id: WorkerId, dispose_timeout: Duration) -> Self {
        Self {
            id,
            state: WorkerState::Idle,
            deadline: None,
            dispose_timeout,
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

    /// When [`WorkerInput::Tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// True once ready and until retiring.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, WorkerState::Idle | WorkerState::Busy)
    }

    /// Feeds one input at `now`.
    pub fn step(&mut self, now: Instant, input: WorkerInput) -> Option<WorkerOutput> {
        let output = self.on_input(now, input);
        debug_assert_eq!(self.invariants(), Ok(()));
        output
    }

    /// A deadline only while one can pass: the start's, or the dispose's.
    pub fn invariants(&self) -> Result<(), String> {
        let timed = matches!(
            self.state,
            WorkerState::Spawning | WorkerState::Starting | WorkerState::Retiring
        );
        if self.deadline.is_some() && !timed {
            return Err(format!(
                "worker {:?}: a deadline while {:?}",
                self.id, self.state
            ));
        }
        Ok(())
    }

    fn on_input(&mut self, now: Instant, input: WorkerInput) -> Option<WorkerOutput> {
        match input {
            WorkerInput::Spawned => {
                if self.state == WorkerState::Spawning {
                    self.state = WorkerState::Starting;
                }
                None
            }
            WorkerInput::Ready => match self.state {
                WorkerState::Spawning | WorkerState::Starting => {
                    self.state = WorkerState::Idle;
                    self.deadline = None;
                    Some(WorkerOutput::Started)
                }
                _ => None,
            },
            WorkerInput::Busy(busy) => {
                if self.is_ready() {
                    self.state = if busy {
                        WorkerState::Busy
                    } else {
                        WorkerState::Idle
                    };
                }
                None
            }
            WorkerInput::Retire => match self.state {
                WorkerState::Retiring | WorkerState::Exited => None,
                _ => {
                    self.state = WorkerState::Retiring;
                    self.deadline = Some(now + self.dispose_timeout);
                    Some(WorkerOutput::SendDispose)
                }
            },
            WorkerInput::Exited => {
                self.state = WorkerState::Exited;
                self.deadline = None;
                None
            }
            WorkerInput::Tick => {
                let deadline = self.deadline?;
                if now < deadline {
                    return None;
                }
                self.deadline = None;
                match self.state {
                    WorkerState::Spawning | WorkerState::Starting => {
                        Some(WorkerOutput::Expired(WorkerTimeout::Start))
                    }
                    WorkerState::Retiring => Some(WorkerOutput::Expired(WorkerTimeout::Dispose)),
                    _ => None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WorkerInput::*;

    fn ms(t: u64) -> Instant {
        Instant(t)
    }

    #[test]
    fn lifecycle_and_deadlines() {
        let mut w = Worker::spawning(WorkerId(1), ms(100), Duration::from_millis(50));
        assert_eq!(w.state(), WorkerState::Spawning);
        assert_eq!(w.step(ms(99), Tick), None);
        w.step(ms(99), Spawned);
        assert_eq!(w.state(), WorkerState::Starting);
        assert_eq!(w.step(ms(99), Ready), Some(WorkerOutput::Started));
        assert_eq!(
            w.step(ms(99), Ready),
            None,
            "a second ready is out of order"
        );
        assert_eq!(w.next_deadline(), None);
        w.step(ms(150), Busy(true));
        assert_eq!(w.state(), WorkerState::Busy);
        w.step(ms(150), Busy(false));
        assert_eq!(w.step(ms(200), Retire), Some(WorkerOutput::SendDispose));
        assert_eq!(w.step(ms(210), Retire), None, "retiring is idempotent");
        assert_eq!(w.next_deadline(), Some(ms(250)), "from the first retire");
        w.step(ms(210), Busy(true));
        assert_eq!(
            w.state(),
            WorkerState::Retiring,
            "busy does not leave retiring"
        );
        assert_eq!(
            w.step(ms(250), Tick),
            Some(WorkerOutput::Expired(WorkerTimeout::Dispose))
        );
        assert_eq!(w.step(ms(300), Tick), None, "a deadline fires once");
        w.step(ms(300), Exited);
        assert_eq!(w.state(), WorkerState::Exited);
    }

    #[test]
    fn start_deadline_expires_before_ready() {
        let mut w = Worker::spawning(WorkerId(2), ms(10), Duration::from_millis(50));
        assert_eq!(
            w.step(ms(10), Tick),
            Some(WorkerOutput::Expired(WorkerTimeout::Start))
        );
        w.step(ms(10), Exited);
        assert_eq!(w.step(ms(11), Ready), None);
    }

    #[test]
    fn an_adopted_worker_is_ready_and_retires_on_its_timeout() {
        let mut w = Worker::adopted(WorkerId(3), Duration::from_millis(5));
        assert!(w.is_ready());
        assert_eq!(w.step(ms(1), Retire), Some(WorkerOutput::SendDispose));
        assert_eq!(w.next_deadline(), Some(ms(6)));
    }
}
