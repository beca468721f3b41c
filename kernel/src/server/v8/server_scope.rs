//! pi's server-scope services on v8: the session directory, management
//! (`create`, `attach`, `detach`, `remove`), the presentation plugins, and
//! ours, the session status.

use super::*;
use crate::protocol::CreateParams;
use crate::protocol::codec::Schema;

impl Server {
    pub(in crate::server) fn on_server_call(
        &mut self,
        conn: ConnId,
        id: String,
        call: ServiceCall,
    ) {
        let svc = match self.resolve_call(&SERVER_SERVICES, &call) {
            Ok(None) => return self.on_control(conn, id, &SERVER_SERVICES, None, &call),
            Ok(Some(svc)) => svc,
            Err(error) => return self.v8_reply(conn, &id, Err(error)),
        };
        if svc == Svc::Management {
            let v8 = self.v8_mut(conn).expect("v8");
            if v8.managing.is_some() || !v8.management_queue.is_empty() {
                // Behind the call under way, or behind the ones already
                // waiting (the one under way may have just ended, its
                // successor not started yet).
                v8.management_queue.push_back((id, call));
                return self.v8_managed_if_idle(conn);
            }
            v8.managing = Some(id.clone());
        }
        self.run_server_call(conn, id, svc, call);
    }

    /// A server-scope method call, admitted (a management call is the one under way).
    pub(in crate::server) fn run_server_call(
        &mut self,
        conn: ConnId,
        id: String,
        svc: Svc,
        call: ServiceCall,
    ) {
        let args = call.args.as_slice();
        match (svc, call.member.as_str()) {
            (Svc::Management, "create") => match pi_create_args(args) {
                Ok(requested) => self.v8_create(conn, id, requested, CreateParams::default()),
                Err(error) => self.v8_reply(conn, &id, Err(error)),
            },
            (Svc::Sessions, "create") => match self.our_create_args(args) {
                Ok(params) => self.v8_create(conn, id, None, params),
                Err(error) => self.v8_reply(conn, &id, Err(error)),
            },
            (Svc::Sessions, "rename") => self.v8_rename(conn, id, args),
            (Svc::Sessions, "models") => {
                let models = self.config.models.iter().map(Schema::to_value).collect();
                self.v8_reply(conn, &id, Ok(Some(Value::Array(models))))
            }
            (Svc::Management, "attach") => match args {
                [Value::Text(session_id), ..] if !session_id.is_empty() => {
                    self.v8_attach(conn, id, session_id.clone())
                }
                _ => self.v8_reply(conn, &id, Err(invalid_args(&call, "a session id"))),
            },
            (Svc::Management, "detach") => {
                if let Some(route) = self.v8(conn).and_then(|v| v.route.clone()) {
                    self.detach(conn, &route.session_id);
                    self.maybe_dispose(&route.session_id);
                }
                self.v8_reply(conn, &id, Ok(None));
            }
            (Svc::Management, "remove") => match args {
                // The v1 path, answered through `respond` (see `v8_respond`).
                [Value::Text(session_id), ..] if !session_id.is_empty() => {
                    self.on_remove(conn, id, session_id.clone())
                }
                _ => self.v8_reply(conn, &id, Err(invalid_args(&call, "a session id"))),
            },
            (Svc::Presentation, "prepareSession") => {
                let selection = args.first().and_then(|a| a.get("packagePaths"));
                match selection {
                    Some(Value::Null) | None => {
                        self.v8_mut(conn).expect("v8").prepared = true;
                        self.v8_reply(conn, &id, Ok(Some(no_bundles())))
                    }
                    Some(Value::Array(paths)) if paths.is_empty() => {
                        self.v8_mut(conn).expect("v8").prepared = true;
                        self.v8_reply(conn, &id, Ok(Some(no_bundles())))
                    }
                    Some(_) => {
                        let error = CallError::new(
                            "service_invalid_value",
                            "This server does not load plugin packages",
                        );
                        self.v8_reply(conn, &id, Err(error))
                    }
                }
            }
            (Svc::Presentation, "reload") => {
                let result = match self.v8(conn).is_some_and(|v| v.prepared) {
                    true => Ok(Some(no_bundles())),
                    false => Err(CallError::internal()),
                };
                self.v8_reply(conn, &id, result)
            }
            _ => unreachable!("resolve_call admits only these members"),
        }
    }

