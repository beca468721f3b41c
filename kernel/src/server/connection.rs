//! One client connection: handshake stage, frame decoder, output accounting
//! and the sessions it is attached to.
//!
//! ```text
//!  AwaitingHello ──hello ok──► Handshaking ──catalog ready──► Ready ──► Closing ──► (removed)
//!        │                          │                          │
//!        └── bad first frame, bad version or token, decode error, deadline ─► hello_error + Closing
//! ```
//!
//! `Handshaking` lasts while the server cannot yet build its snapshot (its
//! session catalog is still loading); requests arriving then are deferred, in
//! order, and run as soon as the server hello is sent. The handshake deadline
//! runs from accept until the server hello is sent.

use crate::ids::ConnId;
use crate::ids::PeerAddr;
use crate::protocol::Request;
use crate::wire::FrameDecoder;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Stage of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Accepted; the first frame must be `hello`.
    AwaitingHello,
    /// A valid hello arrived; the server hello is not sent yet.
    Handshaking,
    /// Handshake complete; requests are served.
    Ready,
    /// The kernel asked the driver to close it; waiting for the driver to report it gone.
    Closing,
}

#[derive(Debug, Clone)]
pub(crate) struct Connection {
    pub(crate) id: ConnId,
    pub(crate) stage: Stage,
    pub(crate) decoder: FrameDecoder,
    /// Requests received while handshaking, served in order once ready.
    pub(crate) deferred: VecDeque<Request>,
    /// Bytes handed to the driver and not yet reported written.
    pub(crate) queued_bytes: usize,
    /// Requests whose response is still owed.
    pub(crate) in_flight: usize,
    /// Sessions this connection is attached to.
    pub(crate) attached: BTreeSet<String>,
    /// Highest session snapshot revision sent to this connection, per session,
    /// so that the snapshots it sees strictly increase.
    pub(crate) revisions: BTreeMap<String, u64>,
    /// The remote peer's address; `None` for a local client.
    pub(crate) peer: Option<PeerAddr>,
    /// A credential its transport carried ([`super::Input::Presented`]).
    pub(crate) presented: Option<super::Secret>,
    /// Set once a hello chose protocol v8: its route, requests and subscriptions.
    pub(crate) v8: Option<Box<super::v8::V8Conn>>,
}

impl Connection {
    pub(crate) fn new(id: ConnId, max_frame_len: u32, peer: Option<PeerAddr>) -> Self {
        Self {
            id,
            stage: Stage::AwaitingHello,
            decoder: FrameDecoder::new(max_frame_len),
            deferred: VecDeque::new(),
            queued_bytes: 0,
            in_flight: 0,
            attached: BTreeSet::new(),
            revisions: BTreeMap::new(),
            peer,
            presented: None,
            v8: None,
        }
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.stage == Stage::Ready
    }

    /// True when a snapshot of `session` at `revision` is news to this connection.
    pub(crate) fn is_news(&self, session: &str, revision: u64) -> bool {
        self.revisions
            .get(session)
            .is_none_or(|last| *last < revision)
    }

    /// True when a snapshot of `session` at `revision` is news to this connection;
    /// records it as sent.
    pub(crate) fn take_revision(&mut self, session: &str, revision: u64) -> bool {
        match self.revisions.get_mut(session) {
            Some(last) if *last >= revision => false,
            Some(last) => {
                *last = revision;
                true
            }
            None => {
                self.revisions.insert(session.to_string(), revision);
                true
            }
        }
    }
}

/// Why a token (from a file of permission bits `mode`) may not guard a
/// network listener, with the fix: a file others may read, or a token of
/// less than 128 bits of entropy as its length and its characters' classes
/// allow (an upper bound: 6 letters are 28 bits, 32 hex digits 165).
pub fn network_token_problem(token: &str, mode: u32) -> Option<String> {
    const FIX: &str = "make one with `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`";
    if mode & 0o077 != 0 {
        return Some(format!(
            "the token file may be read by other users (mode {:o}): `chmod 600` it, or {FIX}",
            mode & 0o777
        ));
    }
    let classes = [
        (token.bytes().any(|b| b.is_ascii_digit()), 10.0),
        (token.bytes().any(|b| b.is_ascii_lowercase()), 26.0),
        (token.bytes().any(|b| b.is_ascii_uppercase()), 26.0),
        (token.bytes().any(|b| !b.is_ascii_alphanumeric()), 32.0),
    ];
    let alphabet: f64 = classes
        .iter()
        .filter(|(used, _)| *used)
        .map(|(_, n)| n)
        .sum();
    let bits = token.chars().count() as f64 * alphabet.max(1.0).log2();
    (bits < 128.0).then(|| {
        format!("the token holds about {bits:.0} bits of entropy, under the 128 a network listener needs: {FIX}")
    })
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    let n = a.len().max(b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= u64::from(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_network_token_is_private_and_strong() {
        use super::network_token_problem as problem;
        let hex = "0123456789abcdef0123456789abcdef";
        let base64 = "q83vQ1Zk4rP0aXb2mN7sTw==";
        assert_eq!(problem(hex, 0o600), None);
        assert_eq!(problem(base64, 0o400), None);
        assert!(problem(hex, 0o644).unwrap().contains("chmod 600"));
        assert!(
            problem("secret", 0o600)
                .unwrap()
                .contains("bits of entropy")
        );
        assert!(problem(&hex[..16], 0o600).is_some(), "16 hex digits");
    }

    use super::*;

    #[test]
    fn constant_time_eq_compares_content_and_length() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn revisions_strictly_increase_per_session() {
        let mut c = Connection::new(ConnId(1), 16, None);
        assert!(c.take_revision("s", 3));
        assert!(!c.take_revision("s", 3));
        assert!(!c.take_revision("s", 2));
        assert!(c.take_revision("s", 4));
        assert!(c.take_revision("t", 1));
    }
}
