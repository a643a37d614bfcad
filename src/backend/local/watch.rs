//! `fs/watchMissing`: one watch per session, polled with backoff, firing
//! `fs/missingChanged` once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{LocalSession, blocking, unexpected};
use crate::error::GatewayError;
use crate::fs::{FsDone, FsOp, FsRoot};
use crate::protocol::fs::{WatchMissingParams, WatchMissingResponse};
use crate::protocol::notify;
use crate::protocol::path::WirePath;
use crate::rpc::Reply;

/// Paths one `fs/watchMissing` may watch.
pub const MAX_WATCHED_PATHS: usize = 1024;
/// A watch checks its paths this often at first, backing off to
/// [`WATCH_POLL_MAX`] while nothing changes.
const WATCH_POLL_MIN: Duration = Duration::from_millis(100);
const WATCH_POLL_MAX: Duration = Duration::from_secs(2);

/// The session's `fs/watchMissing` watch.
pub(super) struct Watch {
    id: u64,
    stop: CancellationToken,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `fs/watchMissing`: one watch per session; a higher id replaces the
/// current one, a lower or equal one is ignored. It fires
/// `fs/missingChanged` once, when a missing path appears or the
/// present one disappears.
pub(super) async fn watch_missing(
    s: &LocalSession,
    p: WatchMissingParams,
) -> Result<Reply, GatewayError> {
    let not_watching = Reply::FsWatchMissing(WatchMissingResponse { watching: false });
    if p.missing.len() + usize::from(p.present.is_some()) > MAX_WATCHED_PATHS {
        return Err(GatewayError::InvalidParams(format!(
            "too many paths to watch (limit {MAX_WATCHED_PATHS})"
        )));
    }
    if s.watch.lock().as_ref().is_some_and(|w| p.watch_id <= w.id) {
        return Ok(not_watching);
    }
    let mut paths = p.missing.clone();
    paths.extend(p.present.iter().cloned());
    let before = exist(&s.shared.root, paths.clone()).await?;
    let present_gone = p.present.is_some() && before.last() != Some(&true);
    let nothing_missing = before[..p.missing.len()].iter().all(|e| *e);
    let stop = CancellationToken::new();
    {
        let mut current = s.watch.lock();
        if current.as_ref().is_some_and(|w| p.watch_id <= w.id) {
            return Ok(not_watching);
        }
        // The new id replaces the old watch even when it does not watch.
        *current = Some(Watch {
            id: p.watch_id,
            stop: stop.clone(),
        });
    }
    if present_gone || nothing_missing {
        return Ok(not_watching);
    }
    let (root, attachment, id) = (s.shared.root.clone(), s.attachment.clone(), p.watch_id);
    crate::task::start("fs-watch", async move {
        let mut every = WATCH_POLL_MIN;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let Ok(now) = exist(&root, paths.clone()).await else {
                return;
            };
            if now != before {
                attachment.notify(notify::fs_missing_changed(id)).await;
                return;
            }
            every = (every * 2).min(WATCH_POLL_MAX);
        }
    });
    Ok(Reply::FsWatchMissing(WatchMissingResponse {
        watching: true,
    }))
}

/// Which of `paths` exist, checked by the gateway (confined to the root;
/// existence is all that is learned).
async fn exist(root: &Arc<FsRoot>, paths: Vec<WirePath>) -> Result<Vec<bool>, GatewayError> {
    let root = root.clone();
    match blocking(move || crate::fs::run(&root, FsOp::Exist(paths))).await? {
        FsDone::Exist(v) => Ok(v),
        other => Err(unexpected(&other).into()),
    }
}