    /// A new stored session, not attached: pi's `create([{id?}])` (`requested`
    /// id, `params` empty) or ours (`params`, a fresh id).
    pub(in crate::server) fn v8_create(
        &mut self,
        conn: ConnId,
        id: String,
        requested: Option<String>,
        params: CreateParams,
    ) {
        if let Some(error) = self.live_capacity_error() {
            return self.v8_reply(conn, &id, Err(call_error(&error)));
        }
        let taken = |server: &Server, s: &str| {
            server.sessions.contains_key(s)
                || server.catalog.contains(s)
                || server.removals.contains_key(s)
        };
        let session_id = match requested {
            Some(s) if taken(self, &s) => {
                return self.v8_reply(conn, &id, Err(CallError::internal()));
            }
            Some(s) => s,
            None => loop {
                let s = self.rng.uuid_v4();
                if !taken(self, &s) {
                    break s;
                }
            },
        };
        let spec = CreateSpec {
            cwd: params.cwd,
            name: params.name,
            model: params.model,
            thinking_level: params.thinking_level,
        };
        // A waiter counts in flight until it is admitted, as v1's do.
        self.conns.get_mut(&conn).expect("ready").in_flight += 1;
        let waiter = Waiter::new(conn, id, Acquire::Create8);
        self.open(session_id, Some(spec), vec![waiter]);
    }

    /// `attach([sessionId])`: releases the current attachment (silently) and
    /// attaches through the v1 path, which opens the worker; the answer goes
    /// through [`Self::v8_admit`].
    pub(in crate::server) fn v8_attach(&mut self, conn: ConnId, id: String, session_id: String) {
        let route = self.v8(conn).and_then(|v| v.route.clone());
        if route.as_ref().is_some_and(|r| r.session_id == session_id) {
            return self.v8_reply(conn, &id, Ok(None));
        }
        // The current route stays until the new session is admitted: a
        // failed attach leaves it as it was.
        self.on_attach(conn, id, session_id);
    }

    /// A v8 acquire is ready: for an attach, the new route (announced before
    /// the answer); for a create, the session's summary.
    pub(in crate::server) fn v8_admit(
        &mut self,
        session_id: &str,
        conn: ConnId,
        request_id: String,
        kind: Acquire,
    ) {
        if !self
            .v8(conn)
            .is_some_and(|v| v.active.contains_key(&request_id))
        {
            // Cancelled while it waited: nothing is attached (the session's
            // idle disposal follows the admission, as for any waiter).
            if self
                .v8(conn)
                .is_some_and(|v| v.managing.as_deref() == Some(&request_id))
            {
                self.v8_end(conn, &request_id);
            }
            return;
        }
        if kind == Acquire::Create8 {
            self.v8_publish_directory();
            let created_at = self.sessions[session_id]
                .snapshot
                .as_ref()
                .map_or(0, |s| s.created_at);
            let summary = self.summary(session_id, created_at);
            return self.v8_reply(conn, &request_id, Ok(Some(summary)));
        }
        // The old route goes without a word (pi's order): the envelope
        // below names the new one.
        if let Some(old) = self.v8(conn).and_then(|v| v.route.clone()) {
            self.v8_release(conn, false);
            self.detach(conn, &old.session_id);
            self.maybe_dispose(&old.session_id);
        }
        let attachment_id = self.rng.uuid_v4();
        let c = self.conns.get_mut(&conn).expect("ready");
        c.attached.insert(session_id.to_string());
        c.v8.as_deref_mut().expect("v8").route = Some(Route {
            session_id: session_id.to_string(),
            attachment_id: attachment_id.clone(),
        });
        let models = self.config.models.clone();
        let live = self.sessions.get_mut(session_id).expect("ready");
        live.attached.insert(conn);
        if live.v8.is_none() {
            let snapshot = live.snapshot.as_ref().expect("ready").unpacked();
            let (approvals, policy) = &live.approvals;
            let approvals = view::approvals_state(approvals, *policy);
            live.v8 = Some(Box::new(SessionView::new(&snapshot, &models, approvals)));
        }
        let route = Target::Session {
            server_id: self.config.server_id.clone(),
            session_id: session_id.to_string(),
            attachment_id,
        };
        self.v8_send(conn, &ServerMessage::Attachment(Some(route)));
        self.v8_reply(conn, &request_id, Ok(None));
    }

    pub(in crate::server) fn summary(&self, session_id: &str, created_at: u64) -> Value {
        Value::object(vec![
            ("serverId", Value::text(&self.config.server_id)),
            ("sessionId", Value::text(session_id)),
            ("createdAt", Value::Int(created_at as i64)),
        ])
    }

