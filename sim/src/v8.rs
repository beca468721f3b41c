//! The v8 vocabulary the simulator's clients, traces and checkers share:
//! the services' ids, what a client asked, and (from the kernel's client
//! side, `kernel::client::v8`) a route and the server's messages parsed
//! strictly. The clients themselves are [`crate::world::v8`].

use kernel::chord::call::ServiceCall;
use kernel::protocol::v8::Target;
use kernel::wire::Value;

/// The control service's id.
pub const CONTROL: &str = "$chord.service";
/// Server-scope services.
pub const DIRECTORY: &str = "pi.session-directory";
/// `create`, `attach`, `detach`, `remove`.
pub const MANAGEMENT: &str = "pi.session-management";
/// `prepareSession`, `reload`.
pub const PRESENTATION: &str = "pi.presentation-plugins";
/// `prompt`, `steer`, `abort`, `waitForPrompt`, …
pub const AGENT: &str = "pi.agent-controller";
/// `select`, `selectThinking`, and the models state.
pub const MODELS: &str = "pi.models";
/// The conversation as replicated state.
pub const TRANSCRIPT: &str = "pi.transcript";

/// A session id that never exists (traced as `unknown`).
pub const UNKNOWN_SESSION: &str = "00000000-0000-4000-8000-00000000dead";

/// The attachment id a client addresses its session calls with when it
/// knows no route (they are fenced: `session_not_attached`).
pub const UNKNOWN_ATTACHMENT: &str = "00000000-0000-4000-8000-0000000000aa";

pub use kernel::client::v8::{Incoming as V8Message, Route, UPDATE_TYPES, VERBS, keys};

/// A request as the client remembers it until its answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Asked {
    /// `$chord.service.subscribe`: the subscription, its service, and the
    /// route it was made under (session scope).
    Subscribe {
        /// The subscription id.
        subscription_id: String,
        /// The service.
        service: String,
        /// The route of a session-scope subscription.
        route: Option<Route>,
    },
    /// `$chord.service.unsubscribe`.
    Unsubscribe(String),
    /// `pi.session-management.attach`.
    Attach(String),
    /// `pi.session-management.detach`.
    Detach,
    /// `pi.session-management.remove`.
    Remove(String),
    /// `pi.session-management.create`.
    Create,
    /// `pi.agent-controller.prompt`.
    Prompt,
    /// `pi.agent-controller.waitForPrompt`.
    Wait,
    /// Anything else.
    Other,
}

impl Asked {
    /// What `call` (to `target`) asks.
    pub fn of(target: &Target, call: &ServiceCall) -> Self {
        let arg = |i: usize| match call.args.get(i) {
            Some(Value::Text(s)) => s.clone(),
            _ => String::new(),
        };
        match (call.service_id.as_str(), call.member.as_str()) {
            (CONTROL, "subscribe") => Self::Subscribe {
                subscription_id: arg(0),
                service: arg(1),
                route: route_of(target),
            },
            (CONTROL, "unsubscribe") => Self::Unsubscribe(arg(0)),
            (MANAGEMENT, "attach") if matches!(target, Target::Server { .. }) => {
                Self::Attach(arg(0))
            }
            (MANAGEMENT, "detach") if matches!(target, Target::Server { .. }) => Self::Detach,
            (MANAGEMENT, "remove") if matches!(target, Target::Server { .. }) => {
                Self::Remove(arg(0))
            }
            (MANAGEMENT, "create") if matches!(target, Target::Server { .. }) => Self::Create,
            (AGENT, "prompt") => Self::Prompt,
            (AGENT, "waitForPrompt") => Self::Wait,
            _ => Self::Other,
        }
    }

    /// True for a request that may change the connection's route.
    pub fn routes(&self) -> bool {
        matches!(self, Self::Attach(_) | Self::Detach | Self::Remove(_))
    }

    /// True for `pi.session-management`'s calls, which pi's server runs
    /// one at a time, in order (pi-v8.md §3.2).
    pub fn serialised(&self) -> bool {
        self.routes() || *self == Self::Create
    }
}

/// The route a target names, if it is a session target.
pub fn route_of(target: &Target) -> Option<Route> {
    match target {
        Target::Server { .. } => None,
        Target::Session {
            session_id,
            attachment_id,
            ..
        } => Some(Route {
            session_id: session_id.clone(),
            attachment_id: attachment_id.clone(),
        }),
    }
}
