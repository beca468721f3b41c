//! The server snapshot: the session list every connection is sent, kept
//! in encoded pieces and told as it changes.

use super::*;

impl Server {
    /// The server snapshot, built from scratch: the reference for the
    /// encodings built around the cached session list (see [`ListCache`]),
    /// which debug builds compare with it.
    pub(super) fn server_snapshot(&self) -> ServerSnapshot {
        let mut sessions: BTreeMap<&str, SessionMetadata> = BTreeMap::new();
        for (id, stored) in self.catalog.iter() {
            sessions.insert(id, stored.meta.clone());
        }
        for live in self.sessions.values() {
            let Some(snap) = live.snapshot.as_deref() else {
                continue;
            };
            let listed = listed_metadata(sessions.get(live.id.as_str()), snap);
            sessions.insert(&live.id, listed);
        }
        ServerSnapshot {
            server_id: self.config.server_id.clone(),
            protocol_version: PROTOCOL_VERSION,
            revision: self.revision,
            sessions: sessions.into_values().collect(),
            models: self.config.models.clone(),
        }
    }

    /// Brings the encoded session list (the catalog merged with the live
    /// sessions' snapshots) up to date (see [`ListCache`]).
    pub(super) fn refresh_list(&mut self) {
        let cache = ListCache::refresh(self.list_cache.take(), self);
        self.list_cache = Some(cache);
    }

    /// Builds a message around the cached session list and the encoded
    /// models: `encode` gets the server snapshot's parts.
    pub(super) fn snapshot_frame(
        &mut self,
        encode: impl for<'a> FnOnce(&EncodedSnapshot<'a>) -> Result<Spliced<'a>, SchemaError>,
    ) -> Result<Frame, String> {
        self.refresh_list();
        let sessions = self.cached_list().map_err(|e| e.to_string())?;
        let models = &self.models_cbor.as_ref().map_err(|e| e.to_string())?.0;
        let snapshot = EncodedSnapshot {
            server_id: &self.config.server_id,
            protocol_version: PROTOCOL_VERSION,
            revision: self.revision,
            sessions,
            models,
        };
        self.spliced_frame(encode(&snapshot))
    }

    /// The session list as [`Self::refresh_list`] last brought it up to date.
    pub(super) fn cached_list(&self) -> Result<&spliced::EncodedList, SchemaError> {
        self.list_cache
            .as_ref()
            .expect("brought up to date first")
            .encoded()
    }

    /// Frames a message encoded in pieces, sharing its cached pieces.
    pub(super) fn spliced_frame(
        &self,
        payload: Result<Spliced<'_>, SchemaError>,
    ) -> Result<Frame, String> {
        let payload = payload.map_err(|e| e.to_string())?;
        payload
            .frame(self.config.limits.max_frame_len)
            .map_err(|e| e.to_string())
    }

    /// The server hello of a connection.
    pub(super) fn hello_frame(&mut self, connection_id: &str) -> Result<Frame, String> {
        let frame = self.snapshot_frame(|snapshot| {
            spliced::encode_hello(PROTOCOL_VERSION, connection_id, snapshot)
        });
        self.checked(frame, || {
            ServerMessage::Hello(ServerHello {
                version: PROTOCOL_VERSION,
                connection_id: connection_id.to_string(),
                snapshot: self.server_snapshot(),
            })
        })
    }

    /// The server snapshot event.
    pub(super) fn server_snapshot_frame(&mut self) -> Result<Frame, String> {
        let frame = self.snapshot_frame(spliced::encode_server_snapshot_event);
        self.checked(frame, || {
            let snapshot = self.server_snapshot();
            ServerMessage::Event(ServerEvent::ServerSnapshot { snapshot })
        })
    }

    /// The response to `list`.
    pub(super) fn list_frame(&mut self, request_id: &str) -> Result<Frame, String> {
        self.refresh_list();
        let frame = match self.cached_list() {
            Ok(sessions) => self.spliced_frame(spliced::encode_list_response(request_id, sessions)),
            Err(e) => Err(e.to_string()),
        };
        self.checked(frame, || {
            ServerMessage::Response(Response {
                id: request_id.to_string(),
                outcome: Ok(CommandResult::List {
                    sessions: self.server_snapshot().sessions,
                }),
            })
        })
    }

    /// In debug builds (every test and the simulator), asserts that a frame
    /// built around cached parts (the session list, a session's snapshot) is
    /// exactly the normal encoding of `message`, which checks the caches and
    /// their invalidation at every use.
    pub(super) fn checked(
        &self,
        frame: Result<Frame, String>,
        message: impl FnOnce() -> ServerMessage,
    ) -> Result<Frame, String> {
        if cfg!(debug_assertions) {
            let normal = self.encode(&message());
            if frame != normal {
                let at = match (&frame, &normal) {
                    (Ok(a), Ok(b)) => a
                        .bytes()
                        .iter()
                        .zip(b.bytes().iter())
                        .take_while(|(x, y)| x == y)
                        .count(),
                    _ => 0,
                };
                panic!(
                    "an encoding around cached parts differs from the normal one \
                     (first difference at byte {at}): {:?} vs {:?}",
                    frame.as_ref().map(|f| f.len()),
                    normal.as_ref().map(|f| f.len()),
                );
            }
        }
        frame
    }

    /// The ready connections that speak version 1.
    pub(super) fn ready_v1(&self) -> Vec<ConnId> {
        self.conns
            .values()
            .filter(|c| c.is_ready() && c.v8.is_none())
            .map(|c| c.id)
            .collect()
    }

    /// Broadcasts a server snapshot to every ready connection; the revision
    /// increments only when at least one receives it.
    pub(super) fn publish_server_snapshot(&mut self) {
        if self.shutting_down {
            return;
        }
        self.v8_publish_directory();
        let ready = self.ready_v1();
        if ready.is_empty() {
            return;
        }
        self.revision += 1;
        let frame = self.server_snapshot_frame();
        self.broadcast_frame(&ready, frame);
    }

    pub(super) fn broadcast(&mut self, to: &[ConnId], message: &ServerMessage) {
        if to.is_empty() {
            return;
        }
        let frame = self.encode(message);
        self.broadcast_frame(to, frame);
    }

    /// Queues one encoded message for each of `to`.
    pub(super) fn broadcast_frame(&mut self, to: &[ConnId], frame: Result<Frame, String>) {
        match frame {
            Ok(frame) => {
                for &id in to {
                    self.send_frame(id, frame.clone());
                }
            }
            Err(e) => panic!("a server-built message must encode: {e}"),
        }
    }
}
