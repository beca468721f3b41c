//! Response codes against the protocol's rules, judged from what clients
//! saw (so a breach that keeps every other view self-consistent is caught).
//!
//! - **Attachment.** A session command (`prompt`, `steer`, `abort`,
//!   `set_model`, `set_thinking`) from a connection that was not attached
//!   to the session, with no attach, detach, create or remove of it in
//!   flight from the moment it was sent to its answer, is answered
//!   `invalid_request`. One from a connection that was attached, judged
//!   the same way, is never answered that it is not attached: an
//!   attachment ends only by a detach, a `session_removed`, or the close
//!   of the connection (a failed removal gives it back untold).
//!
//! - **Disposal.** Outside a shutdown, the kernel tells a worker to dispose
//!   its session only when its runtime is open and idle and no operation is
//!   on its way to it: a session is never disposed under a running turn or
//!   an operation in flight (judged from the worker's side, not the kernel's).
//!
//! - **Handshake deadline.** A connection the server accepted gets its
//!   `hello`, or a `hello_error` or close, within `handshake_timeout` of its
//!   accept, whatever became of the client's hello on the way.
//!
//! - **Dispose deadline.** A worker told to dispose is gone (it exited, or
//!   the server killed it) within `worker_dispose_timeout` of the dispose,
//!   even when it hangs instead of exiting.
//!
//! - **Kill and retirement not early.** The server kills a worker told to
//!   dispose only once its dispose deadline passed; an orphan retires only
//!   once `orphan_grace` passed since it lost its server, and only idle
//!   (never under a running turn).
//!
//! - **Adoption grace.** A session adopted from an orphan is not disposed
//!   for idleness within `adoption_grace` of its adoption (its clients have
//!   that long to come back); a remove or a shutdown may end it sooner.
//!
//! - **Runtime error.** When the worker of a ready session dies, every
//!   connection attached to the session is closed in that step (a runtime
//!   error closes them; detaching them would leave clients waiting for a
//!   session that is gone).
//!
//! - **Not found.** An attach of a session that is stored, that no client
//!   asked to remove, and that the kernel can know of (not a session a
//!   sibling or an unfinished create wrote since the last scan) is not
//!   answered `not_found`, but by a server shutting down.
//!
//! - **Adoption wait.** No worker is spawned for a session an unadopted
//!   orphan holds within `adoption_wait` of the server learning which
//!   sessions orphans hold (it waits for the orphan's announcement).
//!
//! - **Token.** A clean stream whose first frame is a hello without the
//!   token the server is configured with (none, or a wrong one) never gets
//!   `hello`; one with the right token (or to a server without one) never
//!   gets `hello_error auth`.
//!
//! Not judged here: a `remove` accepted while a prompt runs. Its answer
//! comes after the disposal has ended the prompt, so what clients see does
//! not tell it from a remove taken just after the turn ended.

use super::{Check, Violation};
use crate::world::{Fact, result_session};
use kernel::ids::ConnId;
use kernel::protocol::{
    Command, CommandResult, ErrorCode, ServerEvent, ServerMessage, SessionPhase,
};
use std::collections::{BTreeMap, BTreeSet};

/// A request waiting for its answer.
#[derive(Debug, Clone)]
struct Sent {
    command: Command,
    /// For a session command: the attachment generation when it was sent,
    /// if the connection was then surely not attached.
    unattached_at: Option<u64>,
    /// The same, if it was then surely attached.
    attached_at: Option<u64>,
}

/// See the module documentation.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    /// (connection, session) pairs attached, as the responses said.
    attached: BTreeSet<(ConnId, String)>,
    /// Changes of (connection, session) attachment sent or answered so far;
    /// a session command is judged only if none happened meanwhile.
    generation: BTreeMap<(ConnId, String), u64>,
    /// Attach, detach, create and remove requests in flight per pair.
    changing: BTreeMap<(ConnId, String), usize>,
    pending: BTreeMap<(ConnId, String), Sent>,
    /// Connections whose first frame was a hello: whether its token was right.
    token_right: BTreeMap<ConnId, bool>,
    /// Accepted connections with no hello, hello_error or close yet, by accept time.
    handshaking: BTreeMap<ConnId, kernel::time::Instant>,
    /// Adopted sessions, by adoption time (until a new server starts).
    adopted: BTreeMap<String, kernel::time::Instant>,
    /// Sessions some client asked to remove.
    removes: BTreeSet<String>,
    /// Workers told to dispose and not seen gone yet, by the time they were told.
    disposing: BTreeMap<kernel::ids::WorkerId, kernel::time::Instant>,
    /// Session commands judged.
    pub judged: u64,
}

