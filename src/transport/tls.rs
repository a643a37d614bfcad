//! TLS on a listener (rustls, with the ring provider; no OpenSSL).
//!
//! A listener with `[server.tls]` serves its certificate chain and key
//! from PEM files. The files are looked at again (their modification
//! times) at most once a second as connections arrive, and read again when
//! they changed: a certificate rotated on disk (cert-manager renews the
//! Secret, the kubelet swaps the mounted files) is served to the next
//! connection, without a restart, and live connections keep theirs. A
//! rotation that cannot be read (a half-written file, a key that does not
//! match) keeps the current certificate and says so in the log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

pub use crate::config::TlsFiles;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How often the files' times are looked at, at most.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// ALPN of the websocket listener (HTTP/1.1 upgrades).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";
/// ALPN of the gRPC listener.
pub const ALPN_H2: &[u8] = b"h2";

/// A listener's TLS, reloaded when its files change.
pub struct Tls {
    files: TlsFiles,
    alpn: Vec<u8>,
    state: Mutex<State>,
}

struct State {
    acceptor: tokio_rustls::TlsAcceptor,
    stamp: Stamp,
    checked: Instant,
}

/// The files' modification times.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

fn stamp(files: &TlsFiles) -> Stamp {
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (modified(&files.cert), modified(&files.key))
}

/// The largest certificate chain or key file read.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A PEM file's bytes: a regular file (a FIFO or a device put in its place
/// would block or never end; it is opened without waiting and refused) of
/// at most [`MAX_PEM_BYTES`].
fn read_pem(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mut buf = Vec::new();
    f.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if buf.len() as u64 > MAX_PEM_BYTES {
        return Err(format!("{}: over {MAX_PEM_BYTES} bytes", path.display()));
    }
    Ok(buf)
}

fn build(files: &TlsFiles, alpn: &[u8]) -> Result<tokio_rustls::TlsAcceptor, String> {
    let chain = read_pem(&files.cert)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&chain)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", files.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read_pem(&files.key)?)
        .map_err(|e| format!("{}: not a PEM private key: {e}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

impl Tls {
    /// Read the files now (a listener does not start on files it cannot
    /// read); `alpn` is the one protocol the listener speaks.
    pub fn load(files: &TlsFiles, alpn: &[u8]) -> Result<Arc<Tls>, String> {
        let stamp = stamp(files);
        let acceptor = build(files, alpn)?;
        Ok(Arc::new(Tls {
            files: files.clone(),
            alpn: alpn.to_vec(),
            state: Mutex::new(State {
                acceptor,
                stamp,
                checked: Instant::now(),
            }),
        }))
    }

    /// The acceptor for the next connection: the files read again if they
    /// changed since (looked at at most once a second).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= CHECK_EVERY {
            state.checked = Instant::now();
            let now = stamp(&self.files);
            if now != state.stamp {
                state.stamp = now;
                match build(&self.files, &self.alpn) {
                    Ok(a) => {
                        state.acceptor = a;
                        tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS certificate not reloaded; serving the current one");
                    }
                }
            }
        }
        state.acceptor.clone()
    }
}
