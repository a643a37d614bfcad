//! `gateway/preview/create`, `revoke` and `list`: answered from the
//! session's own [`Ports`], by `dispatch` (no backend has a part in them).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::grant::Grant;
use super::ports::Ports;
use crate::error::GatewayError;
use crate::protocol::Empty;
use crate::protocol::preview::{CreateParams, ListResponse, PortState, Preview};
use crate::rpc::{Call, Reply};

/// The query parameter a signed preview URL carries its grant in.
pub const GRANT_PARAM: &str = "exg_preview";

/// Who is calling, for the grant and the audit trail.
pub struct Caller<'a> {
    pub tenant: &'a str,
    pub subject: Option<&'a str>,
    pub session: &'a str,
}

impl Caller<'_> {
    fn who(&self) -> crate::audit::Who<'_> {
        crate::audit::Who {
            tenant: Some(self.tenant),
            subject: self.subject,
            session: Some(self.session),
        }
    }
}

/// Whether `call` is one of the `gateway/preview/*` methods.
pub fn is_preview(call: &Call) -> bool {
    matches!(
        call,
        Call::PreviewCreate(_) | Call::PreviewRevoke(_) | Call::PreviewList(_)
    )
}

/// Answer a `gateway/preview/*` call on the caller's session.
pub fn call(ports: &Ports, caller: &Caller<'_>, call: Call) -> Result<Reply, GatewayError> {
    match call {
        Call::PreviewCreate(p) => create(ports, caller, p).map(Reply::Preview),
        Call::PreviewRevoke(p) => {
            check_port(p.port)?;
            let was_public = ports.revoke(p.port);
            crate::audit::emit(
                "preview.revoked",
                &caller.who(),
                serde_json::json!({ "port": p.port, "was_public": was_public }),
            );
            Ok(Reply::Empty(Empty {}))
        }
        Call::PreviewList(_) => Ok(Reply::PreviewList(ListResponse {
            ports: ports
                .list()
                .into_iter()
                .map(|(port, public)| PortState { port, public })
                .collect(),
            open_connections: ports.open() as u64,
        })),
        _ => Err(GatewayError::Internal(
            "not a gateway/preview method".to_owned(),
        )),
    }
}

fn check_port(port: u16) -> Result<(), GatewayError> {
    if port == 0 {
        return Err(GatewayError::InvalidParams(
            "port must be 1 to 65535".to_owned(),
        ));
    }
    Ok(())
}

/// The path of a session's port on the client listener.
pub fn preview_path(session: &str, port: u16) -> String {
    format!("/preview/{session}/{port}/")
}

fn create(ports: &Ports, caller: &Caller<'_>, p: CreateParams) -> Result<Preview, GatewayError> {
    check_port(p.port)?;
    let settings = &ports.settings;
    let path = preview_path(caller.session, p.port);
    let host_url = match &settings.base {
        Some(base) => super::route::host_label(caller.session, p.port).map(|label| {
            format!(
                "{}://{label}.{}{}/",
                base.scheme, base.domain, base.port_suffix
            )
        }),
        None => None,
    };
    if p.public {
        if p.expires_in_secs.is_some() {
            return Err(GatewayError::InvalidParams(
                "a public preview lasts until gateway/preview/revoke; expiresInSecs is for signed URLs".to_owned(),
            ));
        }
        ports.publish(p.port).map_err(GatewayError::InvalidParams)?;
        crate::audit::emit(
            "preview.published",
            &caller.who(),
            serde_json::json!({ "port": p.port }),
        );
        return Ok(Preview {
            port: p.port,
            url: host_url,
            path,
            public: true,
            expires_at_ms: None,
        });
    }
    let Some(host_url) = host_url else {
        return Err(GatewayError::InvalidParams(if settings.base.is_none() {
            format!(
                "signed preview URLs need [preview] base_url (a browser keeps a preview's cookie per host name); a token of the preview scope opens {path}"
            )
        } else {
            "this session's id has no host name form (a session of a remote executor, or a replica id too long for one DNS label)".to_owned()
        }));
    };
    let ttl = match p.expires_in_secs {
        None => settings.url_ttl,
        Some(0) => {
            return Err(GatewayError::InvalidParams(
                "expiresInSecs must be positive".to_owned(),
            ));
        }
        Some(s) => Duration::from_secs(s),
    };
    if ttl > settings.max_url_ttl {
        return Err(GatewayError::InvalidParams(format!(
            "expiresInSecs is at most {} ([preview] max_url_ttl)",
            settings.max_url_ttl.as_secs()
        )));
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| GatewayError::Internal(format!("clock: {e}")))?;
    let expires = now.as_secs() + ttl.as_secs();
    let grant = Grant {
        tenant: caller.tenant.to_owned(),
        session: caller.session.to_owned(),
        port: p.port,
        expires,
        epoch: ports.epoch(p.port).map_err(GatewayError::InvalidParams)?,
        subject: caller.subject.map(str::to_owned),
    }
    .sign(&settings.key.0)
    .ok_or_else(|| GatewayError::Internal("preview grant: signing failed".to_owned()))?;
    crate::audit::emit(
        "preview.minted",
        &caller.who(),
        serde_json::json!({ "port": p.port, "expires_at_ms": expires * 1000 }),
    );
    Ok(Preview {
        port: p.port,
        url: Some(format!("{host_url}?{GRANT_PARAM}={grant}")),
        path,
        public: false,
        expires_at_ms: Some(expires * 1000),
    })
}
