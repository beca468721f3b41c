use super::*;
use kernel::protocol::ErrorCode;
use kernel::protocol::{
    AssistantItem, AssistantStatus, Content, ModelRef, StopReason, ThinkingLevel, ToolItem,
    ToolStatus, TranscriptItem, Usage, UsageCost, UserItem,
};
use kernel::wire::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "pi-store-test-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// The session directory (not created: the store makes it).
    fn sessions(&self) -> PathBuf {
        self.0.join("sessions")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn model() -> ModelRef {
    ModelRef {
        provider: "faux".into(),
        id: "faux-1".into(),
    }
}

fn user(id: &str, text: &str) -> UserItem {
    UserItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        timestamp: 1_000,
    }
}

fn assistant(id: &str, text: &str, status: AssistantStatus) -> AssistantItem {
    AssistantItem {
        id: id.into(),
        content: vec![
            Content::Thinking {
                thinking: "hmm".into(),
                redacted: None,
                signature: None,
            },
            Content::Text { text: text.into() },
            Content::ToolCall {
                tool_call_id: "call-1".into(),
                tool_name: "read".into(),
                input: Value::Map(vec![("path".into(), Value::text("a.txt"))]),
            },
        ],
        model: model(),
        response_model: None,
        usage: (status != AssistantStatus::Streaming).then_some(Usage {
            input: 10,
            output: 20,
            cache_read: 0,
            cache_write: 0,
            reasoning: Some(5),
            total_tokens: 30,
            cost: UsageCost {
                input: 0.5,
                output: 1.25,
                cache_read: 0.0,
                cache_write: 0.0,
                total: 1.75,
            },
        }),
        timestamp: 2_000,
        status,
        error_message: None,
    }
}

fn tool(id: &str, status: ToolStatus) -> ToolItem {
    ToolItem {
        id: id.into(),
        tool_call_id: "call-1".into(),
        tool_name: "read".into(),
        input: Value::Map(vec![("path".into(), Value::text("a.txt"))]),
        content: vec![Content::Text {
            text: "file contents".into(),
        }],
        details: Some(Value::Array(vec![
            Value::Int(1),
            Value::Float(2.5),
            Value::Null,
        ])),
        usage: None,
        timestamp: 3_000,
        status,
    }
}

fn session(id: &str) -> StoredSession {
    StoredSession {
        id: id.into(),
        name: Some("My session".into()),
        cwd: "/home/me/project".into(),
        created_at: 1_700_000_000_000,
        updated_at: 1_700_000_000_000,
        model: model(),
        thinking_level: ThinkingLevel::Off,
        revision: 1,
        transcript: vec![TranscriptItem::User(user("u0", "hello"))],
        queued_steer: vec![],
        summary: None,
        approvals: Default::default(),
    }
}

fn state_of(s: &StoredSession) -> Persist {
    Persist::State {
        revision: s.revision,
        updated_at: s.updated_at,
        name: s.name.clone(),
        model: s.model.clone(),
        thinking_level: s.thinking_level,
        queued_steer: s.queued_steer.clone(),
        summary: s.summary.clone(),
        approvals: s.approvals.clone(),
    }
}

