//! The agent loop of a [`Runtime`]: a turn's model calls, its replies as
//! they stream, its tools, retries and steers, and how it ends.

use super::*;

impl Runtime {
    /// Starts the next model call of the running turn: a compaction first when
    /// the context nears the model's window, otherwise a reply.
    pub(super) fn next_call(&mut self) {
        if self.turn.as_ref().is_some_and(|t| t.compaction) {
            // An asked-for compaction tried again after a failure.
            if !self.start_compaction(Why::Asked) {
                self.complete_turn();
            }
        } else if !self.start_compaction(Why::Threshold) {
            self.start_reply();
        }
    }

    pub(super) fn start_reply(&mut self) {
        let context = self.context();
        let item = AssistantItem {
            id: self.fresh_item_id(),
            content: Vec::new(),
            model: self.state.model.clone(),
            response_model: None,
            usage: None,
            timestamp: self.now.as_millis(),
            status: AssistantStatus::Streaming,
            error_message: None,
        };
        let item = TranscriptItem::Assistant(item);
        self.out
            .push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.state.transcript.push(item.clone());
        let call = self.fresh_call();
        self.set_stage(Stage::Streaming {
            call,
            item: self.state.transcript.len() - 1,
        });
        self.bump();
        self.progress(TranscriptProgress::ItemStarted { item });
        self.send_snapshot();
        let request = ModelRequest {
            model: self.state.model.clone(),
            thinking_level: self.state.thinking_level,
            purpose: Purpose::Reply,
            summary: self.state.summary.as_ref().map(|s| s.text.clone()),
            instructions: None,
            context,
            approvals: self.state.approvals.effective(self.policy.approvals),
        };
        self.out.push(RuntimeOutput::StartModel { call, request });
    }

    pub(super) fn on_model(&mut self, call: u64, event: ModelEvent) {
        let Some(turn) = &mut self.turn else { return };
        match &mut turn.stage {
            Stage::Streaming { call: c, item } if *c == call => {
                let item = *item;
                self.on_reply_event(item, event);
            }
            Stage::Compacting {
                call: c,
                text,
                through,
            } if *c == call => match event {
                ModelEvent::Delta {
                    kind: DeltaKind::Text,
                    text: t,
                } => text.push_str(&t),
                ModelEvent::Delta { .. }
                | ModelEvent::ToolCall { .. }
                | ModelEvent::ToolInput { .. }
                | ModelEvent::Signature { .. } => {}
                ModelEvent::Done { usage, .. } => {
                    let before = self.state.summary.as_ref().and_then(|s| s.usage.clone());
                    let usage = match (before, usage) {
                        (Some(mut total), Some(call)) => {
                            add_usage(&mut total, &call);
                            Some(total)
                        }
                        (total, call) => call.or(total),
                    };
                    let text = std::mem::take(text);
                    if !text.trim().is_empty() {
                        self.state.summary = Some(Summary {
                            text,
                            through: std::mem::take(through),
                            usage,
                        });
                    } else if let Some(summary) = &mut self.state.summary {
                        summary.usage = usage; // an empty summary was still paid for
                    }
                    turn.failures = 0;
                    match turn.compaction {
                        true => self.complete_turn(),
                        false => self.start_reply(),
                    }
                }
                ModelEvent::Failed {
                    message,
                    retryable,
                    retry_after_ms,
                } => {
                    // A failed compaction does not end a prompt's turn: retry
                    // it, or go on uncompacted. One asked for ends with why.
                    let compaction = turn.compaction;
                    if !self.schedule_retry(retryable, retry_after_ms) {
                        if compaction {
                            let op = self.end_turn(Queued::Commit);
                            let why = format!("The compaction failed: {message}");
                            self.done(op, Err(ProtocolError::new(ErrorCode::InternalError, why)));
                        } else {
                            self.start_reply();
                        }
                    }
                }
            },
            _ => {}
        }
    }

