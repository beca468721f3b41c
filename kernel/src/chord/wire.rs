//! chord's WireOp encoding of one state stream: path ids and short forms.
//!
//! - A path used explicitly for the second time is given an id: the
//!   encoder emits `["#", id, path]` and then the op with the id in the
//!   path's place. Ids count from 0 per stream and live until an `r`.
//! - An op whose path is the previous op's within the same batch omits it
//!   (`["s", v]`, `["d"]`, `["a", text]`, `["t", n]`, `["p", i, r, items]`);
//!   the decoder tells the forms apart by arity. `#` does not change the
//!   previous path; a batch's start and an `r` clear it.
//!
//! One [`Encoder`] per (subscription, instance, generation, member), reset
//! whenever its subscriber is sent a snapshot. The [`Decoder`] is the
//! client's half, for tests and the simulator's replicas.

use super::ops::{Op, Path, Seg};
use crate::wire::Value;
use std::collections::BTreeMap;

/// How often a path was used explicitly, or the id it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Once,
    Id(u64),
}

/// The sending side of one state stream. Two encoders that are equal
/// encode the next batch alike: a publication is encoded once per such
/// group of subscribers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoder {
    paths: BTreeMap<Path, Use>,
    next_id: u64,
}

impl Encoder {
    /// A fresh stream (as after a snapshot).
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes one batch (one publication) as a wire `ops` array.
    pub fn encode(&mut self, ops: &[Op]) -> Value {
        let mut wire = Vec::with_capacity(ops.len());
        let mut previous: Option<&Path> = None;
        for op in ops {
            let Some(path) = op.path() else {
                // `r` resets the dictionary and the previous path.
                self.paths.clear();
                self.next_id = 0;
                previous = None;
                wire.push(tuple("r", None, op));
                continue;
            };
            if previous == Some(path) {
                wire.push(tuple(op.verb(), None, op));
                continue;
            }
            let reference = match self.paths.get(path).copied() {
                Some(Use::Id(id)) => Value::Int(id as i64),
                Some(Use::Once) => {
                    let id = self.next_id;
                    self.next_id += 1;
                    self.paths.insert(path.clone(), Use::Id(id));
                    wire.push(Value::Array(vec![
                        Value::text("#"),
                        Value::Int(id as i64),
                        path_value(path),
                    ]));
                    Value::Int(id as i64)
                }
                None => {
                    self.paths.insert(path.clone(), Use::Once);
                    path_value(path)
                }
            };
            wire.push(tuple(op.verb(), Some(reference), op));
            previous = Some(path);
        }
        Value::Array(wire)
    }
}

/// The wire tuple of `op`, with `path` in the path's place or (short form) none.
fn tuple(verb: &str, path: Option<Value>, op: &Op) -> Value {
    let mut t = vec![Value::text(verb)];
    t.extend(path);
    match op {
        Op::Replace(v) | Op::Set(_, v) => t.push(v.clone()),
        Op::Delete(_) => {}
        Op::Append(_, text) => t.push(Value::text(text.clone())),
        Op::Trim(_, n) => t.push(Value::Int(*n as i64)),
        Op::Splice(_, index, remove, items) => {
            t.push(Value::Int(*index as i64));
            t.push(Value::Int(*remove as i64));
            t.push(Value::Array(items.clone()));
        }
    }
    Value::Array(t)
}

/// A path as a JSON array of keys and indices.
pub fn path_value(path: &Path) -> Value {
    Value::Array(
        path.iter()
            .map(|s| match s {
                Seg::Key(k) => Value::text(k.clone()),
                Seg::Index(i) => Value::Int(*i as i64),
            })
            .collect(),
    )
}

/// Why a wire batch does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

/// The receiving side of one state stream.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    ids: BTreeMap<u64, Path>,
}

