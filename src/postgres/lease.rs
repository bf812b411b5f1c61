//! Lease mode on tokio-postgres: the PROCESSING record committed on its own, and its
//! fenced completion, one autocommit statement each.

use std::time::Duration;

use tokio_postgres::types::ToSql;

use super::PgStore;
use super::statement;
use crate::engine::error::Error;
use crate::engine::record::{LeaseClaim, NewRecord};
use crate::store::{LeaseStore, rows};

impl LeaseStore for PgStore {
    /// Commits the PROCESSING record (autocommit, one statement); only when the key was not
    /// free is the record read, to say why.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let conn = self.checkout().await?;
        let db = self.db(&*conn);
        let acquire = db.prepare(&statement::LEASE_ACQUIRE).await?;
        let fingerprint = &record.fingerprint.0[..];
        let (lease, ttl) = (lease.as_secs_f64(), record.ttl.as_secs_f64());
        let acquire_params: [&(dyn ToSql + Sync); 6] = [
            &record.id,
            &record.scope,
            &record.raw_key,
            &fingerprint,
            &lease,
            &ttl,
        ];
        if let Some(row) = db.query_opt(&acquire, &acquire_params).await? {
            return Ok(LeaseClaim::Acquired {
                token: row.try_get(0)?,
                // An upsert that updated leaves its transaction in the row's `xmax`; a
                // fresh insert leaves 0.
                took_over: row.try_get(1)?,
            });
        }
        let lookup = db.prepare(&statement::LOOKUP).await?;
        let found = db.query_opt(&lookup, &[&record.id]).await?;
        let found = found.map(|row| rows::lookup(&row)).transpose()?;
        Ok(LeaseClaim::not_acquired(found, record.fingerprint))
    }
}
