//! The audit trail's view of calls (module `audit`): what a process was
//! started with, which files were written, removed or copied, and which
//! calls were refused for want of a scope or for a path outside the root.
//! It sits outermost, so refusals by any layer below are seen.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tower::{Layer, Service};

use crate::audit::{self, Who, clip};
use crate::dispatch::RpcRequest;
use crate::error::{ErrorKind, GatewayError};
use crate::protocol::fs::OpenMode;
use crate::protocol::process::ExecParams;
use crate::rpc::{Call, Op, Open, Outcome};

#[derive(Clone, Copy, Default)]
pub struct AuditLayer;

impl<S> Layer<S> for AuditLayer {
    type Service = Audit<S>;
    fn layer(&self, inner: S) -> Audit<S> {
        Audit { inner }
    }
}

#[derive(Clone)]
pub struct Audit<S> {
    inner: S,
}

/// A start's fields, for a refusal (a start that succeeds is recorded by
/// the process table, before the process can exit).
fn started(
    id: &str,
    argv: &[String],
    cwd: &str,
    env: &std::collections::HashMap<String, String>,
    tty: bool,
    pipe_stdin: bool,
) -> (&'static str, Value) {
    let env = sorted_keys(env.keys());
    (
        START,
        audit::process_started(id, argv, cwd, env.into_iter(), tty, pipe_stdin),
    )
}

fn exec_started(p: &ExecParams) -> (&'static str, Value) {
    started(
        &p.process_id,
        &p.argv,
        p.cwd.as_str(),
        &p.env,
        p.tty,
        p.pipe_stdin,
    )
}

/// Recorded on success by the process table (before the process can exit
/// of it), here only when refused.
const START: &str = "process.started";
const TERMINATED: &str = "process.terminated";
const SIGNALLED: &str = "process.signalled";

/// What a call is recorded as when it succeeds: its event and fields.
fn describe(op: &Op) -> Option<(&'static str, Value)> {
    Some(match op {
        Op::Call(Call::ProcessStart(p)) => exec_started(p),
        Op::Open(Open::Exec(p)) => exec_started(p),
        Op::Call(Call::CommandExec(p)) => {
            started(&p.process_id, &p.argv, p.cwd.as_str(), &p.env, p.tty, false)
        }
        Op::Call(Call::ProcessTerminate(p)) => {
            (TERMINATED, json!({"process_id": clip(&p.process_id)}))
        }
        Op::Call(Call::ProcessSignal(p)) => (
            SIGNALLED,
            json!({"process_id": clip(&p.process_id), "signal": p.signal}),
        ),
        Op::Call(Call::FsWriteFile(p)) => (
            "file.written",
            json!({"path": clip(p.path.as_str()), "size": decoded_len(&p.data_base64)}),
        ),
        Op::Open(Open::WriteFile(p)) => ("file.written", json!({"path": clip(p.path.as_str())})),
        Op::Call(Call::FsOpen(p)) if p.mode == OpenMode::Replace => (
            "file.written",
            json!({"path": clip(p.path.as_str()), "via": "fs/open"}),
        ),
        Op::Call(Call::FsCreateDirectory(p)) => {
            ("directory.created", json!({"path": clip(p.path.as_str())}))
        }
        Op::Call(Call::FsRemove(p)) => (
            "file.removed",
            json!({"path": clip(p.path.as_str()), "recursive": p.recursive}),
        ),
        Op::Call(Call::FsCopy(p)) => (
            "file.copied",
            json!({
                "source": clip(p.source_path.as_str()),
                "destination": clip(p.destination_path.as_str()),
                "recursive": p.recursive,
            }),
        ),
        _ => return None,
    })
}

/// The byte length base64 `s` decodes to.
fn decoded_len(s: &str) -> usize {
    let s = s.trim_end();
    let pad = s.bytes().rev().take_while(|b| *b == b'=').count();
    (s.len() / 4 * 3).saturating_sub(pad.min(2))
}

fn sorted_keys<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<&'a str> {
    let mut v: Vec<&str> = keys.map(String::as_str).collect();
    v.sort_unstable();
    v
}

/// Refusal events each tenant may write per second, and in a burst.
const REFUSALS_PER_SECOND: u32 = 20;
const REFUSALS_BURST: u32 = 200;

/// Per-tenant admission of refusal events (governor, keyed by tenant).
struct Refusals {
    limiter: governor::DefaultKeyedRateLimiter<std::sync::Arc<str>>,
    suppressed: parking_lot::Mutex<std::collections::HashMap<std::sync::Arc<str>, u64>>,
}

/// Tenants whose suppressed refusals are remembered at most (beyond, the
/// count starts again).
const MAX_SUPPRESSED_TENANTS: usize = 4096;

