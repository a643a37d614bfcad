//! A client certificate as a credential (machine clients on a listener
//! with `[server.tls] client_ca_file`). The TLS handshake has verified it
//! against that CA; here its subject names who it is, as Kubernetes reads
//! client certificates: the organization (`O`, exactly one) is the tenant,
//! the common name (`CN`) the subject, and the organizational units
//! (`OU`) the scopes (`exec`, `fs:read`, `fs:write`; several in one unit
//! are space-separated, as in a token's `scope` claim). The CA is the issuer:
//! it decides tenant and scopes, as a token's issuer does.

use std::sync::Arc;

use super::{AuthError, Authenticator, Principal, Scopes};

impl Authenticator {
    /// The principal of a verified client certificate (`der`, the leaf).
    pub fn verify_certificate(&self, der: &[u8]) -> Result<Principal, AuthError> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|_| AuthError::Certificate("not a parseable X.509 certificate"))?;
        // Checked at each use, not only at the handshake: a gRPC connection
        // authenticates every call with the certificate it started with.
        if !cert.validity().is_valid() {
            return Err(AuthError::Certificate("it has expired or is not valid yet"));
        }
        let subject = cert.subject();
        let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
            a.as_str()
                .map(str::to_owned)
                .map_err(|_| AuthError::Certificate("a subject attribute is not a string"))
        };
        let orgs = subject
            .iter_organization()
            .map(text)
            .collect::<Result<Vec<_>, _>>()?;
        let [tenant] = orgs.as_slice() else {
            return Err(AuthError::Certificate(
                "its subject must name exactly one organization (O), the tenant",
            ));
        };
        if !(self.tenants)(tenant) {
            return Err(AuthError::UnknownTenant);
        }
        let mut scopes = Scopes::default();
        for ou in subject.iter_organizational_unit() {
            text(ou)?.split_whitespace().for_each(|s| scopes.add(s));
        }
        if scopes.is_empty() {
            return Err(AuthError::NoScope);
        }
        let common = subject
            .iter_common_name()
            .map(text)
            .collect::<Result<Vec<_>, _>>()?;
        let expires_at = u64::try_from(cert.validity().not_after.timestamp())
            .ok()
            .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        Ok(Principal {
            tenant: Arc::from(tenant.as_str()),
            subject: common.first().map(|cn| format!("cert:{cn}")),
            scopes,
            expires_at,
            key: super::KeyLife::default(),
            image: None,
        })
    }
}