/// A response, as [`Rules::answered`] judges it.
struct Answer<'a> {
    conn: ConnId,
    id: &'a str,
    outcome: &'a Result<CommandResult, kernel::protocol::ProtocolError>,
    /// The server was shutting down when it answered.
    shutting_down: bool,
}

fn violation(message: String) -> Check {
    Err(Violation::new("rules", message))
}

fn is_operation(command: &Command) -> bool {
    matches!(
        command,
        Command::Prompt { .. }
            | Command::Steer { .. }
            | Command::Abort { .. }
            | Command::SetModel { .. }
            | Command::SetThinking { .. }
    )
}

/// The session an attachment-changing command is about, if it is one.
fn changes(command: &Command) -> Option<&str> {
    match command {
        Command::Attach { session_id }
        | Command::Detach { session_id }
        | Command::Remove { session_id } => Some(session_id),
        _ => None,
    }
}

impl Rules {
    /// Every accepted connection older than the handshake deadline has had
    /// its answer. Call after each step, with the world's time.
    pub fn check_handshakes(&self, world: &crate::world::World) -> Check {
        if world.is_server_down() {
            return Ok(());
        }
        let bound = world.server.config().limits.handshake_timeout;
        let now = world.now;
        for (conn, at) in &self.handshaking {
            if now.as_millis() > at.as_millis() + bound.as_millis() as u64 {
                return violation(format!(
                    "{conn}: accepted at {at} and no hello, hello_error or close by {now} \
                     (handshake timeout {} ms)",
                    bound.as_millis()
                ));
            }
        }
        Ok(())
    }

    /// Every worker told to dispose longer ago than the dispose deadline
    /// is gone. Call after each step, with the world's time.
    pub fn check_disposals(&mut self, world: &crate::world::World) -> Check {
        self.disposing
            .retain(|worker, _| world.worker_runs(*worker));
        let bound = world.server.config().limits.worker_dispose_timeout;
        let now = world.now;
        for (worker, at) in &self.disposing {
            if now.as_millis() > at.as_millis() + bound.as_millis() as u64 {
                return violation(format!(
                    "{worker}: told to dispose at {at} and still running at {now} \
                     (dispose timeout {} ms)",
                    bound.as_millis()
                ));
            }
        }
        Ok(())
    }

    fn bump(&mut self, key: (ConnId, String)) {
        *self.generation.entry(key).or_default() += 1;
    }

    /// `session_id` is removed: every attachment to it ends.
    fn removed(&mut self, session_id: &str) {
        let gone: Vec<(ConnId, String)> = self
            .attached
            .iter()
            .filter(|(_, s)| s == session_id)
            .cloned()
            .collect();
        for key in gone {
            self.attached.remove(&key);
            self.bump(key);
        }
    }

