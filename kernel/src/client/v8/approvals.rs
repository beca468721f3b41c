//! `pi-server.approvals` as a client reads it: the policy in force and the
//! questions waiting, typed from the replicated state.

use super::connection::{APPROVALS, Connection};
use crate::approval::{ApprovalPolicy, Question};
use crate::wire::Value;

/// A session's approvals as its replica shows them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Shown {
    /// The policy in force.
    pub policy: ApprovalPolicy,
    /// Whether the session set it itself (else the settings' applies).
    pub own: bool,
    /// Tools allowed always in this session.
    pub always: Vec<String>,
    /// Questions waiting, oldest first.
    pub pending: Vec<Question>,
}

impl Shown {
    /// The state as the server publishes it (`{policy, own, always,
    /// pending}`), or `None` if it is not that shape.
    pub fn read(state: &Value) -> Option<Self> {
        let text = |v: &Value| match v {
            Value::Text(t) => Some(t.clone()),
            _ => None,
        };
        let list = |key: &str| match state.get(key) {
            Some(Value::Array(items)) => Some(items.as_slice()),
            _ => None,
        };
        let policy = ApprovalPolicy::parse(&text(state.get("policy")?)?)?;
        let own = matches!(state.get("own"), Some(Value::Bool(true)));
        let always = list("always")?.iter().map(text).collect::<Option<_>>()?;
        let pending = list("pending")?
            .iter()
            .map(|q| {
                Some(Question {
                    id: text(q.get("id")?)?,
                    call_id: text(q.get("callId")?)?,
                    tool: text(q.get("tool")?)?,
                    input: q.get("input")?.clone(),
                    asked_at: match q.get("askedAt")? {
                        Value::Int(n) => u64::try_from(*n).ok()?,
                        _ => return None,
                    },
                })
            })
            .collect::<Option<_>>()?;
        Some(Self {
            policy,
            own,
            always,
            pending,
        })
    }

    /// The attached session's approvals as `connection` follows them.
    pub fn of(connection: &Connection) -> Option<Self> {
        connection.session_state(APPROVALS).and_then(Self::read)
    }

    /// The question to answer now: the oldest.
    pub fn asked(&self) -> Option<&Question> {
        self.pending.first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::Approvals;

    #[test]
    fn the_published_state_reads_back() {
        let approvals = Approvals {
            policy: Some(ApprovalPolicy::Ask),
            always: vec!["edit".into()],
            pending: vec![Question {
                id: "item-4".into(),
                call_id: "c1".into(),
                tool: "bash".into(),
                input: Value::object(vec![("command", Value::text("ls"))]),
                asked_at: 9,
            }],
        };
        let state = crate::server::v8::view::approvals_state(&approvals, ApprovalPolicy::Ask);
        let shown = Shown::read(&state).expect("reads");
        assert_eq!(shown.policy, ApprovalPolicy::Ask);
        assert!(shown.own);
        assert_eq!(shown.always, ["edit"]);
        assert_eq!(shown.asked(), approvals.pending.first());
        assert_eq!(Shown::read(&Value::Null), None);
    }
}
