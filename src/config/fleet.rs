//! `[fleet]`: this replica's place in a fleet of gateways, raw and
//! validated (replica id, peer listener, fleet key, peer directory).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration};
use super::server::{ClientCerts, TlsFiles};

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
    /// Mutual TLS between replicas (`[fleet.tls]`). Required when the
    /// peer listener is not on loopback, unless `allow_plaintext` is set.
    pub tls: Option<FleetTlsSection>,
    /// Let a non-loopback peer listener run without TLS (peer traffic and
    /// clients' tokens cross the network in clear). Default: false.
    #[serde(default)]
    pub allow_plaintext: bool,
}

/// `[fleet.tls]`: this replica's certificate, shown to peers both as a
/// server and as a client, and the fleet CA every peer's must chain to.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetTlsSection {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

impl FleetTlsSection {
    /// The peer listener's TLS: the replica's certificate; peers must show
    /// one of the fleet CA.
    pub fn listener(&self) -> TlsFiles {
        TlsFiles {
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
            client_ca: Some(self.ca_file.clone()),
            client_certs: ClientCerts::Required,
        }
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
    /// `[fleet.tls]`'s files: `listener` for the peer listener, and the
    /// same certificate and CA for dialling peers.
    pub tls: Option<FleetTlsFiles>,
}

/// Validated `[fleet.tls]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetTlsFiles {
    pub listener: TlsFiles,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
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

/// `HOST:PORT` on this machine: a loopback IP literal or `localhost`.
fn is_loopback_address(a: &str) -> bool {
    let host = a.rsplit_once(':').map_or(a, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub(super) fn validate_fleet(f: FleetConfig) -> Result<Option<FleetSettings>, ConfigError> {
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
    let key = super::common::key_file("fleet.key_file", &key_file, MIN_FLEET_KEY_BYTES)?;
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
    if f.tls.is_none() && !f.allow_plaintext {
        if !listen.ip().is_loopback() {
            return Err(ConfigError(format!(
                "fleet.listen = `{listen_text}` is not loopback: set [fleet.tls] (mutual TLS between replicas), or fleet.allow_plaintext = true behind a network you trust"
            )));
        }
        // What a replica sends its peers (clients' tokens, the fleet
        // credential) crosses the network too.
        let off_loopback = match &peers {
            PeerDirectory::Template(t) => Some(t.clone()),
            PeerDirectory::Static(map) => map.values().find(|a| !is_loopback_address(a)).cloned(),
        };
        if let Some(a) = off_loopback {
            return Err(ConfigError(format!(
                "fleet: peer address `{a}` is not loopback: set [fleet.tls] (mutual TLS between replicas), or fleet.allow_plaintext = true behind a network you trust"
            )));
        }
    }
    let tls = f.tls.as_ref().map(|t| FleetTlsFiles {
        listener: t.listener(),
        ca: t.ca_file.clone(),
        cert: t.cert_file.clone(),
        key: t.key_file.clone(),
    });
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
        tls,
    }))
}
