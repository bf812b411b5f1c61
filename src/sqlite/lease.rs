//! Lease mode on SQLite: the PROCESSING record committed in a short write transaction of
//! its own (with a fencing token from the counter row), and its fenced completion, one
//! autocommit statement.

use std::time::Duration;

use ::sqlx::Row;

use super::{SqliteStore, sql};
use crate::engine::error::Error;
use crate::engine::record::{Claim, Existing, LeaseClaim, NewRecord};
use crate::store::{LeaseStore, Store, rows};

impl LeaseStore for SqliteStore {
    /// A look-up outside any transaction answers a replay, a 422 or a 409 for a live lease
    /// without the write lock. Otherwise `BEGIN IMMEDIATE`, the record again under the
    /// lock, and — when the key is free or replaceable — the next fencing token and the
    /// upsert, then `COMMIT`: five round trips. A key this request may not take is answered
    /// from the record read under the lock, and its transaction rolled back.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let peeked = self.lookup(record.id).await?;
        if let Some(Claim::Existing { existing, .. }) = Claim::from_peek(peeked) {
            return Ok(LeaseClaim::Existing(existing));
        }
        let mut conn = self.begin().await?;
        let found = self
            .query(sql::LOOKUP)
            .bind(&record.id.as_bytes()[..])
            .fetch_optional(conn.connection_mut())
            .await?;
        let took_over = match found.as_ref().map(rows::lookup).transpose()? {
            Some(row) => {
                let existing = Existing::from(row);
                if !existing.can_be_replaced_by(record.fingerprint) {
                    <SqliteStore as Store>::rollback(conn).await;
                    return Ok(LeaseClaim::Existing(existing));
                }
                true
            }
            None => false,
        };
        let token: i64 = self
            .query(sql::NEXT_FENCING_TOKEN)
            .fetch_all(conn.connection_mut())
            .await?
            .first()
            .ok_or_else(|| ::sqlx::Error::RowNotFound)?
            .try_get(0)?;
        let acquired = self
            .query(sql::LEASE_ACQUIRE)
            .bind(&record.id.as_bytes()[..])
            .bind(record.scope)
            .bind(record.raw_key)
            .bind(&record.fingerprint.0[..])
            .bind(token)
            .bind(lease.as_secs_f64())
            .bind(record.ttl.as_secs_f64())
            .fetch_all(conn.connection_mut())
            .await?;
        let Some(row) = acquired.first() else {
            // Cannot happen under the write lock (the record was read under it).
            <SqliteStore as Store>::rollback(conn).await;
            return Ok(LeaseClaim::Raced);
        };
        let token = row.try_get(0)?;
        conn.commit().await?;
        Ok(LeaseClaim::Acquired { token, took_over })
    }
}
