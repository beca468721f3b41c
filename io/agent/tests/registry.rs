//! The model registry: built-in and custom models, keys, `authenticated`, cost.

use kernel::protocol::{InputKind, ModelCost, ModelRef, ThinkingLevel, Usage};
use pi_agent::registry::apply_cost;
use pi_agent::{Api, ModelRegistry};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pi-agent-registry-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str, mode: u32) {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load(dir: &TempDir, env: &[(&str, &str)]) -> ModelRegistry {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ModelRegistry::load_with(&dir.0, &move |name| env.get(name).cloned())
}

fn r(provider: &str, id: &str) -> ModelRef {
    ModelRef {
        provider: provider.into(),
        id: id.into(),
    }
}

#[test]
fn built_in_models_have_full_metadata_and_need_keys() {
    let dir = TempDir::new();
    let reg = load(&dir, &[]);
    assert!(reg.warnings().is_empty(), "{:?}", reg.warnings());
    assert_eq!(reg.models()[0].provider, "faux");
    assert!(reg.find(&r("faux", "faux-1")).unwrap().authenticated);
    let sonnet = reg.find(&r("anthropic", "claude-sonnet-4-5")).unwrap();
    assert_eq!(
        (sonnet.context_window, sonnet.max_tokens),
        (200_000, 64_000)
    );
    assert_eq!(
        sonnet.cost,
        ModelCost {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75
        }
    );
    assert!(
        sonnet.reasoning
            && sonnet
                .supported_thinking_levels
                .contains(&ThinkingLevel::High)
    );
    assert_eq!(sonnet.input, [InputKind::Text, InputKind::Image]);
    assert_eq!(sonnet.api, "anthropic-messages");
    assert!(!sonnet.authenticated);
    let gpt = reg.find(&r("openai", "gpt-4.1")).unwrap();
    assert_eq!(gpt.api, "openai-completions");
    assert_eq!(gpt.supported_thinking_levels, [ThinkingLevel::Off]);
    let error = reg
        .provider_config(&r("openai", "gpt-4.1"), "/p")
        .unwrap_err();
    assert!(
        error.starts_with("no API key for provider openai: set OPENAI_API_KEY"),
        "{error}"
    );
    let error = reg
        .provider_config(&r("openai", "gpt-9"), "/p")
        .unwrap_err();
    assert_eq!(error, "unknown model openai/gpt-9");
    assert!(reg.provider_config(&r("faux", "faux-1"), "/p").is_err());
}

#[test]
fn keys_from_the_environment() {
    let dir = TempDir::new();
    let reg = load(
        &dir,
        &[
            ("ANTHROPIC_API_KEY", "sk-ant"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/"),
        ],
    );
    assert!(
        reg.find(&r("anthropic", "claude-haiku-4-5"))
            .unwrap()
            .authenticated
    );
    assert!(!reg.find(&r("openai", "gpt-5")).unwrap().authenticated);
    let p = reg
        .provider_config(&r("anthropic", "claude-haiku-4-5"), "/work")
        .unwrap();
    assert_eq!(p.api, Api::AnthropicMessages);
    assert_eq!(p.base_url, "https://api.anthropic.com");
    assert_eq!(p.api_key.as_deref(), Some("sk-ant"));
    assert_eq!(p.cwd, "/work");
    assert_eq!(p.model.id, "claude-haiku-4-5");
    let reg = load(
        &dir,
        &[
            ("OPENAI_API_KEY", "sk-o"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/"),
        ],
    );
    let p = reg.provider_config(&r("openai", "gpt-5"), "/").unwrap();
    assert_eq!(p.base_url, "http://127.0.0.1:9/v1");
    assert_eq!(p.max_tokens_field.as_deref(), Some("max_completion_tokens"));
}

#[test]
fn auth_json_is_read_only_when_private() {
    let dir = TempDir::new();
    let auth =
        r#"{"openai": {"key": "sk-file"}, "anthropic": {"type": "api_key", "key": "sk-ant-file"}}"#;
    dir.write("auth.json", auth, 0o600);
    let reg = load(&dir, &[("OPENAI_API_KEY", "sk-env")]);
    assert!(reg.warnings().is_empty(), "{:?}", reg.warnings());
    let p = reg.provider_config(&r("openai", "gpt-4.1"), "/").unwrap();
    assert_eq!(p.api_key.as_deref(), Some("sk-file"));
    let p = reg
        .provider_config(&r("anthropic", "claude-opus-4-1"), "/")
        .unwrap();
    assert_eq!(p.api_key.as_deref(), Some("sk-ant-file"));

    dir.write("auth.json", auth, 0o644);
    let reg = load(&dir, &[]);
    assert_eq!(reg.warnings().len(), 1);
    let warning = &reg.warnings()[0];
    assert!(
        warning.starts_with("refusing to read ") && warning.contains("mode 0644"),
        "{warning}"
    );
    assert!(warning.contains("chmod 600"), "{warning}");
    assert!(!reg.find(&r("openai", "gpt-4.1")).unwrap().authenticated);
}

#[test]
fn custom_models_from_models_json() {
    let dir = TempDir::new();
    let models = r#"{
      "providers": {
        "local": {
          "baseUrl": "http://127.0.0.1:8080/v1/",
          "api": "openai-completions",
          "maxTokensField": "max_tokens",
          "timeouts": {"firstByteSeconds": 300, "idleSeconds": 120},
          "models": [
            {"id": "qwen2.5-coder-14b", "contextWindow": 32768, "maxTokens": 8192},
            {"id": "qwq", "name": "QwQ", "reasoning": true, "input": ["text", "image"],
             "cost": {"input": 0.1, "output": 0.2}}
          ]
        },
        "remote": {
          "baseUrl": "https://llm.example/v1", "api": "openai-completions", "apiKeyEnv": "REMOTE_KEY",
          "models": [{"id": "big"}]
        },
        "broken": {"api": "nope", "models": [{"id": "x"}]},
        "openai": {"models": [{"id": "gpt-4.1-nano", "contextWindow": 1047576, "maxTokens": 32768}]},
        "local2": {"baseUrl": "http://localhost:11434/v1", "api": "openai-completions",
          "models": [{"id": "bad", "thinkingLevels": ["loud"]}]}
      }
    }"#;
    dir.write("models.json", models, 0o644);
    let reg = load(&dir, &[]);
    let w = reg.warnings().join("\n");
    assert!(w.contains("provider broken: unknown api \"nope\""), "{w}");
    assert!(w.contains("unknown thinking level \"loud\""), "{w}");
    assert_eq!(reg.warnings().len(), 2, "{w}");

    let qwen = reg.find(&r("local", "qwen2.5-coder-14b")).unwrap();
    assert!(qwen.authenticated, "a local server needs no key");
    assert_eq!(
        (qwen.name.as_str(), qwen.context_window, qwen.max_tokens),
        ("qwen2.5-coder-14b", 32768, 8192)
    );
    assert_eq!(qwen.supported_thinking_levels, [ThinkingLevel::Off]);
    let qwq = reg.find(&r("local", "qwq")).unwrap();
    assert_eq!(qwq.name, "QwQ");
    assert_eq!(qwq.supported_thinking_levels.len(), 5);
    assert_eq!(qwq.cost.output, 0.2);
    let p = reg.provider_config(&r("local", "qwq"), "/src").unwrap();
    assert_eq!(p.base_url, "http://127.0.0.1:8080/v1");
    assert_eq!(p.api_key, None);
    assert_eq!(p.max_tokens_field.as_deref(), Some("max_tokens"));
    assert_eq!(p.timeouts.first_byte, Duration::from_secs(300));
    assert_eq!(p.timeouts.idle, Duration::from_secs(120));
    assert_eq!(p.timeouts.connect, Duration::from_secs(10));

    assert!(!reg.find(&r("remote", "big")).unwrap().authenticated);
    let reg2 = load(&dir, &[("REMOTE_KEY", "k")]);
    assert_eq!(
        reg2.provider_config(&r("remote", "big"), "/")
            .unwrap()
            .api_key
            .as_deref(),
        Some("k")
    );
    // A built-in provider gains models (and keeps needing its key).
    assert!(
        !reg.find(&r("openai", "gpt-4.1-nano"))
            .unwrap()
            .authenticated
    );

    dir.write("models.json", "{not json", 0o644);
    let reg = load(&dir, &[]);
    assert!(
        reg.warnings()[0].starts_with("ignoring ") && reg.warnings()[0].contains("models.json")
    );
    assert!(reg.find(&r("openai", "gpt-4.1")).is_some());
}

#[test]
fn cost_is_usage_times_price_per_million() {
    let price = ModelCost {
        input: 3.0,
        output: 15.0,
        cache_read: 0.3,
        cache_write: 3.75,
    };
    let mut usage = Usage {
        input: 1_000_000,
        output: 2_000,
        cache_read: 10_000,
        cache_write: 0,
        ..Usage::default()
    };
    apply_cost(&price, &mut usage);
    assert_eq!(usage.cost.input, 3.0);
    assert_eq!(usage.cost.output, 0.03);
    assert!((usage.cost.cache_read - 0.003).abs() < 1e-12);
    assert!((usage.cost.total - 3.033).abs() < 1e-12);
}

#[test]
fn openai_responses_per_provider_or_per_model() {
    let dir = TempDir::new();
    dir.write(
        "models.json",
        r#"{"providers": {
            "openai": {"api": "openai-responses"},
            "gateway": {"baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions",
                "models": [
                    {"id": "chat-model"},
                    {"id": "codex-model", "api": "openai-responses"},
                    {"id": "odd-model", "api": "openai-telepathy"}
                ]}
        }}"#,
        0o644,
    );
    let reg = load(&dir, &[("OPENAI_API_KEY", "sk")]);
    let api = |p: &str, id: &str| reg.provider_config(&r(p, id), "/p").unwrap().api;
    assert_eq!(
        api("openai", "gpt-5"),
        Api::OpenAiResponses,
        "built-ins follow their provider"
    );
    assert_eq!(
        reg.find(&r("openai", "gpt-5")).unwrap().api,
        "openai-responses"
    );
    assert_eq!(api("gateway", "chat-model"), Api::OpenAiCompletions);
    assert_eq!(api("gateway", "codex-model"), Api::OpenAiResponses);
    assert!(reg.find(&r("gateway", "odd-model")).is_none());
    assert!(
        reg.warnings()
            .iter()
            .any(|w| w.contains("unknown api \"openai-telepathy\"")),
        "{:?}",
        reg.warnings()
    );
}