    pub(super) fn on_reply_event(&mut self, index: usize, event: ModelEvent) {
        match event {
            ModelEvent::Delta { kind, text } => self.on_delta(index, kind, text),
            ModelEvent::Signature { signature } => {
                let item = self.assistant_mut(index);
                if let Some(Content::Thinking { signature: s, .. }) = item.content.last_mut() {
                    *s = Some(signature);
                }
            }
            ModelEvent::ToolCall {
                tool_call_id,
                tool_name,
            } => {
                let item = self.assistant_mut(index);
                item.content.push(Content::ToolCall {
                    tool_call_id,
                    tool_name,
                    input: Value::Map(Vec::new()),
                });
                let item = TranscriptItem::Assistant(item.clone());
                self.progress(TranscriptProgress::ItemUpdated { item });
            }
            ModelEvent::ToolInput { input } => {
                let item = self.assistant_mut(index);
                if let Some(Content::ToolCall { input: slot, .. }) = item
                    .content
                    .iter_mut()
                    .rev()
                    .find(|c| matches!(c, Content::ToolCall { .. }))
                {
                    *slot = if input.is_json() {
                        input
                    } else {
                        Value::Map(Vec::new())
                    };
                }
            }
            ModelEvent::Done {
                stop,
                usage,
                response_model,
            } => {
                let item = self.assistant_mut(index);
                item.response_model = response_model.filter(|m| !m.is_empty());
                let calls: Vec<(String, String, JsonValue)> = item
                    .content
                    .iter()
                    .filter_map(|c| match c {
                        Content::ToolCall {
                            tool_call_id,
                            tool_name,
                            input,
                        } => Some((tool_call_id.clone(), tool_name.clone(), input.clone())),
                        _ => None,
                    })
                    .collect();
                let stop = if stop == StopReason::ToolUse && calls.is_empty() {
                    StopReason::Stop
                } else {
                    stop
                };
                self.finish_reply(index, AssistantStatus::Complete(stop), usage, None);
                if let Some(turn) = &mut self.turn {
                    turn.failures = 0;
                }
                if stop == StopReason::ToolUse {
                    self.start_tools(calls);
                } else {
                    self.after_step();
                }
            }
            ModelEvent::Failed {
                message,
                retryable,
                retry_after_ms,
            } => {
                let message = if message.trim().is_empty() {
                    "Model call failed".to_string()
                } else {
                    message
                };
                let overflow = is_context_overflow(&message);
                self.finish_reply(index, AssistantStatus::Error, None, Some(message));
                let turn = self.turn.as_mut().expect("a reply streams in a turn");
                if overflow && !turn.overflow_retried {
                    // Compact whatever can be, then ask again: once per turn.
                    turn.overflow_retried = true;
                    if self.start_compaction(Why::Overflow) {
                        return;
                    }
                }
                if !self.schedule_retry(retryable && !overflow, retry_after_ms) {
                    self.complete_turn();
                }
            }
        }
    }

    /// Enters phase `retry` when the error is transient and attempts remain.
    pub(super) fn schedule_retry(&mut self, retryable: bool, retry_after_ms: Option<u64>) -> bool {
        let turn = self.turn.as_mut().expect("a turn runs");
        turn.failures += 1;
        if !retryable || turn.failures >= self.policy.max_attempts {
            return false;
        }
        let exponent = (turn.failures - 1).min(16);
        let backoff = self
            .policy
            .backoff_base
            .saturating_mul(1 << exponent)
            .min(self.policy.backoff_max);
        let delay = retry_after_ms.map_or(backoff, |ms| {
            Duration::from_millis(ms).min(self.policy.backoff_max)
        });
        let at = self.now + delay;
        self.set_stage(Stage::Retrying { at });
        self.bump();
        self.send_snapshot();
        true
    }

    pub(super) fn on_delta(&mut self, index: usize, kind: DeltaKind, text: String) {
        let item = self.assistant_mut(index);
        let content_index = match kind {
            DeltaKind::ToolCall => {
                match item
                    .content
                    .iter()
                    .rposition(|c| matches!(c, Content::ToolCall { .. }))
                {
                    Some(i) => i,
                    None => return, // arguments before any tool call: nothing to attach them to
                }
            }
            DeltaKind::Text | DeltaKind::Thinking => {
                // A signed thinking part is whole: more thinking starts another.
                let extends_last = matches!(
                    (item.content.last(), kind),
                    (Some(Content::Text { .. }), DeltaKind::Text)
                        | (
                            Some(Content::Thinking {
                                signature: None,
                                ..
                            }),
                            DeltaKind::Thinking
                        )
                );
                if !extends_last {
                    item.content.push(match kind {
                        DeltaKind::Thinking => Content::Thinking {
                            thinking: String::new(),
                            redacted: None,
                            signature: None,
                        },
                        _ => Content::Text {
                            text: String::new(),
                        },
                    });
                }
                match item.content.last_mut().expect("pushed") {
                    Content::Text { text: t } => t.push_str(&text),
                    Content::Thinking { thinking, .. } => thinking.push_str(&text),
                    _ => unreachable!("text and thinking parts only"),
                }
                item.content.len() - 1
            }
        };
        let message_id = item.id.clone();
        let bytes = text.len();
        self.progress(TranscriptProgress::AssistantDelta {
            message_id,
            content_index: content_index as u64,
            kind,
            delta: text,
        });
        let (since, unsaved) = self.unsaved.unwrap_or((self.now, 0));
        self.unsaved = Some((since, unsaved + bytes));
        if unsaved + bytes >= self.policy.checkpoint.bytes {
            self.checkpoint();
        }
    }

