//! Per-session storage: one directory per session, a JSON metadata file for
//! the catalog and an SQLite database for everything else.
//!
//! # Layout
//!
//! ```text
//! <sessionDir>/
//!   <id>/                 one directory per session; <id> matches
//!                         ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$
//!     lock                flock(2)ed exclusively by the one worker that owns the session
//!     meta.json           catalog data: createdAt, cwd, name?, model, thinkingLevel
//!     session.sqlite      transcript items and the session state (plus -wal / -shm)
//! ```
//!
//! `meta.json` is what [`scan_catalog`] reads, so listing sessions never opens
//! a database and never waits for a worker. It is written atomically (temp
//! file, `fsync`, `rename`, `fsync` of the directory), tab-indented with a
//! trailing newline, and rewritten when the model or thinking level changes.
//! The database is authoritative for the model and thinking level: they are
//! committed first and `meta.json` follows, so a crash in between leaves a
//! stale `meta.json`, which [`SessionStore::open`] repairs.
//!
//! [`SessionStore::create`] writes `meta.json` last, after the database holds
//! the initial state, so a session whose `meta.json` exists is complete.
//!
//! # The lock
//!
//! Only the session's worker opens `session.sqlite`, and at most one worker
//! may own a session directory. [`SessionStore`] therefore holds an exclusive
//! [`File::try_lock`] (`flock(LOCK_EX | LOCK_NB)`) on `<dir>/lock` for its
//! whole life. A second opener gets [`StoreError::Locked`], which the caller
//! maps to the protocol's `session_locked`. The kernel releases a `flock` when
//! the last descriptor of the holder closes, including when the holder is
//! killed with SIGKILL, so a lock can never stay stuck after a crash (unlike a
//! PID file or an `O_EXCL` marker). The lock file itself is never deleted
//! while the session exists. It names its holder: the PID on the first line
//! and, once [`SessionStore::record_server`] ran, the worker socket of the
//! server the holder serves on the second. That is the evidence a server
//! starting after a crash reads ([`live_holder`]): a session held by a live
//! worker of its own socket has an orphan that will announce itself, so an
//! attach waits for it instead of spawning a second worker. It also lets a
//! `session_locked` error name the server that holds the session.
//!
//! # SQLite settings and why
//!
//! - `journal_mode=WAL`: a commit appends to the write-ahead log instead of
//!   rewriting pages in place, which is cheaper for the many small
//!   transactions of a streaming turn and lets an inspector read the database
//!   while the worker writes.
//! - `synchronous=NORMAL` (the default, see [`Synchronous`]): in WAL mode a
//!   commit is durable against a crash of the process (SIGKILL, panic, OOM
//!   kill) because the log is written to the OS before the commit returns; only
//!   an OS crash or power loss can roll back the last few commits, and the
//!   database stays consistent even then. [`Synchronous::Full`] also fsyncs
//!   the log on every commit, for durability against power loss at the cost
//!   of one fsync per batch.
//! - `busy_timeout=5000`: the worker is the only writer, but an inspector
//!   (the `sqlite3` shell) or a checkpoint can hold a lock briefly; waiting
//!   5 s beats failing a write.
//! - Every write is a `BEGIN IMMEDIATE` transaction, taking the write lock up
//!   front, so a transaction never fails half-way on a lock upgrade.
//!   [`SessionStore::apply`] commits a whole batch of [`Persist`] writes in
//!   one transaction: all or nothing.
//! - [`SessionStore::close`] runs `wal_checkpoint(TRUNCATE)`, leaving a
//!   self-contained `session.sqlite` and an empty log.
//!
//! # Tables
//!
//! All tables are `STRICT`. `schema_version` holds the version of the schema;
//! the migration list (version 1 creates the tables below) brings older
//! databases up to date on open, in one transaction.
//!
//! - `items`: the transcript in order. `seq` fixes the position; an upsert by
//!   `item_id` replaces the body in place and keeps the position. `body` is
//!   the CBOR encoding of the item's protocol wire form (the kernel's
//!   [`Schema`] mapping); `role` and `status` copy two of its fields for
//!   inspection with the `sqlite3` shell. Items are checked against their
//!   schema before they are written, so whatever is stored reads back.
//! - `state`: a single row with the revision, `updated_at`, model, thinking
//!   level and the queued steer messages (CBOR array of user items).

