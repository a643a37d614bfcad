//! Per-tenant usage for chargeback: CPU time and peak memory from the
//! tenant's cgroup, processes started, bytes received from and sent to
//! its clients. Active tenants are read live; a retired activation's
//! usage is folded into the tenant's account, which outlives it (one
//! small entry per tenant seen, never a metric series).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use super::Tenant;

/// Tenants whose accounts are kept; past it, a new tenant's account is
/// not kept (counted in `dropped`). About 120 bytes each.
pub const MAX_ACCOUNTS: usize = 1_000_000;

/// Usage of one tenant, since this gateway started.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Usage {
    /// CPU time of its processes and workers (cgroup), in seconds; `null`
    /// where the kernel does not count it (cgroup v1 without `cpuacct`
    /// in the gateway's hierarchy).
    pub cpu_seconds: Option<f64>,
    /// The highest memory its cgroup held in any activation; `null` where
    /// the kernel does not report it (cgroup v2 before Linux 5.19).
    pub memory_peak_bytes: Option<u64>,
    pub processes_started: u64,
    /// Bytes its clients sent (as charged to its inbound budget).
    pub bytes_in: u64,
    /// Bytes sent to its clients (replies and notifications).
    pub bytes_out: u64,
    /// Times it was activated (its first session after being idle).
    pub activations: u64,
}

impl Usage {
    /// What an active tenant has used so far in this activation.
    pub fn of(t: &Tenant) -> Usage {
        let (cpu_us, peak) = t.cgroup.as_ref().map(|c| c.usage()).unwrap_or((None, None));
        Usage {
            cpu_seconds: cpu_us.map(|us| us as f64 / 1e6),
            memory_peak_bytes: peak,
            processes_started: t.metrics.own_started.get(),
            bytes_in: t.inbound.total(),
            bytes_out: t.outbound.total(),
            activations: 1,
        }
    }

    fn add(&mut self, o: &Usage) {
        self.cpu_seconds = match (self.cpu_seconds, o.cpu_seconds) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.memory_peak_bytes = self.memory_peak_bytes.max(o.memory_peak_bytes);
        self.processes_started += o.processes_started;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        self.activations += o.activations;
    }
}

/// One line of `/accounting`.
#[derive(Debug, Serialize)]
pub struct Account {
    pub tenant: String,
    pub active: bool,
    #[serde(flatten)]
    pub usage: Usage,
}

/// Retired activations' usage, by tenant.
#[derive(Default)]
pub(super) struct Accounts {
    /// Activations taken out of the registry and being retired: still
    /// reported as active (with their metric series) until their usage is
    /// folded in, so no report misses or double-counts one.
    retiring: Mutex<Vec<Arc<Tenant>>>,
    retired: Mutex<HashMap<Arc<str>, Usage>>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Accounts {
    /// An activation taken out of the registry, to be retired (called
    /// under the registry lock it was taken under).
    pub(super) fn begin(&self, t: &Arc<Tenant>) {
        self.retiring.lock().push(t.clone());
    }

    /// Fold a retired activation's final usage in.
    pub(super) fn retire(&self, t: &Arc<Tenant>, u: &Usage) {
        let mut retiring = self.retiring.lock();
        retiring.retain(|r| !Arc::ptr_eq(r, t));
        let name = &t.name;
        let mut m = self.retired.lock();
        if let Some(e) = m.get_mut(name) {
            e.add(u);
        } else if m.len() < MAX_ACCOUNTS {
            m.insert(name.clone(), u.clone());
        } else {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Every tenant's account: retired usage plus the live activations'
    /// (`live`, taken under the registry's locks while they are held) and
    /// those being retired.
    pub(super) fn report(&self, live: &[Arc<Tenant>], only: Option<&str>) -> Vec<Account> {
        let mut out: HashMap<Arc<str>, Account> = HashMap::new();
        let retiring = self.retiring.lock();
        let mut live: Vec<&Arc<Tenant>> = live.iter().collect();
        for t in retiring.iter() {
            if !live.iter().any(|l| Arc::ptr_eq(l, t)) {
                live.push(t);
            }
        }
        for (name, u) in self.retired.lock().iter() {
            if only.is_some_and(|o| o != &**name) {
                continue;
            }
            out.insert(
                name.clone(),
                Account {
                    tenant: name.to_string(),
                    active: false,
                    usage: u.clone(),
                },
            );
        }
        for t in live {
            if only.is_some_and(|o| o != &*t.name) {
                continue;
            }
            let e = out.entry(t.name.clone()).or_insert_with(|| Account {
                tenant: t.name.to_string(),
                active: true,
                usage: Usage {
                    activations: 0,
                    ..Usage::default()
                },
            });
            e.active = true;
            e.usage.add(&Usage::of(t));
        }
        let mut v: Vec<Account> = out.into_values().collect();
        v.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        v
    }

    /// Accounts not kept because [`MAX_ACCOUNTS`] were.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `tenant.activated` in the audit trail (and to webhooks).
pub(super) fn announce_activated(t: &Tenant, templated: bool) {
    crate::audit::emit(
        "tenant.activated",
        &crate::audit::Who {
            tenant: Some(&t.name),
            ..Default::default()
        },
        serde_json::json!({ "instance": &*t.instance, "templated": templated }),
    );
}

/// `tenant.retired` with what its activation used; `why`: `idle` (also
/// when retired for another tenant's place), `changed` (a reload changed
/// what only a new activation applies), `replaced` (such an activation,
/// once its last session ended), `removed` (a reload removed it),
/// `shutdown`.
pub(super) fn announce_retired(t: &Tenant, usage: &Usage, why: &str) {
    if !crate::audit::wanted("tenant.retired") {
        return;
    }
    crate::audit::emit(
        "tenant.retired",
        &crate::audit::Who {
            tenant: Some(&t.name),
            ..Default::default()
        },
        serde_json::json!({
            "instance": &*t.instance,
            "reason": why,
            "usage": serde_json::to_value(usage).unwrap_or_default(),
        }),
    );
}
