//! Configuration: raw TOML (`Config`, unknown keys rejected) validated into
//! `Settings` (durations parsed, key files read, roots checked). Every field
//! documents its default. Without a file, [`Config::embedded`] serves one
//! tenant `default` on loopback with an HS256 key kept in the state directory.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A configuration problem: printed as one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Raw configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub exec: ExecConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    /// Tenants by name. At least one is required.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    #[serde(default)]
    pub isolation: IsolationConfig,
    #[serde(default)]
    pub fleet: FleetConfig,
    #[serde(default)]
    pub executors: ExecutorsConfig,
}

/// `[executors]`: the registry remote executors join (docs/executors.md).
/// Off unless a pool is configured.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorsConfig {
    /// Base of the rendezvous URLs handed to executors, `ws://` or
    /// `wss://HOST[:PORT]` as executors reach the gateway (the load
    /// balancer). Default: `ws://` and the registration's `Host` header.
    pub public_url: Option<String>,
    /// How long a rendezvous URL stays valid (it is also single use).
    /// Default 30 s.
    pub ticket_ttl: Option<String>,
    /// How long the gateway waits for an executor to answer `initialize`
    /// when a session opens on it. Default 10 s.
    pub open_timeout: Option<String>,
    /// Pools by name; a tenant names the one its sessions run on.
    #[serde(default)]
    pub pools: BTreeMap<String, PoolConfig>,
}

/// `[executors.pools.NAME]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Executors (distinct ids) in the pool at once; past it a
    /// registration gets 429. Default 64.
    pub max_executors: Option<usize>,
    /// Links (registrations) one executor may hold at once. Default 16.
    pub max_links_per_executor: Option<usize>,
    /// Links over the whole pool (each may hold up to
    /// `server.max_message_bytes` in the gateway). Default 256.
    pub max_links: Option<usize>,
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

/// Validated `[executors]`.
#[derive(Debug, Clone)]
pub struct ExecutorsSettings {
    pub public_url: Option<String>,
    pub ticket_ttl: Duration,
    pub open_timeout: Duration,
    pub pools: BTreeMap<String, PoolSettings>,
}

/// Validated `[executors.pools.NAME]`.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub name: String,
    /// The one tenant whose sessions it serves (pools are never shared:
    /// an executor would see every tenant's files).
    pub tenant: String,
    pub max_executors: usize,
    pub max_links_per_executor: usize,
    pub max_links: usize,
}

/// Longest executor id: it is part of session ids and metric labels.
pub const MAX_EXECUTOR_ID_BYTES: usize = 64;

/// An executor id: ASCII letters, digits, `_` and `-`, at most
/// [`MAX_EXECUTOR_ID_BYTES`] (no `.`: session ids split on it).
pub fn is_executor_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_EXECUTOR_ID_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn validate_executors(
    e: ExecutorsConfig,
    tenants: &BTreeMap<String, TenantSettings>,
) -> Result<Option<ExecutorsSettings>, ConfigError> {
    let mut users: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, t) in tenants {
        if let Some(pool) = &t.pool {
            if !e.pools.contains_key(pool) {
                return Err(ConfigError(format!(
                    "tenants.{name}.pool: no [executors.pools.{pool}] is configured"
                )));
            }
            users.entry(pool).or_default().push(name);
        }
    }
    for (pool, names) in &users {
        if names.len() > 1 {
            return Err(ConfigError(format!(
                "executors.pools.{pool} is named by tenants {}: a pool serves one tenant (its executors would see every tenant's processes and files)",
                names.join(", ")
            )));
        }
    }
    if e.pools.is_empty() {
        if e.public_url.is_some() {
            return Err(ConfigError(
                "executors.public_url is set but no [executors.pools.NAME] is configured"
                    .to_owned(),
            ));
        }
        return Ok(None);
    }
    if let Some(u) = &e.public_url {
        let parsed = url::Url::parse(u)
            .map_err(|err| ConfigError(format!("executors.public_url `{u}`: {err}")))?;
        if !matches!(parsed.scheme(), "ws" | "wss")
            || parsed.host_str().is_none()
            || parsed.query().is_some()
        {
            return Err(ConfigError(format!(
                "executors.public_url `{u}`: expected ws://HOST[:PORT][/PATH] or wss://..."
            )));
        }
    }
    let mut pools = BTreeMap::new();
    for (name, p) in e.pools {
        if !is_executor_id(&name) {
            return Err(ConfigError(format!(
                "executors.pools.{name}: a pool name is letters, digits, `_` and `-`"
            )));
        }
        let Some(tenant) = users.get(name.as_str()).and_then(|v| v.first()) else {
            return Err(ConfigError(format!(
                "executors.pools.{name}: no tenant names this pool (set tenants.NAME.pool)"
            )));
        };
        pools.insert(
            name.clone(),
            PoolSettings {
                tenant: (*tenant).to_owned(),
                max_executors: positive(
                    &format!("executors.pools.{name}.max_executors"),
                    p.max_executors,
                    64,
                )?,
                max_links_per_executor: positive(
                    &format!("executors.pools.{name}.max_links_per_executor"),
                    p.max_links_per_executor,
                    16,
                )?,
                max_links: positive(
                    &format!("executors.pools.{name}.max_links"),
                    p.max_links,
                    256,
                )?,
                name,
            },
        );
    }
    Ok(Some(ExecutorsSettings {
        public_url: e.public_url.map(|u| u.trim_end_matches('/').to_owned()),
        ticket_ttl: duration(
            "executors.ticket_ttl",
            e.ticket_ttl.as_deref(),
            Duration::from_secs(30),
        )?,
        open_timeout: duration(
            "executors.open_timeout",
            e.open_timeout.as_deref(),
            Duration::from_secs(10),
        )?,
        pools,
    }))
}

