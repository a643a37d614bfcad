//! `quota.refused`: a tenant quota refused a call, a session or a
//! connection. Recorded at a bounded rate per tenant (a client that loops
//! on a refusal would otherwise fill the trail and the webhooks' queue
//! with one event); the ones left out are counted in the next one's
//! `suppressed_before`.

use std::num::NonZeroU32;
use std::sync::{Arc, LazyLock};

use serde_json::json;

use super::{Who, clip};

/// Quota refusals each tenant may have recorded per second, and in a
/// burst.
pub const QUOTA_REFUSALS_PER_SECOND: u32 = 5;
pub const QUOTA_REFUSALS_BURST: u32 = 50;
/// Tenants whose suppressed refusals are remembered at most (beyond, the
/// counts start again).
const MAX_SUPPRESSED_TENANTS: usize = 4096;

struct Limiter {
    limiter: governor::DefaultKeyedRateLimiter<Arc<str>>,
    suppressed: parking_lot::Mutex<std::collections::HashMap<Arc<str>, u64>>,
}

static LIMITER: LazyLock<Limiter> = LazyLock::new(|| Limiter {
    limiter: governor::RateLimiter::keyed(
        governor::Quota::per_second(
            NonZeroU32::new(QUOTA_REFUSALS_PER_SECOND).unwrap_or(NonZeroU32::MIN),
        )
        .allow_burst(NonZeroU32::new(QUOTA_REFUSALS_BURST).unwrap_or(NonZeroU32::MIN)),
    ),
    suppressed: parking_lot::Mutex::new(std::collections::HashMap::new()),
});

impl Limiter {
    /// Some(refusals left out since the last one recorded) when this one
    /// may be recorded.
    fn admit(&self, tenant: &str) -> Option<u64> {
        let key: Arc<str> = Arc::from(tenant);
        let mut s = self.suppressed.lock();
        if self.limiter.check_key(&key).is_ok() {
            return Some(s.remove(&key).unwrap_or(0));
        }
        if s.len() >= MAX_SUPPRESSED_TENANTS && !s.contains_key(&key) {
            s.clear();
            self.limiter.retain_recent();
        }
        *s.entry(key).or_insert(0) += 1;
        None
    }
}

/// Record that `quota` (its `limit`) refused `what` (a method, or
/// `initialize` for a session) for `who`.
pub fn quota_refused(who: &Who<'_>, what: &str, quota: &str, limit: u64) {
    if !super::wanted("quota.refused") {
        return;
    }
    let Some(suppressed) = LIMITER.admit(who.tenant.unwrap_or("")) else {
        return;
    };
    let mut fields = json!({
        "method": clip(what),
        "quota": clip(quota),
        "limit": limit,
    });
    if suppressed > 0 {
        fields["suppressed_before"] = json!(suppressed);
    }
    super::emit("quota.refused", who, fields);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_flood_of_one_tenants_refusals_is_recorded_at_a_bounded_rate() {
        let l = &*super::LIMITER;
        let admitted = (0..super::QUOTA_REFUSALS_BURST + 100)
            .filter(|_| l.admit("flooder-q").is_some())
            .count();
        assert!(
            admitted <= super::QUOTA_REFUSALS_BURST as usize + 5,
            "{admitted}"
        );
        assert!(
            admitted >= super::QUOTA_REFUSALS_BURST as usize / 2,
            "{admitted}"
        );
        assert_eq!(l.admit("other-q"), Some(0));
    }
}
