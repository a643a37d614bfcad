//! The distribution protocol's client side, as a hostile registry meets
//! it: every body read to a bound (a token reply, a manifest, a blob to
//! its descriptor's size), no redirect followed for a token or a manifest
//! and only to `https` for a blob, credentials sent only over TLS (or to
//! the registry itself), a token only asked of the registry's own host
//! or one `[images] registries` lists, a transfer that crawls cut off,
//! and nothing a registry says echoed to a tenant but its status code.
//! (`oci-client` reads token and manifest replies whole, unbounded: it
//! parses references here, nothing more.)

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
}

fn unavailable(what: &str, e: impl std::error::Error) -> ImageError {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    ImageError::Unavailable(format!("{what}: {}", crate::audit::clip(&text)))
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
        let client = |redirect: reqwest::redirect::Policy| -> Result<reqwest::Client, ImageError> {
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
            b.build().map_err(|e| unavailable("registry client", e))
        };
        // A blob may live elsewhere (a registry's storage): over TLS only,
        // three hops at most; reqwest drops the credentials on another host.
        let blobs = client(reqwest::redirect::Policy::custom(|a| {
            if a.previous().len() < 3 && a.url().scheme() == "https" {
                a.follow()
            } else {
                a.stop()
            }
        }))?;
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
            http: client(reqwest::redirect::Policy::none())?,
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
            let res = req.send().await.map_err(|e| unavailable(path, e))?;
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
        let mut req = self
            .http
            .get(realm_url.clone())
            .query(&[("scope", format!("repository:{}:pull", self.repository))]);
        if let Some(s) = get("service") {
            req = req.query(&[("service", s)]);
        }
        if let Some(b) = &self.basic {
            req = req.header(AUTHORIZATION, b.clone());
        }
        let res = req
            .send()
            .await
            .map_err(|e| unavailable("registry authentication", e))?;
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
    while let Some(chunk) = res.chunk().await.map_err(|e| unavailable(what, e))? {
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
