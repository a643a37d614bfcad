//! Authentication: every door turns a bearer token into a
//! [`Caller`] here, and only here, so the rules (draining first, then the
//! token, then the tenant) and the failure metric cannot differ by door.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::{AuthError, Principal};
use crate::dispatch::RequestContext;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::session::Session;
use crate::tenant::Tenant;

/// An authenticated caller and its tenant. Only [`authenticate`] makes one, so
/// holding a `Caller` proves authentication happened.
#[derive(Clone)]
pub struct Caller {
    principal: Arc<Principal>,
    tenant: Arc<Tenant>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("tenant", &self.tenant.name)
            .field("subject", &self.principal.subject)
            .finish()
    }
}

impl Caller {
    pub fn principal(&self) -> &Arc<Principal> {
        &self.principal
    }

    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// The context of one call by this caller.
    pub fn context(
        &self,
        session: Option<Arc<Session>>,
        evicted: CancellationToken,
    ) -> RequestContext {
        RequestContext {
            principal: self.principal.clone(),
            tenant: self.tenant.clone(),
            session,
            place: None,
            evicted,
            reply: None,
        }
    }
}

/// The caller behind this binary's executor links (`exec-gateway
/// executor`): the executor's own tenant on this host, with every scope.
/// The registry it dialled authenticated the executor and chose what runs
/// here; the tenant's confinement on this host applies as always.
pub async fn executor_caller(gw: &Gateway, tenant: &str) -> Option<Caller> {
    let tenant = gw.tenants.get(tenant).await.ok()?;
    Some(Caller {
        principal: Arc::new(Principal {
            tenant: tenant.name.clone(),
            subject: Some("executor-link".to_owned()),
            scopes: crate::auth::Scopes::DEFAULT,
            expires_at: None,
            key: crate::auth::KeyLife::default(),
            image: None,
        }),
        tenant,
    })
}

/// A handshake's outcome in the audit trail: who was admitted through
/// which door with which kind of credential, or who was refused and why.
pub fn audit_handshake(
    door: &str,
    remote: Option<std::net::SocketAddr>,
    credential: &str,
    result: &Result<Caller, GatewayError>,
) {
    if !crate::audit::trail_enabled() {
        return;
    }
    let remote = remote.map(|r| r.to_string());
    match result {
        Ok(c) => crate::audit::emit(
            "auth.accepted",
            &crate::audit::Who {
                tenant: Some(&c.tenant.name),
                subject: c.principal.subject.as_deref(),
                session: None,
            },
            serde_json::json!({"door": door, "remote": remote, "credential": credential}),
        ),
        Err(e) => crate::audit::emit(
            "auth.refused",
            &crate::audit::Who::default(),
            serde_json::json!({
                "door": door,
                "remote": remote,
                "credential": credential,
                "error": e.outcome(),
                "message": crate::audit::clip(&e.to_string()),
            }),
        ),
    }
}

/// The kind of credential a request carries, for the audit trail.
pub fn credential_kind(token: Option<&str>, client_cert: Option<&[u8]>) -> &'static str {
    match (token, client_cert) {
        (Some(_), _) => "token",
        (None, Some(_)) => "certificate",
        (None, None) => "none",
    }
}

/// A TLS handshake a client did not complete (a certificate refused, a
/// protocol not offered), in the audit trail.
pub fn audit_tls_refused(door: &str, remote: std::net::SocketAddr, error: &dyn std::fmt::Display) {
    crate::audit::emit(
        "tls.refused",
        &crate::audit::Who::default(),
        serde_json::json!({
            "door": door,
            "remote": remote.to_string(),
            "message": crate::audit::clip(&error.to_string()),
        }),
    );
}

/// Guard the holder of `token` (never logged). Refusals are
/// `Unauthenticated` or `Forbidden` (a valid token granting nothing
/// usable); each authentication failure is counted by reason. A draining
/// gateway still admits: its live sessions are served until the stop, and
/// only new sessions are refused.
pub async fn authenticate(gw: &Gateway, token: Option<&str>) -> Result<Caller, GatewayError> {
    authenticate_with(gw, token, None, None).await
}

