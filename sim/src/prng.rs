//! The simulator's only source of randomness: a seeded SplitMix64 generator
//! with the few helpers the swarm needs (ratios, ranges, picks, sub-seeds).
//!
//! Self-contained on purpose: a run is a pure function of its seed, whatever
//! the platform, the Rust version or the order in which a hash map iterates.

use std::fmt;

/// A probability as an exact fraction (`numerator / denominator`), as in
/// TigerBeetle's `Ratio`. Printed as `3/100`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ratio {
    /// Chances in favour.
    pub numerator: u32,
    /// Chances in all (never zero).
    pub denominator: u32,
}

impl Ratio {
    /// Never happens.
    pub const NEVER: Self = Self {
        numerator: 0,
        denominator: 1,
    };
    /// Always happens.
    pub const ALWAYS: Self = Self {
        numerator: 1,
        denominator: 1,
    };

    /// `numerator / denominator`, at most one.
    pub fn new(numerator: u32, denominator: u32) -> Self {
        assert!(denominator > 0, "a ratio needs a denominator");
        assert!(numerator <= denominator, "a probability is at most one");
        Self {
            numerator,
            denominator,
        }
    }

    /// True when it can happen at all.
    pub fn is_possible(self) -> bool {
        self.numerator > 0
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.numerator, self.denominator)
    }
}

/// The simulator's choices, drawn from the kernel's own SplitMix64
/// ([`kernel::rng::Rng`]) with the helpers a driver needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Prng {
    inner: kernel::rng::Rng,
}

impl Prng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            inner: kernel::rng::Rng::new(seed),
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// A number in `0..count` (Lemire's multiply-shift; the bias is below 2^-32
    /// for the small counts used here).
    pub fn below(&mut self, count: u64) -> u64 {
        assert!(count > 0, "below(0) has no value");
        ((u128::from(self.next_u64()) * u128::from(count)) >> 64) as u64
    }

    /// A number in `min..=max`.
    pub fn range_inclusive(&mut self, min: u64, max: u64) -> u64 {
        assert!(min <= max, "empty range {min}..={max}");
        min + self.below(max - min + 1)
    }

    /// True with probability `ratio`.
    pub fn chance(&mut self, ratio: Ratio) -> bool {
        ratio.is_possible() && self.below(u64::from(ratio.denominator)) < u64::from(ratio.numerator)
    }

    /// True half of the time.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// A ratio `n/100` with `n` uniform in `0..=percent_max`.
    pub fn ratio_percent(&mut self, percent_max: u32) -> Ratio {
        Ratio::new(self.range_inclusive(0, u64::from(percent_max)) as u32, 100)
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        assert!(!items.is_empty(), "pick from nothing");
        &items[self.below(items.len() as u64) as usize]
    }

    /// An index chosen with the given weights (at least one positive).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        assert!(total > 0, "all weights are zero");
        let mut roll = self.below(total);
        for (index, weight) in weights.iter().enumerate() {
            if roll < u64::from(*weight) {
                return index;
            }
            roll -= u64::from(*weight);
        }
        unreachable!("roll below the total")
    }

    /// A sub-seed for an independent generator.
    pub fn fork(&mut self) -> u64 {
        self.next_u64()
    }
}

/// FNV-1a, 64 bits: a hasher whose output depends only on the bytes fed,
/// for trace and state fingerprints that must match across runs and builds.
#[derive(Debug, Clone)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A hasher for model-checking fingerprints: like [`Fnv`], its output
/// depends only on the bytes fed, but it mixes eight bytes at a time. The
/// fingerprint hashes megabytes of `Debug` text per thousand states, in
/// pieces of a few bytes, and FNV's one multiply per byte was a third of
/// the explorer's time.
///
/// Bytes are gathered in a 64-byte block (in order, whatever the split of
/// the calls); each full block is folded in as eight words, each with a
/// multiply and a rotation; the result is finished with the SplitMix64
/// avalanche.
#[derive(Debug, Clone)]
pub struct WordHash {
    state: u64,
    block: [u8; 64],
    /// Bytes gathered in `block`.
    filled: usize,
    len: u64,
}

impl Default for WordHash {
    fn default() -> Self {
        Self {
            state: 0,
            block: [0; 64],
            filled: 0,
            len: 0,
        }
    }
}

impl WordHash {
    fn fold(&mut self, word: u64) {
        self.state = (self.state ^ word)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(31);
    }

    fn fold_words(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks_exact(8) {
            self.fold(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        }
    }
}

impl std::hash::Hasher for WordHash {
    fn finish(&self) -> u64 {
        let mut copy = self.clone();
        let filled = copy.filled;
        copy.block[filled..].fill(0);
        let block = copy.block;
        copy.fold_words(&block[..filled.div_ceil(8) * 8]);
        copy.fold(copy.len);
        let mut z = copy.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, mut bytes: &[u8]) {
        self.len = self.len.wrapping_add(bytes.len() as u64);
        if bytes.len() <= 8 && self.filled + bytes.len() < 64 {
            // Most pieces of `Debug` text are a few bytes: no copy call.
            for &byte in bytes {
                self.block[self.filled] = byte;
                self.filled += 1;
            }
            return;
        }
        while !bytes.is_empty() {
            let take = bytes.len().min(64 - self.filled);
            self.block[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == 64 {
                let block = self.block;
                self.fold_words(&block);
                self.filled = 0;
            }
        }
    }
}

/// The FNV-1a hash of a string.
pub fn fnv(text: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = Fnv::default();
    h.write(text.as_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_hash_depends_on_the_bytes_not_their_split() {
        use std::hash::Hasher;
        let text = b"the quick brown fox jumps over the lazy dog, twice over";
        let whole = {
            let mut h = WordHash::default();
            h.write(text);
            h.finish()
        };
        for split in [1, 3, 7, 8, 9, 20] {
            let mut h = WordHash::default();
            for piece in text.chunks(split) {
                h.write(piece);
            }
            assert_eq!(h.finish(), whole, "split into pieces of {split}");
        }
        let mut other = WordHash::default();
        other.write(b"the quick brown fox jumps over the lazy dog, twice over!");
        assert_ne!(other.finish(), whole);
        let mut shorter = WordHash::default();
        shorter.write(&text[..text.len() - 1]);
        assert_ne!(shorter.finish(), whole);
    }

    #[test]
    fn same_seed_same_sequence_and_ranges_hold() {
        let mut a = Prng::new(42);
        let mut b = Prng::new(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let x = a.range_inclusive(3, 7);
            assert!((3..=7).contains(&x));
            b.range_inclusive(3, 7);
        }
        assert!(!Prng::new(1).chance(Ratio::NEVER));
        assert!(Prng::new(1).chance(Ratio::ALWAYS));
        assert_eq!(Prng::new(9).weighted(&[0, 5, 0]), 1);
    }
}