/// `[fleet]`: this replica's place in a fleet of gateways behind a load
/// balancer (docs/fleet.md). Off unless `replica` is set (here or by
/// `EXEC_GATEWAY_REPLICA`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// This replica's id: a DNS label, e.g. the StatefulSet pod name.
    pub replica: Option<String>,
    /// The peer listener (replica to replica). Default `0.0.0.0:9470`.
    pub listen: Option<String>,
    /// The shared fleet key (at least 32 bytes): peers prove membership
    /// with tokens signed by it. Required in fleet mode.
    pub key_file: Option<PathBuf>,
    /// How to reach a peer: `{replica}` is replaced by its id, e.g.
    /// `{replica}.exec-gateway-peers.exec-gateway.svc.cluster.local:9470`.
    pub peer_address: Option<String>,
    /// Or a static map from replica id to `HOST:PORT`.
    #[serde(default)]
    pub peers: BTreeMap<String, String>,
    /// How long connecting to a peer may take. Default 2 s.
    pub dial_timeout: Option<String>,
}

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
    pub cgroup_version: CgroupVersion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerPolicy {
    Required,
    Optional,
    Off,
}

/// `[server]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Websocket listener, `ws://IP:PORT`. Default: `ws://127.0.0.1:8765`.
    pub listen: Option<String>,
    /// gRPC listener, `HOST:PORT`. Default: none.
    pub grpc_listen: Option<String>,
    /// How long a disconnected session waits for a resume. Default: each
    /// revision's reference (`10s` for 0.130.0 sessions, `80s` for 0.169.0).
    pub detach_ttl: Option<String>,
    /// Authenticated websocket connections. Default: 16384, lowered to
    /// what the open-file limit allows when not set.
    pub max_connections: Option<usize>,
    /// Sessions in the registry over all tenants. Default: 16384.
    pub max_sessions: Option<usize>,
    /// Concurrent requests per connection. Default: 64.
    pub max_in_flight_per_connection: Option<usize>,
    /// Concurrent requests in the gateway before shedding. Default: 4096.
    pub max_in_flight: Option<usize>,
    /// Deadline of one request (a read gets its `waitMs` on top). Default: `60s`.
    pub request_timeout: Option<String>,
    /// Largest inbound message (websocket message or stdio line). Default: 16 MiB.
    pub max_message_bytes: Option<usize>,
    /// A client whose writes stall this long is disconnected. Default: `30s`.
    pub slow_client_timeout: Option<String>,
    /// A websocket connection older than this (plus up to 10% jitter) is
    /// closed with 1001 and its session detached: the client resumes it,
    /// through the balancer, on any replica. Spreads long-lived connections
    /// over replicas added since, and makes a client present its token
    /// again. Default: none.
    pub max_connection_age: Option<String>,
    /// On SIGTERM, how long running processes may finish before being killed. Default: `5s`.
    pub shutdown_grace: Option<String>,
    /// `Origin` values a websocket upgrade may carry. Exec-server clients
    /// send none; a browser always does, so by default any `Origin` is
    /// refused (403): a web page cannot drive the gateway with a token it
    /// got hold of. Default: none.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Admin listener (`/metrics`, `/readyz` with details), `HOST:PORT`, or
    /// `off`. Default: `127.0.0.1:9465`. A non-loopback address needs
    /// `admin_token_file`.
    pub admin_listen: Option<String>,
    /// File holding the bearer token the admin listener requires (at least
    /// 32 bytes). Default: none (loopback only, no token).
    pub admin_token_file: Option<PathBuf>,
    /// Time from accept to an authenticated request (websocket upgrade or
    /// first authenticated gRPC call); the connection is closed after it.
    /// Covers the HTTP head and the HTTP/2 preface. Default: `10s`.
    pub handshake_timeout: Option<String>,
    /// Connections not yet authenticated, over both doors. Default: 1024.
    pub max_unauthenticated: Option<usize>,
    /// Connections not yet authenticated from one source address. Default: 32.
    pub max_unauthenticated_per_source: Option<usize>,
    /// Authenticated gRPC connections. Default: 4096.
    pub grpc_max_connections: Option<usize>,
}

/// `[exec]`: gateway-wide process settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Running processes over all tenants; past it, starts are shed (-32001). Default: 4096.
    pub max_processes: Option<usize>,
    /// How long a closed process stays readable (and its id taken).
    /// Default: each revision's reference (`30s` for 0.130.0, `80s` for 0.169.0).
    pub exited_retention: Option<String>,
}

/// `[auth]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Claim naming the tenant. Default: `tenant`.
    pub tenant_claim: Option<String>,
    /// Claim holding scopes, space-separated or an array. Default: `scope`.
    pub scopes_claim: Option<String>,
    /// Claim naming the executor pool in an executor credential (a token
    /// with the `executor` scope). Default: `pool`.
    pub pool_claim: Option<String>,
    /// When set, tokens must carry this `iss`.
    pub issuer: Option<String>,
    /// When set, tokens must carry this `aud`.
    pub audience: Option<String>,
    /// Clock skew allowed on `exp`/`nbf`, at most `30s`. Default: `5s`.
    pub leeway: Option<String>,
    /// Minimum time between JWKS refreshes caused by an unknown `kid`. Default: `30s`.
    pub jwks_refresh_interval: Option<String>,
    /// Time allowed for one JWKS fetch (connect, headers and body). Default: `5s`.
    pub jwks_fetch_timeout: Option<String>,
    /// How long a handshake naming an unknown `kid` waits for a JWKS refresh
    /// before it is refused. Default: `1s`.
    pub jwks_unknown_kid_wait: Option<String>,
    /// Verification keys; the algorithm always comes from here, never from a token.
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
}

/// `[[auth.keys]]`: exactly one of the four sources.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// HS256/384/512, RS256/384/512, PS256, ES256/384, EdDSA.
    pub algorithm: String,
    /// Key id; a token naming a `kid` must match it.
    pub kid: Option<String>,
    /// HS*: the secret is the file's bytes, one trailing newline trimmed, ≥ 32 bytes.
    pub secret_file: Option<PathBuf>,
    /// RS*/PS*/ES*/EdDSA: a PEM public key.
    pub public_key_file: Option<PathBuf>,
    /// A JWK set on disk.
    pub jwks_file: Option<PathBuf>,
    /// A JWK set fetched over HTTP(S), cached by `kid`.
    pub jwks_url: Option<String>,
    /// Bind this key to one tenant: its tokens may omit the tenant claim
    /// (Codex's own `signed-bearer-token` JWTs carry none) and may not name
    /// another tenant. Default: none (the tenant claim is required).
    pub tenant: Option<String>,
    /// With `tenant`: the scopes of tokens that carry no scope claim.
    /// Default: every scope.
    pub scopes: Option<Vec<String>>,
}

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
    /// `host` (default) or `none`: a network namespace with only loopback
    /// (needs the namespaces layer; refused at start when it is inactive).
    pub network: Option<Network>,
    /// The executor pool (`[executors.pools.NAME]`) the tenant's sessions
    /// may run on. Default: none.
    pub pool: Option<String>,
    /// Only executors whose registration carries all these labels.
    #[serde(default)]
    pub pool_labels: BTreeMap<String, String>,
    /// `local`, `remote` or `prefer-remote`. Default:
    /// `remote` with a pool, else `local`.
    pub placement: Option<Placement>,
}

