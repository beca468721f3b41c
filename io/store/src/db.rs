//! `session.sqlite`: connection settings, schema migrations, and the
//! encoding of transcript items and state rows.

use super::{DB_FILE, StoreError, Synchronous};
use crate::limits::BUSY_TIMEOUT;
use kernel::approval::Approvals;
use kernel::protocol::codec::{Path as SchemaPath, Schema};
use kernel::protocol::{
    AssistantStatus, Content, ModelRef, ThinkingLevel, ToolStatus, TranscriptItem, Usage, UserItem,
};
use kernel::runtime::{Persist, StoredSession, Summary};
use kernel::wire::{CborLimits, Value, cbor};
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};
use std::path::Path;

/// One schema migration: `sql` brings a database at `version - 1` to `version`.
pub(super) struct Migration {
    /// The version the database is at afterwards.
    pub(super) version: u32,
    /// What it does, for logs.
    pub(super) description: &'static str,
    /// The statements, run in the migration transaction.
    pub(super) sql: &'static str,
}

/// Every migration, oldest first; entry `i` has version `i + 1`. To change
/// the schema, append an entry: databases are brought up to date on open.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "transcript items and the state row",
        sql: "
        CREATE TABLE items (
            seq     INTEGER PRIMARY KEY,
            item_id TEXT NOT NULL UNIQUE,
            role    TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
            status  TEXT,
            body    BLOB NOT NULL
        ) STRICT;
        CREATE TABLE state (
            id             INTEGER PRIMARY KEY CHECK (id = 1),
            revision       INTEGER NOT NULL,
            updated_at     INTEGER NOT NULL,
            model_provider TEXT NOT NULL,
            model_id       TEXT NOT NULL,
            thinking_level TEXT NOT NULL,
            queued_steer   BLOB NOT NULL
        ) STRICT;
    ",
    },
    Migration {
        version: 2,
        description: "the context summary written by compaction",
        sql: "
            ALTER TABLE state ADD COLUMN summary_text TEXT;
            ALTER TABLE state ADD COLUMN summary_through TEXT;
        ",
    },
    Migration {
        version: 3,
        description: "the usage and cost of the summary calls",
        sql: "ALTER TABLE state ADD COLUMN summary_usage BLOB;",
    },
    Migration {
        version: 4,
        description: "the providers' signatures of an item's thinking",
        sql: "ALTER TABLE items ADD COLUMN signatures BLOB;",
    },
    Migration {
        version: 5,
        description: "the approval policy, tools allowed always, questions waiting",
        sql: "ALTER TABLE state ADD COLUMN approvals BLOB;",
    },
];

/// The schema version this build writes.
pub(super) fn latest_version() -> u32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The state row, decoded.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StateRow {
    pub(super) revision: u64,
    pub(super) updated_at: u64,
    pub(super) model: ModelRef,
    pub(super) thinking_level: ThinkingLevel,
    pub(super) queued_steer: Vec<UserItem>,
    pub(super) summary: Option<Summary>,
    pub(super) approvals: Approvals,
}

/// The error of a failed SQLite call, described only when one happens (this
/// sits on every commit's path).
fn sqlite_error<'a>(
    dir: &'a Path,
    id: &'a str,
    what: &'a str,
) -> impl FnOnce(rusqlite::Error) -> StoreError + 'a {
    move |e| {
        let context = format!(
            "Session {id}: cannot {what} ({})",
            dir.join(DB_FILE).display()
        );
        StoreError::sqlite(context, e)
    }
}

fn corrupt(dir: &Path, id: &str, problem: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!(
        "Session {id} is corrupt: {problem} ({})",
        dir.join(DB_FILE).display()
    ))
}

/// Opens `<dir>/session.sqlite` (creating it if `create`) and applies the
/// connection settings described in the module documentation.
pub(super) fn open(
    dir: &Path,
    id: &str,
    create: bool,
    synchronous: Synchronous,
) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(dir.join(DB_FILE), flags).map_err(sqlite_error(
        dir,
        id,
        "open the database",
    ))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(sqlite_error(dir, id, "set busy_timeout"))?;
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(sqlite_error(dir, id, "set journal_mode=WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::sqlite(
            format!(
                "Session {id}: cannot set journal_mode=WAL on {} (got {mode})",
                dir.join(DB_FILE).display()
            ),
            rusqlite::Error::InvalidQuery,
        ));
    }
    conn.pragma_update(None, "synchronous", synchronous.pragma_value())
        .map_err(sqlite_error(dir, id, "set synchronous"))?;
    Ok(conn)
}

