//! The model registry: which models exist, how to reach them, and whether a
//! key is present.
//!
//! Sources, in order (a later entry with the same provider and id replaces an
//! earlier one):
//! 1. the embedded faux models (`kernel::faux::models()`), always authenticated;
//! 2. built-in OpenAI and Anthropic models with full metadata;
//! 3. `<agentDir>/models.json`, custom providers and models:
//!
//! ```json
//! {
//!   "providers": {
//!     "local": {
//!       "baseUrl": "http://127.0.0.1:8080/v1",
//!       "api": "openai-completions",
//!       "apiKeyEnv": "LOCAL_LLM_KEY",
//!       "headers": { "X-Client": "pi-server" },
//!       "maxTokensField": "max_tokens",
//!       "timeouts": { "connectSeconds": 10, "firstByteSeconds": 300, "idleSeconds": 120 },
//!       "models": [
//!         {
//!           "id": "qwen2.5-coder-14b",
//!           "name": "Qwen2.5 Coder 14B (llama.cpp)",
//!           "reasoning": false,
//!           "input": ["text"],
//!           "contextWindow": 32768,
//!           "maxTokens": 8192,
//!           "cost": { "input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0 },
//!           "thinkingLevels": ["off"]
//!         }
//!       ]
//!     }
//!   }
//! }
//! ```
//!
//! Provider fields: `baseUrl` and `api` (`openai-completions` — the base URL
//! ends before `/chat/completions` —, `openai-responses` — before
//! `/responses` — or `anthropic-messages` — before `/v1/messages`) are
//! required for a new provider; naming a built-in provider
//! (`openai`, `anthropic`) overrides its settings and adds models. Optional:
//! `apiKeyEnv` (the environment variable holding the key; declaring it makes
//! the key required), `apiKey` (a literal key), `headers` (sent with every
//! request), `maxTokensField` (`max_tokens` or `max_completion_tokens`: send
//! the model's `maxTokens` under that name; omitted, none is sent; with
//! `openai-responses` any value sends it as `max_output_tokens`), `timeouts`.
//! Model fields: `id` is required; `api` overrides the provider's for this
//! model (e.g. `"api": "openai-responses"` for a Codex model of a provider
//! otherwise on Chat Completions); `name` defaults to the id, `reasoning` to
//! false, `input` to `["text"]`, `contextWindow` to 128000, `maxTokens` to
//! 16384, `cost` (USD per million tokens) to zero, `thinkingLevels` to
//! `["off"]` (`["off","minimal","low","medium","high"]` for reasoning models).
//!
//! `openai-responses` calls are stateless: the transcript is replayed as
//! `input` items with `store: false`; the thinking levels map to
//! `reasoning.effort` (`xhigh` and `max` to `high`) with summaries streamed as
//! thinking.
//!
//! Keys: `<agentDir>/auth.json`, `{ "openai": { "key": "sk-..." }, "anthropic":
//! { "key": "..." } }` (any provider id), read only when it is private to its
//! owner (mode 0600); then the environment (`OPENAI_API_KEY`,
//! `ANTHROPIC_API_KEY`, or the provider's `apiKeyEnv`); then `apiKey`. A model
//! is `authenticated` when its provider has a key or needs none (custom
//! providers without `apiKeyEnv`, e.g. a local llama.cpp, vLLM or Ollama server).

use kernel::protocol::{InputKind, ModelCost, ModelMetadata, ModelRef, ThinkingLevel, Usage};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// The wire API of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI-compatible Chat Completions (`openai-completions`).
    OpenAiCompletions,
    /// Anthropic Messages (`anthropic-messages`).
    AnthropicMessages,
    /// OpenAI Responses (`openai-responses`).
    OpenAiResponses,
}

impl Api {
    /// The registry name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAiCompletions => "openai-completions",
            Self::AnthropicMessages => "anthropic-messages",
            Self::OpenAiResponses => "openai-responses",
        }
    }

    /// Parses a registry name.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::OpenAiCompletions,
            Self::AnthropicMessages,
            Self::OpenAiResponses,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// Bounds on every wait of a model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP (and TLS) connect.
    pub connect: Duration,
    /// From sending the request to the response headers.
    pub first_byte: Duration,
    /// Between two reads of the response body.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: crate::limits::MODEL_CONNECT,
            first_byte: crate::limits::MODEL_FIRST_BYTE,
            idle: crate::limits::MODEL_IDLE,
        }
    }
}

