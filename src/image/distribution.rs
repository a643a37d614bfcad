//! The distribution protocol's client side, as a hostile registry meets
//! it: every body read to a bound (a token reply, a manifest, a blob to
//! its descriptor's size), no redirect followed for a token or a manifest
//! and for a blob only to `https` on a public host (`hops`),
//! credentials sent only over TLS (or to the registry itself), a token
//! only asked of the registry's own host or one `[images] registries`
//! lists, a transfer that crawls cut off, and nothing a registry says
//! echoed to a tenant but its status code: a failed connection or
//! transfer is told as such, its io or TLS error only logged
//! ([`transfer_failed`]), so a tenant cannot probe the gateway's network
//! through a registry it controls. (`oci-client` reads token and manifest
//! replies whole, unbounded: it parses references here, nothing more.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};

use super::ImageError;
use crate::config::ImagesSettings;

/// A token reply is at most this.
pub const MAX_TOKEN_REPLY_BYTES: u64 = 64 << 10;
/// Time to connect, and between two reads of an answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// A blob that arrives slower than this on average, once
/// [`RATE_GRACE`] has passed, is cut off: a registry that drips cannot
/// hold a pull slot for all of `pull_timeout`.
pub const MIN_BYTES_PER_SECOND: u64 = 64 << 10;
const RATE_GRACE: Duration = Duration::from_secs(20);

/// One repository of one registry.
pub struct Registry {
    http: reqwest::Client,
    blobs: reqwest::Client,
    /// `scheme://host/v2/repository`.
    base: String,
    registry: String,
    repository: String,
    insecure: bool,
    basic: Option<HeaderValue>,
    /// Registries the operator allows (a token service must be one, or
    /// the registry's own host).
    allowed: Vec<String>,
    auth: tokio::sync::Mutex<Option<HeaderValue>>,
    /// What a token is asked for: `pull`, or `pull,push` ([`Self::pushing`]).
    actions: &'static str,
}

/// A failed request or body read, as a tenant is told of it: a refused
/// redirect's reason, or "could not connect" / "transfer failed", never
/// the io or TLS error's text (a tenant whose registry redirects to a port
/// of the gateway's network would read "connection refused" against
/// "tls handshake eof": a port scan). The cause goes to the log, at warn,
/// with the host the request was for.
pub fn transfer_failed(what: &str, e: reqwest::Error) -> ImageError {
    let host = e.url().and_then(|u| u.host_str()).unwrap_or("-").to_owned();
    let e = e.without_url();
    let mut text = e.to_string();
    let mut refused = None;
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        if let Some(r) = c.downcast_ref::<hops::Refused>() {
            refused = Some(r.0);
        }
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    tracing::warn!(host, what, error = %crate::audit::clip(&text), "registry transfer failed");
    let told = match refused {
        Some(why) => format!("the registry's redirect was refused: {why}"),
        None if e.is_connect() => "could not connect (the gateway's log says why)".to_owned(),
        None => "transfer failed (the gateway's log says why)".to_owned(),
    };
    ImageError::Unavailable(format!("{what}: {told}"))
}