#[test]
fn create_open_round_trip_with_upsert_in_place() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut expected = session("s1");
    let mut store = SessionStore::create(&dir, &expected).unwrap();
    assert_eq!(store.id(), "s1");
    assert_eq!(store.dir(), dir.join("s1"));

    // A turn: the prompt and a streaming reply, ...
    let u1 = TranscriptItem::User(user("u1", "read a.txt"));
    let streaming =
        TranscriptItem::Assistant(assistant("a1", "let me", AssistantStatus::Streaming));
    expected.revision = 2;
    expected.queued_steer = vec![user("st1", "also b.txt")];
    // The session asks before `bash`, and a question waits.
    expected.approvals = kernel::approval::Approvals {
        policy: Some(kernel::approval::ApprovalPolicy::Ask),
        always: vec!["edit".into()],
        pending: vec![kernel::approval::Question {
            id: "t0".into(),
            call_id: "call-0".into(),
            tool: "bash".into(),
            input: Value::object(vec![("command", Value::text("ls"))]),
            asked_at: 1_700_000_000_100,
        }],
    };
    store
        .apply(&[
            Persist::Item(u1.clone()),
            Persist::Item(streaming),
            state_of(&expected),
        ])
        .unwrap();
    // ... then the reply completes (upsert of a1), a tool runs, the settings change.
    let complete = TranscriptItem::Assistant(assistant(
        "a1",
        "let me read it",
        AssistantStatus::Complete(StopReason::ToolUse),
    ));
    let t1 = TranscriptItem::Tool(tool("t1", ToolStatus::Complete));
    expected.revision = 3;
    expected.updated_at = 1_700_000_000_500;
    expected.model = ModelRef {
        provider: "other".into(),
        id: "big-2".into(),
    };
    expected.thinking_level = ThinkingLevel::High;
    expected.queued_steer = vec![];
    // Answered: the policy and `always` stay.
    expected.approvals.pending.clear();
    store
        .apply(&[
            Persist::Item(t1.clone()),
            Persist::Item(complete.clone()),
            state_of(&expected),
        ])
        .unwrap();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    store.close().unwrap();

    expected.transcript = vec![expected.transcript[0].clone(), u1, complete, t1];
    let (store, loaded) = SessionStore::open(&dir, "s1").unwrap();
    assert_eq!(loaded, expected);
    assert_eq!(store.integrity_check().unwrap(), "ok");
    store.close().unwrap();

    // Clean close leaves no write-ahead log behind.
    let wal = dir.join("s1").join("session.sqlite-wal");
    assert!(!wal.exists() || fs::metadata(&wal).unwrap().len() == 0);

    // meta.json: tab-indented, trailing newline, follows the settings, and
    // previews the first prompt for `list`.
    let text = fs::read_to_string(dir.join("s1").join(META_FILE)).unwrap();
    assert_eq!(
        text,
        "{\n\t\"createdAt\": 1700000000000,\n\t\"cwd\": \"/home/me/project\",\n\t\"name\": \"My session\",\n\
         \t\"model\": {\n\t\t\"provider\": \"other\",\n\t\t\"id\": \"big-2\"\n\t},\n\t\"thinkingLevel\": \"high\",\n\
         \t\"preview\": \"hello\"\n}\n"
    );

    // The inspection columns.
    let conn = Connection::open(dir.join("s1").join(DB_FILE)).unwrap();
    let rows: Vec<(i64, String, String, Option<String>)> = conn
        .prepare("SELECT seq, item_id, role, status FROM items ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let rows: Vec<_> = rows
        .iter()
        .map(|(_, id, role, status)| (id.as_str(), role.as_str(), status.as_deref()))
        .collect();
    assert_eq!(
        rows,
        [
            ("u0", "user", None),
            ("u1", "user", None),
            ("a1", "assistant", Some("complete")),
            ("t1", "tool", Some("complete")),
        ]
    );
    let version: u32 = conn
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, db::latest_version());
}

#[test]
fn session_without_name_or_transcript_round_trips() {
    let tmp = TempDir::new();
    let mut s = session("bare");
    s.name = None;
    s.transcript.clear();
    SessionStore::create(&tmp.sessions(), &s)
        .unwrap()
        .close()
        .unwrap();
    let text = fs::read_to_string(tmp.sessions().join("bare").join(META_FILE)).unwrap();
    assert!(!text.contains("name"), "{text}");
    let (_store, loaded) = SessionStore::open(&tmp.sessions(), "bare").unwrap();
    assert_eq!(loaded, s);
}

#[test]
fn migrations_are_numbered_in_order() {
    for (i, m) in db::MIGRATIONS.iter().enumerate() {
        assert_eq!(m.version as usize, i + 1, "{}", m.description);
    }
}