mod db;
mod limits;
mod meta;
#[cfg(test)]
mod tests;
pub mod watch;

use kernel::host::{StoreFailure, StoreFailureKind};
use kernel::protocol::SessionMetadata;
use kernel::protocol::codec::Schema;
use kernel::runtime::{Persist, StoredSession};
use meta::Meta;
use rusqlite::Connection;
use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Name of the lock file inside a session directory.
pub const LOCK_FILE: &str = "lock";
/// Name of the metadata file inside a session directory.
pub const META_FILE: &str = "meta.json";
/// Name of the database inside a session directory.
pub const DB_FILE: &str = "session.sqlite";
/// The longest session id, in bytes.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Why a storage operation failed. Each message names the session and, where
/// one is involved, the path.
#[derive(Debug)]
pub enum StoreError {
    /// The session id does not match `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`.
    InvalidId(String),
    /// The session directory or its `meta.json` does not exist.
    NotFound(String),
    /// [`SessionStore::create`] found the session directory already there.
    Exists(String),
    /// Another process (or another store in this one) holds the session lock.
    /// Maps to the protocol's `session_locked`.
    Locked(String),
    /// Stored data is unreadable: bad `meta.json`, missing database or state
    /// row, an item that does not decode, a schema newer than this build.
    Corrupt(String),
    /// Data that cannot be stored: an item or setting that its wire schema
    /// forbids (it could not be read back), or a number out of range.
    Invalid(String),
    /// A file system operation failed.
    Io {
        /// What was being done, naming the session and path.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The directory holds only pi's `meta.json` (`{createdAt, cwd}`): pi's
    /// own durable server listed the session and never opened it, so there
    /// is nothing to open yet ([`SessionStore::adopt`] writes its store).
    Unopened {
        /// The session id.
        id: String,
        /// When pi created it (ms).
        created_at: u64,
        /// Its working directory.
        cwd: String,
    },
    /// An SQLite operation failed.
    Sqlite {
        /// What was being done, naming the session and path.
        context: String,
        /// The underlying error.
        source: rusqlite::Error,
    },
}

impl StoreError {
    /// True when the write failed for want of room (a full disk or quota):
    /// the store is intact and works again once there is space.
    pub fn is_out_of_space(&self) -> bool {
        let errno_full = |e: &io::Error| {
            matches!(
                e.raw_os_error(),
                Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error()
                    || code == rustix::io::Errno::DQUOT.raw_os_error()
            )
        };
        match self {
            Self::Io { source, .. } => errno_full(source),
            Self::Sqlite { source, .. } => matches!(
                source,
                rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull
            ),
            _ => false,
        }
    }

    /// What kind of failure this is, for the kernel to decide on
    /// ([`StoreFailure::code`]: the protocol code a request failing with it gets).
    pub fn failure(&self) -> StoreFailure {
        let kind = match self {
            Self::InvalidId(_) => StoreFailureKind::InvalidId,
            Self::Exists(_) => StoreFailureKind::Exists,
            Self::NotFound(_) | Self::Unopened { .. } => StoreFailureKind::NotFound,
            Self::Locked(_) => StoreFailureKind::Locked,
            _ if self.is_out_of_space() => StoreFailureKind::Full,
            Self::Corrupt(_) | Self::Invalid(_) | Self::Io { .. } | Self::Sqlite { .. } => {
                StoreFailureKind::Broken
            }
        };
        StoreFailure::new(kind, self.to_string())
    }

    fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    fn sqlite(context: impl Into<String>, source: rusqlite::Error) -> Self {
        Self::Sqlite {
            context: context.into(),
            source,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidId(m)
            | Self::NotFound(m)
            | Self::Exists(m)
            | Self::Locked(m)
            | Self::Corrupt(m)
            | Self::Invalid(m) => f.write_str(m),
            Self::Io { context, source } => write!(f, "{context}: {source}"),
            Self::Sqlite { context, source } => write!(f, "{context}: {source}"),
            Self::Unopened { id, .. } => write!(
                f,
                "Session {id} was listed by pi's own server and never opened: it has no store yet"
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Sqlite { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// How hard a commit works to survive a crash. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `PRAGMA synchronous=NORMAL`: commits survive a process crash; an OS
    /// crash or power loss may roll back the latest commits (never corrupts).
    #[default]
    Normal,
    /// `PRAGMA synchronous=FULL`: every commit is fsynced, so it also survives
    /// power loss. Costs one fsync per [`SessionStore::apply`].
    Full,
}

impl Synchronous {
    fn pragma_value(self) -> &'static str {
        match self {
            Self::Normal => "NORMAL",
            Self::Full => "FULL",
        }
    }
}

/// Checks a session id against `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`, which
/// makes it a safe single path component (no `/`, no leading `.` or `-`).
pub fn validate_session_id(id: &str) -> Result<(), StoreError> {
    let bytes = id.as_bytes();
    let valid = match bytes.split_first() {
        None => false,
        Some((first, rest)) => {
            bytes.len() <= MAX_SESSION_ID_LEN
                && first.is_ascii_alphanumeric()
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
    };
    if valid {
        return Ok(());
    }
    let shown: String = id.chars().take(64).collect();
    let ellipsis = if shown.len() < id.len() { "..." } else { "" };
    Err(StoreError::InvalidId(format!(
        "Invalid session id {shown:?}{ellipsis}: it must be 1 to {MAX_SESSION_ID_LEN} \
         characters of A-Z, a-z, 0-9, '.', '_' or '-', starting with a letter or digit"
    )))
}

/// Lists the stored sessions, sorted by id, from their `meta.json` files only
/// (no database is opened and no lock is taken). It also deletes what
/// earlier removals left behind ([`remove_session`]'s tombstones).
///
/// Never fails: a missing `session_dir` is an empty list, and an entry that is
/// not a session directory, has no `meta.json` (a session being created or
/// removed), or whose `meta.json` is unreadable or invalid is skipped (the
/// last two with a `tracing::warn!`). `updatedAt` and `parentSessionId` are
/// not in `meta.json` and are left out.
pub fn scan_catalog(session_dir: &Path) -> Vec<SessionMetadata> {
    scan_catalog_with_models(session_dir).0
}

/// [`scan_catalog`], with the model and thinking level each of our
/// sessions' `meta.json` records (pi's record none).
pub fn scan_catalog_with_models(
    session_dir: &Path,
) -> (Vec<SessionMetadata>, Vec<kernel::server::StoredDetails>) {
    let mut models = Vec::new();
    let entries = match fs::read_dir(session_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return (Vec::new(), models),
        Err(error) => {
            tracing::warn!(dir = %session_dir.display(), %error, "cannot list the session directory");
            return (Vec::new(), models);
        }
    };
    let mut sessions = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                tracing::warn!(dir = %session_dir.display(), %error, "cannot read a session directory entry");
                continue;
            }
        };
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if id.starts_with(".removing-") {
            sweep_tombstone(&entry.path());
            continue;
        }
        // Not a session: stray files, ...
        if validate_session_id(&id).is_err() || !entry.path().is_dir() {
            continue;
        }
        let dir = entry.path();
        let meta = match meta::read_any(&dir, &id) {
            Ok(meta::AnyMeta::Ours(meta)) => meta,
            Ok(meta::AnyMeta::Pi { created_at, cwd }) => {
                sessions.push(SessionMetadata {
                    id,
                    created_at,
                    updated_at: None,
                    parent_session_id: None,
                    session_name: None,
                    cwd: Some(cwd),
                });
                continue;
            }
            Err(StoreError::NotFound(_)) => {
                tracing::debug!(session = %id, "session directory without meta.json skipped");
                continue;
            }
            Err(error) => {
                tracing::warn!(session = %id, %error, "session skipped from the catalog");
                continue;
            }
        };
        let metadata = SessionMetadata {
            id,
            created_at: meta.created_at,
            updated_at: None,
            parent_session_id: None,
            session_name: meta.name,
            cwd: Some(meta.cwd),
        };
        if let Err(error) = metadata.to_checked_value() {
            tracing::warn!(session = %metadata.id, %error, "session with invalid metadata skipped from the catalog");
            continue;
        }
        models.push(kernel::server::StoredDetails {
            session_id: metadata.id.clone(),
            model: meta.model,
            thinking_level: meta.thinking_level,
            preview: meta.preview,
        });
        sessions.push(metadata);
    }
    sessions.sort_by(|a, b| a.id.cmp(&b.id));
    (sessions, models)
}

/// Deletes a stored session: takes its lock first ([`StoreError::Locked`] if
/// a worker holds it), then removes the directory recursively.
///
/// The directory is first renamed to a hidden tombstone
/// (`<sessionDir>/.removing-<id>-…`): that rename is the removal, atomic,
/// and the only step that can fail it. The recursive delete after it is
/// clean-up, finished by a later catalog scan if it is interrupted or fails.
pub fn remove_session(session_dir: &Path, id: &str) -> Result<(), StoreError> {
    validate_session_id(id)?;
    let dir = session_dir.join(id);
    if !dir.is_dir() {
        return Err(not_found(id, &dir));
    }
    let lock = acquire_lock(&dir, id)?;
    static TOMBSTONES: AtomicU64 = AtomicU64::new(0);
    let tombstone = session_dir.join(format!(
        ".removing-{id}-{}-{}",
        std::process::id(),
        TOMBSTONES.fetch_add(1, Ordering::Relaxed)
    ));
    fs::rename(&dir, &tombstone).map_err(|e| {
        StoreError::io(
            format!(
                "Session {id}: cannot move {} aside for removal",
                dir.display()
            ),
            e,
        )
    })?;
    sync_dir(session_dir, id)?;
    // Removed: the rest is clean-up, which the next catalog scan finishes
    // if it fails now (a client is told the session is gone either way).
    drop(lock);
    sweep_tombstone(&tombstone);
    Ok(())
}

/// Deletes what a removal left (see [`remove_session`]); what cannot be
/// deleted now is left for the next scan.
fn sweep_tombstone(tombstone: &Path) {
    if let Err(error) = fs::remove_dir_all(tombstone)
        && error.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %tombstone.display(), %error, "cannot delete a removed session's files yet");
    }
}

