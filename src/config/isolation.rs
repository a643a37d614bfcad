//! `[isolation]`: the confinement layers' policies (raw and validated), the
//! cgroup hierarchy choice and the default uid range.

use serde::Deserialize;

/// `[isolation]`: each layer is `required` (missing → refuse to start),
/// `optional` (used when the probe succeeds) or `off`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsolationConfig {
    /// cgroup per tenant and per process. Default: `optional`.
    pub cgroups: Option<LayerPolicy>,
    /// Landlock on tenant processes (tenant root and tmp read-write, system
    /// dirs read-only, signals and abstract sockets scoped). Default: `optional`.
    pub landlock: Option<LayerPolicy>,
    /// seccomp deny-list on tenant processes. Default: `optional`.
    pub seccomp: Option<LayerPolicy>,
    /// Per-tenant worker processes that spawn the tenant's processes, each
    /// confined as a whole (cgroups, uid, Landlock, seccomp). Default: `optional`.
    pub workers: Option<LayerPolicy>,
    /// A uid/gid per tenant for its processes and file operations. `required`
    /// makes `tenants.NAME.uid` mandatory; `optional` (default) uses it where
    /// set; `off` ignores it.
    pub uid: Option<LayerPolicy>,
    /// Mount, IPC and UTS namespaces per confined tenant: a private `/tmp`,
    /// other tenants' roots under `/tmp` gone; needed by `network = "none"`.
    /// Default: `optional`.
    pub namespaces: Option<LayerPolicy>,
    /// A network namespace per tenant with filtered egress through
    /// slirp4netns (`tenants.NAME.network = "isolated"`, the default where
    /// active; needs the namespaces layer, `slirp4netns` and `nft`). `off`
    /// lets tenants use `network = "host"`. Default: `required` (a tenant
    /// without it would share the host's network: its loopback, the
    /// gateway's listeners), except in the embedded single-operator
    /// default ([`DEFAULT_NETWORK_EMBEDDED`]).
    pub network: Option<LayerPolicy>,
    /// A project quota of `max_disk_bytes` on each tenant root (its
    /// filesystem must be mounted with `prjquota`). Default: `optional`.
    pub disk: Option<LayerPolicy>,
    /// `[first, last]`: uids (and gids) allocated to tenants without a
    /// configured `uid` when the gateway runs as root. A tenant's uid is
    /// stable (a hash of its name picks the start) and skips ids that name
    /// a user or group of the host or another tenant's. Default:
    /// `[40000, 59999]` (inside the 65,536 ids a user-namespaced pod maps,
    /// above what `adduser` hands out).
    pub uid_range: Option<[u32; 2]>,
    /// Which cgroup hierarchy the cgroups layer uses: `auto` (default: the
    /// unified hierarchy where `/sys/fs/cgroup` is cgroup v2, else the v1
    /// controllers), `v1`, or `v2` (the first cgroup2 mount, such as
    /// `/sys/fs/cgroup/unified` on a hybrid host).
    pub cgroup_version: Option<CgroupVersion>,
}

/// `[isolation] cgroup_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    #[default]
    Auto,
    V1,
    V2,
}

/// Default `[isolation] uid_range`.
pub const DEFAULT_UID_RANGE: [u32; 2] = [40000, 59999];

/// Validated `[isolation]`.
#[derive(Debug, Clone, Copy)]
pub struct IsolationSettings {
    pub workers: LayerPolicy,
    pub cgroups: LayerPolicy,
    pub landlock: LayerPolicy,
    pub seccomp: LayerPolicy,
    pub uid: LayerPolicy,
    pub namespaces: LayerPolicy,
    pub network: LayerPolicy,
    pub disk: LayerPolicy,
    pub cgroup_version: CgroupVersion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerPolicy {
    Required,
    Optional,
    Off,
}

/// `[isolation] network` when a configuration file does not name it: a
/// host without slirp4netns or nft refuses to start rather than put
/// tenants on the host's network.
pub const DEFAULT_NETWORK: LayerPolicy = LayerPolicy::Required;

/// `[isolation] network` of the embedded default (no file: one tenant, the
/// local operator's own directory): used where the host allows it, else
/// the operator's process runs on the network the operator already has.
pub const DEFAULT_NETWORK_EMBEDDED: LayerPolicy = LayerPolicy::Optional;

/// Validate `[isolation]`: a layer not named is `optional`, but for
/// `network` ([`DEFAULT_NETWORK`]).
pub(super) fn validate_isolation(i: &IsolationConfig) -> IsolationSettings {
    let layer = |p: Option<LayerPolicy>| p.unwrap_or(LayerPolicy::Optional);
    IsolationSettings {
        workers: layer(i.workers),
        cgroups: layer(i.cgroups),
        landlock: layer(i.landlock),
        seccomp: layer(i.seccomp),
        uid: layer(i.uid),
        namespaces: layer(i.namespaces),
        network: i.network.unwrap_or(DEFAULT_NETWORK),
        disk: layer(i.disk),
        cgroup_version: i.cgroup_version.unwrap_or_default(),
    }
}
