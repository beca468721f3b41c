//! The chord service layer that pi protocol v8 carries, sans-IO.
//!
//! - [`ops`]: replicated-state ops, applying them, and the diff that
//!   makes a change a few small ops.
//! - [`wire`]: the WireOp encoding of one state stream (path ids, short
//!   forms), and its decoder.
//! - [`call`]: service calls, the `$chord.service` control calls, errors.
//! - this module: replicated states with their sequence, and the
//!   subscription snapshots and updates built from them.
//!
//! Only what chord 0.85.1 accepts is produced: the ops `r s d a t p #` and
//! the updates `state unavailable replaced spawned closed`; never `m` or
//! `reset`, which would make the published client drop the connection.

pub mod call;
pub mod ops;
pub mod wire;

use crate::wire::Value;
use call::Mode;
use ops::Op;

/// One replicated state: its current value and how many publications made it.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    value: Value,
    sequence: u64,
}

impl State {
    /// A state at sequence 0.
    pub fn new(value: Value) -> Self {
        Self { value, sequence: 0 }
    }

    /// The current value.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Publications so far: a snapshot carries it, the next update carries it + 1.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Moves to `next`: returns the ops of the publication, or `None` when
    /// nothing changed (no publication, the sequence stays).
    pub fn publish(&mut self, next: Value) -> Option<Vec<Op>> {
        let ops = ops::diff_root(&self.value, &next);
        if ops.is_empty() {
            return None;
        }
        debug_assert!(
            {
                let mut applied = self.value.clone();
                ops::apply_all(&mut applied, &ops).is_ok() && applied.same_as(&next)
            },
            "the diff does not reproduce the next value"
        );
        self.value = next;
        self.sequence += 1;
        Some(ops)
    }

    /// Applies ops the caller made itself (cheaper than a diff: nothing
    /// is copied): one publication. Should one not apply, the value is
    /// left part-changed and the error says so: publish it whole then
    /// ([`State::replace`]), as subscribers cannot follow the ops.
    pub fn apply(&mut self, ops: &[Op]) -> Result<(), ops::OpError> {
        self.sequence += 1;
        ops::apply_all(&mut self.value, ops)
    }

    /// Moves to `value` by one `r` op: the publication that resets every
    /// subscriber's replica.
    pub fn replace(&mut self, value: Value) -> Vec<Op> {
        self.value = value.clone();
        self.sequence += 1;
        vec![Op::Replace(value)]
    }
}

/// A member of a service as a snapshot describes it.
#[derive(Debug, Clone, Copy)]
pub enum Member<'a> {
    /// A callable member.
    Method(&'a str),
    /// A state member and its state.
    State(&'a str, &'a State),
}

impl Member<'_> {
    fn name(&self) -> &str {
        match self {
            Self::Method(n) | Self::State(n, _) => n,
        }
    }
}

