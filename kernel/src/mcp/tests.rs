use super::*;
use crate::wire::Value;

fn json(text: &str) -> JsonValue {
    fn convert(v: serde_json::Value) -> JsonValue {
        match v {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(b),
            serde_json::Value::Number(n) => Value::number(n.as_f64().expect("a number")),
            serde_json::Value::String(s) => Value::Text(s),
            serde_json::Value::Array(a) => Value::Array(a.into_iter().map(convert).collect()),
            serde_json::Value::Object(o) => {
                Value::Map(o.into_iter().map(|(k, v)| (k, convert(v))).collect())
            }
        }
    }
    convert(serde_json::from_str(text).expect("valid JSON"))
}

fn layer(source: &str, servers: &str) -> Layer {
    Layer {
        source: source.into(),
        servers: Some(json(servers)),
    }
}

fn tool(name: &str) -> ListedTool {
    ListedTool {
        name: name.into(),
        description: Some(format!("does {name}")),
        schema: json(r#"{"type":"object","properties":{"x":{"type":"string"}}}"#),
    }
}

fn starts(out: &[McpOutput]) -> Vec<(u64, String)> {
    out.iter()
        .filter_map(|o| match o {
            McpOutput::Start { generation, config } => Some((*generation, config.name.clone())),
            _ => None,
        })
        .collect()
}

fn notices(out: &[McpOutput]) -> Vec<String> {
    out.iter()
        .filter_map(|o| match o {
            McpOutput::Notice(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

const T0: Instant = Instant(1_000);

#[test]
fn layers_merge_in_order_and_a_later_layer_wins_by_name() {
    let (servers, problems) = merge(&[
        layer(
            "/agent/settings.json",
            r#"{"docs": {"command": "docs-server", "args": ["--stdio"], "env": {"K": "v"}},
                "web": {"type": "http", "url": "https://a.example/mcp"}}"#,
        ),
        layer(
            "/session/settings.json",
            r#"{"web": {"url": "http://localhost:9/mcp", "headers": {"Authorization": "Bearer t"}},
                "docs": {"disabled": true}}"#,
        ),
    ]);
    assert_eq!(problems, Vec::<String>::new());
    assert_eq!(
        servers,
        [ServerConfig {
            name: "web".into(),
            transport: Transport::Http {
                url: "http://localhost:9/mcp".into(),
                headers: vec![("Authorization".into(), "Bearer t".into())],
            },
        }]
    );
}

#[test]
fn a_malformed_entry_is_a_notice_naming_it_and_its_file_and_the_rest_runs() {
    let (servers, problems) = merge(&[layer(
        "/s/settings.json",
        r#"{"ok": {"command": "x"}, "bad": {"command": 3}, "old": {"type": "sse", "url": "http://h"},
            "none": {}, "ftp": {"url": "ftp://h"}, "args": {"command": "x", "args": "a b"}}"#,
    )]);
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].name, "ok");
    assert_eq!(problems.len(), 5, "{problems:#?}");
    for p in &problems {
        assert!(p.starts_with("/s/settings.json: MCP server"), "{p}");
    }
    for entry in ["args", "bad", "ftp", "none", "old"] {
        let named = format!("MCP server {entry:?} is left out");
        assert!(
            problems.iter().any(|p| p.contains(&named)),
            "{entry}: {problems:#?}"
        );
    }
    let (_, problems) = merge(&[layer("/s/settings.json", "[1]")]);
    assert_eq!(
        problems,
        ["/s/settings.json: \"mcpServers\" must be an object of named servers, not a array"]
    );
}