impl Registry {
    pub fn new(
        reference: &oci_client::Reference,
        settings: &ImagesSettings,
    ) -> Result<Registry, ImageError> {
        let registry = reference.registry().to_owned();
        let insecure = settings.insecure_registries.contains(&registry);
        let ca = match &settings.ca_file {
            Some(p) => Some(std::fs::read(p).map_err(|e| {
                ImageError::Unavailable(format!("images.ca_file {}: {e}", p.display()))
            })?),
            None => None,
        };
        let client =
            |redirect: reqwest::redirect::Policy| -> Result<reqwest::ClientBuilder, ImageError> {
                let mut b = reqwest::Client::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .read_timeout(READ_TIMEOUT)
                    .redirect(redirect)
                    .user_agent("exec-gateway");
                if let Some(pem) = &ca {
                    for cert in reqwest::Certificate::from_pem_bundle(pem)
                        .map_err(|e| ImageError::Unavailable(format!("images.ca_file: {e}")))?
                    {
                        b = b.add_root_certificate(cert);
                    }
                }
                Ok(b)
            };
        let built = |b: reqwest::ClientBuilder| {
            b.build().map_err(|e| transfer_failed("registry client", e))
        };
        // A blob may live elsewhere (a registry's storage, a CDN): over TLS
        // only, three hops at most, to a public host or the registry
        // pulled from (`hops`); reqwest drops the credentials on another
        // host. Not to another listed registry on an internal address:
        // a registry of one tenant's would hand another tenant's
        // internal registry's blobs to its tenants by redirect.
        let listed = hops::Listed::new([reference.resolve_registry()].into_iter());
        let blobs = built(
            client(hops::policy(listed.clone()))?.dns_resolver(Arc::new(hops::PublicOnly(listed))),
        )?;
        let basic = match settings.credentials.get(&registry) {
            Some(c) => {
                let password = std::fs::read_to_string(&c.password_file).map_err(|e| {
                    ImageError::Unavailable(format!(
                        "images.credentials.\"{registry}\".password_file: {e}"
                    ))
                })?;
                let raw = format!("{}:{}", c.username, password.trim_end_matches(['\r', '\n']));
                let mut v = HeaderValue::from_str(&format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(raw)
                ))
                .map_err(|_| {
                    ImageError::Unavailable("registry credentials: not a header value".to_owned())
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(Registry {
            http: built(client(reqwest::redirect::Policy::none())?)?,
            blobs,
            base: format!(
                "{}://{}/v2/{}",
                if insecure { "http" } else { "https" },
                reference.resolve_registry(),
                reference.repository()
            ),
            registry,
            repository: reference.repository().to_owned(),
            insecure,
            basic,
            allowed: settings.registries.clone(),
            auth: tokio::sync::Mutex::new(None),
            actions: "pull",
        })
    }

    /// GET `path` (below the repository), authenticating when the
    /// registry asks (once); for a blob, redirects to `https` are followed.
    pub async fn get(
        &self,
        path: &str,
        accept: Option<&str>,
        blob: bool,
    ) -> Result<reqwest::Response, ImageError> {
        let url = format!("{}/{path}", self.base);
        let client = if blob { &self.blobs } else { &self.http };
        for attempt in 0..2 {
            let mut req = client.get(&url);
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            if let Some(h) = self.auth.lock().await.clone() {
                req = req.header(AUTHORIZATION, h);
            }
            let res = req.send().await.map_err(|e| transfer_failed(path, e))?;
            if res.status() == StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = res.headers().get(WWW_AUTHENTICATE).cloned();
                let header = self.authenticate(challenge.as_ref()).await?;
                *self.auth.lock().await = Some(header);
                continue;
            }
            if !res.status().is_success() {
                // Only the status: a registry's words are not a tenant's.
                return Err(ImageError::Unavailable(format!(
                    "{path}: the registry answered {}",
                    res.status()
                )));
            }
            return Ok(res);
        }
        Err(ImageError::Unavailable(format!(
            "{path}: the registry refused the credentials (401)"
        )))
    }

    /// This client asks for tokens that may push as well as pull.
    pub fn pushing(mut self) -> Registry {
        self.actions = "pull,push";
        self
    }

    /// Send `method` to `target` (a path below the repository, or an
    /// upload's location, which must be on the registry itself),
    /// authenticating when the registry asks (once: `body` makes the
    /// request's body afresh for the second attempt). No redirect is
    /// followed. Any status but a success, and a 404 (told as `None`),
    /// is an error.
    pub async fn send(
        &self,
        method: reqwest::Method,
        target: &str,
        headers: &[(reqwest::header::HeaderName, &str)],
        body: impl Fn() -> Result<Option<reqwest::Body>, ImageError>,
    ) -> Result<Option<reqwest::Response>, ImageError> {
        let url = self.on_registry(target)?;
        let what = target.split('?').next().unwrap_or(target);
        for attempt in 0..2 {
            let mut req = self.http.request(method.clone(), url.clone());
            for (name, value) in headers {
                req = req.header(name, *value);
            }
            if let Some(h) = self.auth.lock().await.clone() {
                req = req.header(AUTHORIZATION, h);
            }
            req = match body()? {
                Some(b) => req.body(b),
                None => req.header(reqwest::header::CONTENT_LENGTH, 0),
            };
            let res = req.send().await.map_err(|e| transfer_failed(what, e))?;
            if res.status() == StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = res.headers().get(WWW_AUTHENTICATE).cloned();
                let header = self.authenticate(challenge.as_ref()).await?;
                *self.auth.lock().await = Some(header);
                continue;
            }
            if res.status() == StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if !res.status().is_success() {
                return Err(ImageError::Unavailable(format!(
                    "{method} {what}: the registry answered {}",
                    res.status()
                )));
            }
            return Ok(Some(res));
        }
        Err(ImageError::Unavailable(format!(
            "{what}: the registry refused the credentials (401)"
        )))
    }

    /// `target` as a URL on this registry: a path below the repository,
    /// or a location the registry gave (absolute, or from its root).
    fn on_registry(&self, target: &str) -> Result<url::Url, ImageError> {
        let base = url::Url::parse(&self.base)
            .map_err(|_| ImageError::Unavailable("the registry's URL".to_owned()))?;
        let url = if target.starts_with('/') || target.contains("://") {
            base.join(target)
        } else {
            url::Url::parse(&format!("{}/{target}", self.base))
        }
        .map_err(|_| ImageError::Unavailable("an upload location that is not a URL".to_owned()))?;
        if url.origin() != base.origin() {
            return Err(ImageError::Unavailable(
                "the registry sent an upload elsewhere (refused)".to_owned(),
            ));
        }
        Ok(url)
    }

    /// The `Authorization` a challenge asks for.
    async fn authenticate(
        &self,
        challenge: Option<&HeaderValue>,
    ) -> Result<HeaderValue, ImageError> {
        let refused =
            |why: &str| ImageError::Unavailable(format!("registry authentication: {why}"));
        let challenge = challenge
            .and_then(|c| c.to_str().ok())
            .ok_or_else(|| refused("401 without a challenge"))?;
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return self.basic.clone().ok_or_else(|| {
                refused("the registry answered 401 and no credentials are configured for it")
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(refused("an unknown challenge"));
        }
        let params = challenge_params(params);
        let get = |k: &str| {
            params
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.as_str())
        };
        let realm = get("realm").ok_or_else(|| refused("a bearer challenge without a realm"))?;
        let realm_url = url::Url::parse(realm).map_err(|_| refused("a realm that is not a URL"))?;
        let host = match (realm_url.host_str(), realm_url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_owned(),
            (None, _) => return Err(refused("a realm without a host")),
        };
        // The token service: the registry's own host or one allowed, over
        // TLS unless it is the insecure registry itself.
        let own = host == self.registry;
        if !(own || self.allowed.contains(&host)) {
            return Err(refused(
                "the token service is not the registry nor in [images] registries",
            ));
        }
        if realm_url.scheme() != "https" && !(own && self.insecure) {
            return Err(refused("the token service is not https"));
        }
        let mut req = self.http.get(realm_url.clone()).query(&[(
            "scope",
            format!("repository:{}:{}", self.repository, self.actions),
        )]);
        if let Some(s) = get("service") {
            req = req.query(&[("service", s)]);
        }
        if let Some(b) = &self.basic {
            req = req.header(AUTHORIZATION, b.clone());
        }
        let res = req
            .send()
            .await
            .map_err(|e| transfer_failed("registry authentication", e))?;
        if !res.status().is_success() {
            return Err(refused(&format!(
                "the token service answered {}",
                res.status()
            )));
        }
        let body = bounded(res, MAX_TOKEN_REPLY_BYTES, "token reply").await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|_| refused("a token reply that is not a token"))?;
        let token = t
            .token
            .or(t.access_token)
            .ok_or_else(|| refused("a token reply without a token"))?;
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| refused("a token that is not a header value"))?;
        v.set_sensitive(true);
        Ok(v)
    }
}