/// Everything one model call needs to reach its provider.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Provider id (also the label of error messages).
    pub provider: String,
    /// Wire API.
    pub api: Api,
    /// Base URL, without a trailing slash.
    pub base_url: String,
    /// The key, if any.
    pub api_key: Option<String>,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// The model's metadata (limits, cost, reasoning).
    pub model: ModelMetadata,
    /// Bounds on every wait.
    pub timeouts: Timeouts,
    /// OpenAI-compatible only: the body field that carries `maxTokens`, if any.
    pub max_tokens_field: Option<String>,
    /// The session's working directory (named in the system prompt).
    pub cwd: String,
    /// Appended to the system prompt: the date, the OS and the project's
    /// context files ([`super::context::section`]).
    pub context: String,
    /// The tools offered to the model (the session's `tools` setting).
    pub tools: Vec<super::ToolSpec>,
}

impl ProviderConfig {
    /// A provider config with default timeouts and no key, for `model` at `base_url`.
    pub fn new(api: Api, base_url: &str, model: ModelMetadata) -> Self {
        Self {
            provider: model.provider.clone(),
            api,
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key: None,
            headers: Vec::new(),
            model,
            timeouts: Timeouts::default(),
            max_tokens_field: None,
            cwd: "/".to_string(),
            context: String::new(),
            tools: super::tool_specs(),
        }
    }
}

/// Fills `usage.cost` from the token counts and the model's prices (per million tokens).
pub fn apply_cost(cost: &ModelCost, usage: &mut Usage) {
    let per = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
    usage.cost.input = per(usage.input, cost.input);
    usage.cost.output = per(usage.output, cost.output);
    usage.cost.cache_read = per(usage.cache_read, cost.cache_read);
    usage.cost.cache_write = per(usage.cache_write, cost.cache_write);
    usage.cost.total =
        usage.cost.input + usage.cost.output + usage.cost.cache_read + usage.cost.cache_write;
}

#[derive(Debug, Clone)]
struct Provider {
    id: String,
    api: Api,
    base_url: String,
    key: Option<String>,
    key_env: Option<String>,
    requires_key: bool,
    headers: Vec<(String, String)>,
    max_tokens_field: Option<String>,
    timeouts: Timeouts,
}

/// The models a worker offers and how to reach them. See the module documentation.
#[derive(Debug, Clone)]
pub struct ModelRegistry {
    providers: Vec<Provider>,
    models: Vec<ModelMetadata>,
    warnings: Vec<String>,
    /// `<agentDir>/auth.json`, named when a key is missing.
    auth_path: std::path::PathBuf,
}

impl ModelRegistry {
    /// Loads the registry for `agent_dir` with the process environment; logs warnings.
    pub fn load(agent_dir: &Path) -> Self {
        let registry = Self::load_with(agent_dir, &|name| std::env::var(name).ok());
        for warning in &registry.warnings {
            tracing::warn!("{warning}");
        }
        registry
    }

