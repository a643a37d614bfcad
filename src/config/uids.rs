//! Host uid allocation: tenants without a configured uid get a stable one
//! from `[isolation] uid_range`, skipping ids the host or a tenant uses.

use std::collections::BTreeMap;

use super::common::ConfigError;
use super::tenants::TenantSettings;

/// Which ids the host already uses (users and groups, through NSS).
pub trait IdsInUse {
    fn uid_used(&self, uid: u32) -> bool;
    fn gid_used(&self, gid: u32) -> bool;
}

/// The host's user and group databases.
pub struct HostIds;

impl IdsInUse for HostIds {
    fn uid_used(&self, uid: u32) -> bool {
        // A lookup that fails (not a "no such user") counts as taken.
        !matches!(nix::unistd::User::from_uid(uid.into()), Ok(None))
    }
    fn gid_used(&self, gid: u32) -> bool {
        !matches!(nix::unistd::Group::from_gid(gid.into()), Ok(None))
    }
}

/// The host's users and groups read once, for allocating many uids at
/// start: enumerated through NSS (getpwent/getgrent) where every source
/// `/etc/nsswitch.conf` names can enumerate (files, systemd, compat);
/// otherwise (LDAP, SSSD without enumeration) each id is looked up.
pub struct HostIdsSnapshot {
    users: std::collections::HashSet<u32>,
    groups: std::collections::HashSet<u32>,
}

impl HostIdsSnapshot {
    /// `None` where some source cannot be trusted to enumerate.
    #[allow(unsafe_code)]
    pub fn load() -> Option<HostIdsSnapshot> {
        let conf = std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default();
        let enumerable = ["passwd", "group"].iter().all(|db| {
            conf.lines()
                .find_map(|l| l.trim().strip_prefix(db)?.trim().strip_prefix(':'))
                .is_none_or(|sources| {
                    sources
                        .split_whitespace()
                        .filter(|s| !s.starts_with('['))
                        .all(|s| matches!(s, "files" | "systemd" | "compat"))
                })
        });
        if !enumerable {
            return None;
        }
        static ENUMERATING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
        let _one = ENUMERATING.lock();
        let mut users = std::collections::HashSet::new();
        let mut groups = std::collections::HashSet::new();
        // SAFETY: the enumeration's state is libc's own; one enumeration
        // at a time (the lock), and each entry is read before the next call.
        unsafe {
            libc::setpwent();
            loop {
                let p = libc::getpwent();
                if p.is_null() {
                    break;
                }
                users.insert((*p).pw_uid);
            }
            libc::endpwent();
            libc::setgrent();
            loop {
                let g = libc::getgrent();
                if g.is_null() {
                    break;
                }
                groups.insert((*g).gr_gid);
            }
            libc::endgrent();
        }
        Some(HostIdsSnapshot { users, groups })
    }
}

impl IdsInUse for HostIdsSnapshot {
    fn uid_used(&self, uid: u32) -> bool {
        self.users.contains(&uid)
    }
    fn gid_used(&self, gid: u32) -> bool {
        self.groups.contains(&gid)
    }
}

/// The host's ids for allocating many: the snapshot where it can be
/// trusted, else per-id lookups.
pub fn host_ids() -> Box<dyn IdsInUse> {
    match HostIdsSnapshot::load() {
        Some(s) => Box::new(s),
        None => Box::new(HostIds),
    }
}

