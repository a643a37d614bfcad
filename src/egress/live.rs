//! The tenant's open proxied connections, by the name each was allowed
//! for: a policy change closes those it no longer allows.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
pub struct Live {
    inner: Arc<parking_lot::Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    open: HashMap<u64, (String, u16, CancellationToken)>,
}

/// One open connection; it leaves the table when dropped.
#[derive(Debug)]
pub struct Entry {
    id: u64,
    stop: CancellationToken,
    inner: Arc<parking_lot::Mutex<Inner>>,
}

impl Entry {
    /// Resolves when the connection must close.
    pub async fn closed(&self) {
        self.stop.cancelled().await;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.inner.lock().open.remove(&self.id);
    }
}

impl Live {
    /// Record a connection allowed for `name` on `port`.
    pub fn open(&self, name: &str, port: u16) -> Entry {
        let stop = CancellationToken::new();
        let mut i = self.inner.lock();
        let id = i.next;
        i.next += 1;
        i.open.insert(id, (name.to_owned(), port, stop.clone()));
        Entry {
            id,
            stop,
            inner: self.inner.clone(),
        }
    }

    /// Close every connection `keep` says no to; how many.
    pub fn close_unless(&self, keep: impl Fn(&str, u16) -> bool) -> usize {
        let i = self.inner.lock();
        let mut closed = 0;
        for (name, port, stop) in i.open.values() {
            if !keep(name, *port) && !stop.is_cancelled() {
                stop.cancel();
                closed += 1;
            }
        }
        closed
    }
}
