//! The preview door on the client listener (docs/preview.md): a request
//! whose `Host` is a name under `[preview] base_url`, or whose path is
//! `/preview/{session}/{port}/…`, goes to that port inside the session's
//! network namespace, once the door has decided who may open it:
//!
//! 1. a signed preview URL (`?exg_preview=`, host names only) is checked
//!    and exchanged for a host-scoped HttpOnly cookie (303 to the same
//!    URL without it);
//! 2. a bearer token (`Authorization` only: never a query parameter the
//!    server inside would see) or a client certificate of the session's
//!    tenant, with the `preview` scope;
//! 3. the preview cookie (host names only);
//! 4. a public port: anyone.
//!
//! A request that passes none is refused the same way whether or not the
//! session exists. Each client connection keeps one connection into the
//! session for its next request (keep-alive both sides); websocket
//! upgrades get one of their own.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::limits::Conn;
use crate::gateway::Gateway;
use crate::preview::grant::Grant;
use crate::preview::proxy::{self, Bounds, CallerHeaders, ProxyBody, Target, Upstream, failure};
use crate::preview::route::HostSession;
use crate::preview::{Refusal, Via};
use crate::session::Session;

mod exchange;
mod relay;

use exchange::{exchange, grant_param, is_https, now_secs};

pub use relay::{
    DialIn, DialStream, dial_forward, dial_port, http_refusal, pump_owner, read_open, serve_dial,
};

/// A preview request's destination, as its host or path says.
pub enum Route {
    Host {
        port: u16,
        session: HostSession,
    },
    Path {
        session: String,
        port: u16,
        rest: String,
    },
    Bad(&'static str),
}

/// The route of `req`, if it is a preview request.
pub fn route(req: &Request<Incoming>, gw: &Gateway) -> Option<Route> {
    if let Some(base) = &gw.settings.preview.base
        && let Some(host) = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
        && let Some(r) = crate::preview::route::host(host, &base.domain)
    {
        return Some(match r {
            Ok((port, session)) => Route::Host { port, session },
            Err(why) => Route::Bad(why),
        });
    }
    Some(match crate::preview::route::path(req.uri().path())? {
        Ok((session, port, rest)) => Route::Path {
            session: session.to_owned(),
            port,
            rest: rest.to_owned(),
        },
        Err(why) => Route::Bad(why),
    })
}

/// The upstream connection a client connection keeps for its next
/// request.
#[derive(Default)]
pub struct Kept(Mutex<Option<KeptUpstream>>);

pub(super) struct KeptUpstream {
    session: String,
    port: u16,
    pub(super) up: Upstream,
    pub(super) stop: CancellationToken,
    credentials: String,
    /// A relayed connection: who its owner let in, and the session's
    /// tenant.
    pub(super) relayed: Option<(Via, String, CallerHeaders)>,
}

/// What the door knows about the client connection.
pub struct Client<'a> {
    pub peer: SocketAddr,
    pub conn: &'a Arc<Conn>,
    pub cert: Option<&'a [u8]>,
    pub tls: bool,
    pub kept: &'a Arc<Kept>,
}

pub(super) fn refuse(
    gw: &Gateway,
    peer: SocketAddr,
    status: StatusCode,
    why: &str,
    tenant: Option<&str>,
    port: u16,
) -> Response<ProxyBody> {
    let _ = gw;
    crate::audit::emit(
        "preview.refused",
        &crate::audit::Who {
            tenant,
            subject: None,
            session: None,
        },
        serde_json::json!({
            "port": port,
            "status": status.as_u16(),
            "reason": why,
            "peer": peer.to_string(),
        }),
    );
    failure(status, why)
}