#[test]
fn invalid_ids_are_rejected_before_touching_the_disk() {
    let long_ok = "a".repeat(128);
    for id in ["a", "A-b_c.d", "0", "x..y", long_ok.as_str()] {
        validate_session_id(id).unwrap();
    }
    let long_bad = "a".repeat(129);
    for id in [
        "",
        ".",
        "..",
        ".hidden",
        "-x",
        "_x",
        "a/b",
        "a b",
        "a\0b",
        "é",
        "a\\b",
        long_bad.as_str(),
    ] {
        let err = validate_session_id(id).unwrap_err();
        assert!(matches!(err, StoreError::InvalidId(_)), "{id:?}");
        assert!(err.to_string().starts_with("Invalid session id"), "{err}");
        assert_eq!(err.failure().code(), ErrorCode::InvalidRequest);

        let tmp = TempDir::new();
        let dir = tmp.sessions();
        let mut s = session("x");
        s.id = id.into();
        assert!(matches!(
            SessionStore::create(&dir, &s),
            Err(StoreError::InvalidId(_))
        ));
        assert!(matches!(
            SessionStore::open(&dir, id),
            Err(StoreError::InvalidId(_))
        ));
        assert!(matches!(
            remove_session(&dir, id),
            Err(StoreError::InvalidId(_))
        ));
        assert!(!dir.exists(), "{id:?} touched the disk");
    }
}

#[test]
fn existing_id_is_rejected() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    SessionStore::create(&dir, &session("dup"))
        .unwrap()
        .close()
        .unwrap();
    let err = SessionStore::create(&dir, &session("dup")).unwrap_err();
    assert!(matches!(err, StoreError::Exists(_)), "{err:?}");
    assert!(
        err.to_string().starts_with("Session dup already exists"),
        "{err}"
    );
    // The existing session is untouched.
    let (_store, loaded) = SessionStore::open(&dir, "dup").unwrap();
    assert_eq!(loaded, session("dup"));
}

#[test]
fn invalid_initial_state_is_rejected_and_leaves_nothing() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut s = session("bad");
    s.cwd = String::new();
    assert!(matches!(
        SessionStore::create(&dir, &s),
        Err(StoreError::Invalid(_))
    ));
    let mut s = session("bad");
    s.transcript
        .push(TranscriptItem::User(user("", "empty id")));
    assert!(matches!(
        SessionStore::create(&dir, &s),
        Err(StoreError::Invalid(_))
    ));
    assert!(!dir.join("bad").exists());
    SessionStore::create(&dir, &session("bad")).unwrap();
}

#[test]
fn a_failing_batch_commits_nothing() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut store = SessionStore::create(&dir, &session("atomic")).unwrap();
    let mut changed = session("atomic");
    changed.revision = 9;
    changed.thinking_level = ThinkingLevel::Max;
    let err = store
        .apply(&[
            Persist::Item(TranscriptItem::User(user("ok", "fine"))),
            state_of(&changed),
            Persist::Item(TranscriptItem::User(user("", "empty id is invalid"))),
        ])
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    store.close().unwrap();
    let (_store, loaded) = SessionStore::open(&dir, "atomic").unwrap();
    assert_eq!(loaded, session("atomic"));
    let text = fs::read_to_string(dir.join("atomic").join(META_FILE)).unwrap();
    assert!(text.contains("\"off\""), "{text}");
}

#[test]
fn lock_excludes_a_second_opener_until_released() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let store = SessionStore::create(&dir, &session("busy")).unwrap();

    let err = SessionStore::open(&dir, "busy").unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("Session busy is locked by another worker"),
        "{message}"
    );
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );
    assert_eq!(err.failure().code(), ErrorCode::SessionLocked);

    drop(store); // released on drop, not only on close
    let (store, _) = SessionStore::open(&dir, "busy").unwrap();
    assert!(matches!(
        SessionStore::open(&dir, "busy"),
        Err(StoreError::Locked(_))
    ));
    store.close().unwrap();
    SessionStore::open(&dir, "busy").unwrap();
}

