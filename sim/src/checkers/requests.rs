//! Every request gets exactly one response while its connection lives.
//!
//! A request is owed from the moment the client sends it. A response to a
//! request that is not owed (answered already, or never sent) is a
//! violation at once. When the connection ends, what it was owed is
//! forgiven; at the end of the liveness phase nothing may still be owed on a
//! live connection ([`Requests::unanswered`]).

use super::{Check, Violation};
use crate::world::Fact;
use crate::world::v8::V8Message;
use kernel::ids::ConnId;
use kernel::protocol::ServerMessage;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// Requests owed, per connection.
#[derive(Debug, Default, Clone)]
pub struct Requests {
    conns: BTreeMap<ConnId, Owed>,
    /// Responses seen.
    pub responses: u64,
    /// Requests sent.
    pub sent: u64,
}

#[derive(Debug, Default, Clone, Hash)]
struct Owed {
    /// Request id → command name.
    owed: BTreeMap<String, &'static str>,
    closed: bool,
}

impl Requests {
    /// Applies one fact.
    pub fn observe(&mut self, fact: &Fact) -> Check {
        match fact {
            Fact::RequestSent { conn, id, command } => {
                self.sent += 1;
                let owed = self.conns.entry(*conn).or_default();
                let previous = owed.owed.insert(id.clone(), command.name());
                if previous.is_some() {
                    let message = format!("{conn}: request id {id} sent twice");
                    return Err(Violation::new("requests", message));
                }
            }
            Fact::Emitted { conn, message, .. } => {
                let ServerMessage::Response(response) = message.as_ref() else {
                    return Ok(());
                };
                self.responses += 1;
                let owed = self.conns.entry(*conn).or_default();
                if owed.owed.remove(&response.id).is_none() {
                    let message = format!(
                        "{conn}: response to {} which is not owed (answered twice or never sent)",
                        response.id
                    );
                    return Err(Violation::new("requests", message));
                }
            }
            Fact::V8RequestSent { conn, id, call, .. } => {
                self.sent += 1;
                let owed = self.conns.entry(*conn).or_default();
                let previous = owed.owed.insert(id.clone(), v8_name(call));
                if previous.is_some() {
                    let message = format!("{conn}: request id {id} sent twice");
                    return Err(Violation::new("requests", message));
                }
            }
            Fact::V8Emitted { conn, message, .. } => {
                let V8Message::Response { id, .. } = message.as_ref() else {
                    return Ok(());
                };
                self.responses += 1;
                let owed = self.conns.entry(*conn).or_default();
                if owed.owed.remove(id).is_none() {
                    let message = format!(
                        "{conn}: response to {id} which is not owed (answered twice or never sent)"
                    );
                    return Err(Violation::new("requests", message));
                }
            }
            Fact::ConnClosed { conn } => self.conns.entry(*conn).or_default().closed = true,
            Fact::ServerRestarted => self.conns.values_mut().for_each(|c| c.closed = true),
            _ => {}
        }
        Ok(())
    }

    /// Requests still owed on live connections: `(conn, request id, command)`.
    pub fn unanswered(&self) -> Vec<(ConnId, String, &'static str)> {
        let live = self.conns.iter().filter(|(_, o)| !o.closed);
        live.flat_map(|(c, o)| o.owed.iter().map(|(id, name)| (*c, id.clone(), *name)))
            .collect()
    }

    /// True once the connection ended (its requests are forgiven).
    pub fn is_closed(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|o| o.closed)
    }

    /// Folds the owed requests of live connections into a fingerprint.
    pub fn fingerprint(&self, hasher: &mut impl Hasher) {
        for (conn, owed) in &self.conns {
            if !owed.closed {
                conn.hash(hasher);
                owed.hash(hasher);
            }
        }
    }
}

/// A v8 call's name, for reports: `v8 <member>` for pi's members.
fn v8_name(call: &kernel::chord::call::ServiceCall) -> &'static str {
    const NAMES: [&str; 18] = [
        "catalogue",
        "subscribe",
        "unsubscribe",
        "create",
        "attach",
        "detach",
        "remove",
        "prepareSession",
        "reload",
        "prompt",
        "steer",
        "followUp",
        "abort",
        "waitForPrompt",
        "cancelQueued",
        "select",
        "selectThinking",
        "getThinkingLevels",
    ];
    NAMES
        .into_iter()
        .find(|n| *n == call.member)
        .unwrap_or("v8 call")
}