    /// Ends the streaming reply with `status`, commits it, then announces it.
    pub(super) fn finish_reply(
        &mut self,
        index: usize,
        status: AssistantStatus,
        usage: Option<Usage>,
        error: Option<String>,
    ) {
        let item = self.assistant_mut(index);
        item.status = status;
        item.usage = usage.or(item.usage.take());
        item.error_message = error;
        let item = TranscriptItem::Assistant(item.clone());
        self.unsaved = None;
        self.out
            .push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.progress(TranscriptProgress::ItemFinished { item });
    }

    /// Creates a running tool item per call and runs the first.
    pub(super) fn start_tools(&mut self, calls: Vec<(String, String, JsonValue)>) {
        let mut ids = VecDeque::new();
        for (tool_call_id, tool_name, input) in calls {
            let item = ToolItem {
                id: self.fresh_item_id(),
                tool_call_id,
                tool_name,
                input,
                content: Vec::new(),
                details: None,
                usage: None,
                timestamp: self.now.as_millis(),
                status: ToolStatus::Running,
            };
            ids.push_back(item.id.clone());
            let item = TranscriptItem::Tool(item);
            self.commit(item.clone());
            self.progress(TranscriptProgress::ItemStarted { item });
        }
        let running = ids.pop_front().expect("at least one tool call");
        self.set_stage(Stage::Tools {
            running: running.clone(),
            waiting: ids,
            asking: false,
        });
        self.bump();
        self.send_snapshot();
        self.run_tool(&running);
    }

    /// The running tool item `id`.
    fn tool_item(&self, id: &str) -> &ToolItem {
        // A running tool item is among the newest: look from the end.
        match self.state.transcript.iter().rev().find(|i| i.id() == id) {
            Some(TranscriptItem::Tool(item)) => item,
            _ => unreachable!("a running tool item exists"),
        }
    }

    /// Starts tool call `id` as the session's approvals say: it runs, it
    /// waits for an answer (its question stored before it is shown), or it
    /// is refused and the next call starts.
    pub(super) fn run_tool(&mut self, id: &str) {
        let item = self.tool_item(id);
        match self
            .state
            .approvals
            .gate(self.policy.approvals, &item.tool_name)
        {
            Gate::Run => self.start_tool(id),
            Gate::Ask => {
                let question = Question {
                    id: item.id.clone(),
                    call_id: item.tool_call_id.clone(),
                    tool: item.tool_name.clone(),
                    input: item.input.clone(),
                    asked_at: self.now.as_millis(),
                };
                self.state.approvals.pending.push(question);
                self.set_asking(true);
                self.bump();
                self.send_approvals();
            }
            Gate::Refuse => {
                let text = crate::approval::refused_read_only(&item.tool_name);
                self.tool_ended(id, vec![Content::Text { text }], None, ToolStatus::Error);
            }
        }
    }

    /// The answer to the question about tool item `id`: the first answer
    /// wins; a later one (or one about no question) is refused.
    pub(super) fn on_answer(&mut self, id: &str, decision: Decision) -> Result<(), ProtocolError> {
        let Some(at) = self.state.approvals.pending.iter().position(|q| q.id == id) else {
            return Err(ProtocolError::new(
                ErrorCode::NotFound,
                format!("No question about {id} waits: it was answered, or its turn ended"),
            ));
        };
        let question = self.state.approvals.pending.remove(at);
        if decision == Decision::Always {
            self.state.approvals.allow_always(&question.tool);
        }
        let outcome = match decision {
            Decision::Deny => Err(crate::approval::DENIED.to_string()),
            Decision::Allow | Decision::Always => Ok(()),
        };
        self.answered(id, outcome);
        Ok(())
    }

