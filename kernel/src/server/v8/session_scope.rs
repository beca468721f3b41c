//! pi's session-scope services on v8: the agent controller, the models,
//! the session plugins and the transcript, for the attached session.

use super::*;
use crate::protocol::InputKind;

impl Server {
    pub(in crate::server) fn on_session_call(
        &mut self,
        conn: ConnId,
        id: String,
        route: Route,
        call: ServiceCall,
    ) {
        let svc = match self.resolve_call(&SESSION_SERVICES, &call) {
            Ok(None) => return self.on_control(conn, id, &SESSION_SERVICES, Some(&route), &call),
            Ok(Some(svc)) => svc,
            Err(error) => return self.v8_reply(conn, &id, Err(error)),
        };
        let session_id = route.session_id;
        let Some(live) = self.sessions.get(&session_id) else {
            return self.v8_reply(conn, &id, Err(CallError::internal()));
        };
        // Busy as the agent is: a turn runs, or a prompt is on its way to
        // it. A setting on its way is not a turn (the worker runs them in
        // order), as for a v1 prompt.
        let busy =
            live.runtime_phase() != crate::protocol::SessionPhase::Idle || live.prompt_on_its_way();
        let snapshot = live.snapshot.as_deref().cloned();
        let args = call.args.as_slice();
        match (svc, call.member.as_str()) {
            (Svc::Agent, "prompt" | "followUp" | "steer") => {
                self.on_v8_prompt(conn, id, &session_id, &call, busy)
            }
            (Svc::Agent, "abort") => match busy {
                true => {
                    self.start_op(conn, &id, &session_id, "v8.void", Operation::Abort);
                }
                false => self.v8_reply(conn, &id, Ok(None)),
            },
            (Svc::Agent, "cancelQueued") => {
                let outcome = Value::object(vec![("outcome", Value::text("not_found"))]);
                self.v8_reply(conn, &id, Ok(Some(outcome)))
            }
            (Svc::Agent, "compact") => match busy {
                // Answered when the summary is stored (or refused then).
                false => {
                    // `[{customInstructions: string | null}]`.
                    let instructions = args
                        .first()
                        .and_then(|a| a.get("customInstructions"))
                        .and_then(|i| match i {
                            Value::Text(text) => Some(text.clone()),
                            _ => None,
                        });
                    let compact = Operation::Compact { instructions };
                    self.start_op(conn, &id, &session_id, "v8.compact", compact);
                }
                true => {
                    let message = "The session is running a turn; compact it when the turn ends";
                    let result = accepted("operationId", None, Some(("busy", message)));
                    self.v8_reply(conn, &id, Ok(Some(result)))
                }
            },
            (Svc::Agent, "waitForPrompt") => self.on_wait_for_prompt(conn, id, &session_id, args),
            (Svc::SessionPlugins, "reload") | (Svc::Models, "refresh") => {
                self.v8_reply(conn, &id, Ok(None))
            }
            (Svc::Models, "getThinkingLevels") => {
                let levels = self.thinking_levels(snapshot.as_ref().map(|s| &s.model));
                let levels = levels.iter().map(|l| Value::text(l.as_str())).collect();
                self.v8_reply(conn, &id, Ok(Some(Value::Array(levels))))
            }
            (Svc::Models, "select") => {
                let model =
                    args.first()
                        .and_then(|a| match (a.get("provider"), a.get("modelId")) {
                            (Some(Value::Text(p)), Some(Value::Text(m))) => Some(ModelRef {
                                provider: p.clone(),
                                id: m.clone(),
                            }),
                            _ => None,
                        });
                match model {
                    Some(model) => {
                        self.start_op(
                            conn,
                            &id,
                            &session_id,
                            "v8.void",
                            Operation::SetModel { model },
                        );
                    }
                    None => {
                        self.v8_reply(conn, &id, Err(invalid_args(&call, "{provider, modelId}")))
                    }
                }
            }
            (Svc::Models, "selectThinking" | "cycleThinking") => {
                self.on_select_thinking(conn, id, &session_id, &call, snapshot.as_ref())
            }
            (Svc::Approvals, member) => match approval_operation(member, args) {
                Ok(operation) => {
                    self.start_op(conn, &id, &session_id, "v8.void", operation);
                }
                Err(expected) => self.v8_reply(conn, &id, Err(invalid_args(&call, expected))),
            },
            _ => unreachable!("resolve_call admits only these members"),
        }
    }

