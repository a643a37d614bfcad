//! What the tenant's names resolved to: the resolver records every
//! answer it passes on, so a connection that carries no name (SSH to a
//! Git host, a database) is attributed to the name its address came from,
//! and the proxy reuses answers while their TTL lasts.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Names one tenant's table holds; past it the entry attributed for the
/// shortest time left goes.
pub const MAX_RESOLVED_NAMES: usize = 4096;
/// Addresses kept per name.
pub const MAX_ADDRESSES_PER_NAME: usize = 32;
/// How long an address stays attributed to the name it was resolved
/// from, at least: clients keep answers past their TTL (runtimes cache
/// for 30 s to minutes, connection pools longer), and a connection made
/// from a kept answer must still be attributed.
pub const MIN_ATTRIBUTION: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Entry {
    name: String,
    addrs: Vec<Ipv4Addr>,
    /// The answer's TTL: reused by the proxy until then.
    fresh_until: Instant,
    /// Attributed until then.
    attributed_until: Instant,
}

/// One tenant's table.
#[derive(Debug, Default)]
pub struct Resolved {
    entries: parking_lot::Mutex<Vec<Entry>>,
}

impl Resolved {
    /// Record `name`'s answer.
    pub fn record(&self, name: &str, addrs: &[Ipv4Addr], ttl: Duration) {
        if addrs.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut addrs = addrs.to_vec();
        addrs.truncate(MAX_ADDRESSES_PER_NAME);
        let mut entries = self.entries.lock();
        entries.retain(|e| e.name != name && e.attributed_until > now);
        if entries.len() >= MAX_RESOLVED_NAMES
            && let Some((i, _)) = entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.attributed_until)
        {
            entries.swap_remove(i);
        }
        entries.push(Entry {
            name: name.to_owned(),
            addrs,
            fresh_until: now + ttl,
            attributed_until: now + ttl.max(MIN_ATTRIBUTION),
        });
    }

    /// `name`'s addresses while its answer's TTL lasts.
    pub fn fresh(&self, name: &str) -> Option<Vec<Ipv4Addr>> {
        let now = Instant::now();
        self.entries
            .lock()
            .iter()
            .find(|e| e.name == name && e.fresh_until > now)
            .map(|e| e.addrs.clone())
    }

    /// Whether `addr` was among `name`'s answers (still attributed).
    pub fn resolves_to(&self, name: &str, addr: Ipv4Addr) -> bool {
        let now = Instant::now();
        self.entries
            .lock()
            .iter()
            .any(|e| e.name == name && e.attributed_until > now && e.addrs.contains(&addr))
    }

    /// The names `addr` was resolved from, most recent first.
    pub fn names_of(&self, addr: Ipv4Addr) -> Vec<String> {
        let now = Instant::now();
        self.entries
            .lock()
            .iter()
            .rev()
            .filter(|e| e.attributed_until > now && e.addrs.contains(&addr))
            .map(|e| e.name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_attributed_to_every_name_it_was_resolved_from() {
        let r = Resolved::default();
        let a: Ipv4Addr = "93.184.215.12".parse().unwrap();
        r.record("a.cdn.test", &[a], Duration::from_secs(60));
        r.record("b.cdn.test", &[a], Duration::ZERO);
        assert_eq!(r.names_of(a), ["b.cdn.test", "a.cdn.test"]);
        assert!(r.fresh("b.cdn.test").is_none(), "a zero TTL is not reused");
        assert!(r.resolves_to("b.cdn.test", a), "but stays attributed");
        assert_eq!(r.fresh("a.cdn.test"), Some(vec![a]));
        r.record(
            "a.cdn.test",
            &["93.184.215.13".parse().unwrap()],
            Duration::from_secs(60),
        );
        assert_eq!(
            r.names_of(a),
            ["b.cdn.test"],
            "a new answer replaces the old"
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let r = Resolved::default();
        for i in 0..MAX_RESOLVED_NAMES + 10 {
            r.record(
                &format!("n{i}.test"),
                &[Ipv4Addr::from(i as u32)],
                Duration::from_secs(60),
            );
        }
        assert_eq!(r.entries.lock().len(), MAX_RESOLVED_NAMES);
    }
}
