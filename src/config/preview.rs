//! `[preview]`: preview URLs into a session's ports (docs/preview.md).
//! Imports only `common`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::common::{ConfigError, duration, positive};

/// Default `[preview] max_connections_per_session`: upstream connections
/// (and forwards) open into one session's ports at once.
pub const DEFAULT_MAX_CONNECTIONS_PER_SESSION: usize = 32;
/// Default `[preview] url_ttl`: how long a signed preview URL (and the
/// cookie it becomes) lasts when its minting call names no expiry.
pub const DEFAULT_URL_TTL: Duration = Duration::from_secs(3600);
/// The longest `[preview] max_url_ttl` (and so any URL) may be.
pub const MAX_URL_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default `[preview] max_url_ttl`.
pub const DEFAULT_MAX_URL_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default `[preview] response_timeout`: how long the server inside may
/// take to begin its answer (504 after).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `[preview] idle_timeout`: a request, response or upgraded
/// connection that moves no byte for this long ends.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Shortest accepted preview signing key.
pub const MIN_PREVIEW_KEY_BYTES: usize = 32;

/// `[preview]`
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewConfig {
    /// Where preview host names live: `https://preview.example.com`
    /// (scheme, a DNS name with a wildcard record and certificate, an
    /// optional port). Requests whose `Host` is `{port}-{session}.` that
    /// name are previews. None: previews by path only.
    pub base_url: Option<String>,
    /// The key (at least 32 bytes, the same on every replica) that signs
    /// preview URLs and cookies. Default: a random key per process (URLs
    /// then work only on the replica that minted them, until it restarts).
    pub key_file: Option<PathBuf>,
    pub max_connections_per_session: Option<usize>,
    pub url_ttl: Option<String>,
    pub max_url_ttl: Option<String>,
    pub response_timeout: Option<String>,
    pub idle_timeout: Option<String>,
}

/// The key that signs preview URLs (never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct PreviewKey(pub Vec<u8>);

impl std::fmt::Debug for PreviewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreviewKey(..)")
    }
}

/// `[preview] base_url`, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewBase {
    /// `https` or `http`.
    pub scheme: String,
    /// The DNS name under which each preview has a host name, lower case.
    pub domain: String,
    /// `:PORT` when the URL names one, else empty.
    pub port_suffix: String,
}

