//! `[tenants.NAME]`: raw and validated, the tenant's network, placement and
//! cgroup limits, its per-tenant defaults, and the check that tenant roots
//! are disjoint.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::common::{ConfigError, positive, state_dir};
use super::isolation::LayerPolicy;

/// `[tenants.NAME]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Directory every fs path and process `cwd` must lie inside. Required;
    /// `/` means the whole host (no confinement).
    pub root: Option<PathBuf>,
    /// Sessions (attached or detached). Default: 64.
    pub max_sessions: Option<usize>,
    /// Running processes; a start past it gets -32006. Default: 128.
    pub max_processes: Option<usize>,
    /// Sustained request rate; past it, -32001. Default: 200.
    pub requests_per_second: Option<u32>,
    /// Requests allowed in a burst. Default: 2 × `requests_per_second`.
    pub burst: Option<u32>,
    /// Requests in flight; past it, -32001. Default: 64.
    pub max_in_flight: Option<usize>,
    /// Output bytes retained over all the tenant's processes; a start past
    /// it gets -32006. Default: 256 MiB.
    pub max_retained_output_bytes: Option<usize>,
    /// Bytes of replies and notifications held for the tenant's clients
    /// (built, not yet written to the socket). A reply that does not fit
    /// waits for room. Default: 256 MiB.
    pub max_outbound_bytes: Option<usize>,
    /// Bytes received from the tenant's clients and not yet done with
    /// (messages being assembled, requests waiting or running); past it,
    /// their reads wait. At least `server.max_message_bytes`. Default: 64 MiB.
    pub max_inbound_bytes: Option<usize>,
    /// Largest file `fs/readFile` returns; larger ones get -32602 (read
    /// them with `fs/readBlock` or gRPC `ReadFile`). Default: 64 MiB.
    pub max_read_file_bytes: Option<u64>,
    /// Authenticated connections (both doors). Default: 1024.
    pub max_connections: Option<usize>,
    /// Open gRPC server streams (Attach, Exec, ReadFile); past it,
    /// RESOURCE_EXHAUSTED. Default: 64.
    pub max_streams: Option<usize>,
    /// `fs/open` handles over all the tenant's sessions (each an open
    /// file in the gateway); past it, -32600. Default: 256.
    pub max_open_files: Option<usize>,
    /// Size of the tenant's private `/tmp` (a tmpfs; its pages count
    /// against `memory_max_bytes` too). Default: 1 GiB.
    pub max_tmp_bytes: Option<u64>,
    /// Bytes the tenant's root may hold (a project quota; the
    /// `[isolation] disk` layer). Default: 4 GiB.
    pub max_disk_bytes: Option<u64>,
    /// Environment `envPolicy` inherits from. Default: PATH, HOME (the root), LANG, SHELL, TMPDIR.
    pub base_env: Option<HashMap<String, String>>,
    /// cgroup `pids.max` over all the tenant's processes. Default: 4096.
    pub pids_max: Option<u64>,
    /// cgroup memory limit over all the tenant's processes (kernel memory of
    /// their open files included). Default: 4 GiB.
    pub memory_max_bytes: Option<u64>,
    /// cgroup `cpu.shares` (1024 = equal share with other tenants). Default: 1024.
    pub cpu_shares: Option<u64>,
    /// A hard CPU cap over all the tenant's processes, in cores (CFS
    /// quota). Default: none.
    pub cpu_max_cores: Option<f64>,
    /// uid the tenant's processes and file operations run as (not 0).
    /// Default: none (the gateway's own; see `[isolation] uid`).
    pub uid: Option<u32>,
    /// gid for the same. Default: the uid.
    pub gid: Option<u32>,
    /// Worker processes kept running for the tenant. Default: 1.
    pub workers_min: Option<usize>,
    /// Most worker processes (sessions spread over them). Default: 4.
    pub workers_max: Option<usize>,
    /// Extra paths the tenant's processes may read (Landlock). Default: none.
    #[serde(default)]
    pub landlock_read: Vec<PathBuf>,
    /// Extra paths the tenant's processes may write (Landlock). Default: none.
    #[serde(default)]
    pub landlock_write: Vec<PathBuf>,
    /// `isolated`: a network namespace of the tenant's own, with the way
    /// out `egress` allows (the default where the `[isolation] network`
    /// layer is active); `none`: a namespace with only loopback; `host`:
    /// the host's network, loopback and listeners included (allowed only
    /// with `[isolation] network = "off"`).
    pub network: Option<Network>,
    /// Where an `isolated` tenant's processes may connect: `"internet"`
    /// (default: every public address), `"none"`, or a list of CIDRs
    /// (private ranges allowed), which may include `"internet"`. The
    /// gateway host's own addresses are never reachable.
    pub egress: Option<EgressConfig>,
    /// Host names an `isolated` tenant's processes may reach
    /// (`github.com`, `*.githubusercontent.com`, `pypi.org:443`), on top
    /// of `egress`'s addresses; with it, `egress` may not say
    /// `"internet"`. Decided on the name a connection carries (TLS SNI,
    /// HTTP `Host`) or, without one, the name the address was resolved
    /// from (docs/isolation.md, "Egress by name"). Default: none (addresses
    /// only).
    pub egress_names: Option<Vec<String>>,
    /// What a connection to a name `egress_names` does not list meets:
    /// `"deny"` (the default), or `"ask"`: a process started with Codex's
    /// `networkProxy` (and `policyDecisionTimeoutMs`) has its client
    /// asked with `network/policyRequest`. Needs `egress_names`.
    pub egress_unlisted: Option<Unlisted>,
    /// Values for `http/request` headers (`valueEnvVar`), each read from a
    /// file the tenant cannot see and sent only to the hosts it names.
    /// Default: none.
    #[serde(default)]
    pub secrets: BTreeMap<String, super::secrets::SecretConfig>,
    /// Extra trust anchors (PEM) for the tenant's `http/request` HTTPS
    /// servers, beside the Mozilla roots. Default: none.
    pub http_ca_file: Option<PathBuf>,
    /// Connections (TCP and UDP flows, DNS included) an `isolated`
    /// tenant may hold open outside its namespace at once; the next is
    /// refused (EHOSTUNREACH). Default: [`DEFAULT_MAX_EGRESS_CONNECTIONS`].
    pub max_egress_connections: Option<u32>,
    /// The executor pool (`[executors.pools.NAME]`) the tenant's sessions
    /// may run on. Default: none.
    pub pool: Option<String>,
    /// Only executors whose registration carries all these labels.
    #[serde(default)]
    pub pool_labels: BTreeMap<String, String>,
    /// `local`, `remote` or `prefer-remote`. Default:
    /// `remote` with a pool, else `local`.
    pub placement: Option<Placement>,
    /// The image the tenant's sessions see as `/` (a registry reference,
    /// `oci:DIR[:TAG]` or `oci-archive:FILE[:TAG]`; docs/environments.md).
    /// Default: none (the host's userland).
    pub image: Option<String>,
    /// Further images a session may choose (a token's `image` claim, the
    /// `initialize` parameter, gRPC `CreateSession`): references, or
    /// prefixes ending in `*`. Default: none (only `image`).
    #[serde(default)]
    pub images: Vec<String>,
}

