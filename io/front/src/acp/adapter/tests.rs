use super::*;
use kernel::protocol::{
    AssistantItem, AssistantStatus, ProtocolError, SessionPhase, StopReason, ToolItem,
    TranscriptItem, TranscriptProgress, UserItem,
};

fn models() -> Vec<ModelMetadata> {
    kernel::faux::models()
}

fn snapshot(transcript: Vec<TranscriptItem>) -> SessionSnapshot {
    SessionSnapshot {
        id: "s1".into(),
        name: None,
        cwd: "/work".into(),
        created_at: 0,
        updated_at: 0,
        phase: SessionPhase::Idle,
        model: kernel::faux::default_model(),
        thinking_level: ThinkingLevel::Off,
        attached: true,
        locked: true,
        revision: 1,
        transcript,
        queued_steer: Vec::new(),
        queued_steer_count: 0,
    }
}

fn user(id: &str, text: &str) -> TranscriptItem {
    TranscriptItem::User(UserItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        timestamp: 1,
    })
}

fn reply(id: &str, text: &str, status: AssistantStatus) -> TranscriptItem {
    TranscriptItem::Assistant(AssistantItem {
        id: id.into(),
        content: vec![Content::Text { text: text.into() }],
        model: kernel::faux::default_model(),
        response_model: None,
        usage: None,
        timestamp: 2,
        status,
        error_message: None,
    })
}

struct Harness {
    adapter: Adapter,
    calls: Vec<(Token, Command)>,
    sent: Vec<Value>,
}

impl Harness {
    fn new() -> Self {
        Self {
            adapter: Adapter::new(models()),
            calls: Vec::new(),
            sent: Vec::new(),
        }
    }

    fn step(&mut self, input: Input) {
        for output in self.adapter.step(input) {
            match output {
                Output::Send(v) => self.sent.push(v),
                Output::Call { token, command } => self.calls.push((token, command)),
                Output::Log(_) => {}
            }
        }
    }

    fn line(&mut self, line: Value) {
        self.step(Input::Line(line.to_string()));
    }

    fn take(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.sent)
    }

    fn call(&mut self) -> (Token, Command) {
        assert!(!self.calls.is_empty(), "no pi call was made");
        self.calls.remove(0)
    }

    fn done(&mut self, token: Token, result: Result<CommandResult, ClientError>) {
        self.step(Input::Done { token, result });
    }

    /// `session/new` answered with an empty session `s1`.
    fn open_new(&mut self) {
        self.line(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/work","mcpServers":[]}}));
        let (token, command) = self.call();
        assert!(matches!(command, Command::Create(ref p) if p.cwd.as_deref() == Some("/work")));
        let session = snapshot(vec![]);
        self.done(token, Ok(CommandResult::Create { session }));
        let sent = self.take();
        assert_eq!(sent[0]["result"]["sessionId"], "s1");
    }
}

fn updates(sent: &[Value]) -> Vec<&Value> {
    sent.iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| &m["params"]["update"])
        .collect()
}

fn error_code(message: &Value) -> i64 {
    message["error"]["code"].as_i64().expect("an error")
}

#[test]
fn initialize_advertises_what_the_adapter_does() {
    let mut h = Harness::new();
    h.line(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}));
    let sent = h.take();
    let result = &sent[0]["result"];
    assert_eq!(result["protocolVersion"], 1);
    let caps = &result["agentCapabilities"];
    assert_eq!(caps["loadSession"], true);
    assert_eq!(caps["promptCapabilities"]["image"], false);
    assert_eq!(caps["promptCapabilities"]["embeddedContext"], true);
    for cap in ["list", "resume", "close", "delete"] {
        assert!(
            caps["sessionCapabilities"][cap].is_object(),
            "{cap}: {caps}"
        );
    }
    assert_eq!(caps["_meta"]["pi"]["steer"], STEER_METHOD);
    assert_eq!(result["agentInfo"]["name"], "pi-server");
}

