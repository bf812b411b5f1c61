//! How long the orders examples keep records: `RECORD_TTL_SECS` sets the layer's record TTL
//! (default 24 h), and `SWEEP_INTERVAL_SECS` runs a [`Sweeper`] in the process at that
//! interval, which archives a record into `idempotency_records_archive` and purges it as
//! soon as its TTL has passed (no extra grace). A key whose record was purged runs again as
//! a new request; its archived row stays.

use std::time::Duration;

use axum_idempotency::{
    Archive, IdempotencyLayer, IntoStore, LeaseStore, MaintenanceStore, Sweeper, SweeperHandle,
};

/// `RECORD_TTL_SECS` and `SWEEP_INTERVAL_SECS`, when set.
pub(crate) struct Retention {
    ttl: Option<Duration>,
    sweep_every: Option<Duration>,
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
        Ok(Self {
            ttl: seconds("RECORD_TTL_SECS")?,
            sweep_every: seconds("SWEEP_INTERVAL_SECS")?,
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
        Some(
            Sweeper::new(pool)
                .interval(every)
                .success_grace(Duration::ZERO)
                .archive(Archive::Records)
                .spawn(),
        )
    }
}