/// Default `tenants.NAME.max_egress_connections`: a tenant's open
/// connections out of its namespace, each of which holds socket buffers
/// in its namespace and in slirp4netns (docs/isolation.md, "Network").
pub const DEFAULT_MAX_EGRESS_CONNECTIONS: u32 = 256;
/// The largest `max_egress_connections`: slirp4netns's descriptor cap.
pub const MAX_EGRESS_CONNECTIONS: u32 = 4096;

/// Where a tenant's processes may connect (`tenants.NAME.egress`), and how
/// many connections at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    /// Every public address.
    pub internet: bool,
    /// These too, private ranges included (never the host's own addresses).
    pub allow: Vec<ipnet::IpNet>,
    /// Connections open at once (`max_egress_connections`).
    pub max_connections: u32,
    /// Names reached through the gateway's egress proxy
    /// (`egress_names`); `None`: addresses alone decide.
    pub names: Option<super::egress::EgressNames>,
    /// `egress_unlisted = "ask"`.
    pub ask: bool,
}

/// `tenants.NAME.egress_unlisted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unlisted {
    Deny,
    Ask,
}

impl Default for Egress {
    fn default() -> Egress {
        Egress {
            internet: false,
            allow: Vec::new(),
            max_connections: DEFAULT_MAX_EGRESS_CONNECTIONS,
            names: None,
            ask: false,
        }
    }
}