/// Brings the schema up to date in one `BEGIN IMMEDIATE` transaction.
/// A database newer than this build is [`StoreError::Corrupt`].
pub(super) fn migrate(conn: &mut Connection, dir: &Path, id: &str) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error(dir, id, "begin the migration"))?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
            id      INTEGER PRIMARY KEY CHECK (id = 1),
            version INTEGER NOT NULL
        ) STRICT;",
    )
    .map_err(sqlite_error(dir, id, "create the schema_version table"))?;
    let current: u32 = tx
        .query_row(
            "SELECT version FROM schema_version WHERE id = 1",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(sqlite_error(dir, id, "read the schema version"))?
        .unwrap_or(0);
    let latest = latest_version();
    if current > latest {
        return Err(corrupt(
            dir,
            id,
            format!("its schema version {current} is newer than this build supports ({latest})"),
        ));
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        tracing::debug!(session = %id, version = migration.version, description = migration.description, "migrating");
        tx.execute_batch(migration.sql).map_err(sqlite_error(
            dir,
            id,
            &format!(
                "apply schema migration {} ({})",
                migration.version, migration.description
            ),
        ))?;
    }
    if current < latest {
        tx.execute(
            "INSERT INTO schema_version (id, version) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            [latest],
        )
        .map_err(sqlite_error(dir, id, "record the schema version"))?;
    }
    tx.commit()
        .map_err(sqlite_error(dir, id, "commit the migration"))
}

/// Writes the state row and transcript of a new session in one transaction.
pub(super) fn write_initial(
    conn: &mut Connection,
    dir: &Path,
    initial: &StoredSession,
) -> Result<(), StoreError> {
    let id = initial.id.as_str();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error(dir, id, "begin a transaction"))?;
    let steer = encode_steer(&initial.queued_steer, id)?;
    let revision = to_sql_int(initial.revision, "revision", id)?;
    let updated_at = to_sql_int(initial.updated_at, "updatedAt", id)?;
    tx.execute(
        "INSERT INTO state (id, revision, updated_at, model_provider, model_id, thinking_level, queued_steer,
                            summary_text, summary_through, summary_usage, approvals)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            revision,
            updated_at,
            initial.model.provider,
            initial.model.id,
            initial.thinking_level.as_str(),
            steer,
            initial.summary.as_ref().map(|s| s.text.as_str()),
            initial.summary.as_ref().map(|s| s.through.as_str()),
            encode_summary_usage(initial.summary.as_ref(), id)?,
            encode_approvals(&initial.approvals, id)?,
        ],
    )
    .map_err(sqlite_error(dir, id, "write the initial state"))?;
    for item in &initial.transcript {
        upsert_item(&tx, dir, id, item)?;
    }
    tx.commit()
        .map_err(sqlite_error(dir, id, "commit the initial state"))
}

/// What `meta.json` holds of a state write.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Settings {
    pub(super) name: Option<String>,
    pub(super) model: ModelRef,
    pub(super) thinking_level: ThinkingLevel,
}

/// Applies a batch in one `BEGIN IMMEDIATE` transaction. Returns the name,
/// model and thinking level of the batch's last state write, if any.
pub(super) fn apply(
    conn: &mut Connection,
    dir: &Path,
    id: &str,
    batch: &[Persist],
) -> Result<Option<Settings>, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error(dir, id, "begin a transaction"))?;
    let mut settings = None;
    for write in batch {
        match write {
            Persist::Item(item) => upsert_item(&tx, dir, id, item)?,
            Persist::State {
                revision,
                updated_at,
                name,
                model,
                thinking_level,
                queued_steer,
                summary,
                approvals,
            } => {
                let steer = encode_steer(queued_steer, id)?;
                let approvals = encode_approvals(approvals, id)?;
                let summary_usage = encode_summary_usage(summary.as_ref(), id)?;
                let revision = to_sql_int(*revision, "revision", id)?;
                let updated_at = to_sql_int(*updated_at, "updatedAt", id)?;
                let changed = tx
                    .prepare_cached(
                        "UPDATE state SET revision = ?1, updated_at = ?2, model_provider = ?3,
                         model_id = ?4, thinking_level = ?5, queued_steer = ?6,
                         summary_text = ?7, summary_through = ?8, summary_usage = ?9,
                         approvals = ?10 WHERE id = 1",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            revision,
                            updated_at,
                            model.provider,
                            model.id,
                            thinking_level.as_str(),
                            steer,
                            summary.as_ref().map(|s| s.text.as_str()),
                            summary.as_ref().map(|s| s.through.as_str()),
                            summary_usage,
                            approvals,
                        ])
                    })
                    .map_err(sqlite_error(dir, id, "write the state row"))?;
                if changed != 1 {
                    return Err(corrupt(dir, id, "its state row is missing"));
                }
                settings = Some(Settings {
                    name: name.clone(),
                    model: model.clone(),
                    thinking_level: *thinking_level,
                });
            }
            // Not in the database: `SessionStore::apply` writes the editor's
            // MCP servers to their file after the transaction.
            Persist::EditorMcp(_) => {}
            // A server-wide setting, not session state: the worker writes it to settings.json.
            Persist::DefaultModel(_) => {}
        }
    }
    tx.commit().map_err(sqlite_error(dir, id, "commit"))?;
    Ok(settings)
}

