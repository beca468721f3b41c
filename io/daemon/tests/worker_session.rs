//! A session end to end on the mock server: the real worker loop
//! (`pi_daemon::worker::run`, SQLite in a temporary directory) drives the
//! OpenAI-compatible provider (reached through a `models.json` entry) and the
//! tools in a temporary cwd, while the test plays its server over an
//! in-memory channel — read, edit and bash through the tool loop, steer
//! delivered after the running tool, abort killing a running command.

use kernel::ids::OpId;
use kernel::protocol::worker::{WorkerFrame, decode_worker_frame, frame_worker_message};
use kernel::protocol::{
    AssistantStatus, Content, ModelRef, StopReason, ThinkingLevel, ToolStatus, TranscriptItem,
    TranscriptProgress,
};
use kernel::wire::{CborLimits, FrameDecoder};
use kernel::worker::{CreateSpec, FromWorker, Operation, ToWorker};
use pi_daemon::duplex::Locked;
use pi_daemon::worker::{Dial, WorkerSetup};
use pi_store::SessionStore;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

#[path = "../../agent/tests/common/mod.rs"]
mod agent_common;
use agent_common::{Body, Mock, Reply};

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pi-agent-session-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("agent")).unwrap();
        std::fs::create_dir_all(dir.join("project")).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- scripted model replies (Chat Completions SSE) ---------------------------------

fn chunk_line(delta: serde_json::Value, finish: Option<&str>) -> String {
    let chunk = serde_json::json!({
        "id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "coder-1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {chunk}\n\n")
}

fn reply(body: String) -> Reply {
    Reply::Respond {
        status: 200,
        headers: vec![],
        body: Body::Chunked {
            bytes: body.into_bytes(),
            piece: 50,
            delay: Duration::ZERO,
            complete: true,
        },
    }
}

/// A reply calling one tool, its arguments in two fragments.
fn tool_reply(id: &str, name: &str, args: serde_json::Value) -> Reply {
    let args = args.to_string();
    let (a, b) = args.split_at(args.len() / 2);
    let mut body = chunk_line(
        serde_json::json!({"role": "assistant", "content": null}),
        None,
    );
    body += &chunk_line(
        serde_json::json!({"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": a}}]}),
        None,
    );
    body += &chunk_line(
        serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
        None,
    );
    body += &chunk_line(serde_json::json!({}), Some("tool_calls"));
    body += "data: [DONE]\n\n";
    reply(body)
}

fn text_reply(text: &str) -> Reply {
    let mut body = chunk_line(
        serde_json::json!({"role": "assistant", "content": text}),
        None,
    );
    body += &chunk_line(serde_json::json!({}), Some("stop"));
    body += "data: {\"id\":\"chatcmpl-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":5,\"total_tokens\":55}}\n\n";
    body += "data: [DONE]\n\n";
    reply(body)
}

// ---- the worker, and the test as its server ----------------------------------------

/// The worker reaches its "server" once, through one end of an in-memory pipe.
#[derive(Clone)]
struct Pipe(Arc<Mutex<Option<DuplexStream>>>);

impl Dial for Pipe {
    type Stream = Locked<DuplexStream>;

    async fn dial(&self) -> Result<Locked<DuplexStream>, String> {
        self.0
            .lock()
            .unwrap()
            .take()
            .map(Locked)
            .ok_or_else(|| "the test's server end is gone".into())
    }

    fn server_path(&self) -> Option<&Path> {
        None
    }
}

const SESSION: &str = "s1";

/// A new session in the test's project, on the mock provider's model.
fn create_spec(dir: &TempDir, thinking_level: ThinkingLevel) -> CreateSpec {
    CreateSpec {
        cwd: Some(dir.0.join("project").display().to_string()),
        name: None,
        model: Some(ModelRef {
            provider: "mock".into(),
            id: "coder".into(),
        }),
        thinking_level: Some(thinking_level),
    }
}

/// A worker process's session, hosted by the real worker loop; the test
/// speaks the server's side of the worker channel.
struct Session {
    channel: DuplexStream,
    decoder: FrameDecoder,
    /// Frames decoded and not yet taken.
    ready: std::collections::VecDeque<WorkerFrame>,
    /// The transcript as the worker's snapshots and progress show it.
    transcript: Vec<TranscriptItem>,
    /// Every message the worker sent.
    sent: Vec<FromWorker>,
    next_op: u64,
    session_dir: PathBuf,
}

impl Session {
    async fn open(dir: &TempDir, mock: &Mock) -> Self {
        Self::open_with(dir, mock, serde_json::json!({})).await
    }

    /// [`Session::open`] with `extra` fields on the mock provider of `models.json`.
    async fn open_with(dir: &TempDir, mock: &Mock, extra: serde_json::Value) -> Self {
        Self::open_bounded(dir, mock, extra, Default::default()).await
    }

