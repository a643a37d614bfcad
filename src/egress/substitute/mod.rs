//! Secrets for the tenant's own processes (docs/isolation.md, "Secrets for
//! the tenant's processes"): a secret with `substitute = true` is a
//! placeholder in their environment; an HTTPS request one of them makes to
//! a host the secret is bound to is intercepted by the egress proxy (TLS
//! ended with a certificate from the tenant's own CA, which their system
//! bundle trusts), its header values have the placeholder replaced by the
//! value read from the secret's file, and it goes on to the host over TLS
//! the gateway verifies.
//!
//! Its seam: `tenant::build` makes a [`Substitution`] for a tenant with
//! such secrets (before its namespace is entered: the bundle is bound
//! there); its [`Substitution::env`] joins every process's environment;
//! the proxy hands an allowed TLS connection to a bound host to
//! [`intercept::serve`].

mod ca;
pub(super) mod intercept;

use std::sync::Arc;

use crate::config::TenantSecret;
use crate::isolation::egress::TENANT_CA_BUNDLE;

pub use ca::MAX_INTERCEPTED_NAMES;

/// The variables that point TLS clients which do not read the system
/// bundle (Python's `requests`, Node, git with another TLS library) at it.
const BUNDLE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
];

/// One substituting secret and what stands for it.
#[derive(Debug)]
struct Bound {
    secret: TenantSecret,
    placeholder: String,
}

/// A tenant's substitution: its CA, its secrets' placeholders, the TLS
/// client of the intercepted connections.
#[derive(Debug)]
pub struct Substitution {
    ca: ca::TenantCa,
    secrets: Vec<Bound>,
    upstream: Arc<rustls::ClientConfig>,
}

/// A placeholder's value for one connection.
#[derive(Debug, Clone)]
pub(super) struct Value {
    pub secret: String,
    pub placeholder: String,
    pub value: String,
}

impl Substitution {
    /// The substitution of `tenant`'s secrets that say so; `None` when none
    /// does.
    pub fn new(
        tenant: &str,
        secrets: &[TenantSecret],
        ca_file: Option<&std::path::Path>,
    ) -> std::io::Result<Option<Arc<Substitution>>> {
        let secrets: Vec<Bound> = secrets
            .iter()
            .filter(|s| s.substitute)
            .map(|s| {
                let mut r = [0u8; 16];
                getrandom::fill(&mut r).map_err(std::io::Error::other)?;
                let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
                Ok(Bound {
                    placeholder: format!("exg-placeholder-{}-{hex}", s.name),
                    secret: s.clone(),
                })
            })
            .collect::<std::io::Result<_>>()?;
        if secrets.is_empty() {
            return Ok(None);
        }
        let mut subtrees: Vec<String> = secrets
            .iter()
            .flat_map(|b| b.secret.hosts.patterns().iter())
            .map(|p| p.subtree().to_owned())
            .collect();
        subtrees.sort();
        subtrees.dedup();
        let ca = ca::TenantCa::new(tenant, &subtrees).map_err(std::io::Error::other)?;
        Ok(Some(Arc::new(Substitution {
            ca,
            secrets,
            upstream: super::http::client_tls(ca_file, None)?,
        })))
    }

    /// The CA the tenant's processes trust, PEM.
    pub fn ca_pem(&self) -> &str {
        self.ca.pem()
    }

    /// What every process of the tenant has in its environment unless its
    /// client set it: each secret's placeholder, and the bundle's path.
    pub fn env(&self) -> Vec<(String, String)> {
        self.secrets
            .iter()
            .map(|b| (b.secret.name.clone(), b.placeholder.clone()))
            .chain(
                BUNDLE_VARS
                    .iter()
                    .map(|v| ((*v).to_owned(), TENANT_CA_BUNDLE.to_owned())),
            )
            .collect()
    }

    /// Whether a connection to `name` on `port` is intercepted: some
    /// substituting secret is bound there.
    pub(super) fn intercepts(&self, name: &str, port: u16) -> bool {
        self.secrets
            .iter()
            .any(|b| b.secret.hosts.allows(name, Some(port)))
    }

    /// The values of the secrets bound to `name` on `port`, read now (a
    /// file that cannot be read leaves its placeholder as it is).
    pub(super) fn values(&self, tenant: &str, name: &str, port: u16) -> Vec<Value> {
        self.secrets
            .iter()
            .filter(|b| b.secret.hosts.allows(name, Some(port)))
            .filter_map(|b| match b.secret.read() {
                Ok(v) if v.bytes().all(|c| c == b'\t' || (c >= 0x20 && c != 0x7f)) => {
                    Some(Value {
                        secret: b.secret.name.clone(),
                        placeholder: b.placeholder.clone(),
                        value: v,
                    })
                }
                Ok(_) => {
                    tracing::warn!(tenant, secret = %b.secret.name, "egress: the secret's value cannot be a header value (control characters); not substituted");
                    None
                }
                Err(e) => {
                    tracing::warn!(tenant, secret = %b.secret.name, error = %e, "egress: cannot read the secret; not substituted");
                    None
                }
            })
            .collect()
    }
}
