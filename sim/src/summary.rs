//! One-line summaries of protocol messages for traces: small ids, no UUIDs,
//! no wall-clock values, so snapshots are stable.

use kernel::protocol::{
    AssistantStatus, ClientMessage, Command, CommandResult, PackedSnapshot, ServerEvent,
    ServerMessage, SessionSnapshot, ToolStatus, TranscriptItem, TranscriptProgress,
};
use kernel::worker::{FromWorker, Operation, ToWorker};
use std::collections::BTreeMap;

/// Maps long ids (session UUIDs) to short stable names (`s1`, `s2`, …) in order of appearance.
#[derive(Debug, Default, Clone)]
pub struct Names {
    map: BTreeMap<String, String>,
}

impl Names {
    /// The short name of a session id.
    pub fn session(&mut self, id: &str) -> String {
        let n = self.map.values().filter(|v| v.starts_with('s')).count() + 1;
        self.map
            .entry(id.to_string())
            .or_insert_with(|| format!("s{n}"))
            .clone()
    }

    /// The short name of an attachment id (`a1`, `a2`, …).
    pub fn attachment(&mut self, id: &str) -> String {
        if id == crate::v8::UNKNOWN_ATTACHMENT {
            return "unknown".into();
        }
        let n = self.map.values().filter(|v| v.starts_with('a')).count() + 1;
        self.map
            .entry(id.to_string())
            .or_insert_with(|| format!("a{n}"))
            .clone()
    }

    /// Gives a session id a fixed short name (for ids that never exist).
    pub fn alias(&mut self, id: &str, short: &str) {
        self.map.insert(id.to_string(), short.to_string());
    }

    /// The session id behind a short name.
    pub fn lookup(&self, short: &str) -> Option<String> {
        self.map
            .iter()
            .find(|(_, v)| v.as_str() == short)
            .map(|(k, _)| k.clone())
    }
}

fn item(i: &TranscriptItem) -> String {
    match i {
        TranscriptItem::User(_) => "user".into(),
        TranscriptItem::Assistant(a) => match a.status {
            AssistantStatus::Streaming => "assistant:streaming".into(),
            AssistantStatus::Complete(_) => "assistant:complete".into(),
            AssistantStatus::Error if kernel::runtime::notice_text(a).is_some() => "notice".into(),
            AssistantStatus::Error => "assistant:error".into(),
            AssistantStatus::Aborted => "assistant:aborted".into(),
        },
        TranscriptItem::Tool(t) => match t.status {
            ToolStatus::Running => "tool:running".into(),
            ToolStatus::Complete => "tool:complete".into(),
            ToolStatus::Error => "tool:error".into(),
        },
    }
}

/// `s1 rev=3 turn attached items=[user,assistant:streaming] steer=1`
pub fn snapshot(names: &mut Names, s: &SessionSnapshot) -> String {
    let items: Vec<String> = s.transcript.iter().map(item).collect();
    format!(
        "{} rev={} {} {}{} model={}/{}:{} items=[{}] steer={}",
        names.session(&s.id),
        s.revision,
        s.phase.as_str(),
        if s.attached { "attached" } else { "detached" },
        if s.locked { " locked" } else { "" },
        s.model.provider,
        s.model.id,
        s.thinking_level.as_str(),
        items.join(","),
        s.queued_steer_count,
    )
}

/// A client → server message.
pub fn client(names: &mut Names, m: &ClientMessage) -> String {
    match m {
        ClientMessage::Hello(h) => {
            format!(
                "hello v{}{}",
                h.version,
                if h.token.is_some() { " token" } else { "" }
            )
        }
        ClientMessage::Request(r) => {
            let c = &r.command;
            let target = c
                .session_id()
                .map(|s| format!(" {}", names.session(s)))
                .unwrap_or_default();
            let extra = match c {
                Command::Prompt { text, .. } | Command::Steer { text, .. } => {
                    format!(" {:?}", short(text))
                }
                Command::SetModel { model, .. } => format!(" {}/{}", model.provider, model.id),
                Command::SetThinking { thinking_level, .. } => {
                    format!(" {}", thinking_level.as_str())
                }
                Command::Rename { name, .. } => format!(" {:?}", short(name)),
                _ => String::new(),
            };
            format!("#{} {}{target}{extra}", r.id, c.name())
        }
    }
}

