//! `meta.json`: the catalog data of one session, written atomically.

use super::{META_FILE, StoreError, sync_dir};
use kernel::protocol::{ModelRef, ThinkingLevel};
use kernel::runtime::StoredSession;
use kernel::wire::MAX_SAFE_INTEGER;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Name of the temporary file `meta.json` is written to before the rename.
const META_TMP_FILE: &str = "meta.json.tmp";

/// The contents of `meta.json`, typed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Meta {
    pub(super) created_at: u64,
    pub(super) cwd: String,
    pub(super) name: Option<String>,
    pub(super) model: ModelRef,
    pub(super) thinking_level: ThinkingLevel,
    /// The first prompt, cut for `list` (`kernel::server::preview`).
    pub(super) preview: Option<String>,
}

impl Meta {
    /// The metadata of a session.
    pub(super) fn of(session: &StoredSession) -> Self {
        Self {
            created_at: session.created_at,
            cwd: session.cwd.clone(),
            name: session.name.clone(),
            model: session.model.clone(),
            thinking_level: session.thinking_level,
            preview: first_prompt(&session.transcript),
        }
    }

    /// Checks what the protocol requires of these fields (they end up in
    /// snapshots and the catalog).
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.created_at > MAX_SAFE_INTEGER as u64 {
            return Err(format!("createdAt {} is out of range", self.created_at));
        }
        if self.cwd.is_empty() {
            return Err("cwd is empty".to_owned());
        }
        if self.model.provider.is_empty() || self.model.id.is_empty() {
            return Err("model.provider and model.id must be non-empty".to_owned());
        }
        Ok(())
    }
}

/// The JSON shape, keys in file order.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaFile {
    created_at: u64,
    cwd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    model: ModelFile,
    thinking_level: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    preview: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct ModelFile {
    provider: String,
    id: String,
}

/// The JSON text of `meta`: tab-indented, with a trailing newline.
pub(super) fn render(meta: &Meta) -> Vec<u8> {
    let file = MetaFile {
        created_at: meta.created_at,
        cwd: meta.cwd.clone(),
        name: meta.name.clone(),
        model: ModelFile {
            provider: meta.model.provider.clone(),
            id: meta.model.id.clone(),
        },
        thinking_level: meta.thinking_level.as_str().to_owned(),
        preview: meta.preview.clone(),
    };
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(b"\t"),
    );
    file.serialize(&mut serializer)
        .expect("serialising plain data to memory cannot fail");
    out.push(b'\n');
    out
}

/// Parses and validates the JSON text of a `meta.json`.
pub(super) fn parse(text: &[u8]) -> Result<Meta, String> {
    let file: MetaFile = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let thinking_level = ThinkingLevel::parse(&file.thinking_level)
        .ok_or_else(|| format!("unknown thinkingLevel {:?}", file.thinking_level))?;
    let meta = Meta {
        created_at: file.created_at,
        cwd: file.cwd,
        name: file.name,
        model: ModelRef {
            provider: file.model.provider,
            id: file.model.id,
        },
        thinking_level,
        preview: file.preview,
    };
    meta.validate()?;
    Ok(meta)
}

/// The preview of the first prompt among `items`, if any.
pub(super) fn first_prompt<'a>(
    items: impl IntoIterator<Item = &'a kernel::protocol::TranscriptItem>,
) -> Option<String> {
    items.into_iter().find_map(|item| match item {
        kernel::protocol::TranscriptItem::User(user) => {
            let text = kernel::client::follow::text_of(&user.content);
            Some(kernel::server::preview(&text))
        }
        _ => None,
    })
}

/// The `meta.json` pi's own durable server writes: `{createdAt, cwd}`,
/// nothing else (no model: pi picks one when it first opens the session).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PiMetaFile {
    created_at: u64,
    cwd: String,
}

/// A session directory's `meta.json`: ours, or pi's.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum AnyMeta {
    Ours(Meta),
    /// pi's: when it was created and where.
    Pi {
        created_at: u64,
        cwd: String,
    },
}

/// Reads `<dir>/meta.json` as ours or, failing that, as pi's; the error is
/// [`read`]'s.
pub(super) fn read_any(dir: &Path, id: &str) -> Result<AnyMeta, StoreError> {
    match read(dir, id) {
        Ok(meta) => Ok(AnyMeta::Ours(meta)),
        Err(StoreError::Corrupt(why)) => {
            let text = fs::read(dir.join(META_FILE))
                .map_err(|e| StoreError::io(format!("Session {id}: cannot read {META_FILE}"), e))?;
            match serde_json::from_slice::<PiMetaFile>(&text) {
                Ok(pi) if !pi.cwd.is_empty() && pi.created_at <= MAX_SAFE_INTEGER as u64 => {
                    Ok(AnyMeta::Pi {
                        created_at: pi.created_at,
                        cwd: pi.cwd,
                    })
                }
                _ => Err(StoreError::Corrupt(why)),
            }
        }
        Err(error) => Err(error),
    }
}

/// Reads `<dir>/meta.json`: [`StoreError::NotFound`] if it is missing,
/// [`StoreError::Corrupt`] if it is not a valid metadata file.
pub(super) fn read(dir: &Path, id: &str) -> Result<Meta, StoreError> {
    let path = dir.join(META_FILE);
    let text = match fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StoreError::NotFound(format!(
                "Session {id} not found ({} does not exist)",
                path.display()
            )));
        }
        Err(e) => {
            return Err(StoreError::io(
                format!("Session {id}: cannot read {}", path.display()),
                e,
            ));
        }
    };
    parse(&text).map_err(|problem| {
        StoreError::Corrupt(format!(
            "Session {id} is corrupt: invalid {}: {problem}",
            path.display()
        ))
    })
}

/// Replaces `<dir>/meta.json` atomically: writes and fsyncs a temporary
/// file, renames it over `meta.json` and fsyncs the directory.
pub(super) fn write(dir: &Path, id: &str, meta: &Meta) -> Result<(), StoreError> {
    replace(dir, id, META_FILE, META_TMP_FILE, &render(meta))
}

/// Replaces `dir/name` with `bytes`, durably: written to `dir/tmp_name`,
/// synced, renamed over, and the directory synced.
pub(super) fn replace(
    dir: &Path,
    id: &str,
    name: &str,
    tmp_name: &str,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let tmp = dir.join(tmp_name);
    let path = dir.join(name);
    let io_error = |what: &str, e| StoreError::io(format!("Session {id}: cannot {what}"), e);
    let mut file =
        File::create(&tmp).map_err(|e| io_error(&format!("create {}", tmp.display()), e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(&format!("write {}", tmp.display()), e))?;
    drop(file);
    fs::rename(&tmp, &path).map_err(|e| {
        io_error(
            &format!("rename {} to {}", tmp.display(), path.display()),
            e,
        )
    })?;
    sync_dir(dir, id)
}