    /// Applies one fact.
    pub fn observe(&mut self, world: &crate::world::World, fact: &Fact) -> Check {
        match fact {
            Fact::RequestSent { conn, id, command } => {
                if let Command::Remove { session_id } = command {
                    self.removes.insert(session_id.clone());
                }
                let (mut unattached_at, mut attached_at) = (None, None);
                if let Some(session_id) = changes(command) {
                    let key = (*conn, session_id.to_owned());
                    *self.changing.entry(key.clone()).or_default() += 1;
                    self.bump(key);
                } else if is_operation(command)
                    && let Some(session_id) = command.session_id()
                {
                    let key = (*conn, session_id.to_owned());
                    let quiet = self.changing.get(&key).is_none_or(|n| *n == 0);
                    let generation = Some(self.generation.get(&key).copied().unwrap_or(0));
                    match (quiet, self.attached.contains(&key)) {
                        (true, false) => unattached_at = generation,
                        (true, true) => attached_at = generation,
                        (false, _) => {}
                    }
                }
                let sent = Sent {
                    command: command.clone(),
                    unattached_at,
                    attached_at,
                };
                self.pending.insert((*conn, id.clone()), sent);
                Ok(())
            }
            Fact::DisposeSent {
                session_id,
                phase,
                queued,
                shutting_down: false,
                ..
            } if *phase != Some(SessionPhase::Idle) || *queued > 0 => violation(format!(
                "{session_id}: disposed with its runtime {phase:?} and {queued} operations on their way"
            )),
            Fact::DisposeSent {
                worker,
                at,
                session_id,
                shutting_down,
                ..
            } => {
                self.disposing.entry(*worker).or_insert(*at);
                let grace = world.server.config().limits.adoption_grace;
                match self.adopted.get(session_id) {
                    Some(adopted)
                        if !shutting_down
                            && !self.removes.contains(session_id)
                            && at.as_millis() < adopted.as_millis() + grace.as_millis() as u64 =>
                    {
                        violation(format!(
                            "{session_id}: adopted at {adopted} and disposed at {at}, \
                             within its adoption grace ({} ms)",
                            grace.as_millis()
                        ))
                    }
                    _ => Ok(()),
                }
            }
            Fact::Killed { worker } => match self.disposing.get(worker) {
                Some(at)
                    if world.now.as_millis()
                        < at.as_millis()
                            + world
                                .server
                                .config()
                                .limits
                                .worker_dispose_timeout
                                .as_millis() as u64 =>
                {
                    violation(format!(
                        "{worker}: told to dispose at {at} and killed at {}, before its deadline",
                        world.now
                    ))
                }
                _ => Ok(()),
            },
            Fact::OrphanRetired {
                interrupted: true,
                at,
                ..
            } => violation(format!(
                "an orphan retired at {at} under a running turn (it marked an item interrupted)"
            )),
            Fact::OrphanRetired {
                orphaned_at, at, ..
            } => {
                let grace = world.worker_limits().orphan_grace;
                if at.as_millis() < orphaned_at.as_millis() + grace.as_millis() as u64 {
                    return violation(format!(
                        "an orphan since {orphaned_at} retired at {at}, within its grace ({} ms)",
                        grace.as_millis()
                    ));
                }
                Ok(())
            }
            Fact::WorkerLost {
                worker,
                session_id,
                attached,
                open_after,
            } if !open_after.is_empty() => violation(format!(
                "{worker} of {session_id} died; of the {attached} connections attached to it, \
                 {open_after:?} stayed open (a runtime error closes them)"
            )),
            Fact::Spawned {
                session_id,
                orphan_holds: true,
                expected_since: Some(since),
            } if world.now.as_millis()
                < since.as_millis()
                    + world.server.config().limits.adoption_wait.as_millis() as u64 =>
            {
                violation(format!(
                    "a worker was spawned for {session_id} at {} while the orphan holding it \
                     is expected (since {since})",
                    world.now
                ))
            }
            Fact::Adopted { session_id, at, .. } => {
                self.adopted.insert(session_id.clone(), *at);
                Ok(())
            }
            Fact::Accepted { conn, at } => {
                self.handshaking.insert(*conn, *at);
                Ok(())
            }
            Fact::NewServer => {
                self.disposing.clear();
                self.adopted.clear();
                Ok(())
            }
            Fact::ServerRestarted => {
                self.handshaking.clear();
                self.disposing.clear();
                self.adopted.clear();
                self.token_right.clear();
                Ok(())
            }
            Fact::HelloSent {
                conn,
                token,
                expected,
            } => {
                let right = expected.is_none() || token == expected;
                self.token_right.insert(*conn, right);
                Ok(())
            }
            Fact::Emitted { conn, message, .. }
                if matches!(
                    message.as_ref(),
                    ServerMessage::Hello(_) | ServerMessage::HelloError(_)
                ) =>
            {
                self.handshaking.remove(conn);
                let right = self.token_right.remove(conn);
                match (message.as_ref(), right) {
                    (ServerMessage::Hello(_), Some(false)) => violation(format!(
                        "{conn}: a hello without the right token was accepted"
                    )),
                    (ServerMessage::HelloError(e), Some(true)) if e.code == ErrorCode::Auth => {
                        violation(format!(
                            "{conn}: the right token was refused: {}",
                            e.message
                        ))
                    }
                    _ => Ok(()),
                }
            }
            Fact::V8RequestSent { call, .. }
                if call.service_id == crate::world::v8::MANAGEMENT && call.member == "remove" =>
            {
                if let Some(kernel::wire::Value::Text(session_id)) = call.args.first() {
                    self.removes.insert(session_id.clone());
                }
                Ok(())
            }
            Fact::V8Emitted { conn, message, .. }
                if matches!(
                    message.as_ref(),
                    crate::world::v8::V8Message::Hello { .. }
                        | crate::world::v8::V8Message::HelloError(_)
                ) =>
            {
                // v8 carries no token: only the handshake deadline is judged.
                self.handshaking.remove(conn);
                Ok(())
            }
            Fact::Emitted {
                conn,
                message,
                shutting_down,
                ..
            } => match message.as_ref() {
                ServerMessage::Response(response) => {
                    let Some(sent) = self.pending.remove(&(*conn, response.id.clone())) else {
                        return Ok(());
                    };
                    let answer = Answer {
                        conn: *conn,
                        id: &response.id,
                        outcome: &response.outcome,
                        shutting_down: *shutting_down,
                    };
                    self.answered(world, answer, sent)
                }
                ServerMessage::Event(ServerEvent::SessionRemoved { session_id }) => {
                    self.removed(session_id);
                    Ok(())
                }
                _ => Ok(()),
            },
            Fact::ConnClosed { conn } => {
                self.handshaking.remove(conn);
                self.token_right.remove(conn);
                self.attached.retain(|(c, _)| c != conn);
                self.pending.retain(|(c, _), _| c != conn);
                self.changing.retain(|(c, _), _| c != conn);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn answered(&mut self, world: &crate::world::World, answer: Answer<'_>, sent: Sent) -> Check {
        let Answer {
            conn,
            id,
            outcome,
            shutting_down,
        } = answer;
        let command = &sent.command;
        if let Some(session_id) = changes(command) {
            let key = (conn, session_id.to_owned());
            if let Some(n) = self.changing.get_mut(&key) {
                *n = n.saturating_sub(1);
            }
            self.bump(key.clone());
            match (command, outcome) {
                (Command::Attach { .. }, Ok(_)) => {
                    self.attached.insert(key);
                }
                (Command::Attach { .. }, Err(e))
                    if e.code == ErrorCode::NotFound
                        && !shutting_down
                        && world.store.sessions.contains_key(session_id)
                        && world.kernel_can_know(session_id)
                        && !self.removes.contains(session_id) =>
                {
                    return violation(format!(
                        "{conn}#{id}: attach of {session_id}, which is stored and never removed, \
                         answered not_found: {}",
                        e.message
                    ));
                }

                (Command::Detach { .. }, Ok(_)) => {
                    self.attached.remove(&key);
                }
                (Command::Remove { .. }, Ok(_)) => self.removed(session_id),
                _ => {}
            }
            return Ok(());
        }
        if let (Command::Create(_), Ok(result)) = (command, outcome)
            && let Some(session) = result_session(result)
        {
            let key = (conn, session.id.clone());
            self.bump(key.clone());
            self.attached.insert(key);
            return Ok(());
        }
        let Some(at) = sent.unattached_at.or(sent.attached_at) else {
            return Ok(());
        };
        let session_id = command.session_id().unwrap_or_default().to_owned();
        let now = self
            .generation
            .get(&(conn, session_id.clone()))
            .copied()
            .unwrap_or(0);
        if now != at {
            return Ok(()); // the attachment changed meanwhile: not judged
        }
        self.judged += 1;
        let refused = matches!(outcome, Err(e) if e.code == ErrorCode::InvalidRequest);
        match (sent.attached_at.is_some(), outcome) {
            (false, _) if refused => Ok(()),
            (false, other) => violation(format!(
                "{conn}#{id}: {} on {session_id} from a connection not attached was answered {other:?}, not invalid_request",
                command.name()
            )),
            (true, Err(e)) if e.message.contains("not attached") => violation(format!(
                "{conn}#{id}: {} on {session_id} from a connection attached (and never told \
                 otherwise) was answered that it is not attached: {}",
                command.name(),
                e.message
            )),
            (true, _) => Ok(()),
        }
    }
}
