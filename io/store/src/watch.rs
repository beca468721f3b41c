//! Watching the session directory for the changes a sibling server makes:
//! a session directory created or removed, a `meta.json` written (a create
//! completes, a rename). The watcher only reports that something changed;
//! when to scan is the kernel's decision (`kernel::server::Input::CatalogChanged`).
//!
//! Everything else under the directory, above all each database and its
//! write-ahead log written on every commit, is filtered out here, in the
//! watcher's thread, so a streaming turn costs no scan. So is every event
//! that changes nothing: inotify is asked for opens too, and a scan opens the
//! directory and each `meta.json`, so counting opens made each scan schedule
//! the next, forever (BENCHMARKS.md, the soak).

use super::META_FILE;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};
use std::path::{Component, Path};

/// Watches while it lives.
pub struct Watcher {
    _inner: notify::RecommendedWatcher,
}

/// Starts watching `session_dir` (created if missing), calling `changed`
/// from the watcher's thread for each relevant change. An error means the
/// directory cannot be watched (no inotify, too many watches): poll it.
pub fn watch(session_dir: &Path, changed: impl Fn() + Send + 'static) -> Result<Watcher, String> {
    std::fs::create_dir_all(session_dir)
        .map_err(|e| format!("cannot create {}: {e}", session_dir.display()))?;
    let root = session_dir.to_owned();
    let mut inner = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            Ok(event) if changes(event.kind) && event.paths.iter().any(|p| relevant(&root, p)) => {
                changed()
            }
            Ok(_) => {}
            // Events were lost (queue overflow): rescan to be sure.
            Err(_) => changed(),
        }
    })
    .map_err(|e| format!("cannot watch {}: {e}", session_dir.display()))?;
    inner
        .watch(session_dir, RecursiveMode::Recursive)
        .map_err(|e| format!("cannot watch {}: {e}", session_dir.display()))?;
    Ok(Watcher { _inner: inner })
}

/// Whether an event of this kind can change what a scan reads: a file opened,
/// read or closed unwritten cannot (a scan makes exactly those).
fn changes(kind: EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// A change to the catalog's data: an entry of the directory itself, or a
/// session's `meta.json` (or the temporary file renamed over it).
fn relevant(root: &Path, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(root) else {
        return false;
    };
    let parts: Vec<Component<'_>> = relative.components().collect();
    match parts.as_slice() {
        [_] => true,
        [_, name] => name
            .as_os_str()
            .to_str()
            .is_some_and(|n| n.starts_with(META_FILE)),
        _ => false,
    }
}

/// For tests: the paths [`relevant`] accepts.
#[cfg(test)]
fn accepts(root: &str, path: &str) -> bool {
    relevant(Path::new(root), Path::new(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directory_entries_and_meta_files_count() {
        let root = "/s";
        assert!(accepts(root, "/s/0b7e"));
        assert!(accepts(root, "/s/.removing-0b7e-1"));
        assert!(accepts(root, "/s/0b7e/meta.json"));
        assert!(accepts(root, "/s/0b7e/meta.json.tmp"));
        assert!(!accepts(root, "/s/0b7e/session.sqlite"));
        assert!(!accepts(root, "/s/0b7e/session.sqlite-wal"));
        assert!(!accepts(root, "/s/0b7e/bash-output/1.txt"));
        assert!(!accepts(root, "/elsewhere/x"));
        assert!(!accepts(root, "/s"));
    }

    #[test]
    fn opening_or_reading_is_no_change() {
        use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};
        assert!(!changes(EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!changes(EventKind::Access(AccessKind::Read)));
        assert!(!changes(EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(changes(EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(changes(EventKind::Create(CreateKind::Folder)));
        assert!(changes(EventKind::Remove(RemoveKind::Any)));
        assert!(changes(EventKind::Modify(ModifyKind::Name(RenameMode::To))));
        assert!(changes(EventKind::Any));
    }
}