/// A tenant's network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    Host,
    None,
}

/// Validated gateway-wide settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub grpc_listen: Option<SocketAddr>,
    /// `None`: the session revision's.
    pub detach_ttl: Option<Duration>,
    pub max_connections: usize,
    pub max_sessions: usize,
    pub max_in_flight_per_connection: usize,
    pub max_in_flight: usize,
    pub request_timeout: Duration,
    pub max_message_bytes: usize,
    pub slow_client_timeout: Duration,
    pub max_connection_age: Option<Duration>,
    pub shutdown_grace: Duration,
    pub allowed_origins: Vec<String>,
    /// `None`: no admin listener.
    pub admin_listen: Option<SocketAddr>,
    pub admin_token: Option<AdminToken>,
    pub handshake_timeout: Duration,
    pub max_unauthenticated: usize,
    pub max_unauthenticated_per_source: usize,
    pub grpc_max_connections: usize,
    /// Which descriptor-taking caps the file set: those are never lowered
    /// to fit the open-file limit (a start that cannot fit them is refused).
    pub caps_explicit: CapsExplicit,
    pub max_processes: usize,
    /// `None`: the session revision's.
    pub exited_retention: Option<Duration>,
    pub auth: AuthSettings,
    pub tenants: BTreeMap<String, TenantSettings>,
    pub isolation: IsolationSettings,
    /// `None`: a lone gateway.
    pub fleet: Option<FleetSettings>,
    /// `None`: no executor registry.
    pub executors: Option<ExecutorsSettings>,
}

/// Validated `[auth]`.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    pub tenant_claim: String,
    pub scopes_claim: String,
    pub pool_claim: String,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub leeway: Duration,
    pub jwks_refresh_interval: Duration,
    pub jwks_fetch_timeout: Duration,
    pub jwks_unknown_kid_wait: Duration,
    pub keys: Vec<KeySettings>,
}

/// A JWT signature algorithm a key may be configured with. The algorithm
/// of a verification always comes from here, never from a token's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyAlgorithm {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    PS256,
    ES256,
    ES384,
    EdDSA,
}

impl KeyAlgorithm {
    const ALL: [KeyAlgorithm; 10] = [
        KeyAlgorithm::HS256,
        KeyAlgorithm::HS384,
        KeyAlgorithm::HS512,
        KeyAlgorithm::RS256,
        KeyAlgorithm::RS384,
        KeyAlgorithm::RS512,
        KeyAlgorithm::PS256,
        KeyAlgorithm::ES256,
        KeyAlgorithm::ES384,
        KeyAlgorithm::EdDSA,
    ];

    /// The name as written in configuration and JWT headers.
    pub fn name(self) -> &'static str {
        match self {
            KeyAlgorithm::HS256 => "HS256",
            KeyAlgorithm::HS384 => "HS384",
            KeyAlgorithm::HS512 => "HS512",
            KeyAlgorithm::RS256 => "RS256",
            KeyAlgorithm::RS384 => "RS384",
            KeyAlgorithm::RS512 => "RS512",
            KeyAlgorithm::PS256 => "PS256",
            KeyAlgorithm::ES256 => "ES256",
            KeyAlgorithm::ES384 => "ES384",
            KeyAlgorithm::EdDSA => "EdDSA",
        }
    }

    pub fn parse(name: &str) -> Result<KeyAlgorithm, String> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| format!("unsupported algorithm `{name}`"))
    }

    /// A shared-secret (HMAC) algorithm rather than a public-key one.
    pub fn is_hmac(self) -> bool {
        matches!(
            self,
            KeyAlgorithm::HS256 | KeyAlgorithm::HS384 | KeyAlgorithm::HS512
        )
    }
}

/// Where a verification key comes from (exactly one source per key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// HS*: the file's bytes, one trailing newline trimmed.
    Secret(PathBuf),
    /// RS*/PS*/ES*/EdDSA: a PEM public key.
    PublicKey(PathBuf),
    /// A JWK set on disk.
    JwksFile(PathBuf),
    /// A JWK set fetched over HTTP(S), cached by `kid`.
    JwksUrl(String),
}

impl KeySource {
    /// The file behind the key, if it is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            KeySource::Secret(p) | KeySource::PublicKey(p) | KeySource::JwksFile(p) => Some(p),
            KeySource::JwksUrl(_) => None,
        }
    }
}

/// A validated `[[auth.keys]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySettings {
    pub algorithm: KeyAlgorithm,
    pub kid: Option<String>,
    pub source: KeySource,
    /// The tenant this key is bound to, if any (see [`KeyConfig::tenant`]).
    pub tenant: Option<String>,
    /// Scopes of a bound key's tokens that carry none (`None`: all).
    pub scopes: Option<Vec<String>>,
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
#[derive(Debug, Clone)]
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
    pub max_read_file_bytes: u64,
    pub max_connections: usize,
    pub max_streams: usize,
    pub max_open_files: usize,
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
    pub network: Network,
    pub pool: Option<String>,
    pub pool_labels: BTreeMap<String, String>,
    pub placement: Placement,
}

/// A tenant's memory limit when its config names none.
pub const DEFAULT_TENANT_MEMORY_BYTES: u64 = 4 << 30;

