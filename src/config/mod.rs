//! Configuration: raw TOML (`Config`, unknown keys rejected) validated into
//! `Settings` (durations parsed, key files read, roots checked). Every field
//! documents its default. Without a file, [`Config::embedded`] serves one
//! tenant `default` on loopback with an HS256 key kept in the state directory.
//!
//! One file per section, each with its raw type, validated type and
//! validation: `server.rs` (with the admin listener), `exec.rs`, `auth.rs`,
//! `tenants.rs`, `isolation.rs`, `fleet.rs`, `executors.rs`; then `uids.rs`
//! (host uid allocation), `fds.rs` (the descriptor fit), `keys.rs` (key
//! files) and `common.rs` (the error type and shared parsers). Every public
//! item is re-exported here: `crate::config::Name` is the path to use.

mod audit;
mod auth;
mod common;
mod egress;
mod exec;
mod executors;
mod fds;
mod fleet;
mod images;
mod isolation;
mod keys;
mod mcp;
mod preview;
mod secrets;
mod server;
mod snapshots;
mod template;
mod tenants;
mod tracing;
mod uids;
mod webhooks;

use audit::validate_audit;
pub use audit::{AuditConfig, AuditSettings, AuditSink};
pub use auth::{
    AuthConfig, AuthSettings, KeyAlgorithm, KeyConfig, KeySettings, KeySource, MAX_LEEWAY,
    MIN_HMAC_SECRET_BYTES, check_jwks_url,
};
pub use common::{ConfigError, state_dir};
pub use egress::{EgressNames, MAX_EGRESS_NAMES, NamePattern, normalize as normalize_host};
pub use exec::ExecConfig;
pub use executors::{
    AccessKey, ExecutorsConfig, ExecutorsSettings, MAX_EXECUTOR_ID_BYTES, PoolConfig, PoolSettings,
    Revocations, is_executor_id,
};
pub use fds::{CapsExplicit, FD_RESERVE, FDS_PER_PROCESS, FDS_PER_WORKER, FdFit, ServerCaps};
pub use fleet::{
    DEFAULT_FLEET_LISTEN, FleetConfig, FleetKey, FleetSettings, FleetTlsFiles, FleetTlsSection,
    MIN_FLEET_KEY_BYTES, PeerDirectory, is_replica_id,
};
pub use images::{
    Credential, ImagePattern, ImageSource, ImagesConfig, ImagesSettings, MAX_DOCUMENT_BYTES,
};
pub use isolation::{
    CgroupVersion, DEFAULT_UID_RANGE, IsolationConfig, IsolationSettings, LayerPolicy,
};
pub use keys::{default_key_file, key_files, secret_paths};
pub use mcp::{
    DEFAULT_MAX_MCP_SESSIONS, DEFAULT_MAX_MCP_SESSIONS_PER_TENANT, DEFAULT_MCP_IDLE_TIMEOUT,
    DEFAULT_MCP_PATH, McpConfig, McpSettings,
};
pub use preview::{
    DEFAULT_MAX_CONNECTIONS_PER_SESSION, PreviewBase, PreviewConfig, PreviewKey, PreviewSettings,
};
pub use secrets::{MAX_SECRET_BYTES, MAX_SECRETS_PER_TENANT, SecretConfig, TenantSecret};
pub use server::{
    AdminToken, ClientCerts, DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, GRPC_RECEIVE_WINDOW_BYTES,
    MIN_ADMIN_TOKEN_BYTES, ServerConfig, TlsFiles, TlsSection, parse_listen,
};
pub use snapshots::{MAX_FORKS_PER_TENANT, SnapshotKey, SnapshotsConfig, SnapshotsSettings};
pub use template::{DEFAULT_NAME_PATTERN, MAX_TEMPLATED_NAME, TemplateSettings};
pub use tenants::{
    CPU_PERIOD_US, CgroupLimits, DEFAULT_MAX_EGRESS_CONNECTIONS, DEFAULT_MAX_OUTBOUND_BYTES,
    DEFAULT_MAX_READ_FILE_BYTES, DEFAULT_TENANT_MEMORY_BYTES, Egress, MAX_EGRESS_CONNECTIONS,
    MAX_EXECUTOR_LABELS, MAX_READ_FILE_LIMIT, Network, Placement, TenantConfig, TenantSettings,
    read_file_reply_bytes,
};
pub use tracing::{TracingConfig, TracingSettings};
pub use uids::{HostIds, IdsInUse, UidLedger, allocate_uids};
pub use webhooks::{EndpointConfig, EndpointSettings, WebhookSettings, WebhooksConfig};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use auth::validate_auth;
use common::{duration, optional_duration, positive};
use executors::validate_executors;
use fleet::validate_fleet;
use isolation::validate_isolation;
use keys::refuse_exposed_keys;
use server::validate_admin;
use tenants::{refuse_nested_roots, validate_tenant};

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
    /// Tenants by name. At least one, or a `[tenant_template]`, is required.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Settings of every tenant a token names that `[tenants]` does not
    /// configure: `[tenants.NAME]` fields (`root` ends in `/{tenant}`)
    /// and `name_pattern`. Default: none (such tokens are refused).
    pub tenant_template: Option<toml::Table>,
    #[serde(default)]
    pub isolation: IsolationConfig,
    #[serde(default)]
    pub fleet: FleetConfig,
    #[serde(default)]
    pub executors: ExecutorsConfig,
    #[serde(default)]
    pub audit: AuditConfig,
    #[serde(default)]
    pub tracing: tracing::TracingConfig,
    #[serde(default)]
    pub images: ImagesConfig,
    #[serde(default)]
    pub snapshots: SnapshotsConfig,
    #[serde(default)]
    pub preview: PreviewConfig,
    /// Lifecycle webhooks. Default: none.
    pub webhooks: Option<WebhooksConfig>,
    #[serde(default)]
    pub mcp: McpConfig,
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
    pub max_inbound_bytes: usize,
    pub inbound_message_timeout: Duration,
    pub max_connection_age: Option<Duration>,
    pub shutdown_grace: Duration,
    pub allowed_origins: Vec<String>,
    /// `None`: no admin listener.
    pub admin_listen: Option<SocketAddr>,
    pub admin_token: Option<AdminToken>,
    /// TLS on the client listeners (`[server.tls]`).
    pub tls: Option<TlsFiles>,
    /// TLS on the admin listener (`[server.admin_tls]`).
    pub admin_tls: Option<TlsFiles>,
    /// Files holding secrets (auth keys, fleet key, admin token), absolute,
    /// as written and resolved: hidden from every tenant, refused inside
    /// one's writable paths.
    pub secret_files: Vec<PathBuf>,
    pub handshake_timeout: Duration,
    pub max_unauthenticated: usize,
    pub max_unauthenticated_per_source: usize,
    pub grpc_max_connections: usize,
    /// Which descriptor-taking caps the file set: those are never lowered
    /// to fit the open-file limit (a start that cannot fit them is refused).
    pub caps_explicit: CapsExplicit,
    /// The descriptor fit made at start (or at a reload's re-read):
    /// `None` where none was made.
    pub fd_fit: Option<FdFit>,
    pub max_processes: usize,
    /// `None`: the session revision's.
    pub exited_retention: Option<Duration>,
    pub auth: AuthSettings,
    pub tenants: BTreeMap<String, TenantSettings>,
    /// `None`: only configured tenants are served.
    pub template: Option<std::sync::Arc<TemplateSettings>>,
    /// Tenants with workers, cgroups and namespaces at once.
    pub max_active_tenants: usize,
    /// A tenant with nothing live this long is retired (workers, cgroups,
    /// mounts and namespaces released).
    pub tenant_idle_timeout: Duration,
    /// `[isolation] uid_range`, which templated tenants' uids come from.
    pub uid_range: [u32; 2],
    pub isolation: IsolationSettings,
    /// `None`: a lone gateway.
    pub fleet: Option<FleetSettings>,
    /// `None`: no executor registry.
    pub executors: Option<ExecutorsSettings>,
    /// `[audit]`: the audit trail, when configured.
    pub audit: Option<AuditSettings>,
    /// Its file, as written and resolved (among `secret_files`, but not
    /// watched for reload).
    pub audit_files: Vec<PathBuf>,
    /// `[tracing]`: spans exported over OTLP, when configured.
    pub tracing: Option<TracingSettings>,
    /// `executors.revocations_file` as read now (re-read on reload).
    pub revocations: std::sync::Arc<Revocations>,
    /// `[images]`: registries, credentials, the store and its bounds.
    pub images: ImagesSettings,
    /// `[snapshots]`: the store of workspace snapshots and its bounds.
    pub snapshots: SnapshotsSettings,
    /// `[preview]`: preview URLs into sessions' ports.
    pub preview: PreviewSettings,
    /// `[webhooks]`: lifecycle events to endpoints, when configured.
    pub webhooks: Option<WebhookSettings>,
    /// `[mcp]`: the MCP server on the client listener.
    pub mcp: McpSettings,
}

