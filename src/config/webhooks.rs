//! `[webhooks]`: lifecycle events POSTed to endpoints, signed per the
//! Standard Webhooks specification (module `webhooks`, docs/webhooks.md).
//! Unsafe settings are refused at start: plain `http://` anywhere but
//! loopback (the events name tenants, sessions and command outcomes, and
//! their signatures would be replayable), a URL with credentials, a
//! secret that is not the spec's `whsec_` form of 24 to 64 bytes, a filter
//! that matches no event type.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Deserialize;

use super::common::{ConfigError, duration, positive};
use crate::webhooks::{self as wh, EventFilter, Secret};
pub use crate::webhooks::{EndpointSettings, WebhookSettings};

/// `[webhooks]`, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Where messages wait until delivered (absolute). Default
    /// `<state dir>/webhooks`.
    pub spool_dir: Option<PathBuf>,
    /// Messages waiting at once (each endpoint's copy counts). Default
    /// 100000.
    pub queue_events: Option<usize>,
    /// Their bodies' bytes. Default 256 MiB.
    pub queue_bytes: Option<usize>,
    /// A larger event is dropped (counted). Default 64 KiB, at most 1 MiB.
    pub max_event_bytes: Option<usize>,
    #[serde(default)]
    pub endpoints: Vec<EndpointConfig>,
}

/// `[[webhooks.endpoints]]`, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub name: String,
    pub url: String,
    /// Files each holding one `whsec_…` secret; every one signs each
    /// message (list the new one beside the old to rotate).
    #[serde(default)]
    pub secret_files: Vec<PathBuf>,
    /// Types, `family.*` or `*`. Default `["*"]`.
    pub events: Option<Vec<String>>,
    /// Only these tenants' events. Default: all (and those of no tenant).
    pub tenants: Option<Vec<String>>,
    /// One attempt, connect to response head. Default 10s.
    pub timeout: Option<String>,
    /// Default 15.
    pub max_attempts: Option<u32>,
    /// Given up past this age. Default 24h.
    pub max_age: Option<String>,
    /// Default 1s, doubled after each failure.
    pub retry_initial: Option<String>,
    /// Default 10m; also caps `Retry-After`.
    pub retry_max: Option<String>,
    /// Attempts at once. Default 8.
    pub concurrency: Option<usize>,
    /// PEM roots trusted beside the public web roots.
    pub ca_file: Option<PathBuf>,
}

/// Most messages waiting at once that a configuration may ask for.
pub const MAX_QUEUE_EVENTS: usize = 10_000_000;

pub(super) fn validate_webhooks(
    c: Option<WebhooksConfig>,
) -> Result<Option<WebhookSettings>, ConfigError> {
    let Some(c) = c else { return Ok(None) };
    let err = |m: String| ConfigError(format!("webhooks: {m}"));
    if c.endpoints.is_empty() {
        return Err(err("no [[webhooks.endpoints]]".to_owned()));
    }
    if c.endpoints.len() > wh::MAX_ENDPOINTS {
        return Err(err(format!("at most {} endpoints", wh::MAX_ENDPOINTS)));
    }
    let spool_dir = match c.spool_dir {
        Some(p) if p.is_absolute() => crate::fs::normalize(&p),
        Some(p) => return Err(err(format!("spool_dir `{}` must be absolute", p.display()))),
        None => super::common::state_dir()?.join("webhooks"),
    };
    let queue_events = positive(
        "webhooks.queue_events",
        c.queue_events,
        wh::DEFAULT_QUEUE_EVENTS,
    )?;
    if queue_events > MAX_QUEUE_EVENTS {
        return Err(err(format!(
            "queue_events must be at most {MAX_QUEUE_EVENTS}"
        )));
    }
    let max_event_bytes = c.max_event_bytes.unwrap_or(wh::DEFAULT_MAX_EVENT_BYTES);
    if !(1024..=wh::MAX_EVENT_BYTES_LIMIT).contains(&max_event_bytes) {
        return Err(err(format!(
            "max_event_bytes must be 1024 to {}",
            wh::MAX_EVENT_BYTES_LIMIT
        )));
    }
    let queue_bytes = c.queue_bytes.unwrap_or(wh::DEFAULT_QUEUE_BYTES);
    if queue_bytes < max_event_bytes {
        return Err(err(
            "queue_bytes must hold at least one event of max_event_bytes".to_owned(),
        ));
    }
    let mut endpoints = Vec::new();
    let mut names = BTreeSet::new();
    for e in c.endpoints {
        let s = validate_endpoint(e)?;
        if !names.insert(s.name.clone()) {
            return Err(err(format!("two endpoints are named `{}`", s.name)));
        }
        endpoints.push(s);
    }
    Ok(Some(WebhookSettings {
        spool_dir,
        queue_events,
        queue_bytes,
        max_event_bytes,
        endpoints,
    }))
}

