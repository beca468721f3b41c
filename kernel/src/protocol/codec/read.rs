//! A direct reader of the common client requests: `list`, `status`,
//! `attach`, `detach`, `abort`, `remove`, `prompt` and `steer`, read straight
//! from CBOR bytes into a [`ClientMessage`], without the
//! [`crate::wire::Value`] tree of [`super::decode_payload`].
//!
//! It accepts a subset of what the tree path accepts and yields the same
//! message. Anything else — another message or command, an unknown,
//! missing or repeated key, a value of another type, an empty id, a head
//! this reader does not take, input near a [`CborLimits`] bound, trailing
//! bytes — is `None`, and the tree path gives the verdict, errors included.
//! So the strict schema check stays where it was; this only skips building
//! and walking a tree for the requests every client sends.
//!
//! [`super::decode_client_message`] compares each answer with the tree path
//! in debug builds (every test), and `kernel/tests/protocol.rs` does on
//! arbitrary and on corrupted messages.

use crate::protocol::types::{ClientMessage, Command, Request};
use crate::wire::CborLimits;

/// Major types of the heads this reader takes.
const TEXT: u8 = 3;
const MAP: u8 = 5;

/// `payload` as one of the common requests, or `None` when the tree path
/// must decide.
pub fn client_request(payload: &[u8], limits: &CborLimits) -> Option<ClientMessage> {
    // Every length inside is bounded by the payload's; a request nests one map.
    if payload.len() > limits.max_byte_len || limits.max_depth < 1 {
        return None;
    }
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let entries = r.map(limits)?;
    let (mut kind, mut id, mut command) = (None, None, None);
    for _ in 0..entries {
        match r.text()? {
            "type" if kind.is_none() => kind = Some(r.text()?),
            "id" if id.is_none() => id = Some(r.text()?),
            "request" if command.is_none() => command = Some(read_command(&mut r, limits)?),
            _ => return None,
        }
    }
    if kind? != "request" || r.at != payload.len() {
        return None;
    }
    let id = id.filter(|id| !id.is_empty())?;
    Some(ClientMessage::Request(Request {
        id: id.to_owned(),
        command: command?,
    }))
}

/// The `request` map.
fn read_command(r: &mut Reader<'_>, limits: &CborLimits) -> Option<Command> {
    let entries = r.map(limits)?;
    let (mut name, mut session, mut text) = (None, None, None);
    for _ in 0..entries {
        match r.text()? {
            "command" if name.is_none() => name = Some(r.text()?),
            "sessionId" if session.is_none() => session = Some(r.text()?),
            "text" if text.is_none() => text = Some(r.text()?),
            _ => return None,
        }
    }
    let session_id = || session.filter(|id| !id.is_empty()).map(str::to_owned);
    let command = match (name?, text) {
        ("list", None) if session.is_none() => Command::List,
        ("status", None) if session.is_none() => Command::Status,
        ("attach", None) => Command::Attach {
            session_id: session_id()?,
        },
        ("detach", None) => Command::Detach {
            session_id: session_id()?,
        },
        ("abort", None) => Command::Abort {
            session_id: session_id()?,
        },
        ("remove", None) => Command::Remove {
            session_id: session_id()?,
        },
        ("prompt", Some(text)) => Command::Prompt {
            session_id: session_id()?,
            text: text.to_owned(),
        },
        ("steer", Some(text)) => Command::Steer {
            session_id: session_id()?,
            text: text.to_owned(),
        },
        _ => return None,
    };
    Some(command)
}

/// The parts of a v8 `request` envelope, borrowed from its bytes.
pub struct V8Request<'a> {
    /// The request's id.
    pub id: &'a str,
    /// `target.serverId`.
    pub server_id: &'a str,
    /// `target.sessionId` and `target.attachmentId`, for a session target.
    pub session: Option<(&'a str, &'a str)>,
    /// The call, decoded on its own.
    pub call: crate::wire::Value,
}

/// `payload` as a v8 `{type:"request", id, target, call}` whose `call` comes
/// last (as every client encodes it), or `None` when the tree path must
/// decide. The call is decoded alone, one level of depth below the limit,
/// as it would be inside the envelope.
pub fn v8_request<'a>(payload: &'a [u8], limits: &CborLimits) -> Option<V8Request<'a>> {
    if payload.len() > limits.max_byte_len || limits.max_depth < 2 {
        return None;
    }
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    if r.map_of(4, limits)? != 4 {
        return None;
    }
    let (mut kind, mut id, mut target) = (None, None, None);
    for _ in 0..3 {
        match r.text()? {
            "type" if kind.is_none() => kind = Some(r.text()?),
            "id" if id.is_none() => id = Some(r.text()?),
            "target" if target.is_none() => {
                let entries = r.map_of(3, limits)?;
                let (mut server, mut session, mut attachment) = (None, None, None);
                for _ in 0..entries {
                    match r.text()? {
                        "serverId" if server.is_none() => server = Some(r.text()?),
                        "sessionId" if session.is_none() => session = Some(r.text()?),
                        "attachmentId" if attachment.is_none() => attachment = Some(r.text()?),
                        _ => return None,
                    }
                }
                let session = match (entries, session, attachment) {
                    (1, None, None) => None,
                    (3, Some(s), Some(a)) => Some((s, a)),
                    _ => return None,
                };
                target = Some((server?, session));
            }
            _ => return None,
        }
    }
    if kind? != "request" || r.text()? != "call" {
        return None;
    }
    let inner = CborLimits {
        max_depth: limits.max_depth - 1,
        ..*limits
    };
    let call = crate::wire::cbor::decode(&payload[r.at..], &inner).ok()?;
    let (server_id, session) = target?;
    Some(V8Request {
        id: id?,
        server_id,
        session,
        call,
    })
}

/// A cursor over the payload.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// The next head: its major type and argument. Indefinite lengths and
    /// reserved additional information are not taken.
    fn head(&mut self) -> Option<(u8, u64)> {
        let first = *self.bytes.get(self.at)?;
        self.at += 1;
        let argument = match first & 0x1f {
            info @ 0..=23 => u64::from(info),
            24 => u64::from(self.take(1)?[0]),
            25 => u64::from(u16::from_be_bytes(self.take(2)?.try_into().ok()?)),
            26 => u64::from(u32::from_be_bytes(self.take(4)?.try_into().ok()?)),
            27 => u64::from_be_bytes(self.take(8)?.try_into().ok()?),
            _ => return None,
        };
        Some((first >> 5, argument))
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(len)?;
        let bytes = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(bytes)
    }

    /// A text string.
    fn text(&mut self) -> Option<&'a str> {
        match self.head()? {
            (TEXT, len) => std::str::from_utf8(self.take(usize::try_from(len).ok()?)?).ok(),
            _ => None,
        }
    }

    /// A map header of at most three entries (the most a request map has).
    fn map(&mut self, limits: &CborLimits) -> Option<usize> {
        self.map_of(3, limits)
    }

    /// A map header of at most `most` entries.
    fn map_of(&mut self, most: u64, limits: &CborLimits) -> Option<usize> {
        match self.head()? {
            (MAP, entries) if entries <= most && entries as usize <= limits.max_container_len => {
                Some(entries as usize)
            }
            _ => None,
        }
    }
}