impl Egress {
    pub fn none() -> Egress {
        Egress::default()
    }

    /// Whether anything outside the namespace may be reached (it needs a
    /// way out).
    pub fn reaches(&self) -> bool {
        self.internet || !self.allow.is_empty() || self.names.is_some()
    }

    /// Short form for logs and `/readyz`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if self.internet {
            parts.push("internet".to_owned());
        }
        parts.extend(self.allow.iter().map(|n| n.to_string()));
        if let Some(n) = &self.names {
            parts.push(format!("{} names", n.entries().len()));
        }
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// A tenant's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    Isolated,
    Host,
    None,
}

/// `tenants.NAME.egress` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EgressConfig {
    Word(String),
    List(Vec<String>),
}

/// What an egress allowlist may not open: "this network", loopback,
/// link-local (cloud metadata), Azure's WireServer, Alibaba's metadata
/// address, multicast and reserved; IPv6 loopback, mapped, link-local, the
/// EC2 metadata address and multicast.
const NEVER_ALLOWED: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "168.63.129.16/32",
    "100.100.100.200/32",
    "224.0.0.0/3",
    "::/127",
    "::ffff:0:0/96",
    "fe80::/10",
    "fd00:ec2::254/128",
    "ff00::/8",
];

/// Validate `egress`: words `internet` and `none`, or CIDRs (a bare
/// address is a /32 or /128).
fn validate_egress(name: &str, e: Option<EgressConfig>) -> Result<Egress, ConfigError> {
    let items = match e {
        None => {
            return Ok(Egress {
                internet: true,
                ..Egress::default()
            });
        }
        Some(EgressConfig::Word(w)) if w == "none" => return Ok(Egress::none()),
        Some(EgressConfig::Word(w)) => vec![w],
        Some(EgressConfig::List(l)) => l,
    };
    let mut out = Egress::none();
    for item in items {
        if item == "internet" {
            out.internet = true;
            continue;
        }
        let net = item
            .parse::<ipnet::IpNet>()
            .or_else(|_| item.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                ConfigError(format!(
                    "tenants.{name}.egress: {item:?} is neither \"internet\", \"none\" nor a CIDR"
                ))
            })?;
        let shortest = if net.addr().is_ipv4() { 8 } else { 16 };
        if net.prefix_len() < shortest {
            return Err(ConfigError(format!(
                "tenants.{name}.egress: {item} is wider than a /{shortest}; it would open private ranges and cloud metadata wholesale: write \"internet\" for public addresses and name private ranges one by one"
            )));
        }
        if let Some(f) = NEVER_ALLOWED
            .iter()
            .filter_map(|f| f.parse::<ipnet::IpNet>().ok())
            .find(|f| f.contains(&net.network()) || net.contains(&f.network()))
        {
            return Err(ConfigError(format!(
                "tenants.{name}.egress: {item} overlaps {f} (loopback, link-local with cloud metadata, multicast or reserved), which no tenant may reach"
            )));
        }
        out.allow.push(net);
    }
    Ok(out)
}

/// Where a tenant's JSON-RPC sessions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Its local worker pool only.
    Local,
    /// Its executor pool only.
    Remote,
    /// An executor when one is free, else locally.
    PreferRemote,
}

/// Limits applied to a tenant's cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub pids_max: Option<u64>,
    pub memory_max_bytes: Option<u64>,
    /// v1 `cpu.shares` (1024 = one default share).
    pub cpu_shares: Option<u64>,
    /// CFS quota per [`CPU_PERIOD_US`] (a hard cap), when set.
    pub cpu_quota_us: Option<u64>,
}

/// The CFS period a CPU quota is expressed in.
pub const CPU_PERIOD_US: u64 = 100_000;

