//! A signed preview URL's first use (docs/preview.md, "Who may open it"):
//! the grant checked, then a 303 to the same URL without it, setting the
//! host-only cookie.

use std::time::{SystemTime, UNIX_EPOCH};

use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use super::{Client, refuse};
use crate::gateway::Gateway;
use crate::preview::Via;
use crate::preview::api::GRANT_PARAM;
use crate::preview::grant::Grant;
use crate::preview::proxy::{ProxyBody, failure};

/// Whether preview host names are served over HTTPS (`[preview]
/// base_url`): the cookie is then `__Host-` and `Secure`.
pub(super) fn is_https(gw: &Gateway) -> bool {
    gw.settings
        .preview
        .base
        .as_ref()
        .is_some_and(|b| b.scheme == "https")
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The grant in a query, and the query without it.
pub(super) fn grant_param(path_and_query: &str) -> Option<(String, String)> {
    let (_, query) = path_and_query.split_once('?')?;
    let mut grant = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((k, v)) if k == GRANT_PARAM => grant = Some(v.to_owned()),
            _ => kept.push(pair),
        }
    }
    Some((grant?, kept.join("&")))
}

/// A signed URL's first use: checked, then a 303 to the same URL without
/// the grant, setting the host-scoped cookie.
pub(super) fn exchange(
    gw: &Gateway,
    client: &Client<'_>,
    (id, port, remote): (&str, u16, bool),
    grant: &str,
    path_and_query: &str,
    kept_query: String,
) -> Response<ProxyBody> {
    let now = now_secs();
    let checked = Grant::verify(grant, &gw.settings.preview.key.0, now);
    let g = match checked {
        Ok(g) if g.session == id && g.port == port => g,
        Ok(_) => {
            return refuse(
                gw,
                client.peer,
                StatusCode::FORBIDDEN,
                "this preview URL is for another session or port",
                None,
                port,
            );
        }
        Err(e) => {
            tracing::info!(reason = e.reason(), "preview URL refused");
            return refuse(
                gw,
                client.peer,
                StatusCode::FORBIDDEN,
                "this preview URL is invalid or has expired",
                None,
                port,
            );
        }
    };
    // A URL of a session that has ended, or one revoked since, is refused
    // here too, not only once its cookie is used.
    let live = gw
        .sessions
        .get(id)
        .filter(|s| *s.tenant.name == *g.tenant)
        .map(|s| s.ports.check(port, &Via::Url { epoch: g.epoch }));
    match live {
        Some(Ok(_)) => {}
        // Another replica's session: its owner checks the cookie on every
        // use (a URL revoked there is refused then).
        None if remote => {}
        Some(Err(_)) => {
            return refuse(
                gw,
                client.peer,
                StatusCode::FORBIDDEN,
                "this preview URL was revoked",
                Some(&g.tenant),
                port,
            );
        }
        None => {
            return refuse(
                gw,
                client.peer,
                StatusCode::FORBIDDEN,
                "this preview URL is invalid or has expired",
                Some(&g.tenant),
                port,
            );
        }
    }
    let path = path_and_query
        .split_once('?')
        .map_or(path_and_query, |(p, _)| p);
    // `//host/…` (or `/\host/…`, which browsers read alike) would be
    // another site to the browser.
    if path.contains('\\') {
        return failure(StatusCode::BAD_REQUEST, "a backslash in the path");
    }
    let path = format!("/{}", path.trim_start_matches('/'));
    let location = if kept_query.is_empty() {
        path
    } else {
        format!("{path}?{kept_query}")
    };
    let secure = is_https(gw);
    let name = if secure {
        crate::preview::SECURE_COOKIE
    } else {
        crate::preview::COOKIE
    };
    let max_age = g.expires.saturating_sub(now);
    let cookie = format!(
        "{name}={grant}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        if secure { "; Secure" } else { "" }
    );
    let mut r = failure(StatusCode::SEE_OTHER, "see other");
    if let (Ok(l), Ok(c)) = (
        HeaderValue::from_str(&location),
        HeaderValue::from_str(&cookie),
    ) {
        r.headers_mut().insert(header::LOCATION, l);
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    crate::audit::emit(
        "preview.exchanged",
        &crate::audit::Who {
            tenant: Some(&g.tenant),
            subject: g.subject.as_deref(),
            session: Some(id),
        },
        serde_json::json!({ "port": port, "peer": client.peer.to_string() }),
    );
    r
}
