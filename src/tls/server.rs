//! A listener's TLS: its certificate, and the client certificates it asks
//! for (`client_ca_file`: optional on the client listeners, where they
//! authenticate machine clients; required on the peer listener, mTLS).

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::UnixTime;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::{ClientCerts, Reloading, TlsFiles};

/// ALPN of the websocket and admin listeners (HTTP/1.1).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";
/// ALPN of the gRPC and peer listeners.
pub const ALPN_H2: &[u8] = b"h2";

/// A listener's TLS, reloaded when its files change.
pub struct Tls {
    inner: Reloading<tokio_rustls::TlsAcceptor>,
}

fn build(files: &TlsFiles, alpn: &[u8], what: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
    let certs = super::read_certs(&files.cert)?;
    let key = super::read_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = Arc::new(super::read_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, super::provider());
            let verifier = match files.client_certs {
                ClientCerts::Required => verifier,
                ClientCerts::Optional => verifier.allow_unauthenticated(),
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(Arc::new(Capped(verifier)))
        }
    };
    super::warn_if_not_valid_now(what, &files.cert, &certs[0]);
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

impl Tls {
    /// Read the files now; `alpn` is the one protocol the listener speaks,
    /// `what` names the listener in the log.
    pub fn load(files: &TlsFiles, alpn: &[u8], what: &'static str) -> Result<Arc<Tls>, String> {
        let paths = [
            Some(&files.cert),
            Some(&files.key),
            files.client_ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        let (f, alpn) = (files.clone(), alpn.to_vec());
        let inner = Reloading::new(paths, what, Box::new(move || build(&f, &alpn, what)))?;
        Ok(Arc::new(Tls { inner }))
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.inner.get()
    }
}

/// Intermediates a client may send with its certificate. Path building
/// over a long chain of look-alike issuers costs the server seconds of CPU
/// per handshake (measured: 1.7 s for 60 self-issued certificates, on the
/// runtime's threads); real client chains have one or two.
pub const MAX_CLIENT_INTERMEDIATES: usize = 4;

/// The WebPKI client verifier, refusing over-long chains before any path
/// building.
#[derive(Debug)]
struct Capped(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for Capped {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        if intermediates.len() > MAX_CLIENT_INTERMEDIATES {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadEncoding,
            ));
        }
        self.0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The client certificate a TLS connection verified (its leaf), if any.
pub fn client_leaf<IO>(
    stream: &tokio_rustls::server::TlsStream<IO>,
) -> Option<Arc<CertificateDer<'static>>> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| Arc::new(c.clone().into_owned()))
}

/// How long a refused TLS connection is kept, read and discarded, after
/// its alert and FIN.
pub const REFUSED_LINGER: std::time::Duration = std::time::Duration::from_secs(1);
/// What a refused TLS connection may still send meanwhile.
pub const REFUSED_LINGER_BYTES: usize = 64 * 1024;

/// Close a connection whose TLS handshake was refused so that its client
/// reads the alert: in TLS 1.3 a client sends its first data right after
/// its certificate, and closing a socket with that data unread resets the
/// connection, which can discard the alert before the client reads it (a
/// refused client certificate then looked like a dropped connection, and
/// clients retried it). The write side is shut (the alert, then FIN) and
/// what the client still sends is read and dropped, within
/// [`REFUSED_LINGER`] and [`REFUSED_LINGER_BYTES`].
pub async fn close_refused<IO>(mut io: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let _ = tokio::time::timeout(REFUSED_LINGER, async {
        let _ = io.shutdown().await;
        let mut buf = [0u8; 4096];
        let mut left = REFUSED_LINGER_BYTES;
        while left > 0 {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}
