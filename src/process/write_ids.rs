//! `writeId` de-duplication: a write retried with its id is applied once.
//!
//! An id is remembered only once its write has happened: a write that
//! failed is forgotten (its retry writes), and a write still under way
//! makes its retry wait for the outcome. The write itself runs in a task of
//! its own, so a call cancelled mid-write (its client's connection dropped,
//! the very case the id is for) neither leaves half the bytes written and
//! the id unknown, nor the id known and the bytes unwritten.
//!
//! Bounded in bytes: ids longer than [`MAX_WRITE_ID_BYTES`] are refused
//! before they get here, and each remembered id is stored once, so a
//! process's table holds at most [`WRITE_IDS_PER_PROCESS`] ×
//! [`MAX_WRITE_ID_BYTES`] bytes of ids (1 MiB).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::GatewayError;

/// `writeId`s remembered per process (oldest forgotten first).
pub const WRITE_IDS_PER_PROCESS: usize = 4096;
/// Longest `writeId` accepted (Codex sends UUIDs: 36 bytes).
pub const MAX_WRITE_ID_BYTES: usize = 256;

#[derive(Debug)]
enum State {
    /// Being written; the receiver sees when it is over.
    Writing(watch::Receiver<bool>),
    Written,
}

/// What a write with an id should do.
#[derive(Debug)]
pub enum Claim {
    /// Write it (the id is now being written).
    Write(watch::Sender<bool>),
    /// Already written: acknowledge.
    Written,
    /// Another call is writing it: wait, then claim again.
    Wait(watch::Receiver<bool>),
}

#[derive(Debug, Default)]
pub struct WriteIds {
    order: VecDeque<Arc<str>>,
    ids: HashMap<Arc<str>, State>,
    bytes: usize,
}

impl WriteIds {
    pub fn claim(&mut self, id: &str) -> Claim {
        match self.ids.get(id) {
            Some(State::Written) => return Claim::Written,
            Some(State::Writing(rx)) => return Claim::Wait(rx.clone()),
            None => {}
        }
        if self.order.len() >= WRITE_IDS_PER_PROCESS
            && let Some(old) = self.order.pop_front()
        {
            self.bytes -= old.len();
            self.ids.remove(&old);
        }
        let (tx, rx) = watch::channel(false);
        let id: Arc<str> = Arc::from(id);
        self.bytes += id.len();
        self.order.push_back(id.clone());
        self.ids.insert(id, State::Writing(rx));
        Claim::Write(tx)
    }

    /// The write of `id` is over: remembered if it happened, forgotten if
    /// it failed (a retry writes it).
    fn finish(&mut self, id: &str, written: bool) {
        if written {
            if let Some(state) = self.ids.get_mut(id) {
                *state = State::Written;
            }
        } else if self.ids.remove(id).is_some() {
            self.order.retain(|o| &**o != id);
            self.bytes -= id.len();
        }
    }

    /// Forgets `id` if it is still the write `rx` watched (not one another
    /// waiter has claimed since).
    fn abandon(&mut self, id: &str, rx: &watch::Receiver<bool>) {
        if matches!(self.ids.get(id), Some(State::Writing(r)) if r.same_channel(rx)) {
            self.finish(id, false);
        }
    }

    /// Bytes of ids held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Runs `write` once for `id`: not again for a repeat of an id written, and
/// after the outcome of one being written. `write` runs in a task of its
/// own, to its end, even if this call is dropped.
pub async fn write_once<F>(
    ids: &Arc<Mutex<WriteIds>>,
    id: &str,
    write: impl FnOnce() -> F,
) -> Result<(), GatewayError>
where
    F: Future<Output = Result<(), GatewayError>> + Send + 'static,
{
    let mut write = Some(write);
    loop {
        let claim = ids.lock().claim(id);
        match claim {
            Claim::Written => return Ok(()),
            Claim::Wait(mut rx) => {
                // Over when the writer says so; then claim again. A writer
                // gone without saying (its task panicked) wrote nothing
                // known: forgotten, as a failed write.
                if rx.wait_for(|done| *done).await.is_err() {
                    ids.lock().abandon(id, &rx);
                }
            }
            Claim::Write(tx) => {
                let Some(write) = write.take() else {
                    return Err(GatewayError::Internal("write id claimed twice".to_owned()));
                };
                let fut = write();
                let ids = ids.clone();
                let id: Arc<str> = Arc::from(id);
                let task = crate::task::start("stdin.write", async move {
                    let result = fut.await;
                    ids.lock().finish(&id, result.is_ok());
                    let _ = tx.send(true);
                    result
                });
                return task.await.unwrap_or_else(|e| {
                    Err(GatewayError::Internal(format!(
                        "stdin write task failed: {e}"
                    )))
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(ids: &mut WriteIds, id: &str) -> bool {
        match ids.claim(id) {
            Claim::Write(_) => {
                ids.finish(id, true);
                true
            }
            _ => false,
        }
    }

    #[test]
    fn repeats_are_seen_and_the_oldest_is_forgotten() {
        let mut ids = WriteIds::default();
        assert!(written(&mut ids, "a"));
        assert!(matches!(ids.claim("a"), Claim::Written));
        for i in 0..WRITE_IDS_PER_PROCESS {
            assert!(written(&mut ids, &i.to_string()));
        }
        // "a" was the oldest: forgotten, so new again.
        assert!(written(&mut ids, "a"));
        assert!(matches!(
            ids.claim(&(WRITE_IDS_PER_PROCESS - 1).to_string()),
            Claim::Written
        ));
    }

    #[test]
    fn the_table_is_bounded_in_bytes() {
        let mut ids = WriteIds::default();
        for i in 0..3 * WRITE_IDS_PER_PROCESS {
            let id = format!("{i:0>MAX_WRITE_ID_BYTES$}");
            assert!(written(&mut ids, &id));
        }
        assert_eq!(ids.bytes(), WRITE_IDS_PER_PROCESS * MAX_WRITE_ID_BYTES);
    }

    #[tokio::test]
    async fn a_failed_write_is_forgotten_and_its_retry_writes() {
        let ids = Arc::new(Mutex::new(WriteIds::default()));
        let e = write_once(&ids, "w", || async {
            Err(GatewayError::Internal("broken".into()))
        })
        .await;
        assert!(e.is_err());
        assert_eq!(ids.lock().bytes(), 0);
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..2 {
            let c = count.clone();
            write_once(&ids, "w", move || async move {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
            .await
            .unwrap();
        }
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_cancelled_call_still_writes_and_its_retry_waits_for_it() {
        let ids = Arc::new(Mutex::new(WriteIds::default()));
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = count.clone();
        // The first call is blocked mid-write, then dropped (its client went).
        let first = write_once(&ids, "w", move || async move {
            let _ = wait.await;
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        tokio::select! {
            biased;
            _ = first => panic!("the write is blocked"),
            _ = tokio::task::yield_now() => {}
        }
        // The retry waits for the first write, which goes on, then is
        // acknowledged without writing again.
        let c = count.clone();
        let retry = write_once(&ids, "w", move || async move {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        release.send(()).unwrap();
        retry.await.unwrap();
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
