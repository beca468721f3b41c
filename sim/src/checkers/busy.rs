//! The busy rules of pi protocol v1: nothing queues.
//!
//! Checked at two levels.
//!
//! **Runtime.** When a runtime receives an operation, its answer follows from
//! its phase just before: `prompt` is `busy` exactly when a turn runs (any
//! phase but idle); `steer` and `abort` are `busy` exactly when idle;
//! `set_model` and `set_thinking` are `busy` exactly when a turn runs.
//!
//! **Kernel.** A prompt whose turn started at a runtime is *running* until
//! the kernel consumes its completion (or its worker's exit). Prompt texts
//! name their request (`c3#r7`, or `!c3#r7` for a tool call), so a
//! snapshot's transcript tells which prompts it contains. A client machine
//! picks its own request ids, so its prompt texts are unique instead, and
//! name their request through the request that sent them. Then:
//!
//! - a snapshot in a non-idle phase contains exactly one running prompt, and
//!   it is the last prompt of its transcript (one prompt per session at a time);
//! - a `busy` response to a prompt is sent only while another prompt of that
//!   session is running;
//! - a successful prompt response carries an idle snapshot that contains the prompt.

use super::{Check, Violation};
use crate::world::{Fact, result_session};
use kernel::ids::{ConnId, OpId};
use kernel::protocol::{
    Command, CommandResult, Content, ErrorCode, ServerEvent, ServerMessage, SessionPhase,
    SessionSnapshot, TranscriptItem,
};
use kernel::worker::Operation;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

/// A prompt request: its connection and request id.
pub type PromptId = (ConnId, String);

/// Running prompts and the prompt requests sent.
#[derive(Debug, Default, Clone)]
pub struct Busy {
    /// By session, server generation and operation. A worker handed over
    /// to another server keeps its turn, but the new server numbers its
    /// operations afresh and never hears how the old one's ended: such an
    /// inherited prompt runs until a snapshot of its session shows it idle.
    running: BTreeMap<(String, u64, OpId), (String, PromptId)>,
    /// Running prompts whose turn ended at the runtime (a later prompt of
    /// the session started there) and whose answer the kernel has not read.
    superseded: BTreeSet<(String, u64, OpId)>,
    /// Server generations seen (hand-offs, restarts).
    generation: u64,
    prompts: BTreeMap<PromptId, String>,
    /// Prompt texts that do not name their request, by the request that sent them.
    by_text: BTreeMap<String, PromptId>,
    /// Operations checked at runtimes.
    pub operations: u64,
    /// v8 prompts, steers and follow-ups not answered yet, with the
    /// session their route names and the member called.
    v8_prompts: BTreeMap<PromptId, (String, String)>,
    /// Operations the kernel sent and has not heard the end of, by
    /// session, server generation and operation: the kernel answers a v8
    /// prompt `busy` while any is in flight (a setting change too, which
    /// `tests/v8_regressions.rs` bug 5 reports).
    in_flight: BTreeSet<(String, u64, OpId)>,
    /// Compactions asked for (`compact`) whose turn started at a runtime,
    /// as `running` holds prompts: a turn of their own, with no prompt.
    compacting: BTreeSet<(String, u64, OpId)>,
}

fn violation(message: String) -> Check {
    Err(Violation::new("busy", message))
}

/// The text a driver puts in a prompt, naming its request.
pub fn prompt_text(conn: ConnId, request_id: &str, tool: bool) -> String {
    format!("{}{conn}#{request_id}", if tool { "!" } else { "" })
}

/// [`prompt_text`] of a tool prompt, asking for MCP tool `t` of server
/// `s0` or `s1` (by the request id's parity) when `mcp`, every other time.
pub fn tool_prompt_text(conn: ConnId, request_id: &str, mcp: bool) -> String {
    let n: u64 = request_id
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0);
    if mcp && n.is_multiple_of(2) {
        format!("!mcp__s{}__t {conn}#{request_id}", n / 2 % 2)
    } else {
        prompt_text(conn, request_id, true)
    }
}

/// The request a prompt text names (its first word, after an MCP tool's
/// name), if it is one.
pub fn parse_prompt(text: &str) -> Option<PromptId> {
    let text = text.strip_prefix('!').unwrap_or(text);
    let mut words = text.split(' ');
    let mut tag = words.next()?;
    if tag.starts_with(kernel::mcp::PREFIX) {
        tag = words.next()?;
    }
    let (conn, request) = tag.split_once('#')?;
    let conn = conn.strip_prefix('c')?.parse().ok()?;
    Some((ConnId(conn), request.to_string()))
}

