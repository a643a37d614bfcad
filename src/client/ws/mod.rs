//! The websocket backend: exec-server JSON-RPC, one message per frame,
//! spoken with the protocol's own types (`crate::protocol`).
//!
//! One link (a websocket, `link`) at a time carries the session. Its
//! reader task answers calls by id and routes process notifications to
//! attachments (`mailbox`); when it dies, calls in flight fail over to a
//! resumed link (`initialize {resumeSessionId}`) and attachments
//! (`attach`) re-read the process's retained output from their cursor.
//! The client fixes its session to the November 2026 revision
//! (`file://` paths, 128 + n exit codes, 80 s detach TTL) by asking
//! `environment/info` first. The calls themselves are in `process` and
//! `files`.

mod attach;
mod files;
mod link;
mod mailbox;
mod process;
mod snapshots;
#[cfg(test)]
mod testing;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

pub(super) use self::attach::WsAttachment;
pub(super) use self::link::dial;
use self::link::{Link, TAKEN_OVER, open_link};
use self::mailbox::Subs;
use super::common::{Backoff, Ids};
use super::error::{
    ClientError, Result, is_draining, is_overloaded, is_transient, is_unavailable_at_handshake,
    retry_after,
};
use super::types::ConnectOptions;
use crate::error::code;
use crate::protocol::environment::EnvironmentInfo;
use crate::protocol::methods;
use crate::protocol::path::{WirePath, to_wire};
use crate::protocol::process::{InitializeParams, InitializeResponse};
use crate::protocol::revision::Revision;

pub(super) struct WsClient {
    opts: ConnectOptions,
    session_id: String,
    root: String,
    link: Mutex<Arc<Link>>,
    reconnecting: tokio::sync::Mutex<()>,
    subs: Arc<Subs>,
    next_id: AtomicI64,
    ids: Ids,
    /// How the session writes paths: `file://` URIs (November 2026), or
    /// plain paths on a server that has only the May 2026 revision.
    revision: Revision,
    /// When a call was last answered.
    last_answer: Mutex<tokio::time::Instant>,
}

impl WsClient {
    pub(super) async fn connect(opts: ConnectOptions) -> Result<WsClient> {
        let subs = Arc::new(Subs::default());
        let next_id = AtomicI64::new(1);
        // A gateway over its limits (-32001), or a replica that is draining
        // (a new connection through the balancer reaches another), is asked
        // again, a while later; a session being resumed also outlasts a
        // connection that fails as the reconnects of a live client do.
        let mut backoff = Backoff::new(opts.resume_within);
        let resuming = opts.resume_session.is_some();
        let worth_retrying = |e: &ClientError| {
            is_overloaded(e)
                || is_draining(e)
                || is_unavailable_at_handshake(e)
                || (resuming && is_transient(e))
        };
        let (link, init) = loop {
            let link = match open_link(&opts, 0, subs.clone()).await {
                Ok(link) => link,
                Err(e) if worth_retrying(&e) && backoff.wait().await => continue,
                Err(e) => return Err(e),
            };
            match handshake(&link, &next_id, &opts, opts.resume_session.as_deref()).await {
                Ok(init) => break (link, init),
                Err(e) if worth_retrying(&e) && backoff.wait().await => link.dead.cancel(),
                Err(e) => return Err(e),
            }
        };
        let (root, revision) = match discover_root(&link, &next_id, init.environment_info).await {
            Ok(found) => found,
            Err(e) => {
                link.dead.cancel();
                return Err(e);
            }
        };
        let mut opts = opts;
        opts.resume_session = Some(init.session_id.clone());
        Ok(WsClient::new(
            opts,
            init.session_id,
            root,
            revision,
            link,
            subs,
            next_id,
        ))
    }