/// The lock file names its holder and the server it serves: a starting
/// server reads that as the evidence of an orphan, and a refused opener is
/// told which server holds the session and how to reach it.
#[test]
fn the_lock_names_its_holder_and_server() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    assert_eq!(live_holder(&dir, "held"), None, "no session, no holder");
    let mut store = SessionStore::create(&dir, &session("held")).unwrap();
    let me = std::process::id();
    assert_eq!(
        live_holder(&dir, "held"),
        Some(LockHolder {
            pid: me,
            server: None
        })
    );
    let socket = tmp.0.join("srv").join("alpha.workers.sock");
    store.record_server(&socket);
    assert_eq!(
        live_holder(&dir, "held"),
        Some(LockHolder {
            pid: me,
            server: Some(socket.clone())
        })
    );
    let message = SessionStore::open(&dir, "held").unwrap_err().to_string();
    assert!(
        message.contains(&format!("worker pid {me} of server alpha"))
            && message.contains(&format!(
                "--server-dir {} --server-id alpha",
                tmp.0.join("srv").display()
            )),
        "{message}"
    );
    store.close().unwrap();
    assert_eq!(
        live_holder(&dir, "held"),
        None,
        "a stale file naming a live pid is not a holder"
    );
}

#[test]
fn missing_sessions_are_not_found() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let err = SessionStore::open(&dir, "nope").unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    assert!(
        err.to_string().starts_with("Session nope not found"),
        "{err}"
    );
    assert_eq!(err.failure().code(), ErrorCode::NotFound);

    fs::create_dir_all(dir.join("empty")).unwrap();
    assert!(matches!(
        SessionStore::open(&dir, "empty"),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        remove_session(&dir, "nope"),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn damaged_sessions_are_corrupt() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();

    SessionStore::create(&dir, &session("nodb"))
        .unwrap()
        .close()
        .unwrap();
    fs::remove_file(dir.join("nodb").join(DB_FILE)).unwrap();
    let err = SessionStore::open(&dir, "nodb").unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");

    SessionStore::create(&dir, &session("newer"))
        .unwrap()
        .close()
        .unwrap();
    let conn = Connection::open(dir.join("newer").join(DB_FILE)).unwrap();
    conn.execute("UPDATE schema_version SET version = 99", [])
        .unwrap();
    drop(conn);
    let err = SessionStore::open(&dir, "newer").unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt(m) if m.contains("schema version 99")),
        "{err:?}"
    );

    SessionStore::create(&dir, &session("badmeta"))
        .unwrap()
        .close()
        .unwrap();
    fs::write(dir.join("badmeta").join(META_FILE), "{\"createdAt\": -1}").unwrap();
    let err = SessionStore::open(&dir, "badmeta").unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
}

#[test]
fn open_repairs_a_stale_meta_json() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut s = session("stale");
    let mut store = SessionStore::create(&dir, &s).unwrap();
    let before = fs::read(dir.join("stale").join(META_FILE)).unwrap();
    s.revision = 2;
    s.thinking_level = ThinkingLevel::Low;
    store.apply(&[state_of(&s)]).unwrap();
    store.close().unwrap();
    // As if the worker died between the commit and the meta.json rewrite.
    fs::write(dir.join("stale").join(META_FILE), &before).unwrap();

    let (_store, loaded) = SessionStore::open(&dir, "stale").unwrap();
    assert_eq!(loaded, s);
    let text = fs::read_to_string(dir.join("stale").join(META_FILE)).unwrap();
    assert!(text.contains("\"thinkingLevel\": \"low\""), "{text}");
}

#[test]
fn a_new_name_is_written_to_meta_json_and_listed() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut s = session("named");
    let mut store = SessionStore::create(&dir, &s).unwrap();
    s.revision = 2;
    s.name = Some("renamed".into());
    store.apply(&[state_of(&s)]).unwrap();
    let listed = scan_catalog(&dir);
    assert_eq!(listed[0].session_name.as_deref(), Some("renamed"));
    store.close().unwrap();
    let (_store, loaded) = SessionStore::open(&dir, "named").unwrap();
    assert_eq!(loaded, s, "the name survives a reopen");
}