impl Decoder {
    /// A fresh stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one batch.
    pub fn decode(&mut self, batch: &Value) -> Result<Vec<Op>, WireError> {
        let Value::Array(tuples) = batch else {
            return Err(WireError("ops must be an array".into()));
        };
        let mut ops = Vec::with_capacity(tuples.len());
        let mut previous: Option<Path> = None;
        for t in tuples {
            let Value::Array(t) = t else {
                return Err(WireError("an op must be an array".into()));
            };
            let Some(Value::Text(verb)) = t.first() else {
                return Err(WireError("an op starts with its verb".into()));
            };
            let rest = &t[1..];
            let long = match (verb.as_str(), rest.len()) {
                ("#", 2) => {
                    let id = uint(&rest[0])?;
                    let path = self.path(&rest[1])?;
                    self.ids.insert(id, path);
                    continue;
                }
                ("r", 1) => {
                    self.ids.clear();
                    previous = None;
                    ops.push(Op::Replace(rest[0].clone()));
                    continue;
                }
                ("s" | "a" | "t", 1) | ("d", 0) | ("p", 3) => false,
                ("s" | "a" | "t", 2) | ("d", 1) | ("p", 4) => true,
                _ => {
                    return Err(WireError(format!(
                        "bad op {verb:?} of arity {}",
                        rest.len()
                    )));
                }
            };
            let (path, args) = if long {
                (self.path(&rest[0])?, &rest[1..])
            } else {
                let path = previous
                    .clone()
                    .ok_or_else(|| WireError("a short op with no previous path".into()))?;
                (path, rest)
            };
            previous = Some(path.clone());
            ops.push(match verb.as_str() {
                "s" => Op::Set(path, args[0].clone()),
                "d" => Op::Delete(path),
                "a" => match &args[0] {
                    Value::Text(s) => Op::Append(path, s.clone()),
                    _ => return Err(WireError("append takes a string".into())),
                },
                "t" => Op::Trim(path, uint(&args[0])? as usize),
                _ => match &args[2] {
                    Value::Array(items) => Op::Splice(
                        path,
                        uint(&args[0])? as usize,
                        uint(&args[1])? as usize,
                        items.clone(),
                    ),
                    _ => return Err(WireError("splice items must be an array".into())),
                },
            });
        }
        Ok(ops)
    }

    fn path(&self, reference: &Value) -> Result<Path, WireError> {
        match reference {
            Value::Int(id) if *id >= 0 => self
                .ids
                .get(&(*id as u64))
                .cloned()
                .ok_or_else(|| WireError(format!("unknown path id {id}"))),
            Value::Array(segs) => segs
                .iter()
                .map(|s| match s {
                    Value::Text(k) => Ok(Seg::Key(k.clone())),
                    Value::Int(i) if *i >= 0 => Ok(Seg::Index(*i as usize)),
                    _ => Err(WireError("a path segment is a key or an index".into())),
                })
                .collect(),
            _ => Err(WireError("a path is an array or an id".into())),
        }
    }
}

fn uint(v: &Value) -> Result<u64, WireError> {
    match v {
        Value::Int(n) if *n >= 0 => Ok(*n as u64),
        _ => Err(WireError("expected a non-negative integer".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chord_path;

    fn render(v: &Value) -> String {
        match v {
            Value::Null => "null".into(),
            Value::Int(n) => n.to_string(),
            Value::Text(s) => format!("{s:?}"),
            Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(render).collect();
                format!("[{}]", parts.join(","))
            }
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn second_use_interns_and_short_forms_stay_within_a_batch() {
        let mut enc = Encoder::new();
        let entries = chord_path!["entries"];
        let first = enc.encode(&[Op::Splice(entries.clone(), 0, 0, vec![Value::Int(1)])]);
        assert_eq!(render(&first), r#"[["p",["entries"],0,0,[1]]]"#);
        // The second batch's first use is the path's second: `#` then the id
        // (the published server's own wire, pi-v8.md §2.5).
        let second = enc.encode(&[
            Op::Splice(entries.clone(), 1, 0, vec![Value::Int(2)]),
            Op::Splice(entries.clone(), 2, 0, vec![Value::Int(3)]),
            Op::Append(chord_path!["t"], "x".into()),
            Op::Delete(chord_path!["t"]),
        ]);
        assert_eq!(
            render(&second),
            r##"[["#",0,["entries"]],["p",0,1,0,[2]],["p",2,0,[3]],["a",["t"],"x"],["d"]]"##
        );
        let third = enc.encode(&[
            Op::Splice(entries.clone(), 3, 0, vec![]),
            Op::Replace(Value::Null),
            Op::Set(chord_path!["entries"], Value::Int(0)),
        ]);
        assert_eq!(
            render(&third),
            r#"[["p",0,3,0,[]],["r",null],["s",["entries"],0]]"#
        );
    }

    #[test]
    fn decoder_inverts_encoder() {
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        let batches = vec![
            vec![Op::Set(chord_path!["a"], Value::Int(1))],
            vec![
                Op::Set(chord_path!["a"], Value::Int(2)),
                Op::Set(chord_path!["a"], Value::Int(3)),
                Op::Trim(chord_path!["b", 0], 1),
                Op::Delete(chord_path!["b", 0]),
            ],
            vec![
                Op::Replace(Value::text("x")),
                Op::Append(chord_path!["a"], "y".into()),
            ],
            vec![
                Op::Append(chord_path!["a"], "z".into()),
                Op::Splice(vec![], 0, 1, vec![]),
            ],
        ];
        for batch in batches {
            let wire = enc.encode(&batch);
            assert_eq!(dec.decode(&wire).unwrap(), batch, "{}", render(&wire));
        }
    }
}