pub const DEFAULT_LISTEN: &str = "ws://127.0.0.1:8765";
/// Where `/metrics` and the detailed `/readyz` are served by default.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9465";
/// Highest `max_read_file_bytes` accepted (the reference server's limit).
pub const MAX_READ_FILE_LIMIT: u64 = 512 * 1024 * 1024;
/// Shortest accepted admin token.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;
/// Default `fs/readFile` limit: Codex reads instruction files (32 KiB),
/// images for the model (tens of MB at most) and source files through it.
pub const DEFAULT_MAX_READ_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Default bytes held for one tenant's clients.
pub const DEFAULT_MAX_OUTBOUND_BYTES: usize = 256 * 1024 * 1024;
/// Bytes a base64 `fs/readFile` result of `len` file bytes takes on the wire.
pub fn read_file_reply_bytes(len: u64) -> u64 {
    len.div_ceil(3).saturating_mul(4).saturating_add(96)
}

/// The admin listener's bearer token (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub Vec<u8>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}
/// Where replicas reach each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerDirectory {
    /// `HOST:PORT` per replica id.
    Static(BTreeMap<String, String>),
    /// A template with `{replica}`.
    Template(String),
}

/// The fleet key (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct FleetKey(pub Vec<u8>);

impl std::fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FleetKey(..)")
    }
}

/// Validated `[fleet]`.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    pub replica: String,
    pub listen: SocketAddr,
    pub key: FleetKey,
    pub peers: PeerDirectory,
    pub dial_timeout: Duration,
}

/// The peer listener's default address.
pub const DEFAULT_FLEET_LISTEN: &str = "0.0.0.0:9470";
/// Shortest accepted fleet key.
pub const MIN_FLEET_KEY_BYTES: usize = 32;

/// A replica id: a DNS label starting with a letter (RFC 1035), so that it
/// can name a pod and never reads as an address (`127`, `0x7f000001`).
pub fn is_replica_id(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn validate_fleet(f: FleetConfig) -> Result<Option<FleetSettings>, ConfigError> {
    let Some(replica) = f.replica else {
        if f.key_file.is_some() || f.peer_address.is_some() || !f.peers.is_empty() {
            return Err(ConfigError(
                "[fleet] is configured but this replica has no id: set fleet.replica or EXEC_GATEWAY_REPLICA".to_owned(),
            ));
        }
        return Ok(None);
    };
    if !is_replica_id(&replica) {
        return Err(ConfigError(format!(
            "fleet.replica `{replica}` is not a DNS label starting with a letter (lowercase letters, digits, `-`, at most 63)"
        )));
    }
    let key_file = f.key_file.ok_or_else(|| {
        ConfigError(
            "fleet.key_file is required in fleet mode: peers must prove they belong to the fleet"
                .to_owned(),
        )
    })?;
    let mut key = std::fs::read(&key_file).map_err(|e| {
        ConfigError(format!(
            "fleet.key_file: cannot read {}: {e}",
            key_file.display()
        ))
    })?;
    while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
        key.pop();
    }
    if key.len() < MIN_FLEET_KEY_BYTES {
        return Err(ConfigError(format!(
            "fleet.key_file: a fleet key needs at least {MIN_FLEET_KEY_BYTES} bytes"
        )));
    }
    let listen_text = f.listen.as_deref().unwrap_or(DEFAULT_FLEET_LISTEN);
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        ConfigError(format!(
            "fleet.listen: expected HOST:PORT, got `{listen_text}`"
        ))
    })?;
    let peers = match (f.peer_address, f.peers.is_empty()) {
        (Some(_), false) => {
            return Err(ConfigError(
                "fleet: set peer_address or [fleet.peers], not both".to_owned(),
            ));
        }
        (Some(t), true) => {
            if !t.contains("{replica}") {
                return Err(ConfigError(format!(
                    "fleet.peer_address `{t}` must contain `{{replica}}`"
                )));
            }
            PeerDirectory::Template(t)
        }
        (None, false) => {
            for name in f.peers.keys() {
                if !is_replica_id(name) {
                    return Err(ConfigError(format!(
                        "fleet.peers: `{name}` is not a DNS label"
                    )));
                }
            }
            PeerDirectory::Static(f.peers)
        }
        (None, true) => {
            return Err(ConfigError(
                "fleet: set peer_address (a DNS template) or [fleet.peers] (a static map)"
                    .to_owned(),
            ));
        }
    };
    let dial_timeout = duration(
        "fleet.dial_timeout",
        f.dial_timeout.as_deref(),
        Duration::from_secs(2),
    )?;
    Ok(Some(FleetSettings {
        replica,
        listen,
        key: FleetKey(key),
        peers,
        dial_timeout,
    }))
}

/// The name of the embedded configuration's tenant.
pub const DEFAULT_TENANT: &str = "default";
/// Largest leeway accepted on `exp`/`nbf`.
pub const MAX_LEEWAY: Duration = Duration::from_secs(30);
/// Shortest accepted HS* secret.
pub const MIN_HMAC_SECRET_BYTES: usize = 32;

/// Parse `ws://IP:PORT` with the reference's error texts.
pub fn parse_listen(url: &str) -> Result<SocketAddr, ConfigError> {
    let Some(rest) = url.strip_prefix("ws://") else {
        return Err(ConfigError(format!(
            "unsupported --listen URL `{url}`; expected `ws://IP:PORT` or `stdio`"
        )));
    };
    rest.trim_end_matches('/').parse().map_err(|_| {
        ConfigError(format!(
            "invalid websocket --listen URL `{url}`; expected `ws://IP:PORT`"
        ))
    })
}

fn duration(name: &str, value: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(v)
            .map_err(|e| ConfigError(format!("{name}: invalid duration `{v}`: {e}"))),
    }
}

fn optional_duration(name: &str, value: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    value
        .map(|v| duration(name, Some(v), Duration::ZERO))
        .transpose()
}

