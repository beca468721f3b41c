//! The short run of a fuzz target on the stable toolchain, for CI: every
//! input of its kept corpus, then seeded mutations of them (bit flips, byte
//! changes, cuts, insertions and splices). Included by the tests that run
//! the targets (`kernel/tests/fuzz_corpus.rs`, the ACP adapter's tests).

use std::path::Path;

/// xorshift64*: the mutations are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a corpus file");
            (path.display().to_string(), bytes)
        })
        .collect();
    inputs.sort();
    inputs.into_iter().map(|(_, bytes)| bytes).collect()
}

fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = [0x00, 0xff, 0x7f, 0x80, 0x18, 0x1b, 0xa1, 0x9f][rng.below(8)];
            }
            2 if !out.is_empty() => {
                let i = rng.below(out.len());
                out.truncate(i);
            }
            3 => {
                let i = rng.below(out.len() + 1);
                out.insert(i, rng.next() as u8);
            }
            4 if !out.is_empty() => {
                let i = rng.below(out.len());
                let n = rng.below(out.len() - i) + 1;
                out.drain(i..i + n);
            }
            _ if !other.is_empty() => {
                let i = rng.below(out.len() + 1);
                let j = rng.below(other.len());
                out.splice(i..i, other[j..].iter().copied());
            }
            _ => {}
        }
    }
    out
}

/// Runs `target` over the corpus in `dir` and `mutations` mutations of it.
pub(crate) fn short_run(dir: &Path, mutations: usize, target: impl Fn(&[u8])) {
    let inputs = corpus(dir);
    assert!(!inputs.is_empty(), "{}: an empty corpus", dir.display());
    for input in &inputs {
        target(input);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ inputs.len() as u64);
    for _ in 0..mutations {
        let input = &inputs[rng.below(inputs.len())];
        let other = &inputs[rng.below(inputs.len())];
        target(&mutate(&mut rng, input, other));
    }
}
