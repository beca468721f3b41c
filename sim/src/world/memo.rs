//! Parts of the model checker's fingerprint, hashed once per change.
//!
//! A state's fingerprint hashes the `Debug` text of the kernel, the store,
//! every fake worker and every queued message. Most of that text is the
//! same as the parent state's: a step changes the server and one worker,
//! and leaves the store and the other queues alone. A [`Memo`] keeps the
//! hash of its value's text until the value is next borrowed mutably, so a
//! part that did not change costs one word, not its text, and a state
//! cloned for a sibling branch carries the hashes already made.
//!
//! The value itself is shared between the clones (copy on write): the
//! explorer clones a state for every sibling branch, and most branches
//! leave most parts (the store's transcripts, queued snapshots, idle
//! workers) as they were.

use crate::prng::WordHash;
use std::cell::Cell;
use std::fmt;
use std::hash::Hasher;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// A value and the hash of its fingerprint text, made when first asked for
/// and forgotten on every mutable borrow ([`DerefMut`]): the only way to
/// change the value, so a kept hash is always the value's. Clones share the
/// value until one of them borrows it mutably.
#[derive(Clone)]
pub struct Memo<T> {
    value: Arc<T>,
    hash: Cell<Option<u64>>,
}

impl<T> Memo<T> {
    /// Wraps `value`, with no hash made yet.
    pub fn new(value: T) -> Self {
        Self {
            value: Arc::new(value),
            hash: Cell::new(None),
        }
    }

    /// The hash of the text `write` makes of the value, made once per
    /// change. Every call on one memo must pass the same `write`.
    pub fn hash_with(&self, write: impl FnOnce(&T, &mut HashWrite<'_, WordHash>)) -> u64 {
        if let Some(hash) = self.hash.get() {
            return hash;
        }
        let mut hasher = WordHash::default();
        write(&self.value, &mut HashWrite(&mut hasher));
        let hash = hasher.finish();
        self.hash.set(Some(hash));
        hash
    }
}

impl<T: fmt::Debug> Memo<T> {
    /// The hash of the value's `Debug` text, made once per change.
    pub fn hash(&self) -> u64 {
        self.hash_with(|value, out| {
            let _ = fmt::Write::write_fmt(out, format_args!("{value:?}"));
        })
    }
}

impl<T> Deref for Memo<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Clone> Memo<T> {
    /// The value, unwrapped (copied if a clone still shares it).
    pub fn into_inner(self) -> T {
        Arc::try_unwrap(self.value).unwrap_or_else(|shared| T::clone(&shared))
    }
}

impl<T: Clone> DerefMut for Memo<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.hash.set(None);
        Arc::make_mut(&mut self.value)
    }
}

impl<T: fmt::Debug> fmt::Debug for Memo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: Default> Default for Memo<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

/// Feeds formatted text straight into a hasher.
pub struct HashWrite<'a, H>(pub &'a mut H);

impl<H: Hasher> fmt::Write for HashWrite<'_, H> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutable_borrow_forgets_the_hash() {
        let mut memo = Memo::new(vec![1, 2]);
        let before = memo.hash();
        assert_eq!(memo.hash(), before, "kept while unchanged");
        memo.push(3);
        let after = memo.hash();
        assert_ne!(after, before);
        assert_eq!(
            after,
            Memo::new(vec![1, 2, 3]).hash(),
            "the new value's hash"
        );
        let mut copy = memo.clone();
        assert_eq!(copy.hash(), after, "a clone carries the hash");
        copy.push(4);
        assert_eq!(*memo, [1, 2, 3], "a clone's change is its own");
        assert_eq!(memo.hash(), after);
    }
}