    /// [`Session::open_with`], the worker held to `limits`.
    async fn open_bounded(
        dir: &TempDir,
        mock: &Mock,
        extra: serde_json::Value,
        limits: kernel::limits::WorkerLimits,
    ) -> Self {
        let create = create_spec(dir, ThinkingLevel::Off);
        Self::start(dir, mock, extra, limits, Some(create)).await
    }

    /// A worker for the session: a new one as `create` says, or the stored one.
    async fn start(
        dir: &TempDir,
        mock: &Mock,
        extra: serde_json::Value,
        limits: kernel::limits::WorkerLimits,
        create: Option<CreateSpec>,
    ) -> Self {
        let mut provider = serde_json::json!({
            "baseUrl": format!("{}/v1", mock.base),
            "api": "openai-completions",
            "models": [{"id": "coder", "contextWindow": 100000, "maxTokens": 4096, "cost": {"input": 1, "output": 2}}]
        });
        for (k, v) in extra.as_object().unwrap() {
            provider[k] = v.clone();
        }
        let models_json = serde_json::json!({"providers": {"mock": provider}});
        std::fs::write(dir.0.join("agent/models.json"), models_json.to_string()).unwrap();
        let session_dir = dir.0.join("sessions");
        let (channel, worker_end) = tokio::io::duplex(1 << 20);
        let setup = WorkerSetup {
            dial: Pipe(Arc::new(Mutex::new(Some(worker_end)))),
            token: "secret".into(),
            session_id: SESSION.into(),
            session_dir: session_dir.clone(),
            agent_dir: dir.0.join("agent"),
            pid: u64::from(std::process::id()),
            cwd: None,
            clock: pi_daemon::worker::wall_now,
            limits,
            policy: Default::default(),
            faux_delay: Duration::ZERO,
        };
        tokio::spawn(pi_daemon::worker::run(setup));
        let mut s = Self {
            channel,
            decoder: FrameDecoder::new(kernel::wire::frame::DEFAULT_MAX_FRAME_LEN),
            ready: Default::default(),
            transcript: Vec::new(),
            sent: Vec::new(),
            next_op: 1,
            session_dir,
        };
        match s.frame().await {
            WorkerFrame::Hello {
                token, session_id, ..
            } => assert_eq!((token.as_str(), session_id.as_str()), ("secret", SESSION)),
            other => panic!("expected the worker's hello, got {other:?}"),
        }
        s.send(WorkerFrame::Start {
            create,
            revision_floor: 0,
        })
        .await;
        s.run_until("the session to open", |s| {
            s.sent.iter().any(|m| matches!(m, FromWorker::Ready { .. }))
        })
        .await;
        s
    }

    async fn send(&mut self, frame: WorkerFrame) {
        let bytes = frame_worker_message(&frame).unwrap();
        self.channel.write_all(&bytes).await.unwrap();
    }

    /// The next frame from the worker.
    async fn frame(&mut self) -> WorkerFrame {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return frame;
            }
            let n = self.channel.read(&mut buf).await.unwrap();
            assert!(n > 0, "the worker closed its channel");
            let mut payloads = Vec::new();
            self.decoder.push(&buf[..n], &mut payloads).unwrap();
            let limits = CborLimits::default();
            let frames = payloads
                .iter()
                .map(|p| decode_worker_frame(p, &limits).unwrap());
            self.ready.extend(frames);
        }
    }

    /// A frame from the worker, applied.
    fn pending(&mut self, frame: WorkerFrame) {
        match frame {
            WorkerFrame::FromWorker(message) => self.apply(message),
            other => panic!("unexpected frame from the worker: {other:?}"),
        }
    }

    async fn operation(&mut self, operation: Operation) -> OpId {
        let op = OpId(self.next_op);
        self.next_op += 1;
        self.send(WorkerFrame::ToWorker(ToWorker::Operation { op, operation }))
            .await;
        op
    }

    /// What the worker says, as a server following it sees it.
    fn apply(&mut self, message: FromWorker) {
        match &message {
            FromWorker::Ready { snapshot }
            | FromWorker::Snapshot { snapshot }
            | FromWorker::OpDone {
                outcome: Ok(snapshot),
                ..
            } => {
                // A tail replaces the items from where it starts.
                let tail = snapshot.transcript();
                assert!(tail.from() <= self.transcript.len(), "a tail within");
                self.transcript.truncate(tail.from());
                self.transcript.extend(tail.unpack().expect("decodes"));
            }
            FromWorker::Progress {
                progress:
                    TranscriptProgress::ItemStarted { item }
                    | TranscriptProgress::ItemUpdated { item }
                    | TranscriptProgress::ItemFinished { item },
            } => match self.transcript.iter_mut().find(|i| i.id() == item.id()) {
                Some(known) => *known = item.clone(),
                None => self.transcript.push(item.clone()),
            },
            _ => {}
        }
        self.sent.push(message);
    }

    /// Reads what the worker sends until `until` holds.
    async fn run_until(&mut self, what: &str, until: impl Fn(&Self) -> bool) {
        let limit = tokio::time::Instant::now() + Duration::from_secs(30);
        while !until(self) {
            let frame = tokio::select! {
                frame = self.frame() => frame,
                () = tokio::time::sleep_until(limit) => panic!("timed out waiting for {what}; transcript: {:#?}", self.transcript),
            };
            self.pending(frame);
        }
    }

    fn done(&self, op: OpId) -> bool {
        self.sent
            .iter()
            .any(|m| matches!(m, FromWorker::OpDone { op: o, .. } if *o == op))
    }

    fn running_tool(&self) -> bool {
        self.transcript
            .iter()
            .any(|i| matches!(i, TranscriptItem::Tool(t) if t.status == ToolStatus::Running))
    }

    fn transcript(&self) -> &[TranscriptItem] {
        &self.transcript
    }

    /// Disposes the session (the worker closes its store and exits), then
    /// reads back what it stored.
    async fn dispose_and_read(mut self) -> kernel::runtime::StoredSession {
        self.send(WorkerFrame::ToWorker(ToWorker::Dispose)).await;
        let mut buf = vec![0u8; 4096];
        while self.channel.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        let (_store, stored) = SessionStore::open(&self.session_dir, SESSION).unwrap();
        stored
    }
}