/// `k="v", k2=v2` of a challenge (quoted values may hold commas).
fn challenge_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() && out.len() < 16 {
        let Some((k, after)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().trim_start_matches(',').trim().to_owned();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_owned(), &q[end + 1..]),
                None => (q.to_owned(), ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (after[..end].trim().to_owned(), &after[end..]),
                None => (after.trim().to_owned(), ""),
            }
        };
        out.push((k, v));
        rest = next.trim_start_matches([',', ' ']);
    }
    out
}

/// A response body, at most `limit` bytes.
pub async fn bounded(
    mut res: reqwest::Response,
    limit: u64,
    what: &str,
) -> Result<Vec<u8>, ImageError> {
    let too_large = || ImageError::Refused(format!("{what}: larger than {limit} bytes"));
    if res.content_length().is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| transfer_failed(what, e))? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Cuts off a transfer slower than [`MIN_BYTES_PER_SECOND`].
pub struct Pace {
    started: Instant,
}

impl Pace {
    pub fn start() -> Pace {
        Pace {
            started: Instant::now(),
        }
    }

    pub fn check(&self, bytes: u64, what: &str) -> Result<(), ImageError> {
        let t = self.started.elapsed();
        if t > RATE_GRACE && (bytes as f64) < t.as_secs_f64() * MIN_BYTES_PER_SECOND as f64 {
            return Err(ImageError::Unavailable(format!(
                "{what}: arriving slower than {} KiB/s",
                MIN_BYTES_PER_SECOND >> 10
            )));
        }
        Ok(())
    }
}

