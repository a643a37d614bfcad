//! Preview URLs (docs/preview.md): HTTP and websocket requests into a
//! port on a session's own loopback, inside its tenant's network
//! namespace, by host name (`{port}-{session}.{domain}`) or by path on
//! the client listener (`/preview/{session}/{port}/…`).
//!
//! - `route`: what a request's host or path names.
//! - `grant`: signed preview URLs (an HMAC of the session, port, tenant,
//!   expiry and revocation epoch), exchanged for a host-scoped cookie.
//! - `ports`: one session's previewed ports: public or not, their
//!   revocation epochs, and the connections open into them (bounded).
//! - `api`: `gateway/preview/create|revoke|list`, answered by `dispatch`.
//! - `proxy`: one request passed to the server inside and its answer
//!   back, with headers the server can trust, bodies bounded, websocket
//!   upgrades spliced.
//!
//! Its seam into the rest: the client listener's door
//! (`transport::preview`) decides who may open what and connects inside
//! the namespace (`forward::connect`); sessions hold their [`Ports`].

pub mod api;
pub mod grant;
mod ports;
pub mod proxy;
pub mod route;

pub use ports::{Admission, MAX_PORTS_PER_SESSION, Ports, Refusal, Via};

/// The cookie a signed URL becomes on a plain-HTTP preview domain.
pub const COOKIE: &str = "exg_preview";
/// The cookie a signed URL becomes over HTTPS: the `__Host-` prefix
/// makes the browser refuse one set with a `Domain` or from another
/// host name, so no other preview can plant or widen it.
pub const SECURE_COOKIE: &str = "__Host-exg_preview";

/// Whether `pair` (`name=value` from a `Cookie` header, or the first
/// part of a `Set-Cookie`) is the gateway's preview cookie.
pub fn is_preview_cookie(pair: &str) -> bool {
    let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
    name == COOKIE || name == SECURE_COOKIE
}

/// Every value of the preview cookie among a request's `Cookie` headers
/// (a page of another preview may have planted more than one: each is
/// tried). Over HTTPS only the `__Host-` name counts, which no other host
/// name can set.
pub fn cookie_values<'a>(cookies: impl Iterator<Item = &'a str>, secure: bool) -> Vec<&'a str> {
    cookies
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(n, _)| *n == SECURE_COOKIE || (!secure && *n == COOKIE))
        .map(|(_, v)| v)
        .take(MAX_COOKIES_TRIED)
        .collect()
}

/// Preview cookies of one request checked at most.
pub const MAX_COOKIES_TRIED: usize = 8;