fn is_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn validate_endpoint(e: EndpointConfig) -> Result<EndpointSettings, ConfigError> {
    if !is_name(&e.name) {
        return Err(ConfigError(format!(
            "webhooks.endpoints: name `{}` must be 1 to 64 letters, digits, `_` or `-`",
            e.name
        )));
    }
    let at = format!("webhooks.endpoints `{}`", e.name);
    let err = |m: String| ConfigError(format!("{at}: {m}"));
    let url = check_url(&e.url).map_err(err)?;
    if e.secret_files.is_empty() {
        return Err(err(
            "needs secret_files (one or more `whsec_…` files)".to_owned()
        ));
    }
    if e.secret_files.len() > wh::MAX_SECRETS {
        return Err(err(format!("at most {} secret_files", wh::MAX_SECRETS)));
    }
    let mut secrets = Vec::new();
    for f in &e.secret_files {
        let text = std::fs::read_to_string(f)
            .map_err(|x| err(format!("cannot read secret file {}: {x}", f.display())))?;
        secrets.push(Secret::parse(&text).map_err(|x| err(format!("{}: {x}", f.display())))?);
    }
    let events = match &e.events {
        None => EventFilter::ALL,
        Some(p) => EventFilter::parse(p).map_err(|x| err(format!("events: {x}")))?,
    };
    let tenants = e.tenants.map(|t| t.into_iter().collect::<BTreeSet<_>>());
    if tenants.as_ref().is_some_and(BTreeSet::is_empty) {
        return Err(err(
            "tenants = [] receives nothing; leave it out for all".to_owned()
        ));
    }
    let d = |field: &str, v: &Option<String>, default| {
        duration(&format!("{at}: {field}"), v.as_deref(), default)
    };
    let timeout = d("timeout", &e.timeout, wh::DEFAULT_TIMEOUT)?;
    let max_age = d("max_age", &e.max_age, wh::DEFAULT_MAX_AGE)?;
    let retry_initial = d("retry_initial", &e.retry_initial, wh::DEFAULT_RETRY_INITIAL)?;
    let retry_max = d("retry_max", &e.retry_max, wh::DEFAULT_RETRY_MAX)?;
    if timeout.is_zero() || retry_initial.is_zero() || retry_max < retry_initial {
        return Err(err(
            "timeout and retry_initial must be over zero, retry_max at least retry_initial"
                .to_owned(),
        ));
    }
    let max_attempts = e.max_attempts.unwrap_or(wh::DEFAULT_MAX_ATTEMPTS);
    if max_attempts == 0 {
        return Err(err("max_attempts must be at least 1".to_owned()));
    }
    let concurrency = positive(
        &format!("{at}: concurrency"),
        e.concurrency,
        wh::DEFAULT_CONCURRENCY,
    )?;
    if let Some(ca) = &e.ca_file {
        let pem = std::fs::read(ca).map_err(|x| err(format!("ca_file {}: {x}", ca.display())))?;
        match reqwest::Certificate::from_pem_bundle(&pem) {
            Ok(v) if !v.is_empty() => {}
            _ => return Err(err(format!("ca_file {}: no PEM certificate", ca.display()))),
        }
    }
    Ok(EndpointSettings {
        name: e.name,
        url,
        secrets,
        secret_files: e.secret_files,
        events,
        tenants,
        timeout,
        max_attempts,
        max_age,
        retry_initial,
        retry_max,
        concurrency,
        ca_file: e.ca_file,
    })
}