/// Where a blob request may go: a redirect is followed only to `https`,
/// without credentials in its URL, three hops at most, and to a host on
/// the public internet or one the operator lists (`[images] registries`,
/// `insecure_registries`: its own mirror). An IP literal is checked here;
/// a name, once resolved, by [`hops::PublicOnly`], which keeps only its
/// public addresses (unless the name is listed).
mod hops {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::sync::Arc;

    use crate::isolation::egress::NON_PUBLIC;

    /// Redirects a blob request follows, at most.
    pub const MAX_HOPS: usize = 3;

    /// Why a redirect was not followed (our words: a tenant may read them).
    #[derive(Debug)]
    pub struct Refused(pub &'static str);

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Refused {}

    /// Whether `ip` is off the public internet: in a range the egress
    /// filter refuses ([`NON_PUBLIC`]: loopback, private, CGNAT,
    /// link-local with the cloud metadata address, unspecified, multicast,
    /// broadcast, unique-local...), or an IPv6 address that embeds such an
    /// IPv4 one (IPv4-compatible, IPv4-mapped, NAT64's `64:ff9b::/96`).
    pub fn internal(ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => {
                let s = v6.segments();
                if s[..6] == [0; 6]
                    || s[..6] == [0, 0, 0, 0, 0, 0xffff]
                    || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                {
                    IpAddr::V4(Ipv4Addr::from(v6.to_bits() as u32))
                } else {
                    ip
                }
            }
            v4 => v4,
        };
        NON_PUBLIC
            .iter()
            .filter_map(|n| n.parse::<ipnet::IpNet>().ok())
            .any(|n| n.contains(&ip))
    }

    /// `(host, host[:port])` of a URL, as `[images] registries` writes a
    /// registry (lowercase, no trailing dot, no default port).
    fn authority(u: &url::Url) -> Option<(String, String)> {
        let host = u.host_str()?.trim_end_matches('.').to_ascii_lowercase();
        let full = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        Some((host, full))
    }

    /// The registries the operator lists (and the one pulled from).
    #[derive(Clone)]
    pub struct Listed(Arc<[(String, String)]>);