/// A server → client message.
pub fn server(names: &mut Names, m: &ServerMessage) -> String {
    match m {
        ServerMessage::Hello(h) => {
            format!(
                "hello v{} rev={} sessions={}",
                h.version,
                h.snapshot.revision,
                h.snapshot.sessions.len()
            )
        }
        ServerMessage::HelloError(e) => format!("hello_error {}: {}", e.code.as_str(), e.message),
        ServerMessage::Response(r) => match &r.outcome {
            Ok(result) => format!("#{} ok {}", r.id, result_summary(names, result)),
            Err(e) => format!(
                "#{} err {}: {}",
                r.id,
                e.code.as_str(),
                shorten(names, &e.message)
            ),
        },
        ServerMessage::Event(e) => match e {
            ServerEvent::ServerSnapshot { snapshot } => {
                format!(
                    "server_snapshot rev={} sessions={}",
                    snapshot.revision,
                    snapshot.sessions.len()
                )
            }
            ServerEvent::SessionSnapshot { snapshot: s } => {
                format!("session_snapshot {}", snapshot(names, s))
            }
            ServerEvent::SessionProgress {
                session_id,
                progress,
            } => {
                format!(
                    "progress {} {}",
                    names.session(session_id),
                    progress_summary(progress)
                )
            }
            ServerEvent::SessionRemoved { session_id } => {
                format!("session_removed {}", names.session(session_id))
            }
        },
    }
}

fn result_summary(names: &mut Names, r: &CommandResult) -> String {
    match r {
        CommandResult::List { sessions } => {
            let ids: Vec<String> = sessions.iter().map(|s| names.session(&s.id)).collect();
            format!("list [{}]", ids.join(","))
        }
        CommandResult::Detach { session_id } => format!("detach {}", names.session(session_id)),
        CommandResult::Remove { session_id } => format!("remove {}", names.session(session_id)),
        CommandResult::Status { sessions } => {
            let live: Vec<String> = sessions
                .iter()
                .map(|s| {
                    let id = names.session(&s.session_id);
                    format!("{id}:{}/{}", s.state.as_str(), s.clients)
                })
                .collect();
            format!("status [{}]", live.join(","))
        }
        CommandResult::Create { session }
        | CommandResult::Attach { session }
        | CommandResult::Prompt { session }
        | CommandResult::SetMcpServers { session }
        | CommandResult::Steer { session }
        | CommandResult::Abort { session }
        | CommandResult::SetModel { session }
        | CommandResult::SetThinking { session }
        | CommandResult::Rename { session }
        | CommandResult::Compact { session } => {
            format!("{} {}", r.name(), snapshot(names, session))
        }
    }
}

fn progress_summary(p: &TranscriptProgress) -> String {
    match p {
        TranscriptProgress::ItemStarted { item: i } => format!("item_started {}", item(i)),
        TranscriptProgress::AssistantDelta {
            content_index,
            kind,
            delta,
            ..
        } => {
            format!("delta {kind:?}[{content_index}] {delta:?}")
        }
        TranscriptProgress::ItemUpdated { item: i } => format!("item_updated {}", item(i)),
        TranscriptProgress::ItemFinished { item: i } => format!("item_finished {}", item(i)),
    }
}

/// Text as traced: up to 32 characters, then the number left out.
fn short(text: &str) -> String {
    match text.char_indices().nth(32) {
        Some((cut, _)) => format!("{}…(+{})", &text[..cut], text[cut..].chars().count()),
        None => text.to_string(),
    }
}

/// Replaces known session ids inside free text by their short names.
pub fn shorten(names: &mut Names, text: &str) -> String {
    let mut out = text.to_string();
    for (long, short) in &names.map {
        out = out.replace(long.as_str(), short);
    }
    out
}