/// `https://` anywhere; `http://` only to a loopback address or
/// `localhost`; no credentials in the URL (they would be logged).
fn check_url(text: &str) -> Result<url::Url, String> {
    let u = url::Url::parse(text).map_err(|e| format!("url `{text}`: {e}"))?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err("url: no user or password in the URL".to_owned());
    }
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    };
    match u.scheme() {
        "https" if u.host().is_some() => Ok(u),
        "http" if loopback => Ok(u),
        "http" => Err(format!(
            "url `{text}`: plain http:// only to loopback (127.0.0.1, [::1], localhost); use https://"
        )),
        s => Err(format!(
            "url `{text}`: scheme `{s}` (https:// or loopback http://)"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn config(
        dir: &std::path::Path,
        endpoint: &str,
    ) -> Result<Option<WebhookSettings>, ConfigError> {
        let text = format!(
            "spool_dir = \"{}/spool\"\n[[endpoints]]\nsecret_files = [\"{}/s\"]\n{endpoint}\n",
            dir.display(),
            dir.display()
        );
        validate_webhooks(Some(toml::from_str(&text).unwrap()))
    }

    #[test]
    fn unsafe_or_broken_settings_are_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("s"),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
        )
        .unwrap();
        let ok = config(
            dir.path(),
            "name = \"a\"\nurl = \"http://127.0.0.1:8080/h\"",
        )
        .unwrap()
        .unwrap();
        assert_eq!(ok.endpoints[0].events, EventFilter::ALL);
        assert_eq!(ok.queue_events, wh::DEFAULT_QUEUE_EVENTS);
        config(
            dir.path(),
            "name = \"a\"\nurl = \"https://hooks.example.com/h\"",
        )
        .unwrap();
        config(dir.path(), "name = \"a\"\nurl = \"http://[::1]:1/h\"").unwrap();
        for (endpoint, says) in [
            (
                "name = \"a\"\nurl = \"http://hooks.example.com/h\"",
                "only to loopback",
            ),
            (
                "name = \"a\"\nurl = \"http://10.0.0.1/h\"",
                "only to loopback",
            ),
            ("name = \"a\"\nurl = \"ftp://127.0.0.1/h\"", "scheme"),
            (
                "name = \"a\"\nurl = \"https://u:p@hooks.example.com/h\"",
                "no user",
            ),
            ("name = \"a/b\"\nurl = \"https://h.example/\"", "letters"),
            (
                "name = \"a\"\nurl = \"https://h.example/\"\nevents = [\"proces.*\"]",
                "matches no event type",
            ),
            (
                "name = \"a\"\nurl = \"https://h.example/\"\ntenants = []",
                "receives nothing",
            ),
            (
                "name = \"a\"\nurl = \"https://h.example/\"\nmax_attempts = 0",
                "max_attempts",
            ),
            (
                "name = \"a\"\nurl = \"https://h.example/\"\nretry_initial = \"10s\"\nretry_max = \"1s\"",
                "retry_max",
            ),
        ] {
            let e = config(dir.path(), endpoint).unwrap_err().to_string();
            assert!(e.contains(says), "{endpoint}: {e}");
        }
        std::fs::write(dir.path().join("s"), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let e = config(dir.path(), "name = \"a\"\nurl = \"https://h.example/\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("whsec_"), "{e}");
        let e = validate_webhooks(Some(
            toml::from_str(
                "spool_dir = \"rel\"\n[[endpoints]]\nname = \"a\"\nurl = \"https://h.example/\"",
            )
            .unwrap(),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("absolute"), "{e}");
        let e = validate_webhooks(Some(WebhooksConfig::default()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no [[webhooks.endpoints]]"), "{e}");
    }
}