    /// Loads the registry for `agent_dir`, reading variables through `env`.
    pub fn load_with(agent_dir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut warnings = Vec::new();
        let auth_path = agent_dir.join("auth.json");
        let auth = read_auth(&auth_path, &mut warnings);
        let mut providers = builtin_providers(&env);
        let mut models = kernel::faux::models();
        models.extend(builtin_models());
        let models_path = agent_dir.join("models.json");
        match std::fs::read_to_string(&models_path) {
            Ok(text) => match serde_json::from_str::<ModelsFile>(&text) {
                Ok(file) => add_custom(file, &env, &mut providers, &mut models, &mut warnings),
                Err(e) => warnings.push(format!("ignoring {}: {e}", models_path.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warnings.push(format!("cannot read {}: {e}", models_path.display())),
        }
        for p in &mut providers {
            let from_env = p.key_env.as_deref().and_then(&env);
            if let Some(key) = auth.get(&p.id).cloned().or(from_env) {
                p.key = Some(key);
            }
        }
        for m in &mut models {
            m.authenticated = match providers.iter().find(|p| p.id == m.provider) {
                Some(p) => p.key.is_some() || !p.requires_key,
                None => m.provider == kernel::faux::PROVIDER,
            };
        }
        Self {
            providers,
            models,
            warnings,
            auth_path,
        }
    }

    /// Every model, faux first.
    pub fn models(&self) -> &[ModelMetadata] {
        &self.models
    }

    /// Problems met while loading (each was logged by [`ModelRegistry::load`]).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// A model's metadata.
    pub fn find(&self, model: &ModelRef) -> Option<&ModelMetadata> {
        self.models
            .iter()
            .find(|m| m.provider == model.provider && m.id == model.id)
    }

    /// [`ModelRegistry::provider_config`] for one model call of the session
    /// whose directory is `session`, with its settings and project context
    /// read now, so edits take effect: the tools it offers
    /// ([`crate::settings::session`]) and, for the system prompt, the date
    /// (`YYYY-MM-DD`), the OS and the context files of `agent_dir` and `cwd`
    /// ([`super::context`]).
    pub fn call_config(
        &self,
        model: &ModelRef,
        cwd: &str,
        agent_dir: &Path,
        session: &Path,
        date: &str,
    ) -> Result<ProviderConfig, String> {
        let mut config = self.provider_config(model, cwd)?;
        let settings = crate::settings::session(agent_dir, session)?;
        config.tools = super::tools::select_tools(&settings.tools)?;
        config.context =
            super::context::section(agent_dir, Path::new(cwd), date, settings.context_files);
        Ok(config)
    }

    /// How to call `model` for a session whose working directory is `cwd`.
    /// Faux models are not reached over HTTP and have none.
    pub fn provider_config(&self, model: &ModelRef, cwd: &str) -> Result<ProviderConfig, String> {
        let meta = self
            .find(model)
            .ok_or_else(|| format!("unknown model {}/{}", model.provider, model.id))?;
        let Some(p) = self.providers.iter().find(|p| p.id == model.provider) else {
            return Err(format!(
                "model {}/{} is not served over HTTP",
                model.provider, model.id
            ));
        };
        if !meta.authenticated {
            let env = p
                .key_env
                .as_deref()
                .unwrap_or("the provider's key variable");
            return Err(format!(
                "no API key for provider {}: set {env} or add {{\"{}\": {{\"key\": \"...\"}}}} \
                 to {} (mode 0600)",
                p.id,
                p.id,
                self.auth_path.display()
            ));
        }
        Ok(ProviderConfig {
            provider: p.id.clone(),
            api: Api::parse(&meta.api).unwrap_or(p.api),
            base_url: p.base_url.clone(),
            api_key: p.key.clone(),
            headers: p.headers.clone(),
            model: meta.clone(),
            timeouts: p.timeouts,
            max_tokens_field: p.max_tokens_field.clone(),
            cwd: cwd.to_string(),
            context: String::new(),
            tools: super::tool_specs(),
        })
    }
}

/// Reads `auth.json` if it exists and is private; a readable-by-others file is refused.
fn read_auth(path: &Path, warnings: &mut Vec<String>) -> BTreeMap<String, String> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            warnings.push(format!("cannot read {}: {e}", path.display()));
            return BTreeMap::new();
        }
    };
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        warnings.push(format!(
            "refusing to read {}: it is accessible to other users (mode {mode:04o}); \
             run `chmod 600 {}` to use the keys in it",
            path.display(),
            path.display()
        ));
        return BTreeMap::new();
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            warnings.push(format!("cannot read {}: {e}", path.display()));
            return BTreeMap::new();
        }
    };
    let json: serde_json::Value = match serde_json::from_str(&text) {
        Ok(json) => json,
        Err(e) => {
            warnings.push(format!("ignoring {}: invalid JSON: {e}", path.display()));
            return BTreeMap::new();
        }
    };
    let Some(object) = json.as_object() else {
        warnings.push(format!(
            "ignoring {}: expected a JSON object",
            path.display()
        ));
        return BTreeMap::new();
    };
    let mut keys = BTreeMap::new();
    for (provider, entry) in object {
        let key = entry
            .as_str()
            .or_else(|| entry.get("key").and_then(|k| k.as_str()));
        match key {
            Some(key) if !key.trim().is_empty() => {
                keys.insert(provider.clone(), key.trim().to_string());
            }
            _ => warnings.push(format!(
                "{}: entry {provider:?} has no \"key\" string; ignored",
                path.display()
            )),
        }
    }
    keys
}