#[test]
fn new_returns_model_and_thought_level_options() {
    let mut h = Harness::new();
    h.line(json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/work","mcpServers":[]}}));
    let (token, _) = h.call();
    h.done(
        token,
        Ok(CommandResult::Create {
            session: snapshot(vec![]),
        }),
    );
    let sent = h.take();
    let options = sent[0]["result"]["configOptions"].as_array().unwrap();
    assert_eq!(options[0]["category"], "model");
    assert_eq!(options[0]["currentValue"], "faux/faux-1");
    assert_eq!(
        options[0]["options"].as_array().unwrap().len(),
        models().len()
    );
    assert_eq!(options[1]["category"], "thought_level");
    assert_eq!(options[1]["currentValue"], "off");
}

#[test]
fn a_prompt_streams_then_answers_after_its_last_update() {
    let mut h = Harness::new();
    h.open_new();
    h.line(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"hi"}]}}));
    let (token, command) = h.call();
    assert_eq!(
        command,
        Command::Prompt {
            session_id: "s1".into(),
            text: "hi".into()
        }
    );
    let progress = |p| ServerEvent::SessionProgress {
        session_id: "s1".into(),
        progress: p,
    };
    h.step(Input::Event(ServerEvent::SessionSnapshot {
        snapshot: snapshot(vec![user("u1", "hi")]),
    }));
    h.step(Input::Event(progress(TranscriptProgress::AssistantDelta {
        message_id: "a1".into(),
        content_index: 0,
        kind: kernel::protocol::DeltaKind::Text,
        delta: "you said ".into(),
    })));
    // The final snapshot holds text the deltas did not carry.
    let done = snapshot(vec![
        user("u1", "hi"),
        reply(
            "a1",
            "you said hi",
            AssistantStatus::Complete(StopReason::Stop),
        ),
    ]);
    h.done(token, Ok(CommandResult::Prompt { session: done }));
    let sent = h.take();
    let ups = updates(&sent);
    // The editor's own prompt is not echoed back.
    assert!(
        ups.iter()
            .all(|u| u["sessionUpdate"] != "user_message_chunk")
    );
    let text: String = ups
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .map(|u| u["content"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "you said hi");
    let last = sent.last().unwrap();
    assert_eq!(last["id"], 2);
    assert_eq!(last["result"]["stopReason"], "end_turn");
}

#[test]
fn cancel_aborts_and_the_prompt_answers_cancelled() {
    let mut h = Harness::new();
    h.open_new();
    h.line(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"long"}]}}));
    let (prompt, _) = h.call();
    h.line(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s1"}}));
    let (abort, command) = h.call();
    assert_eq!(
        command,
        Command::Abort {
            session_id: "s1".into()
        }
    );
    let aborted = snapshot(vec![
        user("u1", "long"),
        reply("a1", "lo", AssistantStatus::Aborted),
    ]);
    h.done(
        abort,
        Ok(CommandResult::Abort {
            session: aborted.clone(),
        }),
    );
    h.done(prompt, Ok(CommandResult::Prompt { session: aborted }));
    let sent = h.take();
    assert_eq!(sent.last().unwrap()["result"]["stopReason"], "cancelled");
}

#[test]
fn load_replays_history_before_answering_and_shows_other_clients() {
    let mut h = Harness::new();
    h.line(json!({"jsonrpc":"2.0","id":3,"method":"session/load","params":{"sessionId":"s1","cwd":"/work","mcpServers":[]}}));
    let (token, command) = h.call();
    assert_eq!(
        command,
        Command::Attach {
            session_id: "s1".into()
        }
    );
    let tool = TranscriptItem::Tool(ToolItem {
        id: "t1".into(),
        tool_call_id: "c1".into(),
        tool_name: "bash".into(),
        input: kernel::map! {"command" => JsonValue::text("echo hi")},
        content: vec![Content::Text {
            text: "hi\n".into(),
        }],
        details: None,
        usage: None,
        timestamp: 3,
        status: ToolStatus::Complete,
    });
    let history = snapshot(vec![
        user("u1", "!echo hi"),
        tool,
        reply("a1", "done", AssistantStatus::Complete(StopReason::Stop)),
    ]);
    h.done(token, Ok(CommandResult::Attach { session: history }));
    let sent = h.take();
    let kinds: Vec<&str> = updates(&sent)
        .iter()
        .map(|u| u["sessionUpdate"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "user_message_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk"
        ]
    );
    let call = updates(&sent)[1];
    assert_eq!(call["kind"], "execute");
    assert_eq!(call["title"], "bash: echo hi");
    assert_eq!(sent.last().unwrap()["id"], 3);
    // Another client's prompt is shown as a user message.
    h.step(Input::Event(ServerEvent::SessionSnapshot {
        snapshot: snapshot(vec![user("u1", "!echo hi"), user("u2", "theirs")]),
    }));
    let sent = h.take();
    assert_eq!(updates(&sent)[0]["content"]["text"], "theirs");
}

