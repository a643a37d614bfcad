//! TLS with rustls and the ring provider (no OpenSSL): the listeners'
//! certificates ([`server`]) and the gateway's own dials ([`client`]: a
//! peer replica, the executor's registry, `exec --grpc grpcs://`).
//!
//! Certificates, keys and CA bundles are PEM files. A listener's or a
//! dialler's files are looked at again (their modification times) at most
//! once a second as connections are made, and read again when they
//! changed: a certificate rotated on disk (cert-manager renews the Secret,
//! the kubelet swaps the mounted files) is used for the next connection
//! without a restart, and live connections keep theirs. A rotation that
//! cannot be read (a half-written file, a key that does not match) keeps
//! the current configuration and says so in the log.

pub mod client;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use self::client::{ClientTls, Connector};
pub use self::server::{ALPN_H2, ALPN_HTTP1, Tls};
pub use crate::config::{ClientCerts, TlsFiles};

/// How often the files' times are looked at, at most.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The largest certificate chain, key or CA bundle read.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A PEM file's bytes: a regular file (a FIFO or a device put in its place
/// would block or never end; it is opened without waiting and refused) of
/// at most [`MAX_PEM_BYTES`].
fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let (f, _) = crate::fs::open_regular(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(format!("{}: over {MAX_PEM_BYTES} bytes", path.display()));
    }
    Ok(buf)
}

/// The certificates of a PEM file (a chain, leaf first, or a CA bundle).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(&read_pem(path)?)
        .map_err(|e| format!("{}: not a PEM private key: {e}", path.display()))
}

/// A CA bundle as trust anchors.
fn read_roots(path: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certs(path)? {
        roots
            .add(c)
            .map_err(|e| format!("{}: not a CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Says in the log when a certificate of `what` is not valid now: clients
/// refuse it, so a rotation that did not happen shows here first.
fn warn_if_not_valid_now(what: &str, path: &Path, leaf: &CertificateDer<'_>) {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return;
    };
    let now = x509_parser::time::ASN1Time::now();
    let v = cert.validity();
    if now > v.not_after {
        tracing::error!(%what, cert = %path.display(), not_after = %v.not_after, "TLS certificate has expired: clients will refuse it");
    } else if now < v.not_before {
        tracing::error!(%what, cert = %path.display(), not_before = %v.not_before, "TLS certificate is not valid yet: clients will refuse it");
    }
}

/// What a set of files builds (an acceptor, a client configuration),
/// built again when one of the files changes.
struct Reloading<T> {
    paths: Vec<PathBuf>,
    what: &'static str,
    build: Box<dyn Fn() -> Result<T, String> + Send + Sync>,
    state: Mutex<State<T>>,
}

struct State<T> {
    current: T,
    stamp: Vec<Option<SystemTime>>,
    checked: Instant,
}

fn stamp(paths: &[PathBuf]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

impl<T: Clone> Reloading<T> {
    /// Build now: a listener or a dialler does not start on files it
    /// cannot read.
    fn new(
        paths: Vec<PathBuf>,
        what: &'static str,
        build: Box<dyn Fn() -> Result<T, String> + Send + Sync>,
    ) -> Result<Self, String> {
        let stamp = stamp(&paths);
        let current = build()?;
        Ok(Reloading {
            paths,
            what,
            build,
            state: Mutex::new(State {
                current,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The current value, built again first if the files changed since
    /// (looked at at most once a second).
    fn get(&self) -> T {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= CHECK_EVERY {
            state.checked = Instant::now();
            let now = stamp(&self.paths);
            if now != state.stamp {
                state.stamp = now;
                match (self.build)() {
                    Ok(v) => {
                        state.current = v;
                        tracing::info!(what = self.what, "TLS files reloaded");
                    }
                    Err(e) => {
                        tracing::warn!(what = self.what, error = %e, "TLS files not reloaded; using the current ones");
                    }
                }
            }
        }
        state.current.clone()
    }
}
