//! What the tower stack costs per call, in process: the whole stack
//! (`Gateway::stack`) against the bare handler (`dispatch::Dispatch`), for
//! a call that does nothing (`process/list`), with no isolation layer.

use std::time::{Duration, Instant};

use crate::harness::{BenchResult, Row, err};

/// Figure 6, pushed when it can be measured (skipped with a line on stderr
/// otherwise).
pub(crate) async fn stack_row(settings: &exec_gateway::config::Settings, rows: &mut Vec<Row>) {
    // 6. the cost of the stack, in process: the whole tower stack vs the
    // bare handler, for a call that does nothing (process/list).
    // As root the in-process gateway cannot turn the uid layer off, and its
    // uid probe needs the gateway binary: the figure is skipped there.
    match stack_cost(settings, 200_000).await {
        Ok((with_stack, bare)) => rows.push(Row::reported(
            "tower stack cost per call (in process)",
            format!("{:.2} µs", with_stack.as_secs_f64() * 1e6),
            format!("{:.2} µs bare handler", bare.as_secs_f64() * 1e6),
            format!(
                "{:+.2} µs",
                (with_stack.as_secs_f64() - bare.as_secs_f64()) * 1e6
            ),
        )),
        Err(e) => eprintln!("tower stack cost skipped: {e}"),
    }
}

/// Mean time per call through the full stack and through the bare handler.
async fn stack_cost(
    settings: &exec_gateway::config::Settings,
    n: u32,
) -> BenchResult<(Duration, Duration)> {
    use exec_gateway::config::LayerPolicy;
    use tower::ServiceExt as _;
    // In process, the stack alone is measured: no isolation layer (a worker
    // would be this binary re-executed, which is not the gateway).
    let mut settings = settings.clone();
    let iso = &mut settings.isolation;
    (
        iso.workers,
        iso.cgroups,
        iso.landlock,
        iso.seccomp,
        iso.uid,
        iso.namespaces,
        iso.network,
    ) = (
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
        LayerPolicy::Off,
    );
    let gw = exec_gateway::gateway::Gateway::new(settings, None).map_err(err)?;
    let tenant = gw.tenants.get("bench").await.map_err(|e| e.to_string())?;
    let (out, mut rx) =
        exec_gateway::outbound::Outbound::channel(exec_gateway::outbound::ByteBudget::unlimited());
    exec_gateway::task::start(
        "bench-drain",
        async move { while rx.recv().await.is_some() {} },
    );
    let (session, token) = gw
        .sessions
        .initialize(&tenant, None, out, None)
        .map_err(err)?;
    let req = exec_gateway::dispatch::RpcRequest {
        op: exec_gateway::rpc::Op::Call(exec_gateway::rpc::Call::ProcessList(
            exec_gateway::rpc::NoParams,
        )),
        ctx: exec_gateway::dispatch::RequestContext {
            principal: std::sync::Arc::new(exec_gateway::auth::Principal {
                tenant: tenant.name.clone(),
                subject: None,
                scopes: exec_gateway::auth::Scopes::ALL,
                expires_at: None,
                key: exec_gateway::auth::KeyLife::default(),
                image: None,
            }),
            tenant: tenant.clone(),
            session: Some(session),
            place: None,
            evicted: token.evicted,
            reply: None,
        },
    };
    let t = Instant::now();
    for _ in 0..n {
        gw.stack.clone().oneshot(req.clone()).await.map_err(err)?;
    }
    let with_stack = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        exec_gateway::dispatch::Dispatch
            .oneshot(req.clone())
            .await
            .map_err(err)?;
    }
    let bare = t.elapsed() / n;
    Ok((with_stack, bare))
}