    /// A client set the session's approval policy (`None`: the settings').
    /// A question waiting is settled by the new policy when it no longer asks.
    pub(super) fn on_set_approvals(
        &mut self,
        policy: Option<ApprovalPolicy>,
    ) -> Result<(), ProtocolError> {
        self.state.approvals.policy = policy;
        let asked = self.state.approvals.pending.first().cloned();
        let gate = asked
            .as_ref()
            .map(|q| self.state.approvals.gate(self.policy.approvals, &q.tool));
        match (asked, gate) {
            (Some(q), Some(Gate::Run)) => {
                self.state.approvals.pending.clear();
                self.answered(&q.id, Ok(()));
            }
            (Some(q), Some(Gate::Refuse)) => {
                self.state.approvals.pending.clear();
                self.answered(&q.id, Err(crate::approval::refused_read_only(&q.tool)));
            }
            _ => {
                self.bump();
                self.send_approvals();
            }
        }
        Ok(())
    }

    /// The question about `id` is gone from the state: store and show
    /// that, then run the call, or end it with why it did not run.
    fn answered(&mut self, id: &str, outcome: Result<(), String>) {
        self.set_asking(false);
        self.bump();
        self.send_approvals();
        match outcome {
            Ok(()) => self.start_tool(id),
            Err(text) => self.tool_ended(id, vec![Content::Text { text }], None, ToolStatus::Error),
        }
    }

    /// Runs tool item `id` (an answer allowed it, or none was needed).
    fn start_tool(&mut self, id: &str) {
        let item = self.tool_item(id);
        let run = RuntimeOutput::RunTool {
            id: item.id.clone(),
            tool_name: item.tool_name.clone(),
            input: item.input.clone(),
            cwd: self.state.cwd.clone(),
        };
        self.out.push(run);
    }

    /// Holds the running tool call for its question, or lets it go.
    fn set_asking(&mut self, held: bool) {
        if let Some(Turn {
            stage: Stage::Tools { asking, .. },
            ..
        }) = &mut self.turn
        {
            *asking = held;
        }
    }

    /// When the question waiting is denied for want of an answer, if a
    /// timeout is set.
    pub(super) fn question_deadline(&self) -> Option<Instant> {
        let timeout = self.policy.approval_timeout?;
        let asked = self.state.approvals.pending.first()?;
        Some(Instant(asked.asked_at) + timeout)
    }

    /// Nobody answered in time: the call is denied, and the model told why.
    pub(super) fn time_out_question(&mut self) {
        let Some(question) = self.state.approvals.pending.pop() else {
            return;
        };
        let secs = self.policy.approval_timeout.map_or(0, |t| t.as_secs());
        let why = format!(
            "{} (nobody answered within {secs} s)",
            crate::approval::DENIED
        );
        self.answered(&question.id, Err(why));
    }

    /// Tells the server the approvals as they stand.
    pub(super) fn send_approvals(&mut self) {
        let message = self.approvals_message();
        self.out.push(RuntimeOutput::Send(message));
    }

    pub(super) fn on_tool_done(
        &mut self,
        id: String,
        content: Vec<Content>,
        details: Option<JsonValue>,
        is_error: bool,
    ) {
        let Some(Turn {
            stage: Stage::Tools {
                running, asking, ..
            },
            ..
        }) = &self.turn
        else {
            return;
        };
        if *running != id || *asking {
            return;
        }
        let details = details.filter(Value::is_json);
        let status = match is_error {
            true => ToolStatus::Error,
            false => ToolStatus::Complete,
        };
        self.tool_ended(&id, content, details, status);
    }

    /// The running tool call `id` ended (ran, was denied or refused): its
    /// item is finished, then the next call starts, or the step ends.
    fn tool_ended(
        &mut self,
        id: &str,
        content: Vec<Content>,
        details: Option<JsonValue>,
        status: ToolStatus,
    ) {
        self.finish_tool(id, content, details, status);
        let Some(Turn {
            stage: Stage::Tools { waiting, .. },
            ..
        }) = &mut self.turn
        else {
            unreachable!()
        };
        if !self.state.queued_steer.is_empty() {
            // The user steered: skip the calls not started yet and let the model hear them first.
            let skipped: Vec<String> = waiting.drain(..).collect();
            for id in skipped {
                let text =
                    "Skipped: the user steered the turn before this tool call ran".to_string();
                self.finish_tool(&id, vec![Content::Text { text }], None, ToolStatus::Error);
            }
        }
        let Some(Turn {
            stage: Stage::Tools { waiting, .. },
            ..
        }) = &mut self.turn
        else {
            unreachable!()
        };
        match waiting.pop_front() {
            Some(next) => {
                let waiting = std::mem::take(waiting);
                self.set_stage(Stage::Tools {
                    running: next.clone(),
                    waiting,
                    asking: false,
                });
                self.bump();
                self.send_snapshot();
                self.run_tool(&next);
            }
            None => self.after_step(),
        }
    }