#[test]
fn scan_catalog_lists_good_sessions_and_skips_bad_ones() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    assert!(
        scan_catalog(&dir).is_empty(),
        "a missing session dir is an empty catalog"
    );

    for id in ["c", "a", "b"] {
        let mut s = session(id);
        s.created_at = 1_000 + id.as_bytes()[0] as u64;
        SessionStore::create(&dir, &s).unwrap().close().unwrap();
    }
    let mut s = session("open-one");
    s.name = None;
    let _held = SessionStore::create(&dir, &s).unwrap(); // a held lock does not matter
    fs::create_dir(dir.join("no-meta")).unwrap();
    fs::create_dir(dir.join("corrupt")).unwrap();
    fs::write(dir.join("corrupt").join(META_FILE), "{not json").unwrap();
    fs::create_dir(dir.join("bad-level")).unwrap();
    fs::write(
        dir.join("bad-level").join(META_FILE),
        "{\"createdAt\": 1, \"cwd\": \"/\", \"model\": {\"provider\": \"p\", \"id\": \"m\"}, \"thinkingLevel\": \"huge\"}",
    )
    .unwrap();
    fs::create_dir(dir.join(".removing-x-1-0")).unwrap();
    fs::write(dir.join("notes.txt"), "not a session").unwrap();

    let catalog = scan_catalog(&dir);
    let ids: Vec<_> = catalog.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c", "open-one"]);
    assert!(
        !dir.join(".removing-x-1-0").exists(),
        "a removal's leftover files are swept"
    );
    assert_eq!(
        catalog[0],
        SessionMetadata {
            id: "a".into(),
            created_at: 1_000 + b'a' as u64,
            updated_at: None,
            parent_session_id: None,
            session_name: Some("My session".into()),
            cwd: Some("/home/me/project".into()),
        }
    );
    assert_eq!(catalog[3].session_name, None);
}

#[test]
fn remove_needs_the_lock_and_deletes_everything() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let store = SessionStore::create(&dir, &session("gone")).unwrap();
    let err = remove_session(&dir, "gone").unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err:?}");
    assert!(dir.join("gone").join(META_FILE).exists());

    store.close().unwrap();
    remove_session(&dir, "gone").unwrap();
    assert!(!dir.join("gone").exists());
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        0,
        "no tombstone left behind"
    );
    assert!(scan_catalog(&dir).is_empty());
    assert!(matches!(
        remove_session(&dir, "gone"),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        SessionStore::open(&dir, "gone"),
        Err(StoreError::NotFound(_))
    ));
    // The id can be used again.
    SessionStore::create(&dir, &session("gone")).unwrap();
}

#[test]
fn synchronous_full_is_selectable() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let pragmas = |store: &SessionStore| -> (i64, String, i64) {
        let sync = store
            .conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        let mode = store
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        let busy = store
            .conn
            .pragma_query_value(None, "busy_timeout", |r| r.get(0))
            .unwrap();
        (sync, mode, busy)
    };
    let store = SessionStore::create(&dir, &session("normal")).unwrap();
    assert_eq!(pragmas(&store), (1, "wal".to_owned(), 5000));
    let store = SessionStore::create_with(&dir, &session("full"), Synchronous::Full).unwrap();
    assert_eq!(pragmas(&store), (2, "wal".to_owned(), 5000));
    store.close().unwrap();
    let (store, _) = SessionStore::open_with(&dir, "full", Synchronous::Full).unwrap();
    assert_eq!(pragmas(&store).0, 2);
}

/// Env var that turns [`sigkill_loses_no_committed_write`] into the child
/// process it spawns. Its value is the session dir.
const CRASH_CHILD_ENV: &str = "PI_STORE_CRASH_CHILD";
/// What the child prints after each commit, followed by the batch number.
const COMMITTED: &str = "PI_STORE_COMMITTED=";
const CRASH_ID: &str = "crash";

fn crash_items(i: u64) -> (TranscriptItem, TranscriptItem, TranscriptItem) {
    (
        TranscriptItem::User(user(&format!("u{i}"), "go on")),
        TranscriptItem::Assistant(assistant(
            &format!("a{i}"),
            "partial",
            AssistantStatus::Streaming,
        )),
        TranscriptItem::Assistant(assistant(
            &format!("a{i}"),
            "finished",
            AssistantStatus::Complete(StopReason::Stop),
        )),
    )
}

