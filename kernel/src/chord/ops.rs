//! Replicated-state ops (chord's `applyOps` vocabulary), applying them, and
//! the diff that turns one value into the next as a few small ops.
//!
//! A replicated state is a JSON value ([`Value`] without byte strings). It
//! changes only by [`Op`]s: `r` replaces the root, `s` sets, `d` deletes an
//! object key or an array element, `a` appends text, `t` drops UTF-16 code
//! units from the front of a string, and `p` splices an array. chord 0.85.1
//! accepts exactly these; the later `m` (reorder) is never produced here.

use crate::wire::Value;

/// One step of a path: an object key or an array index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seg {
    /// An object key.
    Key(String),
    /// An array index.
    Index(usize),
}

impl From<&str> for Seg {
    fn from(key: &str) -> Self {
        Self::Key(key.to_string())
    }
}

impl From<usize> for Seg {
    fn from(index: usize) -> Self {
        Self::Index(index)
    }
}

/// A path from the root of a state value.
pub type Path = Vec<Seg>;

/// Builds a [`Path`] from keys and indices: `path!["docs", "pi.live"]`.
#[macro_export]
macro_rules! chord_path {
    ($($seg:expr),* $(,)?) => {
        vec![$($crate::chord::ops::Seg::from($seg)),*]
    };
}

/// One change to a replicated state, in decoded form.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `["r", value]`: replace the root.
    Replace(Value),
    /// `["s", path, value]`: set a key, or an index up to the array's length.
    Set(Path, Value),
    /// `["d", path]`: delete a key, or splice out an array element.
    Delete(Path),
    /// `["a", path, text]`: append to a string.
    Append(Path, String),
    /// `["t", path, n]`: drop `n` UTF-16 code units from a string's front.
    Trim(Path, usize),
    /// `["p", path, index, remove, items]`: splice an array (the root too).
    Splice(Path, usize, usize, Vec<Value>),
}

impl Op {
    /// The op's verb on the wire.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Replace(_) => "r",
            Self::Set(..) => "s",
            Self::Delete(_) => "d",
            Self::Append(..) => "a",
            Self::Trim(..) => "t",
            Self::Splice(..) => "p",
        }
    }

    /// The path it targets (`None` for `r`).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Replace(_) => None,
            Self::Set(p, _)
            | Self::Delete(p)
            | Self::Append(p, _)
            | Self::Trim(p, _)
            | Self::Splice(p, ..) => Some(p),
        }
    }
}

/// Why an op does not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError(pub String);

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Keys chord refuses to mutate through (`UnsafePathError`).
const RESERVED: [&str; 3] = ["__proto__", "constructor", "prototype"];

/// Applies one op to `root`, as chord's `applyOps` does.
pub fn apply(root: &mut Value, op: &Op) -> Result<(), OpError> {
    if let Some(path) = op.path()
        && let Some(bad) = path
            .iter()
            .find(|s| matches!(s, Seg::Key(k) if RESERVED.contains(&k.as_str())))
    {
        return Err(OpError(format!("reserved path segment {bad:?}")));
    }
    match op {
        Op::Replace(value) => {
            *root = value.clone();
            Ok(())
        }
        Op::Splice(path, index, remove, items) => {
            let Value::Array(array) = resolve(root, path)? else {
                return Err(OpError(format!("splice of a non-array at {path:?}")));
            };
            if *index > array.len() || index + remove > array.len() {
                return Err(OpError(format!(
                    "splice {index}+{remove} out of bounds ({}) at {path:?}",
                    array.len()
                )));
            }
            array.splice(index..&(index + remove), items.iter().cloned());
            Ok(())
        }
        Op::Set(path, value) => {
            let (parent, last) = parent_of(root, path)?;
            match (parent, last) {
                (Value::Map(entries), Seg::Key(key)) => {
                    match entries.iter_mut().find(|(k, _)| k == key) {
                        Some((_, slot)) => *slot = value.clone(),
                        None => entries.push((key.clone(), value.clone())),
                    }
                    Ok(())
                }
                (Value::Array(items), Seg::Index(i)) if *i < items.len() => {
                    items[*i] = value.clone();
                    Ok(())
                }
                (Value::Array(items), Seg::Index(i)) if *i == items.len() => {
                    items.push(value.clone());
                    Ok(())
                }
                _ => Err(OpError(format!("set of {path:?} does not fit its parent"))),
            }
        }
        Op::Delete(path) => {
            let (parent, last) = parent_of(root, path)?;
            match (parent, last) {
                (Value::Map(entries), Seg::Key(key)) => {
                    entries.retain(|(k, _)| k != key);
                    Ok(())
                }
                (Value::Array(items), Seg::Index(i)) if *i < items.len() => {
                    items.remove(*i);
                    Ok(())
                }
                _ => Err(OpError(format!(
                    "delete of {path:?} does not fit its parent"
                ))),
            }
        }
        Op::Append(path, text) => match resolve_leaf(root, path)? {
            Value::Text(s) => {
                s.push_str(text);
                Ok(())
            }
            _ => Err(OpError(format!("append to a non-string at {path:?}"))),
        },
        Op::Trim(path, n) => match resolve_leaf(root, path)? {
            Value::Text(s) => {
                let cut = utf16_offset(s, *n)
                    .ok_or_else(|| OpError(format!("trim {n} past the end at {path:?}")))?;
                s.drain(..cut);
                Ok(())
            }
            _ => Err(OpError(format!("trim of a non-string at {path:?}"))),
        },
    }
}

