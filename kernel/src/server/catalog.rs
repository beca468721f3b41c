//! The stored sessions: their metadata as loaded at start and kept up to
//! date as sessions are created, adopted and removed, each with its CBOR
//! encoded once for the session list.
//!
//! Every change goes through a method here and increments the catalog's
//! revision, which the server's cached session list compares at use: no
//! change can forget to invalidate it.

use crate::protocol::SessionMetadata;
use crate::protocol::codec::spliced::encode_item;
use crate::wire::CborError;
use std::collections::BTreeMap;
use std::fmt;

/// One stored session.
pub(crate) struct Stored {
    pub(crate) meta: SessionMetadata,
    /// Its list entry's CBOR (or why it cannot be encoded).
    pub(crate) cbor: Result<Box<[u8]>, CborError>,
}

impl Stored {
    fn new(meta: SessionMetadata) -> Self {
        let cbor = encode_item(&meta).map(Vec::into_boxed_slice);
        Self { meta, cbor }
    }

    fn encoded_len(&self) -> usize {
        self.cbor.as_ref().map_or(0, |cbor| cbor.len())
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
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    sessions: Option<BTreeMap<String, Stored>>,
    revision: u64,
    /// Total bytes of the stored entries' CBOR, to size the session list.
    encoded_len: usize,
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

    /// Total bytes of the stored entries' CBOR.
    pub(crate) fn encoded_len(&self) -> usize {
        self.encoded_len
    }

    /// Adds loaded sessions (and marks the catalog loaded).
    pub(crate) fn load(&mut self, sessions: Vec<SessionMetadata>) {
        self.sessions.get_or_insert_default();
        self.revision += 1;
        for meta in sessions {
            self.insert(meta);
        }
    }

    /// Records a session under its id, if the catalog is loaded.
    pub(crate) fn insert(&mut self, meta: SessionMetadata) {
        if let Some(catalog) = &mut self.sessions {
            self.revision += 1;
            let stored = Stored::new(meta);
            self.encoded_len += stored.encoded_len();
            if let Some(old) = catalog.insert(stored.meta.id.clone(), stored) {
                self.encoded_len -= old.encoded_len();
            }
        }
    }

    /// Forgets a session.
    pub(crate) fn remove(&mut self, id: &str) {
        if let Some(catalog) = &mut self.sessions
            && let Some(old) = catalog.remove(id)
        {
            self.revision += 1;
            self.encoded_len -= old.encoded_len();
        }
    }

    /// A stored session's metadata.
    pub(crate) fn get(&self, id: &str) -> Option<&SessionMetadata> {
        self.sessions.as_ref()?.get(id).map(|stored| &stored.meta)
    }

    /// True when the session is stored.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.sessions.as_ref().is_some_and(|c| c.contains_key(id))
    }

    /// Number of stored sessions.
    pub(crate) fn len(&self) -> usize {
        self.sessions.as_ref().map_or(0, BTreeMap::len)
    }

    /// The stored sessions in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Stored)> {
        self.sessions.iter().flatten()
    }
}
