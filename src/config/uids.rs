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
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let start = hash % count;
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
