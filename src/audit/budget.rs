//! The audit trail's byte budgets: what one source of events may make the
//! trail keep a minute, so that no source rotates the others' history away
//! or hides their events.
//!
//! A source is a tenant (its events), or, for events with no tenant, one
//! of: the admin listener's (`admin.*`), executors' (`executor.*`), the
//! refusals of unauthenticated clients (`auth.refused`, `tls.refused`: any
//! other `*.refused` with no tenant), each by the address it came from (the
//! first [`MAX_REFUSAL_SOURCES`] addresses a minute, an IPv6 one by its
//! /64; the rest share one more budget), and everything else with no tenant.
//! So a flood of forged handshakes spends its own address's budget, not the
//! operator's, an executor's or another address's.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The window of a budget.
const BUDGET_WINDOW: Duration = Duration::from_secs(60);
/// Longest string and most list items of an event cut to its summary.
pub(super) const SUMMARY_FIELD_BYTES: usize = 128;
pub(super) const SUMMARY_LIST_ITEMS: usize = 8;
/// Tenants whose budgets are remembered at most (beyond, all start anew).
const MAX_BUDGETED_TENANTS: usize = 4096;
/// Client addresses whose refusals have a budget of their own at most, a
/// minute; refusals from any further address share one budget.
pub const MAX_REFUSAL_SOURCES: usize = 1024;

/// Whose budget an event spends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Bucket {
    Tenant(String),
    /// `admin.*` with no tenant.
    Admin,
    /// `executor.*` with no tenant.
    Executor,
    /// A refusal with no tenant, by the client's address (none: unknown).
    Refused(Option<IpAddr>),
    /// Any other event with no tenant.
    Other,
}

impl Bucket {
    pub(super) fn of(event: &str, tenant: Option<&str>, fields: &Value) -> Bucket {
        if let Some(t) = tenant {
            return Bucket::Tenant(t.to_owned());
        }
        if event.starts_with("admin.") {
            Bucket::Admin
        } else if event.starts_with("executor.") {
            Bucket::Executor
        } else if event.ends_with(".refused") {
            Bucket::Refused(source_of(fields))
        } else {
            Bucket::Other
        }
    }
}

/// The address (an IPv6 one cut to its /64, what one client commonly
/// holds) an event's `remote` names.
fn source_of(fields: &Value) -> Option<IpAddr> {
    let remote = fields.get("remote")?.as_str()?;
    let ip = remote
        .parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| remote.parse::<IpAddr>())
        .ok()?;
    Some(match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    })
}

/// What one source may make the trail keep, per minute: its events whole
/// up to the budget, then summarised (who, what, every field cut to 128
/// bytes and 8 items, `"over_budget": true`) up to twice it, then left
/// out, counted in the dropped total and, in the next event of the source
/// written, in `omitted_before`. So a source writes at most about twice
/// its budget a minute, whatever it does.
pub(super) struct Budgets {
    per_window: u64,
    all: parking_lot::Mutex<All>,
}

#[derive(Default)]
struct All {
    tenants: HashMap<String, Budget>,
    admin: Budget,
    executor: Budget,
    other: Budget,
    sources: HashMap<Option<IpAddr>, Budget>,
    /// Refusals from addresses beyond [`MAX_REFUSAL_SOURCES`].
    more_sources: Budget,
}

struct Budget {
    since: Instant,
    used: u64,
    omitted: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            since: Instant::now(),
            used: 0,
            omitted: 0,
        }
    }
}

/// How an event is written, by its source's budget.
pub(super) enum Admit {
    Whole { omitted: u64 },
    Summary { omitted: u64 },
    Omit,
}