/// Serve one preview request.
pub async fn serve(
    req: Request<Incoming>,
    gw: &Arc<Gateway>,
    route: Route,
    client: Client<'_>,
) -> Response<ProxyBody> {
    // Two Host headers (RFC 9112 3.2: a 400): the app must not see one
    // the gateway did not route by.
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return failure(StatusCode::BAD_REQUEST, "more than one Host header");
    }
    let (id, port, host_mode, path_and_query, path_prefix) = match route {
        Route::Bad(why) => return failure(StatusCode::BAD_REQUEST, why),
        Route::Host { session, .. } if gw.fleet.is_none() && session.replica.is_some() => {
            return failure(
                StatusCode::BAD_REQUEST,
                "a preview host name is {port}-{session}.{domain}",
            );
        }
        Route::Host { port, session } => {
            let pq = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            (session.id(), port, true, pq, None)
        }
        Route::Path {
            session,
            port,
            rest,
        } => {
            let query = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            if rest.is_empty() {
                // Relative links resolve under the port's own path.
                let mut r = failure(StatusCode::PERMANENT_REDIRECT, "moved");
                let to = format!("/preview/{session}/{port}/{query}");
                if let Ok(v) = HeaderValue::from_str(&to) {
                    r.headers_mut().insert(header::LOCATION, v);
                }
                return r;
            }
            let p = format!("/preview/{session}/{port}");
            (session, port, false, format!("{rest}{query}"), Some(p))
        }
    };
    let owner = match &gw.fleet {
        Some(f) => match f.owner(&id) {
            // A replica the fleet does not know: like an unknown session
            // (never dialled on a stranger's word).
            crate::fleet::Owner::Peer(r) if f.peer_address(r).is_none() => None,
            crate::fleet::Owner::Peer(r) => Some(r.to_owned()),
            _ => None,
        },
        None => None,
    };
    // 1. A signed URL, exchanged for a cookie.
    if host_mode && let Some((grant, kept_query)) = grant_param(&path_and_query) {
        return exchange(
            gw,
            &client,
            (&id, port, owner.is_some()),
            &grant,
            &path_and_query,
            kept_query,
        );
    }
    let secure = is_https(gw);
    let cookies: Vec<String> = if host_mode {
        crate::preview::cookie_values(
            req.headers()
                .get_all(header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok()),
            secure,
        )
        .into_iter()
        .map(str::to_owned)
        .collect()
    } else {
        Vec::new()
    };
    let token = crate::auth::bearer_token(
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
        None,
    );
    let is_upgrade = req.headers().contains_key(header::UPGRADE);
    // A page of another preview (every preview host name is one site to
    // a browser, so SameSite lets the cookie go) must not open a websocket
    // or send a form with the victim's cookie: those need the preview's
    // own origin.
    let cross_site = (is_upgrade
        || !matches!(
            *req.method(),
            hyper::Method::GET | hyper::Method::HEAD | hyper::Method::OPTIONS
        ))
        && !same_origin(&req, secure);
    // What the kept connection was let in with: a relayed one is used
    // again only for the same credentials (its owner checked those).
    let credentials = format!("{token:?}{cookies:?}");
    let kept = if is_upgrade {
        None
    } else {
        client.kept.0.lock().take().filter(|k| {
            k.session == id
                && k.port == port
                && k.up.is_ready()
                && !k.stop.is_cancelled()
                && (owner.is_none() || k.credentials == credentials)
        })
    };
    let opened = match &owner {
        None => local(gw, &client, (&id, port), token.as_deref(), &cookies, kept).await,
        Some(replica) => {
            relay::dial(
                gw,
                &client,
                replica,
                (&id, port),
                (token.as_deref(), &cookies),
                kept,
            )
            .await
        }
    };
    let Opened {
        mut up,
        stop,
        via,
        caller,
        tenant,
    } = match opened {
        Ok(o) => o,
        Err(r) => return *r,
    };
    // The one check of a cookie's origin: for every request, a kept
    // connection's and a relayed one's included.
    if cross_site && matches!(via, Via::Url { .. }) {
        return refuse(
            gw,
            client.peer,
            StatusCode::FORBIDDEN,
            CROSS_SITE,
            Some(&tenant.name),
            port,
        );
    }
    let relayed = owner
        .is_some()
        .then(|| (via.clone(), tenant.name.to_string(), caller.clone()));
    if client.conn.promote(&tenant).is_err() {
        return refuse(
            gw,
            client.peer,
            StatusCode::SERVICE_UNAVAILABLE,
            "connection limit reached; retry later",
            Some(&tenant.name),
            port,
        );
    }
    let target = Target {
        path_and_query,
        prefix: path_prefix,
        host_mode,
        caller,
        peer: client.peer,
        proto: if client.tls { "https" } else { "http" },
        strip_authorization: via == Via::Token,
    };
    let settings = &gw.settings.preview;
    tenant.metrics.preview_requests.inc();
    let bounds = Bounds {
        response_timeout: settings.response_timeout,
        idle_timeout: settings.idle_timeout,
        inbound: tenant.inbound.clone(),
        outbound: tenant.outbound.clone(),
        stop: stop.clone(),
    };
    let resp = proxy::send(&mut up, req, &target, &bounds).await;
    if !is_upgrade {
        *client.kept.0.lock() = Some(KeptUpstream {
            session: id,
            port,
            up,
            stop,
            credentials,
            relayed,
        });
    }
    resp
}

/// A connection into the session's port, and who it let in.
pub(super) struct Opened {
    pub up: Upstream,
    pub stop: CancellationToken,
    pub via: Via,
    pub caller: CallerHeaders,
    /// The session's tenant: its connection slots and byte budgets.
    pub tenant: Arc<crate::tenant::Tenant>,
}

/// The refusal of a cookie's request from another origin.
pub(super) const CROSS_SITE: &str =
    "a request from another origin may not use this preview's cookie";