/// The open storage of one session, owned by its worker. Holds the session
/// lock until it is closed or dropped. See the module documentation.
#[derive(Debug)]
pub struct SessionStore {
    // Field order matters: the connection closes before the lock is released.
    conn: Connection,
    lock: File,
    dir: PathBuf,
    id: String,
    meta: Meta,
}

impl SessionStore {
    /// Creates session `initial.id` under `session_dir` (created if missing)
    /// with [`Synchronous::Normal`]. See [`SessionStore::create_with`].
    pub fn create(session_dir: &Path, initial: &StoredSession) -> Result<Self, StoreError> {
        Self::create_with(session_dir, initial, Synchronous::Normal)
    }

    /// Creates session `initial.id` under `session_dir` (created if missing):
    /// the session directory (which must not exist: [`StoreError::Exists`]),
    /// its lock, the database with `initial`'s state and transcript, and
    /// finally `meta.json`. The returned store holds the lock.
    ///
    /// If anything fails after the directory was made, the directory is
    /// removed again.
    pub fn create_with(
        session_dir: &Path,
        initial: &StoredSession,
        synchronous: Synchronous,
    ) -> Result<Self, StoreError> {
        let id = initial.id.as_str();
        validate_session_id(id)?;
        let meta = Meta::of(initial);
        meta.validate().map_err(|problem| {
            StoreError::Invalid(format!("Session {id}: cannot create it: {problem}"))
        })?;
        fs::create_dir_all(session_dir).map_err(|e| {
            StoreError::io(
                format!(
                    "Session {id}: cannot create the session directory {}",
                    session_dir.display()
                ),
                e,
            )
        })?;
        let dir = session_dir.join(id);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(StoreError::Exists(format!(
                    "Session {id} already exists ({})",
                    dir.display()
                )));
            }
            Err(e) => {
                return Err(StoreError::io(
                    format!("Session {id}: cannot create {}", dir.display()),
                    e,
                ));
            }
        }
        match Self::create_in(session_dir, dir.clone(), initial, meta, synchronous) {
            Ok(store) => Ok(store),
            Err(error) => {
                if let Err(cleanup) = fs::remove_dir_all(&dir) {
                    tracing::warn!(session = %id, dir = %dir.display(), %cleanup, "cannot remove a half-created session");
                }
                Err(error)
            }
        }
    }

    /// Writes the store of a session that has only pi's `meta.json`
    /// ([`StoreError::Unopened`]) into its directory: the database with
    /// `initial`, then our `meta.json` in place of pi's. If the directory
    /// changed meanwhile (a database appeared, the metadata is no longer
    /// pi's), nothing is written.
    pub fn adopt(session_dir: &Path, initial: &StoredSession) -> Result<Self, StoreError> {
        let id = initial.id.as_str();
        validate_session_id(id)?;
        let meta = Meta::of(initial);
        meta.validate().map_err(|problem| {
            StoreError::Invalid(format!("Session {id}: cannot store it: {problem}"))
        })?;
        let dir = session_dir.join(id);
        let lock = acquire_lock(&dir, id)?;
        let db_path = dir.join(DB_FILE);
        if !matches!(meta::read_any(&dir, id)?, meta::AnyMeta::Pi { .. }) || db_path.exists() {
            return Err(StoreError::Exists(format!(
                "Session {id} changed while it was being opened ({})",
                dir.display()
            )));
        }
        match Self::create_locked(
            lock,
            session_dir,
            dir.clone(),
            initial,
            meta,
            Synchronous::Normal,
        ) {
            Ok(store) => Ok(store),
            Err(error) => {
                for file in [DB_FILE, "session.sqlite-wal", "session.sqlite-shm"] {
                    let _ = fs::remove_file(dir.join(file));
                }
                Err(error)
            }
        }
    }

    fn create_in(
        session_dir: &Path,
        dir: PathBuf,
        initial: &StoredSession,
        meta: Meta,
        synchronous: Synchronous,
    ) -> Result<Self, StoreError> {
        let lock = acquire_lock(&dir, &initial.id)?;
        Self::create_locked(lock, session_dir, dir, initial, meta, synchronous)
    }

    /// [`Self::create_in`] with the session's lock already held.
    fn create_locked(
        lock: File,
        session_dir: &Path,
        dir: PathBuf,
        initial: &StoredSession,
        meta: Meta,
        synchronous: Synchronous,
    ) -> Result<Self, StoreError> {
        let id = initial.id.clone();
        let mut conn = db::open(&dir, &id, true, synchronous)?;
        db::migrate(&mut conn, &dir, &id)?;
        db::write_initial(&mut conn, &dir, initial)?;
        meta::write(&dir, &id, &meta)?;
        sync_dir(session_dir, &id)?;
        Ok(Self {
            conn,
            lock,
            dir,
            id,
            meta,
        })
    }

    /// Opens stored session `id` with [`Synchronous::Normal`]. See
    /// [`SessionStore::open_with`].
    pub fn open(session_dir: &Path, id: &str) -> Result<(Self, StoredSession), StoreError> {
        Self::open_with(session_dir, id, Synchronous::Normal)
    }

    /// Opens stored session `id`: takes its lock ([`StoreError::Locked`] if
    /// held), reads `meta.json`, migrates the database to the current schema
    /// and loads everything. [`StoreError::NotFound`] if the directory or its
    /// `meta.json` is missing.
    ///
    /// `cwd`, `name` and `created_at` come from `meta.json`; the revision,
    /// `updated_at`, model, thinking level and steer queue from the state row;
    /// the transcript from the items. If `meta.json` disagrees with the state
    /// row about the model or thinking level (a crash between the commit and
    /// the `meta.json` rewrite), it is rewritten from the state row.
    pub fn open_with(
        session_dir: &Path,
        id: &str,
        synchronous: Synchronous,
    ) -> Result<(Self, StoredSession), StoreError> {
        validate_session_id(id)?;
        let dir = session_dir.join(id);
        if !dir.is_dir() {
            return Err(not_found(id, &dir));
        }
        let lock = acquire_lock(&dir, id)?;
        let db_path = dir.join(DB_FILE);
        let mut meta = match meta::read_any(&dir, id)? {
            meta::AnyMeta::Ours(meta) => meta,
            meta::AnyMeta::Pi { .. } if db_path.exists() => {
                return Err(StoreError::Corrupt(format!(
                    "Session {id} is stored by pi's own durable server ({} is pi-durable \
                     storage), which this server does not read; it is left as it is",
                    db_path.display()
                )));
            }
            meta::AnyMeta::Pi { created_at, cwd } => {
                return Err(StoreError::Unopened {
                    id: id.to_owned(),
                    created_at,
                    cwd,
                });
            }
        };
        if !db_path.is_file() {
            return Err(StoreError::Corrupt(format!(
                "Session {id} is corrupt: its database {} is missing",
                db_path.display()
            )));
        }
        let mut conn = db::open(&dir, id, false, synchronous)?;
        db::migrate(&mut conn, &dir, id)?;
        let (state, transcript) = db::load(&conn, &dir, id)?;
        let preview = meta
            .preview
            .clone()
            .or_else(|| meta::first_prompt(&transcript));
        if meta.model != state.model
            || meta.thinking_level != state.thinking_level
            || meta.preview != preview
        {
            tracing::info!(session = %id, "meta.json behind the database; rewriting it");
            meta.model = state.model.clone();
            meta.thinking_level = state.thinking_level;
            meta.preview = preview;
            meta::write(&dir, id, &meta)?;
        }
        let session = stored_of(id, &meta, state, transcript);
        let store = Self {
            conn,
            lock,
            dir,
            id: id.to_owned(),
            meta,
        };
        Ok((store, session))
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session directory (`<sessionDir>/<id>`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes a batch of writes durable in ONE `BEGIN IMMEDIATE` transaction:
    /// either all of it is committed or none. Items are upserted by id (a new
    /// id goes to the end of the transcript, a known id keeps its position).
    /// If the batch changes the name, model or thinking level, `meta.json` is
    /// rewritten after the commit (the name lives there alone); should that fail, the error is returned
    /// but the batch is committed, and the next open repairs `meta.json`.
    ///
    /// An item or steer message that its wire schema forbids fails the whole
    /// batch with [`StoreError::Invalid`], since it could not be read back.
    /// The session as it is stored now (after a failed write, say).
    pub fn reload(&self) -> Result<StoredSession, StoreError> {
        let (state, transcript) = db::load(&self.conn, &self.dir, &self.id)?;
        Ok(stored_of(&self.id, &self.meta, state, transcript))
    }

    pub fn apply(&mut self, batch: &[Persist]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let settings = db::apply(&mut self.conn, &self.dir, &self.id, batch)?;
        let editor = batch.iter().rev().find_map(|p| match p {
            Persist::EditorMcp(servers) => Some(servers),
            _ => None,
        });
        if let Some(servers) = editor {
            let text = kernel::wire::Value::Map(vec![("mcpServers".into(), servers.clone())])
                .json_text()
                + "\n";
            let (file, tmp) = (kernel::mcp::EDITOR_FILE, ".editor-mcp.json.tmp");
            meta::replace(&self.dir, &self.id, file, tmp, text.as_bytes())?;
        }
        let mut meta = self.meta.clone();
        if let Some(settings) = settings {
            meta.name = settings.name;
            meta.model = settings.model;
            meta.thinking_level = settings.thinking_level;
        }
        if meta.preview.is_none() {
            let items = batch.iter().filter_map(|p| match p {
                Persist::Item(item) => Some(item),
                _ => None,
            });
            meta.preview = meta::first_prompt(items);
        }
        if meta != self.meta {
            meta::write(&self.dir, &self.id, &meta)?;
            self.meta = meta;
        }
        Ok(())
    }

    /// Runs `PRAGMA integrity_check` and returns its result: `"ok"` for a
    /// sound database, else the problems found, one per line.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        db::integrity_check(&self.conn, &self.dir, &self.id)
    }

    /// Records in the lock file, after our PID, the worker socket of the
    /// server this store's worker serves on (see [`live_holder`]). Failing to
    /// record it only costs a crash-restarted server that evidence.
    pub fn record_server(&mut self, worker_socket: &Path) {
        let text = format!("{}\n{}\n", std::process::id(), worker_socket.display());
        // In place: the PID line stays as it was, so a reader never sees it missing.
        let _ = self
            .lock
            .rewind()
            .and_then(|()| self.lock.write_all(text.as_bytes()))
            .and_then(|()| self.lock.set_len(text.len() as u64));
    }

    /// Closes the session cleanly: checkpoints the log into the database
    /// (`wal_checkpoint(TRUNCATE)`), closes the database, then releases the
    /// lock. (Dropping the store also closes the database and the lock, with
    /// SQLite's own checkpoint-on-close.)
    pub fn close(self) -> Result<(), StoreError> {
        let Self {
            conn,
            lock,
            dir,
            id,
            ..
        } = self;
        db::checkpoint(&conn, &dir, &id)?;
        conn.close().map_err(|(_, e)| {
            StoreError::sqlite(
                format!("Session {id}: cannot close {}", dir.join(DB_FILE).display()),
                e,
            )
        })?;
        drop(lock);
        Ok(())
    }
}

