//! Project context for the system prompt: the agent dir's global
//! `AGENTS.md`, then every `AGENTS.md` (or, where a directory has none,
//! `CLAUDE.md`) from the filesystem root down to the session's cwd, each
//! under a heading naming its path; and the date and OS, as pi sends them.
//!
//! Read again for every model call, so an edit made by the agent or the
//! user takes effect at once. The total is capped at [`MAX_BYTES`]; what is
//! cut is said. `"contextFiles": false` in `<agentDir>/settings.json` or
//! `PI_CONTEXT_FILES=0` turns the files off, and a session's own
//! `settings.json` for that session ([`crate::settings::session`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Most bytes of context files put in one system prompt.
pub const MAX_BYTES: usize = 64 * 1024;

/// The file names looked for in each directory, in order of preference.
const NAMES: [&str; 2] = ["AGENTS.md", "CLAUDE.md"];

/// The context files that apply to `cwd`, outermost first.
pub fn files(agent_dir: &Path, cwd: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let global = agent_dir.join("AGENTS.md");
    if global.is_file() {
        found.push(global);
    }
    let mut dirs: Vec<&Path> = cwd.ancestors().collect();
    dirs.reverse();
    for dir in dirs {
        if let Some(file) = NAMES.iter().map(|n| dir.join(n)).find(|p| p.is_file())
            && !found.contains(&file)
        {
            found.push(file);
        }
    }
    found
}

/// The section appended to the system prompt: the date and the OS, then,
/// with `files_on`, the context files.
pub fn section(agent_dir: &Path, cwd: &Path, date: &str, files_on: bool) -> String {
    let mut text = String::new();
    let _ = write!(
        text,
        "\nCurrent date: {date}\nOperating system: {} ({})",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    if !files_on {
        return text;
    }
    let mut files_text = String::new();
    let mut omitted = 0usize;
    for path in files(agent_dir, cwd) {
        let Ok(content) = std::fs::read_to_string(&path) else {
            continue;
        };
        let block = format!("\n\n## {}\n\n{}\n", path.display(), content.trim_end());
        let room = MAX_BYTES.saturating_sub(files_text.len());
        if block.len() <= room {
            files_text.push_str(&block);
        } else {
            let mut cut = room;
            while !block.is_char_boundary(cut) {
                cut -= 1;
            }
            files_text.push_str(&block[..cut]);
            omitted += block.len() - cut;
        }
    }
    if files_text.is_empty() {
        return text;
    }
    text.push_str(
        "\n\n# Project context\n\nInstructions from the user's context files (outermost first; \
         later ones are more specific):",
    );
    text.push_str(&files_text);
    if omitted > 0 {
        let _ = write!(
            text,
            "\n\n[context files truncated: {omitted} more bytes not shown (limit {MAX_BYTES} bytes)]"
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pi-context-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn files_from_the_agent_dir_then_root_to_cwd_agents_before_claude() {
        let root = scratch("order");
        let agent = root.join("agent");
        let repo = root.join("repo");
        let sub = repo.join("crates").join("core");
        std::fs::create_dir_all(&agent).unwrap();
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(agent.join("AGENTS.md"), "global rules").unwrap();
        std::fs::write(repo.join("AGENTS.md"), "repo rules").unwrap();
        std::fs::write(repo.join("CLAUDE.md"), "ignored: AGENTS.md wins").unwrap();
        std::fs::write(sub.join("CLAUDE.md"), "core rules").unwrap();
        assert_eq!(
            files(&agent, &sub),
            [
                agent.join("AGENTS.md"),
                repo.join("AGENTS.md"),
                sub.join("CLAUDE.md")
            ]
        );
        let text = section(&agent, &sub, "2026-12-03", true);
        let (g, r, c) = (
            text.find("global rules").unwrap(),
            text.find("repo rules").unwrap(),
            text.find("core rules").unwrap(),
        );
        assert!(g < r && r < c, "{text}");
        assert!(text.contains(&format!("## {}", repo.join("AGENTS.md").display())));
        assert!(!text.contains("ignored"));
        assert!(text.contains("Current date: 2026-12-03"));
        assert!(text.contains(std::env::consts::OS));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_total_is_capped_and_the_cut_is_said() {
        let root = scratch("cap");
        std::fs::write(root.join("AGENTS.md"), "x".repeat(MAX_BYTES + 500)).unwrap();
        let text = section(&root.join("no-agent-dir"), &root, "d", true);
        assert!(text.len() < MAX_BYTES + 1000, "{}", text.len());
        assert!(
            text.contains("context files truncated"),
            "{}",
            &text[text.len() - 200..]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn off_leaves_only_the_date_and_os() {
        let root = scratch("off");
        std::fs::write(root.join("AGENTS.md"), "rules").unwrap();
        let text = section(&root, &root, "d", false);
        assert!(!text.contains("rules") && text.contains("Current date: d"));
        assert!(section(&root, &root, "d", true).contains("rules"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