fn builtin_providers(env: &dyn Fn(&str) -> Option<String>) -> Vec<Provider> {
    let provider = |id: &str, api, url_env: &str, default_url: &str, key_env: &str, field| {
        let base_url = env(url_env).unwrap_or_else(|| default_url.to_string());
        Provider {
            id: id.to_string(),
            api,
            base_url: base_url.trim_end_matches('/').to_string(),
            key: None,
            key_env: Some(key_env.to_string()),
            requires_key: true,
            headers: Vec::new(),
            max_tokens_field: field,
            timeouts: Timeouts::default(),
        }
    };
    vec![
        provider(
            "openai",
            Api::OpenAiCompletions,
            "OPENAI_BASE_URL",
            "https://api.openai.com/v1",
            "OPENAI_API_KEY",
            Some("max_completion_tokens".to_string()),
        ),
        provider(
            "anthropic",
            Api::AnthropicMessages,
            "ANTHROPIC_BASE_URL",
            "https://api.anthropic.com",
            "ANTHROPIC_API_KEY",
            None,
        ),
    ]
}

/// Built-in models (prices in USD per million tokens).
pub fn builtin_models() -> Vec<ModelMetadata> {
    use ThinkingLevel::*;
    #[allow(clippy::too_many_arguments)]
    fn model(
        provider: &str,
        id: &str,
        name: &str,
        api: Api,
        window: u64,
        max: u64,
        price: [f64; 4],
        levels: &[ThinkingLevel],
    ) -> ModelMetadata {
        ModelMetadata {
            provider: provider.into(),
            id: id.into(),
            name: name.into(),
            api: api.as_str().into(),
            reasoning: levels.iter().any(|l| *l != Off),
            input: vec![InputKind::Text, InputKind::Image],
            context_window: window,
            max_tokens: max,
            cost: ModelCost {
                input: price[0],
                output: price[1],
                cache_read: price[2],
                cache_write: price[3],
            },
            supported_thinking_levels: levels.to_vec(),
            authenticated: false,
        }
    }
    let oa = Api::OpenAiCompletions;
    let an = Api::AnthropicMessages;
    let gpt5 = [Minimal, Low, Medium, High];
    let o_series = [Low, Medium, High];
    let claude = [Off, Minimal, Low, Medium, High];
    vec![
        model(
            "openai",
            "gpt-5",
            "GPT-5",
            oa,
            400_000,
            128_000,
            [1.25, 10.0, 0.125, 0.0],
            &gpt5,
        ),
        model(
            "openai",
            "gpt-5-mini",
            "GPT-5 mini",
            oa,
            400_000,
            128_000,
            [0.25, 2.0, 0.025, 0.0],
            &gpt5,
        ),
        model(
            "openai",
            "gpt-4.1",
            "GPT-4.1",
            oa,
            1_047_576,
            32_768,
            [2.0, 8.0, 0.5, 0.0],
            &[Off],
        ),
        model(
            "openai",
            "gpt-4.1-mini",
            "GPT-4.1 mini",
            oa,
            1_047_576,
            32_768,
            [0.4, 1.6, 0.1, 0.0],
            &[Off],
        ),
        model(
            "openai",
            "gpt-4o",
            "GPT-4o",
            oa,
            128_000,
            16_384,
            [2.5, 10.0, 1.25, 0.0],
            &[Off],
        ),
        model(
            "openai",
            "o4-mini",
            "o4-mini",
            oa,
            200_000,
            100_000,
            [1.1, 4.4, 0.275, 0.0],
            &o_series,
        ),
        model(
            "anthropic",
            "claude-sonnet-4-5",
            "Claude Sonnet 4.5",
            an,
            200_000,
            64_000,
            [3.0, 15.0, 0.3, 3.75],
            &claude,
        ),
        model(
            "anthropic",
            "claude-opus-4-1",
            "Claude Opus 4.1",
            an,
            200_000,
            32_000,
            [15.0, 75.0, 1.5, 18.75],
            &claude,
        ),
        model(
            "anthropic",
            "claude-haiku-4-5",
            "Claude Haiku 4.5",
            an,
            200_000,
            64_000,
            [1.0, 5.0, 0.1, 1.25],
            &claude,
        ),
        model(
            "anthropic",
            "claude-sonnet-4-0",
            "Claude Sonnet 4",
            an,
            200_000,
            64_000,
            [3.0, 15.0, 0.3, 3.75],
            &claude,
        ),
    ]
}

