//! The process methods (`process/*`, v0 `command/exec*`) and the gRPC
//! process streams, over the session's process table.

use std::sync::Arc;

use crate::backend::RunScope;
use crate::error::GatewayError;
use crate::process::{Api, StartOptions};
use crate::protocol::process::{
    ExecParams, ExecResponse, ProcessIdParams, ReadParams, ResizeParams, SandboxType, SignalParams,
    WriteParams,
};
use crate::protocol::revision::Policy;
use crate::protocol::v0::{
    CommandExecParams, CommandExecResponse, CommandExecWriteParams, CommandExecWriteResponse,
};
use crate::rpc::{Opened, Outcome, Reply};

use super::{LocalSession, empty};

fn process_options(audit: Option<Arc<crate::audit::Tag>>) -> StartOptions {
    StartOptions {
        api: Api::Process,
        retained_cap: None,
        hold_output: false,
        audit,
    }
}

/// `process/start`. The tenant's confinement applies whatever the client
/// asks; no sandbox of the client's is applied on top.
pub(super) async fn start(
    s: &LocalSession,
    p: ExecParams,
    policy: &Policy,
    audit: Option<Arc<crate::audit::Tag>>,
) -> Result<Reply, GatewayError> {
    s.shared.check_cwd(&p.cwd)?;
    let process_id = p.process_id.clone();
    s.table.start(p, process_options(audit)).await?;
    Ok(Reply::ProcessStart(ExecResponse {
        process_id,
        sandbox_type: policy
            .start_reports_sandbox_type
            .then_some(SandboxType::None),
    }))
}

/// Proxies of processes one session keeps at once.
pub const MAX_PROCESS_PROXIES: usize = 64;

/// `process/start` with Codex's `networkProxy`: the process gets a proxy
/// of its own (`egress::ask`) in its environment, checked as the
/// reference checks the launch. A tenant without egress by name starts it
/// as any other (its addresses decide; `networkProxyLaunch` is false).
pub(super) async fn start_managed(
    s: &LocalSession,
    mut p: ExecParams,
    policy: &Policy,
    audit: Option<Arc<crate::audit::Tag>>,
) -> Result<Reply, GatewayError> {
    let Some(np) = p.network_proxy.take() else {
        return start(s, p, policy, audit).await;
    };
    let invalid = |m: &str| GatewayError::InvalidParams(m.to_owned());
    if np.policy_decision_timeout_ms == Some(0) {
        return Err(invalid(
            "network policy decision callback timeout must be nonzero",
        ));
    }
    if np.policy_decision_timeout_ms.is_some()
        && (p.process_id.is_empty() || p.process_id.len() > 256)
    {
        return Err(invalid(
            "callback-enabled process ID must be non-empty and at most 256 bytes",
        ));
    }
    let enabled = np
        .proxy
        .as_ref()
        .and_then(|v| v.get("enabled"))
        .and_then(serde_json::Value::as_bool);
    if enabled == Some(false) {
        return Err(invalid(
            "invalid network proxy config: executor-local network proxy launch requires an enabled proxy",
        ));
    }
    let Some(egress) = s.shared.egress.get().cloned() else {
        return start(s, p, policy, audit).await;
    };
    s.shared.check_cwd(&p.cwd)?;
    // One of the session's proxies, given back when the process closes.
    let slot = Slot::take(&s.proxies).ok_or_else(|| {
        GatewayError::InvalidRequest(format!(
            "at most {MAX_PROCESS_PROXIES} processes with networkProxy at once per session"
        ))
    })?;
    let mut token = [0u8; 16];
    getrandom::fill(&mut token).map_err(|e| GatewayError::Internal(format!("randomness: {e}")))?;
    let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
    let proxy = egress
        .process_proxy(crate::egress::ask::Asker {
            session: audit
                .as_ref()
                .map(|t| t.session.clone())
                .unwrap_or_default(),
            token: token.clone(),
            process_id: p.process_id.clone(),
            attachment: s.attachment.clone(),
            timeout: np
                .policy_decision_timeout_ms
                .map(std::time::Duration::from_millis),
            remembered: s.remembered.clone(),
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("the process's network proxy: {e}")))?;
    for (k, v) in crate::egress::ask::proxy_env(proxy.port, &token) {
        if let Some(ep) = p.env_policy.as_mut() {
            ep.set.insert(k.clone(), v.clone());
        }
        p.env.insert(k, v);
    }
    let id = p.process_id.clone();
    let reply = start(s, p, policy, audit).await?;
    // The proxy lives as long as the process: until its events end
    // (closed, or the session killed it).
    if let Ok(events) = s.table.events(&id) {
        let (_, mut rx) = events.subscribe(u64::MAX);
        crate::task::start("egress-process-proxy-life", async move {
            while rx.recv().await.is_some() {}
            drop(proxy);
            drop(slot);
        });
    }
    Ok(reply)
}