/// Applies a batch in order, stopping at the first op that does not apply.
pub fn apply_all(root: &mut Value, ops: &[Op]) -> Result<(), OpError> {
    ops.iter().try_for_each(|op| apply(root, op))
}

/// The byte offset in `s` after its first `units` UTF-16 code units, if
/// that falls on a character boundary within the string.
fn utf16_offset(s: &str, units: usize) -> Option<usize> {
    let mut counted = 0;
    for (offset, c) in s.char_indices() {
        if counted == units {
            return Some(offset);
        }
        counted += c.len_utf16();
    }
    (counted == units).then_some(s.len())
}

fn resolve<'v>(root: &'v mut Value, path: &[Seg]) -> Result<&'v mut Value, OpError> {
    let mut at = root;
    for seg in path {
        at = match (at, seg) {
            (Value::Map(entries), Seg::Key(key)) => entries
                .iter_mut()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .ok_or_else(|| OpError(format!("no key {key:?} on {path:?}")))?,
            (Value::Array(items), Seg::Index(i)) => items
                .get_mut(*i)
                .ok_or_else(|| OpError(format!("no index {i} on {path:?}")))?,
            _ => return Err(OpError(format!("path {path:?} does not fit the value"))),
        };
    }
    Ok(at)
}

fn resolve_leaf<'v>(root: &'v mut Value, path: &[Seg]) -> Result<&'v mut Value, OpError> {
    if path.is_empty() {
        return Err(OpError("this op cannot target the root".into()));
    }
    resolve(root, path)
}

fn parent_of<'v, 'p>(
    root: &'v mut Value,
    path: &'p [Seg],
) -> Result<(&'v mut Value, &'p Seg), OpError> {
    let Some((last, parent)) = path.split_last() else {
        return Err(OpError("this op cannot target the root".into()));
    };
    Ok((resolve(root, parent)?, last))
}

/// Appends to `out` the ops that turn `old` (at `path`) into `new`: maps
/// key by key, an array as one splice of what lies between its common
/// prefix and suffix (or, when one element changed in place, the ops
/// inside it), a string that grew at its end as an append, anything else
/// as a set. The ops apply to `old` in order ([`apply_all`]).
pub fn diff(old: &Value, new: &Value, path: &mut Path, out: &mut Vec<Op>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Map(before), Value::Map(after)) => {
            for (key, _) in before {
                if !after.iter().any(|(k, _)| k == key) {
                    let mut p = path.clone();
                    p.push(Seg::Key(key.clone()));
                    out.push(Op::Delete(p));
                }
            }
            for (key, value) in after {
                path.push(Seg::Key(key.clone()));
                match before.iter().find(|(k, _)| k == key) {
                    Some((_, was)) => diff(was, value, path, out),
                    None => out.push(Op::Set(path.clone(), value.clone())),
                }
                path.pop();
            }
        }
        (Value::Array(before), Value::Array(after)) => {
            let prefix = before.iter().zip(after).take_while(|(a, b)| a == b).count();
            let room = before.len().min(after.len()) - prefix;
            let suffix = before
                .iter()
                .rev()
                .zip(after.iter().rev())
                .take(room)
                .take_while(|(a, b)| a == b)
                .count();
            let removed = before.len() - prefix - suffix;
            let added = &after[prefix..after.len() - suffix];
            if removed == 1 && added.len() == 1 && nests(&before[prefix], &added[0]) {
                path.push(Seg::Index(prefix));
                diff(&before[prefix], &added[0], path, out);
                path.pop();
            } else {
                out.push(Op::Splice(path.clone(), prefix, removed, added.to_vec()));
            }
        }
        (Value::Text(before), Value::Text(after))
            if !path.is_empty() && after.starts_with(before.as_str()) =>
        {
            out.push(Op::Append(path.clone(), after[before.len()..].to_string()));
        }
        _ if path.is_empty() => out.push(Op::Replace(new.clone())),
        _ => out.push(Op::Set(path.clone(), new.clone())),
    }
}