// ---- models.json ------------------------------------------------------------

#[derive(Deserialize)]
struct ModelsFile {
    #[serde(default)]
    providers: BTreeMap<String, ProviderFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderFile {
    base_url: Option<String>,
    api: Option<String>,
    api_key_env: Option<String>,
    api_key: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    max_tokens_field: Option<String>,
    timeouts: Option<TimeoutsFile>,
    #[serde(default)]
    models: Vec<ModelFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimeoutsFile {
    connect_seconds: Option<f64>,
    first_byte_seconds: Option<f64>,
    idle_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModelFile {
    id: String,
    name: Option<String>,
    api: Option<String>,
    #[serde(default)]
    reasoning: bool,
    input: Option<Vec<String>>,
    context_window: Option<u64>,
    max_tokens: Option<u64>,
    cost: Option<CostFile>,
    thinking_levels: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct CostFile {
    #[serde(default)]
    input: f64,
    #[serde(default)]
    output: f64,
    #[serde(default)]
    cache_read: f64,
    #[serde(default)]
    cache_write: f64,
}

fn add_custom(
    file: ModelsFile,
    env: &dyn Fn(&str) -> Option<String>,
    providers: &mut Vec<Provider>,
    models: &mut Vec<ModelMetadata>,
    warnings: &mut Vec<String>,
) {
    for (id, p) in file.providers {
        if id.is_empty() || id == kernel::faux::PROVIDER {
            warnings.push(format!(
                "models.json: provider id {id:?} is reserved; ignored"
            ));
            continue;
        }
        let api = match p.api.as_deref().map(|a| (a, Api::parse(a))) {
            Some((_, Some(api))) => Some(api),
            Some((other, None)) => {
                warnings.push(format!(
                    "models.json: provider {id}: unknown api {other:?} \
                     (expected openai-completions, openai-responses or \
                     anthropic-messages); ignored"
                ));
                continue;
            }
            None => None,
        };
        let field = match p.max_tokens_field.as_deref() {
            None => None,
            Some(f @ ("max_tokens" | "max_completion_tokens")) => Some(f.to_string()),
            Some(other) => {
                warnings.push(format!(
                    "models.json: provider {id}: maxTokensField {other:?} is not \
                     max_tokens or max_completion_tokens; none is sent"
                ));
                None
            }
        };
        let position = providers.iter().position(|q| q.id == id);
        let provider = match position {
            Some(i) => &mut providers[i],
            None => {
                let (Some(base_url), Some(api)) = (p.base_url.clone(), api) else {
                    warnings.push(format!(
                        "models.json: provider {id} needs \"baseUrl\" and \"api\"; ignored"
                    ));
                    continue;
                };
                providers.push(Provider {
                    id: id.clone(),
                    api,
                    base_url,
                    key: None,
                    key_env: None,
                    requires_key: false,
                    headers: Vec::new(),
                    max_tokens_field: None,
                    timeouts: Timeouts::default(),
                });
                providers.last_mut().expect("pushed")
            }
        };
        if let Some(api) = api {
            provider.api = api;
            // The provider's models so far (built-in ones) follow it.
            for m in models.iter_mut().filter(|m| m.provider == id) {
                m.api = api.as_str().to_string();
            }
        }
        if let Some(url) = &p.base_url {
            provider.base_url = url.trim_end_matches('/').to_string();
        }
        if let Some(var) = &p.api_key_env {
            provider.key_env = Some(var.clone());
            provider.requires_key = true;
        }
        if let Some(key) = p.api_key.as_ref().filter(|k| !k.trim().is_empty()) {
            // Like the `pi` agent: the name of a set variable, or the key itself.
            provider.key = Some(env(key).unwrap_or_else(|| key.clone()));
        }
        provider.headers.extend(p.headers);
        if field.is_some() {
            provider.max_tokens_field = field;
        }
        if let Some(t) = p.timeouts {
            let secs = |v: Option<f64>, d: Duration| {
                v.filter(|s| s.is_finite() && *s > 0.0)
                    .map_or(d, Duration::from_secs_f64)
            };
            let t0 = provider.timeouts;
            provider.timeouts = Timeouts {
                connect: secs(t.connect_seconds, t0.connect),
                first_byte: secs(t.first_byte_seconds, t0.first_byte),
                idle: secs(t.idle_seconds, t0.idle),
            };
        }
        let api = provider.api;
        for m in p.models {
            match custom_model(&id, api, m) {
                Ok(meta) => {
                    models.retain(|x| !(x.provider == meta.provider && x.id == meta.id));
                    models.push(meta);
                }
                Err(e) => warnings.push(format!("models.json: provider {id}: {e}; model ignored")),
            }
        }
    }
}

fn custom_model(provider: &str, api: Api, m: ModelFile) -> Result<ModelMetadata, String> {
    if m.id.trim().is_empty() {
        return Err("a model has an empty id".into());
    }
    let id = m.id;
    let api = match m.api.as_deref() {
        None => api,
        Some(name) => {
            Api::parse(name).ok_or_else(|| format!("model {id}: unknown api {name:?}"))?
        }
    };
    let input = match m.input {
        None => vec![InputKind::Text],
        Some(kinds) => {
            let mut out = Vec::new();
            for k in kinds {
                out.push(match k.as_str() {
                    "text" => InputKind::Text,
                    "image" => InputKind::Image,
                    other => return Err(format!("model {id}: unknown input kind {other:?}")),
                });
            }
            out.sort();
            out.dedup();
            out
        }
    };
    let levels = match m.thinking_levels {
        Some(names) => {
            let mut levels = Vec::new();
            for n in names {
                levels.push(
                    ThinkingLevel::parse(&n)
                        .ok_or_else(|| format!("model {id}: unknown thinking level {n:?}"))?,
                );
            }
            levels.sort();
            levels.dedup();
            levels
        }
        None if m.reasoning => {
            use ThinkingLevel::*;
            vec![Off, Minimal, Low, Medium, High]
        }
        None => vec![ThinkingLevel::Off],
    };
    if levels.is_empty() {
        return Err(format!("model {id}: thinkingLevels is empty"));
    }
    let window = m.context_window.unwrap_or(128_000);
    let max = m.max_tokens.unwrap_or(16_384);
    if window == 0 || max == 0 {
        return Err(format!(
            "model {id}: contextWindow and maxTokens must be at least 1"
        ));
    }
    let c = m.cost.unwrap_or_default();
    let prices = [c.input, c.output, c.cache_read, c.cache_write];
    if prices.iter().any(|p| !p.is_finite() || *p < 0.0) {
        return Err(format!("model {id}: costs must be numbers ≥ 0"));
    }
    Ok(ModelMetadata {
        provider: provider.to_string(),
        name: m
            .name
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| id.clone()),
        id,
        api: api.as_str().to_string(),
        reasoning: m.reasoning,
        input,
        context_window: window,
        max_tokens: max,
        cost: ModelCost {
            input: c.input,
            output: c.output,
            cache_read: c.cache_read,
            cache_write: c.cache_write,
        },
        supported_thinking_levels: levels,
        authenticated: false,
    })
}