fn positive(name: &str, value: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match value.unwrap_or(default) {
        0 => Err(ConfigError(format!("{name} must be at least 1"))),
        n => Ok(n),
    }
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

/// `$XDG_STATE_HOME/exec-gateway`, else `~/.local/state/exec-gateway`.
pub fn state_dir() -> Result<PathBuf, ConfigError> {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("exec-gateway"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ConfigError("neither XDG_STATE_HOME nor HOME is set".to_owned()))?;
    Ok(PathBuf::from(home).join(".local/state/exec-gateway"))
}

/// The embedded default's HS256 key: created (32 random bytes, hex, mode
/// 0600) on first use, then reused.
pub fn default_key_file() -> Result<PathBuf, ConfigError> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = state_dir()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ConfigError(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join("hs256.key");
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ConfigError(format!("no randomness: {e}")))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(format!("{hex}\n").as_bytes())
                .map_err(|e| ConfigError(format!("cannot write {}: {e}", path.display())))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(ConfigError(format!(
                "cannot create {}: {e}",
                path.display()
            )));
        }
    }
    Ok(path)
}

impl Config {
    /// Read and parse a TOML file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("cannot read config {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            ConfigError(format!(
                "invalid config {}: {}",
                path.display(),
                e.to_string().replace('\n', " ").trim()
            ))
        })
    }

    /// The embedded default: tenant `default` rooted at `root`, HS256 key
    /// from the state directory, loopback listener.
    pub fn embedded(root: &Path) -> Result<Config, ConfigError> {
        let key = default_key_file()?;
        let mut tenants = BTreeMap::new();
        tenants.insert(
            DEFAULT_TENANT.to_owned(),
            TenantConfig {
                root: Some(root.to_path_buf()),
                ..TenantConfig::default()
            },
        );
        Ok(Config {
            auth: AuthConfig {
                keys: vec![KeyConfig {
                    algorithm: "HS256".to_owned(),
                    secret_file: Some(key),
                    ..KeyConfig::default()
                }],
                ..AuthConfig::default()
            },
            tenants,
            ..Config::default()
        })
    }

    /// Validate into settings.
    pub fn validate(self) -> Result<Settings, ConfigError> {
        let s = self.server;
        let listen = parse_listen(s.listen.as_deref().unwrap_or(DEFAULT_LISTEN))?;
        let grpc_listen = match &s.grpc_listen {
            None => None,
            Some(a) => Some(a.parse().map_err(|_| {
                ConfigError(format!("server.grpc_listen: expected HOST:PORT, got `{a}`"))
            })?),
        };
        let auth = validate_auth(self.auth)?;
        for (i, k) in auth.keys.iter().enumerate() {
            if let Some(t) = &k.tenant
                && !self.tenants.contains_key(t)
            {
                return Err(ConfigError(format!(
                    "auth.keys[{i}]: tenant `{t}` is not configured"
                )));
            }
        }
        if self.tenants.is_empty() {
            return Err(ConfigError(
                "no tenants configured: add at least one [tenants.NAME] with a root".to_owned(),
            ));
        }
        let layer = |p: Option<LayerPolicy>| p.unwrap_or(LayerPolicy::Optional);
        let isolation = IsolationSettings {
            workers: layer(self.isolation.workers),
            cgroups: layer(self.isolation.cgroups),
            landlock: layer(self.isolation.landlock),
            seccomp: layer(self.isolation.seccomp),
            uid: layer(self.isolation.uid),
            namespaces: layer(self.isolation.namespaces),
            cgroup_version: self.isolation.cgroup_version.unwrap_or_default(),
        };
        let mut tenants = BTreeMap::new();
        for (name, t) in self.tenants {
            tenants.insert(name.clone(), validate_tenant(&name, t, isolation.uid)?);
        }
        if nix::unistd::geteuid().is_root() {
            if isolation.uid == LayerPolicy::Off {
                return Err(ConfigError(
                    "[isolation] uid = \"off\" is refused when the gateway runs as root: tenant processes would run as uid 0".to_owned(),
                ));
            }
            allocate_uids(
                &mut tenants,
                self.isolation.uid_range.unwrap_or(DEFAULT_UID_RANGE),
                &HostIds,
            )?;
        }
        let keys = key_files(&auth.keys);
        for (name, t) in &tenants {
            refuse_exposed_keys(name, t, &keys)?;
        }
        refuse_nested_roots(&tenants)?;
        let caps_explicit = CapsExplicit {
            connections: s.max_connections.is_some(),
            grpc: s.grpc_max_connections.is_some(),
            unauthenticated: s.max_unauthenticated.is_some(),
            processes: self.exec.max_processes.is_some(),
        };
        let (admin_listen, admin_token) = validate_admin(&s)?;
        let fleet = validate_fleet(self.fleet)?;
        let executors = validate_executors(self.executors, &tenants)?;
        Ok(Settings {
            listen,
            grpc_listen,
            detach_ttl: optional_duration("server.detach_ttl", s.detach_ttl.as_deref())?,
            max_connections: positive("server.max_connections", s.max_connections, 16384)?,
            max_sessions: positive("server.max_sessions", s.max_sessions, 16384)?,
            max_in_flight_per_connection: positive(
                "server.max_in_flight_per_connection",
                s.max_in_flight_per_connection,
                64,
            )?,
            max_in_flight: positive("server.max_in_flight", s.max_in_flight, 4096)?,
            request_timeout: duration(
                "server.request_timeout",
                s.request_timeout.as_deref(),
                Duration::from_secs(60),
            )?,
            max_message_bytes: positive(
                "server.max_message_bytes",
                s.max_message_bytes,
                16 * 1024 * 1024,
            )?,
            slow_client_timeout: duration(
                "server.slow_client_timeout",
                s.slow_client_timeout.as_deref(),
                Duration::from_secs(30),
            )?,
            max_connection_age: match optional_duration(
                "server.max_connection_age",
                s.max_connection_age.as_deref(),
            )? {
                Some(d) if d < Duration::from_secs(1) => {
                    return Err(ConfigError(
                        "server.max_connection_age: at least 1s".to_owned(),
                    ));
                }
                d => d,
            },
            shutdown_grace: duration(
                "server.shutdown_grace",
                s.shutdown_grace.as_deref(),
                Duration::from_secs(5),
            )?,
            allowed_origins: s.allowed_origins,
            admin_listen,
            admin_token,
            handshake_timeout: duration(
                "server.handshake_timeout",
                s.handshake_timeout.as_deref(),
                Duration::from_secs(10),
            )?,
            max_unauthenticated: positive(
                "server.max_unauthenticated",
                s.max_unauthenticated,
                1024,
            )?,
            max_unauthenticated_per_source: positive(
                "server.max_unauthenticated_per_source",
                s.max_unauthenticated_per_source,
                32,
            )?,
            grpc_max_connections: positive(
                "server.grpc_max_connections",
                s.grpc_max_connections,
                4096,
            )?,
            caps_explicit,
            max_processes: positive("exec.max_processes", self.exec.max_processes, 4096)?,
            exited_retention: optional_duration(
                "exec.exited_retention",
                self.exec.exited_retention.as_deref(),
            )?,
            auth,
            tenants,
            isolation,
            fleet,
            executors,
        })
    }
}