/// Validated `[tenants.NAME]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSettings {
    pub name: String,
    /// `None` = the whole host.
    pub root: Option<PathBuf>,
    pub max_sessions: usize,
    pub max_processes: usize,
    pub requests_per_second: u32,
    pub burst: u32,
    pub max_in_flight: usize,
    pub max_retained_output_bytes: usize,
    pub max_outbound_bytes: usize,
    pub max_inbound_bytes: usize,
    pub max_read_file_bytes: u64,
    pub max_connections: usize,
    pub max_streams: usize,
    pub max_open_files: usize,
    pub max_tmp_bytes: u64,
    pub max_disk_bytes: u64,
    pub base_env: HashMap<String, String>,
    pub cgroup_limits: CgroupLimits,
    /// (uid, gid): configured, or allocated from `[isolation] uid_range`
    /// when the gateway runs as root.
    pub uid: Option<(u32, u32)>,
    /// `uid` was allocated (the tenant's root then appears as its own:
    /// module `isolation::idmap`).
    pub uid_allocated: bool,
    pub workers_min: usize,
    pub workers_max: usize,
    pub landlock_read: Vec<PathBuf>,
    pub landlock_write: Vec<PathBuf>,
    /// As configured; `None`: `isolated` where the network layer is
    /// active, else the host's.
    pub network: Option<Network>,
    pub egress: Egress,
    /// `http/request` header values and the hosts each goes to.
    pub secrets: Vec<super::secrets::TenantSecret>,
    /// Extra trust anchors for `http/request`.
    pub http_ca_file: Option<PathBuf>,
    pub pool: Option<String>,
    pub pool_labels: BTreeMap<String, String>,
    pub placement: Placement,
    /// The default image (`None`: the host's userland).
    pub image: Option<super::images::ImageSource>,
    /// What sessions may choose besides it.
    pub images: Vec<super::images::ImagePattern>,
}

/// Default size of a tenant's private `/tmp`.
pub const DEFAULT_MAX_TMP_BYTES: u64 = 1 << 30;
/// Default project quota of a tenant's root.
pub const DEFAULT_MAX_DISK_BYTES: u64 = 4 << 30;

/// A disk size of at least 1 MiB (less could not hold a tool's temp files).
fn bytes_at_least(name: &str, key: &str, v: u64) -> Result<u64, ConfigError> {
    if v < 1 << 20 {
        return Err(ConfigError(format!(
            "tenants.{name}.{key} must be at least 1 MiB (1048576), got {v}"
        )));
    }
    Ok(v)
}

/// A tenant's memory limit when its config names none.
pub const DEFAULT_TENANT_MEMORY_BYTES: u64 = 4 << 30;

/// Highest `max_read_file_bytes` accepted (the reference server's limit).
pub const MAX_READ_FILE_LIMIT: u64 = 512 * 1024 * 1024;

/// Default `fs/readFile` limit: Codex reads instruction files (32 KiB),
/// images for the model (tens of MB at most) and source files through it.
pub const DEFAULT_MAX_READ_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Default bytes held for one tenant's clients.
pub const DEFAULT_MAX_OUTBOUND_BYTES: usize = 256 * 1024 * 1024;
/// Default bytes held of what one tenant's clients send: four messages of
/// the largest default size at once.
pub const DEFAULT_MAX_INBOUND_BYTES: usize = 64 * 1024 * 1024;
/// Bytes a base64 `fs/readFile` result of `len` file bytes takes on the wire.
pub fn read_file_reply_bytes(len: u64) -> u64 {
    len.div_ceil(3).saturating_mul(4).saturating_add(96)
}

fn default_base_env(home: &Path) -> HashMap<String, String> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("LANG", "C.UTF-8"),
        (
            "SHELL",
            if Path::new("/bin/bash").exists() {
                "/bin/bash"
            } else {
                "/bin/sh"
            },
        ),
        ("TMPDIR", "/tmp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .chain([("HOME".to_owned(), home.display().to_string())])
    .collect()
}

pub(super) fn validate_tenant(
    name: &str,
    t: TenantConfig,
    uid_policy: LayerPolicy,
) -> Result<TenantSettings, ConfigError> {
    validate_tenant_at(name, t, uid_policy, true)
}