/// Today's date (UTC) as the system prompt writes it.
fn today() -> String {
    let stamp = kernel::time::format_utc(pi_daemon::worker::wall_now().as_millis());
    stamp.split(' ').next().unwrap_or_default().to_owned()
}

fn tool_text(item: &TranscriptItem) -> String {
    let TranscriptItem::Tool(t) = item else {
        panic!("not a tool item: {item:?}")
    };
    t.content
        .iter()
        .filter_map(|c| match c {
            Content::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_session_reads_edits_and_runs_commands_through_the_tool_loop() {
    let dir = TempDir::new();
    let project = dir.0.join("project");
    std::fs::write(project.join("notes.txt"), "status: draft\n").unwrap();
    let mock = Mock::sequence(vec![
        tool_reply("call_1", "read", serde_json::json!({"path": "notes.txt"})),
        tool_reply(
            "call_2",
            "edit",
            serde_json::json!({"path": "notes.txt", "old_text": "draft", "new_text": "final"}),
        ),
        tool_reply(
            "call_3",
            "bash",
            serde_json::json!({"command": "cat notes.txt && echo ran > ran.txt"}),
        ),
        text_reply("All done."),
    ])
    .await;
    let mut s = Session::open(&dir, &mock).await;
    let op = s.operation(Operation::prompt("finalise the notes")).await;
    s.run_until("the prompt to finish", |s| s.done(op)).await;

    assert_eq!(
        std::fs::read_to_string(project.join("notes.txt")).unwrap(),
        "status: final\n"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("ran.txt")).unwrap(),
        "ran\n"
    );
    let t = s.transcript();
    let roles: Vec<&str> = t
        .iter()
        .map(|i| match i {
            TranscriptItem::User(_) => "user",
            TranscriptItem::Assistant(_) => "assistant",
            TranscriptItem::Tool(_) => "tool",
        })
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    assert_eq!(tool_text(&t[2]), "status: draft\n");
    assert!(tool_text(&t[4]).starts_with("Edited notes.txt"));
    assert_eq!(tool_text(&t[6]), "status: final\n");
    for i in [2, 4, 6] {
        assert!(
            matches!(&t[i], TranscriptItem::Tool(x) if x.status == ToolStatus::Complete),
            "{:?}",
            t[i]
        );
    }
    let TranscriptItem::Assistant(last) = &t[7] else {
        panic!()
    };
    assert_eq!(last.status, AssistantStatus::Complete(StopReason::Stop));
    assert_eq!(
        last.content,
        vec![Content::Text {
            text: "All done.".into()
        }]
    );
    let usage = last.usage.clone().unwrap();
    assert!(
        (usage.cost.total - (50.0 + 10.0) / 1e6).abs() < 1e-12,
        "{usage:?}"
    );
    let TranscriptItem::Assistant(first) = &t[1] else {
        panic!()
    };
    assert!(
        matches!(&first.content[0], Content::ToolCall { tool_name, .. } if tool_name == "read")
    );

    // The model saw each result before its next call.
    let requests = mock.requests();
    assert_eq!(requests.len(), 4);
    let messages = requests[3].body["messages"].as_array().unwrap().clone();
    let tool_messages: Vec<&serde_json::Value> =
        messages.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool_messages.len(), 3);
    assert_eq!(tool_messages[0]["tool_call_id"], "call_1");
    assert_eq!(tool_messages[0]["content"], "status: draft\n");
}

#[tokio::test]
async fn steer_is_delivered_after_the_running_tool_and_abort_kills_a_command() {
    let dir = TempDir::new();
    let project = dir.0.join("project");
    let mock = Mock::sequence(vec![
        tool_reply(
            "call_1",
            "bash",
            serde_json::json!({"command": "sleep 0.5; echo slept"}),
        ),
        tool_reply(
            "call_2",
            "bash",
            serde_json::json!({"command": "sleep 300 & echo $! > child.pid; wait"}),
        ),
        text_reply("unreachable"),
    ])
    .await;
    let mut s = Session::open(&dir, &mock).await;
    let prompt = s.operation(Operation::prompt("work")).await;
    s.run_until("the first tool to run", Session::running_tool)
        .await;
    let steer = s
        .operation(Operation::Steer {
            text: "also check the logs".into(),
        })
        .await;
    s.run_until("the steer", |s| s.done(steer)).await;
    // The steer reaches the model with the next call, after the tool result.
    s.run_until("the second call", |s| {
        s.transcript().len() >= 5 && s.running_tool()
    })
    .await;
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(messages[n - 2]["role"], "tool");
    assert_eq!(messages[n - 2]["content"], "slept\n");
    assert_eq!(
        messages[n - 1],
        serde_json::json!({"role": "user", "content": "also check the logs"})
    );

    // Abort while `sleep 300` runs: the command's process group dies, the turn ends.
    let pid_file = project.join("child.pid");
    for _ in 0..250 {
        if std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n')) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let abort = s.operation(Operation::Abort).await;
    s.run_until("the abort", |s| s.done(abort) && s.done(prompt))
        .await;
    let mut gone = false;
    for _ in 0..150 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        if stat.map_or(true, |st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        }) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the aborted command's child {pid} is still running");
    let last_tool = s.transcript().iter().rev().find_map(|i| match i {
        TranscriptItem::Tool(t) => Some(t.clone()),
        _ => None,
    });
    assert_eq!(last_tool.unwrap().status, ToolStatus::Error);
    assert_eq!(mock.requests().len(), 2, "no model call after the abort");
}

/// The system prompt carries the context files (the agent dir's AGENTS.md,
/// then the project's, outermost first, each under its path), the date and
/// the OS; a context file edited between calls is read again.
#[tokio::test]
async fn context_files_reach_the_system_prompt_and_edits_take_effect() {
    let dir = TempDir::new();
    let project = dir.0.join("project");
    std::fs::write(dir.0.join("agent/AGENTS.md"), "Global: answer in English.").unwrap();
    std::fs::write(project.join("AGENTS.md"), "Project: run cargo test first.").unwrap();
    let mock = Mock::sequence(vec![text_reply("ok"), text_reply("ok again")]).await;
    let mut s = Session::open(&dir, &mock).await;
    let op = s.operation(Operation::prompt("hi")).await;
    s.run_until("the first prompt", |s| s.done(op)).await;
    std::fs::write(project.join("AGENTS.md"), "Project: use nextest now.").unwrap();
    let op = s.operation(Operation::prompt("again")).await;
    s.run_until("the second prompt", |s| s.done(op)).await;

    let systems: Vec<String> = mock
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(systems.len(), 2);
    let first = &systems[0];
    let global = first
        .find("Global: answer in English.")
        .expect("global file");
    let local = first
        .find("Project: run cargo test first.")
        .expect("project file");
    assert!(global < local, "outermost first:\n{first}");
    assert!(
        first.contains(&format!("## {}", project.join("AGENTS.md").display())),
        "{first}"
    );
    assert!(
        first.contains(&format!("Current date: {}", today())),
        "{first}"
    );
    assert!(first.contains(std::env::consts::OS), "{first}");
    assert!(
        systems[1].contains("Project: use nextest now."),
        "re-read: {}",
        systems[1]
    );
    assert!(!systems[1].contains("cargo test first"));
}

/// A session's own `settings.json` (in its directory) turns its context
/// files off and picks its tools: only those are offered, a call to another
/// is refused, and an unknown name fails the next prompt with a clear error.
#[tokio::test]
async fn a_sessions_own_settings_pick_its_tools_and_turn_context_files_off() {
    let dir = TempDir::new();
    std::fs::write(dir.0.join("project/AGENTS.md"), "Project: secret rules.").unwrap();
    let mock = Mock::sequence(vec![
        tool_reply("c1", "bash", serde_json::json!({"command": "echo hi"})),
        text_reply("done"),
    ])
    .await;
    let mut s = Session::open(&dir, &mock).await;
    let own = s.session_dir.join(SESSION).join("settings.json");
    std::fs::write(&own, r#"{"contextFiles": false, "tools": ["read", "ls"]}"#).unwrap();
    let op = s.operation(Operation::prompt("hi")).await;
    s.run_until("the prompt", |s| s.done(op)).await;

    let first = &mock.requests()[0].body;
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["read", "ls"]);
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(!system.contains("secret rules"), "{system}");
    assert!(
        !system.contains("- bash:") && system.contains("- ls:"),
        "{system}"
    );
    let tool = s
        .transcript()
        .iter()
        .find(|i| matches!(i, TranscriptItem::Tool(_)))
        .expect("the call is answered");
    assert!(
        tool_text(tool).contains("this session does not offer the tool"),
        "{}",
        tool_text(tool)
    );

    // An unknown tool name: the prompt fails before any model call, saying why.
    std::fs::write(&own, r#"{"tools": ["read", "grp"]}"#).unwrap();
    let op = s.operation(Operation::prompt("again")).await;
    s.run_until("the second prompt", |s| s.done(op)).await;
    assert_eq!(mock.requests().len(), 2, "no call with a bad setting");
    let Some(TranscriptItem::Assistant(last)) = s.transcript().last() else {
        panic!("{:?}", s.transcript())
    };
    assert_eq!(last.status, AssistantStatus::Error);
    let error = last.error_message.as_deref().unwrap_or_default();
    assert!(
        error.contains("unknown tool \"grp\"") && error.contains(&own.display().to_string()),
        "{error}"
    );
}

/// A hosted model without a key: the first prompt fails at once, without a
/// call, and its error names the variable and the `auth.json` entry to set.
#[tokio::test]
async fn the_first_prompt_without_a_key_says_which_variable_or_auth_entry_to_set() {
    let dir = TempDir::new();
    let mock = Mock::start(text_reply("never sent")).await;
    let var = "PI_TEST_UNSET_MOCK_KEY_8F3A";
    let mut s = Session::open_with(&dir, &mock, serde_json::json!({"apiKeyEnv": var})).await;
    let op = s.operation(Operation::prompt("hi")).await;
    s.run_until("the prompt", |s| s.done(op)).await;
    assert!(mock.requests().is_empty(), "no call without a key");
    let Some(TranscriptItem::Assistant(reply)) = s.transcript().last() else {
        panic!("{:?}", s.transcript())
    };
    assert_eq!(reply.status, AssistantStatus::Error);
    let auth = dir.0.join("agent/auth.json");
    assert_eq!(
        reply.error_message.as_deref(),
        Some(
            format!(
                "no API key for provider mock: set {var} or add {{\"mock\": {{\"key\": \"...\"}}}} \
                 to {} (mode 0600)",
                auth.display()
            )
            .as_str()
        )
    );
}

/// OpenAI's answer to a request over the model's window.
fn overflow_reply() -> Reply {
    let body = serde_json::json!({"error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9100 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded"
    }});
    Reply::Respond {
        status: 400,
        headers: vec![("content-type", "application/json".into())],
        body: Body::Chunked {
            bytes: body.to_string().into_bytes(),
            piece: 1 << 20,
            delay: Duration::ZERO,
            complete: true,
        },
    }
}

#[tokio::test]
async fn a_context_overflow_from_the_provider_compacts_and_retries_once() {
    let dir = TempDir::new();
    let mock = Mock::sequence(vec![
        text_reply("Hello!"),
        overflow_reply(),
        text_reply("Earlier the user said hello."),
        text_reply("Here is the answer."),
    ])
    .await;
    let mut s = Session::open(&dir, &mock).await;
    let first = s.operation(Operation::prompt("hi")).await;
    s.run_until("the first turn", |s| s.done(first)).await;
    let second = s.operation(Operation::prompt("now the big question")).await;
    s.run_until("the second turn", |s| s.done(second)).await;

    let requests = mock.requests();
    assert_eq!(requests.len(), 4, "reply, overflow, summary, retry");
    let summary_request = requests[2].body.to_string();
    assert!(
        summary_request.contains("hi") && summary_request.contains("Hello!"),
        "the summary call is sent the older turn: {summary_request}"
    );
    let retry = requests[3].body.to_string();
    assert!(retry.contains("Earlier the user said hello."), "{retry}");
    assert!(retry.contains("now the big question"), "{retry}");
    let t = s.transcript();
    let TranscriptItem::Assistant(last) = t.last().unwrap() else {
        panic!("{t:?}")
    };
    assert_eq!(last.status, AssistantStatus::Complete(StopReason::Stop));
    assert_eq!(
        last.content,
        vec![Content::Text {
            text: "Here is the answer.".into()
        }]
    );
    let summary = s
        .dispose_and_read()
        .await
        .summary
        .expect("a summary is kept");
    assert_eq!(summary.text, "Earlier the user said hello.");
    let usage = summary.usage.expect("the summary call's usage is stored");
    assert_eq!((usage.input, usage.output, usage.total_tokens), (50, 5, 55));
    // models.json prices: $1 in, $2 out per million tokens.
    assert!(
        (usage.cost.total - (50.0 + 10.0) / 1e6).abs() < 1e-12,
        "{usage:?}"
    );
}

// ---- MCP servers ----------------------------------------------------------------------

/// `tests/mcp`, with the reference MCP servers installed from npm.
fn mcp_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp");
    let install = std::process::Command::new(dir.join("install.sh"))
        .output()
        .expect("tests/mcp/install.sh runs (it needs npm)");
    assert!(
        install.status.success(),
        "tests/mcp/install.sh failed: {install:#?}"
    );
    dir.canonicalize().unwrap()
}