    /// `prompt`, `followUp` and `steer`: a prompt starts a turn when the
    /// agent is idle and is refused in band when busy; a steer goes to the
    /// running turn; a follow-up is not queued.
    fn on_v8_prompt(
        &mut self,
        conn: ConnId,
        id: String,
        session_id: &str,
        call: &ServiceCall,
        busy: bool,
    ) {
        let max = self.config.limits.max_prompt_images;
        let (text, images) = match prompt_input(&call.args, max) {
            Ok(input) => input,
            Err(what) => {
                let error = CallError::invalid_value(&call.service_id, &call.member, &what);
                return self.v8_reply(conn, &id, Err(error));
            }
        };
        let key = if call.member == "prompt" {
            "operationId"
        } else {
            "entryId"
        };
        if !images.is_empty() {
            // Only a prompt starts a turn with images, and only with a
            // model that takes them.
            let model = self.sessions[session_id]
                .snapshot
                .as_deref()
                .map(|s| s.model.clone());
            let takes = |m: &ModelRef| {
                self.config.models.iter().any(|meta| {
                    meta.provider == m.provider
                        && meta.id == m.id
                        && meta.input.contains(&InputKind::Image)
                })
            };
            let refusal = match &model {
                _ if call.member != "prompt" => Some(format!(
                    "images go with a prompt, not a {}: send them when the turn ends",
                    call.member
                )),
                Some(m) if !takes(m) => Some(format!(
                    "{}/{} does not take images; select a model that does",
                    m.provider, m.id
                )),
                _ => None,
            };
            if let Some(message) = refusal {
                let result = accepted(key, None, Some(("operation_failed", &message)));
                return self.v8_reply(conn, &id, Ok(Some(result)));
            }
        }
        if !busy {
            let op = self.start_op(
                conn,
                "",
                session_id,
                "v8.prompt",
                Operation::Prompt { text, images },
            );
            let view = self.session_view(session_id);
            view.prompts.insert(op.0, None);
            return self.v8_reply(conn, &id, Ok(Some(accepted(key, Some(op.0), None))));
        }
        if call.member == "steer" {
            self.start_op(conn, &id, session_id, "v8.steer", Operation::Steer { text });
            return;
        }
        let message = match call.member.as_str() {
            "prompt" => "The session is running a turn; steer it, or wait",
            _ => "Follow-ups are not queued by this server; send it when the turn ends",
        };
        let result = accepted(key, None, Some(("busy", message)));
        self.v8_reply(conn, &id, Ok(Some(result)))
    }

    /// `waitForPrompt`: at once for a prompt that ended, else when it does.
    fn on_wait_for_prompt(&mut self, conn: ConnId, id: String, session_id: &str, args: &[Value]) {
        let op = match args {
            [Value::Text(op)] => op.parse::<u64>().ok(),
            _ => None,
        };
        let view = self.session_view(session_id);
        match op.and_then(|op| view.prompts.get(&op).map(|end| (op, end.clone()))) {
            Some((_, Some(end))) => self.v8_reply(conn, &id, Ok(Some(prompt_result(&end)))),
            Some((op, None)) => view.waits.push(PromptWait {
                conn,
                request_id: id,
                op,
            }),
            None => self.v8_reply(conn, &id, Err(CallError::internal())),
        }
    }

    /// `selectThinking` (a level the model offers) and `cycleThinking`
    /// (the next one), between turns.
    fn on_select_thinking(
        &mut self,
        conn: ConnId,
        id: String,
        session_id: &str,
        call: &ServiceCall,
        snapshot: Option<&SessionSnapshot>,
    ) {
        let args = call.args.as_slice();
        let levels = self.thinking_levels(snapshot.map(|s| &s.model));
        let level = if call.member == "selectThinking" {
            match args {
                [Value::Text(l)] => ThinkingLevel::parse(l).filter(|l| levels.contains(l)),
                _ => None,
            }
        } else {
            let current = snapshot.map_or(ThinkingLevel::Off, |s| s.thinking_level);
            let at = levels.iter().position(|l| *l == current);
            let next = at.map_or(0, |i| (i + 1) % levels.len());
            levels.get(next).copied()
        };
        match level {
            Some(level) => {
                self.start_op(
                    conn,
                    &id,
                    session_id,
                    "v8.void",
                    Operation::SetThinking { level },
                );
            }
            None => self.v8_reply(conn, &id, Err(CallError::internal())),
        }
    }