    fn new(
        opts: ConnectOptions,
        session_id: String,
        root: String,
        revision: Revision,
        link: Arc<Link>,
        subs: Arc<Subs>,
        next_id: AtomicI64,
    ) -> WsClient {
        WsClient {
            opts,
            session_id,
            root,
            link: Mutex::new(link),
            reconnecting: tokio::sync::Mutex::new(()),
            subs,
            next_id,
            ids: Ids::new(),
            revision,
            last_answer: Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// A path as the session's revision writes it.
    fn wire_path(&self, path: &str) -> Result<WirePath> {
        wire_path(path, self.revision)
    }

    pub(super) fn session_id(&self) -> &str {
        &self.session_id
    }

    pub(super) fn root(&self) -> &str {
        &self.root
    }

    /// Replace a dead link with a resumed one (once, whoever asks first).
    async fn reconnect(&self, dead_generation: u64) -> Result<()> {
        let _one = self.reconnecting.lock().await;
        let dead = self.link.lock().clone();
        if dead.generation != dead_generation {
            return Ok(());
        }
        if dead.close_code.load(Ordering::Relaxed) == TAKEN_OVER {
            return Err(dead.disconnected());
        }
        // Measured from the last answer, so a link that keeps dying
        // right after each resume does not retry forever.
        let since = self.last_answer.lock().elapsed();
        let mut backoff = Backoff::new(self.opts.resume_within.saturating_sub(since));
        loop {
            let last = match self.resume_once(dead_generation + 1).await {
                Ok(link) => {
                    tracing::info!(session = %self.session_id, why = %dead.why.lock(), "connection lost; session resumed");
                    *self.link.lock() = link;
                    // Attachments re-read what they missed.
                    self.subs.lag_all();
                    return Ok(());
                }
                // The session is gone or someone else holds it: retrying
                // cannot help.
                Err(e) if !is_transient(&e) => return Err(e),
                Err(e) => e.to_string(),
            };
            if !backoff.wait().await {
                return Err(ClientError::Disconnected(format!(
                    "could not resume session {} within {}s: {last}",
                    self.session_id,
                    self.opts.resume_within.as_secs()
                )));
            }
        }
    }

    async fn resume_once(&self, generation: u64) -> Result<Arc<Link>> {
        let link = open_link(&self.opts, generation, self.subs.clone()).await?;
        handshake(&link, &self.next_id, &self.opts, Some(&self.session_id)).await?;
        Ok(link)
    }

    /// A call, retried on a resumed link when the connection drops; `None`
    /// for a start that, retried, found its process already there.
    async fn call_retrying<P: Serialize>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<Option<Box<RawValue>>> {
        let mut retried = false;
        loop {
            let link = self.link.lock().clone();
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            match link.call(id, method, params).await {
                Err(ClientError::Disconnected(_)) => {
                    self.reconnect(link.generation).await?;
                    retried = true;
                }
                Err(e) if is_overloaded(&e) => {
                    tokio::time::sleep(retry_after(&e)).await;
                }
                Ok(r) => {
                    *self.last_answer.lock() = tokio::time::Instant::now();
                    return Ok(Some(r));
                }
                // A start retried after a drop may find the first one done.
                Err(e) if retried && method == methods::PROCESS_START && e.is_already_exists() => {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A call whose result decodes into `T`.
    async fn call<T: DeserializeOwned, P: Serialize>(&self, method: &str, params: &P) -> Result<T> {
        match self.call_retrying(method, params).await? {
            Some(raw) => decode_result(&raw),
            None => Err(ClientError::Protocol(format!("{method} has no result"))),
        }
    }

    /// A call whose result is not needed.
    async fn call_unit<P: Serialize>(&self, method: &str, params: &P) -> Result<()> {
        self.call_retrying(method, params).await.map(|_| ())
    }

    pub(super) async fn close(&self) -> Result<()> {
        let r = self.call_unit(methods::SESSION_CLOSE, &()).await;
        self.link.lock().dead.cancel();
        r
    }
}

impl Drop for WsClient {
    fn drop(&mut self) {
        self.link.lock().dead.cancel();
    }
}

fn decode_result<T: DeserializeOwned>(raw: &RawValue) -> Result<T> {
    serde_json::from_str(raw.get()).map_err(ClientError::protocol)
}

/// `path` as a session of `revision` writes it; relative paths are refused.
fn wire_path(path: &str, revision: Revision) -> Result<WirePath> {
    if !path.starts_with('/') {
        return Err(ClientError::Usage(format!(
            "`{path}` is not an absolute path"
        )));
    }
    Ok(WirePath::parse(to_wire(path, revision)))
}

/// `initialize` (resuming `resume`), then `initialized`.
async fn handshake(
    link: &Link,
    next_id: &AtomicI64,
    opts: &ConnectOptions,
    resume: Option<&str>,
) -> Result<InitializeResponse> {
    let params = InitializeParams {
        snapshot: None,
        client_name: opts.client_name.clone(),
        resume_session_id: resume.map(str::to_owned),
        // A resumed session keeps the image it was opened on.
        image: opts.image.clone().filter(|_| resume.is_none()),
    };
    let id = next_id.fetch_add(1, Ordering::Relaxed);
    let r = link.call(id, methods::INITIALIZE, &params).await?;
    let init = decode_result(&r)?;
    link.notify(methods::INITIALIZED).await?;
    Ok(init)
}

/// The tenant's root and the revision to speak. The client speaks the
/// November 2026 revision: `file://` paths (the first one fixes the
/// session's revision), 128 + n exit codes, the 80 s detach TTL. A server
/// whose `initialize` carries no environment is asked with a method only
/// that revision has; one without it (Codex 0.130.0's exec-server) gets
/// plain paths.
async fn discover_root(
    link: &Link,
    next_id: &AtomicI64,
    environment: Option<Box<EnvironmentInfo>>,
) -> Result<(String, Revision)> {
    let (cwd, revision) = match environment {
        Some(env) => (Some(env.cwd), Revision::Nov2026),
        None => {
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            match link.call(id, methods::ENVIRONMENT_INFO, &()).await {
                Ok(raw) => {
                    let env: EnvironmentInfo = decode_result(&raw)?;
                    (Some(env.cwd), Revision::Nov2026)
                }
                Err(ClientError::Rpc {
                    code: code::METHOD_NOT_FOUND,
                    ..
                }) => (None, Revision::May2026),
                Err(e) => return Err(e),
            }
        }
    };
    // `file:///x` → `/x`; a plain path as is.
    let root = cwd.map_or_else(
        || "/".to_owned(),
        |c| WirePath::parse(c).as_str().to_owned(),
    );
    Ok((root, revision))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::testing::{error, fake};
    use super::*;

    #[test]
    fn paths_are_written_in_the_sessions_form() {
        let nov = wire_path("/a b/c", Revision::Nov2026).unwrap();
        assert_eq!(nov.raw(), "file:///a%20b/c");
        assert_eq!(nov.as_str(), "/a b/c");
        assert_eq!(
            wire_path("/a b/c", Revision::May2026).unwrap().raw(),
            "/a b/c"
        );
        assert!(matches!(
            wire_path("a/b", Revision::Nov2026),
            Err(ClientError::Usage(m)) if m.contains("not an absolute path")
        ));
    }

    #[tokio::test]
    async fn handshake_initializes_then_says_initialized() {
        let f = fake(Revision::Nov2026, |_, _| Ok(json!({"sessionId": "s7"})));
        let opts = ConnectOptions::new("ws://x", "t");
        let init = handshake(&f.link, &AtomicI64::new(5), &opts, Some("s7"))
            .await
            .unwrap();
        assert_eq!(init.session_id, "s7");
        assert!(init.environment_info.is_none());
        // The stand-in records the notification after the answer is read.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while f.methods().len() < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert_eq!(f.methods(), ["initialize", "initialized"]);
        assert_eq!(
            f.params(0),
            json!({"clientName": opts.client_name, "resumeSessionId": "s7"})
        );
        assert!(
            f.seen.lock()[0]
                .2
                .starts_with(r#"{"id":5,"method":"initialize""#)
        );
        assert_eq!(f.seen.lock()[1].2, r#"{"method":"initialized"}"#);
    }

    fn environment(cwd: &str) -> serde_json::Value {
        json!({"shell": {"name": "bash", "path": "/bin/bash"}, "executorVersion": "1",
               "providerId": "p", "cwd": cwd, "userHomeDir": "/", "platformOs": "linux",
               "prependPathDirs": [], "temporaryDirectories": [], "tempDir": "/tmp",
               "capabilities": {}})
    }

    #[tokio::test]
    async fn the_root_comes_from_the_environment() {
        let f = fake(Revision::Nov2026, |_, _| {
            Ok(environment("file:///home/t%201"))
        });
        let next = AtomicI64::new(1);
        let (root, rev) = discover_root(&f.link, &next, None).await.unwrap();
        assert_eq!((root.as_str(), rev), ("/home/t 1", Revision::Nov2026));
        assert_eq!(f.methods(), ["environment/info"]);

        // Given at `initialize`: nothing asked.
        let env: EnvironmentInfo = serde_json::from_value(environment("file:///r")).unwrap();
        let (root, _) = discover_root(&f.link, &next, Some(Box::new(env)))
            .await
            .unwrap();
        assert_eq!(root, "/r");
        assert_eq!(f.methods().len(), 1);
    }

    #[tokio::test]
    async fn a_server_without_environment_info_gets_plain_paths() {
        let f = fake(Revision::Nov2026, |_, _| {
            Err(error(-32601, "method not found: environment/info"))
        });
        let (root, rev) = discover_root(&f.link, &AtomicI64::new(1), None)
            .await
            .unwrap();
        assert_eq!((root.as_str(), rev), ("/", Revision::May2026));
        // Any other error is the connection's failure.
        let f = fake(Revision::Nov2026, |_, _| Err(error(-32003, "forbidden")));
        assert!(matches!(
            discover_root(&f.link, &AtomicI64::new(1), None).await,
            Err(ClientError::Rpc { code: -32003, .. })
        ));
    }

    #[tokio::test]
    async fn close_ends_the_session_and_the_link() {
        let f = fake(Revision::Nov2026, |_, _| Ok(json!({})));
        f.client.close().await.unwrap();
        assert_eq!(f.methods(), ["session/close"]);
        assert!(f.link.dead.is_cancelled());
    }
}
