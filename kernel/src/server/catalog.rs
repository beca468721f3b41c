//! The stored sessions: their metadata as loaded at start and kept up to
//! date as sessions are created, adopted and removed, each with its CBOR
//! encoded once for the session list.
//!
//! Every change goes through a method here and increments the catalog's
//! revision, which the server's cached session list compares at use: no
//! change can forget to invalidate it.
//!
//! Sibling servers sharing the session directory change it too, so the
//! catalog follows the directory ([`Sync`]): the driver reports that the
//! directory changed ([`super::Input::CatalogChanged`]), or that it cannot
//! watch it ([`super::Input::CatalogUnwatched`], then it is polled); the
//! catalog asks for a scan once changes have settled
//! ([`super::Output::ScanCatalog`]) and reconciles the scanned sessions
//! with its own ([`Catalog::reconcile`]).

use crate::protocol::SessionMetadata;
use crate::protocol::codec::direct::encode_session_metadata;
use crate::time::Instant;
use crate::wire::CborError;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;
use std::time::Duration;

/// One stored session.
#[derive(Clone)]
pub(crate) struct Stored {
    pub(crate) meta: SessionMetadata,
    /// Its list entry's CBOR (or why it cannot be encoded).
    pub(crate) cbor: Result<Box<[u8]>, CborError>,
}

impl Stored {
    fn new(meta: SessionMetadata) -> Self {
        let cbor = encode_session_metadata(&meta).map(Vec::into_boxed_slice);
        Self { meta, cbor }
    }
}

/// The metadata, and the length of the CBOR rather than its bytes.
impl fmt::Debug for Stored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stored")
            .field("meta", &self.meta)
            .field("cbor_len", &self.cbor.as_ref().map(|cbor| cbor.len()))
            .finish()
    }
}

/// The session catalog. Until [`Catalog::load`] it is not loaded and empty.
#[derive(Clone, Default)]
pub(crate) struct Catalog {
    sessions: Option<BTreeMap<String, Stored>>,
    revision: u64,
    sync: Sync,
    /// What changed since the session list last took the changes.
    changes: Changes,
}

/// The fields that say what the catalog holds: `changes` only says what the
/// session list has yet to re-encode, which its own `Debug` shows by the
/// revision it was brought up to (the model checker merges states by their
/// `Debug` text).
impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field("sessions", &self.sessions)
            .field("revision", &self.revision)
            .field("sync", &self.sync)
            .finish()
    }
}

/// The sessions whose entries changed (added, updated or forgotten) since
/// [`Catalog::take_changes`], or `all` when too many did to name them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Changes {
    pub(crate) all: bool,
    pub(crate) ids: BTreeSet<String>,
}

impl Changes {
    /// Past this many named changes, `all` is cheaper to follow.
    const MAX_IDS: usize = 1024;

    fn record(&mut self, id: &str) {
        if self.all {
            return;
        }
        if self.ids.len() == Self::MAX_IDS {
            self.all = true;
            self.ids.clear();
        } else if !self.ids.contains(id) {
            self.ids.insert(id.to_owned());
        }
    }
}

/// When the catalog is next compared with the directory.
///
/// Invariant: at most one scan is out; while it is, every session this
/// server changes is in `touched`, and the scan's view of those sessions
/// (taken before or during the change) is ignored.
#[derive(Debug, Clone, Default)]
struct Sync {
    /// A scan is wanted at this time (changes settle until then).
    due: Option<Instant>,
    /// The scan out, if any.
    in_flight: Option<u64>,
    touched: BTreeSet<String>,
    /// Set when the directory is not watched: scan this often.
    poll: Option<Duration>,
    last_scan: u64,
}

impl Catalog {
    /// True once the io layer delivered the stored sessions.
    pub(crate) fn is_loaded(&self) -> bool {
        self.sessions.is_some()
    }

    /// Counts changes; compared by the cached session list.
    pub(crate) fn revision(&self) -> u64 {
        self.revision
    }

    /// Adds loaded sessions (and marks the catalog loaded).
    pub(crate) fn load(&mut self, sessions: Vec<SessionMetadata>) {
        self.sessions.get_or_insert_default();
        self.revision += 1;
        self.changes.all = true;
        self.changes.ids.clear();
        for meta in sessions {
            self.insert(meta);
        }
    }