impl Refusals {
    /// Some(refusals suppressed since the last one written) when this one
    /// may be written.
    fn admit(&self, tenant: &std::sync::Arc<str>) -> Option<u64> {
        let mut s = self.suppressed.lock();
        if self.limiter.check_key(tenant).is_ok() {
            return Some(s.remove(tenant).unwrap_or(0));
        }
        if s.len() >= MAX_SUPPRESSED_TENANTS && !s.contains_key(tenant) {
            s.clear();
            self.limiter.retain_recent();
        }
        *s.entry(tenant.clone()).or_insert(0) += 1;
        None
    }
}

static REFUSALS: std::sync::LazyLock<Refusals> = std::sync::LazyLock::new(|| Refusals {
    limiter: governor::RateLimiter::keyed(
        governor::Quota::per_second(
            std::num::NonZeroU32::new(REFUSALS_PER_SECOND).unwrap_or(std::num::NonZeroU32::MIN),
        )
        .allow_burst(
            std::num::NonZeroU32::new(REFUSALS_BURST).unwrap_or(std::num::NonZeroU32::MIN),
        ),
    ),
    suppressed: parking_lot::Mutex::new(std::collections::HashMap::new()),
});

const QUOTA_REFUSED: &str = "quota.refused";

/// The quota a call was refused by, and its limit: a tenant quota
/// (-32006), or a file call that met the tenant's disk quota (`disk`, its
/// limit not known here: 0).
fn quota_of(e: &GatewayError) -> Option<(&'static str, u64)> {
    match e {
        GatewayError::QuotaExceeded { quota, limit, .. } => Some((quota, *limit)),
        e if e.to_string().contains(crate::fs::DISK_QUOTA_USED_UP) => Some(("disk", 0)),
        _ => None,
    }
}

/// Refusals worth a security team's eye: a scope the caller lacks, a path
/// outside the root, a call the gateway forbids.
fn is_refusal(e: &GatewayError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Forbidden | ErrorKind::OutsideRoot | ErrorKind::Unauthenticated
    )
}

impl<S> Service<RpcRequest> for Audit<S>
where
    S: Service<RpcRequest, Response = Outcome, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Outcome;
    type Error = GatewayError;
    type Future = Pin<Box<dyn Future<Output = Result<Outcome, GatewayError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: RpcRequest) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // Calls' own events go to the trail only; a quota refusal also
        // to the webhooks.
        let trail = audit::trail_enabled();
        if !trail && !audit::wanted(QUOTA_REFUSED) {
            return Box::pin(inner.call(req));
        }
        let described = if trail { describe(&req.op) } else { None };
        let method = req.op.method();
        let tenant = req.ctx.tenant.name.clone();
        let subject = req.ctx.principal.subject.clone();
        let session = req.ctx.session.as_ref().map(|s| s.id.clone());
        Box::pin(async move {
            let result = inner.call(req).await;
            let who = Who {
                tenant: Some(&tenant),
                subject: subject.as_deref(),
                session: session.as_deref(),
            };
            if let Some((quota, limit)) = result.as_ref().err().and_then(quota_of) {
                audit::quota_refused(&who, method, quota, limit);
            }
            match (&result, described) {
                (Ok(_), Some((event, fields)))
                    if ![START, TERMINATED, SIGNALLED].contains(&event) =>
                {
                    audit::emit(event, &who, fields);
                }
                (Err(e), described) if is_refusal(e) => {
                    // Refusals cost the caller nothing else (they come
                    // before its rate limit): a flood of them is recorded
                    // at a bounded rate, the rest counted in the next one.
                    let Some(suppressed) = REFUSALS.admit(&tenant) else {
                        return result;
                    };
                    let mut fields = json!({
                        "method": method,
                        "error": e.outcome(),
                        "message": clip(&e.to_string()),
                    });
                    if let Value::Object(f) = &mut fields {
                        if let Some((_, Value::Object(call))) = described {
                            f.extend(call);
                        }
                        // Whatever the call (a refusal with no fields of
                        // its own once lost the count).
                        if suppressed > 0 {
                            f.insert("suppressed_before".to_owned(), json!(suppressed));
                        }
                    }
                    audit::emit("call.refused", &who, fields);
                }
                _ => {}
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_flood_of_refusals_is_recorded_at_a_bounded_rate_and_counted() {
        let t: std::sync::Arc<str> = std::sync::Arc::from("flooder");
        let admitted = (0..super::REFUSALS_BURST + 50)
            .filter(|_| super::REFUSALS.admit(&t).is_some())
            .count();
        assert!(admitted <= super::REFUSALS_BURST as usize + 5, "{admitted}");
        assert!(admitted >= super::REFUSALS_BURST as usize / 2, "{admitted}");
        // Another tenant is not held back by it.
        assert_eq!(
            super::REFUSALS.admit(&std::sync::Arc::from("other")),
            Some(0)
        );
    }

    #[test]
    fn decoded_lengths() {
        assert_eq!(super::decoded_len(""), 0);
        assert_eq!(super::decoded_len("YQ=="), 1);
        assert_eq!(super::decoded_len("YWI="), 2);
        assert_eq!(super::decoded_len("YWJj"), 3);
    }
}