/// [`validate_tenant`]; a templated tenant's root may not exist yet
/// (`root_exists` false): it is made on first use.
pub(super) fn validate_tenant_at(
    name: &str,
    t: TenantConfig,
    uid_policy: LayerPolicy,
    root_exists: bool,
) -> Result<TenantSettings, ConfigError> {
    check_name(name)?;
    let root = t
        .root
        .ok_or_else(|| ConfigError(format!("tenants.{name}.root is required")))?;
    if !root.is_absolute() {
        return Err(ConfigError(format!(
            "tenants.{name}.root must be absolute: {}",
            root.display()
        )));
    }
    if root_exists && !root.is_dir() {
        return Err(ConfigError(format!(
            "tenants.{name}.root is not a directory: {}",
            root.display()
        )));
    }
    let root = crate::fs::normalize(&root);
    if t.uid == Some(0) || t.gid == Some(0) {
        return Err(ConfigError(format!(
            "tenants.{name}: uid and gid must not be 0 (root)"
        )));
    }
    let uid = match (t.uid, uid_policy) {
        (_, LayerPolicy::Off) => None,
        (Some(u), _) => Some((u, t.gid.unwrap_or(u))),
        (None, LayerPolicy::Required) if root_exists => {
            return Err(ConfigError(format!(
                "tenants.{name}.uid is required by [isolation] uid = \"required\""
            )));
        }
        (None, LayerPolicy::Optional | LayerPolicy::Required) => None,
    };
    for p in t.landlock_read.iter().chain(&t.landlock_write) {
        if !p.is_absolute() {
            return Err(ConfigError(format!(
                "tenants.{name}: landlock paths must be absolute: {}",
                p.display()
            )));
        }
    }
    let rps = t.requests_per_second.unwrap_or(200);
    if rps == 0 {
        return Err(ConfigError(format!(
            "tenants.{name}.requests_per_second must be at least 1"
        )));
    }
    let p = |field: &str, v: Option<usize>, d: usize| {
        positive(&format!("tenants.{name}.{field}"), v, d)
    };
    let max_outbound_bytes = p(
        "max_outbound_bytes",
        t.max_outbound_bytes,
        DEFAULT_MAX_OUTBOUND_BYTES,
    )?;
    let max_read_file_bytes = t
        .max_read_file_bytes
        .unwrap_or(DEFAULT_MAX_READ_FILE_BYTES)
        .min(MAX_READ_FILE_LIMIT);
    if read_file_reply_bytes(max_read_file_bytes) > max_outbound_bytes as u64 {
        return Err(ConfigError(format!(
            "tenants.{name}: an fs/readFile reply of max_read_file_bytes ({max_read_file_bytes}) takes {} bytes base64, more than max_outbound_bytes ({max_outbound_bytes})",
            read_file_reply_bytes(max_read_file_bytes)
        )));
    }
    // A secret the egress proxy puts in needs the proxy (checked below).
    let substituting = t
        .secrets
        .iter()
        .find(|(_, s)| s.substitute)
        .map(|(n, _)| n.clone());
    Ok(TenantSettings {
        name: name.to_owned(),
        base_env: t.base_env.unwrap_or_else(|| default_base_env(&root)),
        root: (root != Path::new("/")).then_some(root),
        max_sessions: p("max_sessions", t.max_sessions, 64)?,
        max_processes: p("max_processes", t.max_processes, 128)?,
        requests_per_second: rps,
        burst: t.burst.unwrap_or(rps.saturating_mul(2)).max(1),
        max_in_flight: p("max_in_flight", t.max_in_flight, 64)?,
        max_retained_output_bytes: p(
            "max_retained_output_bytes",
            t.max_retained_output_bytes,
            256 * 1024 * 1024,
        )?,
        max_outbound_bytes,
        max_inbound_bytes: p(
            "max_inbound_bytes",
            t.max_inbound_bytes,
            DEFAULT_MAX_INBOUND_BYTES,
        )?,
        max_read_file_bytes,
        max_connections: p("max_connections", t.max_connections, 1024)?,
        max_streams: p("max_streams", t.max_streams, 64)?,
        max_open_files: p("max_open_files", t.max_open_files, 256)?,
        max_tmp_bytes: bytes_at_least(
            name,
            "max_tmp_bytes",
            t.max_tmp_bytes.unwrap_or(DEFAULT_MAX_TMP_BYTES),
        )?,
        max_disk_bytes: bytes_at_least(
            name,
            "max_disk_bytes",
            t.max_disk_bytes.unwrap_or(DEFAULT_MAX_DISK_BYTES),
        )?,
        cgroup_limits: CgroupLimits {
            pids_max: Some(t.pids_max.unwrap_or(4096)),
            memory_max_bytes: Some(t.memory_max_bytes.unwrap_or(DEFAULT_TENANT_MEMORY_BYTES)),
            cpu_shares: Some(t.cpu_shares.unwrap_or(1024).max(2)),
            cpu_quota_us: match t.cpu_max_cores {
                None => None,
                Some(c) if c.is_finite() && (0.01..=1024.0).contains(&c) => {
                    Some((c * CPU_PERIOD_US as f64) as u64)
                }
                Some(c) => {
                    return Err(ConfigError(format!(
                        "tenants.{name}.cpu_max_cores must be between 0.01 and 1024, got {c}"
                    )));
                }
            },
        },
        uid,
        uid_allocated: false,
        workers_min: t.workers_min.unwrap_or(1).clamp(1, 64),
        workers_max: t
            .workers_max
            .unwrap_or(4)
            .clamp(1, 64)
            .max(t.workers_min.unwrap_or(1)),
        landlock_read: t.landlock_read,
        landlock_write: t.landlock_write,
        network: t.network,
        secrets: super::secrets::validate_secrets(name, t.secrets)?,
        http_ca_file: match t.http_ca_file {
            Some(p) if !p.is_absolute() => {
                return Err(ConfigError(format!(
                    "tenants.{name}.http_ca_file must be an absolute path"
                )));
            }
            other => other,
        },
        egress: {
            if t.egress.is_some() && matches!(t.network, Some(Network::Host | Network::None)) {
                return Err(ConfigError(format!(
                    "tenants.{name}.egress applies to network = \"isolated\" only"
                )));
            }
            let egress_written = t.egress.is_some();
            let mut e = validate_egress(name, t.egress)?;
            if let Some(n) = t.max_egress_connections {
                if matches!(t.network, Some(Network::Host | Network::None)) {
                    return Err(ConfigError(format!(
                        "tenants.{name}.max_egress_connections applies to network = \"isolated\" only"
                    )));
                }
                if n == 0 || n > MAX_EGRESS_CONNECTIONS {
                    return Err(ConfigError(format!(
                        "tenants.{name}.max_egress_connections = {n}: needs 1 to {MAX_EGRESS_CONNECTIONS}"
                    )));
                }
                e.max_connections = n;
            }
            if let Some(names) = &t.egress_names {
                if matches!(t.network, Some(Network::Host | Network::None)) {
                    return Err(ConfigError(format!(
                        "tenants.{name}.egress_names applies to network = \"isolated\" only"
                    )));
                }
                if e.internet && egress_written {
                    return Err(ConfigError(format!(
                        "tenants.{name}: egress = \"internet\" already allows every public address, so egress_names would narrow nothing: keep one of them"
                    )));
                }
                // Names replace the default "internet".
                e.internet = false;
                e.names = Some(super::egress::validate_names(name, names)?);
            }
            if e.names.is_none()
                && let Some(secret) = &substituting
            {
                return Err(ConfigError(format!(
                    "tenants.{name}.secrets.{secret}.substitute needs egress_names (the value is put in by the egress proxy)"
                )));
            }
            if t.egress_unlisted == Some(Unlisted::Ask) {
                if e.names.is_none() {
                    return Err(ConfigError(format!(
                        "tenants.{name}.egress_unlisted = \"ask\" needs egress_names (what is listed is not asked)"
                    )));
                }
                e.ask = true;
            }
            e
        },
        placement: match (t.placement, &t.pool) {
            (Some(Placement::Local) | None, None) => Placement::Local,
            (Some(p), None) => {
                return Err(ConfigError(format!(
                    "tenants.{name}.placement = {p:?} needs tenants.{name}.pool"
                )));
            }
            (Some(p), Some(_)) => p,
            (None, Some(_)) => Placement::Remote,
        },
        pool_labels: {
            if t.pool_labels.len() > MAX_EXECUTOR_LABELS {
                return Err(ConfigError(format!(
                    "tenants.{name}.pool_labels: at most {MAX_EXECUTOR_LABELS} labels"
                )));
            }
            t.pool_labels
        },
        pool: t.pool,
        image: t
            .image
            .as_deref()
            .map(super::images::ImageSource::parse)
            .transpose()
            .map_err(|e| ConfigError(format!("tenants.{name}.image: {e}")))?,
        images: t
            .images
            .iter()
            .map(|i| super::images::ImagePattern::parse(i))
            .collect::<Result<_, _>>()
            .map_err(|e| ConfigError(format!("tenants.{name}.images: {e}")))?,
    })
}