#[test]
fn an_editors_acp_list_becomes_the_settings_shape() {
    let list = json(
        r#"[{"name": "fs", "command": "/bin/fs", "args": ["/tmp"], "env": [{"name": "A", "value": "1"}]},
            {"type": "http", "name": "web", "url": "http://h/mcp", "headers": [{"name": "X", "value": "y"}]}]"#,
    );
    let map = from_acp(&list).unwrap();
    let (servers, problems) = merge(&[Layer {
        source: "editor".into(),
        servers: Some(map),
    }]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        servers[0].transport,
        Transport::Stdio {
            command: "/bin/fs".into(),
            args: vec!["/tmp".into()],
            env: vec![("A".into(), "1".into())],
        }
    );
    assert_eq!(
        servers[1].transport,
        Transport::Http {
            url: "http://h/mcp".into(),
            headers: vec![("X".into(), "y".into())],
        }
    );
    assert!(from_acp(&json(r#"[{"command": "x"}]"#)).is_err());
    assert!(from_acp(&json("{}")).is_err());
}

#[test]
fn offered_names_are_prefixed_safe_and_short() {
    assert_eq!(offered_name("docs", "search"), "mcp__docs__search");
    assert_eq!(
        offered_name("my.server", "get page"),
        "mcp__my_server__get_page"
    );
    let long = offered_name("s", &"x".repeat(100));
    assert_eq!(long.len(), NAME_MAX);
}

#[test]
fn a_turn_waits_for_starting_servers_and_then_routes_their_tools() {
    let mut m = McpServers::new(McpLimits::default());
    assert!(m.settled());
    let out = m.step(
        T0,
        McpInput::Configure(vec![layer(
            "f",
            r#"{"a": {"command": "a"}, "b": {"url": "http://b"}}"#,
        )]),
    );
    assert_eq!(starts(&out), [(1, "a".into()), (2, "b".into())]);
    assert!(!m.settled());
    assert_eq!(
        m.next_deadline(),
        Some(T0 + McpLimits::default().start_timeout)
    );
    m.step(
        T0,
        McpInput::Started {
            name: "a".into(),
            generation: 1,
            tools: vec![tool("echo"), tool("add")],
        },
    );
    assert!(!m.settled());
    let out = m.step(
        T0,
        McpInput::Failed {
            name: "b".into(),
            generation: 2,
            reason: "connection refused".into(),
        },
    );
    assert!(m.settled());
    assert_eq!(
        notices(&out),
        ["MCP server \"b\" failed to start: connection refused; the session goes on without it"]
    );
    let names: Vec<_> = m.tools().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["mcp__a__echo", "mcp__a__add"]);
    assert_eq!(
        m.route("mcp__a__add"),
        Route::Call {
            server: "a".into(),
            generation: 1,
            tool: "add".into()
        }
    );
    assert_eq!(m.route("bash"), Route::Builtin);
    let Route::Unavailable(why) = m.route("mcp__b__fetch") else {
        panic!("b failed")
    };
    assert!(why.contains("connection refused"), "{why}");
    // The same configuration again changes nothing, and tells nothing.
    let out = m.step(
        T0 + std::time::Duration::from_secs(1),
        McpInput::Configure(vec![layer(
            "f",
            r#"{"a": {"command": "a"}, "b": {"url": "http://b"}}"#,
        )]),
    );
    assert_eq!(out, []);
}

#[test]
fn a_server_that_does_not_start_in_time_is_stopped_and_failed_then_retried_later() {
    let limits = McpLimits::default();
    let mut m = McpServers::new(limits.clone());
    let config = || McpInput::Configure(vec![layer("f", r#"{"slow": {"command": "sleep"}}"#)]);
    m.step(T0, config());
    let late = T0 + limits.start_timeout;
    let out = m.step(late, McpInput::Tick);
    assert!(out.contains(&McpOutput::Stop {
        name: "slow".into(),
        generation: 1
    }));
    assert!(notices(&out)[0].contains("did not start within 30 s"));
    assert!(m.settled());
    // Its answer after that is stale.
    m.step(
        late,
        McpInput::Started {
            name: "slow".into(),
            generation: 1,
            tools: vec![tool("t")],
        },
    );
    assert_eq!(m.tools().count(), 0);
    assert_eq!(m.step(late, config()), [], "not retried before retry_after");
    let out = m.step(late + limits.retry_after, config());
    assert_eq!(starts(&out), [(2, "slow".into())]);
}

#[test]
fn a_changed_or_removed_server_is_stopped_and_a_dead_one_is_told() {
    let mut m = McpServers::new(McpLimits::default());
    m.step(
        T0,
        McpInput::Configure(vec![layer("f", r#"{"a": {"command": "a"}}"#)]),
    );
    m.step(
        T0,
        McpInput::Started {
            name: "a".into(),
            generation: 1,
            tools: vec![tool("t")],
        },
    );
    let out = m.step(
        T0,
        McpInput::Configure(vec![layer("f", r#"{"a": {"command": "a2"}}"#)]),
    );
    assert_eq!(
        out[0],
        McpOutput::Stop {
            name: "a".into(),
            generation: 1
        }
    );
    assert_eq!(starts(&out), [(2, "a".into())]);
    m.step(
        T0,
        McpInput::Started {
            name: "a".into(),
            generation: 2,
            tools: vec![tool("t")],
        },
    );
    let out = m.step(
        T0,
        McpInput::Failed {
            name: "a".into(),
            generation: 2,
            reason: "exited with status 1".into(),
        },
    );
    assert!(notices(&out)[0].starts_with("MCP server \"a\" stopped: exited with status 1"));
    assert_eq!(m.status()[0].state, "failed");
    let out = m.step(T0, McpInput::Configure(vec![]));
    assert_eq!(out, [], "a failed server has nothing to stop");
    assert!(m.status().is_empty());
}

#[test]
fn bad_schemas_taken_names_and_the_cap_leave_tools_out_with_notices() {
    let limits = McpLimits {
        max_tools: 2,
        ..McpLimits::default()
    };
    let mut m = McpServers::new(limits);
    m.step(
        T0,
        McpInput::Configure(vec![layer("f", r#"{"s": {"command": "s"}}"#)]),
    );
    let mut bad = tool("bad");
    bad.schema = Value::text("not a schema");
    let out = m.step(
        T0,
        McpInput::Started {
            name: "s".into(),
            generation: 1,
            tools: vec![tool("a b"), tool("a_b"), bad, tool("c"), tool("d")],
        },
    );
    let told = notices(&out);
    assert_eq!(told.len(), 3, "{told:#?}");
    assert!(told[0].contains("\"a_b\"") && told[0].contains("is taken"));
    assert!(told[1].contains("\"bad\"") && told[1].contains("not a JSON schema"));
    assert!(told[2].contains("1 tools are left out"));
    let names: Vec<_> = m.tools().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["mcp__s__a_b", "mcp__s__c"]);
    assert_eq!(m.invariants(), Ok(()));
}

#[test]
fn configuration_problems_are_told_once() {
    let mut m = McpServers::new(McpLimits::default());
    let bad = || McpInput::Configure(vec![layer("f", r#"{"x": {"command": 1}}"#)]);
    assert_eq!(notices(&m.step(T0, bad())).len(), 1);
    assert_eq!(m.step(T0, bad()), []);
}
