//! What a front's request ([`front::Request`]) is over v8, and what its
//! answer means for the front: the same decisions the v1 path makes, so
//! the front machine cannot tell the protocols apart.
//!
//! - A prompt is `pi.agent-controller.prompt`, answered as soon as it is
//!   admitted; its turn's end is `waitForPrompt` on the operation it was
//!   given ([`Outcome::Wait`]), as a v1 prompt's answer comes at its end.
//! - An in-band refusal (`{accepted: false, error}`) is the server's
//!   refusal, `busy` included, as v1 says it.
//! - An abort's withdrawn steers are not told over v8: none come back.

use super::connection::{AGENT, APPROVALS, MODELS, Request, SESSIONS};
use crate::chord::call::ServiceCall;
use crate::client::ClientError;
use crate::client::front::{self, Answer};
use crate::protocol::{ErrorCode, ProtocolError, SessionPhase};
use crate::wire::Value;

/// What a call's answer means.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The front's answer.
    Answer(Result<Answer, ClientError>),
    /// A prompt was admitted: its turn's end is this call's answer.
    Wait(Request),
}

/// The v8 call that carries out `request` on session `session_id`.
pub fn request_of(session_id: &str, request: &front::Request) -> Request {
    use front::Request as R;
    let agent = |member: &str, args: Vec<Value>| {
        Request::Session(ServiceCall::singleton(AGENT, member, args))
    };
    let input = |text: &str| {
        Value::object(vec![
            ("message", Value::text(text)),
            ("images", Value::Null),
        ])
    };
    match request {
        R::Prompt(text) => agent("prompt", vec![input(text)]),
        R::Steer(text) => agent("steer", vec![input(text)]),
        R::Abort => agent("abort", vec![]),
        R::Compact(instructions) => agent(
            "compact",
            vec![Value::object(vec![(
                "customInstructions",
                instructions.as_deref().map_or(Value::Null, Value::text),
            )])],
        ),
        R::SetModel(model) => Request::Session(ServiceCall::singleton(
            MODELS,
            "select",
            vec![Value::object(vec![
                ("provider", Value::text(&model.provider)),
                ("modelId", Value::text(&model.id)),
            ])],
        )),
        R::SetThinking(level) => Request::Session(ServiceCall::singleton(
            MODELS,
            "selectThinking",
            vec![Value::text(level.as_str())],
        )),
        R::Rename(name) => Request::Server(ServiceCall::singleton(
            SESSIONS,
            "rename",
            vec![Value::text(session_id), Value::text(name)],
        )),
        R::Answer { id, decision } => Request::Session(ServiceCall::singleton(
            APPROVALS,
            "answer",
            vec![Value::object(vec![
                ("id", Value::text(id)),
                ("decision", Value::text(decision.as_str())),
            ])],
        )),
        R::SetApprovals(policy) => Request::Session(ServiceCall::singleton(
            APPROVALS,
            "setPolicy",
            vec![Value::object(vec![(
                "policy",
                Value::text(policy.as_str()),
            )])],
        )),
    }
}

/// `request` (a prompt's) with `images` (image parts) beside its text.
pub fn with_images(request: Request, images: &[crate::protocol::Content]) -> Request {
    use crate::protocol::Content;
    let parts: Vec<Value> = images
        .iter()
        .filter_map(|c| match c {
            Content::Image { data, mime_type } => Some(Value::object(vec![
                ("type", Value::text("image")),
                ("data", Value::text(data)),
                ("mimeType", Value::text(mime_type)),
            ])),
            _ => None,
        })
        .collect();
    match request {
        Request::Session(mut call) if call.member == "prompt" && !parts.is_empty() => {
            if let Some(Value::Map(entries)) = call.args.first_mut() {
                for (key, value) in entries.iter_mut() {
                    if key == "images" {
                        *value = Value::Array(parts.clone());
                    }
                }
            }
            Request::Session(call)
        }
        other => other,
    }
}

/// What the answer to [`request_of`]'s call means for the front.
pub fn outcome_of(request: &front::Request, result: Result<Option<Value>, ClientError>) -> Outcome {
    use front::Request as R;
    let value = match result {
        Ok(value) => value,
        Err(e) => return Outcome::Answer(Err(e)),
    };
    let admitted = |key: &str| match value.as_ref() {
        Some(v) if v.get("accepted") == Some(&Value::Bool(true)) => match v.get(key) {
            Some(Value::Text(id)) => Ok(id.clone()),
            _ => Err(ClientError::Protocol(format!("an admission without {key}"))),
        },
        Some(v) => Err(refusal(v.get("error"))),
        None => Err(ClientError::Protocol("an empty admission".into())),
    };
    match request {
        R::Prompt(_) => match admitted("operationId") {
            Ok(op) => Outcome::Wait(Request::Session(ServiceCall::singleton(
                AGENT,
                "waitForPrompt",
                vec![Value::text(op)],
            ))),
            Err(e) => Outcome::Answer(Err(e)),
        },
        R::Steer(_) => Outcome::Answer(admitted("entryId").map(|_| Answer::Steer)),
        R::Compact(_) => Outcome::Answer(admitted("operationId").map(|_| Answer::Applied)),
        R::Abort => Outcome::Answer(Ok(Answer::Abort {
            withdrawn: Vec::new(),
        })),
        R::SetModel(_)
        | R::SetThinking(_)
        | R::Rename(_)
        | R::Answer { .. }
        | R::SetApprovals(_) => Outcome::Answer(Ok(Answer::Applied)),
    }
}