    /// Records a session under its id, if the catalog is loaded.
    pub(crate) fn insert(&mut self, meta: SessionMetadata) {
        if self.sync.in_flight.is_some() {
            self.sync.touched.insert(meta.id.clone());
        }
        self.put(meta);
    }

    fn put(&mut self, meta: SessionMetadata) {
        if let Some(catalog) = &mut self.sessions {
            self.revision += 1;
            self.changes.record(&meta.id);
            let stored = Stored::new(meta);
            catalog.insert(stored.meta.id.clone(), stored);
        }
    }

    /// Forgets a session.
    pub(crate) fn remove(&mut self, id: &str) {
        if self.sync.in_flight.is_some() {
            self.sync.touched.insert(id.to_owned());
        }
        self.forget(id);
    }

    fn forget(&mut self, id: &str) {
        if let Some(catalog) = &mut self.sessions
            && catalog.remove(id).is_some()
        {
            self.revision += 1;
            self.changes.record(id);
        }
    }

    /// What changed since the last call (everything, before the first).
    pub(crate) fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// A stored session's metadata.
    pub(crate) fn get(&self, id: &str) -> Option<&SessionMetadata> {
        self.sessions.as_ref()?.get(id).map(|stored| &stored.meta)
    }

    /// True when the session is stored.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.sessions.as_ref().is_some_and(|c| c.contains_key(id))
    }

    /// The stored sessions in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Stored)> {
        self.sessions.iter().flatten()
    }

    /// The stored sessions from `from` (included) to `to` (excluded; `None`:
    /// to the end), in id order.
    pub(crate) fn range<'a>(
        &'a self,
        from: &'a str,
        to: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a String, &'a Stored)> {
        let to = to.map_or(Bound::Unbounded, Bound::Excluded);
        self.sessions
            .iter()
            .flat_map(move |c| c.range::<str, _>((Bound::Included(from), to)))
    }

    // ---- following the directory ---------------------------------------

    /// The directory changed: scan it `settle` from now (or at the scan
    /// already due, if sooner), so that a burst of changes is one scan.
    /// A change before the load is scanned after it: the load may have read
    /// the directory before the change.
    pub(crate) fn changed(&mut self, now: Instant, settle: Duration) {
        let at = now + settle;
        self.sync.due = Some(self.sync.due.map_or(at, |due| due.min(at)));
    }

    /// The directory cannot be watched: poll it every `every`.
    pub(crate) fn unwatched(&mut self, now: Instant, every: Duration) {
        self.sync.poll = Some(every);
        self.changed(now, every);
    }

    /// When a scan should be asked for (none while one is out).
    pub(crate) fn scan_deadline(&self) -> Option<Instant> {
        match self.sync.in_flight {
            Some(_) => None,
            None if !self.is_loaded() => None,
            None => self.sync.due,
        }
    }

    /// The scan to ask for now, if one is due.
    pub(crate) fn start_scan(&mut self, now: Instant) -> Option<u64> {
        if self.scan_deadline().is_none_or(|due| due > now) {
            return None;
        }
        self.sync.due = None;
        self.sync.last_scan += 1;
        self.sync.in_flight = Some(self.sync.last_scan);
        self.sync.touched.clear();
        Some(self.sync.last_scan)
    }

    /// Brings the catalog in line with scan `scan` of the directory. A
    /// session live here, or changed here while the scan was out, keeps its
    /// entry: this server knows better. Another session is added, updated
    /// or forgotten as the directory says; what the directory does not
    /// record (`updatedAt`, `parentSessionId`) is kept. Returns whether any
    /// entry changed (`None` for a scan that is not the one out).
    pub(crate) fn reconcile(
        &mut self,
        now: Instant,
        scan: u64,
        scanned: Vec<SessionMetadata>,
        is_live: impl Fn(&str) -> bool,
    ) -> Option<bool> {
        if self.sync.in_flight != Some(scan) {
            return None;
        }
        self.sync.in_flight = None;
        let touched = std::mem::take(&mut self.sync.touched);
        if let Some(every) = self.sync.poll {
            self.changed(now, every);
        }
        let keep = |id: &str| is_live(id) || touched.contains(id);
        let before = self.revision;
        let mut seen = BTreeSet::new();
        for mut meta in scanned {
            seen.insert(meta.id.clone());
            if keep(&meta.id) {
                continue;
            }
            if let Some(old) = self.get(&meta.id) {
                meta.updated_at = meta.updated_at.max(old.updated_at);
                meta.parent_session_id = meta
                    .parent_session_id
                    .or_else(|| old.parent_session_id.clone());
                if *old == meta {
                    continue;
                }
            }
            self.put(meta);
        }
        let gone: Vec<String> = self
            .iter()
            .map(|(id, _)| id)
            .filter(|id| !seen.contains(*id) && !keep(id))
            .cloned()
            .collect();
        for id in gone {
            self.forget(&id);
        }
        Some(self.revision != before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_millis(100);

    fn meta(id: &str, name: Option<&str>) -> SessionMetadata {
        SessionMetadata {
            id: id.into(),
            created_at: 1,
            updated_at: None,
            parent_session_id: None,
            session_name: name.map(str::to_owned),
            cwd: Some("/work".into()),
        }
    }

    fn loaded(ids: &[&str]) -> Catalog {
        let mut catalog = Catalog::default();
        catalog.load(ids.iter().map(|id| meta(id, None)).collect());
        catalog
    }

    fn ids(catalog: &Catalog) -> Vec<&str> {
        catalog.iter().map(|(id, _)| id.as_str()).collect()
    }

    fn ms(n: u64) -> Instant {
        Instant(n)
    }

    #[test]
    fn changes_settle_into_one_scan() {
        let mut catalog = loaded(&["a"]);
        assert_eq!(catalog.scan_deadline(), None, "no scan without a change");
        catalog.changed(ms(0), SETTLE);
        catalog.changed(ms(50), SETTLE);
        assert_eq!(
            catalog.scan_deadline(),
            Some(ms(100)),
            "the first change sets it"
        );
        assert_eq!(catalog.start_scan(ms(99)), None);
        let scan = catalog.start_scan(ms(100)).expect("due");
        catalog.changed(ms(120), SETTLE);
        assert_eq!(catalog.scan_deadline(), None, "one scan at a time");
        assert_eq!(
            catalog.reconcile(ms(130), scan, vec![meta("a", None)], |_| false),
            Some(false)
        );
        assert_eq!(
            catalog.scan_deadline(),
            Some(ms(220)),
            "the later change gets its scan"
        );
    }

    #[test]
    fn a_scan_adds_renames_and_forgets_what_a_sibling_did() {
        let mut catalog = loaded(&["a", "b"]);
        catalog.changed(ms(0), SETTLE);
        let scan = catalog.start_scan(ms(100)).unwrap();
        let scanned = vec![meta("a", Some("renamed")), meta("c", None)];
        assert_eq!(
            catalog.reconcile(ms(110), scan, scanned, |_| false),
            Some(true)
        );
        assert_eq!(ids(&catalog), ["a", "c"]);
        assert_eq!(
            catalog.get("a").unwrap().session_name.as_deref(),
            Some("renamed")
        );
        assert_eq!(
            catalog.reconcile(ms(120), scan, vec![], |_| false),
            None,
            "not out"
        );
    }

    #[test]
    fn what_this_server_knows_better_is_kept() {
        let mut catalog = loaded(&["live", "mine"]);
        let mut fresh = meta("mine", None);
        fresh.updated_at = Some(7);
        catalog.insert(fresh);
        catalog.changed(ms(0), SETTLE);
        let scan = catalog.start_scan(ms(100)).unwrap();
        // Created here while the scan was out, after it read the directory.
        catalog.insert(meta("new", None));
        let scanned = vec![meta("mine", None)];
        let changed = catalog.reconcile(ms(110), scan, scanned, |id| id == "live");
        assert_eq!(changed, Some(false));
        assert_eq!(ids(&catalog), ["live", "mine", "new"]);
        assert_eq!(
            catalog.get("mine").unwrap().updated_at,
            Some(7),
            "not in meta.json"
        );
    }

    #[test]
    fn a_change_before_the_load_is_scanned_after_it() {
        let mut catalog = Catalog::default();
        catalog.changed(ms(0), SETTLE);
        assert_eq!(catalog.scan_deadline(), None, "nothing to reconcile yet");
        catalog.load(vec![]);
        assert_eq!(catalog.start_scan(ms(100)), Some(1));
    }

    #[test]
    fn an_unwatched_directory_is_polled() {
        let mut catalog = loaded(&[]);
        catalog.unwatched(ms(0), Duration::from_secs(1));
        let scan = catalog.start_scan(ms(1000)).unwrap();
        catalog.reconcile(ms(1010), scan, vec![], |_| false);
        assert_eq!(catalog.scan_deadline(), Some(ms(2010)));
    }
}
