//! The remote backend: a tenant's sessions on its pool of remote executors.
//!
//! A session leases one link of one executor, opens (or resumes) the
//! executor's own session on it with `initialize`, and from then on passes
//! each call on as it came (method and params) and each answer back as the
//! executor wrote it; the executor's notifications reach the connection
//! that holds the session. Calls have already passed the tower stack: the
//! tenant's scopes, rate, concurrency and deadline apply as for local
//! sessions.
//!
//! When the link drops, calls in flight fail with `executorUnavailable`
//! naming the executor; the next call waits up to `executors.open_timeout`
//! for the executor to come back and resumes its session there.

mod events;
mod files;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Deserialize;

use super::translate::{params_for_executor, plain_environment, reply_of};
use super::{OpFuture, RunScope, SessionBackend, closed_before_reply};
use crate::error::GatewayError;
use crate::outbound::Attachment;
use crate::protocol::environment::{EnvironmentInfo, Shell};
use crate::protocol::methods as m;
use crate::protocol::process::ProcessIdParams;
use crate::registry::{Lease, Link, LinkError, Pool};
use crate::rpc::{Call, Op, Open, Opened, Outcome, Reply};
use events::{RemoteEvents, Taps};
use files::RemoteFile;

/// A tenant's executor pool and which of its executors it may use.
pub struct RemoteBackend {
    pool: Arc<Pool>,
    labels: BTreeMap<String, String>,
    open_timeout: Duration,
}

/// A session just opened on an executor.
pub struct OpenedRemote {
    pub backend: Arc<RemoteSession>,
    pub executor: String,
    /// The executor's own session id.
    pub session: String,
}

impl RemoteBackend {
    pub fn new(
        pool: Arc<Pool>,
        labels: BTreeMap<String, String>,
        open_timeout: Duration,
    ) -> RemoteBackend {
        RemoteBackend {
            pool,
            labels,
            open_timeout,
        }
    }

    /// The name of the tenant's pool.
    pub fn pool_name(&self) -> &str {
        &self.pool.name
    }

    /// Whether the pool serves `tenant` (a pool's sessions are its one
    /// tenant's).
    pub fn serves(&self, tenant: &str) -> bool {
        self.pool.tenant() == tenant
    }

    /// Whether an executor with the tenant's labels has a free link now.
    pub fn has_free_link(&self) -> bool {
        self.pool.has_free_link(&self.labels)
    }

    /// Open a new session (`resume`: none) or resume the executor's
    /// session `resume = (executor, session)`, waiting up to the open
    /// timeout for a free link.
    pub async fn open(
        &self,
        attachment: Arc<Attachment>,
        resume: Option<(&str, &str)>,
    ) -> Result<OpenedRemote, GatewayError> {
        let want = resume.map(|(e, _)| e);
        let Some(lease) = self.pool.lease(&self.labels, want, self.open_timeout).await else {
            return Err(GatewayError::ExecutorUnavailable {
                pool: self.pool.name.clone(),
                executor: want.unwrap_or("*").to_owned(),
                detail: match want {
                    Some(_) => format!(
                        "it has no free link on this gateway (waited {:?})",
                        self.open_timeout
                    ),
                    None => format!(
                        "no executor of the pool has a free link (waited {:?})",
                        self.open_timeout
                    ),
                },
            });
        };
        self.start(lease, attachment, resume.map(|(_, s)| s)).await
    }