/// A preview of a session of this replica: who may open it decided here,
/// the kept connection used again or a new one made.
async fn local(
    gw: &Arc<Gateway>,
    client: &Client<'_>,
    (id, port): (&str, u16),
    token: Option<&str>,
    cookies: &[String],
    kept: Option<KeptUpstream>,
) -> Result<Opened, Box<Response<ProxyBody>>> {
    let cookies: Vec<&str> = cookies.iter().map(String::as_str).collect();
    let cert = client.cert;
    let (session, via, caller) = admit(
        gw,
        client.peer,
        cert,
        client.conn.answer_by(),
        (id, port),
        token,
        &cookies,
    )
    .await?;
    let revoked = session
        .ports
        .check(port, &via)
        .map_err(|e| Box::new(refusal(gw, client.peer, &session, port, e)))?;
    let (up, stop) = match kept {
        Some(k) => (k.up, k.stop),
        None => {
            let (tcp, hold, stop) =
                connect_inside(gw, client.peer, &session, port, &via, revoked).await?;
            let up = Upstream::handshake(tcp, hold, stop.clone())
                .await
                .map_err(|e| {
                    tracing::info!(error = %e, "preview: upstream handshake");
                    Box::new(failure(
                        StatusCode::BAD_GATEWAY,
                        "the server in the session did not speak HTTP",
                    ))
                })?;
            (up, stop)
        }
    };
    Ok(Opened {
        up,
        stop,
        via,
        caller,
        tenant: session.tenant.clone(),
    })
}

/// Who may open the preview: a token or certificate with the `preview`
/// scope, the preview cookie, or nothing for a public port. A token that
/// does not verify is refused only if nothing else lets the request in
/// (on a public port an `Authorization` header may be the app's own).
pub(super) async fn admit(
    gw: &Arc<Gateway>,
    peer: SocketAddr,
    cert: Option<&[u8]>,
    answer_by: Option<tokio::time::Instant>,
    (id, port): (&str, u16),
    token: Option<&str>,
    cookies: &[&str],
) -> Result<(Arc<Session>, Via, CallerHeaders), Box<Response<ProxyBody>>> {
    let refused = |status, why: &str, tenant: Option<&str>| {
        Box::new(refuse(gw, peer, status, why, tenant, port))
    };
    let mut token_error = None;
    if token.is_some() || (cert.is_some() && cookies.is_empty()) {
        let authenticated =
            crate::transport::authenticate::authenticate_with(gw, token, cert, answer_by).await;
        match authenticated {
            Ok(caller) => {
                if !caller
                    .principal()
                    .scopes
                    .grants(crate::auth::Scope::Preview)
                {
                    return Err(refused(
                        StatusCode::FORBIDDEN,
                        "the token lacks the preview scope",
                        Some(&caller.tenant().name),
                    ));
                }
                // Another tenant's session answers like an unknown one.
                let Ok(session) = gw.sessions.lookup(caller.tenant(), id) else {
                    return Err(refused(
                        StatusCode::NOT_FOUND,
                        "unknown session id",
                        Some(&caller.tenant().name),
                    ));
                };
                let headers = CallerHeaders {
                    tenant: Some(caller.tenant().name.to_string()),
                    subject: caller.principal().subject.clone(),
                    via: "token",
                };
                return Ok((session, Via::Token, headers));
            }
            Err(e) if token.is_some() => token_error = Some(e),
            // A certificate that names no tenant: a public port may still
            // let the request in.
            Err(_) => {}
        }
    }
    let key = &gw.settings.preview.key.0;
    let now = now_secs();
    for text in cookies {
        if let Ok(g) = Grant::verify(text, key, now)
            && g.session == id
            && g.port == port
            && let Some(session) = gw.sessions.get(id)
            && *session.tenant.name == *g.tenant
        {
            let headers = CallerHeaders {
                tenant: Some(g.tenant.clone()),
                subject: g.subject.clone(),
                via: "url",
            };
            return Ok((session, Via::Url { epoch: g.epoch }, headers));
        }
    }
    if let Some(session) = gw.sessions.get(id)
        && session.ports.is_public(port)
    {
        let headers = CallerHeaders {
            tenant: None,
            subject: None,
            via: "public",
        };
        return Ok((session, Via::Public, headers));
    }
    if let Some(e) = token_error {
        let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::UNAUTHORIZED);
        return Err(refused(status, &e.to_string(), None));
    }
    let mut r = refuse(
        gw,
        peer,
        StatusCode::UNAUTHORIZED,
        "this preview needs a token of the preview scope, a preview URL, or a public port",
        None,
        port,
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Err(Box::new(r))
}

