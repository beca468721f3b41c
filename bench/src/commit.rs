//! Item 4: transcript commit — `SessionStore::apply` of one item against a
//! raw rusqlite insert of the same bytes into the same table, with the same
//! settings (WAL, `synchronous=NORMAL`, one `BEGIN IMMEDIATE` transaction
//! each).

use crate::rtt::Pair;
use crate::server::stored_session;
use crate::util::{Env, Report, fmt_us, median, us};
use kernel::faux;
use kernel::protocol::codec::Schema;
use kernel::protocol::{
    AssistantItem, AssistantStatus, Content, StopReason, TranscriptItem, Usage,
};
use kernel::runtime::Persist;
use kernel::wire::cbor;
use pi_store::SessionStore;
use rusqlite::{Connection, TransactionBehavior, params};
use std::time::Instant;

/// A finished assistant reply of about `text_len` bytes.
pub(crate) fn assistant_item(id: &str, text_len: usize) -> TranscriptItem {
    let text: String = "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(text_len)
        .collect();
    TranscriptItem::Assistant(AssistantItem {
        id: id.into(),
        content: vec![Content::Text { text }],
        model: faux::default_model(),
        response_model: None,
        usage: Some(Usage {
            input: 120,
            output: 240,
            total_tokens: 360,
            ..Usage::default()
        }),
        timestamp: 1_700_000_000_000,
        status: AssistantStatus::Complete(StopReason::Stop),
        error_message: None,
    })
}

/// The same item body as the store writes it (CBOR of the checked wire form).
fn body(item: &TranscriptItem) -> Vec<u8> {
    let mut out = Vec::new();
    cbor::encode(&item.to_checked_value().expect("valid"), &mut out).expect("encodes");
    out
}

/// A raw database with the store's `items` table and connection settings.
fn raw_db(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    assert!(mode.eq_ignore_ascii_case("wal"));
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(
        "CREATE TABLE items (
            seq     INTEGER PRIMARY KEY,
            item_id TEXT NOT NULL UNIQUE,
            role    TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
            status  TEXT,
            body    BLOB NOT NULL
        ) STRICT;",
    )?;
    Ok(conn)
}

/// Item 4.
pub(crate) fn run(env: &Env, report: &mut Report) -> Result<(), String> {
    let n = env.pick(200, 1000);
    for text_len in [200usize, 4000] {
        let dir = env.fresh_dir("commit");
        let mut store =
            SessionStore::create(&dir.join("sessions"), &stored_session("commit-bench", 1))
                .map_err(|e| e.to_string())?;
        let mut raw = raw_db(&dir.join("raw.sqlite")).map_err(|e| e.to_string())?;
        let mut next = 0usize;
        let mut batch = |count: usize| -> Vec<TranscriptItem> {
            (0..count)
                .map(|_| {
                    next += 1;
                    assistant_item(&format!("item-{next}"), text_len)
                })
                .collect()
        };
        let bytes = body(&assistant_item("item-0", text_len)).len();

        let mut raw_commits = |items: &[TranscriptItem]| -> Result<Vec<f64>, String> {
            // The raw side writes bytes encoded beforehand: only SQLite is timed.
            let bodies: Vec<(String, Vec<u8>)> = items
                .iter()
                .map(|i| (i.id().to_string(), body(i)))
                .collect();
            let mut samples = Vec::with_capacity(items.len());
            for (id, body) in &bodies {
                let start = Instant::now();
                let tx = raw
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(|e| e.to_string())?;
                tx.prepare_cached(
                    "INSERT INTO items (item_id, role, status, body) VALUES (?1, ?2, ?3, ?4)",
                )
                .and_then(|mut s| s.execute(params![id, "assistant", "complete", body]))
                .map_err(|e| e.to_string())?;
                tx.commit().map_err(|e| e.to_string())?;
                samples.push(us(start.elapsed()));
            }
            Ok(samples)
        };
        let mut store_commits = |items: Vec<TranscriptItem>| -> Result<Vec<f64>, String> {
            let mut samples = Vec::with_capacity(items.len());
            for item in items {
                let write = [Persist::Item(item)];
                let start = Instant::now();
                store.apply(&write).map_err(|e| e.to_string())?;
                samples.push(us(start.elapsed()));
            }
            Ok(samples)
        };
        // Warm up both.
        let warm = batch(n / 5);
        raw_commits(&warm)?;
        store_commits(warm)?;
        let mut pair = Pair::default();
        for _ in 0..env.rounds {
            let a_items = batch(n);
            let b_items = batch(n);
            let a = raw_commits(&a_items)?;
            let b = store_commits(b_items)?;
            pair.round(a, b);
        }
        let ratio = pair.ratio();
        // Where the difference goes: the item's encoding with and without the schema check.
        let item = assistant_item("item-x", text_len);
        let reps = env.pick(2000, 20000);
        let time = |checked: bool| {
            let start = Instant::now();
            for _ in 0..reps {
                let value = if checked {
                    item.to_checked_value().expect("valid")
                } else {
                    item.to_value()
                };
                let mut out = Vec::new();
                cbor::encode(&value, &mut out).expect("encodes");
                std::hint::black_box(out);
            }
            us(start.elapsed()) / reps as f64
        };
        let checked = median(&[time(true), time(true), time(true)]);
        let unchecked = median(&[time(false), time(false), time(false)]);
        report.push(
            "4",
            format!("transcript commit of one assistant item ({bytes} B body): `SessionStore::apply` vs raw rusqlite insert"),
            format!(
                "apply {} / raw {} → **{ratio:.2}×** ({}); encoding inside apply: {} checked, {} unchecked",
                crate::rtt::Pair::describe(&pair.b),
                crate::rtt::Pair::describe(&pair.a),
                pair.spread(),
                fmt_us(checked),
                fmt_us(unchecked)
            ),
            "≤ 1.5×",
            Some(ratio <= 1.5),
        );
        drop(store);
    }
    Ok(())
}