/// Inserts an item at the end of the transcript, or replaces the item with
/// the same id in place (keeping its `seq`).
fn upsert_item(
    tx: &Transaction<'_>,
    dir: &Path,
    id: &str,
    item: &TranscriptItem,
) -> Result<(), StoreError> {
    let body = encode_item(item, id)?;
    let signatures = encode_signatures(item);
    let (role, status) = role_and_status(item);
    tx.prepare_cached(
        "INSERT INTO items (item_id, role, status, body, signatures) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (item_id) DO UPDATE SET role = excluded.role, status = excluded.status,
         body = excluded.body, signatures = excluded.signatures",
    )
    .and_then(|mut stmt| stmt.execute(params![item.id(), role, status, body, signatures]))
    .map_err(|e| sqlite_error(dir, id, &format!("write item {}", item.id()))(e))?;
    Ok(())
}

/// The `role` and `status` columns of an item (user items have no status).
fn role_and_status(item: &TranscriptItem) -> (&'static str, Option<&'static str>) {
    match item {
        TranscriptItem::User(_) => ("user", None),
        TranscriptItem::Assistant(a) => (
            "assistant",
            Some(match a.status {
                AssistantStatus::Streaming => "streaming",
                AssistantStatus::Complete(_) => "complete",
                AssistantStatus::Error => "error",
                AssistantStatus::Aborted => "aborted",
            }),
        ),
        TranscriptItem::Tool(t) => (
            "tool",
            Some(match t.status {
                ToolStatus::Running => "running",
                ToolStatus::Complete => "complete",
                ToolStatus::Error => "error",
            }),
        ),
    }
}

/// Loads the state row and the transcript, oldest item first.
pub(super) fn load(
    conn: &Connection,
    dir: &Path,
    id: &str,
) -> Result<(StateRow, Vec<TranscriptItem>), StoreError> {
    let row = conn
        .query_row(
            "SELECT revision, updated_at, model_provider, model_id, thinking_level, queued_steer,
                    summary_text, summary_through, summary_usage, approvals
             FROM state WHERE id = 1",
            [],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, Vec<u8>>(5)?,
                    row.get::<_, Option<String>>(6)?,
                    row.get::<_, Option<String>>(7)?,
                    row.get::<_, Option<Vec<u8>>>(8)?,
                    row.get::<_, Option<Vec<u8>>>(9)?,
                ))
            },
        )
        .optional()
        .map_err(sqlite_error(dir, id, "read the state row"))?;
    let Some((
        revision,
        updated_at,
        provider,
        model_id,
        level,
        steer,
        summary_text,
        summary_through,
        summary_usage,
        approvals,
    )) = row
    else {
        return Err(corrupt(dir, id, "its state row is missing"));
    };
    let thinking_level = ThinkingLevel::parse(&level).ok_or_else(|| {
        corrupt(
            dir,
            id,
            format!("unknown thinking level {level:?} in the state row"),
        )
    })?;
    if provider.is_empty() || model_id.is_empty() {
        return Err(corrupt(dir, id, "empty model in the state row"));
    }
    let queued_steer = decode_steer(&steer).map_err(|problem| corrupt(dir, id, problem))?;
    let revision = u64::try_from(revision).map_err(|_| {
        corrupt(
            dir,
            id,
            format!("negative revision {revision} in the state row"),
        )
    })?;
    let updated_at = u64::try_from(updated_at).map_err(|_| {
        corrupt(
            dir,
            id,
            format!("negative updated_at {updated_at} in the state row"),
        )
    })?;
    let summary_usage = summary_usage
        .map(|blob| decode_usage(&blob))
        .transpose()
        .map_err(|problem| corrupt(dir, id, problem))?;
    let approvals = approvals
        .map(|blob| decode_approvals(&blob))
        .transpose()
        .map_err(|problem| corrupt(dir, id, problem))?
        .unwrap_or_default();
    let state = StateRow {
        approvals,
        revision,
        updated_at,
        model: ModelRef {
            provider,
            id: model_id,
        },
        thinking_level,
        queued_steer,
        summary: match (summary_text, summary_through) {
            (Some(text), Some(through)) => Some(Summary {
                text,
                through,
                usage: summary_usage,
            }),
            _ => None,
        },
    };

    let mut stmt = conn
        .prepare("SELECT item_id, body, signatures FROM items ORDER BY seq")
        .map_err(sqlite_error(dir, id, "read the transcript"))?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, Option<Vec<u8>>>(2)?,
            ))
        })
        .map_err(sqlite_error(dir, id, "read the transcript"))?;
    let mut transcript = Vec::new();
    for row in rows {
        let (item_id, body, signatures) =
            row.map_err(sqlite_error(dir, id, "read the transcript"))?;
        let item = decode_item(&body)
            .and_then(|mut item| {
                if let Some(blob) = signatures {
                    decode_signatures(&mut item, &blob)?;
                }
                Ok(item)
            })
            .map_err(|problem| {
                corrupt(
                    dir,
                    id,
                    format!("item {item_id:?} does not decode: {problem}"),
                )
            })?;
        if item.id() != item_id {
            return Err(corrupt(
                dir,
                id,
                format!("item {item_id:?} holds an item with id {:?}", item.id()),
            ));
        }
        transcript.push(item);
    }
    Ok((state, transcript))
}

