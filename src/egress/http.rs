//! `http/request` performed inside the tenant's network (docs/protocol.md,
//! "HTTP"): every connection is made from a socket of the gateway's own
//! in the tenant's namespace, unmarked, so it meets exactly the rules the
//! tenant's processes meet (its addresses, its names through the proxy,
//! its connection cap), and names are resolved by the namespace's
//! resolver. Never from the gateway's own network.
//!
//! `valueEnvVar` names one of the tenant's secrets (`[tenants.NAME.
//! secrets.VAR]`), never the gateway's environment: its value follows
//! `value` in the header, and only for the hosts the secret is bound to
//! (a redirect elsewhere drops the header).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::sockets::Sockets;
use crate::config::{TenantSecret, normalize_host};
use crate::error::GatewayError;
use crate::protocol::http::{Header, HttpRequestParams, RedirectPolicy, Response, ResponseHeader};

/// Redirects followed at most (as the reference).
pub const MAX_REDIRECTS: usize = 10;
/// The largest body answered whole; a larger one needs `streamResponse`.
pub const MAX_BUFFERED_BODY_BYTES: usize = 64 << 20;
/// The largest `http/request/bodyDelta` (as the reference).
pub const MAX_DELTA_BYTES: usize = 1 << 20;
/// How long a connection may take when the request sets no timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers a redirect to another origin drops (beside secrets).
const CROSS_ORIGIN_DROPPED: &[&str] = &["authorization", "cookie", "proxy-authorization"];