impl All {
    /// The budget of `bucket`, made if `make`.
    fn budget(&mut self, bucket: &Bucket, make: bool, now: Instant) -> Option<&mut Budget> {
        match bucket {
            Bucket::Tenant(t) => {
                if make && !self.tenants.contains_key(t) {
                    if self.tenants.len() >= MAX_BUDGETED_TENANTS {
                        self.tenants.clear();
                    }
                    self.tenants.insert(t.clone(), Budget::default());
                }
                self.tenants.get_mut(t)
            }
            Bucket::Admin => Some(&mut self.admin),
            Bucket::Executor => Some(&mut self.executor),
            Bucket::Other => Some(&mut self.other),
            Bucket::Refused(ip) => {
                if make && !self.sources.contains_key(ip) {
                    if self.sources.len() >= MAX_REFUSAL_SOURCES {
                        // Addresses quiet for a whole window make room;
                        // their counts of left-out events go to the shared
                        // budget's next event.
                        let mut freed = 0;
                        self.sources.retain(|_, b| {
                            let keep = now.duration_since(b.since) < BUDGET_WINDOW;
                            if !keep {
                                freed += b.omitted;
                            }
                            keep
                        });
                        self.more_sources.omitted += freed;
                    }
                    if self.sources.len() < MAX_REFUSAL_SOURCES {
                        self.sources.insert(*ip, Budget::default());
                    }
                }
                match self.sources.get_mut(ip) {
                    Some(b) => Some(b),
                    None => Some(&mut self.more_sources),
                }
            }
        }
    }
}

impl Budgets {
    pub(super) fn new(per_window: u64) -> Budgets {
        Budgets {
            per_window,
            all: parking_lot::Mutex::new(All::default()),
        }
    }

    pub(super) fn admit(&self, bucket: &Bucket) -> Admit {
        let now = Instant::now();
        let mut all = self.all.lock();
        let Some(b) = all.budget(bucket, true, now) else {
            return Admit::Whole { omitted: 0 };
        };
        if now.duration_since(b.since) >= BUDGET_WINDOW {
            b.since = now;
            b.used = 0;
        }
        if b.used >= self.per_window.saturating_mul(2) {
            b.omitted += 1;
            return Admit::Omit;
        }
        let omitted = std::mem::take(&mut b.omitted);
        if b.used >= self.per_window {
            Admit::Summary { omitted }
        } else {
            Admit::Whole { omitted }
        }
    }

    pub(super) fn charge(&self, bucket: &Bucket, bytes: usize) {
        let now = Instant::now();
        if let Some(b) = self.all.lock().budget(bucket, false, now) {
            b.used = b.used.saturating_add(bytes as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_with_no_tenant_are_budgeted_by_kind_and_source() {
        let none = json!({});
        assert_eq!(Bucket::of("admin.access", None, &none), Bucket::Admin);
        assert_eq!(
            Bucket::of("executor.refused", None, &none),
            Bucket::Executor
        );
        assert_eq!(
            Bucket::of("auth.refused", Some("t"), &none),
            Bucket::Tenant("t".to_owned())
        );
        let a = Bucket::of("auth.refused", None, &json!({"remote": "127.0.0.2:5"}));
        assert_eq!(a, Bucket::Refused(Some("127.0.0.2".parse().unwrap())));
        let v6 = Bucket::of(
            "tls.refused",
            None,
            &json!({"remote": "[2001:db8::1:2:3:4]:9"}),
        );
        assert_eq!(v6, Bucket::Refused(Some("2001:db8::".parse().unwrap())));
        assert_eq!(
            Bucket::of("auth.refused", None, &none),
            Bucket::Refused(None)
        );
    }

    #[test]
    fn one_source_spent_leaves_the_others_whole() {
        let b = Budgets::new(100);
        let flood = Bucket::Refused(Some("10.0.0.1".parse().unwrap()));
        for _ in 0..10 {
            if let Admit::Whole { .. } | Admit::Summary { .. } = b.admit(&flood) {
                b.charge(&flood, 50);
            }
        }
        assert!(matches!(b.admit(&flood), Admit::Omit));
        assert!(matches!(b.admit(&Bucket::Admin), Admit::Whole { .. }));
        let other = Bucket::Refused(Some("10.0.0.2".parse().unwrap()));
        assert!(matches!(b.admit(&other), Admit::Whole { omitted: 0 }));
        // Past the cap of addresses, the rest share one budget.
        for i in 0..MAX_REFUSAL_SOURCES {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i as u32));
            b.admit(&Bucket::Refused(Some(ip)));
        }
        assert!(b.all.lock().sources.len() <= MAX_REFUSAL_SOURCES);
    }
}