fn not_found(id: &str, dir: &Path) -> StoreError {
    StoreError::NotFound(format!(
        "Session {id} not found ({} does not exist)",
        dir.display()
    ))
}

/// A stored session from its `meta.json` and its database's state row and items.
fn stored_of(
    id: &str,
    meta: &Meta,
    state: db::StateRow,
    transcript: Vec<kernel::protocol::TranscriptItem>,
) -> StoredSession {
    StoredSession {
        id: id.to_owned(),
        name: meta.name.clone(),
        cwd: meta.cwd.clone(),
        created_at: meta.created_at,
        updated_at: state.updated_at,
        model: state.model,
        thinking_level: state.thinking_level,
        revision: state.revision,
        transcript,
        queued_steer: state.queued_steer,
        summary: state.summary,
        approvals: state.approvals,
    }
}

/// Who holds a session's lock, as its lock file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// The holder's process id.
    pub pid: u32,
    /// The worker socket of the server it serves on, once recorded.
    pub server: Option<PathBuf>,
}

impl LockHolder {
    fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let pid = lines.next()?.trim().parse().ok()?;
        let server = lines
            .next()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(PathBuf::from);
        Some(Self { pid, server })
    }

    /// `server-id` of a worker socket `<server-dir>/<server-id>.workers.sock`.
    fn server_id(&self) -> Option<(&Path, &str)> {
        let socket = self.server.as_deref()?;
        let name = socket
            .file_name()?
            .to_str()?
            .strip_suffix(".workers.sock")?;
        Some((socket.parent()?, name))
    }

    /// ` (worker pid N of server S; reach it with --server-dir D --server-id S)`.
    fn describe(&self) -> String {
        match self.server_id() {
            Some((dir, id)) => format!(
                " (worker pid {} of server {id}; reach it with --server-dir {} --server-id {id})",
                self.pid,
                dir.display()
            ),
            None => format!(" (pid {})", self.pid),
        }
    }
}

