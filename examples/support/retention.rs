//! How long the orders examples keep records: `RECORD_TTL_SECS` sets the layer's record TTL
//! (default 24 h), and `SWEEP_INTERVAL_SECS` runs a [`Sweeper`] in the process at that
//! interval, which archives a record into `idempotency_records_archive` and purges it as
//! soon as its TTL has passed (no extra grace). A key whose record was purged runs again as
//! a new request; its archived row stays. With `ARCHIVE_JSONL` naming a file, the sweeper
//! archives into that file of JSON lines instead of the table (`jsonl_archive.rs`).

use std::sync::Mutex;
use std::time::Duration;

use axum_idempotency::{
    Archive, IdempotencyLayer, IntoStore, LeaseStore, MaintenanceStore, Sweeper, SweeperHandle,
};

use crate::jsonl_archive::JsonLines;

/// `RECORD_TTL_SECS`, `SWEEP_INTERVAL_SECS` and `ARCHIVE_JSONL`, when set.
pub(crate) struct Retention {
    ttl: Option<Duration>,
    sweep_every: Option<Duration>,
    /// Opened at start (so a path that cannot be written fails the start), taken by the
    /// sweeper.
    jsonl: Mutex<Option<JsonLines>>,
}

impl Retention {
    pub(crate) fn from_env() -> Result<Self, String> {
        let seconds = |name: &str| match std::env::var(name) {
            Ok(value) => match value.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Some(Duration::from_secs(n))),
                _ => Err(format!(
                    "{name} must be a positive number of seconds, not {value:?}"
                )),
            },
            Err(_) => Ok(None),
        };
        let jsonl = match std::env::var_os("ARCHIVE_JSONL") {
            Some(path) => Some(JsonLines::open(path)?),
            None => None,
        };
        Ok(Self {
            ttl: seconds("RECORD_TTL_SECS")?,
            sweep_every: seconds("SWEEP_INTERVAL_SECS")?,
            jsonl: Mutex::new(jsonl),
        })
    }

    /// The layer with `RECORD_TTL_SECS` as its record TTL.
    pub(crate) fn layer<D: LeaseStore>(&self, layer: IdempotencyLayer<D>) -> IdempotencyLayer<D> {
        match self.ttl {
            Some(ttl) => layer.ttl(ttl),
            None => layer,
        }
    }

    /// The sweeper `SWEEP_INTERVAL_SECS` asks for, running.
    pub(crate) fn sweeper<P>(&self, pool: P) -> Option<SweeperHandle>
    where
        P: IntoStore,
        P::Store: MaintenanceStore + Send + Sync + 'static,
    {
        let every = self.sweep_every?;
        let sweeper = Sweeper::new(pool)
            .interval(every)
            .success_grace(Duration::ZERO);
        let sweeper = match self.jsonl.lock().unwrap().take() {
            Some(file) => sweeper.archive_to(file, Archive::Records),
            None => sweeper.archive(Archive::Records),
        };
        Some(sweeper.spawn())
    }
}