#[test]
fn bad_input_gets_json_rpc_errors() {
    let mut h = Harness::new();
    h.step(Input::Line("not json".into()));
    h.line(json!({"jsonrpc":"2.0","id":1,"method":"nope","params":{}}));
    h.line(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"mcpServers":[]}}));
    h.line(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"zz","prompt":[]}}));
    h.line(json!({"jsonrpc":"2.0","id":4,"method":"session/new","params":{"cwd":"relative","mcpServers":[]}}));
    let sent = h.take();
    assert_eq!(error_code(&sent[0]), -32700);
    assert_eq!(sent[0]["id"], Value::Null);
    assert_eq!(error_code(&sent[1]), -32601);
    assert_eq!(error_code(&sent[2]), -32602);
    assert!(
        sent[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cwd")
    );
    assert_eq!(error_code(&sent[3]), -32002);
    assert!(sent[3]["error"]["message"].as_str().unwrap().contains("zz"));
    assert_eq!(error_code(&sent[4]), -32602);
    assert!(h.calls.is_empty());
}

#[test]
fn a_busy_session_is_a_clear_error_and_images_are_refused() {
    let mut h = Harness::new();
    h.open_new();
    h.line(json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"x"}]}}));
    let (token, _) = h.call();
    let busy = ProtocolError {
        code: ErrorCode::Busy,
        message: "A prompt is already running".into(),
        details: None,
    };
    h.done(token, Err(ClientError::Server(busy)));
    h.line(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"image","data":"AA==","mimeType":"image/png"}]}}));
    let sent = h.take();
    assert_eq!(error_code(&sent[0]), -32001);
    assert!(
        sent[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("busy")
    );
    assert_eq!(error_code(&sent[1]), -32602);
    assert!(
        sent[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prompt[0]")
    );
}

#[test]
fn config_changes_of_other_clients_are_told() {
    let mut h = Harness::new();
    h.open_new();
    h.line(json!({"jsonrpc":"2.0","id":2,"method":"session/set_config_option","params":{"sessionId":"s1","configId":"model","value":"faux/faux-reasoner"}}));
    let (token, command) = h.call();
    assert!(matches!(command, Command::SetModel { ref model, .. } if model.id == "faux-reasoner"));
    let mut changed = snapshot(vec![]);
    changed.model.id = "faux-reasoner".into();
    // Our own change, broadcast before its answer, is not another client's.
    h.step(Input::Event(ServerEvent::SessionSnapshot {
        snapshot: changed.clone(),
    }));
    h.done(
        token,
        Ok(CommandResult::SetModel {
            session: changed.clone(),
        }),
    );
    let sent = h.take();
    assert!(updates(&sent).is_empty());
    let levels = sent[0]["result"]["configOptions"][1]["options"]
        .as_array()
        .unwrap();
    assert_eq!(levels.len(), 5);
    // Another client's change is.
    changed.thinking_level = ThinkingLevel::High;
    h.step(Input::Event(ServerEvent::SessionSnapshot {
        snapshot: changed,
    }));
    let sent = h.take();
    assert_eq!(updates(&sent)[0]["sessionUpdate"], "config_option_update");
    // An unknown model is refused with the alternatives.
    h.line(json!({"jsonrpc":"2.0","id":3,"method":"session/set_config_option","params":{"sessionId":"s1","configId":"model","value":"x/y"}}));
    let sent = h.take();
    assert_eq!(error_code(&sent[0]), -32602);
    assert!(
        sent[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("faux/faux-1")
    );
}