/// A server → worker message.
pub fn to_worker(m: &ToWorker) -> String {
    match m {
        ToWorker::Operation { op, operation } => {
            let detail = match operation {
                Operation::Prompt { text, .. } | Operation::Steer { text } => {
                    format!(" {:?}", short(text))
                }
                Operation::SetModel { model } => format!(" {}/{}", model.provider, model.id),
                Operation::SetThinking { level } => format!(" {}", level.as_str()),
                Operation::Rename { name } => format!(" {:?}", short(name)),
                Operation::SetMcpServers { servers } => format!(" {}", short(&servers.json_text())),
                Operation::Abort => String::new(),
                Operation::Compact { instructions } => instructions
                    .as_deref()
                    .map_or(String::new(), |i| format!(" {:?}", short(i))),
                Operation::Answer { id, decision } => format!(" {id} {}", decision.as_str()),
                Operation::SetApprovals { policy } => {
                    format!(" {}", policy.map_or("settings", |p| p.as_str()))
                }
            };
            format!("{op} {}{detail}", operation.name())
        }
        ToWorker::Dispose => "dispose".into(),
        ToWorker::Snapshot => "send snapshot".into(),
    }
}

/// A snapshot as a worker sends it: a tail's items after `..N+`, the
/// number of items before it.
fn packed(names: &mut Names, s: &PackedSnapshot) -> String {
    let line = snapshot(names, &s.unpack().expect("packed by a worker host"));
    match s.transcript().from() {
        0 => line,
        from => line.replacen("items=[", &format!("items=[..{from}+"), 1),
    }
}

/// A worker → server message.
pub fn from_worker(names: &mut Names, m: &FromWorker) -> String {
    match m {
        FromWorker::Ready { snapshot: s } => format!("ready {}", packed(names, s)),
        FromWorker::Failed { error } => format!(
            "failed {}: {}",
            error.code.as_str(),
            shorten(names, &error.message)
        ),
        FromWorker::Snapshot { snapshot: s } => format!("snapshot {}", packed(names, s)),
        FromWorker::Progress { progress } => format!("progress {}", progress_summary(progress)),
        FromWorker::OpDone { op, outcome } => match outcome {
            Ok(s) => format!("{op} done {}", packed(names, s)),
            Err(e) => format!("{op} failed {}: {}", e.code.as_str(), e.message),
        },
        FromWorker::Fatal { message } => format!("fatal {message}"),
        FromWorker::Approvals { approvals, policy } => {
            let asked: Vec<String> = approvals
                .pending
                .iter()
                .map(|q| format!("{} {}", q.id, q.tool))
                .collect();
            format!(
                "approvals {} always={:?} asked={asked:?}",
                policy.as_str(),
                approvals.always
            )
        }
    }
}

/// A v8 route: `s1/a2`.
fn v8_route(names: &mut Names, route: &crate::v8::Route) -> String {
    format!(
        "{}/{}",
        names.session(&route.session_id),
        names.attachment(&route.attachment_id)
    )
}

/// One argument of a v8 call, short.
fn v8_arg(names: &mut Names, v: &kernel::wire::Value) -> String {
    use kernel::wire::Value;
    match v {
        Value::Text(t) if kernel::rng::is_uuid_v4(t) => names.session(t),
        Value::Text(t) => short(t),
        Value::Null => "null".into(),
        Value::Map(_) => match (v.get("message"), v.get("provider"), v.get("modelId")) {
            (Some(Value::Text(m)), _, _) => format!("{:?}", short(m)),
            (_, Some(Value::Text(p)), Some(Value::Text(m))) => format!("{p}/{m}"),
            _ => "{…}".into(),
        },
        other => short(&other.json_text()),
    }
}

/// A v8 client → server request.
pub fn v8_request(
    names: &mut Names,
    id: &str,
    target: &kernel::protocol::v8::Target,
    call: &kernel::chord::call::ServiceCall,
) -> String {
    let args: Vec<String> = call.args.iter().map(|a| v8_arg(names, a)).collect();
    let name = match call.service_id.as_str() {
        crate::v8::CONTROL => call.member.clone(),
        service => format!("{service}.{}", call.member),
    };
    let at = match crate::v8::route_of(target) {
        Some(route) => format!(" @{}", v8_route(names, &route)),
        None => String::new(),
    };
    let args = if args.is_empty() {
        String::new()
    } else {
        format!(" {}", args.join(" "))
    };
    format!("#{id} {name}{args}{at}")
}

