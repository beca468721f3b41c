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
