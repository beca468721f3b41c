//! Publishing v8 states: each subscription's updates as small ops, one
//! encoder shared by the subscriptions that saw the same publications.

use super::*;

impl Server {
    /// A session's new snapshot, its transcript from `tail.from()` on: the
    /// session states move to it, and their subscribers get the ops.
    pub(in crate::server) fn v8_on_snapshot(
        &mut self,
        session_id: &str,
        tail: &crate::protocol::PackedTranscript,
    ) {
        let models = &self.config.models;
        let Some(live) = self.sessions.get_mut(session_id) else {
            return;
        };
        let (Some(view), Some(snapshot)) = (live.v8.as_deref_mut(), live.snapshot.as_ref()) else {
            return;
        };
        let Ok(items) = tail.unpack() else {
            return; // checked when it arrived
        };
        let (transcript, models) = view.sync(snapshot, tail.from(), items, models);
        #[cfg(debug_assertions)]
        if snapshot.has_transcript() {
            let whole = view::conversation_view(&snapshot.unpacked());
            assert!(
                chord::ops::diff_root(view.transcript.value(), &whole).is_empty(),
                "the transcript state follows the snapshot"
            );
        }
        let transcript = transcript.map(|ops| (view.transcript.sequence(), ops));
        let models = models.map(|ops| (view.models.sequence(), ops));
        if let Some((sequence, ops)) = transcript {
            self.v8_publish_session(session_id, Svc::Transcript, sequence, &ops);
        }
        if let Some((sequence, ops)) = models {
            self.v8_publish_session(session_id, Svc::Models, sequence, &ops);
        }
    }

    /// The session's approvals changed: `pi-server.approvals` follows.
    pub(in crate::server) fn v8_on_approvals(&mut self, session_id: &str) {
        let Some(live) = self.sessions.get_mut(session_id) else {
            return;
        };
        let (approvals, policy) = &live.approvals;
        let next = view::approvals_state(approvals, *policy);
        let Some(view) = live.v8.as_deref_mut() else {
            return;
        };
        if let Some(ops) = view.approvals.publish(next) {
            let sequence = view.approvals.sequence();
            self.v8_publish_session(session_id, Svc::Approvals, sequence, &ops);
        }
    }

    /// A progress event: the transcript's live part moves.
    pub(in crate::server) fn v8_on_progress(
        &mut self,
        session_id: &str,
        progress: &TranscriptProgress,
    ) {
        let Some(view) = self
            .sessions
            .get_mut(session_id)
            .and_then(|l| l.v8.as_deref_mut())
        else {
            return;
        };
        if let Some(ops) = view.advance(progress) {
            let sequence = view.transcript.sequence();
            self.v8_publish_session(session_id, Svc::Transcript, sequence, &ops);
        }
    }

    pub(in crate::server) fn v8_publish_session(
        &mut self,
        session_id: &str,
        svc: Svc,
        sequence: u64,
        ops: &[Op],
    ) {
        let to: Vec<ConnId> = self.sessions[session_id].attached.iter().copied().collect();
        self.v8_publish(&to, svc, sequence, ops);
    }

    /// Sends one publication to every subscription of `to` to `svc`,
    /// through its stream's encoder. Subscriptions share an encoder while
    /// they saw the same publications since their snapshots (all that
    /// subscribed between the same two publications): the update is
    /// encoded once per shared encoder, and each frame is its own short
    /// head around that encoding.
    pub(in crate::server) fn v8_publish(
        &mut self,
        to: &[ConnId],
        svc: Svc,
        sequence: u64,
        ops: &[Op],
    ) {
        // (encoder before, encoder after, the update's CBOR)
        type Encoded = (Option<Arc<Encoder>>, Arc<Encoder>, Arc<[u8]>);
        let mut encoded: Vec<Encoded> = Vec::new();
        let mut frames: Vec<(ConnId, String, Arc<[u8]>)> = Vec::new();
        let limits = self.config.limits.cbor;
        let same = |a: &Option<Arc<Encoder>>, b: &Option<Arc<Encoder>>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        for &conn in to {
            let Some(v8) = self.conns.get_mut(&conn).and_then(|c| c.v8.as_deref_mut()) else {
                continue;
            };
            for (id, sub) in v8.subs.iter_mut().filter(|(_, s)| s.svc == svc) {
                let bytes = match encoded
                    .iter()
                    .find(|(before, ..)| same(before, &sub.encoder))
                {
                    Some((_, after, bytes)) => {
                        sub.encoder = Some(Arc::clone(after));
                        Arc::clone(bytes)
                    }
                    None => {
                        let before = sub.encoder.take();
                        let mut encoder = before.as_deref().cloned().unwrap_or_default();
                        let update = chord::state_update("state", sequence, encoder.encode(ops));
                        let after = Arc::new(encoder);
                        sub.encoder = Some(Arc::clone(&after));
                        let Ok(bytes) = proto::encode(&update, &limits) else {
                            continue; // too large to send: its connection is closed below
                        };
                        let bytes: Arc<[u8]> = bytes.into();
                        encoded.push((before, after, Arc::clone(&bytes)));
                        bytes
                    }
                };
                frames.push((conn, id.clone(), bytes));
            }
        }
        for (conn, subscription_id, update) in frames {
            let frame = self.update_frame(&subscription_id, update);
            self.send_encoded(conn, frame);
        }
    }