fn validate_auth(a: AuthConfig) -> Result<AuthSettings, ConfigError> {
    let leeway = duration("auth.leeway", a.leeway.as_deref(), Duration::from_secs(5))?;
    if leeway > MAX_LEEWAY {
        return Err(ConfigError(format!(
            "auth.leeway must be at most {}s",
            MAX_LEEWAY.as_secs()
        )));
    }
    if a.keys.is_empty() {
        return Err(ConfigError(
            "auth.keys is empty: configure at least one [[auth.keys]] (the gateway never runs unauthenticated)".to_owned(),
        ));
    }
    let keys = a
        .keys
        .into_iter()
        .enumerate()
        .map(|(i, k)| validate_key(k).map_err(|e| ConfigError(format!("auth.keys[{i}]: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AuthSettings {
        tenant_claim: a.tenant_claim.unwrap_or_else(|| "tenant".to_owned()),
        scopes_claim: a.scopes_claim.unwrap_or_else(|| "scope".to_owned()),
        pool_claim: a.pool_claim.unwrap_or_else(|| "pool".to_owned()),
        issuer: a.issuer,
        audience: a.audience,
        leeway,
        jwks_refresh_interval: duration(
            "auth.jwks_refresh_interval",
            a.jwks_refresh_interval.as_deref(),
            Duration::from_secs(30),
        )?,
        jwks_fetch_timeout: duration(
            "auth.jwks_fetch_timeout",
            a.jwks_fetch_timeout.as_deref(),
            Duration::from_secs(5),
        )?,
        jwks_unknown_kid_wait: duration(
            "auth.jwks_unknown_kid_wait",
            a.jwks_unknown_kid_wait.as_deref(),
            Duration::from_secs(1),
        )?,
        keys,
    })
}

/// Descriptors kept for everything but connections and process pipes
/// (listeners, key files, the reaper, cgroup files, logs).
pub const FD_RESERVE: u64 = 256;
/// Descriptors one running process may hold in the gateway (stdin, stdout,
/// stderr, pidfd).
pub const FDS_PER_PROCESS: u64 = 4;
/// Descriptors a worker holds in the gateway (its link socket and pidfd).
pub const FDS_PER_WORKER: u64 = 2;

/// See [`Settings::caps_explicit`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapsExplicit {
    pub connections: bool,
    pub grpc: bool,
    pub unauthenticated: bool,
    pub processes: bool,
}

impl Settings {
    /// (descriptors of each cap, set in the file): websocket, gRPC,
    /// unauthenticated, processes.
    fn fd_caps(&self) -> [(u64, bool); 4] {
        let e = self.caps_explicit;
        let grpc = if self.grpc_listen.is_some() {
            self.grpc_max_connections as u64
        } else {
            0
        };
        [
            (self.max_connections as u64, e.connections),
            (grpc, e.grpc),
            (self.max_unauthenticated as u64, e.unauthenticated),
            (FDS_PER_PROCESS * self.max_processes as u64, e.processes),
        ]
    }

    /// Descriptors not scaled by the caps: the reserve, workers, and each
    /// tenant's `fs/open` handles and gRPC streams (each holds a file).
    fn reserved_fds(&self) -> u64 {
        let tenants: u64 = self
            .tenants
            .values()
            .map(|t| {
                t.workers_max as u64 * FDS_PER_WORKER
                    + t.max_open_files as u64
                    + t.max_streams as u64
            })
            .sum();
        FD_RESERVE + tenants
    }

    /// Descriptors the caps may take at once.
    pub fn fds_needed(&self) -> u64 {
        self.reserved_fds() + self.fd_caps().iter().map(|(n, _)| n).sum::<u64>()
    }

    /// Fit the connection and process caps into `limit` open files. Caps
    /// set in the file are kept, and a start they cannot fit is refused;
    /// caps left at their defaults are lowered in proportion to fit (the
    /// returned text says to what).
    pub fn fit_fd_limit(&mut self, limit: u64) -> Result<Option<String>, ConfigError> {
        let need = self.fds_needed();
        if need <= limit {
            return Ok(None);
        }
        let caps = self.fd_caps();
        let fixed: u64 =
            self.reserved_fds() + caps.iter().filter(|c| c.1).map(|c| c.0).sum::<u64>();
        let flexible: u64 = caps.iter().filter(|c| !c.1).map(|c| c.0).sum();
        // Room for at least a few of each defaulted cap.
        if flexible == 0 || limit < fixed + 64 {
            return Err(ConfigError(format!(
                "connection and process caps need up to {need} open files (server.max_connections {} + server.grpc_max_connections {} + server.max_unauthenticated {} + {FDS_PER_PROCESS} x exec.max_processes {} + {} for the reserve, workers, max_open_files and max_streams) but RLIMIT_NOFILE allows {limit}: lower them or raise the limit",
                self.max_connections,
                caps[1].0,
                self.max_unauthenticated,
                self.max_processes,
                self.reserved_fds()
            )));
        }
        let room = (limit - fixed) as f64 / flexible as f64;
        let scale = |n: usize, explicit: bool| {
            if explicit {
                n
            } else {
                ((n as f64 * room) as usize).max(1)
            }
        };
        let e = self.caps_explicit;
        self.max_connections = scale(self.max_connections, e.connections);
        self.grpc_max_connections = scale(self.grpc_max_connections, e.grpc);
        self.max_unauthenticated = scale(self.max_unauthenticated, e.unauthenticated);
        self.max_unauthenticated_per_source = self
            .max_unauthenticated_per_source
            .min(self.max_unauthenticated);
        self.max_processes = scale(self.max_processes, e.processes);
        Ok(Some(format!(
            "RLIMIT_NOFILE is {limit}: caps left at their defaults lowered to fit: server.max_connections {}, server.grpc_max_connections {}, server.max_unauthenticated {}, exec.max_processes {}",
            self.max_connections,
            self.grpc_max_connections,
            self.max_unauthenticated,
            self.max_processes
        )))
    }
}

/// A JWKS URL must be `https://` (a key set fetched in the clear can be
/// replaced on the way); plain `http://` only to a loopback host.
pub fn check_jwks_url(u: &str) -> Result<(), String> {
    let url = url::Url::parse(u).map_err(|e| format!("jwks_url `{u}`: {e}"))?;
    match url.scheme() {
        "https" => Ok(()),
        "http" => {
            let loopback = match url.host() {
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                None => false,
            };
            if loopback {
                Ok(())
            } else {
                Err(format!(
                    "jwks_url `{u}` must use https (plain http only to a loopback host)"
                ))
            }
        }
        other => Err(format!("jwks_url `{u}`: unsupported scheme `{other}`")),
    }
}

/// The admin listener: loopback by default; anywhere else only with a token.
fn validate_admin(
    s: &ServerConfig,
) -> Result<(Option<SocketAddr>, Option<AdminToken>), ConfigError> {
    let token = match &s.admin_token_file {
        None => None,
        Some(p) => {
            let mut t = std::fs::read(p).map_err(|e| {
                ConfigError(format!(
                    "server.admin_token_file: cannot read {}: {e}",
                    p.display()
                ))
            })?;
            while t.last().is_some_and(|b| b.is_ascii_whitespace()) {
                t.pop();
            }
            if t.len() < MIN_ADMIN_TOKEN_BYTES {
                return Err(ConfigError(format!(
                    "server.admin_token_file: a token needs at least {MIN_ADMIN_TOKEN_BYTES} bytes"
                )));
            }
            Some(AdminToken(t))
        }
    };
    let listen = s.admin_listen.as_deref().unwrap_or(DEFAULT_ADMIN_LISTEN);
    if listen == "off" {
        return Ok((None, token));
    }
    let addr: SocketAddr = listen.parse().map_err(|_| {
        ConfigError(format!(
            "server.admin_listen: expected HOST:PORT or `off`, got `{listen}`"
        ))
    })?;
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(ConfigError(format!(
            "server.admin_listen = `{listen}` is not loopback: set server.admin_token_file (metrics and readiness details name tenants and isolation gaps)"
        )));
    }
    Ok((Some(addr), token))
}