impl Busy {
    /// The request a prompt text names, or that sent it.
    fn identify(&self, text: &str) -> Option<PromptId> {
        parse_prompt(text).or_else(|| self.by_text.get(text).cloned())
    }

    fn user_prompt(&self, item: &TranscriptItem) -> Option<PromptId> {
        let TranscriptItem::User(user) = item else {
            return None;
        };
        user.content.iter().find_map(|c| match c {
            Content::Text { text } => self.identify(text),
            _ => None,
        })
    }

    /// Applies one fact.
    pub fn observe(&mut self, fact: &Fact) -> Check {
        match fact {
            Fact::UnaskedAnswer { worker, op } => {
                return violation(format!(
                    "{worker} answered {op}, which its server never gave it (or gave \
                     before the worker lost it): the answer would complete another \
                     server's operation"
                ));
            }
            Fact::RequestSent {
                conn,
                id,
                command: Command::Prompt { session_id, text },
            } => {
                self.prompts.insert((*conn, id.clone()), session_id.clone());
                if parse_prompt(text).is_none() {
                    self.by_text.insert(text.clone(), (*conn, id.clone()));
                }
            }
            Fact::RuntimeOp {
                worker: _,
                session_id,
                op,
                operation,
                phase_before,
                immediate,
                store_failed,
            } => {
                self.operations += 1;
                let storage_error =
                    *store_failed && *immediate == Some(Err(ErrorCode::InternalError));
                let steer_in_compaction = matches!(operation, Operation::Steer { .. })
                    && self.compacting.iter().any(|(s, _, _)| s == session_id);
                if !storage_error {
                    if steer_in_compaction {
                        // A compaction's turn takes no steer.
                        if *immediate != Some(Err(ErrorCode::Busy)) {
                            return violation(format!(
                                "{session_id}: a steer during a compaction answered {immediate:?}"
                            ));
                        }
                    } else {
                        check_runtime(operation, *phase_before, *immediate, session_id)?;
                    }
                }
                let started = *phase_before == SessionPhase::Idle && immediate.is_none();
                if !started {
                    return Ok(());
                }
                // A turn started (a prompt's, or a compaction's): the runtime
                // was idle, so every earlier turn of the session ended there.
                // A prompt runs on for the kernel until the kernel reads its
                // answer, or that answer dies with its server's channel.
                let key = (session_id.clone(), self.generation, *op);
                let ended: Vec<_> = (self.running.keys())
                    .filter(|k| k.0 == *session_id && **k != key)
                    .cloned()
                    .collect();
                self.superseded.extend(ended);
                self.compacting.retain(|(s, _, _)| s != session_id);
                match operation {
                    Operation::Compact { .. } => {
                        self.compacting.insert(key);
                    }
                    Operation::Prompt { text, .. } => {
                        // A v8 steer or follow-up of an idle session starts a
                        // prompt whose text names no request: known by its text.
                        let prompt = self.identify(text).unwrap_or_else(|| {
                            let prompt = (ConnId(0), text.clone());
                            self.by_text.insert(text.clone(), prompt.clone());
                            prompt
                        });
                        self.running.insert(key, (session_id.clone(), prompt));
                    }
                    _ => {}
                }
            }
            Fact::OpDoneConsumed {
                op,
                session_id: Some(session_id),
                ..
            } => {
                let key = (session_id.clone(), self.generation, *op);
                self.running.remove(&key);
                self.superseded.remove(&key);
                self.compacting.remove(&key);
                self.in_flight
                    .remove(&(session_id.clone(), self.generation, *op));
            }
            // One runtime per session: when its worker is gone, nothing runs there.
            Fact::WorkerExitConsumed {
                session_id: Some(session_id),
                ..
            }
            | Fact::OrphanRetired { session_id, .. } => {
                self.running.retain(|(s, _, _), _| s != session_id);
                self.in_flight.retain(|(s, _, _)| s != session_id);
                self.compacting.retain(|(s, _, _)| s != session_id);
            }
            Fact::ServerRestarted => {
                self.running.clear();
                self.compacting.clear();
                self.superseded.clear();
                self.in_flight.clear();
                self.generation += 1;
            }
            Fact::NewServer => {
                self.generation += 1;
                self.in_flight.clear();
                for key in std::mem::take(&mut self.superseded) {
                    self.running.remove(&key);
                }
            }
            // An orphan's turn that ended while no server ran answered no one.
            Fact::Adopted {
                session_id,
                phase: Some(SessionPhase::Idle),
                ..
            } => {
                self.running.retain(|(s, _, _), _| s != session_id);
                self.compacting.retain(|(s, _, _)| s != session_id);
            }
            Fact::Emitted { conn, message, .. } => {
                self.inherited_ended(message);
                self.check_emitted(*conn, message)?;
                // A prompt refused busy never started: its text, typed
                // again as a steer (a front end's retry), names no prompt.
                if let ServerMessage::Response(r) = message.as_ref()
                    && matches!(&r.outcome, Err(e) if e.code == ErrorCode::Busy)
                {
                    let prompt = (*conn, r.id.clone());
                    self.by_text.retain(|_, p| *p != prompt);
                }
            }
            Fact::OpSent { session_id, op, .. } => {
                self.in_flight
                    .insert((session_id.clone(), self.generation, *op));
            }
            Fact::V8RequestSent {
                conn,
                id,
                target,
                call,
            } if call.service_id == crate::world::v8::AGENT
                && matches!(call.member.as_str(), "prompt" | "steer" | "followUp") =>
            {
                if let Some(route) = crate::world::v8::route_of(target) {
                    self.v8_prompts
                        .insert((*conn, id.clone()), (route.session_id, call.member.clone()));
                }
            }
            Fact::V8Emitted { conn, message, .. } => {
                if let crate::world::v8::V8Message::Response {
                    id,
                    outcome: Ok(Some(result)),
                } = message.as_ref()
                    && let Some((session_id, member)) = self.v8_prompts.remove(&(*conn, id.clone()))
                {
                    return self.check_v8_prompt(*conn, id, &session_id, &member, result);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A v8 prompt refused `busy` (in band) while no other prompt of its
    /// session runs and no operation of it is in flight breaks the busy
    /// rule as a v1 `busy` does.
    fn check_v8_prompt(
        &mut self,
        conn: ConnId,
        id: &str,
        session_id: &str,
        member: &str,
        result: &kernel::wire::Value,
    ) -> Check {
        use kernel::wire::Value;
        let code = result.get("error").and_then(|e| e.get("code"));
        if member != "prompt" || code != Some(&Value::text("busy")) {
            return Ok(());
        }
        let other = self.running.values().any(|(s, _)| s == session_id)
            || self.in_flight.iter().any(|(s, _, _)| s == session_id)
            || self.compacting.iter().any(|(s, _, _)| s == session_id);
        if !other {
            return violation(format!(
                "{conn}: v8 prompt {id} refused busy while no prompt of {session_id} runs"
            ));
        }
        Ok(())
    }

    /// An idle snapshot ends the prompts its session inherited from an
    /// earlier server.
    fn inherited_ended(&mut self, message: &ServerMessage) {
        let snapshot = match message {
            ServerMessage::Response(r) => r.outcome.as_ref().ok().and_then(result_session),
            ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => Some(snapshot),
            _ => None,
        };
        if let Some(snapshot) = snapshot.filter(|s| s.phase == SessionPhase::Idle) {
            let now = self.generation;
            self.running
                .retain(|(s, g, _), _| *s != snapshot.id || *g == now);
            self.compacting
                .retain(|(s, g, _)| *s != snapshot.id || *g == now);
        }
    }

    fn check_emitted(&self, conn: ConnId, message: &ServerMessage) -> Check {
        match message {
            ServerMessage::Response(r) => {
                let prompt = (conn, r.id.clone());
                if let Some(session_id) = self.prompts.get(&prompt) {
                    self.check_prompt_response(&prompt, session_id, &r.outcome)?;
                }
                match r.outcome.as_ref().ok().and_then(result_session) {
                    Some(snapshot) => self.check_snapshot(snapshot),
                    None => Ok(()),
                }
            }
            ServerMessage::Event(ServerEvent::SessionSnapshot { snapshot }) => {
                self.check_snapshot(snapshot)
            }
            _ => Ok(()),
        }
    }

    fn check_prompt_response(
        &self,
        prompt: &PromptId,
        session_id: &str,
        outcome: &Result<CommandResult, kernel::protocol::ProtocolError>,
    ) -> Check {
        let (conn, id) = prompt;
        match outcome {
            Err(e) if e.code == ErrorCode::Busy => {
                let other = self
                    .running
                    .values()
                    .any(|(s, p)| s == session_id && p != prompt)
                    || self.compacting.iter().any(|(s, _, _)| s == session_id);
                if !other {
                    return violation(format!(
                        "{conn}: prompt {id} answered busy while no other prompt of {session_id} runs"
                    ));
                }
            }
            Ok(CommandResult::Prompt { session }) => {
                let contains = session
                    .transcript
                    .iter()
                    .any(|i| self.user_prompt(i).as_ref() == Some(prompt));
                if session.phase != SessionPhase::Idle || !contains {
                    return violation(format!(
                        "{conn}: prompt {id} succeeded with phase {} (contains it: {contains})",
                        session.phase.as_str()
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A snapshot in a non-idle phase contains exactly one running prompt,
    /// its last, or is a compaction's turn with none.
    fn check_snapshot(&self, snapshot: &SessionSnapshot) -> Check {
        if snapshot.phase == SessionPhase::Idle {
            return Ok(());
        }
        let compaction = self.compacting.iter().any(|(s, _, _)| *s == snapshot.id);
        if compaction
            && matches!(
                snapshot.phase,
                SessionPhase::Compaction | SessionPhase::Retry
            )
        {
            return Ok(());
        }
        let prompts: Vec<PromptId> = snapshot
            .transcript
            .iter()
            .filter_map(|i| self.user_prompt(i))
            .collect();
        let running: Vec<&PromptId> = self
            .running
            .values()
            .filter(|(s, p)| *s == snapshot.id && prompts.contains(p))
            .map(|(_, p)| p)
            .collect();
        let last = prompts.last();
        if running.len() != 1 || last != Some(running[0]) {
            return violation(format!(
                "{} rev {} in phase {}: running prompts {running:?}, last prompt {last:?}",
                snapshot.id,
                snapshot.revision,
                snapshot.phase.as_str()
            ));
        }
        Ok(())
    }

    /// Folds the running prompts into a fingerprint.
    pub fn fingerprint(&self, hasher: &mut impl Hasher) {
        self.running.hash(hasher);
        self.superseded.hash(hasher);
        self.compacting.hash(hasher);
    }
}

/// The runtime's answer follows from its phase before the operation.
fn check_runtime(
    operation: &Operation,
    phase: SessionPhase,
    immediate: Option<Result<(), ErrorCode>>,
    session_id: &str,
) -> Check {
    let running = phase != SessionPhase::Idle;
    let busy = immediate == Some(Err(ErrorCode::Busy));
    let (expect_busy, name) = match operation {
        Operation::Prompt { .. } => (running, "prompt"),
        Operation::Steer { .. } => (!running, "steer"),
        Operation::Abort => (!running, "abort"),
        Operation::SetModel { .. } => (running, "set_model"),
        Operation::SetThinking { .. } => (running, "set_thinking"),
        // A name is no setting of a turn: never busy.
        Operation::Rename { .. } => (false, "rename"),
        // Neither are the editor's MCP servers.
        Operation::SetMcpServers { .. } => (false, "set_mcp_servers"),
        // A compaction asked for is a turn of its own: between turns only.
        Operation::Compact { .. } => (running, "compact"),
        // An answer names its question, which only a turn has; the
        // policy is no setting of a turn.
        Operation::Answer { .. } => (false, "answer"),
        Operation::SetApprovals { .. } => (false, "set_approvals"),
    };
    if busy != expect_busy {
        return violation(format!(
            "{session_id}: runtime answered {name} in phase {} with {immediate:?}",
            phase.as_str()
        ));
    }
    // A compaction that starts is answered when its summary is stored.
    let answered_now = !matches!(
        operation,
        Operation::Prompt { .. } | Operation::Compact { .. }
    );
    if answered_now && immediate.is_none() {
        return violation(format!(
            "{session_id}: runtime did not answer {name} at once"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_texts_name_their_request() {
        let text = prompt_text(ConnId(3), "r7", true);
        assert_eq!(text, "!c3#r7");
        assert_eq!(parse_prompt(&text), Some((ConnId(3), "r7".to_string())));
        assert_eq!(parse_prompt("hello"), None);
        assert_eq!(
            parse_prompt("c1#r2 and more words"),
            Some((ConnId(1), "r2".to_string()))
        );
    }
}