    /// `{type:"service_update", subscriptionId, update}` around an encoded update.
    pub(in crate::server) fn update_frame(
        &self,
        subscription_id: &str,
        update: Arc<[u8]>,
    ) -> Result<Frame, String> {
        let mut head = Vec::with_capacity(48 + subscription_id.len());
        let limits = &self.config.limits.cbor;
        let mut encoder = crate::wire::cbor::Encoder::new(&mut head, limits);
        let written = encoder
            .map_header(3)
            .and_then(|()| encoder.text("type"))
            .and_then(|()| encoder.text("service_update"))
            .and_then(|()| encoder.text("subscriptionId"))
            .and_then(|()| encoder.text(subscription_id))
            .and_then(|()| encoder.text("update"));
        written.map_err(|e| e.to_string())?;
        let frame = crate::wire::frame::frame_shared(
            &head,
            &[update],
            &[],
            self.config.limits.max_frame_len,
        )
        .map_err(|e| e.to_string())?;
        if cfg!(debug_assertions) {
            let message = ServerMessage::ServiceUpdate {
                subscription_id: subscription_id.to_string(),
                update: crate::wire::cbor::decode(&frame.bytes()[4 + head.len()..], limits)
                    .expect("an update decodes"),
            };
            assert_eq!(
                frame,
                self.v8_frame(&message.to_value())?,
                "a spliced update"
            );
        }
        Ok(frame)
    }

    /// The directory's state now: stored sessions and adopted live ones,
    /// by id.
    pub(in crate::server) fn directory_sessions(&self) -> Value {
        let mut sessions: BTreeMap<&str, u64> = BTreeMap::new();
        for (id, stored) in self.catalog.iter() {
            sessions.insert(id, stored.meta.created_at);
        }
        for live in self.sessions.values() {
            if let Some(snapshot) = live.snapshot.as_deref() {
                sessions.insert(&live.id, snapshot.created_at);
            }
        }
        Value::Array(
            sessions
                .into_iter()
                .map(|(id, created_at)| self.summary(id, created_at))
                .collect(),
        )
    }

    /// Brings `pi.session-directory` up to date and tells its subscribers.
    /// Kept only while someone subscribes: a server with no v8 client
    /// builds no list for it.
    pub(in crate::server) fn v8_publish_directory(&mut self) {
        let subscribers: Vec<ConnId> = self
            .conns
            .values()
            .filter(|c| {
                c.v8.as_ref()
                    .is_some_and(|v| v.subs.values().any(|s| s.svc == Svc::Directory))
            })
            .map(|c| c.id)
            .collect();
        if !subscribers.is_empty() {
            self.refresh_directory(&subscribers);
        }
    }

    /// [`Self::v8_publish_directory`] to these subscribers (none, to make
    /// the state a new subscription's snapshot shows).
    pub(in crate::server) fn refresh_directory(&mut self, subscribers: &[ConnId]) {
        let sessions = self.directory_sessions();
        let state = self.directory.get_or_insert_with(|| {
            State::new(Value::object(vec![
                ("revision", Value::Int(0)),
                ("sessions", Value::Array(vec![])),
            ]))
        });
        if state.value().get("sessions") == Some(&sessions) && state.sequence() > 0 {
            return;
        }
        let revision = match state.value().get("revision") {
            Some(Value::Int(n)) => n + 1,
            _ => 1,
        };
        let next = Value::object(vec![
            ("revision", Value::Int(revision)),
            ("sessions", sessions),
        ]);
        let Some(ops) = state.publish(next) else {
            return;
        };
        let sequence = state.sequence();
        self.v8_publish(subscribers, Svc::Directory, sequence, &ops);
    }
}
