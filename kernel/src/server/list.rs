//! The session list of `list` responses, hellos and server snapshots, kept
//! encoded between them ([`ListCache`]).
//!
//! The list is the catalog merged with the live sessions' snapshots, in id
//! order. It is kept as pieces of whole entries, each covering a range of
//! ids ([`Piece`]): a change re-encodes the pieces whose range holds a
//! changed session, and a message holds the pieces rather than a copy of
//! them ([`crate::protocol::codec::spliced::EncodedList`]). So a message
//! costs its envelope and a change costs a piece, whatever the catalog's
//! size; copying the whole list into each message and rebuilding it at each
//! change were most of a step once catalogs grew (BENCHMARKS.md, The codec
//! near its floor).

use super::catalog::Catalog;
use super::{Server, listed_metadata};
use crate::protocol::codec::cbor_error;
use crate::protocol::codec::spliced::{EncodedList, ListBuilder};
use crate::protocol::{SchemaError, SessionSnapshot};
use crate::wire::CborError;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

/// A piece past this many entries is split.
const MAX_PIECE_ENTRIES: usize = 64;

/// A piece (but the first) under this many entries joins the one before it.
const MIN_PIECE_ENTRIES: usize = 8;

/// The session list's CBOR, kept between `list` responses and server
/// snapshots, with what it was built from.
///
/// It is brought up to date at use ([`ListCache::refresh`]) from what
/// changed since: the catalog names the sessions it changed
/// ([`Catalog::take_changes`]), and what each live session with a snapshot
/// contributes ([`Listed`]) is compared with what the list was built from
/// (a few hundred live sessions at most, against thousands of stored ones).
/// Nothing else has to remember to invalidate it.
#[derive(Clone)]
pub(super) struct ListCache {
    /// The catalog revision it was brought up to.
    catalog_revision: u64,
    /// The live sessions' entries it was built from, in id order.
    live: Vec<Listed>,
    /// The pieces, in id order; each covers the ids from its `from` to the
    /// next one's.
    pieces: Vec<Piece>,
    /// The `sessions` array (or why it cannot be encoded).
    encoded: Result<EncodedList, SchemaError>,
}

/// What it was built from, and the length of the CBOR rather than its bytes
/// (the model checker merges states by their `Debug` text: how the list is
/// cut into pieces is not part of a state).
impl fmt::Debug for ListCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListCache")
            .field("catalog_revision", &self.catalog_revision)
            .field("live", &self.live)
            .field(
                "sessions_len",
                &self.encoded.as_ref().map(EncodedList::encoded_len),
            )
            .finish()
    }
}

/// The entries of a range of ids, encoded.
#[derive(Clone)]
struct Piece {
    /// The first id of its range ("" for the first piece, which starts the
    /// list).
    from: String,
    /// How many entries it holds.
    entries: usize,
    /// Their CBOR (or why the first that cannot be encoded cannot).
    cbor: Result<Arc<[u8]>, CborError>,
}

impl ListCache {
    /// The cache brought up to date with `server` (built whole when there is
    /// none yet, or the catalog changed too much to say what).
    pub(super) fn refresh(cache: Option<Self>, server: &mut Server) -> Self {
        let changes = server.catalog.take_changes();
        let server = &*server;
        match cache {
            Some(cache) if !changes.all => cache.update(server, changes.ids),
            _ => Self::build(server),
        }
    }

    /// The `sessions` array.
    pub(super) fn encoded(&self) -> Result<&EncodedList, SchemaError> {
        self.encoded.as_ref().map_err(Clone::clone)
    }

    /// The whole list, encoded now.
    fn build(server: &Server) -> Self {
        let pieces = encode_range(server, "", None, 0);
        let live = lives(server).map(|(_, snap)| Listed::of(snap)).collect();
        Self::assemble(server, live, pieces)
    }

