//! `<agentDir>/settings.json`: user settings shared by every session. The
//! daemon writes only `defaultProvider` and `defaultModel`, reads those and
//! `contextFiles`, and keeps every other key as it is.

use kernel::protocol::ModelRef;
use std::path::{Path, PathBuf};

fn file(agent_dir: &Path) -> PathBuf {
    agent_dir.join("settings.json")
}

fn read(agent_dir: &Path) -> serde_json::Map<String, serde_json::Value> {
    let path = file(agent_dir);
    let Ok(text) = std::fs::read_to_string(&path) else {
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

/// A boolean setting, if the settings give one.
pub fn flag(agent_dir: &Path, key: &str) -> Option<bool> {
    read(agent_dir).get(key)?.as_bool()
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