/// The child: appends turns as fast as it can, reporting each committed one.
fn crash_child(dir: &Path) {
    let (mut store, mut state) = SessionStore::open(dir, CRASH_ID).unwrap();
    let started = Instant::now();
    let mut out = io::stdout().lock();
    // Bounded in case the parent died without killing us.
    for i in 0.. {
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
        let (u, streaming, complete) = crash_items(i);
        store
            .apply(&[Persist::Item(u), Persist::Item(streaming)])
            .unwrap();
        state.revision += 1;
        store
            .apply(&[Persist::Item(complete), state_of(&state)])
            .unwrap();
        writeln!(out, "\n{COMMITTED}{i}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn sigkill_loses_no_committed_write() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD_ENV) {
        crash_child(Path::new(&dir));
        return;
    }
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut initial = session(CRASH_ID);
    initial.transcript.clear();
    SessionStore::create(&dir, &initial)
        .unwrap()
        .close()
        .unwrap();

    let test_name = format!(
        "{}::sigkill_loses_no_committed_write",
        module_path!()
            .split_once("::")
            .map_or(module_path!(), |(_, rest)| rest)
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            test_name.as_str(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_CHILD_ENV, &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) = line
                .find(COMMITTED)
                .and_then(|at| line[at + COMMITTED.len()..].trim().parse::<u64>().ok())
            {
                let _ = tx.send(n);
            }
        }
    });

    let first = rx.recv_timeout(Duration::from_secs(30));
    let first_at = Instant::now();
    if first.is_ok() {
        std::thread::sleep(Duration::from_millis(200));
    }
    child.kill().unwrap(); // SIGKILL
    let window = first_at.elapsed();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    first.unwrap_or_else(|_| panic!("the child never committed; its stderr:\n{stderr}"));
    let last = rx.try_iter().last().unwrap_or(0);
    assert!(
        !status.success(),
        "the child was killed, not finished: {status:?}"
    );
    eprintln!(
        "crash test: child reported {} turns (2 transactions each); SIGKILL {} ms after the first",
        last + 1,
        window.as_millis()
    );

    let (store, loaded) =
        SessionStore::open(&dir, CRASH_ID).expect("the lock is free after SIGKILL");
    assert_eq!(store.integrity_check().unwrap(), "ok");
    assert!(
        loaded.revision > last,
        "revision {} but turn {last} was committed",
        loaded.revision
    );
    for i in 0..=last {
        let (u, _, complete) = crash_items(i);
        let at = 2 * i as usize;
        assert_eq!(loaded.transcript.get(at), Some(&u), "turn {i}");
        assert_eq!(loaded.transcript.get(at + 1), Some(&complete), "turn {i}");
    }
    store.close().unwrap();
}

#[test]
fn the_compaction_summary_round_trips() {
    let tmp = TempDir::new();
    let dir = tmp.sessions();
    let mut s = session("with-summary");
    let mut store = SessionStore::create(&dir, &s).unwrap();
    s.revision = 2;
    s.summary = Some(kernel::runtime::Summary {
        text: "they said hello".into(),
        through: "u0".into(),
        usage: None,
    });
    store.apply(&[state_of(&s)]).unwrap();
    store.close().unwrap();
    let (mut store, loaded) = SessionStore::open(&dir, "with-summary").unwrap();
    assert_eq!(loaded.summary, s.summary);
    assert_eq!(loaded.revision, 2);

    // With the summary calls' usage and cost.
    s.revision = 3;
    s.summary.as_mut().unwrap().usage = Some(kernel::protocol::Usage {
        input: 900,
        output: 40,
        cache_read: 100,
        total_tokens: 1040,
        cost: kernel::protocol::UsageCost {
            input: 0.0027,
            output: 0.0006,
            cache_read: 0.00003,
            total: 0.00333,
            ..Default::default()
        },
        ..Default::default()
    });
    store.apply(&[state_of(&s)]).unwrap();
    store.close().unwrap();
    let (_store, loaded) = SessionStore::open(&dir, "with-summary").unwrap();
    assert_eq!(loaded.summary, s.summary);
}
