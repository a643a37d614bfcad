//! A tenant's calls to its workers, held off while a snapshot freezes the
//! tenant (module `snapshot`): a worker frozen mid-call would be taken for
//! a stuck one and killed.

use std::sync::Arc;

/// A tenant's calls to its workers, held off while a snapshot freezes it.
pub type Gate = Arc<tokio::sync::RwLock<()>>;

/// The gate held for reading from blocking code (a spawn's round trip).
pub(super) fn read_blocking(gate: &Gate) -> tokio::sync::OwnedRwLockReadGuard<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(gate.clone().read_owned()))
        }
        // Not on a multi-threaded runtime's worker: wait here.
        _ => loop {
            if let Ok(g) = gate.clone().try_read_owned() {
                break g;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        },
    }
}
