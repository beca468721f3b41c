//! A service call (`request.call` of pi protocol v8), the `$chord.service`
//! control calls, and chord's error vocabulary.

use crate::wire::Value;

/// The control service every endpoint answers.
pub const CONTROL_SERVICE: &str = "$chord.service";

/// How a service is addressed: one provider, or instances by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One instance, no `instance` in calls.
    Singleton,
    /// Instances by key and generation.
    Keyed,
}

impl Mode {
    /// The wire literal.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Singleton => "singleton",
            Self::Keyed => "keyed",
        }
    }

    fn parse(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) if s == "singleton" => Some(Self::Singleton),
            Value::Text(s) if s == "keyed" => Some(Self::Keyed),
            _ => None,
        }
    }
}

/// A keyed instance's address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instance {
    /// Non-empty key.
    pub key: String,
    /// Generation, from 1.
    pub generation: u64,
}

/// `{serviceId, instance?, member, args}`, strictly.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceCall {
    /// The service addressed.
    pub service_id: String,
    /// A keyed instance, for keyed services only.
    pub instance: Option<Instance>,
    /// The member called.
    pub member: String,
    /// Positional arguments (JSON values).
    pub args: Vec<Value>,
}

impl ServiceCall {
    /// Parses `call` as chord's `parseServiceCall` does: exactly these keys,
    /// non-empty ids, an array of JSON arguments, a well-formed instance.
    pub fn parse(call: &Value) -> Option<Self> {
        let Value::Map(entries) = call else {
            return None;
        };
        let (mut service_id, mut member, mut args, mut instance) = (None, None, None, None);
        for (key, value) in entries {
            let slot_taken = match key.as_str() {
                "serviceId" => service_id.replace(non_empty(value)?).is_some(),
                "member" => member.replace(non_empty(value)?).is_some(),
                "args" => match value {
                    Value::Array(items) if value.is_json() => args.replace(items.clone()).is_some(),
                    _ => return None,
                },
                "instance" => instance.replace(parse_instance(value)?).is_some(),
                _ => return None,
            };
            if slot_taken {
                return None;
            }
        }
        Some(Self {
            service_id: service_id?,
            instance,
            member: member?,
            args: args?,
        })
    }

    /// A call without an instance.
    pub fn singleton(service_id: &str, member: &str, args: Vec<Value>) -> Self {
        Self {
            service_id: service_id.into(),
            instance: None,
            member: member.into(),
            args,
        }
    }

    /// The call as its wire value (keys in the published client's order).
    pub fn to_value(&self) -> Value {
        let mut entries = vec![("serviceId".to_string(), Value::text(&self.service_id))];
        if let Some(i) = &self.instance {
            entries.push((
                "instance".into(),
                Value::Map(vec![
                    ("key".into(), Value::text(&i.key)),
                    ("generation".into(), Value::Int(i.generation as i64)),
                ]),
            ));
        }
        entries.push(("member".into(), Value::text(&self.member)));
        entries.push(("args".into(), Value::Array(self.args.clone())));
        Value::Map(entries)
    }
}

