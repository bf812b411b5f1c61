//! The keys this process is running on each SQLite file: SQLite has one writer and no row
//! locks, so a twin cannot see that another request holds its key — it would only wait
//! for the write lock, whichever key holds it. Within one process the claim asks this
//! registry first and answers an in-flight twin 409 at once, as on PostgreSQL; a twin in
//! another process on the same file waits for the write lock (up to the busy timeout) and
//! then replays.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use crate::engine::key::RecordId;

/// The keys in flight on one database file, shared by every store over it.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    keys: Mutex<HashSet<RecordId>>,
}

/// One registry per database file, as long as a store over it lives.
static FILES: LazyLock<Mutex<HashMap<PathBuf, Weak<InFlight>>>> = LazyLock::new(Default::default);

impl InFlight {
    /// The registry of the file at `path` (absolute or relative to the working directory;
    /// every store of this process over the same path shares it).
    pub(super) fn of(path: &Path) -> Arc<Self> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        let mut files = FILES.lock().unwrap_or_else(|e| e.into_inner());
        files.retain(|_, registry| registry.strong_count() > 0);
        if let Some(registry) = files.get(&path).and_then(Weak::upgrade) {
            return registry;
        }
        let registry = Arc::new(Self::default());
        files.insert(path, Arc::downgrade(&registry));
        registry
    }

    /// Whether a request of this process holds `id`.
    pub(super) fn holds(&self, id: RecordId) -> bool {
        self.keys().contains(&id)
    }

    /// Marks `id` in flight until the guard drops.
    pub(super) fn enter(self: &Arc<Self>, id: RecordId) -> Entered {
        self.keys().insert(id);
        Entered {
            registry: Arc::clone(self),
            id,
        }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashSet<RecordId>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A key held by a request of this process, for as long as its transaction is open.
#[derive(Debug)]
pub(super) struct Entered {
    registry: Arc<InFlight>,
    id: RecordId,
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.registry.keys().remove(&self.id);
    }
}