/// A tenant name: letters, digits, '-', '_' or '.', and not reserved.
pub(super) fn check_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(ConfigError(format!(
            "tenant name `{name}`: use letters, digits, '-', '_' or '.'"
        )));
    }
    match reserved_name(name) {
        Some(why) => Err(ConfigError(format!("tenant name `{name}`: {why}"))),
        None => Ok(()),
    }
}

/// Why `name` cannot be a tenant's even in the allowed characters: it
/// would be read as an option (a leading `-`), be `.` or `..` or hidden
/// (a leading `.`), or name a cgroup control file where tenants' cgroups
/// are made (`tasks`, `cgroup.procs`, `memory.max`...).
fn reserved_name(name: &str) -> Option<&'static str> {
    const CGROUP_FILES: &[&str] = &["tasks", "notify_on_release", "release_agent"];
    const CONTROLLERS: &[&str] = &[
        "cgroup",
        "cpu",
        "cpuacct",
        "cpuset",
        "memory",
        "pids",
        "io",
        "blkio",
        "devices",
        "freezer",
        "hugetlb",
        "rdma",
        "misc",
        "net_cls",
        "net_prio",
        "perf_event",
    ];
    if name.starts_with('-') {
        return Some("may not start with '-'");
    }
    if name.starts_with('.') {
        return Some("may not start with '.'");
    }
    if CGROUP_FILES.contains(&name)
        || name
            .split_once('.')
            .is_some_and(|(prefix, _)| CONTROLLERS.contains(&prefix))
    {
        return Some("names a cgroup control file");
    }
    None
}

