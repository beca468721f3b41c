//! The front machine: what lines become, the refusal rule, and (by
//! property) that no typed line is lost or taken twice.

use super::*;
use crate::protocol::ProtocolError;
use proptest::prelude::*;

fn busy() -> ClientError {
    ClientError::Server(ProtocolError::new(ErrorCode::Busy, "busy"))
}

fn sends(out: &[Output]) -> Vec<(u64, Request)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send { call, request, .. } => Some((*call, request.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_line_is_a_prompt_when_idle_a_steer_in_a_turn_and_held_in_between() {
    let mut f = Front::new(SessionPhase::Idle, 4);
    let out = f.step(Input::Typed("first".into()));
    assert_eq!(sends(&out), [(1, Request::Prompt("first".into()))]);
    assert_eq!(f.turn_start(), Some(4));
    assert!(f.busy());
    assert!(
        sends(&f.step(Input::Typed("second".into()))).is_empty(),
        "held until the turn shows"
    );
    let out = f.step(Input::Session {
        phase: SessionPhase::Turn,
        transcript_len: 5,
    });
    assert_eq!(sends(&out), [(2, Request::Steer("second".into()))]);
    f.step(Input::Answered {
        call: 2,
        outcome: Ok(Answer::Steer),
    });
    f.step(Input::EndOfInput);
    let out = f.step(Input::Answered {
        call: 1,
        outcome: Ok(Answer::Prompt {
            phase: SessionPhase::Idle,
        }),
    });
    assert_eq!(out, [Output::Finished]);
    assert!(
        f.step(Input::Typed("   ".into())).is_empty(),
        "blank lines are ignored"
    );
}

#[test]
fn a_refused_steer_comes_back_as_a_prompt_and_a_refused_prompt_as_a_steer() {
    let mut f = Front::new(SessionPhase::Turn, 2);
    let out = f.step(Input::Typed("late".into()));
    assert_eq!(sends(&out), [(1, Request::Steer("late".into()))]);
    let out = f.step(Input::Answered {
        call: 1,
        outcome: Err(busy()),
    });
    assert!(
        sends(&out).is_empty(),
        "not steered again while the turn seems to run"
    );
    assert!(out.contains(&Output::Notice(Notice::Retrying {
        text: "late".into()
    })));
    let out = f.step(Input::Session {
        phase: SessionPhase::Idle,
        transcript_len: 4,
    });
    assert_eq!(sends(&out), [(2, Request::Prompt("late".into()))]);
    // Another client's turn started first: the prompt is refused, and the
    // line steers that turn.
    let out = f.step(Input::Answered {
        call: 2,
        outcome: Err(busy()),
    });
    assert_eq!(sends(&out), [(3, Request::Steer("late".into()))]);
    // Refused once more (that turn ended too): handed back, not retried forever.
    let out = f.step(Input::Answered {
        call: 3,
        outcome: Err(busy()),
    });
    assert_eq!(
        out,
        [Output::HandBack {
            text: "late".into(),
            why: Why::Busy,
            tag: 0
        }]
    );
}

#[test]
fn other_refusals_and_lost_calls_hand_the_line_back() {
    let mut f = Front::new(SessionPhase::Idle, 0);
    f.step(Input::Typed("a".into()));
    let refused = ClientError::Server(ProtocolError::new(ErrorCode::InvalidRequest, "no"));
    let out = f.step(Input::Answered {
        call: 1,
        outcome: Err(refused.clone()),
    });
    assert_eq!(
        out,
        [Output::HandBack {
            text: "a".into(),
            why: Why::Refused(refused),
            tag: 0
        }]
    );
    f.step(Input::Typed("b".into()));
    let out = f.step(Input::Answered {
        call: 2,
        outcome: Err(ClientError::Disconnected("gone".into())),
    });
    assert_eq!(
        out,
        [Output::HandBack {
            text: "b".into(),
            why: Why::Lost("gone".into()),
            tag: 0
        }]
    );
}

#[test]
fn while_reconnecting_lines_are_held_and_go_once_it_is_back() {
    let mut f = Front::new(SessionPhase::Idle, 0);
    assert_eq!(
        f.step(Input::Link(Link::Reconnecting)),
        [Output::Notice(Notice::Reconnecting)]
    );
    let out = f.step(Input::Typed("wait".into()));
    assert_eq!(out, [Output::Notice(Notice::Held { lines: 1 })]);
    let out = f.step(Input::Link(Link::Up));
    assert_eq!(out[0], Output::Notice(Notice::Reconnected));
    assert_eq!(sends(&out), [(1, Request::Prompt("wait".into()))]);
}

#[test]
fn an_abort_hands_back_what_was_held_and_what_it_withdrew() {
    let mut f = Front::new(SessionPhase::Idle, 0);
    assert_eq!(
        f.step(Input::Abort),
        [Output::Notice(Notice::NothingToAbort)]
    );
    f.step(Input::Typed("go".into()));
    f.step(Input::Typed("held".into()));
    let out = f.step(Input::Abort);
    assert_eq!(
        out,
        [
            Output::HandBack {
                text: "held".into(),
                why: Why::Aborted,
                tag: 0
            },
            Output::Notice(Notice::Aborting),
            Output::Send {
                call: 2,
                request: Request::Abort,
                tag: 0
            },
        ]
    );
    assert!(f.step(Input::Abort).is_empty(), "one abort at a time");
    let out = f.step(Input::Answered {
        call: 2,
        outcome: Ok(Answer::Abort {
            withdrawn: vec!["steered".into()],
        }),
    });
    assert_eq!(
        out,
        [Output::HandBack {
            text: "steered".into(),
            why: Why::Withdrawn,
            tag: 0
        }]
    );
}

/// What a fake server does next.
#[derive(Debug, Clone)]
enum Event {
    Type,
    Prompt,
    Answer { pick: usize, how: u8 },
    Phase(bool),
    Link(u8),
    Abort,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => Just(Event::Type),
        1 => Just(Event::Prompt),
        4 => (any::<usize>(), 0u8..6).prop_map(|(pick, how)| Event::Answer { pick, how }),
        2 => any::<bool>().prop_map(Event::Phase),
        1 => (0u8..3).prop_map(Event::Link),
        1 => Just(Event::Abort),
    ]
}

#[test]
fn slash_commands_are_settings_local_actions_or_handed_back() {
    let mut f = Front::new(SessionPhase::Idle, 0);
    // An unknown command never goes to the model; `//` escapes.
    let out = f.step(Input::Typed("/frobnicate".into()));
    assert!(
        matches!(&out[..], [Output::HandBack { text, why: Why::Invalid(_), .. }] if text == "/frobnicate"),
        "{out:?}"
    );
    let out = f.step(Input::Typed("//frobnicate".into()));
    assert_eq!(sends(&out), [(1, Request::Prompt("/frobnicate".into()))]);
    f.step(Input::Answered {
        call: 1,
        outcome: Ok(Answer::Prompt {
            phase: SessionPhase::Idle,
        }),
    });

    // A setting goes at once, busy or not, and says when it is applied.
    let out = f.step(Input::Typed("/thinking high".into()));
    assert_eq!(
        sends(&out),
        [(
            2,
            Request::SetThinking(crate::protocol::ThinkingLevel::High)
        )]
    );
    let out = f.step(Input::Answered {
        call: 2,
        outcome: Ok(Answer::Applied),
    });
    assert_eq!(
        out,
        [Output::Notice(Notice::Applied("/thinking high".into()))]
    );
    // Refused (a turn runs): the line comes back with the reason.
    let out = f.step(Input::Typed("/name fixes".into()));
    assert_eq!(sends(&out), [(3, Request::Rename("fixes".into()))]);
    let out = f.step(Input::Answered {
        call: 3,
        outcome: Err(busy()),
    });
    assert!(
        matches!(&out[..], [Output::HandBack { text, why: Why::Refused(_), .. }] if text == "/name fixes"),
        "{out:?}"
    );

    // The front end's own commands, and /abort as Ctrl-C.
    let out = f.step(Input::Typed("/help".into()));
    assert_eq!(out, [Output::Local(Command::Help)]);
    let out = f.step(Input::Typed("/model".into()));
    assert_eq!(out, [Output::Local(Command::Model(None))]);
    let out = f.step(Input::Typed("/abort".into()));
    assert_eq!(out, [Output::Notice(Notice::NothingToAbort)]);

    // Away: a setting is not held, it comes back.
    f.step(Input::Link(Link::Reconnecting));
    let out = f.step(Input::Typed("/model faux/faux-1".into()));
    assert!(
        matches!(
            &out[..],
            [Output::HandBack {
                why: Why::NotConnected,
                ..
            }]
        ),
        "{out:?}"
    );
    let out = f.step(Input::EndOfInput);
    assert!(out.contains(&Output::Finished), "nothing left: {out:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Whatever the server answers and whatever the connection does, every
    /// typed line is taken by the server at most once, is never both taken
    /// and handed back, and once the server answers everything kindly,
    /// every line was taken or handed back.
    #[test]
    fn no_typed_line_is_lost_or_taken_twice(events in prop::collection::vec(event(), 1..60)) {
        let mut f = Front::new(SessionPhase::Idle, 0);
        let mut typed = 0u32;
        let mut pending: Vec<(u64, Request)> = Vec::new();
        let mut taken: BTreeMap<String, u32> = BTreeMap::new();
        let mut back: BTreeMap<String, u32> = BTreeMap::new();
        let mut closed = false;
        let absorb = |out: Vec<Output>, pending: &mut Vec<(u64, Request)>, back: &mut BTreeMap<String, u32>| {
            for o in out {
                match o {
                    Output::Send { call, request, .. } => pending.push((call, request)),
                    Output::HandBack { text, .. } => *back.entry(text).or_default() += 1,
                    _ => {}
                }
            }
        };
        for event in events {
            let out = match event {
                Event::Type => {
                    typed += 1;
                    f.step(Input::Typed(format!("line {typed}")))
                }
                Event::Prompt => {
                    typed += 1;
                    f.step(Input::Prompt { text: format!("line {typed}"), tag: typed.into() })
                }
                Event::Phase(running) => f.step(Input::Session {
                    phase: if running { SessionPhase::Turn } else { SessionPhase::Idle },
                    transcript_len: typed as usize,
                }),
                Event::Link(0) if !closed => f.step(Input::Link(Link::Reconnecting)),
                Event::Link(1) if !closed => f.step(Input::Link(Link::Up)),
                Event::Link(_) => {
                    closed = true;
                    f.step(Input::Link(Link::Closed))
                }
                Event::Abort => f.step(Input::Abort),
                Event::Answer { pick, how } if !pending.is_empty() => {
                    let (call, request) = pending.remove(pick % pending.len());
                    let outcome = match (how, &request) {
                        (0 | 1, Request::Prompt(t)) => {
                            *taken.entry(t.clone()).or_default() += 1;
                            Ok(Answer::Prompt { phase: SessionPhase::Idle })
                        }
                        (0 | 1, Request::Steer(t)) => {
                            *taken.entry(t.clone()).or_default() += 1;
                            Ok(Answer::Steer)
                        }
                        (0 | 1, Request::Abort) => Ok(Answer::Abort { withdrawn: vec![] }),
                        (2 | 3, _) => Err(busy()),
                        (4, _) => Err(ClientError::Disconnected("lost".into())),
                        _ => Err(ClientError::Server(ProtocolError::new(ErrorCode::InvalidRequest, "no"))),
                    };
                    f.step(Input::Answered { call, outcome })
                }
                Event::Answer { .. } => Vec::new(),
            };
            absorb(out, &mut pending, &mut back);
            prop_assert!(f.invariants().is_ok());
        }
        // The server becomes kind: idle, connected, every call taken.
        if !closed {
            absorb(f.step(Input::Link(Link::Up)), &mut pending, &mut back);
        }
        let mut rounds = 0;
        while !pending.is_empty() || (!closed && f.held() > 0) {
            rounds += 1;
            prop_assert!(rounds < 1000, "does not settle");
            absorb(
                f.step(Input::Session { phase: SessionPhase::Idle, transcript_len: 0 }),
                &mut pending,
                &mut back,
            );
            if let Some((call, request)) = pending.pop() {
                let outcome = match &request {
                    Request::Prompt(t) => {
                        *taken.entry(t.clone()).or_default() += 1;
                        Ok(Answer::Prompt { phase: SessionPhase::Idle })
                    }
                    Request::Steer(t) => {
                        *taken.entry(t.clone()).or_default() += 1;
                        Ok(Answer::Steer)
                    }
                    Request::Abort => Ok(Answer::Abort { withdrawn: vec![] }),
                    Request::SetModel(_)
                    | Request::SetThinking(_)
                    | Request::Rename(_)
                    | Request::Compact(_)
                    | Request::Answer { .. }
                    | Request::SetApprovals(_) => Ok(Answer::Applied),
                };
                absorb(f.step(Input::Answered { call, outcome }), &mut pending, &mut back);
            }
        }
        for n in 1..=typed {
            let line = format!("line {n}");
            let t = taken.get(&line).copied().unwrap_or(0);
            let b = back.get(&line).copied().unwrap_or(0);
            prop_assert!(t <= 1, "{line} taken {t} times");
            prop_assert!(t + b == 1, "{line}: taken {t}, handed back {b}");
        }
    }
}

#[test]
fn a_request_to_start_a_turn_now_is_a_prompt_or_handed_back() {
    let mut f = Front::new(SessionPhase::Turn, 3);
    let out = f.step(Input::Prompt {
        text: "start".into(),
        tag: 7,
    });
    assert_eq!(
        out,
        [Output::HandBack {
            text: "start".into(),
            why: Why::Busy,
            tag: 7
        }]
    );
    f.step(Input::Session {
        phase: SessionPhase::Idle,
        transcript_len: 5,
    });
    let out = f.step(Input::Prompt {
        text: "start".into(),
        tag: 8,
    });
    assert_eq!(
        out,
        [Output::Send {
            call: 1,
            request: Request::Prompt("start".into()),
            tag: 8
        }]
    );
    assert_eq!(f.turn_start(), Some(5));
    // Refused for a turn that began meanwhile: handed back, not retried.
    let out = f.step(Input::Answered {
        call: 1,
        outcome: Err(busy()),
    });
    assert_eq!(
        out,
        [Output::HandBack {
            text: "start".into(),
            why: Why::Refused(busy()),
            tag: 8
        }]
    );
}

/// A question shown is answered by a key or a command, naming the
/// question; with none shown, the keys are typing and an answer is a
/// notice, never a call.
#[test]
fn a_question_is_answered_by_key_or_command_and_only_while_shown() {
    use crate::approval::{ApprovalPolicy, Decision};
    let mut f = Front::new(SessionPhase::Turn, 3);
    assert_eq!(f.key_answer('y'), None, "no question: y is a letter");
    let out = f.step(Input::Decide(Decision::Allow));
    assert_eq!(out, [Output::Notice(Notice::NothingAsked)]);
    f.step(Input::Asked(Some("item-3".into())));
    assert_eq!(f.asked(), Some("item-3"));
    assert_eq!(f.key_answer('a'), Some(Decision::Always));
    assert_eq!(f.key_answer('x'), None);
    let out = f.step(Input::Decide(Decision::Deny));
    let [Output::Send { request, .. }] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!(
        *request,
        Request::Answer {
            id: "item-3".into(),
            decision: Decision::Deny
        }
    );
    let out = f.step(Input::Typed("/always".into()));
    assert!(matches!(
        out.as_slice(),
        [Output::Send {
            request: Request::Answer {
                decision: Decision::Always,
                ..
            },
            ..
        }]
    ));
    let out = f.step(Input::Typed("/approvals read-only".into()));
    assert!(matches!(
        out.as_slice(),
        [Output::Send {
            request: Request::SetApprovals(ApprovalPolicy::ReadOnly),
            ..
        }]
    ));
    f.step(Input::Asked(None));
    assert_eq!(f.key_answer('y'), None);
}