/// Give every tenant without a configured uid one from `[first, last]`:
/// the FNV-1a hash of its name picks where to start, and the search moves
/// up (wrapping) past ids that are a host user or group, or any tenant's.
/// Tenants are taken in name order, so the result depends only on the
/// configuration and the host's databases: every replica agrees.
pub fn allocate_uids(
    tenants: &mut BTreeMap<String, TenantSettings>,
    [first, last]: [u32; 2],
    host: &dyn IdsInUse,
) -> Result<(), ConfigError> {
    if first == 0 || last < first || last == u32::MAX {
        return Err(ConfigError(format!(
            "[isolation] uid_range = [{first}, {last}]: needs 0 < first <= last < {}",
            u32::MAX
        )));
    }
    let mut taken: std::collections::HashSet<u32> = tenants
        .values()
        .filter_map(|t| t.uid)
        .flat_map(|(u, g)| [u, g])
        .collect();
    let count = u64::from(last - first) + 1;
    for (name, t) in tenants.iter_mut() {
        if t.uid.is_some() {
            continue;
        }
        let start = fnv1a(name) % count;
        let found = (0..count)
            .map(|i| first + ((start + i) % count) as u32)
            .find(|&id| !taken.contains(&id) && !host.uid_used(id) && !host.gid_used(id));
        let Some(id) = found else {
            return Err(ConfigError(format!(
                "tenants.{name}: no free uid left in [isolation] uid_range = [{first}, {last}]"
            )));
        };
        taken.insert(id);
        t.uid = Some((id, id));
        t.uid_allocated = true;
    }
    Ok(())
}

/// The uids of templated tenants, recorded where their roots are: entry
/// `ROOTS/.uids/UID` is a symlink whose target is the tenant's name.
/// symlink(2) fails on an existing name, so two replicas (or two
/// gateways) sharing the roots' filesystem can never give one uid to two
/// tenants, and a tenant keeps its uid across restarts and replicas. No
/// tenant can reach the ledger: names never start with `.`, and a
/// templated tenant sees only its own root.
pub struct UidLedger {
    dir: std::path::PathBuf,
    first: u32,
    last: u32,
    /// Configured tenants' uids and gids.
    reserved: std::collections::HashSet<u32>,
}

/// Where the ledger of templated roots `roots` lives.
pub fn ledger_dir(roots: &std::path::Path) -> std::path::PathBuf {
    roots.join(".uids")
}

impl UidLedger {
    pub fn new(
        roots: &std::path::Path,
        [first, last]: [u32; 2],
        configured: &BTreeMap<String, TenantSettings>,
    ) -> UidLedger {
        UidLedger {
            dir: ledger_dir(roots),
            first,
            last,
            reserved: configured
                .values()
                .filter_map(|t| t.uid)
                .flat_map(|(u, g)| [u, g])
                .collect(),
        }
    }

    /// The uid of templated tenant `name`: the one the ledger holds for
    /// it, else the first free id from where the FNV-1a hash of its name
    /// points (moving up, wrapping), skipping host users and groups and
    /// configured tenants. A full range refuses the tenant.
    pub fn uid_for(&self, name: &str, host: &dyn IdsInUse) -> Result<u32, ConfigError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let (first, last) = (self.first, self.last);
        let err = |e: std::io::Error| {
            ConfigError(format!(
                "tenant `{name}`: uid ledger {}: {e}",
                self.dir.display()
            ))
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e)),
        }
        // Never a link, never another user's: the ledger decides uids.
        {
            use std::os::unix::fs::MetadataExt as _;
            let m = std::fs::symlink_metadata(&self.dir).map_err(err)?;
            if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o022 != 0 {
                return Err(err(std::io::Error::other(
                    "not a directory of the gateway's that only it may write",
                )));
            }
        }
        let count = u64::from(last - first) + 1;
        let start = fnv1a(name) % count;
        for i in 0..count {
            let id = first + ((start + i) % count) as u32;
            let entry = self.dir.join(id.to_string());
            loop {
                match std::fs::read_link(&entry) {
                    Ok(holder) if holder.as_os_str() == name => return Ok(id),
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(err(e)),
                }
                if self.reserved.contains(&id) || host.uid_used(id) || host.gid_used(id) {
                    break;
                }
                match std::os::unix::fs::symlink(name, &entry) {
                    Ok(()) => return Ok(id),
                    // Taken meanwhile (by this tenant elsewhere, or
                    // another): read who holds it.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(err(e)),
                }
            }
        }
        Err(ConfigError(format!(
            "tenant `{name}`: no free uid left in [isolation] uid_range = [{first}, {last}] (the ledger {} holds the templated tenants' uids; remove the entries of tenants gone for good, or widen the range)",
            self.dir.display()
        )))
    }

    /// The templated tenant the ledger gives `id` to.
    pub fn holder(&self, id: u32) -> Option<String> {
        std::fs::read_link(self.dir.join(id.to_string()))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }

    /// Whether the ledger gives `id` to a templated tenant.
    pub fn holds(&self, id: u32) -> bool {
        self.holder(id).is_some()
    }
}