/// Labels an executor may register with (and a tenant may require).
pub const MAX_EXECUTOR_LABELS: usize = 32;

/// Tenant roots must be disjoint: a root inside (or equal to) another
/// tenant's would hand one tenant the other's files, and the gateway's
/// state directory (every tenant's private /tmp) must lie in no root.
pub(super) fn refuse_nested_roots(
    tenants: &BTreeMap<String, TenantSettings>,
) -> Result<(), ConfigError> {
    let mut roots: Vec<(PathBuf, &String)> = tenants
        .iter()
        .filter_map(|(n, t)| {
            let r = t.root.as_ref()?;
            Some((r.canonicalize().unwrap_or_else(|_| r.clone()), n))
        })
        .collect();
    // In component order a root's descendants follow it directly: two
    // overlap only if some root is a prefix of (or equal to) the next.
    roots.sort();
    for pair in roots.windows(2) {
        let [(ra, a), (rb, b)] = pair else { continue };
        if rb.starts_with(ra) {
            return Err(ConfigError(format!(
                "tenants.{a}.root {} and tenants.{b}.root {} overlap; tenant roots must be disjoint",
                ra.display(),
                rb.display()
            )));
        }
    }
    if let Ok(state) = state_dir() {
        let state = state.canonicalize().unwrap_or(state);
        if let Some((ra, a)) = roots.iter().find(|(r, _)| state.starts_with(r)) {
            return Err(ConfigError(format!(
                "tenants.{a}.root {} holds the gateway's state directory {}; choose another root or set XDG_STATE_HOME",
                ra.display(),
                state.display()
            )));
        }
    }
    Ok(())
}

impl TenantSettings {
    /// Where the tenant may write, resolved: its root (none for `/`, which
    /// means unconfined) and its extra Landlock write paths. A gateway file
    /// there is the tenant's to read or rewrite.
    pub fn writable_dirs(&self) -> Vec<PathBuf> {
        self.root
            .iter()
            .chain(self.landlock_write.iter())
            .map(|p| p.canonicalize().unwrap_or_else(|_| crate::fs::normalize(p)))
            .collect()
    }
}
