//! The event model: which audit events are webhook events (and under
//! which type), an endpoint's filter over the types, and the body.

use serde_json::{Map, Value};

/// Every webhook event type, in a fixed order (a filter is a bit set over
/// it).
pub const EVENT_TYPES: [&str; 9] = [
    "session.created",
    "session.closed",
    "process.exited",
    "tenant.activated",
    "tenant.retired",
    "quota.refused",
    "egress.refused",
    "executor.joined",
    "executor.left",
];

/// The webhook type of an audit event (its index in [`EVENT_TYPES`]), or
/// `None` for an audit event no webhook carries. The one table between the
/// two vocabularies: the audit trail keeps its names (`session.opened`,
/// `egress.denied`), the webhooks speak of what happened to a receiver.
pub fn type_of(audit_event: &str) -> Option<usize> {
    let name = match audit_event {
        "session.opened" => "session.created",
        "egress.denied" => "egress.refused",
        "session.closed" | "process.exited" | "tenant.activated" | "tenant.retired"
        | "quota.refused" | "executor.joined" | "executor.left" => audit_event,
        _ => return None,
    };
    EVENT_TYPES.iter().position(|t| *t == name)
}

/// The event types an endpoint receives: a bit per [`EVENT_TYPES`] entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventFilter(pub u16);

impl EventFilter {
    pub const ALL: EventFilter = EventFilter((1 << EVENT_TYPES.len()) - 1);

    /// From patterns: `*`, an exact type, or a prefix glob `family.*`.
    /// A pattern that matches no type is refused (a typo would otherwise
    /// silently receive nothing).
    pub fn parse(patterns: &[String]) -> Result<EventFilter, String> {
        if patterns.is_empty() {
            return Err(format!(
                "an empty event list receives nothing; name types ({}), `family.*` or `*`",
                EVENT_TYPES.join(", ")
            ));
        }
        let mut bits = 0u16;
        for p in patterns {
            let matched = EVENT_TYPES
                .iter()
                .enumerate()
                .filter(|(_, t)| matches(p, t))
                .fold(0u16, |acc, (i, _)| acc | 1 << i);
            if matched == 0 {
                return Err(format!(
                    "event pattern `{p}` matches no event type (types: {})",
                    EVENT_TYPES.join(", ")
                ));
            }
            bits |= matched;
        }
        Ok(EventFilter(bits))
    }

    pub fn has(self, index: usize) -> bool {
        self.0 & (1 << index) != 0
    }
}

/// `*`; `prefix.*` (the prefix and a dot, then anything); or the name.
fn matches(pattern: &str, name: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') => name.starts_with(prefix),
        Some(_) => false,
        None => pattern == name,
    }
}

/// The body: `{"type", "timestamp" (RFC 3339), "data"}`; `data` is the
/// event's fields with who it is about (`tenant`, `subject`, `session`,
/// where known) set last, so no field stands in for them.
pub fn body(
    ty: &str,
    at: std::time::SystemTime,
    who: [(&str, Option<&str>); 3],
    fields: &Value,
) -> String {
    let mut data = match fields {
        Value::Object(f) => f.clone(),
        _ => Map::new(),
    };
    for (k, v) in who {
        match v {
            Some(v) => data.insert(k.to_owned(), Value::String(v.to_owned())),
            None => data.remove(k),
        };
    }
    let mut out = Map::new();
    out.insert("type".to_owned(), Value::String(ty.to_owned()));
    out.insert(
        "timestamp".to_owned(),
        Value::String(humantime::format_rfc3339_millis(at).to_string()),
    );
    out.insert("data".to_owned(), Value::Object(data));
    Value::Object(out).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn f(p: &[&str]) -> Result<EventFilter, String> {
        EventFilter::parse(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn filters_take_names_prefix_globs_and_refuse_what_matches_nothing() {
        let p = f(&["process.*"]).unwrap();
        assert!(p.has(type_of("process.exited").unwrap()));
        assert!(!p.has(type_of("session.opened").unwrap()));
        let two = f(&["session.created", "executor.*"]).unwrap();
        assert!(two.has(type_of("session.opened").unwrap()));
        assert!(!two.has(type_of("session.closed").unwrap()));
        assert!(two.has(type_of("executor.left").unwrap()));
        assert_eq!(f(&["*"]).unwrap(), EventFilter::ALL);
        assert!(f(&["proces.*"]).is_err());
        assert!(f(&["process*"]).is_err());
        assert!(f(&["session.opened"]).is_err());
        assert!(f(&[]).is_err());
    }

    #[test]
    fn audit_events_map_to_webhook_types_and_others_are_not_offered() {
        assert_eq!(
            EVENT_TYPES[type_of("session.opened").unwrap()],
            "session.created"
        );
        assert_eq!(
            EVENT_TYPES[type_of("egress.denied").unwrap()],
            "egress.refused"
        );
        assert_eq!(type_of("egress.allowed"), None);
        assert_eq!(type_of("session.resumed"), None);
        assert_eq!(type_of("file.written"), None);
        for t in EVENT_TYPES {
            if t != "session.created" && t != "egress.refused" {
                assert_eq!(EVENT_TYPES[type_of(t).unwrap()], t);
            }
        }
    }

    #[test]
    fn who_is_set_last_in_the_body() {
        let b = body(
            "process.exited",
            std::time::UNIX_EPOCH,
            [
                ("tenant", Some("t1")),
                ("subject", None),
                ("session", Some("s")),
            ],
            &serde_json::json!({"tenant": "forged", "subject": "root", "exit_code": 3}),
        );
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["type"], "process.exited");
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["data"]["tenant"], "t1");
        assert!(v["data"].get("subject").is_none());
        assert_eq!(v["data"]["exit_code"], 3);
    }
}
