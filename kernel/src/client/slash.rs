//! Slash commands: what a typed line that starts with `/` is. One parser
//! for every front end, so `/model` means the same in the terminal UI and
//! in the CLI's line mode, and the same names complete.
//!
//! A line is text for the model unless it starts with `/`: then it is a
//! command, or an error the user sees (an unknown command never reaches the
//! model). `//text` is the escape: the text `/text`, for the model.

use crate::approval::{ApprovalPolicy, Decision};
use crate::protocol::{ModelRef, ThinkingLevel};

/// What a typed line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Text for the model (a prompt or a steer); `//x` has become `/x`.
    Text(String),
    /// A command.
    Command(Command),
    /// A line starting with `/` that is no command as written: why.
    Invalid(String),
}

/// A slash command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/help`: the commands and keys.
    Help,
    /// `/quit` (or `/exit`): detach and leave.
    Quit,
    /// `/abort`: end the running turn.
    Abort,
    /// `/model [PROVIDER/MODEL]`: show the models, or switch to one.
    Model(Option<ModelRef>),
    /// `/thinking [LEVEL]`: show the levels, or set one.
    Thinking(Option<ThinkingLevel>),
    /// `/name NAME`: rename the session.
    Name(String),
    /// `/new`: a new session in the same working directory, switched to.
    New,
    /// `/sessions [SESSION]`: list the server's sessions, or switch to one.
    Sessions(Option<String>),
    /// `/export [FILE]`: write the transcript to a file.
    Export(Option<String>),
    /// `/compact [INSTRUCTIONS]`: summarise the older conversation now, as
    /// the instructions ask.
    Compact(Option<String>),
    /// `/approvals [POLICY]`: show the approval policy and the question
    /// waiting, or set the policy.
    Approvals(Option<ApprovalPolicy>),
    /// `/allow`, `/always`, `/deny`: answer the question shown.
    Decide(Decision),
}

/// Every command: its name, its arguments and what it does, as `/help`
/// shows them and completion offers them, in that order.
pub const COMMANDS: [(&str, &str, &str); 14] = [
    ("/help", "", "the commands and keys"),
    (
        "/model",
        "[PROVIDER/MODEL]",
        "list the models, or switch (between turns)",
    ),
    (
        "/thinking",
        "[LEVEL]",
        "list the thinking levels, or set one (between turns)",
    ),
    ("/name", "NAME", "rename the session (names are unique)"),
    ("/abort", "", "end the running turn (as Ctrl-C or Esc)"),
    (
        "/compact",
        "[INSTRUCTIONS]",
        "summarise the older conversation now (between turns), as asked",
    ),
    (
        "/new",
        "",
        "start a session in the same directory and switch to it",
    ),
    (
        "/sessions",
        "[SESSION]",
        "list the server's sessions, or switch to one",
    ),
    (
        "/export",
        "[FILE]",
        "write the transcript to FILE (default: NAME.md here)",
    ),
    (
        "/approvals",
        "[POLICY]",
        "show the approval policy, or set it: auto, ask or read-only",
    ),
    ("/allow", "", "run the tool call asked about (the y key)"),
    (
        "/always",
        "",
        "run it, and this tool from now on in this session (the a key)",
    ),
    ("/deny", "", "do not run it; the model is told (the n key)"),
    (
        "/quit",
        "",
        "detach and leave (as Ctrl-D); the session goes on",
    ),
];

/// Parses a typed line.
pub fn parse(line: &str) -> Line {
    let Some(rest) = line.strip_prefix('/') else {
        return Line::Text(line.to_owned());
    };
    if rest.starts_with('/') {
        return Line::Text(rest.to_owned());
    }
    let (name, argument) = match rest.split_once(char::is_whitespace) {
        Some((name, argument)) => (name, argument.trim()),
        None => (rest, ""),
    };
    let argument = (!argument.is_empty()).then_some(argument);
    let none = |command: Command| match argument {
        None => Line::Command(command),
        Some(_) => Line::Invalid(format!("/{name} takes no argument")),
    };
    match name {
        "help" | "?" => none(Command::Help),
        "quit" | "exit" => none(Command::Quit),
        "abort" => none(Command::Abort),
        "compact" => Line::Command(Command::Compact(argument.map(str::to_owned))),
        "new" => none(Command::New),
        "model" => match argument.map(model) {
            None => Line::Command(Command::Model(None)),
            Some(Some(model)) => Line::Command(Command::Model(Some(model))),
            Some(None) => {
                Line::Invalid("/model takes PROVIDER/MODEL, as in /model faux/faux-reasoner".into())
            }
        },
        "thinking" => match argument.map(ThinkingLevel::parse) {
            None => Line::Command(Command::Thinking(None)),
            Some(Some(level)) => Line::Command(Command::Thinking(Some(level))),
            Some(None) => {
                let names: Vec<&str> = ThinkingLevel::ALL.iter().map(|l| l.as_str()).collect();
                Line::Invalid(format!("/thinking takes one of {}", names.join(", ")))
            }
        },
        "name" | "rename" => match argument {
            Some(name) if !name.contains('\n') => Line::Command(Command::Name(name.to_owned())),
            Some(_) => Line::Invalid("/name takes one line".into()),
            None => Line::Invalid("/name takes the new name, as in /name bugfix".into()),
        },
        "sessions" => Line::Command(Command::Sessions(argument.map(str::to_owned))),
        "export" => Line::Command(Command::Export(argument.map(str::to_owned))),
        "approvals" => match argument.map(ApprovalPolicy::parse) {
            None => Line::Command(Command::Approvals(None)),
            Some(Some(policy)) => Line::Command(Command::Approvals(Some(policy))),
            Some(None) => Line::Invalid(format!("/approvals takes {}", ApprovalPolicy::NAMES)),
        },
        "allow" => none(Command::Decide(Decision::Allow)),
        "always" => none(Command::Decide(Decision::Always)),
        "deny" => none(Command::Decide(Decision::Deny)),
        "" => Line::Invalid("a command name goes after /; /help lists them".into()),
        _ => Line::Invalid(format!(
            "unknown command /{name}: /help lists them; //{name} sends /{name} as text"
        )),
    }
}