    /// The connection's route is gone: its session subscriptions end (no
    /// update of the old attachment arrives after this), and the client is
    /// told when `publish`.
    pub(in crate::server) fn v8_release(&mut self, conn: ConnId, publish: bool) {
        let Some(v8) = self.v8_mut(conn) else {
            return;
        };
        if v8.route.take().is_none() {
            return;
        }
        v8.subs.retain(|_, sub| sub.attachment.is_none());
        if publish {
            self.v8_send(conn, &ServerMessage::Attachment(None));
        }
    }

    /// A v1-path answer to a v8 request (attach errors, remove).
    pub(in crate::server) fn v8_respond(
        &mut self,
        conn: ConnId,
        request_id: &str,
        outcome: Result<CommandResult, ProtocolError>,
    ) {
        let result = outcome.map(|_| None).map_err(|e| call_error(&e));
        self.v8_reply(conn, request_id, result);
    }
}

impl Server {
    /// Our `rename([sessionId, name])`: the session this connection is
    /// attached to takes a name no other session has (v1's rule); answered
    /// when the worker has stored it.
    fn v8_rename(&mut self, conn: ConnId, id: String, args: &[Value]) {
        let invalid = |what: &str| CallError::invalid_value(SESSIONS_SERVICE, "rename", what);
        let (session_id, name) = match args {
            [Value::Text(session), Value::Text(name)] => (session.clone(), name.clone()),
            _ => return self.v8_reply(conn, &id, Err(invalid("expected [sessionId, name]"))),
        };
        let attached = self
            .v8(conn)
            .and_then(|v| v.route.as_ref())
            .is_some_and(|r| r.session_id == session_id);
        if !attached || !self.sessions.contains_key(&session_id) {
            let error = CallError::new(
                "session_not_attached",
                format!("Attach session {session_id} before renaming it"),
            );
            return self.v8_reply(conn, &id, Err(error));
        }
        if let Err(message) = self.check_name(&name, &session_id) {
            return self.v8_reply(conn, &id, Err(invalid(&message)));
        }
        self.start_op(
            conn,
            &id,
            &session_id,
            "v8.void",
            Operation::Rename { name },
        );
    }
}

/// The id pi's `create([{id?}])` asks for, if any. An id that is not a
/// session id is pi's plain error (`internal_error`).
fn pi_create_args(args: &[Value]) -> Result<Option<String>, CallError> {
    match args.first() {
        None | Some(Value::Null) => Ok(None),
        Some(arg @ Value::Map(_)) => match arg.get("id") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Text(s)) if is_session_id(s) => Ok(Some(s.clone())),
            Some(_) => Err(CallError::internal()),
        },
        Some(_) => Err(CallError::invalid_value(
            Svc::Management.id(),
            "create",
            "expected {id?}",
        )),
    }
}

impl Server {
    /// Our `create([{cwd?, name?, model?: {provider, modelId}, thinkingLevel?}])`:
    /// v1's `create` parameters, checked as v1 checks them (a name is
    /// unique; the working directory and model are the worker's to judge).
    fn our_create_args(&self, args: &[Value]) -> Result<CreateParams, CallError> {
        let invalid = |what: &str| CallError::invalid_value(SESSIONS_SERVICE, "create", what);
        let expected = "expected {cwd?, name?, model?: {provider, modelId}, thinkingLevel?}";
        let arg = match args {
            [] | [Value::Null] => return Ok(CreateParams::default()),
            [arg @ Value::Map(entries)] => {
                let known = ["cwd", "name", "model", "thinkingLevel"];
                if entries.iter().any(|(k, _)| !known.contains(&k.as_str())) {
                    return Err(invalid(expected));
                }
                arg
            }
            _ => return Err(invalid(expected)),
        };
        let text = |key: &str| match arg.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Text(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(invalid(&format!("{key} must be a non-empty string"))),
        };
        let cwd = text("cwd")?;
        let name = text("name")?;
        if let Some(name) = &name {
            self.check_name(name, "").map_err(|m| invalid(&m))?;
        }
        let model = match arg.get("model") {
            None | Some(Value::Null) => None,
            Some(model) => match (model.get("provider"), model.get("modelId")) {
                (Some(Value::Text(provider)), Some(Value::Text(id)))
                    if !provider.is_empty() && !id.is_empty() =>
                {
                    Some(ModelRef {
                        provider: provider.clone(),
                        id: id.clone(),
                    })
                }
                _ => return Err(invalid("model must be {provider, modelId}")),
            },
        };
        let thinking_level = match text("thinkingLevel")? {
            None => None,
            Some(level) => Some(
                ThinkingLevel::parse(&level)
                    .ok_or_else(|| invalid(&format!("no thinking level {level:?}")))?,
            ),
        };
        Ok(CreateParams {
            cwd,
            name,
            model,
            thinking_level,
        })
    }
}
