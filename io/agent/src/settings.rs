//! A session's own settings for its model calls and tools: its `settings.json`
//! (`<sessionDir>/<id>/settings.json`) over `<agentDir>/settings.json`
//! ([`pi_config::settings`]).

use kernel::approval::ApprovalPolicy;
use pi_config::settings::{file, read, read_file};
use std::path::Path;

/// What one session's model calls are given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// Whether the project's context files go in the system prompt.
    pub context_files: bool,
    /// The tools offered, by name, in order.
    pub tools: Vec<String>,
    /// The approval policy of sessions that set none (`"approvals"`).
    pub approvals: ApprovalPolicy,
    /// How long a question waits before it is denied
    /// (`"approvalTimeoutSeconds"`; none: it waits).
    pub approval_timeout: Option<std::time::Duration>,
}

/// The settings of the session whose directory is `session`: each key from
/// the session's `settings.json`, else (for `contextFiles`) from
/// `PI_CONTEXT_FILES`, else from `<agentDir>/settings.json`, else the
/// default (context files on; [`crate::tools::DEFAULT_TOOLS`]).
/// Read for every model call, so a change takes effect at the next one.
pub fn session(agent_dir: &Path, session: &Path) -> Result<SessionSettings, String> {
    let path = session.join("settings.json");
    let own = read_file(&path);
    let global = read(agent_dir);
    let env = std::env::var("PI_CONTEXT_FILES")
        .ok()
        .map(|v| !matches!(v.trim(), "0" | "false" | "off" | "no"));
    let context_files = match own.get("contextFiles") {
        Some(v) => Some(v.as_bool().ok_or_else(|| {
            format!("{}: \"contextFiles\" must be true or false", path.display())
        })?),
        None => None,
    }
    .or(env)
    .or_else(|| global.get("contextFiles").and_then(|v| v.as_bool()))
    .unwrap_or(true);
    let (source, list) = match own.get("tools") {
        Some(list) => (path.clone(), Some(list)),
        None => (file(agent_dir), global.get("tools")),
    };
    let tools: Vec<String> = match list {
        None => crate::tools::DEFAULT_TOOLS
            .iter()
            .map(|t| t.to_string())
            .collect(),
        Some(list) => list
            .as_array()
            .and_then(|l| l.iter().map(|t| t.as_str().map(str::to_string)).collect())
            .ok_or_else(|| {
                format!(
                    "{}: \"tools\" must be a list of tool names",
                    source.display()
                )
            })?,
    };
    crate::tools::select_tools(&tools).map_err(|e| format!("{}: {e}", source.display()))?;
    let (source, approvals) = match own.get("approvals") {
        Some(value) => (path.clone(), Some(value)),
        None => (file(agent_dir), global.get("approvals")),
    };
    let approvals = match approvals {
        None => ApprovalPolicy::default(),
        Some(value) => value
            .as_str()
            .and_then(ApprovalPolicy::parse)
            .ok_or_else(|| {
                format!(
                    "{}: \"approvals\" must be {}, not {value}",
                    source.display(),
                    ApprovalPolicy::NAMES
                )
            })?,
    };
    let (source, timeout) = match own.get("approvalTimeoutSeconds") {
        Some(value) => (path, Some(value)),
        None => (file(agent_dir), global.get("approvalTimeoutSeconds")),
    };
    let approval_timeout = match timeout {
        None => None,
        Some(value) => match value.as_u64() {
            Some(secs) if secs > 0 => Some(std::time::Duration::from_secs(secs)),
            _ => {
                return Err(format!(
                    "{}: \"approvalTimeoutSeconds\" must be a whole number of seconds above 0, not {value}",
                    source.display()
                ));
            }
        },
    };
    Ok(SessionSettings {
        context_files,
        tools,
        approvals,
        approval_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_own_settings_override_the_global_ones() {
        let dir = std::env::temp_dir().join(format!("pi-settings-s-{}", std::process::id()));
        let (agent, session) = (dir.join("agent"), dir.join("session"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&agent).unwrap();
        std::fs::create_dir_all(&session).unwrap();
        let s = self::session(&agent, &session).unwrap();
        assert_eq!(s.tools, crate::tools::DEFAULT_TOOLS);
        let write =
            |path: &Path, text: &str| std::fs::write(path.join("settings.json"), text).unwrap();
        write(&agent, r#"{"tools": ["read", "bash"]}"#);
        assert_eq!(
            self::session(&agent, &session).unwrap().tools,
            ["read", "bash"]
        );
        write(&session, r#"{"tools": [], "contextFiles": false}"#);
        let s = self::session(&agent, &session).unwrap();
        assert!(s.tools.is_empty());
        if std::env::var_os("PI_CONTEXT_FILES").is_none() {
            assert!(!s.context_files);
        }
        write(&session, r#"{"tools": "read"}"#);
        let e = self::session(&agent, &session).unwrap_err();
        assert!(e.contains("must be a list of tool names"), "{e}");
        write(&session, r#"{"contextFiles": "no"}"#);
        let e = self::session(&agent, &session).unwrap_err();
        assert!(e.contains("must be true or false"), "{e}");
        write(&session, "{}");
        write(&agent, r#"{"tools": ["read", "Bash"]}"#);
        let e = self::session(&agent, &session).unwrap_err();
        assert!(
            e.contains("unknown tool \"Bash\"") && e.contains("the tools are read, write, edit"),
            "{e}"
        );
        // The approval policy: the session's over the global one, checked.
        write(&agent, r#"{"approvals": "ask"}"#);
        let s = self::session(&agent, &session).unwrap();
        assert_eq!(s.approvals, ApprovalPolicy::Ask);
        write(&session, r#"{"approvals": "read-only"}"#);
        let s = self::session(&agent, &session).unwrap();
        assert_eq!(s.approvals, ApprovalPolicy::ReadOnly);
        write(&session, r#"{"approvals": "never"}"#);
        let e = self::session(&agent, &session).unwrap_err();
        assert!(
            e.contains("\"approvals\" must be auto, ask or read-only"),
            "{e}"
        );
        write(&session, r#"{"approvalTimeoutSeconds": 300}"#);
        let s = self::session(&agent, &session).unwrap();
        assert_eq!(
            s.approval_timeout,
            Some(std::time::Duration::from_secs(300))
        );
        write(&session, r#"{"approvalTimeoutSeconds": -1}"#);
        let e = self::session(&agent, &session).unwrap_err();
        assert!(e.contains("whole number of seconds"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