/// Whether a changed array element is diffed inside rather than replaced:
/// two maps, two arrays, or a string that grew.
fn nests(old: &Value, new: &Value) -> bool {
    match (old, new) {
        (Value::Map(_), Value::Map(_)) | (Value::Array(_), Value::Array(_)) => true,
        (Value::Text(a), Value::Text(b)) => b.starts_with(a.as_str()),
        _ => false,
    }
}

/// The ops from `old` to `new`, from the root.
pub fn diff_root(old: &Value, new: &Value) -> Vec<Op> {
    let mut out = Vec::new();
    diff(old, new, &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, Value)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    fn int(n: i64) -> Value {
        Value::Int(n)
    }

    #[test]
    fn each_op_applies_as_chord_does() {
        let mut v = map(&[
            ("a", Value::Array(vec![int(1), int(2)])),
            ("t", Value::text("héllo")),
        ]);
        apply(&mut v, &Op::Set(chord_path!["a", 2], int(3))).unwrap();
        apply(&mut v, &Op::Delete(chord_path!["a", 0])).unwrap();
        apply(&mut v, &Op::Append(chord_path!["t"], "!".into())).unwrap();
        apply(&mut v, &Op::Trim(chord_path!["t"], 2)).unwrap();
        apply(
            &mut v,
            &Op::Splice(chord_path!["a"], 1, 1, vec![int(7), int(8)]),
        )
        .unwrap();
        apply(&mut v, &Op::Set(chord_path!["n"], Value::Null)).unwrap();
        assert_eq!(
            v,
            map(&[
                ("a", Value::Array(vec![int(2), int(7), int(8)])),
                ("t", Value::text("llo!")),
                ("n", Value::Null),
            ])
        );
        apply(&mut v, &Op::Delete(chord_path!["n"])).unwrap();
        assert!(v.get("n").is_none());
    }

    #[test]
    fn bad_ops_are_refused() {
        let mut v = map(&[("a", Value::Array(vec![int(1)])), ("t", Value::text("x"))]);
        let bad = [
            Op::Set(chord_path!["a", 5], int(1)),
            Op::Splice(chord_path!["a"], 2, 0, vec![]),
            Op::Splice(chord_path!["a"], 0, 2, vec![]),
            Op::Append(vec![], "x".into()),
            Op::Append(chord_path!["a"], "x".into()),
            Op::Trim(chord_path!["t"], 2),
            Op::Set(chord_path!["__proto__"], int(1)),
            Op::Delete(chord_path!["missing", "deeper"]),
        ];
        for op in bad {
            let before = v.clone();
            assert!(apply(&mut v, &op).is_err(), "{op:?} applied");
            assert_eq!(v, before, "{op:?} changed the value");
        }
    }

    #[test]
    fn trim_counts_utf16_code_units() {
        let mut v = map(&[("t", Value::text("😀ab"))]);
        assert!(
            apply(&mut v, &Op::Trim(chord_path!["t"], 1)).is_err(),
            "half a pair"
        );
        apply(&mut v, &Op::Trim(chord_path!["t"], 2)).unwrap();
        assert_eq!(v.get("t"), Some(&Value::text("ab")));
    }

    #[test]
    fn diff_is_small_and_applies() {
        let entry = |i: i64, text: &str| map(&[("id", int(i)), ("text", Value::text(text))]);
        let old = map(&[
            ("revision", int(1)),
            ("entries", Value::Array(vec![entry(1, "a"), entry(2, "b")])),
            ("gone", Value::Bool(true)),
        ]);
        let new = map(&[
            ("revision", int(2)),
            (
                "entries",
                Value::Array(vec![entry(1, "a"), entry(2, "bc"), entry(3, "d")]),
            ),
        ]);
        let ops = diff_root(&old, &new);
        assert_eq!(
            ops,
            vec![
                Op::Delete(chord_path!["gone"]),
                Op::Set(chord_path!["revision"], int(2)),
                Op::Splice(
                    chord_path!["entries"],
                    1,
                    1,
                    vec![entry(2, "bc"), entry(3, "d")]
                ),
            ]
        );
        let mut applied = old.clone();
        apply_all(&mut applied, &ops).unwrap();
        assert_eq!(applied, new);

        // One element changed in place: the ops reach inside it.
        let grown = map(&[
            ("revision", int(2)),
            (
                "entries",
                Value::Array(vec![entry(1, "a"), entry(2, "bcde"), entry(3, "d")]),
            ),
        ]);
        assert_eq!(
            diff_root(&new, &grown),
            vec![Op::Append(chord_path!["entries", 1, "text"], "de".into())]
        );
        assert_eq!(diff_root(&int(1), &int(2)), vec![Op::Replace(int(2))]);
    }
}
