//! `gateway/egress/get` and `set`: the tenant's egress, read and changed
//! at run time by callers with the `egress` scope; answered by `dispatch`
//! (no backend has a part).

use super::TenantEgress;
use crate::config::{Egress, EgressNames};
use crate::error::GatewayError;
use crate::protocol::egress::Policy;
use crate::rpc::{Call, Reply};

/// Whether `call` is one of the `gateway/egress/*` methods.
pub fn is_egress(call: &Call) -> bool {
    matches!(call, Call::EgressGet(_) | Call::EgressSet(_))
}

/// Answer a `gateway/egress/*` call for the tenant whose settings say
/// `configured` and whose egress by name is `live` (if it has one).
pub fn call(
    configured: &Egress,
    live: Option<&TenantEgress>,
    who: &crate::audit::Who<'_>,
    call: Call,
) -> Result<Reply, GatewayError> {
    let policy = |names: Option<&EgressNames>, closed: Option<usize>| Policy {
        names: names.map(EgressNames::entries),
        cidrs: configured.allow.iter().map(ToString::to_string).collect(),
        internet: configured.internet,
        closed,
    };
    match call {
        Call::EgressGet(_) => {
            let names = live.map(TenantEgress::names);
            Ok(Reply::Egress(policy(names.as_deref(), None)))
        }
        Call::EgressSet(p) => {
            let Some(live) = live else {
                return Err(GatewayError::InvalidRequest(
                    "this tenant's egress is decided by addresses alone; `egress_names` in its configuration turns names on".to_owned(),
                ));
            };
            let names = EgressNames::parse(&p.names)
                .map_err(|e| GatewayError::InvalidParams(format!("names: {e}")))?;
            let closed = live.set_names(names.clone());
            crate::audit::emit(
                "egress.changed",
                who,
                serde_json::json!({
                    "names": crate::audit::clip_list(p.names.iter().map(String::as_str)),
                    "closed": closed,
                }),
            );
            Ok(Reply::Egress(policy(Some(&names), Some(closed))))
        }
        _ => Err(GatewayError::Internal("not an egress call".to_owned())),
    }
}
