//! The host mechanisms that keep tenants apart: cgroups, the process sandbox
//! (uid, Landlock, seccomp, rlimits), signals to process groups and the
//! reaper sidecar. Each is a mechanism only: which tenant gets what is
//! decided above (module `tenant`), and whether the host allows a layer is
//! probed by module `probe`.

pub mod caps;
pub mod cgroup;
pub mod disk;
pub mod egress;
pub mod fds;
pub mod idmap;
pub mod loader;
pub mod namespace;
mod pid_parent;
pub mod reaper;
pub mod sandbox;
pub mod seccomp;
pub mod signal;

/// Which isolation layers are active (probed at start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layers {
    pub workers: bool,
    pub cgroups: bool,
    pub landlock: bool,
    pub seccomp: bool,
    pub uid: bool,
    pub namespaces: bool,
    /// A network namespace per tenant with filtered egress.
    pub network: bool,
    /// Whether a tenant that names no network may share the host's: only
    /// where the operator let the layer go (`off`, or `optional` whose
    /// probe failed). Not where the probe was skipped because no tenant
    /// wanted it then: a tenant added later (by reload, or by removing its
    /// `network = "none"`) gets its own network or is refused.
    pub host_network: bool,
    /// A project quota on each tenant root.
    pub disk: bool,
}