    /// Re-encodes the pieces holding a session the catalog changed
    /// (`changed`) or whose live entry changed.
    fn update(self, server: &Server, mut changed: BTreeSet<String>) -> Self {
        let live = if self.live_unchanged(server) {
            self.live
        } else {
            let now: Vec<Listed> = lives(server).map(|(_, snap)| Listed::of(snap)).collect();
            changed.extend(live_changes(&self.live, &now));
            now
        };
        if changed.is_empty() {
            return Self {
                catalog_revision: server.catalog.revision(),
                live,
                ..self
            };
        }
        let mut pieces = self.pieces;
        let mut dirty: Vec<usize> = changed
            .iter()
            // The last piece starting at or before `id` (the first starts at "").
            .map(|id| pieces.partition_point(|p| p.from.as_str() <= id.as_str()) - 1)
            .collect();
        dirty.dedup();
        // From the last, so that the indices before stay valid.
        let mut dirty = dirty.into_iter().rev().peekable();
        while let Some(i) = dirty.next() {
            let to = pieces.get(i + 1).map(|p| p.from.clone());
            let room = piece_room(&pieces[i]);
            let new = encode_range(server, &pieces[i].from, to.as_deref(), room);
            match new.as_slice() {
                // A small piece (but the first) joins the one before it; an
                // empty one just goes, as the one before holds nothing of
                // its range.
                [piece] if i > 0 && piece.entries == 0 => {
                    pieces.remove(i);
                }
                [piece] if i > 0 && piece.entries < MIN_PIECE_ENTRIES => {
                    let room = piece_room(&pieces[i - 1]) + room;
                    let joined = encode_range(server, &pieces[i - 1].from, to.as_deref(), room);
                    pieces.splice(i - 1..=i, joined);
                    // The one before is re-encoded already.
                    dirty.next_if_eq(&(i - 1));
                }
                _ => {
                    pieces.splice(i..=i, new);
                }
            }
        }
        Self::assemble(server, live, pieces)
    }

    /// True when every live session lists as it did.
    fn live_unchanged(&self, server: &Server) -> bool {
        let mut listed = self.live.iter();
        lives(server).all(|(_, snap)| listed.next().is_some_and(|l| l.is(snap)))
            && listed.next().is_none()
    }

    fn assemble(server: &Server, live: Vec<Listed>, pieces: Vec<Piece>) -> Self {
        assert!(
            pieces.first().is_some_and(|p| p.from.is_empty()),
            "the first piece starts the list"
        );
        assert!(
            pieces.windows(2).all(|w| w[0].from < w[1].from),
            "the pieces cover increasing ranges"
        );
        let entries = pieces.iter().map(|p| p.entries).sum();
        // The header's error comes before an entry's, as in one encoding.
        let encoded = EncodedList::new(entries, Vec::with_capacity(pieces.len()))
            .and_then(|mut list| {
                for piece in &pieces {
                    list.push(piece.cbor.clone()?);
                }
                Ok(list)
            })
            .map_err(cbor_error);
        Self {
            catalog_revision: server.catalog.revision(),
            live,
            pieces,
            encoded,
        }
    }
}

/// Room for re-encoding `piece` with an entry or two more.
fn piece_room(piece: &Piece) -> usize {
    /// About the most bytes of two entries.
    const SLACK: usize = 512;
    piece.cbor.as_ref().map_or(0, |cbor| cbor.len()) + SLACK
}

/// The live sessions with a snapshot, in id order.
fn lives(server: &Server) -> impl Iterator<Item = (&str, &SessionSnapshot)> {
    live_range(server, "", None)
}

/// The live sessions with a snapshot from `from` to `to` (excluded).
fn live_range<'a>(
    server: &'a Server,
    from: &'a str,
    to: Option<&'a str>,
) -> impl Iterator<Item = (&'a str, &'a SessionSnapshot)> {
    let to = to.map_or(Bound::Unbounded, Bound::Excluded);
    server
        .sessions
        .range::<str, _>((Bound::Included(from), to))
        .filter_map(|(id, l)| l.snapshot.as_deref().map(|snap| (id.as_str(), snap)))
}