/// A prompt's wait answered: its turn ended (whatever its status: the
/// transcript says how). A wait cut off with the connection is no failure:
/// the prompt was admitted, so its turn runs on, and the replica will say
/// when it ends (the front sees a turn until then).
pub fn prompt_ended(result: Result<Option<Value>, ClientError>) -> Result<Answer, ClientError> {
    match result {
        Ok(_) => Ok(Answer::Prompt {
            phase: SessionPhase::Idle,
        }),
        Err(ClientError::Disconnected(_)) => Ok(Answer::Prompt {
            phase: SessionPhase::Turn,
        }),
        Err(e) => Err(e),
    }
}

/// An in-band `error` as the server's refusal.
fn refusal(error: Option<&Value>) -> ClientError {
    let text = |key: &str| match error.and_then(|e| e.get(key)) {
        Some(Value::Text(s)) => s.clone(),
        _ => String::new(),
    };
    ClientError::Server(ProtocolError::new(
        error_code(&text("code")),
        text("message"),
    ))
}

/// A v8 error code as the protocol's (the text keeps the original).
pub fn error_code(code: &str) -> ErrorCode {
    match code {
        "busy" => ErrorCode::Busy,
        "session_not_found" | "session_not_attached" => ErrorCode::NotFound,
        "service_invalid_value"
        | "invalid_request"
        | "service_member_not_found"
        | "service_not_allowed" => ErrorCode::InvalidRequest,
        other => ErrorCode::parse(other).unwrap_or(ErrorCode::InternalError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ModelRef, ThinkingLevel};

    fn admission(key: &str, id: Option<&str>, error: Option<(&str, &str)>) -> Value {
        Value::object(vec![
            ("accepted", Value::Bool(id.is_some())),
            (key, id.map_or(Value::Null, Value::text)),
            (
                "error",
                error.map_or(Value::Null, |(c, m)| {
                    Value::object(vec![("code", Value::text(c)), ("message", Value::text(m))])
                }),
            ),
        ])
    }

    #[test]
    fn a_prompt_waits_for_its_turn_and_a_busy_refusal_is_v1_s_busy() {
        let prompt = front::Request::Prompt("hi".into());
        let Request::Session(call) = request_of("s", &prompt) else {
            panic!()
        };
        assert_eq!(
            (call.service_id.as_str(), call.member.as_str()),
            (AGENT, "prompt")
        );
        let admitted = admission("operationId", Some("7"), None);
        let Outcome::Wait(Request::Session(wait)) = outcome_of(&prompt, Ok(Some(admitted))) else {
            panic!()
        };
        assert_eq!(wait.member, "waitForPrompt");
        assert_eq!(wait.args, vec![Value::text("7")]);
        let busy = admission("operationId", None, Some(("busy", "a turn runs")));
        match outcome_of(&prompt, Ok(Some(busy))) {
            Outcome::Answer(Err(ClientError::Server(e))) => {
                assert_eq!(
                    (e.code, e.message.as_str()),
                    (ErrorCode::Busy, "a turn runs")
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            prompt_ended(Ok(None)),
            Ok(Answer::Prompt {
                phase: SessionPhase::Idle
            })
        );
        // Admitted, then the wait was cut off: its turn goes on.
        assert_eq!(
            prompt_ended(Err(ClientError::Disconnected("gone".into()))),
            Ok(Answer::Prompt {
                phase: SessionPhase::Turn
            })
        );
    }

    #[test]
    fn settings_go_to_their_services_and_are_applied() {
        let model = front::Request::SetModel(ModelRef {
            provider: "faux".into(),
            id: "faux-2".into(),
        });
        let Request::Session(call) = request_of("s", &model) else {
            panic!()
        };
        assert_eq!(
            (call.service_id.as_str(), call.member.as_str()),
            (MODELS, "select")
        );
        let level = front::Request::SetThinking(ThinkingLevel::High);
        let Request::Session(call) = request_of("s", &level) else {
            panic!()
        };
        assert_eq!(call.args, vec![Value::text("high")]);
        let rename = front::Request::Rename("n".into());
        let Request::Server(call) = request_of("s", &rename) else {
            panic!()
        };
        assert_eq!(call.args, vec![Value::text("s"), Value::text("n")]);
        for request in [model, level, rename] {
            assert_eq!(
                outcome_of(&request, Ok(None)),
                Outcome::Answer(Ok(Answer::Applied))
            );
        }
        let steer = front::Request::Steer("x".into());
        assert_eq!(
            outcome_of(&steer, Ok(Some(admission("entryId", Some("3"), None)))),
            Outcome::Answer(Ok(Answer::Steer))
        );
    }
}