/// A tenant's HTTP client.
pub struct HttpEgress {
    sockets: Arc<Sockets>,
    secrets: Vec<TenantSecret>,
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for HttpEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEgress")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// A response whose head has come: its body is read by the caller.
pub struct Fetched {
    pub head: Response,
    pub body: Incoming,
    /// When the request must be done (`timeoutMs`), if ever.
    pub deadline: Option<Instant>,
}

/// One header to send: its name, and its value (or how to make it).
struct Outgoing {
    name: hyper::header::HeaderName,
    value: hyper::header::HeaderValue,
    /// The secret in it, whose hosts it may go to.
    secret: Option<usize>,
}

fn invalid(msg: impl Into<String>) -> GatewayError {
    GatewayError::InvalidParams(msg.into())
}

fn failed(msg: impl std::fmt::Display) -> GatewayError {
    GatewayError::Internal(format!("http/request failed: {msg}"))
}

fn sending(url: &url::Url) -> GatewayError {
    failed(format!("error sending request for url ({url})"))
}

/// The TLS client of a tenant's connections out (its `http/request`, its
/// intercepted ones): the public roots, the tenant's `http_ca_file` and,
/// for `http/request` of a tenant that intercepts, the tenant's own CA;
/// HTTP/1.1.
pub(super) fn client_tls(
    ca_file: Option<&std::path::Path>,
    tenant_ca: Option<&str>,
) -> std::io::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = tenant_ca {
        add_pem(&mut roots, pem.as_bytes(), "the tenant's CA")?;
    }
    if let Some(path) = ca_file {
        add_pem(
            &mut roots,
            &std::fs::read(path)?,
            &path.display().to_string(),
        )?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// Every certificate of `pem` into `roots`; `what` names it in an error.
fn add_pem(roots: &mut rustls::RootCertStore, pem: &[u8], what: &str) -> std::io::Result<()> {
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(pem) {
        let cert: rustls::pki_types::CertificateDer<'static> =
            cert.map_err(|e| std::io::Error::other(format!("{what}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| std::io::Error::other(format!("{what}: {e}")))?;
    }
    Ok(())
}

impl HttpEgress {
    /// The client of a tenant whose namespace `sockets` makes sockets in.
    pub fn new(
        sockets: Arc<Sockets>,
        secrets: Vec<TenantSecret>,
        ca_file: Option<&std::path::Path>,
        tenant_ca: Option<&str>,
    ) -> std::io::Result<HttpEgress> {
        let tls = client_tls(ca_file, tenant_ca)?;
        Ok(HttpEgress {
            sockets,
            secrets,
            tls,
        })
    }

    /// Check the request as the reference does (in its order), then send it
    /// and follow redirects; the response's head, its body to read.
    pub async fn fetch(&self, p: &HttpRequestParams) -> Result<Fetched, GatewayError> {
        let body = match &p.body_base64 {
            Some(b) => Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| invalid(e.to_string()))?,
            ),
            None => Bytes::new(),
        };
        let method = hyper::Method::from_bytes(p.method.as_bytes())
            .map_err(|_| invalid("http/request method is invalid: invalid HTTP method"))?;
        let url = url::Url::parse(&p.url)
            .map_err(|e| invalid(format!("http/request url is invalid: {e}")))?;
        check_scheme(&url).map_err(|s| {
            invalid(format!(
                "http/request only supports http and https URLs, got {s}"
            ))
        })?;
        let host = url_host(&url);
        let https = url.scheme() == "https";
        let mut headers = self.headers(&p.headers, &host, url.port_or_known_default(), https)?;
        // With a secret, the caller's `Host` may not name another site
        // than the URL (a front end routing by it would get the secret).
        if headers.iter().any(|h| h.secret.is_some())
            && let Some(h) = headers.iter().find(|h| h.name == hyper::header::HOST)
        {
            let named = h.value.to_str().ok().map(|v| {
                let v = v.trim();
                let bare = match v.rsplit_once(':') {
                    Some((n, p)) if p.bytes().all(|b| b.is_ascii_digit()) => n,
                    _ => v,
                };
                normalize_host(bare).unwrap_or_default()
            });
            if named.as_deref() != Some(host.as_str()) {
                return Err(invalid(format!(
                    "http/request header Host must name {host} when a secret is sent"
                )));
            }
        }
        // Credentials in the URL become Basic authorization (as the
        // reference sends them), unless the caller gave one.
        let mut url = url;
        if !url.username().is_empty() || url.password().is_some() {
            if !headers
                .iter()
                .any(|h| h.name == hyper::header::AUTHORIZATION)
            {
                let user = percent_decode(url.username());
                let pass = url.password().map(percent_decode).unwrap_or_default();
                let basic =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
                if let Ok(v) = hyper::header::HeaderValue::from_str(&format!("Basic {basic}")) {
                    headers.push(Outgoing {
                        name: hyper::header::AUTHORIZATION,
                        value: v,
                        secret: None,
                    });
                }
            }
            let _ = url.set_username("");
            let _ = url.set_password(None);
        }
        let deadline = p
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        if p.timeout_ms == Some(0) {
            return Err(failed("route-aware request timed out"));
        }
        let asked = url.clone();
        let sent = async {
            let mut url = url;
            let (mut method, mut body, mut headers) = (method, body, headers);
            let mut hops = 0;
            loop {
                let resp = self
                    .send_once(&url, &method, &headers, body.clone())
                    .await?;
                let status = resp.status();
                let location = resp
                    .headers()
                    .get(hyper::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .map(str::to_owned);
                let (true, RedirectPolicy::Follow, Some(location)) =
                    (status.is_redirection(), p.redirect_policy, location)
                else {
                    return Ok(resp);
                };
                if status == hyper::StatusCode::NOT_MODIFIED
                    || status == hyper::StatusCode::MULTIPLE_CHOICES
                {
                    return Ok(resp);
                }
                hops += 1;
                if hops > MAX_REDIRECTS {
                    return Err(failed("too many redirects"));
                }
                // A Location that is no URL is the answer, as it is.
                let Ok(next) = url.join(&location) else {
                    return Ok(resp);
                };
                if let Err(s) = check_scheme(&next) {
                    return Err(failed(format!(
                        "redirect target uses unsupported URL scheme: {s}"
                    )));
                }
                // 303, and 301/302 after a POST, become a GET without a body.
                let to_get = status == hyper::StatusCode::SEE_OTHER
                    && method != hyper::Method::HEAD
                    || (matches!(status.as_u16(), 301 | 302) && method == hyper::Method::POST);
                if to_get {
                    method = hyper::Method::GET;
                    body = Bytes::new();
                    headers
                        .retain(|h| !matches!(h.name.as_str(), "content-type" | "content-length"));
                }
                let same_origin = next.origin() == url.origin();
                let next_host = url_host(&next);
                headers.retain(|h| {
                    let secret_ok = h.secret.is_none_or(|i| {
                        next.scheme() == "https"
                            && self.secrets[i]
                                .hosts
                                .allows(&next_host, next.port_or_known_default())
                    });
                    secret_ok && (same_origin || !CROSS_ORIGIN_DROPPED.contains(&h.name.as_str()))
                });
                headers.retain(|h| h.name != hyper::header::REFERER);
                if !(url.scheme() == "https" && next.scheme() == "http")
                    && let Ok(v) = hyper::header::HeaderValue::from_str(&referer(&url, same_origin))
                {
                    headers.push(Outgoing {
                        name: hyper::header::REFERER,
                        value: v,
                        secret: None,
                    });
                }
                url = next;
            }
        };
        let resp = match deadline {
            Some(d) => tokio::time::timeout_at(d, sent)
                .await
                .map_err(|_| sending(&asked))??,
            None => sent.await?,
        };
        let head = Response {
            status: resp.status().as_u16(),
            headers: resp
                .headers()
                .iter()
                .filter_map(|(n, v)| {
                    Some(ResponseHeader {
                        name: n.as_str().to_owned(),
                        value: v.to_str().ok()?.to_owned(),
                    })
                })
                .collect(),
            body_base64: String::new(),
        };
        Ok(Fetched {
            head,
            body: resp.into_body(),
            deadline,
        })
    }

    /// The request's headers, checked in order; secrets filled in.
    fn headers(
        &self,
        given: &[Header],
        host: &str,
        port: Option<u16>,
        https: bool,
    ) -> Result<Vec<Outgoing>, GatewayError> {
        let mut out = Vec::with_capacity(given.len());
        for h in given {
            let name = hyper::header::HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
                invalid("http/request header name is invalid: invalid HTTP header name")
            })?;
            let (value, secret) = match &h.value_env_var {
                None => (h.value.clone(), None),
                Some(var) => {
                    let Some(i) = self.secrets.iter().position(|s| &s.name == var) else {
                        return Err(invalid(format!(
                            "http/request header {} requires executor environment variable {var}",
                            h.name
                        )));
                    };
                    let s = &self.secrets[i];
                    if !s.hosts.allows(host, port) {
                        return Err(invalid(format!(
                            "http/request header {} cannot use secret {var} for {host}: it is bound to {}",
                            h.name,
                            s.hosts.entries().join(", ")
                        )));
                    }
                    if !https {
                        return Err(invalid(format!(
                            "http/request header {} sends secret {var} over https only",
                            h.name
                        )));
                    }
                    let v = s.read().map_err(|e| {
                        tracing::warn!(secret = %var, error = %e, "a tenant secret cannot be read");
                        GatewayError::Internal(format!(
                            "secret {var} cannot be read (the gateway's log says why)"
                        ))
                    })?;
                    if v.is_empty() {
                        return Err(invalid(format!(
                            "http/request header {} requires a non-empty executor environment variable {var}",
                            h.name
                        )));
                    }
                    (format!("{}{v}", h.value), Some(i))
                }
            };
            let mut value = hyper::header::HeaderValue::from_str(&value).map_err(|_| {
                invalid(format!(
                    "http/request header value is invalid for {}: failed to parse header value",
                    h.name
                ))
            })?;
            if secret.is_some() {
                value.set_sensitive(true);
            }
            out.push(Outgoing {
                name,
                value,
                secret,
            });
        }
        Ok(out)
    }

    /// One request on a new connection.
    async fn send_once(
        &self,
        url: &url::Url,
        method: &hyper::Method,
        headers: &[Outgoing],
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>, GatewayError> {
        let host = url.host_str().unwrap_or_default().to_owned();
        let port = url.port_or_known_default().unwrap_or(80);
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, self.connect(url, &host, port))
            .await
            .map_err(|_| sending(url))?
            .map_err(|e| {
                tracing::debug!(url = %url, error = %e, "http/request: connect failed");
                sending(url)
            })?;
        let mut target = url.path().to_owned();
        if let Some(q) = url.query() {
            target.push('?');
            target.push_str(q);
        }
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let mut req = hyper::Request::builder().method(method.clone()).uri(target);
        // The caller's own Host, if it gave one (as the reference).
        if !headers.iter().any(|h| h.name == hyper::header::HOST) {
            req = req.header(hyper::header::HOST, authority);
        }
        if !headers.iter().any(|h| h.name == hyper::header::ACCEPT) {
            req = req.header(hyper::header::ACCEPT, "*/*");
        }
        for h in headers {
            req = req.header(h.name.clone(), h.value.clone());
        }
        let body = if body.is_empty() {
            http_body_util::Either::Left(http_body_util::Empty::<Bytes>::new())
        } else {
            http_body_util::Either::Right(http_body_util::Full::new(body))
        };
        let req = req.body(body).map_err(|_| sending(url))?;
        let resp = if url.scheme() == "https" {
            let name =
                rustls::pki_types::ServerName::try_from(host.clone()).map_err(|_| sending(url))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    tracing::debug!(url = %url, error = %e, "http/request: TLS failed");
                    sending(url)
                })?;
            exchange(hyper_util::rt::TokioIo::new(tls), req, url).await?
        } else {
            exchange(hyper_util::rt::TokioIo::new(tcp), req, url).await?
        };
        Ok(resp)
    }

