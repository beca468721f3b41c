//! The replica of one subscription: the snapshot's state, then every
//! `state` update checked (its type, its sequence, chord 0.85.1's verbs),
//! decoded and applied, as the published client keeps it.

use super::{Route, UPDATE_TYPES, VERBS, keys};
use crate::chord::ops;
use crate::chord::wire::Decoder;
use crate::wire::Value;

/// The replica of one subscription's state member.
#[derive(Debug, Clone)]
pub struct Replica {
    /// The service subscribed to.
    pub service: String,
    /// The route it was made under (session-scope services).
    pub route: Option<Route>,
    /// The state's sequence and value, for a service with a state member.
    pub state: Option<(u64, Value)>,
    decoder: Decoder,
}

impl Replica {
    /// The replica a subscription snapshot starts: a singleton's one
    /// instance, its state member (if any) from its one `r` op. The state
    /// is moved out of the snapshot, not copied (a transcript's may be
    /// large).
    pub fn from_snapshot(
        service: &str,
        route: Option<Route>,
        mut snapshot: Value,
    ) -> Result<Self, String> {
        let (mut replica, at) = Self::check(service, route, &snapshot)?;
        if let Some((sequence, at)) = replica.state.take().map(|(s, _)| s).zip(at) {
            let value = snapshot
                .get_mut("instances")
                .and_then(|i| match i {
                    Value::Array(instances) => instances.first_mut(),
                    _ => None,
                })
                .and_then(|i| i.get_mut("members"))
                .and_then(|m| match m {
                    Value::Array(members) => members.get_mut(at),
                    _ => None,
                })
                .and_then(|m| m.get_mut("ops"))
                .and_then(|o| match o {
                    Value::Array(ops) => ops.first_mut(),
                    _ => None,
                })
                .and_then(|op| match op {
                    Value::Array(op) => op.get_mut(1),
                    _ => None,
                })
                .map(|v| std::mem::replace(v, Value::Null))
                .expect("checked");
            replica.state = Some((sequence, value));
        }
        Ok(replica)
    }

    /// Checks a subscription snapshot; the replica it makes holds its state's
    /// sequence (the value comes after), with where that member is.
    fn check(
        service: &str,
        route: Option<Route>,
        snapshot: &Value,
    ) -> Result<(Self, Option<usize>), String> {
        let instances = match snapshot.get("instances") {
            Some(Value::Array(instances)) => instances,
            _ => return Err(format!("{service}: a snapshot without instances")),
        };
        if keys(snapshot) != ["instances", "mode", "serviceId"] {
            return Err(format!("{service}: snapshot keys {:?}", keys(snapshot)));
        }
        if snapshot.get("serviceId") != Some(&Value::text(service)) {
            return Err(format!("{service}: a snapshot of another service"));
        }
        let [instance] = instances.as_slice() else {
            return Err(format!(
                "{service}: a singleton snapshot with {} instances",
                instances.len()
            ));
        };
        let Some(Value::Array(members)) = instance.get("members") else {
            return Err(format!("{service}: an instance without members"));
        };
        let mut state = None;
        let mut at = None;
        for (i, member) in members.iter().enumerate() {
            if member.get("kind") != Some(&Value::text("state")) {
                continue;
            }
            let sequence = match member.get("sequence") {
                Some(Value::Int(n)) if *n >= 0 => *n as u64,
                _ => return Err(format!("{service}: a state member without a sequence")),
            };
            match member.get("ops") {
                Some(Value::Array(ops)) => match ops.as_slice() {
                    [Value::Array(op)] if op.len() == 2 && op[0] == Value::text("r") => {}
                    _ => return Err(format!("{service}: a snapshot's ops are not one r")),
                },
                _ => return Err(format!("{service}: a state member without ops")),
            };
            state = Some((sequence, Value::Null));
            at = Some(i);
        }
        let replica = Self {
            service: service.to_string(),
            route,
            state,
            decoder: Decoder::new(),
        };
        Ok((replica, at))
    }

    /// The wire decoder's state (the path ids defined so far), which
    /// decides how the next update decodes.
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Applies one `service_update`: checks its type and keys, that its
    /// sequence follows the last, that its ops use only chord 0.85.1's
    /// verbs, decode and apply.
    pub fn update(&mut self, update: &Value) -> Result<(), String> {
        let service = &self.service;
        let kind = match update.get("type") {
            Some(Value::Text(t)) => t.as_str(),
            _ => return Err(format!("{service}: an update without a type")),
        };
        if !UPDATE_TYPES.contains(&kind) {
            return Err(format!(
                "{service}: update type {kind:?} (chord 0.85.1 refuses it)"
            ));
        }
        if kind != "state" {
            return Err(format!(
                "{service}: an update {kind:?} on a singleton subscription the server never withdraws"
            ));
        }
        if keys(update) != ["member", "ops", "sequence", "type"] {
            return Err(format!("{service}: state update keys {:?}", keys(update)));
        }
        let Some((sequence, value)) = &mut self.state else {
            return Err(format!(
                "{service}: a state update for a service without state"
            ));
        };
        if update.get("member") != Some(&Value::text("state")) {
            return Err(format!(
                "{service}: an update of member {:?}",
                update.get("member")
            ));
        }
        let next = match update.get("sequence") {
            Some(Value::Int(n)) if *n >= 1 => *n as u64,
            other => return Err(format!("{service}: update sequence {other:?}")),
        };
        if next != *sequence + 1 {
            return Err(format!(
                "{service}: update sequence {next} after {sequence} (a gap or a repeat)"
            ));
        }
        let wire = update.get("ops").expect("keyed");
        if let Value::Array(tuples) = wire {
            for tuple in tuples {
                let verb = match tuple {
                    Value::Array(t) => t.first(),
                    _ => None,
                };
                match verb {
                    Some(Value::Text(v)) if VERBS.contains(&v.as_str()) => {}
                    other => {
                        return Err(format!(
                            "{service}: op verb {other:?} (chord 0.85.1 refuses it)"
                        ));
                    }
                }
            }
        }
        let decoded = self
            .decoder
            .decode(wire)
            .map_err(|e| format!("{service}: sequence {next} does not decode: {}", e.0))?;
        ops::apply_all(value, &decoded)
            .map_err(|e| format!("{service}: sequence {next} does not apply: {e}"))?;
        *sequence = next;
        Ok(())
    }
}
