//! `[auth]` and `[[auth.keys]]`: raw and validated, the key algorithms and
//! sources, and the JWKS URL check.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration};

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

/// Largest leeway accepted on `exp`/`nbf`.
pub const MAX_LEEWAY: Duration = Duration::from_secs(30);
/// Shortest accepted HS* secret.
pub const MIN_HMAC_SECRET_BYTES: usize = 32;

pub(super) fn validate_auth(a: AuthConfig) -> Result<AuthSettings, ConfigError> {
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
