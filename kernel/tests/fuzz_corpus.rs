//! CI's short run of the fuzz targets (`kernel/fuzz`), on the stable
//! toolchain: each target's body runs over every input of its kept corpus
//! (`kernel/fuzz/corpus/<target>/`), then over seeded mutations of them
//! (bit flips, byte changes, cuts, insertions and splices). A panic is a
//! failure, as under libFuzzer; the long runs are cargo-fuzz's.

// The test reads its corpus from files; the targets it runs do no IO.
#![allow(clippy::disallowed_methods)]

#[allow(dead_code, unreachable_pub)]
#[path = "../fuzz/src/lib.rs"]
mod targets;

use std::path::Path;

#[path = "../fuzz/src/short.rs"]
mod short;

#[test]
fn every_target_survives_its_corpus_and_mutations_of_it() {
    let corpora = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for &(name, target) in targets::TARGETS {
        short::short_run(&corpora.join(name), 20_000, target);
    }
}