fn node_server(dir: &Path, package: &str, args: &[&str]) -> serde_json::Value {
    let script = dir.join(format!(
        "node_modules/@modelcontextprotocol/{package}/dist/index.js"
    ));
    let mut argv = vec![script.display().to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    serde_json::json!({"command": "node", "args": argv})
}

/// The reference server over Streamable HTTP, on a free port, killed on drop.
struct HttpServer(std::process::Child, u16);

impl HttpServer {
    async fn start(dir: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        let child = std::process::Command::new("node")
            .arg(script)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("node runs");
        let server = Self(child, port);
        let limit = std::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < limit,
                "the HTTP MCP server listens"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn notices(items: &[TranscriptItem]) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| match i {
            TranscriptItem::Assistant(a) => kernel::runtime::notice_text(a).map(str::to_owned),
            _ => None,
        })
        .collect()
}

fn offered_tools(request: &agent_common::Recorded) -> Vec<String> {
    request.body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_reference_mcp_servers_tools_are_offered_called_and_shown_over_stdio_and_http() {
    let mcp = mcp_dir();
    let dir = TempDir::new();
    let project = dir.0.join("project");
    std::fs::write(project.join("notes.txt"), "the notes say 42\n").unwrap();
    let http = HttpServer::start(&mcp).await;
    // The agent directory's settings run two stdio servers...
    let settings = serde_json::json!({"mcpServers": {
        "everything": node_server(&mcp, "server-everything", &["stdio"]),
        "files": node_server(&mcp, "server-filesystem", &[project.to_str().unwrap()]),
    }});
    std::fs::write(dir.0.join("agent/settings.json"), settings.to_string()).unwrap();
    let mock = Mock::sequence(vec![
        tool_reply(
            "c1",
            "mcp__everything__echo",
            serde_json::json!({"message": "hello mcp"}),
        ),
        tool_reply(
            "c2",
            "mcp__files__read_text_file",
            serde_json::json!({"path": project.join("notes.txt")}),
        ),
        tool_reply(
            "c3",
            "mcp__web__get-sum",
            serde_json::json!({"a": 2, "b": 3}),
        ),
        text_reply("All three answered."),
    ])
    .await;
    let mut s = Session::open(&dir, &mock).await;
    // ...and the session's own settings add one over Streamable HTTP.
    let own = serde_json::json!({"mcpServers": {"web": {
        "type": "http", "url": format!("http://127.0.0.1:{}/mcp", http.1)
    }}});
    std::fs::write(
        s.session_dir.join(SESSION).join("settings.json"),
        own.to_string(),
    )
    .unwrap();
    let op = s.operation(Operation::prompt("use the servers")).await;
    s.run_until("the turn", |s| s.done(op)).await;

    let requests = mock.requests();
    assert_eq!(requests.len(), 4);
    let offered = offered_tools(&requests[0]);
    for name in [
        "read",
        "bash",
        "mcp__everything__echo",
        "mcp__files__read_text_file",
        "mcp__web__get-sum",
    ] {
        assert!(offered.iter().any(|o| o == name), "{name} in {offered:?}");
    }
    // The schema is passed through.
    let echo = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "mcp__everything__echo")
        .unwrap();
    assert_eq!(
        echo["function"]["parameters"]["properties"]["message"]["type"],
        "string"
    );
    let t = s.transcript();
    assert_eq!(notices(t), Vec::<String>::new(), "{t:#?}");
    let tools: Vec<&TranscriptItem> = t
        .iter()
        .filter(|i| matches!(i, TranscriptItem::Tool(_)))
        .collect();
    assert_eq!(tools.len(), 3, "{t:#?}");
    for (item, (name, said)) in tools.iter().zip([
        ("mcp__everything__echo", "hello mcp"),
        ("mcp__files__read_text_file", "the notes say 42"),
        ("mcp__web__get-sum", "5"),
    ]) {
        let TranscriptItem::Tool(tool) = item else {
            unreachable!()
        };
        assert_eq!(tool.tool_name, name);
        assert_eq!(tool.status, ToolStatus::Complete, "{tool:#?}");
        assert!(
            tool_text(item).contains(said),
            "{name}: {}",
            tool_text(item)
        );
    }
    // Each result reached the model.
    for (request, said) in requests[1..]
        .iter()
        .zip(["hello mcp", "the notes say 42", "5"])
    {
        let body = request.body["messages"].to_string();
        assert!(body.contains(said), "{said} in {body}");
    }
    drop(http);
}

#[tokio::test]
async fn a_server_that_fails_crashes_hangs_or_prints_garbage_is_told_and_the_session_goes_on() {
    let mcp = mcp_dir();
    let dir = TempDir::new();
    let faulty = mcp.join("faulty.mjs").display().to_string();
    let settings = serde_json::json!({"mcpServers": {
        "absent": {"command": "no-such-mcp-server-anywhere"},
        "garbage": {"command": "node", "args": [faulty, "garbage"]},
        "faulty": {"command": "node", "args": [faulty]},
        "broken": {"command": ["not", "a", "string"]},
    }});
    std::fs::write(dir.0.join("agent/settings.json"), settings.to_string()).unwrap();
    let mock = Mock::sequence(vec![
        tool_reply("c1", "mcp__faulty__ok", serde_json::json!({"text": "fine"})),
        tool_reply("c2", "mcp__faulty__hang", serde_json::json!({})),
        tool_reply("c3", "mcp__faulty__crash", serde_json::json!({})),
        tool_reply(
            "c4",
            "mcp__faulty__ok",
            serde_json::json!({"text": "again"}),
        ),
        text_reply("Done despite the servers."),
    ])
    .await;
    let limits = kernel::limits::WorkerLimits {
        mcp: kernel::limits::McpLimits {
            start_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(2),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut s = Session::open_bounded(&dir, &mock, serde_json::json!({}), limits).await;
    let op = s.operation(Operation::prompt("try them")).await;
    s.run_until("the turn", |s| s.done(op)).await;
    let t = s.transcript();
    let told = notices(t);
    let settings_path = dir.0.join("agent/settings.json").display().to_string();
    assert!(
        told.iter()
            .any(|n| n.contains(&settings_path) && n.contains("\"broken\"")),
        "a malformed entry is told with its file: {told:#?}"
    );
    assert!(
        told.iter()
            .any(|n| n.contains("\"absent\" failed to start")),
        "{told:#?}"
    );
    assert!(
        told.iter()
            .any(|n| n.contains("\"garbage\" failed to start")),
        "{told:#?}"
    );
    assert!(
        told.iter()
            .any(|n| n.contains("\"bad-schema\" is left out")),
        "{told:#?}"
    );
    // The notices come before the turn, and the model is never sent them.
    let user = t
        .iter()
        .position(|i| matches!(i, TranscriptItem::User(_)))
        .unwrap();
    assert_eq!(notices(&t[..user]).len(), told.len(), "{t:#?}");
    let offered = offered_tools(&mock.requests()[0]);
    assert!(
        offered.iter().any(|o| o == "mcp__faulty__ok"),
        "{offered:?}"
    );
    assert!(!offered.iter().any(|o| o.starts_with("mcp__garbage")));
    assert!(
        !mock.requests()[0]
            .body
            .to_string()
            .contains("failed to start")
    );

    let results: Vec<(String, ToolStatus, String)> = t
        .iter()
        .filter_map(|i| match i {
            TranscriptItem::Tool(tool) => Some((tool.tool_name.clone(), tool.status, tool_text(i))),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 4, "{results:#?}");
    assert_eq!(results[0].1, ToolStatus::Complete);
    assert!(results[0].2.contains("ok: fine"));
    assert_eq!(results[1].1, ToolStatus::Error);
    assert!(
        results[1].2.contains("did not answer within 2 s"),
        "{results:#?}"
    );
    assert_eq!(results[2].1, ToolStatus::Error);
    assert_eq!(
        results[3].1,
        ToolStatus::Error,
        "the crashed server is gone"
    );
    assert!(results[3].2.contains("faulty"), "{results:#?}");
    let TranscriptItem::Assistant(last) = t.last().unwrap() else {
        panic!("{t:#?}")
    };
    assert_eq!(last.status, AssistantStatus::Complete(StopReason::Stop));
    // Its death is told before the next turn.
    let next = s.operation(Operation::prompt("and now?")).await;
    s.run_until("the next turn", |s| s.done(next)).await;
    assert!(
        notices(s.transcript())
            .iter()
            .any(|n| n.contains("\"faulty\" stopped")),
        "{:#?}",
        notices(s.transcript())
    );
}

#[tokio::test]
async fn a_long_mcp_result_keeps_its_start_and_the_whole_is_kept_in_the_session() {
    let mcp = mcp_dir();
    let dir = TempDir::new();
    let faulty = mcp.join("faulty.mjs").display().to_string();
    let settings =
        serde_json::json!({"mcpServers": {"faulty": {"command": "node", "args": [faulty]}}});
    std::fs::write(dir.0.join("agent/settings.json"), settings.to_string()).unwrap();
    let mock = Mock::sequence(vec![
        tool_reply("c1", "mcp__faulty__big", serde_json::json!({})),
        text_reply("That was long."),
    ])
    .await;
    let mut s = Session::open(&dir, &mock).await;
    let op = s.operation(Operation::prompt("get it all")).await;
    s.run_until("the turn", |s| s.done(op)).await;
    let t = s.transcript();
    let item = t
        .iter()
        .find(|i| matches!(i, TranscriptItem::Tool(_)))
        .expect("the call");
    let text = tool_text(item);
    let limit = pi_agent::mcp::RESULT_MAX_BYTES;
    assert!(text.starts_with("line 00000 "), "{}", &text[..80]);
    assert!(
        text.len() < limit + 1024,
        "cut to its start: {} bytes",
        text.len()
    );
    let path = text
        .rsplit("the whole of it is in ")
        .next()
        .and_then(|p| p.strip_suffix(']'))
        .expect("the result names the file");
    let whole = std::fs::read_to_string(path).unwrap();
    assert_eq!(whole.lines().count(), 4000);
    assert!(
        path.starts_with(s.session_dir.join(SESSION).to_str().unwrap()),
        "{path}"
    );
    // The model was sent the cut result, not the whole.
    let sent = mock.requests()[1].body.to_string();
    assert!(sent.contains("line 00000") && !sent.contains("line 03999"));
}

/// An Anthropic tool loop whose worker goes away mid-loop (disposed while
/// the call after the tool hangs): the reply's thinking signature was stored
/// with it, so the next worker of the session sends the signed thinking
/// block back, with thinking on. The replies are recorded streams.
#[tokio::test]
async fn the_next_worker_sends_back_the_thinking_signature_its_reply_stored() {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.0.join("project/src")).unwrap();
    let lines: String = (1..=20).map(|i| format!("// line {i}\n")).collect();
    std::fs::write(dir.0.join("project/src/lib.rs"), lines).unwrap();
    let mock = Mock::sequence(vec![
        agent_common::sse("anthropic-thinking-tools.sse"),
        Reply::Hang,
        agent_common::sse("anthropic-text.sse"),
    ])
    .await;
    let extra = serde_json::json!({
        "baseUrl": mock.base,
        "api": "anthropic-messages",
        "apiKey": "sk-ant-test",
        "models": [{"id": "coder", "reasoning": true, "contextWindow": 200000, "maxTokens": 16000}],
    });
    let create = create_spec(&dir, ThinkingLevel::Medium);
    let limits = kernel::limits::WorkerLimits::default();
    let mut s = Session::start(&dir, &mock, extra.clone(), limits.clone(), Some(create)).await;
    s.operation(Operation::prompt("fix lib.rs")).await;
    s.run_until("the tool and the next call", |s| {
        matches!(s.transcript().last(), Some(TranscriptItem::Assistant(a)) if a.status == AssistantStatus::Streaming)
            && s.transcript().len() == 4
    })
    .await;
    // The call hangs once the mock has read it.
    while mock.requests().len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stored = s.dispose_and_read().await;
    let signed = stored.transcript.iter().any(|item| {
        matches!(item, TranscriptItem::Assistant(a) if a.content.iter().any(|c| matches!(
            c,
            Content::Thinking { signature: Some(s), .. } if s.starts_with("EqQB")
        )))
    });
    assert!(signed, "the signature is stored: {:#?}", stored.transcript);

    let mut s = Session::start(&dir, &mock, extra, limits, None).await;
    let op = s.operation(Operation::prompt("go on")).await;
    s.run_until("the reply", |s| s.done(op)).await;
    let body = &mock.requests()[2].body;
    assert_eq!(body["thinking"]["type"], "enabled", "{body:#}");
    let assistant = &body["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["content"][0]["type"], "thinking");
    assert_eq!(
        assistant["content"][0]["signature"],
        "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    );
    assert_eq!(
        assistant["content"][0]["thinking"],
        "I need to see the file before editing it."
    );
}