/// FNV-1a of a tenant name: where its uid search starts.
fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The host's databases plus a uid ledger: configured tenants' uids skip
/// what templated tenants hold.
pub struct HostAndLedger<'a>(pub &'a dyn IdsInUse, pub &'a UidLedger);

impl IdsInUse for HostAndLedger<'_> {
    fn uid_used(&self, uid: u32) -> bool {
        self.0.uid_used(uid) || self.1.holds(uid)
    }
    fn gid_used(&self, gid: u32) -> bool {
        self.0.gid_used(gid) || self.1.holds(gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::minimal;

    /// A host whose user database holds `used`.
    struct Taken(Vec<u32>);
    impl IdsInUse for Taken {
        fn uid_used(&self, uid: u32) -> bool {
            self.0.contains(&uid)
        }
        fn gid_used(&self, gid: u32) -> bool {
            self.0.contains(&gid)
        }
    }

    fn tenants(names: &[(&str, Option<u32>)]) -> BTreeMap<String, TenantSettings> {
        let c: Config = toml::from_str(&minimal("")).unwrap();
        let t = c.validate().unwrap().tenants["a"].clone();
        names
            .iter()
            .map(|(n, uid)| {
                let mut t = t.clone();
                t.uid = uid.map(|u| (u, u));
                t.uid_allocated = false;
                (n.to_string(), t)
            })
            .collect()
    }

    #[test]
    fn allocated_uids_are_stable_distinct_and_skip_what_is_taken() {
        let range = [1000, 1002];
        let mut a = tenants(&[("x", None), ("y", None), ("z", Some(1001))]);
        allocate_uids(&mut a, range, &Taken(vec![])).unwrap();
        let mut b = tenants(&[("x", None), ("y", None), ("z", Some(1001))]);
        allocate_uids(&mut b, range, &Taken(vec![])).unwrap();
        let ids = |m: &BTreeMap<String, TenantSettings>| {
            m.values().map(|t| t.uid.unwrap()).collect::<Vec<_>>()
        };
        // The same configuration gives the same uids.
        assert_eq!(ids(&a), ids(&b));
        let mut all: Vec<u32> = ids(&a).iter().map(|(u, _)| *u).collect();
        all.sort();
        assert_eq!(all, vec![1000, 1001, 1002]);
        assert!(a["x"].uid_allocated && !a["z"].uid_allocated);
        assert_eq!(a["x"].uid.unwrap().0, a["x"].uid.unwrap().1);
        // A host user in the range is skipped; a full range is refused.
        let mut c = tenants(&[("x", None)]);
        allocate_uids(&mut c, range, &Taken(vec![1000, 1001])).unwrap();
        assert_eq!(c["x"].uid, Some((1002, 1002)));
        let mut d = tenants(&[("x", None), ("y", None)]);
        let e = allocate_uids(&mut d, range, &Taken(vec![1000, 1001])).unwrap_err();
        assert!(e.0.contains("no free uid"), "{}", e.0);
        for bad in [[0, 10], [10, 9], [1, u32::MAX]] {
            let mut t = tenants(&[("x", None)]);
            assert!(allocate_uids(&mut t, bad, &Taken(vec![])).is_err());
        }
    }
}