fn model(text: &str) -> Option<ModelRef> {
    match text.split_once('/') {
        Some((provider, id)) if !provider.is_empty() && !id.is_empty() && !id.contains(' ') => {
            Some(ModelRef {
                provider: provider.to_owned(),
                id: id.to_owned(),
            })
        }
        _ => None,
    }
}

/// The commands whose names start with `prefix` (a line being typed, as
/// `/mo`), for completion; none unless it is a bare `/word`.
pub fn complete(prefix: &str) -> Vec<&'static str> {
    if !prefix.starts_with('/') || prefix.starts_with("//") || prefix.contains(char::is_whitespace)
    {
        return Vec::new();
    }
    COMMANDS
        .iter()
        .map(|(name, _, _)| *name)
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// `/help`'s text: one line per command.
pub fn help() -> String {
    let width = COMMANDS
        .iter()
        .map(|(name, args, _)| name.len() + 1 + args.len())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (name, args, what) in COMMANDS {
        let usage = if args.is_empty() {
            name.to_owned()
        } else {
            format!("{name} {args}")
        };
        text.push_str(&format!("{usage:<width$}  {what}\n"));
    }
    text.push_str("//TEXT sends /TEXT to the model as it is");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_text_commands_or_errors() {
        let text = |s: &str| Line::Text(s.to_owned());
        assert_eq!(parse("hello"), text("hello"));
        assert_eq!(parse(" /model"), text(" /model"), "only a leading slash");
        assert_eq!(parse("//model x"), text("/model x"));
        assert_eq!(parse("/help"), Line::Command(Command::Help));
        assert_eq!(parse("/exit"), Line::Command(Command::Quit));
        assert_eq!(parse("/model"), Line::Command(Command::Model(None)));
        assert_eq!(
            parse("/model  faux/faux-reasoner "),
            Line::Command(Command::Model(Some(ModelRef {
                provider: "faux".into(),
                id: "faux-reasoner".into()
            })))
        );
        assert_eq!(
            parse("/thinking high"),
            Line::Command(Command::Thinking(Some(ThinkingLevel::High)))
        );
        assert_eq!(
            parse("/name the big fix"),
            Line::Command(Command::Name("the big fix".into()))
        );
        assert_eq!(
            parse("/sessions fix"),
            Line::Command(Command::Sessions(Some("fix".into())))
        );
        assert_eq!(parse("/export"), Line::Command(Command::Export(None)));
        for bad in [
            "/model faux",
            "/thinking lots",
            "/name",
            "/quit now",
            "/frobnicate",
            "/",
            "/name a\nb",
        ] {
            assert!(matches!(parse(bad), Line::Invalid(_)), "{bad}");
        }
        let Line::Invalid(why) = parse("/frobnicate") else {
            unreachable!()
        };
        assert!(why.contains("//frobnicate"), "{why}");
    }

    #[test]
    fn completion_offers_the_commands_a_prefix_starts() {
        assert_eq!(complete("/mo"), ["/model"]);
        assert_eq!(complete("/"), COMMANDS.map(|(n, _, _)| n));
        assert!(complete("/model x").is_empty());
        assert!(complete("hello").is_empty());
        assert!(complete("//m").is_empty());
        assert!(complete("/zz").is_empty());
    }

    #[test]
    fn every_command_parses_and_is_in_the_help() {
        let help = help();
        for (name, args, _) in COMMANDS {
            assert!(help.contains(name));
            let line = match args {
                "" => name.to_owned(),
                "[PROVIDER/MODEL]" => format!("{name} faux/faux-1"),
                "[LEVEL]" => format!("{name} low"),
                "[POLICY]" => format!("{name} ask"),
                _ => format!("{name} x"),
            };
            assert!(matches!(parse(&line), Line::Command(_)), "{line}");
        }
    }
}
