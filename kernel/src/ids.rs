//! Small typed ids the drivers and the kernel use for connections, workers and operations.

use std::fmt;

macro_rules! small_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

small_id!(
    /// A client connection, allocated by the driver (unique for the server's lifetime).
    ConnId,
    "c"
);
small_id!(
    /// A worker process incarnation, allocated by the kernel.
    WorkerId,
    "w"
);
small_id!(
    /// One control operation forwarded to a worker, allocated by the kernel.
    OpId,
    "op"
);
small_id!(
    /// A worker channel the driver accepted and has not yet bound to a worker
    /// (a worker announcing itself for adoption), allocated by the driver.
    ChannelId,
    "ch"
);

/// A remote client's address, as the driver wrote it: an IP address in its
/// canonical text form (`192.0.2.7`, `2001:db8::1`). The kernel only
/// compares, orders and shows it: failed tokens back off by it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerAddr(pub String);

impl PeerAddr {
    /// `text` if it reads as an IP address (digits, hex letters, `.` and
    /// `:` only, at most 45 characters), as a header's value must to be
    /// believed.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let plausible = !text.is_empty()
            && text.len() <= 45
            && text.contains(['.', ':'])
            && text
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == '.' || c == ':');
        plausible.then(|| Self(text.to_ascii_lowercase()))
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