impl Settings {
    /// Whether a token naming `name` has a tenant: a configured one, or
    /// one the template admits.
    pub fn knows_tenant(&self, name: &str) -> bool {
        self.tenants.contains_key(name) || self.template.as_ref().is_some_and(|t| t.admits(name))
    }
}

/// The name of the embedded configuration's tenant.
pub const DEFAULT_TENANT: &str = "default";

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
            isolation: IsolationConfig {
                network: Some(isolation::DEFAULT_NETWORK_EMBEDDED),
                ..IsolationConfig::default()
            },
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
        if self.tenants.is_empty() && self.tenant_template.is_none() {
            return Err(ConfigError(
                "no tenants configured: add at least one [tenants.NAME] with a root, or a [tenant_template]".to_owned(),
            ));
        }
        let isolation = validate_isolation(&self.isolation);
        let uid_range = self.isolation.uid_range.unwrap_or(DEFAULT_UID_RANGE);
        if let [first, last] = uid_range
            && (first == 0 || last < first || last >= u32::MAX - 1)
        {
            return Err(ConfigError(format!(
                "[isolation] uid_range = [{first}, {last}]: needs 0 < first <= last < {}",
                u32::MAX - 1
            )));
        }
        let template = self
            .tenant_template
            .map(|t| template::validate_template(t, isolation.uid))
            .transpose()?;
        if template.is_some()
            && isolation.uid == LayerPolicy::Required
            && !nix::unistd::geteuid().is_root()
        {
            return Err(ConfigError(
                "[isolation] uid = \"required\" with a [tenant_template]: templated tenants' uids are allocated, which needs the gateway to run as root".to_owned(),
            ));
        }
        // The templated tenants' uids, which configured ones must not take.
        let ledger = template
            .as_ref()
            .map(|t| UidLedger::new(&t.roots, uid_range, &BTreeMap::new()));
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
            if tenants.values().any(|t| t.uid.is_none()) {
                let host = uids::host_ids();
                match &ledger {
                    Some(ledger) => allocate_uids(
                        &mut tenants,
                        uid_range,
                        &uids::HostAndLedger(host.as_ref(), ledger),
                    )?,
                    None => allocate_uids(&mut tenants, uid_range, host.as_ref())?,
                }
            }
        }
        // Every secret a file holds (the auth keys, the fleet key, the
        // admin token, the TLS key) is kept from the tenants the same way.
        let tls = s.tls.as_ref().map(TlsFiles::from);
        let audit = validate_audit(&self.audit)?;
        let mut secret_files = key_files(&auth.keys);
        secret_files.extend(secret_paths(
            self.fleet
                .key_file
                .iter()
                .chain(self.snapshots.key_file.iter())
                .chain(self.preview.key_file.iter())
                .chain(s.admin_token_file.iter())
                .chain(s.tls.iter().map(|t| &t.key_file))
                .chain(s.admin_tls.iter().map(|t| &t.key_file))
                .chain(self.fleet.tls.iter().map(|t| &t.key_file))
                // A trust anchor or certificate a tenant could replace would
                // let it in as anyone (a CA of its own) or break TLS.
                .chain(s.tls.iter().flat_map(tls_public_files))
                .chain(s.admin_tls.iter().flat_map(tls_public_files))
                .chain(
                    self.fleet
                        .tls
                        .iter()
                        .flat_map(|t| [&t.cert_file, &t.ca_file]),
                )
                .map(PathBuf::as_path)
                .chain(executors::executor_secret_files(&self.executors))
                // The tenants' own secrets (http/request headers): no
                // tenant sees any, its own included.
                .chain(
                    tenants
                        .values()
                        .flat_map(|t| t.secrets.iter().map(|s| s.file.as_path())),
                )
                .chain(
                    template
                        .iter()
                        .flat_map(|t| t.example.secrets.iter().map(|s| s.file.as_path())),
                ),
        ));
        // The audit trail names every tenant's command lines: hidden too,
        // but not a configuration input (it changes all the time).
        let audit_files = secret_paths(audit.iter().filter_map(|a| match &a.sink {
            AuditSink::File(p) => Some(p.as_path()),
            AuditSink::Stdout => None,
        }));
        secret_files.extend(audit_files.iter().cloned());
        let images = self.images.validate()?;
        let snapshots = self.snapshots.validate()?;
        let webhooks = webhooks::validate_webhooks(self.webhooks)?;
        // Their secrets sign what receivers trust; a tenant that could
        // write the spool would have the gateway sign its own events.
        secret_files.extend(secret_paths(webhooks.iter().flat_map(|w| {
            w.endpoints
                .iter()
                .flat_map(|e| e.secret_files.iter().chain(e.ca_file.iter()))
                .chain(std::iter::once(&w.spool_dir))
                .map(PathBuf::as_path)
        })));
        secret_files.extend(secret_paths(
            images
                .credentials
                .values()
                .map(|c| c.password_file.as_path()),
        ));
        for (name, t) in &tenants {
            images::check_tenant(
                &format!("tenants.{name}"),
                t.image.as_ref(),
                &t.images,
                &images,
            )?;
        }
        if let Some(t) = &template {
            images::check_tenant(
                "tenant_template",
                t.example.image.as_ref(),
                &t.example.images,
                &images,
            )?;
        }
        secret_files.sort();
        secret_files.dedup();
        for (name, t) in &tenants {
            refuse_exposed_keys(name, t, &secret_files)?;
        }
        refuse_nested_roots(&tenants)?;
        if let (Some(t), Some(ledger)) = (&template, &ledger) {
            template::refuse_template_overlaps(t, tenants.iter(), &secret_files)?;
            // A configured uid the ledger gives a templated tenant would
            // make the two one user.
            for (name, s) in &tenants {
                let Some((u, g)) = s.uid.filter(|_| !s.uid_allocated) else {
                    continue;
                };
                for id in [u, g] {
                    if let Some(holder) = ledger.holder(id).filter(|h| h != name) {
                        return Err(ConfigError(format!(
                            "tenants.{name}: uid/gid {id} is templated tenant `{holder}`'s ({}); choose another",
                            uids::ledger_dir(&t.roots).join(id.to_string()).display()
                        )));
                    }
                }
            }
        }
        if isolation.network != LayerPolicy::Off
            && let Some((name, _)) = tenants
                .iter()
                .find(|(_, t)| t.network == Some(Network::Host))
        {
            return Err(ConfigError(format!(
                "tenants.{name}.network = \"host\" gives the tenant the host's loopback, the gateway's listeners and every other host-network tenant; it is allowed only with [isolation] network = \"off\""
            )));
        }
        let caps_explicit = CapsExplicit {
            connections: s.max_connections.is_some(),
            grpc: s.grpc_max_connections.is_some(),
            unauthenticated: s.max_unauthenticated.is_some(),
            processes: self.exec.max_processes.is_some(),
            active_tenants: s.max_active_tenants.is_some(),
        };
        let (admin_listen, admin_token) = validate_admin(&s)?;
        let fleet = validate_fleet(self.fleet)?;
        let preview = self.preview.validate(fleet.is_some())?;
        let mcp = self.mcp.validate()?;
        let tracing_settings =
            tracing::validate_tracing(&self.tracing, fleet.as_ref().map(|f| f.replica.as_str()))?;
        let mut executors = validate_executors(self.executors, &tenants)?;
        if let Some(e) = &mut executors {
            e.listener_tls = s.tls.is_some();
        }
        let revocations = match executors
            .as_ref()
            .and_then(|e| e.revocations_file.as_deref())
        {
            Some(path) => Revocations::load(path)
                .map_err(|e| ConfigError(format!("executors.revocations_file: {e}")))?,
            None => Revocations::default(),
        };
        let settings = Settings {
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
            max_inbound_bytes: positive(
                "server.max_inbound_bytes",
                s.max_inbound_bytes,
                DEFAULT_GATEWAY_MAX_INBOUND_BYTES,
            )?,
            inbound_message_timeout: duration(
                "server.inbound_message_timeout",
                s.inbound_message_timeout.as_deref(),
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
                Some(d) => Some(d),
                None => Some(DEFAULT_MAX_CONNECTION_AGE),
            },
            shutdown_grace: duration(
                "server.shutdown_grace",
                s.shutdown_grace.as_deref(),
                Duration::from_secs(5),
            )?,
            allowed_origins: s.allowed_origins,
            admin_listen,
            admin_token,
            tls,
            admin_tls: s.admin_tls.as_ref().map(TlsFiles::from),
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
            fd_fit: None,
            max_processes: positive("exec.max_processes", self.exec.max_processes, 4096)?,
            exited_retention: optional_duration(
                "exec.exited_retention",
                self.exec.exited_retention.as_deref(),
            )?,
            auth,
            tenants,
            template: template.map(std::sync::Arc::new),
            max_active_tenants: positive(
                "server.max_active_tenants",
                s.max_active_tenants,
                DEFAULT_MAX_ACTIVE_TENANTS,
            )?,
            tenant_idle_timeout: duration(
                "server.tenant_idle_timeout",
                s.tenant_idle_timeout.as_deref(),
                DEFAULT_TENANT_IDLE_TIMEOUT,
            )?,
            uid_range,
            isolation,
            fleet,
            executors,
            audit,
            audit_files,
            tracing: tracing_settings,
            revocations: std::sync::Arc::new(revocations),
            images,
            snapshots,
            preview,
            webhooks,
            mcp,
            secret_files,
        };
        refuse_unfit_inbound(&settings)?;
        if let Some(t) = &settings.template {
            let e = &t.example;
            if settings.isolation.network != LayerPolicy::Off && e.network == Some(Network::Host) {
                return Err(ConfigError(
                    "tenant_template.network = \"host\" is allowed only with [isolation] network = \"off\"".to_owned(),
                ));
            }
        }
        Ok(settings)
    }
}

