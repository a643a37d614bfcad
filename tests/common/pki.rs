//! Certificates made in the test (rcgen): a CA and the leaves it signs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A test CA.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf says of itself.
#[derive(Default)]
pub struct LeafSpec<'a> {
    /// DNS names and IP addresses (default: 127.0.0.1 and localhost).
    pub names: Vec<&'a str>,
    /// Subject: organization (O), units (OU), common name (CN).
    pub organizations: Vec<&'a str>,
    pub units: Vec<&'a str>,
    pub common_name: Option<&'a str>,
    /// Valid only in these years (default: rcgen's, from 1975 to 4096).
    pub years: Option<(i32, i32)>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            issuer: rcgen::Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} intermediate CA"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Ca {
            issuer: rcgen::Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// A leaf for 127.0.0.1 and localhost, for servers and clients alike.
    pub fn server(&self) -> Leaf {
        self.leaf(&LeafSpec::default())
    }

    pub fn leaf(&self, spec: &LeafSpec<'_>) -> Leaf {
        let names: Vec<String> = if spec.names.is_empty() {
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()]
        } else {
            spec.names.iter().map(|s| (*s).to_owned()).collect()
        };
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        let dn = &mut params.distinguished_name;
        for o in &spec.organizations {
            dn.push(rcgen::DnType::OrganizationName, *o);
        }
        for ou in &spec.units {
            dn.push(rcgen::DnType::OrganizationalUnitName, *ou);
        }
        if let Some(cn) = spec.common_name {
            dn.push(rcgen::DnType::CommonName, cn);
        }
        if let Some((from, to)) = spec.years {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        }
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The CA's certificate written to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.pem).unwrap();
        p
    }
}

impl Leaf {
    /// `dir/{stem}.crt` and `dir/{stem}.key`, each replaced by rename (as a
    /// rotation does).
    pub fn install(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let mut out = Vec::new();
        for (ext, text) in [("crt", &self.cert_pem), ("key", &self.key_pem)] {
            let path = dir.join(format!("{stem}.{ext}"));
            let tmp = dir.join(format!("{stem}.{ext}.new"));
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
            out.push(path);
        }
        (out[0].clone(), out[1].clone())
    }
}

/// A rustls client trusting `ca_pem` only, showing `identity` if given.
pub fn client_config(ca_pem: &str, identity: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match identity {
        None => builder.with_no_client_auth(),
        Some(l) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(l.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
    })
}
