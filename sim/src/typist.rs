//! Typed lines through the real front-end machine, judged from outside.
//!
//! A [`Typist`] is a front end on one leased session of a client machine
//! ([`crate::machines`]): it types lines (and now and then asks for an
//! abort) into a real `kernel::client::front::Front`, carries out the
//! requests the machine decides through the machine's real `Client`, and
//! reports the answers, the session's phase and the connection back to it,
//! as the terminal UI, the CLI's line mode and the ACP adapter do.
//!
//! [`Lines`] keeps what became of every typed line (each text is unique)
//! and judges it against the store once the run settles (DESIGN.md,
//! `Front`: no typed line is lost, none is taken twice):
//!
//! - no line is in the session's transcript twice;
//! - a line handed back because it never ran (refused, busy, aborted,
//!   withdrawn, closed) is not in it at all; one handed back as lost with
//!   the connection may be, once;
//! - a prompt the server answered is in it once; an answered steer at most
//!   once (another client's abort may withdraw it);
//! - no line is left neither sent nor handed back on a front that is
//!   connected and settled.

use crate::world::World;
use kernel::client::ClientError;
use kernel::client::LeaseId;
use kernel::client::follow::text_of;
use kernel::client::front::{Answer, Front, Input, Output, Request, Why};
use kernel::protocol::{SessionPhase, SessionSnapshot, TranscriptItem};
use std::collections::BTreeMap;

/// A front end typing into one leased session.
#[derive(Debug)]
pub struct Typist {
    /// The lease it types through.
    pub lease: LeaseId,
    /// The machine under test.
    pub front: Front,
    /// The session as last reported to it: revision, phase, length.
    reported: Option<(u64, SessionPhase, usize)>,
}

impl Typist {
    /// A front end on `lease`, the session as `snapshot` shows it.
    pub fn new(lease: LeaseId, snapshot: Option<&SessionSnapshot>) -> Self {
        let (phase, len) =
            snapshot.map_or((SessionPhase::Idle, 0), |s| (s.phase, s.transcript.len()));
        Self {
            lease,
            front: Front::new(phase, len),
            reported: snapshot.map(|s| (s.revision, phase, len)),
        }
    }

    /// The session's latest word, if it is news to the front.
    pub fn session_news(&mut self, snapshot: Option<&SessionSnapshot>) -> Option<Input> {
        let s = snapshot?;
        let now = (s.revision, s.phase, s.transcript.len());
        if self.reported == Some(now) {
            return None;
        }
        self.reported = Some(now);
        Some(Input::Session {
            phase: s.phase,
            transcript_len: s.transcript.len(),
        })
    }
}

/// The front's answer to a machine call's completion.
pub fn answer(
    request: &Request,
    result: Result<Option<&SessionSnapshot>, ClientError>,
) -> Result<Answer, ClientError> {
    let snapshot = result?;
    Ok(match request {
        Request::Prompt(_) => Answer::Prompt {
            phase: snapshot.map_or(SessionPhase::Idle, |s| s.phase),
        },
        Request::Steer(_) => Answer::Steer,
        Request::Abort => Answer::Abort {
            withdrawn: snapshot
                .map(|s| s.queued_steer.iter().map(|u| text_of(&u.content)).collect())
                .unwrap_or_default(),
        },
        Request::SetModel(_)
        | Request::SetThinking(_)
        | Request::Rename(_)
        | Request::Compact(_)
        | Request::Answer { .. }
        | Request::SetApprovals(_) => Answer::Applied,
    })
}

/// What became of one typed line.
#[derive(Debug, Clone, Default)]
struct Line {
    session_id: String,
    /// Times it went out (again only after a refusal).
    sent: u32,
    /// The server took it: as a prompt, or as a steer.
    taken: Option<Taken>,
    handed_back: Option<Why>,
    /// Its front end went away with it still held or on its way.
    abandoned: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    Prompt,
    Steer,
}

/// Every typed line of a run. See the module documentation.
#[derive(Debug, Default)]
pub struct Lines {
    lines: BTreeMap<String, Line>,
}

impl Lines {
    /// `text` was typed into a front end on `session_id`.
    pub fn typed(&mut self, session_id: &str, text: &str) {
        self.lines.insert(
            text.to_owned(),
            Line {
                session_id: session_id.to_owned(),
                ..Line::default()
            },
        );
    }

    /// Notes what an output of a front says of its lines.
    pub fn output(&mut self, output: &Output) {
        match output {
            Output::Send {
                request: Request::Prompt(text) | Request::Steer(text),
                ..
            } => {
                if let Some(line) = self.lines.get_mut(text) {
                    line.sent += 1;
                }
            }
            Output::HandBack { text, why, .. } => {
                if let Some(line) = self.lines.get_mut(text) {
                    line.handed_back = Some(why.clone());
                }
            }
            _ => {}
        }
    }

    /// The server answered a line's request.
    pub fn answered(&mut self, request: &Request, ok: bool) {
        let (text, taken) = match request {
            Request::Prompt(text) => (text, Taken::Prompt),
            Request::Steer(text) => (text, Taken::Steer),
            _ => return,
        };
        if let Some(line) = self.lines.get_mut(text)
            && ok
        {
            line.taken = Some(taken);
        }
    }

    /// A front end on `session_id` went away: its open lines are abandoned.
    pub fn abandon(&mut self, session_id: &str) {
        for line in self.lines.values_mut() {
            if line.session_id == session_id && line.handed_back.is_none() && line.taken.is_none() {
                line.abandoned = true;
            }
        }
    }

    /// Lines typed.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// True when none was typed.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Judges every line against the store once the run settled; `open`
    /// says whether a line's front end is still there, connected, on a
    /// granted lease (so it should have decided the line by now).
    pub fn check(&self, world: &World, open: impl Fn(&str) -> bool) -> Result<(), String> {
        for (text, line) in &self.lines {
            let Some(stored) = world.store.sessions.get(&line.session_id) else {
                continue; // removed with its transcript
            };
            let count = stored
                .transcript
                .iter()
                .filter(
                    |item| matches!(item, TranscriptItem::User(u) if text_of(&u.content) == *text),
                )
                .count();
            let what = format!("typed line {text:?} in {} ({line:?})", line.session_id);
            if count > 1 {
                return Err(format!("{what}: taken {count} times"));
            }
            match (&line.handed_back, line.taken) {
                (Some(Why::Lost(_)), _) => {}
                (Some(_), _) if count > 0 => {
                    return Err(format!("{what}: handed back, yet in the transcript"));
                }
                (Some(_), _) => {}
                (None, Some(Taken::Prompt)) if count != 1 => {
                    return Err(format!(
                        "{what}: its prompt was answered, yet not in the transcript"
                    ));
                }
                (None, Some(_)) => {}
                (None, None) if line.abandoned => {}
                (None, None) if open(&line.session_id) => {
                    return Err(format!("{what}: neither sent nor handed back once settled"));
                }
                (None, None) => {}
            }
        }
        Ok(())
    }
}