/// The members of one instance, sorted by name as the provider sorts them.
/// Each state member is one `r` op at its current sequence.
pub fn instance_snapshot(members: &[Member<'_>]) -> Value {
    let mut sorted: Vec<&Member<'_>> = members.iter().collect();
    sorted.sort_by(|a, b| a.name().cmp(b.name()));
    let members = sorted
        .into_iter()
        .map(|m| match m {
            Member::Method(name) => Value::object(vec![
                ("name", Value::text(*name)),
                ("kind", Value::text("method")),
            ]),
            Member::State(name, state) => Value::object(vec![
                ("name", Value::text(*name)),
                ("kind", Value::text("state")),
                ("sequence", Value::Int(state.sequence() as i64)),
                (
                    "ops",
                    Value::Array(vec![Value::Array(vec![
                        Value::text("r"),
                        state.value().clone(),
                    ])]),
                ),
            ]),
        })
        .collect();
    Value::object(vec![("members", Value::Array(members))])
}

/// A singleton's subscription snapshot: exactly one instance, no address.
pub fn singleton_snapshot(service_id: &str, members: &[Member<'_>]) -> Value {
    Value::object(vec![
        ("serviceId", Value::text(service_id)),
        ("mode", Value::text(Mode::Singleton.as_str())),
        ("instances", Value::Array(vec![instance_snapshot(members)])),
    ])
}

/// Writes [`singleton_snapshot`]'s bytes with `e`, each state's value
/// encoded where it stands instead of copied into a tree (a transcript's
/// state may be large). `depth` is how deep the message nests the snapshot.
pub fn write_singleton_snapshot(
    e: &mut crate::wire::cbor::Encoder<'_, '_>,
    service_id: &str,
    members: &[Member<'_>],
    depth: usize,
) -> Result<(), crate::wire::CborError> {
    let mut sorted: Vec<&Member<'_>> = members.iter().collect();
    sorted.sort_by(|a, b| a.name().cmp(b.name()));
    e.map_header(3)?;
    e.text("serviceId")?;
    e.text(service_id)?;
    e.text("mode")?;
    e.text(Mode::Singleton.as_str())?;
    e.text("instances")?;
    e.array_header(1)?;
    e.map_header(1)?;
    e.text("members")?;
    e.array_header(sorted.len())?;
    for member in sorted {
        match member {
            Member::Method(name) => {
                e.map_header(2)?;
                e.text("name")?;
                e.text(name)?;
                e.text("kind")?;
                e.text("method")?;
            }
            Member::State(name, state) => {
                e.map_header(4)?;
                e.text("name")?;
                e.text(name)?;
                e.text("kind")?;
                e.text("state")?;
                e.text("sequence")?;
                e.uint(state.sequence())?;
                e.text("ops")?;
                e.array_header(1)?;
                e.array_header(2)?;
                e.text("r")?;
                // serviceId map, instances, instance, members, member, ops, op.
                e.nested_item(state.value(), depth + 7)?;
            }
        }
    }
    Ok(())
}

/// A `state` update of a singleton: one publication of one member.
pub fn state_update(member: &str, sequence: u64, ops: Value) -> Value {
    Value::object(vec![
        ("type", Value::text("state")),
        ("member", Value::text(member)),
        ("sequence", Value::Int(sequence as i64)),
        ("ops", ops),
    ])
}

/// The `$chord.service.catalogue` result: `[{serviceId, mode}]`.
pub fn catalogue(services: &[(&str, Mode)]) -> Value {
    Value::Array(
        services
            .iter()
            .map(|(id, mode)| {
                Value::object(vec![
                    ("serviceId", Value::text(*id)),
                    ("mode", Value::text(mode.as_str())),
                ])
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chord_path;

    #[test]
    fn a_state_publishes_what_changed_and_counts() {
        let mut state = State::new(Value::object(vec![("n", Value::Int(1))]));
        assert_eq!(state.publish(state.value().clone()), None);
        assert_eq!(state.sequence(), 0);
        let ops = state
            .publish(Value::object(vec![("n", Value::Int(2))]))
            .unwrap();
        assert_eq!(ops, vec![Op::Set(chord_path!["n"], Value::Int(2))]);
        assert_eq!(state.sequence(), 1);
    }

    #[test]
    fn snapshot_members_are_sorted_with_one_replace_each() {
        let state = State::new(Value::Int(7));
        let snapshot = singleton_snapshot(
            "svc",
            &[
                Member::Method("zeta"),
                Member::State("state", &state),
                Member::Method("alpha"),
            ],
        );
        let members = snapshot.get("instances").unwrap();
        let Value::Array(instances) = members else {
            panic!()
        };
        let Some(Value::Array(members)) = instances[0].get("members") else {
            panic!()
        };
        let names: Vec<&Value> = members.iter().map(|m| m.get("name").unwrap()).collect();
        assert_eq!(
            names,
            [
                &Value::text("alpha"),
                &Value::text("state"),
                &Value::text("zeta")
            ]
        );
        assert_eq!(
            members[1].get("ops"),
            Some(&Value::Array(vec![Value::Array(vec![
                Value::text("r"),
                Value::Int(7)
            ])]))
        );
    }
}
