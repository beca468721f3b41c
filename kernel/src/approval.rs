//! Approvals: whether a tool call runs at once, waits for a person's answer,
//! or is not offered at all.
//!
//! A session has a policy: [`ApprovalPolicy::Auto`] (every tool runs, pi's
//! default), [`ApprovalPolicy::Ask`] (a tool that writes, runs commands or
//! is an MCP server's waits for an answer; a reading tool does not) or
//! [`ApprovalPolicy::ReadOnly`] (only reading tools are offered, and any
//! other call is refused). A question is session state: the runtime stores
//! it before anyone is shown it, every attached client sees it, the first
//! answer wins, and it outlives its clients, the server and the worker.
//!
//! The rule of one call is [`Approvals::gate`]; the runtime keeps the
//! [`Approvals`] in its stored state and carries out what it says.

use crate::protocol::JsonValue;

/// The tools that only read: never asked about, always offered.
pub const READING_TOOLS: [&str; 4] = ["read", "grep", "find", "ls"];

/// Whether `tool` only reads.
pub fn is_reading(tool: &str) -> bool {
    READING_TOOLS.contains(&tool)
}

/// How a session treats tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApprovalPolicy {
    /// Every tool runs at once (pi's default).
    #[default]
    Auto,
    /// Tools that write, run commands or are MCP tools wait for an answer.
    Ask,
    /// Only reading tools are offered; any other call is refused.
    ReadOnly,
}

impl ApprovalPolicy {
    /// Every policy, in the order help text lists them.
    pub const ALL: [ApprovalPolicy; 3] = [Self::Auto, Self::Ask, Self::ReadOnly];

    /// Its name in settings, on the wire and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ask => "ask",
            Self::ReadOnly => "read-only",
        }
    }

    /// The policy named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Whether a model call offers `tool` under this policy.
    pub fn offers(self, tool: &str) -> bool {
        self != Self::ReadOnly || is_reading(tool)
    }

    /// The policies' names, for messages.
    pub const NAMES: &str = "auto, ask or read-only";
}

/// A person's answer to a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run this call.
    Allow,
    /// Run this call, and every later call of the same tool in this session.
    Always,
    /// Do not run it: the model is told it was denied.
    Deny,
}

impl Decision {
    /// Every decision.
    pub const ALL: [Decision; 3] = [Self::Allow, Self::Always, Self::Deny];

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Always => "always",
            Self::Deny => "deny",
        }
    }

    /// The decision named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// One tool call waiting for an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    /// The tool item's id in the transcript: what an answer names.
    pub id: String,
    /// The provider's id of the call (pi's `callId` in `pi.live`).
    pub call_id: String,
    /// Which tool.
    pub tool: String,
    /// Its arguments.
    pub input: JsonValue,
    /// When it was asked (epoch ms).
    pub asked_at: u64,
}

/// What a session's approvals are: its policy, the tools allowed always,
/// and the questions waiting.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Approvals {
    /// Set for this session by a client; `None` follows the settings.
    pub policy: Option<ApprovalPolicy>,
    /// Tools an `always` answer allowed for the rest of the session, sorted.
    pub always: Vec<String>,
    /// Questions waiting, oldest first (at most one per running tool call;
    /// tools run one at a time, so at most one in practice).
    pub pending: Vec<Question>,
}

/// What becomes of one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// It runs now.
    Run,
    /// It waits for an answer.
    Ask,
    /// It is refused without running (read-only).
    Refuse,
}

impl Approvals {
    /// The policy in force, `default` being the settings'.
    pub fn effective(&self, default: ApprovalPolicy) -> ApprovalPolicy {
        self.policy.unwrap_or(default)
    }

    /// What becomes of a call of `tool` under `default` (the settings').
    pub fn gate(&self, default: ApprovalPolicy, tool: &str) -> Gate {
        match self.effective(default) {
            _ if is_reading(tool) => Gate::Run,
            ApprovalPolicy::Auto => Gate::Run,
            ApprovalPolicy::ReadOnly => Gate::Refuse,
            ApprovalPolicy::Ask if self.always.iter().any(|t| t == tool) => Gate::Run,
            ApprovalPolicy::Ask => Gate::Ask,
        }
    }

    /// The question about tool item `id`, if one waits.
    pub fn question(&self, id: &str) -> Option<&Question> {
        self.pending.iter().find(|q| q.id == id)
    }

    /// Remembers `tool` as allowed always.
    pub fn allow_always(&mut self, tool: &str) {
        if let Err(at) = self.always.binary_search_by(|t| t.as_str().cmp(tool)) {
            self.always.insert(at, tool.to_string());
        }
    }
}

/// The text a denied tool call's result carries: the model reads it.
pub const DENIED: &str = "Denied: the user did not allow this tool call. Do not retry it \
                          unchanged; ask the user or take another way.";

/// The text of a call refused under read-only.
pub fn refused_read_only(tool: &str) -> String {
    format!(
        "Refused: the session is read-only, so only {} run; {tool} was not run.",
        READING_TOOLS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_tools_always_run_and_the_rest_follow_the_policy() {
        let mut a = Approvals::default();
        assert_eq!(a.gate(ApprovalPolicy::Auto, "bash"), Gate::Run);
        assert_eq!(a.gate(ApprovalPolicy::Ask, "read"), Gate::Run);
        assert_eq!(a.gate(ApprovalPolicy::Ask, "bash"), Gate::Ask);
        assert_eq!(a.gate(ApprovalPolicy::Ask, "mcp_tool"), Gate::Ask);
        assert_eq!(a.gate(ApprovalPolicy::ReadOnly, "ls"), Gate::Run);
        assert_eq!(a.gate(ApprovalPolicy::ReadOnly, "write"), Gate::Refuse);
        a.allow_always("bash");
        a.allow_always("bash");
        assert_eq!(a.always, ["bash"]);
        assert_eq!(a.gate(ApprovalPolicy::Ask, "bash"), Gate::Run);
        assert_eq!(a.gate(ApprovalPolicy::Ask, "edit"), Gate::Ask);
        // A session's own policy wins over the settings'.
        a.policy = Some(ApprovalPolicy::Auto);
        assert_eq!(a.gate(ApprovalPolicy::Ask, "edit"), Gate::Run);
        // Read-only does not honour an earlier `always`.
        a.policy = Some(ApprovalPolicy::ReadOnly);
        assert_eq!(a.gate(ApprovalPolicy::Auto, "bash"), Gate::Refuse);
    }

    #[test]
    fn names_round_trip() {
        for p in ApprovalPolicy::ALL {
            assert_eq!(ApprovalPolicy::parse(p.as_str()), Some(p));
            assert!(p.offers("read"));
        }
        for d in Decision::ALL {
            assert_eq!(Decision::parse(d.as_str()), Some(d));
        }
        assert!(!ApprovalPolicy::ReadOnly.offers("bash"));
        assert_eq!(ApprovalPolicy::parse("never"), None);
    }
}
