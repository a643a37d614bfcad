//! `[server]`: the raw section, the websocket listen URL, and the admin
//! listener (address and bearer token). The rest of `[server]` is validated
//! into the top-level `Settings` by `mod.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::common::ConfigError;

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
    /// Bytes received from clients and not yet done with (messages being
    /// assembled, requests waiting or running), over all connections;
    /// past it, reads wait. At least `max_message_bytes`. Default: 1 GiB.
    pub max_inbound_bytes: Option<usize>,
    /// A websocket message still incomplete this long after its first
    /// byte ends its connection (1008). Default: `30s`.
    pub inbound_message_timeout: Option<String>,
    /// A websocket connection older than this (plus up to 10% jitter) is
    /// closed with 1001 and its session detached: the client resumes it,
    /// through the balancer, on any replica. Spreads long-lived connections
    /// over replicas added since, and makes a client present its token
    /// again. Default: `24h`. (A connection also closes, 1008, when the
    /// token that opened it expires.)
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
    /// Tenants active at once (with workers, cgroups, namespaces, a
    /// private /tmp); a session of another tenant first retires an idle
    /// one, else is refused as overloaded. Default: 1024, lowered to what
    /// the open-file limit allows when not set.
    pub max_active_tenants: Option<usize>,
    /// A tenant with no session, connection or call this long is retired:
    /// its workers end and its cgroups, mounts and namespaces are released
    /// (they come back on its next session). Default: `60s`.
    pub tenant_idle_timeout: Option<String>,
    /// TLS on the client listeners (websocket and gRPC): `wss://` and gRPC
    /// over TLS. Default: none (plaintext, for a TLS-terminating ingress).
    pub tls: Option<TlsSection>,
    /// TLS on the admin listener (`https://`). Required when the admin
    /// listener is not on loopback, unless `admin_plaintext` is set.
    pub admin_tls: Option<TlsSection>,
    /// Serve a non-loopback admin listener without TLS (its token and
    /// what it shows cross the network in clear). Default: false.
    #[serde(default)]
    pub admin_plaintext: bool,
}

/// `[server.tls]`, `[server.admin_tls]`: PEM files, read again when they
/// change.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// CA bundle of client certificates (`[server.tls]` only): a client
    /// that shows one signed by it is authenticated by it (docs/operations.md,
    /// "Client certificates"). Default: none (clients show no certificate).
    pub client_ca_file: Option<PathBuf>,
}

/// Whether a listener requires the client certificates it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// A client without one is served (and authenticates otherwise).
    Optional,
    /// A client without one fails the handshake (mutual TLS).
    Required,
}

/// Where a listener's certificate is, and whom it asks for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle client certificates are verified against.
    pub client_ca: Option<PathBuf>,
    pub client_certs: ClientCerts,
}

impl From<&TlsSection> for TlsFiles {
    fn from(s: &TlsSection) -> TlsFiles {
        TlsFiles {
            cert: s.cert_file.clone(),
            key: s.key_file.clone(),
            client_ca: s.client_ca_file.clone(),
            client_certs: ClientCerts::Optional,
        }
    }
}

pub const DEFAULT_LISTEN: &str = "ws://127.0.0.1:8765";

/// Where `/metrics` and the detailed `/readyz` are served by default.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9465";
/// Shortest accepted admin token.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

/// The admin listener's bearer token (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub Vec<u8>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

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

/// The admin listener: loopback by default; anywhere else only with a
/// token, and over TLS unless plaintext is asked for by name.
pub(super) fn validate_admin(
    s: &ServerConfig,
) -> Result<(Option<SocketAddr>, Option<AdminToken>), ConfigError> {
    if s.admin_tls
        .as_ref()
        .is_some_and(|t| t.client_ca_file.is_some())
    {
        return Err(ConfigError(
            "server.admin_tls: client_ca_file is not supported (the admin listener authenticates with admin_token_file)".to_owned(),
        ));
    }
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
    if !addr.ip().is_loopback() && s.admin_tls.is_none() && !s.admin_plaintext {
        return Err(ConfigError(format!(
            "server.admin_listen = `{listen}` is not loopback: set [server.admin_tls] (its token would cross the network in clear), or server.admin_plaintext = true behind a network you trust"
        )));
    }
    Ok((Some(addr), token))
}

/// The HTTP/2 receive window of a gRPC connection and of each of its
/// streams: what a client may send before the gateway reads it. Each
/// authenticated connection holds this much of its tenant's
/// `max_inbound_bytes` while it lives, so what HTTP/2 buffers is charged
/// too; windows may take half the budget (64 MiB by default: 64 gRPC
/// connections a tenant), the rest stays for messages. 512 KiB in flight
/// fills a 4 Gbit/s link at 1 ms round trip.
pub const GRPC_RECEIVE_WINDOW_BYTES: u32 = 512 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

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
}
