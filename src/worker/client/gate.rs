//! A tenant's calls to its workers, held off while a snapshot freezes the
//! tenant (module `snapshot`): a worker frozen mid-call would be taken for
//! a stuck one and killed.

use std::sync::Arc;

/// A tenant's calls to its workers, held off while a snapshot freezes it.
pub type Gate = Arc<tokio::sync::RwLock<()>>;