/// Encodes an item as CBOR of its checked wire form.
fn encode_item(item: &TranscriptItem, id: &str) -> Result<Vec<u8>, StoreError> {
    let value = item.to_checked_value().map_err(|e| {
        StoreError::Invalid(format!(
            "Session {id}: cannot store item {:?}: {e}",
            item.id()
        ))
    })?;
    to_cbor(&value).map_err(|e| {
        StoreError::Invalid(format!(
            "Session {id}: cannot store item {:?}: {e}",
            item.id()
        ))
    })
}

/// The signatures of an assistant item's thinking parts, which its wire
/// form leaves out: a CBOR array of `[content index, signature]` pairs, or
/// nothing when none is signed.
fn encode_signatures(item: &TranscriptItem) -> Option<Vec<u8>> {
    let TranscriptItem::Assistant(reply) = item else {
        return None;
    };
    let pairs: Vec<Value> = reply
        .content
        .iter()
        .enumerate()
        .filter_map(|(index, part)| match part {
            Content::Thinking {
                signature: Some(signature),
                ..
            } => Some(Value::Array(vec![
                Value::Int(index as i64),
                Value::text(signature),
            ])),
            _ => None,
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    Some(to_cbor(&Value::Array(pairs)).expect("a list of pairs encodes"))
}

/// Puts the signatures [`encode_signatures`] kept back into their parts.
fn decode_signatures(item: &mut TranscriptItem, blob: &[u8]) -> Result<(), String> {
    let value = cbor::decode(blob, &CborLimits::default())
        .map_err(|e| format!("its signatures are invalid CBOR: {e}"))?;
    let TranscriptItem::Assistant(reply) = item else {
        return Err("signatures of an item that is not a reply".into());
    };
    let Value::Array(pairs) = value else {
        return Err("its signatures are not a list".into());
    };
    for pair in pairs {
        let Value::Array(pair) = pair else {
            return Err("a signature is not a pair".into());
        };
        let Ok([Value::Int(index), Value::Text(signature)]) = <[Value; 2]>::try_from(pair) else {
            return Err("a signature is not an index and a text".into());
        };
        match usize::try_from(index)
            .ok()
            .and_then(|i| reply.content.get_mut(i))
        {
            Some(Content::Thinking { signature: s, .. }) => *s = Some(signature),
            _ => {
                return Err(format!(
                    "a signature of part {index}, which is not thinking"
                ));
            }
        }
    }
    Ok(())
}

fn decode_item(body: &[u8]) -> Result<TranscriptItem, String> {
    let value =
        cbor::decode(body, &CborLimits::default()).map_err(|e| format!("invalid CBOR: {e}"))?;
    TranscriptItem::from_value(&value, "item").map_err(|e| e.to_string())
}

/// Encodes the steer queue as a CBOR array of user items.
fn encode_steer(steer: &[UserItem], id: &str) -> Result<Vec<u8>, StoreError> {
    let values = steer
        .iter()
        .map(|item| {
            item.to_checked_value().map_err(|e| {
                StoreError::Invalid(format!(
                    "Session {id}: cannot store steer message {:?}: {e}",
                    item.id
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    to_cbor(&Value::Array(values)).map_err(|e| {
        StoreError::Invalid(format!("Session {id}: cannot store the steer queue: {e}"))
    })
}

/// The summary calls' usage as CBOR (the protocol's `Usage` schema).
fn encode_summary_usage(
    summary: Option<&Summary>,
    id: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(usage) = summary.and_then(|s| s.usage.as_ref()) else {
        return Ok(None);
    };
    let value = usage.to_checked_value().map_err(|e| {
        StoreError::Invalid(format!(
            "Session {id}: cannot store the summary's usage: {e}"
        ))
    })?;
    to_cbor(&value).map(Some).map_err(|e| {
        StoreError::Invalid(format!(
            "Session {id}: cannot store the summary's usage: {e}"
        ))
    })
}

/// The approvals as CBOR ([`Approvals`]' schema); none when they are the
/// default (no policy of the session's own, nothing allowed or asked).
fn encode_approvals(approvals: &Approvals, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
    if *approvals == Approvals::default() {
        return Ok(None);
    }
    to_cbor(&approvals.to_value())
        .map(Some)
        .map_err(|e| StoreError::Invalid(format!("Session {id}: cannot store the approvals: {e}")))
}

fn decode_approvals(blob: &[u8]) -> Result<Approvals, String> {
    let value = cbor::decode(blob, &CborLimits::default())
        .map_err(|e| format!("the approvals are invalid CBOR: {e}"))?;
    Approvals::from_value_at(&value, &SchemaPath::Root("approvals")).map_err(|e| e.to_string())
}

fn decode_usage(blob: &[u8]) -> Result<Usage, String> {
    let value = cbor::decode(blob, &CborLimits::default())
        .map_err(|e| format!("the summary's usage is invalid CBOR: {e}"))?;
    Usage::from_value_at(&value, &SchemaPath::Root("summaryUsage")).map_err(|e| e.to_string())
}

fn decode_steer(blob: &[u8]) -> Result<Vec<UserItem>, String> {
    let value = cbor::decode(blob, &CborLimits::default())
        .map_err(|e| format!("the queued steer messages are invalid CBOR: {e}"))?;
    let Value::Array(values) = &value else {
        return Err(format!(
            "the queued steer messages are a {}, not an array",
            value.kind()
        ));
    };
    let root = SchemaPath::Root("queuedSteer");
    values
        .iter()
        .enumerate()
        .map(|(i, v)| UserItem::from_value_at(v, &root.index(i)).map_err(|e| e.to_string()))
        .collect()
}

/// A counter or timestamp as an SQLite integer.
fn to_sql_int(n: u64, what: &str, id: &str) -> Result<i64, StoreError> {
    i64::try_from(n)
        .map_err(|_| StoreError::Invalid(format!("Session {id}: {what} {n} is out of range")))
}

fn to_cbor(value: &Value) -> Result<Vec<u8>, cbor::CborError> {
    let mut out = Vec::new();
    cbor::encode(value, &mut out)?;
    Ok(out)
}

/// `PRAGMA integrity_check`, its rows joined by newlines.
pub(super) fn integrity_check(
    conn: &Connection,
    dir: &Path,
    id: &str,
) -> Result<String, StoreError> {
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .map_err(sqlite_error(dir, id, "run integrity_check"))?;
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(sqlite_error(dir, id, "run integrity_check"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sqlite_error(dir, id, "run integrity_check"))?;
    Ok(rows.join("\n"))
}

/// `PRAGMA wal_checkpoint(TRUNCATE)`. A checkpoint blocked by a reader is
/// logged, not an error: the log is checkpointed later.
pub(super) fn checkpoint(conn: &Connection, dir: &Path, id: &str) -> Result<(), StoreError> {
    let busy: i64 = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get(0))
        .map_err(sqlite_error(dir, id, "checkpoint the write-ahead log"))?;
    if busy != 0 {
        tracing::warn!(session = %id, "wal_checkpoint(TRUNCATE) could not complete: a reader holds the database");
    }
    Ok(())
}