fn non_empty(v: &Value) -> Option<String> {
    match v {
        Value::Text(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn parse_instance(v: &Value) -> Option<Instance> {
    let Value::Map(entries) = v else {
        return None;
    };
    if entries.len() != 2 {
        return None;
    }
    let key = non_empty(v.get("key")?)?;
    let generation = match v.get("generation")? {
        Value::Int(g) if *g >= 1 => *g as u64,
        _ => return None,
    };
    Some(Instance { key, generation })
}

/// A call to `$chord.service`, matched only in its exact shapes; any other
/// call to it is an ordinary call (and finds no such service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// `catalogue []`.
    Catalogue,
    /// `subscribe [subscriptionId, serviceId, mode]`.
    Subscribe {
        /// Chosen by the client, unique among its active subscriptions.
        subscription_id: String,
        /// The service subscribed to.
        service_id: String,
        /// The mode the client expects.
        mode: Mode,
    },
    /// `unsubscribe [subscriptionId]`.
    Unsubscribe {
        /// An active subscription of this client.
        subscription_id: String,
    },
}

impl Control {
    /// The control call `call` is, if any.
    pub fn of(call: &ServiceCall) -> Option<Self> {
        if call.service_id != CONTROL_SERVICE || call.instance.is_some() {
            return None;
        }
        match (call.member.as_str(), call.args.as_slice()) {
            ("catalogue", []) => Some(Self::Catalogue),
            ("subscribe", [sub, service, mode]) => Some(Self::Subscribe {
                subscription_id: non_empty(sub)?,
                service_id: non_empty(service)?,
                mode: Mode::parse(mode)?,
            }),
            ("unsubscribe", [sub]) => Some(Self::Unsubscribe {
                subscription_id: non_empty(sub)?,
            }),
            _ => None,
        }
    }
}

/// An error a v8 request is answered with: `{code, message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The wire code.
    pub code: String,
    /// What a person reads.
    pub message: String,
}

impl CallError {
    /// Any code and message.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }

    /// `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_request", message)
    }

    /// `internal_error`, the mask of every failure that has no code of its own.
    pub fn internal() -> Self {
        Self::new("internal_error", "Internal server error")
    }

    /// An unknown service id.
    pub fn not_allowed(service: &str) -> Self {
        Self::new(
            "service_not_allowed",
            format!("Remote service {service} is not allowlisted"),
        )
    }

    /// A known singleton with no provider now.
    pub fn no_provider(service: &str) -> Self {
        Self::new(
            "service_not_found",
            format!("Remote service {service} has no provider"),
        )
    }

    /// A call or subscription in the other mode.
    pub fn mode_mismatch(service: &str, actual: Mode, asked: Mode) -> Self {
        Self::new(
            "service_mode_mismatch",
            format!(
                "Remote service {service} is {}, not {}",
                actual.as_str(),
                asked.as_str()
            ),
        )
    }

    /// An unknown member.
    pub fn member_not_found(service: &str, member: &str) -> Self {
        Self::new(
            "service_member_not_found",
            format!("Unknown remote service member {service}.{member}"),
        )
    }

    /// A call to a state member.
    pub fn member_mismatch(service: &str, member: &str) -> Self {
        Self::new(
            "service_member_mismatch",
            format!("Remote service member {service}.{member} is not a method"),
        )
    }

    /// Arguments of the wrong shape.
    pub fn invalid_value(service: &str, member: &str, what: &str) -> Self {
        Self::new(
            "service_invalid_value",
            format!("Invalid arguments to {service}.{member}: {what}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, Value)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn calls_parse_strictly() {
        let good = map(&[
            ("serviceId", Value::text("pi.models")),
            ("member", Value::text("select")),
            ("args", Value::Array(vec![Value::Null])),
        ]);
        let call = ServiceCall::parse(&good).unwrap();
        assert_eq!(call.to_value(), good);
        let keyed = map(&[
            ("serviceId", Value::text("k")),
            (
                "instance",
                map(&[("key", Value::text("p")), ("generation", Value::Int(2))]),
            ),
            ("member", Value::text("m")),
            ("args", Value::Array(vec![])),
        ]);
        assert_eq!(ServiceCall::parse(&keyed).unwrap().to_value(), keyed);
        let bad = [
            map(&[
                ("serviceId", Value::text("s")),
                ("member", Value::text("m")),
            ]),
            map(&[
                ("serviceId", Value::text("")),
                ("member", Value::text("m")),
                ("args", Value::Array(vec![])),
            ]),
            map(&[
                ("serviceId", Value::text("s")),
                ("member", Value::text("m")),
                ("args", Value::Array(vec![])),
                ("extra", Value::Null),
            ]),
            map(&[
                ("serviceId", Value::text("s")),
                ("member", Value::text("m")),
                ("args", Value::Null),
            ]),
            map(&[
                ("serviceId", Value::text("s")),
                ("member", Value::text("m")),
                ("args", Value::Array(vec![Value::Bytes(vec![1])])),
            ]),
            map(&[
                ("serviceId", Value::text("s")),
                (
                    "instance",
                    map(&[("key", Value::text("p")), ("generation", Value::Int(0))]),
                ),
                ("member", Value::text("m")),
                ("args", Value::Array(vec![])),
            ]),
            Value::Array(vec![]),
        ];
        for call in bad {
            assert_eq!(ServiceCall::parse(&call), None, "{call:?}");
        }
    }

    #[test]
    fn control_calls_match_only_their_shapes() {
        let call = |member: &str, args: Vec<Value>| {
            Control::of(&ServiceCall::singleton(CONTROL_SERVICE, member, args))
        };
        assert_eq!(call("catalogue", vec![]), Some(Control::Catalogue));
        assert_eq!(
            call(
                "subscribe",
                vec![
                    Value::text("service-1"),
                    Value::text("x"),
                    Value::text("keyed")
                ]
            ),
            Some(Control::Subscribe {
                subscription_id: "service-1".into(),
                service_id: "x".into(),
                mode: Mode::Keyed
            })
        );
        assert_eq!(call("catalogue", vec![Value::Null]), None);
        assert_eq!(
            call(
                "subscribe",
                vec![Value::text("s"), Value::text("x"), Value::text("many")]
            ),
            None
        );
        assert_eq!(call("unsubscribe", vec![Value::text("")]), None);
    }
}