/// Validated `[preview]`.
#[derive(Debug, Clone)]
pub struct PreviewSettings {
    pub base: Option<PreviewBase>,
    pub key: PreviewKey,
    /// Whether the key came from `key_file` (shared by a fleet).
    pub key_from_file: bool,
    pub max_connections_per_session: usize,
    pub url_ttl: Duration,
    pub max_url_ttl: Duration,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for PreviewSettings {
    fn default() -> Self {
        let mut key = vec![0u8; MIN_PREVIEW_KEY_BYTES];
        // A key nobody knows; without randomness, previews by signed URL
        // are impossible rather than forgeable (an all-zero key is never
        // used: `validate` fails first).
        let _ = getrandom::fill(&mut key);
        PreviewSettings {
            base: None,
            key: PreviewKey(key),
            key_from_file: false,
            max_connections_per_session: DEFAULT_MAX_CONNECTIONS_PER_SESSION,
            url_ttl: DEFAULT_URL_TTL,
            max_url_ttl: DEFAULT_MAX_URL_TTL,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

impl PreviewConfig {
    pub fn validate(&self, fleet: bool) -> Result<PreviewSettings, ConfigError> {
        let base = self.base_url.as_deref().map(base).transpose()?;
        let (key, key_from_file) = match &self.key_file {
            Some(p) => (key(p)?, true),
            None => {
                let mut k = vec![0u8; MIN_PREVIEW_KEY_BYTES];
                getrandom::fill(&mut k)
                    .map_err(|e| ConfigError(format!("preview: no randomness: {e}")))?;
                (PreviewKey(k), false)
            }
        };
        if fleet && base.is_some() && !key_from_file {
            return Err(ConfigError(
                "preview.key_file is required with preview.base_url in fleet mode: a URL minted on one replica must open on any".to_owned(),
            ));
        }
        let max_url_ttl = duration(
            "preview.max_url_ttl",
            self.max_url_ttl.as_deref(),
            DEFAULT_MAX_URL_TTL,
        )?;
        if max_url_ttl > MAX_URL_TTL || max_url_ttl < Duration::from_secs(60) {
            return Err(ConfigError("preview.max_url_ttl: from 1m to 7d".to_owned()));
        }
        let url_ttl = duration("preview.url_ttl", self.url_ttl.as_deref(), DEFAULT_URL_TTL)?;
        if url_ttl > max_url_ttl || url_ttl < Duration::from_secs(1) {
            return Err(ConfigError(
                "preview.url_ttl: from 1s to preview.max_url_ttl".to_owned(),
            ));
        }
        let response_timeout = duration(
            "preview.response_timeout",
            self.response_timeout.as_deref(),
            DEFAULT_RESPONSE_TIMEOUT,
        )?;
        let idle_timeout = duration(
            "preview.idle_timeout",
            self.idle_timeout.as_deref(),
            DEFAULT_IDLE_TIMEOUT,
        )?;
        if response_timeout.is_zero() || idle_timeout.is_zero() {
            return Err(ConfigError(
                "preview.response_timeout and preview.idle_timeout must be positive".to_owned(),
            ));
        }
        Ok(PreviewSettings {
            base,
            key,
            key_from_file,
            max_connections_per_session: positive(
                "preview.max_connections_per_session",
                self.max_connections_per_session,
                DEFAULT_MAX_CONNECTIONS_PER_SESSION,
            )?,
            url_ttl,
            max_url_ttl,
            response_timeout,
            idle_timeout,
        })
    }
}

/// `scheme://domain[:port]` with nothing else: a preview's host name is
/// `{port}-{session}.{domain}`.
fn base(url: &str) -> Result<PreviewBase, ConfigError> {
    let bad = |why: &str| ConfigError(format!("preview.base_url `{url}`: {why}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    let scheme = parsed.scheme().to_owned();
    if scheme != "https" && scheme != "http" {
        return Err(bad("the scheme must be https or http"));
    }
    let Some(url::Host::Domain(domain)) = parsed.host() else {
        return Err(bad("needs a DNS name (previews are its subdomains)"));
    };
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
        || !matches!(parsed.path(), "" | "/")
    {
        return Err(bad("only a scheme, a name and a port"));
    }
    if domain.split('.').count() < 2 {
        return Err(bad(
            "name a domain of its own with at least two labels (its wildcard covers every preview)",
        ));
    }
    Ok(PreviewBase {
        scheme,
        domain: domain.to_ascii_lowercase(),
        port_suffix: parsed.port().map(|p| format!(":{p}")).unwrap_or_default(),
    })
}

fn key(path: &std::path::Path) -> Result<PreviewKey, ConfigError> {
    super::common::key_file("preview.key_file", path, MIN_PREVIEW_KEY_BYTES).map(PreviewKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_is_a_scheme_a_domain_and_a_port() {
        let b = base("https://Preview.Example.com").unwrap();
        assert_eq!(b.domain, "preview.example.com");
        assert_eq!(b.port_suffix, "");
        let b = base("http://preview.test:8080/").unwrap();
        assert_eq!(
            (b.scheme.as_str(), b.port_suffix.as_str()),
            ("http", ":8080")
        );
        for bad in [
            "ftp://a.b",
            "https://127.0.0.1",
            "https://localhost",
            "https://a.b/x",
            "https://u:p@a.b",
            "https://a.b/?q",
        ] {
            assert!(base(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_fleet_needs_a_shared_key_for_urls() {
        let c = PreviewConfig {
            base_url: Some("https://p.example.com".into()),
            ..Default::default()
        };
        assert!(c.validate(true).is_err());
        assert!(c.validate(false).is_ok());
        let c = PreviewConfig {
            url_ttl: Some("2d".into()),
            ..Default::default()
        };
        assert!(c.validate(false).is_err());
    }
}