fn validate_key(k: KeyConfig) -> Result<KeySettings, String> {
    let algorithm = KeyAlgorithm::parse(&k.algorithm)?;
    let mut sources = [
        k.secret_file.map(KeySource::Secret),
        k.public_key_file.map(KeySource::PublicKey),
        k.jwks_file.map(KeySource::JwksFile),
        k.jwks_url.map(KeySource::JwksUrl),
    ]
    .into_iter()
    .flatten();
    let (Some(source), None) = (sources.next(), sources.next()) else {
        return Err(
            "give exactly one of secret_file, public_key_file, jwks_file, jwks_url".to_owned(),
        );
    };
    if let KeySource::JwksUrl(u) = &source {
        check_jwks_url(u)?;
    }
    let is_secret = matches!(source, KeySource::Secret(_));
    if algorithm.is_hmac() != is_secret {
        return Err(format!(
            "{} {}",
            algorithm.name(),
            if algorithm.is_hmac() {
                "needs secret_file"
            } else {
                "needs a public key, not secret_file"
            }
        ));
    }
    if k.scopes.is_some() && k.tenant.is_none() {
        return Err("scopes applies only to a key bound to a tenant".to_owned());
    }
    Ok(KeySettings {
        algorithm,
        kid: k.kid,
        source,
        tenant: k.tenant,
        scopes: k.scopes,
    })
}

fn validate_tenant(
    name: &str,
    t: TenantConfig,
    uid_policy: LayerPolicy,
) -> Result<TenantSettings, ConfigError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(ConfigError(format!(
            "tenant name `{name}`: use letters, digits, '-', '_' or '.'"
        )));
    }
    let root = t
        .root
        .ok_or_else(|| ConfigError(format!("tenants.{name}.root is required")))?;
    if !root.is_absolute() {
        return Err(ConfigError(format!(
            "tenants.{name}.root must be absolute: {}",
            root.display()
        )));
    }
    if !root.is_dir() {
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
        (None, LayerPolicy::Required) => {
            return Err(ConfigError(format!(
                "tenants.{name}.uid is required by [isolation] uid = \"required\""
            )));
        }
        (None, LayerPolicy::Optional) => None,
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
        max_read_file_bytes,
        max_connections: p("max_connections", t.max_connections, 1024)?,
        max_streams: p("max_streams", t.max_streams, 64)?,
        max_open_files: p("max_open_files", t.max_open_files, 256)?,
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
        network: t.network.unwrap_or_default(),
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
    })
}

/// Labels an executor may register with (and a tenant may require).
pub const MAX_EXECUTOR_LABELS: usize = 32;

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

/// Tenant roots must be disjoint: a root inside (or equal to) another
/// tenant's would hand one tenant the other's files, and the gateway's
/// state directory (every tenant's private /tmp) must lie in no root.
fn refuse_nested_roots(tenants: &BTreeMap<String, TenantSettings>) -> Result<(), ConfigError> {
    let roots: Vec<(&String, PathBuf)> = tenants
        .iter()
        .filter_map(|(n, t)| {
            let r = t.root.as_ref()?;
            Some((n, r.canonicalize().unwrap_or_else(|_| r.clone())))
        })
        .collect();
    for (i, (a, ra)) in roots.iter().enumerate() {
        for (b, rb) in &roots[i + 1..] {
            if ra.starts_with(rb) || rb.starts_with(ra) {
                return Err(ConfigError(format!(
                    "tenants.{a}.root {} and tenants.{b}.root {} overlap; tenant roots must be disjoint",
                    ra.display(),
                    rb.display()
                )));
            }
        }
        if let Ok(state) = state_dir() {
            let state = state.canonicalize().unwrap_or(state);
            if state.starts_with(ra) {
                return Err(ConfigError(format!(
                    "tenants.{a}.root {} holds the gateway's state directory {}; choose another root or set XDG_STATE_HOME",
                    ra.display(),
                    state.display()
                )));
            }
        }
    }
    Ok(())
}