/// Whether a request comes from the preview's own origin: its `Origin`
/// names the host it was sent to, or (no `Origin`) its `Sec-Fetch-Site`
/// says same-origin or none; a request with neither is not a browser
/// page's.
fn same_origin(req: &Request<Incoming>, secure: bool) -> bool {
    let h = req.headers();
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
    if h.get_all(header::ORIGIN).iter().count() > 1 {
        return false;
    }
    if let Some(origin) = h.get(header::ORIGIN) {
        let scheme = if secure { "https" } else { "http" };
        return host.is_some_and(|host| {
            origin
                .to_str()
                .is_ok_and(|o| o.eq_ignore_ascii_case(&format!("{scheme}://{host}")))
        });
    }
    match h.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site) => matches!(site, "same-origin" | "none"),
        None => true,
    }
}

pub(super) fn refusal(
    gw: &Gateway,
    peer: SocketAddr,
    session: &Session,
    port: u16,
    r: Refusal,
) -> Response<ProxyBody> {
    let (status, why) = match r {
        Refusal::Revoked => (StatusCode::FORBIDDEN, "this preview URL was revoked"),
        Refusal::NotPublic => (StatusCode::UNAUTHORIZED, "this port is no longer public"),
        Refusal::Full => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the session's preview connections (max_connections_per_session) are all open",
        ),
    };
    refuse(gw, peer, status, why, Some(&session.tenant.name), port)
}

/// A new connection into the session's port: one of the session's
/// preview connections and one of the tenant's streams, held (with the
/// session kept alive, for a token holder) by whoever holds the returned
/// [`proxy::Hold`]; its token ends at `revoked` or the session's end, and
/// never merely because the connection closed.
pub(super) async fn connect_inside(
    gw: &Gateway,
    peer: SocketAddr,
    session: &Arc<Session>,
    port: u16,
    via: &Via,
    revoked: CancellationToken,
) -> Result<(tokio::net::TcpStream, proxy::Hold, CancellationToken), Box<Response<ProxyBody>>> {
    let refused = |status, why: &str| {
        Box::new(refuse(
            gw,
            peer,
            status,
            why,
            Some(&session.tenant.name),
            port,
        ))
    };
    let Some(net) = session.tenant.net.clone() else {
        return Err(refused(
            StatusCode::CONFLICT,
            "previews need the tenant's own network (network = \"isolated\")",
        ));
    };
    let admission = session
        .ports
        .admit(port, via)
        .map_err(|e| Box::new(refusal(gw, peer, session, port, e)))?;
    // Anyone's connections into a public port leave a quarter of the
    // tenant's streams to its own callers.
    let reserve = if *via == Via::Public {
        session.tenant.settings.max_streams / 4
    } else {
        0
    };
    let streams = &session.tenant.streams;
    let permit = if streams.available_permits() > reserve {
        streams.clone().try_acquire_owned().ok()
    } else {
        None
    };
    let Some(permit) = permit else {
        return Err(refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "the tenant's streams (max_streams) are all open",
        ));
    };
    let tcp = match crate::forward::connect(&net, port).await {
        Ok(t) => t,
        Err(e) => {
            tracing::info!(tenant = %session.tenant.name, port, error = %e, "preview: connect");
            return Err(refused(
                StatusCode::BAD_GATEWAY,
                &format!("nothing accepts connections on port {port} in the session's network"),
            ));
        }
    };
    // Two ends, kept apart: `stop` is a revocation or the session's end,
    // which ends the requests on the connection (a 410, a cut body);
    // `closed` is also the connection's own end, its last holder gone,
    // which only ends the task watching for the first.
    let stop = CancellationToken::new();
    let closed = stop.child_token();
    {
        let stop = stop.clone();
        let closed = closed.clone();
        let ended = session.ended.clone();
        let revoked = revoked.clone();
        crate::task::start("preview-stop", async move {
            tokio::select! {
                () = ended.cancelled() => stop.cancel(),
                () = revoked.cancelled() => stop.cancel(),
                () = closed.cancelled() => {}
            }
        });
    }
    // A token holder's connection keeps the session alive, like an
    // attached stream; anyone's (a public port, a URL) does not.
    let keep = (*via == Via::Token).then(|| session.stream_guard());
    let hold: proxy::Hold = Arc::new((admission, permit, keep, StopOnDrop(closed)));
    crate::audit::emit(
        "preview.opened",
        &crate::audit::Who {
            tenant: Some(&session.tenant.name),
            subject: None,
            session: Some(&session.id),
        },
        serde_json::json!({ "port": port, "via": via.name(), "peer": peer.to_string() }),
    );
    Ok((tcp, hold, stop))
}

/// Cancels its token when the connection it belongs to ends (the task
/// that watched for the session's end then ends too, and a relayed
/// connection's pump).
struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