    pub(super) fn finish_tool(
        &mut self,
        id: &str,
        content: Vec<Content>,
        details: Option<JsonValue>,
        status: ToolStatus,
    ) {
        let Some(TranscriptItem::Tool(item)) = self
            .state
            .transcript
            .iter_mut()
            .rev()
            .find(|i| i.id() == id)
        else {
            unreachable!("the tool item exists")
        };
        item.content = content
            .into_iter()
            .filter(|c| matches!(c, Content::Text { .. } | Content::Image { .. }))
            .collect();
        item.details = details;
        item.status = status;
        let item = TranscriptItem::Tool(item.clone());
        self.out
            .push(RuntimeOutput::Persist(Persist::Item(item.clone())));
        self.progress(TranscriptProgress::ItemFinished { item });
    }

    /// After a reply without tool calls, or after the last tool call: steer
    /// text goes to the model next; otherwise the turn ends.
    pub(super) fn after_step(&mut self) {
        let tools_ran = matches!(
            self.turn,
            Some(Turn {
                stage: Stage::Tools { .. },
                ..
            })
        );
        if !self.state.queued_steer.is_empty() || tools_ran {
            self.take_steer();
            self.next_call();
        } else {
            self.complete_turn();
        }
    }

    /// Stops whatever runs (model call, tool), records it with `message`, ends
    /// the turn; returns the prompt operation, which the caller completes.
    pub(super) fn stop_turn(&mut self, message: &str, queued: Queued) -> OpId {
        let turn = self.turn.clone().expect("a turn runs");
        match turn.stage {
            Stage::Streaming { call, item } => {
                self.out.push(RuntimeOutput::CancelModel { call });
                self.finish_reply(
                    item,
                    AssistantStatus::Aborted,
                    None,
                    Some(message.to_string()),
                );
            }
            Stage::Compacting { call, .. } => self.out.push(RuntimeOutput::CancelModel { call }),
            Stage::Tools {
                running,
                waiting,
                asking,
            } => {
                let text = match asking {
                    true => format!("{message}: the tool call never ran"),
                    false => {
                        self.out.push(RuntimeOutput::CancelTool {
                            id: running.clone(),
                        });
                        format!("{message}: the tool call was stopped")
                    }
                };
                self.finish_tool(
                    &running,
                    vec![Content::Text { text }],
                    None,
                    ToolStatus::Error,
                );
                for id in waiting {
                    let text = format!("{message}: the tool call never ran");
                    self.finish_tool(&id, vec![Content::Text { text }], None, ToolStatus::Error);
                }
            }
            Stage::Retrying { .. } => {}
        }
        self.end_turn(queued)
    }

    /// Moves queued steer messages into the transcript, in order.
    pub(super) fn take_steer(&mut self) {
        for item in std::mem::take(&mut self.state.queued_steer) {
            self.commit(TranscriptItem::User(item));
        }
    }

    /// Ends the turn; returns the prompt operation, which the caller completes.
    pub(super) fn end_turn(&mut self, queued: Queued) -> OpId {
        // A question dies with its turn (stored with the bump below).
        let asked = !self.state.approvals.pending.is_empty();
        self.state.approvals.pending.clear();
        if queued == Queued::Commit {
            // Steer text that no model call will see still belongs to the conversation.
            self.take_steer();
        }
        let turn = self.turn.take().expect("a turn runs");
        self.bump();
        self.send_snapshot();
        if asked {
            self.send_approvals();
        }
        turn.prompt_op
    }

    /// Ends the turn normally: the prompt's response carries the final snapshot.
    pub(super) fn complete_turn(&mut self) {
        let op = self.end_turn(Queued::Commit);
        self.done(op, Ok(()));
    }
}