/// The gateway's key files, absolute (as written and resolved through
/// symlinks): no tenant may reach them.
pub fn key_files(keys: &[KeySettings]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for k in keys {
        if let Some(p) = k.source.file() {
            let abs = if p.is_absolute() {
                p.to_path_buf()
            } else {
                std::env::current_dir()
                    .map(|d| d.join(p))
                    .unwrap_or_else(|_| p.to_path_buf())
            };
            if let Ok(real) = abs.canonicalize() {
                out.push(real);
            }
            out.push(crate::fs::normalize(&abs));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A key file inside a tenant's root or its extra writable paths would let
/// that tenant read it (fs/readFile, or its processes) and mint tokens for
/// every tenant: such a configuration is refused. A root of `/` is the
/// documented "no confinement" setting and is not checked.
fn refuse_exposed_keys(
    name: &str,
    t: &TenantSettings,
    keys: &[PathBuf],
) -> Result<(), ConfigError> {
    for dir in t.writable_dirs() {
        if let Some(key) = keys.iter().find(|k| k.starts_with(&dir)) {
            return Err(ConfigError(format!(
                "tenants.{name}: key file {} lies inside {}, which the tenant can read; \
                 move the key (for example to /run/exec-gateway) or choose another root",
                key.display(),
                dir.display()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal(extra: &str) -> String {
        // Outside the tenant root (/tmp), or the key would be refused.
        let key = Path::new("/var/tmp/exec-gateway-config-test.key");
        std::fs::write(key, "k".repeat(40)).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n[tenants.a]\nroot = \"/tmp\"\n{extra}",
            key.display()
        )
    }

    #[test]
    fn listen_urls() {
        assert_eq!(
            parse_listen("ws://127.0.0.1:0").unwrap().to_string(),
            "127.0.0.1:0"
        );
        assert!(parse_listen("ws://[::1]:0").is_ok());
        assert_eq!(
            parse_listen("http://x").unwrap_err().0,
            "unsupported --listen URL `http://x`; expected `ws://IP:PORT` or `stdio`"
        );
        assert_eq!(
            parse_listen("ws://nohost").unwrap_err().0,
            "invalid websocket --listen URL `ws://nohost`; expected `ws://IP:PORT`"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<Config>("[server]\nlisen = \"x\"").is_err());
        let c: Config = toml::from_str(&minimal("[server]\ndetach_ttl = \"soon\"")).unwrap();
        assert!(c.validate().unwrap_err().0.contains("server.detach_ttl"));
        let c: Config = toml::from_str(&minimal("[server]\nmax_in_flight = 0")).unwrap();
        assert!(c.validate().is_err());
        let c: Config = toml::from_str(&minimal("[auth]\nleeway = \"60s\"")).unwrap();
        assert!(c.validate().unwrap_err().0.contains("leeway"));
    }

    #[test]
    fn executor_pools_are_checked() {
        let err = |extra: &str| {
            let c: Config = toml::from_str(&minimal(extra)).unwrap();
            c.validate().unwrap_err().0
        };
        assert!(err("pool = \"p\"").contains("no [executors.pools.p]"));
        assert!(err("placement = \"remote\"").contains("needs tenants.a.pool"));
        assert!(err("[executors.pools.p]").contains("no tenant names this pool"));
        assert!(
            err("pool = \"p\"\n[executors]\npublic_url = \"http://x\"\n[executors.pools.p]")
                .contains("public_url")
        );
        assert!(err("pool = \"bad.name\"\n[executors.pools.\"bad.name\"]").contains("pool name"));
        let c: Config = toml::from_str(&minimal("pool = \"p\"\n[executors.pools.p]")).unwrap();
        let s = c.validate().unwrap();
        assert_eq!(s.tenants["a"].placement, Placement::Remote);
        let pools = &s.executors.unwrap().pools;
        assert_eq!(pools["p"].tenant, "a");
        assert_eq!(pools["p"].max_executors, 64);
        assert!(is_executor_id("ex-1_a") && !is_executor_id("ex.1") && !is_executor_id(""));
    }

    #[test]
    fn auth_and_tenants_are_required() {
        let c: Config = toml::from_str("[tenants.a]\nroot = \"/tmp\"").unwrap();
        assert!(c.validate().unwrap_err().0.contains("auth.keys"));
        let key = std::env::temp_dir().join("exec-gateway-config-test2.key");
        std::fs::write(&key, "k".repeat(40)).unwrap();
        let c: Config = toml::from_str(&format!(
            "[[auth.keys]]\nalgorithm = \"RS256\"\nsecret_file = \"{}\"\n[tenants.a]\nroot = \"/tmp\"",
            key.display()
        ))
        .unwrap();
        assert!(c.validate().unwrap_err().0.contains("public key"));
        let c: Config = toml::from_str(&minimal("[tenants.b]\nmax_sessions = 1")).unwrap();
        assert!(c.validate().unwrap_err().0.contains("tenants.b.root"));
        // A key inside a tenant's root is refused, naming both.
        let c: Config = toml::from_str(&minimal("[tenants.c]\nroot = \"/var/tmp\"")).unwrap();
        let e = c.validate().unwrap_err().0;
        assert!(
            e.contains(
                "tenants.c: key file /var/tmp/exec-gateway-config-test.key lies inside /var/tmp"
            ),
            "{e}"
        );
    }

    #[test]
    fn defaults() {
        let s: Config = toml::from_str(&minimal("")).unwrap();
        let s = s.validate().unwrap();
        assert_eq!(s.detach_ttl, None);
        assert_eq!(s.listen.to_string(), "127.0.0.1:8765");
        let t = &s.tenants["a"];
        assert_eq!(t.root.as_deref(), Some(Path::new("/tmp")));
        assert_eq!(t.burst, 400);
        assert_eq!(t.base_env["HOME"], "/tmp");
        assert_eq!(s.auth.tenant_claim, "tenant");
    }

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