/// When a client refused because its tenant's image is still being
/// pulled is told to retry (its next handshake waits for the pull again).
pub const IMAGE_PULL_RETRY_AFTER_MS: u64 = 1000;

/// [`authenticate`] with the client certificate the connection's TLS
/// handshake verified, if any: a bearer token, when sent, is the
/// credential; without one, the certificate is (module `auth::cert`).
///
/// `answer_by` is when a handshake must be answered, ahead of the
/// connection's deadline (`Conn::answer_by`): an activation still waiting
/// for the tenant's image pull then is refused with
/// [`GatewayError::ImagePulling`] (the pull goes on, and a retry after it
/// ends succeeds). An activation waiting for anything else is waited for.
pub async fn authenticate_with(
    gw: &Gateway,
    token: Option<&str>,
    client_cert: Option<&[u8]>,
    answer_by: Option<tokio::time::Instant>,
) -> Result<Caller, GatewayError> {
    let verified = match (token, client_cert) {
        (Some(t), _) => gw.auth().verify(t).await,
        (None, Some(der)) => gw.auth().verify_certificate(der),
        (None, None) => Err(AuthError::Missing),
    };
    let principal = verified.map_err(|e| {
        gw.metrics.auth_failure(e.reason());
        e.to_gateway_error()
    })?;
    // The authenticator only accepts known tenants; a miss here means a
    // reload removed it meanwhile. Activation may fail (its root cannot
    // be made) or wait for an idle tenant's place.
    let tenant = activate(gw, &principal.tenant, answer_by)
        .await
        .inspect_err(|e| {
            if matches!(e, GatewayError::Unauthenticated(_)) {
                gw.metrics.auth_failure(AuthError::UnknownTenant.reason());
            }
        })?;
    Ok(Caller {
        principal: Arc::new(principal),
        tenant,
    })
}

/// Tenant `name`, active; by `answer_by`, unless its image is still being
/// pulled then (see [`authenticate_with`]).
async fn activate(
    gw: &Gateway,
    name: &str,
    answer_by: Option<tokio::time::Instant>,
) -> Result<Arc<Tenant>, GatewayError> {
    let get = gw.tenants.get(name);
    let Some(by) = answer_by else {
        return get.await;
    };
    let mut get = std::pin::pin!(get);
    match tokio::time::timeout_at(by, &mut get).await {
        Ok(r) => r,
        // Dropping the activation leaves the pull running (in a task of
        // its own, `ImageStore::resolve`); the next handshake joins it or
        // finds the image stored.
        Err(_) if gw.tenants.image_pulling(name) => {
            tracing::info!(
                tenant = name,
                "handshake answered before its deadline: the tenant's image is still being pulled"
            );
            Err(GatewayError::ImagePulling {
                tenant: name.to_owned(),
                retry_after_ms: IMAGE_PULL_RETRY_AFTER_MS,
            })
        }
        // Not a pull: the connection's deadline still applies.
        Err(_) => get.await,
    }
}

/// An HTTP door's answer to a refused handshake: its status, and on `r`
/// the `WWW-Authenticate` a 401 carries and the `Retry-After` (whole
/// seconds, RFC 9110, rounded up: at least 1) of a refusal that says when.
pub fn refusal_headers(e: &GatewayError, r: &mut hyper::HeaderMap) -> hyper::StatusCode {
    use hyper::header::{self, HeaderValue};
    let status =
        hyper::StatusCode::from_u16(e.http_status()).unwrap_or(hyper::StatusCode::UNAUTHORIZED);
    if status == hyper::StatusCode::UNAUTHORIZED {
        r.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer error=\"invalid_token\""),
        );
    }
    if let Some(after) = e.retry_after() {
        let secs = u64::try_from(after.as_millis().div_ceil(1000).max(1)).unwrap_or(u64::MAX);
        r.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    status
}
