//! Which session a user means: the id, name or id prefix they typed, as
//! every front end reads it (`pi-server prompt NAME`, `/sessions NAME`).

use crate::protocol::SessionMetadata;

/// Why a session query named no one session.
#[derive(Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// No session.
    None,
    /// The candidates, as `id (name)` lines.
    Ambiguous(Vec<String>),
}

/// The session id `query` names: an exact id, else the one session whose
/// name is `query`, else the one id it is a prefix of.
pub fn resolve(sessions: &[SessionMetadata], query: &str) -> Result<String, Unresolved> {
    if sessions.iter().any(|s| s.id == query) {
        return Ok(query.to_owned());
    }
    let mut ids: Vec<&SessionMetadata> = sessions
        .iter()
        .filter(|s| s.session_name.as_deref() == Some(query))
        .collect();
    if ids.is_empty() {
        ids = sessions
            .iter()
            .filter(|s| s.id.starts_with(query))
            .collect();
    }
    ids.sort_by(|a, b| a.id.cmp(&b.id));
    ids.dedup_by(|a, b| a.id == b.id);
    match ids.as_slice() {
        [] => Err(Unresolved::None),
        [one] => Ok(one.id.clone()),
        many => Err(Unresolved::Ambiguous(
            many.iter()
                .map(|s| match &s.session_name {
                    Some(name) => format!("{} ({name})", s.id),
                    None => s.id.clone(),
                })
                .collect(),
        )),
    }
}

/// Whether `session` is one a listing filtered by `text` shows: its id
/// starts with it, or its name or working directory holds it (ignoring
/// case).
pub fn matches(session: &SessionMetadata, text: &str) -> bool {
    let text = text.to_lowercase();
    let holds = |field: &Option<String>| {
        field
            .as_deref()
            .is_some_and(|f| f.to_lowercase().contains(&text))
    };
    session.id.starts_with(&text) || holds(&session.session_name) || holds(&session.cwd)
}

/// What `list TEXT` keeps: a session that [`matches`] the text, or whose
/// first prompt (its preview, which the server reports for `status`) holds
/// it, case aside.
pub fn listed(session: &SessionMetadata, preview: Option<&str>, text: &str) -> bool {
    matches(session, text)
        || preview.is_some_and(|p| p.to_lowercase().contains(&text.to_lowercase()))
}

/// The shortest prefix length, at least `min`, that tells every id of
/// `ids` apart (a listing's short ids, each usable as a query).
pub fn unique_prefix_len<'a>(ids: impl IntoIterator<Item = &'a str>, min: usize) -> usize {
    let mut ids: Vec<&str> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.windows(2)
        .map(|pair| {
            let common = pair[0]
                .bytes()
                .zip(pair[1].bytes())
                .take_while(|(a, b)| a == b)
                .count();
            common + 1
        })
        .fold(min, usize::max)
}

/// The most recently active session whose working directory is `cwd`
/// (`--last`): the newest update, else creation; ties by id.
pub fn latest_in(sessions: &[SessionMetadata], cwd: &str) -> Result<String, Unresolved> {
    sessions
        .iter()
        .filter(|s| s.cwd.as_deref() == Some(cwd))
        .max_by(|a, b| {
            let at = |s: &SessionMetadata| s.updated_at.unwrap_or(s.created_at);
            at(a).cmp(&at(b)).then_with(|| a.id.cmp(&b.id))
        })
        .map(|s| s.id.clone())
        .ok_or(Unresolved::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_matches_id_prefixes_names_and_directories() {
        let s = SessionMetadata {
            id: "abc123".into(),
            created_at: 0,
            updated_at: None,
            parent_session_id: None,
            session_name: Some("Bug Fix".into()),
            cwd: Some("/home/me/project".into()),
        };
        for yes in ["abc", "bug", "fix", "project", "/home"] {
            assert!(matches(&s, yes), "{yes}");
        }
        for no in ["123", "zzz"] {
            assert!(!matches(&s, no), "{no}");
        }
        // `list TEXT` also finds a session by its first prompt.
        assert!(listed(&s, Some("Fix the Parser"), "parser"));
        assert!(!listed(&s, Some("fix the parser"), "zzz"));
        assert!(!listed(&s, None, "parser"));
        assert_eq!(unique_prefix_len(["abcdef01", "abcdef02", "x"], 4), 8);
        assert_eq!(unique_prefix_len(["a1", "b2"], 8), 8);
    }

    #[test]
    fn the_last_session_is_the_newest_of_the_directory() {
        let at = |id: &str, cwd: &str, created: u64, updated: Option<u64>| SessionMetadata {
            id: id.into(),
            created_at: created,
            updated_at: updated,
            parent_session_id: None,
            session_name: None,
            cwd: Some(cwd.into()),
        };
        let sessions = [
            at("a", "/p", 1, Some(50)),
            at("b", "/p", 40, None),
            at("c", "/q", 1, Some(99)),
        ];
        assert_eq!(latest_in(&sessions, "/p"), Ok("a".into()));
        assert_eq!(latest_in(&sessions, "/q"), Ok("c".into()));
        assert_eq!(latest_in(&sessions, "/r"), Err(Unresolved::None));
    }

    fn meta(id: &str, name: Option<&str>) -> SessionMetadata {
        SessionMetadata {
            id: id.into(),
            created_at: 0,
            updated_at: None,
            parent_session_id: None,
            session_name: name.map(str::to_owned),
            cwd: None,
        }
    }

    #[test]
    fn a_query_is_an_id_a_name_or_a_unique_prefix() {
        let sessions = [
            meta("abc123", Some("work")),
            meta("abd456", None),
            meta("work", None),
            meta("ff00", Some("twin")),
            meta("ee00", Some("twin")),
        ];
        assert_eq!(resolve(&sessions, "abd456"), Ok("abd456".into()));
        assert_eq!(
            resolve(&sessions, "work"),
            Ok("work".into()),
            "an id beats a name"
        );
        assert_eq!(resolve(&sessions, "abc"), Ok("abc123".into()));
        assert_eq!(resolve(&sessions, "zz"), Err(Unresolved::None));
        assert_eq!(
            resolve(&sessions, "ab"),
            Err(Unresolved::Ambiguous(vec![
                "abc123 (work)".into(),
                "abd456".into()
            ]))
        );
        assert_eq!(
            resolve(&sessions, "twin"),
            Err(Unresolved::Ambiguous(vec![
                "ee00 (twin)".into(),
                "ff00 (twin)".into()
            ]))
        );
    }
}