/// The ids whose live entries differ between `old` and `now` (both in id order).
fn live_changes(old: &[Listed], now: &[Listed]) -> Vec<String> {
    use std::cmp::Ordering;
    let mut changed = Vec::new();
    let (mut old, mut now) = (old.iter().peekable(), now.iter().peekable());
    loop {
        let order = match (old.peek(), now.peek()) {
            (None, None) => return changed,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) => a.id.cmp(&b.id),
        };
        match order {
            Ordering::Less => changed.extend(old.next().map(|a| a.id.clone())),
            Ordering::Greater => changed.extend(now.next().map(|b| b.id.clone())),
            Ordering::Equal => {
                let (a, b) = (old.next(), now.next());
                if a != b {
                    changed.extend(a.map(|a| a.id.clone()));
                }
            }
        }
    }
}

/// The entries from `from` to `to` (excluded; `None`: the end), in pieces
/// of at most [`MAX_PIECE_ENTRIES`] (one, empty, when there are none): the
/// catalog's entries as encoded when stored, live ones encoded now, in id
/// order, as [`Server::server_snapshot`] lists them; `room` is the bytes
/// they are expected to take.
fn encode_range(server: &Server, from: &str, to: Option<&str>, room: usize) -> Vec<Piece> {
    let catalog: &Catalog = &server.catalog;
    let mut list = ListBuilder::headless(room);
    // Where each entry starts, and its id.
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut failed = None;
    let mut stored = catalog.range(from, to).peekable();
    let mut lives = live_range(server, from, to).peekable();
    loop {
        let next_live = lives.peek().map(|(id, _)| *id);
        let at = list.encoded_len();
        // After a failure, entries are only counted.
        let result = match (stored.peek(), next_live) {
            (None, None) => break,
            (Some((id, s)), live) if live.is_none_or(|live| id.as_str() < live) => {
                starts.push((at, id.as_str()));
                let result = match &s.cbor {
                    Ok(cbor) if failed.is_none() => {
                        list.push_encoded(cbor);
                        Ok(())
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.clone()),
                };
                stored.next();
                result
            }
            _ => {
                let (id, snap) = lives.next().expect("peeked: stored is not first");
                starts.push((at, id));
                let base = match stored.peek() {
                    Some((stored_id, _)) if stored_id.as_str() == id => {
                        stored.next().map(|(_, s)| &s.meta)
                    }
                    _ => None,
                };
                if failed.is_none() {
                    list.push_metadata(&listed_metadata(base, snap))
                } else {
                    Ok(())
                }
            }
        };
        if let Err(e) = result {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        // The first entry that cannot be encoded fails the list, as it
        // fails one encoding of it: no need to cut this piece.
        return vec![Piece {
            from: from.to_owned(),
            entries: starts.len(),
            cbor: Err(e),
        }];
    }
    let cbor = list.finish();
    let entries = starts.len();
    if entries <= MAX_PIECE_ENTRIES {
        return vec![Piece {
            from: from.to_owned(),
            entries,
            cbor: Ok(cbor.into()),
        }];
    }
    // Cut into equal pieces of about half the most.
    let count = entries.div_ceil(MAX_PIECE_ENTRIES / 2);
    (0..count)
        .map(|k| {
            let first = k * entries / count;
            let end = (k + 1) * entries / count;
            let start = starts[first].0;
            let stop = starts.get(end).map_or(cbor.len(), |(at, _)| *at);
            Piece {
                from: if k == 0 {
                    from.to_owned()
                } else {
                    starts[first].1.to_owned()
                },
                entries: end - first,
                cbor: Ok(Arc::from(&cbor[start..stop])),
            }
        })
        .collect()
}

/// What a live session contributes to the session list: the fields of its
/// snapshot that [`listed_metadata`] reads.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Listed {
    id: String,
    created_at: u64,
    updated_at: u64,
    name: Option<String>,
    cwd: String,
}

impl Listed {
    fn of(snap: &SessionSnapshot) -> Self {
        Self {
            id: snap.id.clone(),
            created_at: snap.created_at,
            updated_at: snap.updated_at,
            name: snap.name.clone(),
            cwd: snap.cwd.clone(),
        }
    }

    /// True when `snap` lists as this.
    fn is(&self, snap: &SessionSnapshot) -> bool {
        self.id == snap.id
            && self.created_at == snap.created_at
            && self.updated_at == snap.updated_at
            && self.name == snap.name
            && self.cwd == snap.cwd
    }
}