/// A websocket connection is closed (1001, its session detached and
/// resumable) this long after it opened, plus up to 10% jitter. Long
/// enough that no client sees it in a working day; short enough that no
/// connection outlives a day of key rotation and fleet changes. A token
/// that expires first closes it earlier (1008).
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(24 * 3600);

/// Default `server.max_active_tenants` (lowered to fit the open-file
/// limit when not set).
pub const DEFAULT_MAX_ACTIVE_TENANTS: usize = 1024;

/// Default `server.tenant_idle_timeout`: long enough that a team working
/// in bursts keeps warm workers, short enough that thousands of teams that
/// came once cost nothing within a minute.
pub const DEFAULT_TENANT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Gateway-wide bytes held of what clients send.
pub const DEFAULT_GATEWAY_MAX_INBOUND_BYTES: usize = 1024 * 1024 * 1024;

/// An inbound budget smaller than the largest message would hold back a
/// message that is allowed but can never fit: refused.
fn refuse_unfit_inbound(s: &Settings) -> Result<(), ConfigError> {
    let m = s.max_message_bytes;
    if s.max_inbound_bytes < m {
        return Err(ConfigError(format!(
            "server.max_inbound_bytes ({}) is less than server.max_message_bytes ({m}): a message of the allowed size could never be received",
            s.max_inbound_bytes
        )));
    }
    let example = s
        .template
        .as_ref()
        .map(|t| ("tenant_template".to_owned(), &t.example));
    let configured = s.tenants.iter().map(|(n, t)| (format!("tenants.{n}"), t));
    for (section, t) in configured.chain(example) {
        if t.max_inbound_bytes < m {
            return Err(ConfigError(format!(
                "{section}.max_inbound_bytes ({}) is less than server.max_message_bytes ({m}): a message of the allowed size could never be received",
                t.max_inbound_bytes
            )));
        }
    }
    Ok(())
}

/// A TLS section's files other than its key (already a secret).
fn tls_public_files(t: &TlsSection) -> impl Iterator<Item = &PathBuf> {
    std::iter::once(&t.cert_file).chain(t.client_ca_file.iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration with one key (outside any root) and tenant `a` at
    /// `/tmp`, then `extra`.
    pub(super) fn minimal(extra: &str) -> String {
        // Outside the tenant root (/tmp), or the key would be refused.
        let key = Path::new("/var/tmp/exec-gateway-config-test.key");
        std::fs::write(key, "k".repeat(40)).unwrap();
        format!(
            "[[auth.keys]]\nalgorithm = \"HS256\"\nsecret_file = \"{}\"\n[tenants.a]\nroot = \"/tmp\"\n{extra}",
            key.display()
        )
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
                "tenants.c: secret file /var/tmp/exec-gateway-config-test.key lies inside /var/tmp"
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
}