    async fn start(
        &self,
        lease: Lease,
        attachment: Arc<Attachment>,
        resume: Option<&str>,
    ) -> Result<OpenedRemote, GatewayError> {
        let executor = lease.executor.id.clone();
        let hello = handshake(&self.pool.name, &lease, resume, self.open_timeout).await?;
        let taps = Arc::new(Taps::default());
        lease.link.bind(attachment.clone(), taps.tap());
        // The executor's own description (0.169.0 gives one); one this
        // gateway cannot read, or none (0.130.0), gets placeholders. One
        // that describes itself takes `file://` URIs (for gRPC clients'
        // plain paths).
        let uris = hello.environment_info.is_some();
        let environment = hello
            .environment_info
            .and_then(|v| serde_json::from_value::<EnvironmentInfo>(v).ok())
            .unwrap_or_else(|| placeholder_environment(&executor));
        let session = hello.session_id;
        Ok(OpenedRemote {
            backend: Arc::new(RemoteSession {
                pool: self.pool.clone(),
                executor: executor.clone(),
                session: session.clone(),
                open_timeout: self.open_timeout,
                attachment,
                lease: Mutex::new(Some(lease)),
                relink: tokio::sync::Mutex::new(()),
                environment,
                uris,
                taps,
                ended: std::sync::atomic::AtomicBool::new(false),
            }),
            executor,
            session,
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Hello {
    session_id: String,
    #[serde(default)]
    environment_info: Option<serde_json::Value>,
}

/// `initialize` (resuming `resume`) and `initialized` on a fresh link.
async fn handshake(
    pool: &str,
    lease: &Lease,
    resume: Option<&str>,
    timeout: Duration,
) -> Result<Hello, GatewayError> {
    let unavailable = |detail: String| GatewayError::ExecutorUnavailable {
        pool: pool.to_owned(),
        executor: lease.executor.id.clone(),
        detail,
    };
    let params = match resume {
        Some(s) => serde_json::json!({"clientName": "exec-gateway", "resumeSessionId": s}),
        None => serde_json::json!({"clientName": "exec-gateway"}),
    };
    let answer = tokio::time::timeout(timeout, lease.link.call(m::INITIALIZE, &params.to_string()))
        .await
        .map_err(|_| unavailable(format!("it did not answer initialize within {timeout:?}")))?
        .map_err(|e| link_error(pool, &lease.executor.id, e))?;
    let hello: Hello = serde_json::from_str(&answer)
        .map_err(|e| unavailable(format!("its initialize answer is not understood: {e}")))?;
    if !crate::fleet::is_executor_session_id(&hello.session_id)
        || resume.is_some_and(|r| r != hello.session_id)
    {
        return Err(unavailable(
            "it answered initialize with an unusable session id".to_owned(),
        ));
    }
    lease
        .link
        .notify(m::INITIALIZED)
        .await
        .map_err(|e| link_error(pool, &lease.executor.id, e))?;
    Ok(hello)
}

fn link_error(pool: &str, executor: &str, e: LinkError) -> GatewayError {
    match e {
        LinkError::Lost => GatewayError::ExecutorUnavailable {
            pool: pool.to_owned(),
            executor: executor.to_owned(),
            detail: "its link closed".to_owned(),
        },
        LinkError::Busy => GatewayError::Overloaded,
        LinkError::Remote {
            code,
            message,
            data,
        } => GatewayError::Executor {
            code,
            message,
            data,
        },
    }
}

/// What `environmentInfo` says of an executor that did not describe itself
/// (the 0.130.0 executor answers `initialize` with a session id only).
fn placeholder_environment(executor: &str) -> EnvironmentInfo {
    EnvironmentInfo {
        shell: Shell {
            name: "sh".to_owned(),
            path: "/bin/sh".to_owned(),
        },
        executor_version: String::new(),
        provider_id: format!("executor:{executor}"),
        cwd: "/".to_owned(),
        user_home_dir: "/".to_owned(),
        platform_os: "linux".to_owned(),
        prepend_path_dirs: Vec::new(),
        temporary_directories: Vec::new(),
        temp_dir: "/tmp".to_owned(),
        capabilities: BTreeMap::new(),
        image: None,
    }
}

/// One session on a remote executor.
pub struct RemoteSession {
    pool: Arc<Pool>,
    executor: String,
    /// The executor's own session id.
    session: String,
    open_timeout: Duration,
    attachment: Arc<Attachment>,
    lease: Mutex<Option<Lease>>,
    /// One re-link at a time.
    relink: tokio::sync::Mutex<()>,
    environment: EnvironmentInfo,
    /// The executor takes `file://` URIs and has block calls (0.169.0).
    uris: bool,
    /// gRPC streams following the session's processes.
    taps: Arc<Taps>,
    /// The session was closed here: no link is made for it again (a
    /// stream's or a file's last call after the close fails instead).
    ended: std::sync::atomic::AtomicBool,
}

impl RemoteSession {
    fn unavailable(&self, detail: &str) -> GatewayError {
        GatewayError::ExecutorUnavailable {
            pool: self.pool.name.clone(),
            executor: self.executor.clone(),
            detail: detail.to_owned(),
        }
    }

    fn current(&self) -> Option<Arc<Link>> {
        self.lease
            .lock()
            .as_ref()
            .map(|l| l.link.clone())
            .filter(|l| !l.is_closed())
    }

    /// The session's link; after a loss, the executor's next free link
    /// with the session resumed on it.
    async fn link(&self) -> Result<Arc<Link>, GatewayError> {
        if let Some(l) = self.current() {
            return Ok(l);
        }
        if self.ended.load(std::sync::atomic::Ordering::Acquire) {
            return Err(self.unavailable("the session was closed"));
        }
        let _one = self.relink.lock().await;
        if let Some(l) = self.current() {
            return Ok(l);
        }
        // The old lease goes first: the executor's session count drops.
        let old = self.lease.lock().take();
        drop(old);
        let lease = self
            .pool
            .lease(&BTreeMap::new(), Some(&self.executor), self.open_timeout)
            .await
            .ok_or_else(|| {
                self.unavailable("its link closed and it has not come back to this gateway")
            })?;
        handshake(
            &self.pool.name,
            &lease,
            Some(&self.session),
            self.open_timeout,
        )
        .await?;
        lease.link.bind(self.attachment.clone(), self.taps.tap());
        let link = lease.link.clone();
        tracing::info!(executor = %self.executor, link = link.serial, "session resumed on a new executor link");
        *self.lease.lock() = Some(lease);
        Ok(link)
    }

    async fn call(&self, call: Call, scope: RunScope) -> Result<Outcome, GatewayError> {
        match call {
            Call::Initialize(_) => {
                return Err(GatewayError::InvalidRequest(
                    "initialize may only be sent once per connection".to_owned(),
                ));
            }
            Call::HttpRequest(_) => {
                return Err(GatewayError::Forbidden(
                    "http/request is disabled on this gateway".to_owned(),
                ));
            }
            _ => {}
        }
        let Some(reply) = scope.reply else {
            // A gRPC client: a typed reply, translated; the description
            // is the one the executor gave at `initialize`.
            if let Call::EnvironmentInfo(_) = call {
                let info = plain_environment(self.environment.clone());
                return Ok(Outcome::Reply(Reply::EnvironmentInfo(Box::new(info))));
            }
            return self.call_typed(&call, &scope).await.map(Outcome::Reply);
        };
        let result = self
            .exchange(&call, &call.params_json()?, &scope.evicted)
            .await?;
        let held = reply
            .outbound()
            .reserve(result.len())
            .await
            .map_err(|_| closed_before_reply())?;
        reply.send_encoded(result, 0, held).await;
        Ok(Outcome::Sent)
    }
}

impl RemoteSession {
    /// `call` for a gRPC client: paths in the executor's form, its JSON
    /// answer as the call's typed reply.
    async fn call_typed(&self, call: &Call, scope: &RunScope) -> Result<Reply, GatewayError> {
        let params = params_for_executor(call, self.uris)?;
        let result = self.exchange(call, &params, &scope.evicted).await?;
        reply_of(call, &result)
    }

    /// [`Self::call_typed`] outside any client's call (streams' own calls).
    async fn typed(&self, call: &Call) -> Result<Reply, GatewayError> {
        self.call_typed(call, &RunScope::default()).await
    }

    fn events(self: Arc<Self>, process_id: String) -> Outcome {
        Outcome::Opened(Opened::Events(Arc::new(RemoteEvents {
            session: self,
            process_id,
            failure: Arc::default(),
        })))
    }

    /// Send `call` with `params` on the session's link; the executor's
    /// raw result (ended early if another connection takes the session).
    async fn exchange(
        &self,
        call: &Call,
        params: &str,
        evicted: &tokio_util::sync::CancellationToken,
    ) -> Result<String, GatewayError> {
        let link = self.link().await?;
        tokio::select! {
            r = link.call(call.method(), params) => r,
            () = evicted.cancelled() => {
                return Err(GatewayError::InvalidRequest(
                    "the session was taken over by another connection".to_owned(),
                ));
            }
        }
        .map_err(|e| link_error(&self.pool.name, &self.executor, e))
    }
}

impl SessionBackend for RemoteSession {
    fn run(self: Arc<Self>, op: Op, scope: RunScope) -> OpFuture {
        Box::pin(async move {
            match op {
                Op::Call(call) => self.call(call, scope).await,
                Op::Open(Open::Events(ProcessIdParams { process_id })) => {
                    Ok(self.events(process_id))
                }
                Op::Open(Open::Exec(params)) => {
                    let process_id = params.process_id.clone();
                    self.call_typed(&Call::ProcessStart(*params), &scope)
                        .await?;
                    Ok(self.events(process_id))
                }
                Op::Open(Open::ReadFile(path)) => {
                    let file = RemoteFile::open(self, path, false).await?;
                    Ok(Outcome::Opened(Opened::Blocks(Box::new(file))))
                }
                Op::Open(Open::WriteFile(path)) => {
                    let file = RemoteFile::open(self, path, true).await?;
                    Ok(Outcome::Opened(Opened::Blocks(Box::new(file))))
                }
            }
        })
    }

    fn kill_all(&self, _why: crate::audit::KilledBy) {
        // Closing the link ends the executor's connection; it ends the
        // session's processes when its own detach TTL passes.
        self.ended.store(true, std::sync::atomic::Ordering::Release);
        self.lease.lock().take();
    }

    fn live_processes(&self) -> usize {
        // They run on the executor, not here.
        0
    }

    fn environment(&self) -> EnvironmentInfo {
        self.environment.clone()
    }

    fn is_remote(&self) -> bool {
        true
    }
}