/// The holder of session `id`'s lock under `session_dir`, if a live process
/// holds it now. Reading the lock file and checking its PID disturbs nobody;
/// only when that PID is alive is the lock probed (shared, non-blocking, and
/// released at once) to rule out a reused PID in a stale file.
pub fn live_holder(session_dir: &Path, id: &str) -> Option<LockHolder> {
    let path = session_dir.join(id).join(LOCK_FILE);
    let mut file = File::open(&path).ok()?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let holder = LockHolder::parse(&text)?;
    let pid = rustix::process::Pid::from_raw(i32::try_from(holder.pid).ok()?)?;
    match rustix::process::test_kill_process(pid) {
        Ok(()) | Err(rustix::io::Errno::PERM) => {}
        Err(_) => return None,
    }
    match file.try_lock_shared() {
        Ok(()) => None, // free: the PID was reused; the lock drops with the file
        Err(TryLockError::WouldBlock) => Some(holder),
        Err(TryLockError::Error(_)) => None,
    }
}

/// Opens (creating it if needed) and exclusively locks `<dir>/lock`, then
/// writes our PID into it.
fn acquire_lock(dir: &Path, id: &str) -> Result<File, StoreError> {
    let path = dir.join(LOCK_FILE);
    let mut file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    {
        Ok(file) => file,
        // The directory went away (a concurrent remove).
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_found(id, dir)),
        Err(e) => {
            return Err(StoreError::io(
                format!("Session {id}: cannot open the lock file {}", path.display()),
                e,
            ));
        }
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let holder = LockHolder::parse(&text).map_or_else(String::new, |h| h.describe());
            return Err(StoreError::Locked(format!(
                "Session {id} is locked by another worker{holder}: {} is held",
                path.display()
            )));
        }
        Err(TryLockError::Error(e)) => {
            return Err(StoreError::io(
                format!("Session {id}: cannot lock {}", path.display()),
                e,
            ));
        }
    }
    // Diagnostics only: who holds the lock. Failing to record it is harmless.
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    Ok(file)
}

/// Fsyncs a directory so that entries created, renamed or removed in it are durable.
fn sync_dir(dir: &Path, id: &str) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| {
        StoreError::io(
            format!("Session {id}: cannot sync the directory {}", dir.display()),
            e,
        )
    })
}