/// One of a session's [`MAX_PROCESS_PROXIES`]; given back when dropped.
struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Slot {
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>) -> Option<Slot> {
        use std::sync::atomic::Ordering;
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_PROCESS_PROXIES).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// `process/read`. Over a JSON-RPC connection the reply's bytes are
/// reserved before it is built, and it is sent from here.
pub(super) async fn read(
    s: &LocalSession,
    p: ReadParams,
    scope: RunScope,
) -> Result<Outcome, GatewayError> {
    let out = scope.reply.as_ref().map(|r| r.outbound());
    let (response, held) = s.table.read(p, &scope.evicted, out).await?;
    let reply = Reply::ProcessRead(response);
    match (held, scope.reply) {
        (Some(held), Some(to)) => {
            let result = serde_json::to_string(&reply)
                .map_err(|e| GatewayError::Internal(format!("encoding a reply: {e}")))?;
            to.send_encoded(result, 0, held).await;
            Ok(Outcome::Sent)
        }
        _ => Ok(Outcome::Reply(reply)),
    }
}

pub(super) async fn write(s: &LocalSession, p: WriteParams) -> Result<Reply, GatewayError> {
    Ok(Reply::ProcessWrite(s.table.write(p).await?))
}

pub(super) fn terminate(s: &LocalSession, p: &ProcessIdParams) -> Reply {
    Reply::ProcessTerminate(s.table.terminate(&p.process_id))
}

pub(super) fn signal(s: &LocalSession, p: &SignalParams) -> Result<Reply, GatewayError> {
    s.table.signal(p)?;
    Ok(empty())
}

pub(super) fn resize(s: &LocalSession, p: &ResizeParams) -> Result<Reply, GatewayError> {
    s.table.resize(p)?;
    Ok(empty())
}

pub(super) async fn close_stdin(
    s: &LocalSession,
    p: &ProcessIdParams,
) -> Result<Reply, GatewayError> {
    s.table.close_stdin(&p.process_id).await?;
    Ok(empty())
}

pub(super) fn list(s: &LocalSession) -> Reply {
    Reply::ProcessList(s.table.list())
}

/// v0 `command/exec`: the same table, v0 notifications, stdin closed
/// for pipe processes, and the client's retained-output cap.
pub(super) async fn command_exec(
    s: &LocalSession,
    p: CommandExecParams,
    audit: Option<Arc<crate::audit::Tag>>,
) -> Result<Reply, GatewayError> {
    s.shared.check_cwd(&p.cwd)?;
    let process_id = p.process_id.clone();
    let exec = ExecParams {
        process_id: p.process_id,
        argv: p.argv,
        cwd: p.cwd,
        env: p.env,
        tty: p.tty,
        pipe_stdin: false,
        arg0: p.arg0,
        env_policy: None,
        sandbox: None,
        network_proxy: None,
    };
    s.table
        .start(
            exec,
            StartOptions {
                api: Api::CommandExec,
                retained_cap: p.output_bytes_cap,
                hold_output: false,
                audit,
            },
        )
        .await?;
    Ok(Reply::CommandExec(CommandExecResponse {
        process_id,
        running: true,
        exit_code: None,
        stdout: None,
        stderr: None,
    }))
}

/// v0 `command/exec/write`.
pub(super) async fn command_exec_write(
    s: &LocalSession,
    p: &CommandExecWriteParams,
) -> Result<Reply, GatewayError> {
    s.table.write_v0(&p.process_id, &p.chunk.0).await?;
    Ok(Reply::CommandExecWrite(CommandExecWriteResponse {
        accepted: true,
    }))
}

/// gRPC `Attach`: a process's events from a seq onwards.
pub(super) fn attach(s: &LocalSession, p: &ProcessIdParams) -> Result<Outcome, GatewayError> {
    Ok(Outcome::Opened(Opened::Events(
        s.table.events(&p.process_id)?,
    )))
}

/// gRPC `Exec`: start a process whose output is held until the stream
/// subscribes.
pub(super) async fn exec_stream(
    s: &LocalSession,
    p: ExecParams,
    audit: Option<Arc<crate::audit::Tag>>,
) -> Result<Outcome, GatewayError> {
    s.shared.check_cwd(&p.cwd)?;
    let process = s
        .table
        .start(
            p,
            StartOptions {
                hold_output: true,
                ..process_options(audit)
            },
        )
        .await?;
    Ok(Outcome::Opened(Opened::Events(process)))
}