    /// A connection to `host:port` from inside the tenant's namespace.
    async fn connect(
        &self,
        url: &url::Url,
        host: &str,
        port: u16,
    ) -> std::io::Result<tokio::net::TcpStream> {
        let addrs = match url.host() {
            Some(url::Host::Ipv4(a)) => vec![a],
            Some(url::Host::Domain(d)) => super::dns::lookup(&self.sockets, false, d).await?.0,
            _ => {
                return Err(std::io::Error::other(format!(
                    "{host}: the tenant's network has no IPv6"
                )));
            }
        };
        let mut last = std::io::Error::other("no address");
        for a in addrs {
            let sock = self.sockets.tcp_plain().await?;
            match sock.connect((a, port).into()).await {
                Ok(c) => {
                    let _ = c.set_nodelay(true);
                    return Ok(c);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Send `req` on `io` (HTTP/1.1); the connection is driven by a task of
/// its own until the response's body is read.
async fn exchange<T, B>(
    io: T,
    req: hyper::Request<B>,
    url: &url::Url,
) -> Result<hyper::Response<Incoming>, GatewayError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|_| sending(url))?;
    crate::task::start("http-request-connection", async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| {
        tracing::debug!(url = %url, error = %e, "http/request: no response");
        sending(url)
    })
}

fn check_scheme(url: &url::Url) -> Result<(), String> {
    match url.scheme() {
        "http" | "https" => Ok(()),
        other => Err(other.to_owned()),
    }
}

/// The URL's host as the policy compares it.
fn url_host(url: &url::Url) -> String {
    match url.host() {
        Some(url::Host::Domain(d)) => normalize_host(d).unwrap_or_else(|| d.to_owned()),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

/// The `Referer` for a redirect from `url`: no fragment, no credentials;
/// only its origin when the redirect leaves it (as the reference).
fn referer(url: &url::Url, same_origin: bool) -> String {
    if !same_origin {
        return format!("{}/", url.origin().ascii_serialization());
    }
    let mut r = url.clone();
    r.set_fragment(None);
    let _ = r.set_username("");
    let _ = r.set_password(None);
    r.to_string()
}

/// Read a whole body (at most [`MAX_BUFFERED_BODY_BYTES`]) before `deadline`.
pub async fn read_all(
    mut body: Incoming,
    deadline: Option<Instant>,
) -> Result<Bytes, GatewayError> {
    let read_failed = || {
        GatewayError::Internal(
            "failed to read http/request response body: error decoding response body".to_owned(),
        )
    };
    let collect = async {
        let mut out = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| read_failed())?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > MAX_BUFFERED_BODY_BYTES {
                    return Err(GatewayError::Internal(format!(
                        "http/request response body is over {} MiB; ask with streamResponse",
                        MAX_BUFFERED_BODY_BYTES >> 20
                    )));
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(out.freeze())
    };
    match deadline {
        Some(d) => tokio::time::timeout_at(d, collect)
            .await
            .map_err(|_| read_failed())?,
        None => collect.await,
    }
}

/// The next piece of a streamed body, at most [`MAX_DELTA_BYTES`]:
/// `Ok(None)` at its end.
pub async fn next_delta(
    body: &mut Incoming,
    pending: &mut Bytes,
    deadline: Option<Instant>,
) -> Result<Option<Bytes>, String> {
    let decode = "error decoding response body".to_owned();
    loop {
        if !pending.is_empty() {
            let n = pending.len().min(MAX_DELTA_BYTES);
            return Ok(Some(pending.split_to(n)));
        }
        let frame = match deadline {
            Some(d) => match tokio::time::timeout_at(d, body.frame()).await {
                Ok(f) => f,
                Err(_) => return Err(decode),
            },
            None => body.frame().await,
        };
        match frame {
            None => return Ok(None),
            Some(Err(_)) => return Err(decode),
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    *pending = data;
                }
            }
        }
    }
}

/// A URL's percent-encoded user or password, decoded.
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}
