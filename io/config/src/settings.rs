//! `<agentDir>/settings.json`: user settings shared by every session. The
//! daemon writes only `defaultProvider` and `defaultModel`, reads those,
//! `contextFiles` and `tools`, and keeps every other key as it is.
//!
//! A session's own `settings.json`, in its directory
//! (`<sessionDir>/<id>/settings.json`), overrides `contextFiles` and `tools`
//! for that session alone (the agent's `settings::session`). It lives beside the store and not
//! in the protocol: v1's `create` takes no options, and `meta.json` holds
//! exactly `createdAt` and `cwd`.

use kernel::protocol::ModelRef;
use std::path::{Path, PathBuf};

/// `<agentDir>/settings.json`.
pub fn file(agent_dir: &Path) -> PathBuf {
    agent_dir.join("settings.json")
}

/// `<agentDir>/settings.json` as an object; empty when absent or malformed.
pub fn read(agent_dir: &Path) -> serde_json::Map<String, serde_json::Value> {
    read_file(&file(agent_dir))
}

/// A settings file as an object: empty when absent, and when it is not a
/// JSON object (with a warning).
pub fn read_file(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Default::default();
    };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(map)) => map,
        Ok(_) | Err(_) => {
            tracing::warn!(path = %path.display(), "settings.json is not a JSON object; ignoring it");
            Default::default()
        }
    }
}

/// The layers of a session's MCP configuration, in the order they merge
/// (later wins by name): `<agentDir>/settings.json`, the session's own
/// `settings.json`, and the editor's servers remembered with the session.
pub fn mcp_layers(agent_dir: &Path, session: &Path) -> Vec<kernel::mcp::Layer> {
    [
        file(agent_dir),
        session.join("settings.json"),
        session.join(kernel::mcp::EDITOR_FILE),
    ]
    .into_iter()
    .map(|path| mcp_layer(&path))
    .collect()
}

/// The MCP servers `<agentDir>/settings.json` configures, for every session.
pub fn mcp_global(agent_dir: &Path) -> kernel::mcp::Layer {
    mcp_layer(&file(agent_dir))
}

fn mcp_layer(path: &Path) -> kernel::mcp::Layer {
    kernel::mcp::Layer {
        servers: read_file(path)
            .get("mcpServers")
            .map(crate::json::from_json),
        source: path.display().to_string(),
    }
}

/// The model new sessions start with, if the settings name one.
pub fn default_model(agent_dir: &Path) -> Option<ModelRef> {
    let map = read(agent_dir);
    let provider = map.get("defaultProvider")?.as_str()?.to_string();
    let id = map.get("defaultModel")?.as_str()?.to_string();
    (!provider.is_empty() && !id.is_empty()).then_some(ModelRef { provider, id })
}

/// Records `model` as the default for new sessions (atomically; other keys kept).
pub fn set_default_model(agent_dir: &Path, model: &ModelRef) -> Result<(), String> {
    let mut map = read(agent_dir);
    map.insert("defaultProvider".into(), model.provider.clone().into());
    map.insert("defaultModel".into(), model.id.clone().into());
    std::fs::create_dir_all(agent_dir)
        .map_err(|e| format!("cannot create {}: {e}", agent_dir.display()))?;
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(map))
        .expect("a JSON object")
        + "\n";
    let tmp = agent_dir.join(format!(".settings.json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, file(agent_dir)).map_err(|e| format!("cannot replace settings.json: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_round_trips_and_keeps_other_keys() {
        let dir = std::env::temp_dir().join(format!("pi-settings-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(default_model(&dir), None);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("settings.json"), "{\"theme\": \"dark\"}").unwrap();
        let m = ModelRef {
            provider: "faux".into(),
            id: "faux-reasoner".into(),
        };
        set_default_model(&dir, &m).unwrap();
        assert_eq!(default_model(&dir), Some(m));
        let text = std::fs::read_to_string(dir.join("settings.json")).unwrap();
        assert!(text.contains("\"theme\": \"dark\""));
        std::fs::write(dir.join("settings.json"), "[1]").unwrap();
        assert_eq!(default_model(&dir), None, "a malformed file is ignored");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