    /// The thinking levels a model offers (`off` alone for one we do not know).
    pub(in crate::server) fn thinking_levels(
        &self,
        model: Option<&ModelRef>,
    ) -> Vec<ThinkingLevel> {
        let levels = model.and_then(|model| {
            self.config
                .models
                .iter()
                .find(|m| m.provider == model.provider && m.id == model.id)
                .map(|m| m.supported_thinking_levels.clone())
        });
        match levels {
            Some(levels) if !levels.is_empty() => levels,
            _ => vec![ThinkingLevel::Off],
        }
    }

    pub(in crate::server) fn session_view(&mut self, session_id: &str) -> &mut SessionView {
        self.sessions
            .get_mut(session_id)
            .and_then(|l| l.v8.as_deref_mut())
            .expect("a v8 client is attached")
    }

    /// A worker operation of a v8 request ended (`name` says which kind).
    pub(in crate::server) fn v8_op_done(
        &mut self,
        session_id: &str,
        conn: ConnId,
        request_id: &str,
        name: &'static str,
        op: OpId,
        outcome: Result<(), ProtocolError>,
    ) {
        match name {
            "v8.prompt" => {
                let end = match outcome {
                    // The states were brought to the answer's snapshot first.
                    Ok(()) => self.sessions[session_id]
                        .v8
                        .as_ref()
                        .map_or(PromptEnd::Unanswered("the session went away".into()), |v| {
                            v.last_reply.clone()
                        }),
                    Err(e) => PromptEnd::Unanswered(e.message),
                };
                self.v8_prompt_ended(session_id, op.0, end);
            }
            "v8.compact" => {
                // pi's in-band errors: `nothing_to_compact`, `busy`.
                let result = match outcome {
                    Ok(()) => accepted("operationId", Some(op.0), None),
                    Err(e) if e.message.starts_with("Nothing to compact") => accepted(
                        "operationId",
                        None,
                        Some(("nothing_to_compact", &e.message)),
                    ),
                    Err(e) => accepted(
                        "operationId",
                        None,
                        Some((call_error(&e).code.as_str(), &e.message)),
                    ),
                };
                self.v8_reply(conn, request_id, Ok(Some(result)));
            }
            "v8.steer" => {
                let result = match outcome {
                    Ok(_) => accepted("entryId", Some(op.0), None),
                    Err(e) => accepted(
                        "entryId",
                        None,
                        Some((call_error(&e).code.as_str(), &e.message)),
                    ),
                };
                self.v8_reply(conn, request_id, Ok(Some(result)));
            }
            _ => {
                let result = outcome.map(|_| None).map_err(|e| call_error(&e));
                self.v8_reply(conn, request_id, result);
            }
        }
    }

    pub(super) fn v8_prompt_ended(&mut self, session_id: &str, op: u64, end: PromptEnd) {
        let Some(view) = self
            .sessions
            .get_mut(session_id)
            .and_then(|l| l.v8.as_deref_mut())
        else {
            return;
        };
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut view.waits)
            .into_iter()
            .partition(|w| w.op == op);
        view.waits = waiting;
        view.remember(op, end.clone());
        for wait in ready {
            self.v8_reply(wait.conn, &wait.request_id, Ok(Some(prompt_result(&end))));
        }
    }

    /// The session is going away: every `waitForPrompt` still waiting fails.
    pub(in crate::server) fn v8_session_gone(&mut self, view: Option<Box<SessionView>>) {
        for wait in view.map(|v| v.waits).unwrap_or_default() {
            self.v8_reply(wait.conn, &wait.request_id, Err(CallError::internal()));
        }
    }
}

/// `answer([{id, decision}])` or `setPolicy([{policy}])` of
/// `pi-server.approvals` as a worker operation, or the arguments expected.
fn approval_operation(member: &str, args: &[Value]) -> Result<Operation, &'static str> {
    use crate::approval::{ApprovalPolicy, Decision};
    let text = |a: &Value, key: &str| match a.get(key) {
        Some(Value::Text(t)) => Some(t.clone()),
        _ => None,
    };
    if member == "answer" {
        let answer = match args {
            [a] => text(a, "id").zip(text(a, "decision").and_then(|d| Decision::parse(&d))),
            _ => None,
        };
        return answer
            .map(|(id, decision)| Operation::Answer { id, decision })
            .ok_or("{id, decision: \"allow\" | \"always\" | \"deny\"}");
    }
    let policy = match args {
        [a] if matches!(a.get("policy"), None | Some(Value::Null)) => Some(None),
        [a] => text(a, "policy")
            .and_then(|p| ApprovalPolicy::parse(&p))
            .map(Some),
        _ => None,
    };
    policy
        .map(|policy| Operation::SetApprovals { policy })
        .ok_or("{policy: \"auto\" | \"ask\" | \"read-only\" | null}")
}
