//! Lease mode on sqlx: the PROCESSING record committed on its own, and its fenced
//! completion, one autocommit statement each.

use std::time::Duration;

use ::sqlx::Row;

use super::SqlxStore;
use crate::engine::error::Error;
use crate::engine::record::{LeaseClaim, NewRecord};
use crate::store::{LeaseStore, Store, sql};

impl LeaseStore for SqlxStore {
    /// The upsert commits on its own; only when it did not take the key is the record read.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let query = self
            .query(sql::LEASE_ACQUIRE)
            .bind(record.id)
            .bind(record.scope)
            .bind(record.raw_key)
            .bind(&record.fingerprint.0[..])
            .bind(lease.as_secs_f64())
            .bind(record.ttl.as_secs_f64());
        let acquired = self
            .on_own_connection(|conn| Box::pin(query.fetch_optional(conn)))
            .await?;
        if let Some(row) = acquired {
            return Ok(LeaseClaim::Acquired {
                token: row.try_get(0)?,
                took_over: row.try_get(1)?,
            });
        }
        let found = self.lookup(record.id).await?;
        Ok(LeaseClaim::not_acquired(found, record.fingerprint))
    }
}