    impl Listed {
        pub fn new<'a>(entries: impl Iterator<Item = &'a str>) -> Listed {
            Listed(
                entries
                    .filter_map(|e| url::Url::parse(&format!("https://{e}/")).ok())
                    .filter_map(|u| authority(&u))
                    .collect(),
            )
        }

        fn has(&self, full: &str) -> bool {
            self.0.iter().any(|(_, f)| f == full)
        }

        fn has_host(&self, host: &str) -> bool {
            self.0.iter().any(|(h, _)| h == host)
        }
    }

    /// Why a blob request may not be redirected to `to`, if it may not.
    pub fn refusal(to: &url::Url, hops: usize, listed: &Listed) -> Option<&'static str> {
        if hops >= MAX_HOPS {
            return Some("more than 3 redirects");
        }
        if to.scheme() != "https" {
            return Some("not https");
        }
        if !to.username().is_empty() || to.password().is_some() {
            return Some("credentials in its URL");
        }
        let Some((host, full)) = authority(to) else {
            return Some("no host");
        };
        if listed.has(&full) {
            return None;
        }
        const OWN: &str = "to an address of the gateway's own network (loopback, private, \
                           link-local or otherwise not public)";
        match to.host() {
            Some(url::Host::Ipv4(ip)) if internal(IpAddr::V4(ip)) => Some(OWN),
            Some(url::Host::Ipv6(ip)) if internal(IpAddr::V6(ip)) => Some(OWN),
            Some(url::Host::Domain(_)) if host == "localhost" || host.ends_with(".localhost") => {
                Some(OWN)
            }
            // A listed name resolves as it likes (`PublicOnly` lets it):
            // only its listed port is reachable.
            Some(url::Host::Domain(_)) if listed.has_host(&host) => {
                Some("to a port of a listed registry's host that is not listed")
            }
            _ => None,
        }
    }

    /// The redirect policy of blob requests: [`refusal`], logged.
    pub fn policy(listed: Listed) -> reqwest::redirect::Policy {
        reqwest::redirect::Policy::custom(move |a| {
            match refusal(a.url(), a.previous().len(), &listed) {
                None => a.follow(),
                Some(why) => {
                    let from = a
                        .previous()
                        .last()
                        .and_then(|u| u.host_str())
                        .unwrap_or("-");
                    tracing::warn!(
                        from,
                        to = a.url().host_str().unwrap_or("-"),
                        why,
                        "image blob redirect refused"
                    );
                    a.error(Refused(why))
                }
            }
        })
    }

    /// A resolver that keeps a name's public addresses only, unless the
    /// name is a listed registry's host: a public-looking name (a
    /// redirect's target) that resolves into the gateway's network is not
    /// connected to. (An HTTPS proxy from the environment resolves names
    /// itself: then this filter does not apply.)
    pub struct PublicOnly(pub Listed);

    impl reqwest::dns::Resolve for PublicOnly {
        fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
            let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
            let listed = self.0.has_host(&host);
            Box::pin(async move {
                let found: Vec<SocketAddr> =
                    tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
                let kept: Vec<SocketAddr> = found
                    .iter()
                    .copied()
                    .filter(|a| listed || !internal(a.ip()))
                    .collect();
                if kept.is_empty() {
                    let why = if found.is_empty() {
                        format!("{host}: no address")
                    } else {
                        format!("{host}: resolves only to addresses of the gateway's own network")
                    };
                    return Err(why.into());
                }
                Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::challenge_params;

    #[test]
    fn challenges_parse_with_quoted_commas() {
        let p = challenge_params(
            r#"realm="https://a/token",service="reg, x",scope="repository:r:pull""#,
        );
        assert_eq!(p[0], ("realm".to_owned(), "https://a/token".to_owned()));
        assert_eq!(p[1], ("service".to_owned(), "reg, x".to_owned()));
        assert_eq!(p[2].0, "scope");
    }
}

#[cfg(test)]
mod hop_tests {
    use super::hops::{Listed, internal, refusal};

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    /// Guards the classification behind redirect refusals: every range a
    /// tenant could aim a registry's redirect at inside the gateway's
    /// network is internal, in both families and embedded in IPv6; public
    /// addresses (CDNs) are not.
    #[test]
    fn addresses_of_the_gateways_network_are_internal() {
        for a in [
            "127.0.0.1",
            "127.0.0.2",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::7f00:1",
            "64:ff9b::a00:1",
        ] {
            assert!(internal(ip(a)), "{a} taken for public");
        }
        for a in [
            "8.8.8.8",
            "52.216.0.1",
            "100.128.0.1",
            "172.32.0.1",
            "2600:1f18::1",
            "2a00:1450::1",
            "64:ff9b::808:808",
        ] {
            assert!(!internal(ip(a)), "{a} taken for internal");
        }
    }

    /// Guards the redirect policy: https to a public host is followed;
    /// http, userinfo, an internal IP literal, localhost, a listed host's
    /// other port and a fourth hop are refused; a listed host:port is
    /// followed whatever its address.
    #[test]
    fn blob_redirects_go_to_public_https_hosts_or_listed_ones() {
        let listed = Listed::new(
            [
                "registry.example.com",
                "127.0.0.1:5000",
                "Mirror.Internal:8443",
            ]
            .into_iter(),
        );
        let r = |u: &str, hops| refusal(&url::Url::parse(u).unwrap(), hops, &listed);
        for ok in [
            "https://prod-registry.s3.amazonaws.com/x?sig=1",
            "https://d1.cloudfront.net/x",
            "https://8.8.8.8/x",
            "https://127.0.0.1:5000/v2/x",
            "https://mirror.internal:8443/x",
            "https://registry.example.com/x",
            "https://registry.example.com:443/x",
        ] {
            assert_eq!(r(ok, 0), None, "{ok}");
        }
        for (bad, why) in [
            ("http://cdn.example.net/x", "not https"),
            ("https://user:pw@example.invalid/x", "credentials"),
            ("https://user@cdn.example.net/x", "credentials"),
            ("https://127.0.0.2:5099/x", "own network"),
            ("https://127.0.0.1:9/x", "own network"),
            ("https://2130706433/x", "own network"),
            ("https://[::1]:5099/x", "own network"),
            ("https://[::ffff:7f00:1]/x", "own network"),
            ("https://169.254.169.254/latest/meta-data", "own network"),
            ("https://10.0.0.1/x", "own network"),
            ("https://100.64.1.1/x", "own network"),
            ("https://0.0.0.0:22/x", "own network"),
            ("https://localhost:5099/x", "own network"),
            ("https://LOCALHOST./x", "own network"),
            ("https://api.localhost/x", "own network"),
            ("https://mirror.internal:22/x", "not listed"),
            ("https://registry.example.com:8080/x", "not listed"),
        ] {
            let got = r(bad, 0).unwrap_or_else(|| panic!("{bad} followed"));
            assert!(got.contains(why), "{bad}: {got}");
        }
        assert!(r("https://d1.cloudfront.net/x", 3).is_some_and(|w| w.contains("3 redirects")));
    }

    /// Guards the resolver of blob requests: a name that resolves only
    /// into the gateway's network (`localhost`, from /etc/hosts) gives no
    /// address to connect to, unless a listed registry has that name.
    #[tokio::test]
    async fn names_resolving_into_the_gateways_network_are_not_connected_to() {
        use reqwest::dns::Resolve as _;
        let name = || "localhost".parse::<reqwest::dns::Name>().unwrap();
        let unlisted = super::hops::PublicOnly(Listed::new(["registry.example.com"].into_iter()));
        let err = match unlisted.resolve(name()).await {
            Ok(a) => panic!("localhost resolved to {:?}", a.collect::<Vec<_>>()),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("gateway's own network"), "{err}");
        let listed = super::hops::PublicOnly(Listed::new(["localhost:5000"].into_iter()));
        let addrs: Vec<_> = listed.resolve(name()).await.unwrap().collect();
        assert!(
            addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty(),
            "{addrs:?}"
        );
    }
}
