//! The gateway's own dials over TLS: which servers it trusts (a CA bundle,
//! or the public web roots when none is given) and the certificate it
//! shows (a replica to its peers, a machine client to the gateway).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::Reloading;

/// A dialler's TLS, reloaded when its files change.
pub struct ClientTls {
    inner: Reloading<Arc<ClientConfig>>,
}

/// What a dialler trusts and shows.
#[derive(Debug, Clone, Default)]
pub struct ClientTlsFiles {
    /// CA bundle the server's certificate must chain to. None: the public
    /// web roots (webpki-roots).
    pub ca: Option<PathBuf>,
    /// A certificate chain and key to show (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
}

fn build(
    files: &ClientTlsFiles,
    alpn: &[Vec<u8>],
    what: &str,
) -> Result<Arc<ClientConfig>, String> {
    let roots = match &files.ca {
        Some(ca) => super::read_roots(ca)?,
        None => rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let builder = ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let mut config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = super::read_certs(cert)?;
            super::warn_if_not_valid_now(what, cert, &certs[0]);
            builder
                .with_client_auth_cert(certs, super::read_key(key)?)
                .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?
        }
    };
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

impl ClientTls {
    /// Read the files now; `alpn` lists the protocols offered, `what`
    /// names the dialler in the log.
    pub fn load(
        files: &ClientTlsFiles,
        alpn: &[&[u8]],
        what: &'static str,
    ) -> Result<Arc<ClientTls>, String> {
        let mut paths: Vec<PathBuf> = files.ca.iter().cloned().collect();
        if let Some((c, k)) = &files.identity {
            paths.extend([c.clone(), k.clone()]);
        }
        let (f, alpn): (ClientTlsFiles, Vec<Vec<u8>>) =
            (files.clone(), alpn.iter().map(|a| a.to_vec()).collect());
        let inner = Reloading::new(paths, what, Box::new(move || build(&f, &alpn, what)))?;
        Ok(Arc::new(ClientTls { inner }))
    }

    /// The configuration for the next connection.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.inner.get()
    }

    /// Dial `host:port` and verify the server as `host` (a DNS name or an
    /// IP address), within `timeout`.
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let connector = tokio_rustls::TlsConnector::from(self.config());
        let dial = async {
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            connector.connect(name, tcp).await
        };
        tokio::time::timeout(timeout, dial)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS dial timed out"))?
    }
}

/// A tonic/hyper connector that dials over [`ClientTls`] (the URI's scheme
/// is not looked at: every connection is TLS).
#[derive(Clone)]
pub struct Connector {
    pub tls: Arc<ClientTls>,
    pub timeout: Duration,
}

impl tower::Service<hyper::http::Uri> for Connector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: hyper::http::Uri) -> Self::Future {
        let (tls, timeout) = (self.tls.clone(), self.timeout);
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let s = tls.connect(&host, port, timeout).await?;
            Ok(TokioIo::new(s))
        })
    }
}

/// A CA bundle as `ClientTlsFiles` (the common case of a client).
pub fn trusting(ca: Option<&Path>) -> ClientTlsFiles {
    ClientTlsFiles {
        ca: ca.map(Path::to_path_buf),
        identity: None,
    }
}
