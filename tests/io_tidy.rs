//! The hosts keep their bounds where a reader finds them: every wait and
//! queue bound of an io crate is a named constant in that crate's
//! `limits.rs` (or a field of `kernel::limits`), and no queue is unbounded.
//! Test code is exempt: it waits as it needs.

use std::fs;
use std::path::{Path, PathBuf};

/// The io crates' sources, test modules left out.
fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).expect("a source directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("io");
    let mut files = Vec::new();
    for krate in fs::read_dir(&root).expect("io/") {
        let src = krate.expect("an entry").path().join("src");
        if src.is_dir() {
            walk(&src, &mut files);
        }
    }
    files.sort();
    assert!(files.len() > 40, "the io crates' sources: {}", files.len());
    files
        .into_iter()
        .filter(|path| !path.ends_with("tests.rs"))
        .map(|path| {
            let text = fs::read_to_string(&path).expect("a source file");
            let code = match text.find("#[cfg(test)]") {
                Some(at) => text[..at].to_owned(),
                None => text,
            };
            (path, code)
        })
        .collect()
}

/// A `Duration::from_*` whose argument is a number written out.
fn duration_literal(line: &str) -> bool {
    let mut rest = line;
    while let Some(at) = rest.find("Duration::from_") {
        rest = &rest[at + "Duration::from_".len()..];
        let unit_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let after = rest[unit_end..].trim_start();
        if let Some(argument) = after.strip_prefix('(')
            && argument
                .trim_start()
                .starts_with(|c: char| c.is_ascii_digit())
        {
            return true;
        }
    }
    false
}

#[test]
fn io_waits_are_named_in_the_limits_and_no_queue_is_unbounded() {
    let mut problems = Vec::new();
    for (path, code) in sources() {
        let limits = path.ends_with("limits.rs");
        for (n, line) in code.lines().enumerate() {
            let at = format!("{}:{}", path.display(), n + 1);
            if line.contains("unbounded_channel") {
                problems.push(format!("{at}: an unbounded channel"));
            }
            if !limits && duration_literal(line) {
                problems.push(format!("{at}: a wait outside limits.rs: {}", line.trim()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_literal_finder_finds_literals_only() {
    assert!(duration_literal("let d = Duration::from_millis(50);"));
    assert!(duration_literal("sleep(Duration::from_secs_f64( 1.5))"));
    assert!(!duration_literal("Duration::from_millis(ms)"));
    assert!(!duration_literal("map(Duration::from_millis)"));
}