/// What a v8 result says, short.
fn v8_result(names: &mut Names, v: &kernel::wire::Value) -> String {
    use kernel::wire::Value;
    let text = |v: Option<&Value>| match v {
        Some(Value::Text(t)) => t.clone(),
        _ => String::new(),
    };
    match v {
        Value::Map(_) if v.get("instances").is_some() => {
            let sequence = match v.get("instances") {
                Some(Value::Array(instances)) => instances
                    .iter()
                    .filter_map(|i| match i.get("members") {
                        Some(Value::Array(members)) => members
                            .iter()
                            .find_map(|m| m.get("sequence"))
                            .map(|v| v.json_text()),
                        _ => None,
                    })
                    .next(),
                _ => None,
            };
            let sequence = sequence.map_or(String::new(), |s| format!(" seq={s}"));
            format!("snapshot {}{sequence}", text(v.get("serviceId")))
        }
        Value::Map(_) if v.get("accepted").is_some() => {
            match (v.get("accepted"), v.get("operationId").or(v.get("entryId"))) {
                (Some(Value::Bool(true)), Some(Value::Text(id))) => format!("accepted {id}"),
                _ => format!(
                    "refused {}",
                    text(v.get("error").and_then(|e| e.get("code")))
                ),
            }
        }
        Value::Map(_) if v.get("status").is_some() => match text(v.get("status")).as_str() {
            "done" => format!("done {:?}", short(&text(v.get("text")))),
            status => format!("{status}: {}", shorten(names, &text(v.get("reason")))),
        },
        Value::Map(_) if v.get("sessionId").is_some() => {
            format!("session {}", names.session(&text(v.get("sessionId"))))
        }
        Value::Map(_) if v.get("outcome").is_some() => {
            format!("outcome {}", text(v.get("outcome")))
        }
        Value::Array(items) if items.iter().all(|i| i.get("serviceId").is_some()) => {
            let ids: Vec<String> = items.iter().map(|i| text(i.get("serviceId"))).collect();
            format!("catalogue [{}]", ids.join(","))
        }
        other => short(&other.json_text()),
    }
}

/// A server → v8 client message; `None` for an update that only streams
/// text (an `a` op or path ids), unless `deltas`.
pub fn v8_server(names: &mut Names, m: &crate::v8::V8Message, deltas: bool) -> Option<String> {
    use crate::v8::V8Message;
    use kernel::wire::Value;
    Some(match m {
        V8Message::Hello { .. } => "hello v8".into(),
        V8Message::HelloError(e) => format!("hello_error {}: {}", e.code, e.message),
        V8Message::Response { id, outcome } => match outcome {
            Ok(None) => format!("#{id} ok"),
            Ok(Some(result)) => format!("#{id} ok {}", v8_result(names, result)),
            Err(e) => format!("#{id} err {}: {}", e.code, shorten(names, &e.message)),
        },
        V8Message::Attachment(Some(route)) => format!("attachment {}", v8_route(names, route)),
        V8Message::Attachment(None) => "attachment null".into(),
        V8Message::Update {
            subscription_id,
            update,
        } => {
            let verbs: Vec<String> = match update.get("ops") {
                Some(Value::Array(ops)) => ops
                    .iter()
                    .filter_map(|op| match op {
                        Value::Array(t) => match t.first() {
                            Some(Value::Text(verb)) => Some(verb.clone()),
                            _ => None,
                        },
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            if !deltas && !verbs.is_empty() && verbs.iter().all(|v| v == "a" || v == "#") {
                return None;
            }
            let kind = match update.get("type") {
                Some(Value::Text(t)) => t.clone(),
                _ => "?".into(),
            };
            let sequence = update
                .get("sequence")
                .map_or(String::new(), |s| format!(" seq={}", s.json_text()));
            format!(
                "update {subscription_id} {kind}{sequence} [{}]",
                verbs.join(" ")
            )
        }
        V8Message::Malformed(why) => format!("malformed {}", short(why)),
    })
}
