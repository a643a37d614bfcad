//! A tenant's own CA: made when the tenant is, its key only in the
//! gateway's memory, constrained to the names its substituting secrets are
//! bound to (a certificate it signed for any other name fails where name
//! constraints are checked: OpenSSL, rustls, Go, browsers). It signs one
//! certificate per intercepted name, kept for a day.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Server configurations (one per intercepted name) kept at once; past it
/// the cache starts again.
pub const MAX_INTERCEPTED_NAMES: usize = 256;
/// How long one name's certificate is used (it is valid a week).
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
const LEAF_VALIDITY_DAYS: i64 = 7;
/// The CA's validity: it lives no longer than the tenant's activation
/// anyway (its key is never written anywhere).
const CA_VALIDITY_DAYS: i64 = 825;

/// One tenant's CA.
pub struct TenantCa {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
    configs: parking_lot::Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
}

impl std::fmt::Debug for TenantCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCa").finish_non_exhaustive()
    }
}

impl TenantCa {
    /// A new CA for `tenant`, permitted to vouch for `subtrees` (names and
    /// what lies under them) only.
    pub fn new(tenant: &str, subtrees: &[String]) -> Result<TenantCa, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::default();
        p.distinguished_name.push(
            DnType::CommonName,
            format!("exec-gateway egress CA for tenant {tenant}"),
        );
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p.name_constraints = Some(NameConstraints {
            permitted_subtrees: subtrees
                .iter()
                .map(|s| GeneralSubtree::DnsName(s.clone()))
                .collect(),
            // No address either: a permitted DNS subtree alone leaves IP
            // names unconstrained (OpenSSL would take a leaf for any).
            excluded_subtrees: vec![
                GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [0; 4])),
                GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [0; 16])),
            ],
        });
        (p.not_before, p.not_after) = validity(CA_VALIDITY_DAYS);
        let cert = p.self_signed(&key)?;
        Ok(TenantCa {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(p, key),
            configs: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate (what the tenant's processes trust).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The TLS server the tenant's connection to `name` meets: a
    /// certificate for `name` signed by this CA; HTTP/1.1 only.
    pub fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if let Some((made, c)) = self.configs.lock().get(name)
            && made.elapsed() < LEAF_REUSE
        {
            return Ok(c.clone());
        }
        // Made outside the lock: other names' connections do not wait on
        // a key being generated.
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut p = CertificateParams::new(vec![name.to_owned()]).map_err(|e| e.to_string())?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        (p.not_before, p.not_after) = validity(LEAF_VALIDITY_DAYS);
        let cert = p.signed_by(&key, &self.issuer).map_err(|e| e.to_string())?;
        let chain = vec![cert.der().clone(), self.der.clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut configs = self.configs.lock();
        if configs.len() >= MAX_INTERCEPTED_NAMES {
            configs.clear();
        }
        configs.insert(name.to_owned(), (Instant::now(), config.clone()));
        Ok(config)
    }
}

/// From an hour ago (clocks differ a little) to `days` from now.
fn validity(days: i64) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::hours(1),
        now + time::Duration::days(days),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS handshake, in memory, of a client trusting only `ca` with the
    /// server `ca` made for `name`.
    async fn handshake(ca: &TenantCa, name: &str) -> Result<(), String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der.clone()).map_err(|e| e.to_string())?;
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let (a, b) = tokio::io::duplex(64 << 10);
        let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config(name)?);
        let server = crate::task::start("test-acceptor", async move {
            acceptor.accept(b).await.map(|_| ())
        });
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let r = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(server_name, a)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        drop(server);
        r
    }

    #[tokio::test]
    async fn the_ca_vouches_for_its_bound_names_only() {
        let ca = TenantCa::new("t", &["allowed.test".to_owned(), "cdn.test".to_owned()]).unwrap();
        handshake(&ca, "allowed.test").await.unwrap();
        handshake(&ca, "a.cdn.test").await.unwrap();
        // Signed, yet refused by the client: outside the name constraints
        // (were the key ever taken, it could not pass for another site).
        let e = handshake(&ca, "bank.test").await.unwrap_err();
        assert!(e.to_lowercase().contains("name"), "{e}");
        let e = handshake(&ca, "93.184.215.11").await.unwrap_err();
        assert!(e.to_lowercase().contains("name"), "{e}");
        assert!(!ca.pem().contains("PRIVATE"));
    }
}
