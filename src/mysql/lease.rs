//! Lease mode on MySQL/MariaDB: the PROCESSING record committed in a short transaction of
//! its own (the key's row lock, a fencing token from the counter, the insert or takeover),
//! and its fenced completion.

use std::time::Duration;

use ::sqlx::Row;

use super::MySqlStore;
use super::conn::{DUPLICATE_KEY, error_number, lock_refused, micros};
use super::sql;
use crate::engine::error::Error;
use crate::engine::record::{LeaseClaim, LeaseEnd, NewRecord};
use crate::store::{LeaseStore, rows};

impl LeaseStore for MySqlStore {
    /// `BEGIN` (lock waits bounded to 1 s), the key's locking read, and — when the key is
    /// free or may be taken over — the token drawn, the insert or takeover and `COMMIT`.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let mut conn = self.begin_internal(1).await?;
        let id = &record.id.as_bytes()[..];
        let locked = self
            .query(sql::LEASE_LOCK)
            .bind(&record.fingerprint.0[..])
            .bind(id)
            .fetch_optional(conn.connection_mut())
            .await;
        let row = match locked {
            Err(e) if lock_refused(&e) => {
                conn.reset().await;
                return Ok(LeaseClaim::Raced);
            }
            locked => locked?,
        };
        let took_over = match &row {
            None => false,
            Some(row) if row.try_get::<bool, _>(10)? => true,
            Some(row) => {
                let found = rows::record_row(row, 9)?;
                conn.reset().await;
                return Ok(LeaseClaim::not_acquired(Some(found), record.fingerprint));
            }
        };
        let drawn = self
            .query(sql::NEXT_FENCING_TOKEN)
            .execute(conn.connection_mut())
            .await?;
        let token = i64::try_from(drawn.last_insert_id()).unwrap_or(i64::MAX);
        if drawn.rows_affected() != 1 || token <= 0 {
            conn.reset().await;
            return Err(Error::SchemaMissing(Box::new(Error::InvalidArgument(
                "the fencing-token counter row is missing from idempotency_counters",
            ))));
        }
        let token = if took_over {
            self.query(sql::LEASE_TAKE_OVER)
                .bind(record.scope)
                .bind(record.raw_key)
                .bind(&record.fingerprint.0[..])
                .bind(token)
                .bind(micros(lease))
                .bind(micros(record.ttl))
                .bind(id)
                .execute(conn.connection_mut())
                .await?;
            self.query(sql::LEASE_TOKEN)
                .bind(id)
                .fetch_one(conn.connection_mut())
                .await?
                .try_get(0)?
        } else {
            let inserted = self
                .query(sql::LEASE_INSERT)
                .bind(id)
                .bind(record.scope)
                .bind(record.raw_key)
                .bind(&record.fingerprint.0[..])
                .bind(token)
                .bind(micros(lease))
                .bind(micros(record.ttl))
                .execute(conn.connection_mut())
                .await;
            match inserted {
                Ok(_) => token,
                // A twin inserted the key after the locking read.
                Err(e) if error_number(&e) == Some(DUPLICATE_KEY) || lock_refused(&e) => {
                    conn.reset().await;
                    return Ok(LeaseClaim::Raced);
                }
                Err(e) => return Err(e.into()),
            }
        };
        conn.finish(true).await?;
        Ok(LeaseClaim::Acquired { token, took_over })
    }

    /// One fenced `UPDATE`, its lock wait bounded.
    async fn lease_complete(
        &self,
        record: &NewRecord<'_>,
        token: i64,
        end: LeaseEnd,
    ) -> Result<bool, Error> {
        let query = self
            .query(sql::LEASE_COMPLETE)
            .bind(end.state())
            .bind(end.retryable())
            .bind(record.status.as_u16() as i16)
            .bind(&record.headers[..])
            .bind(&*record.body.bytes)
            .bind(record.body.key_id)
            .bind(micros(record.ttl))
            .bind(&record.id.as_bytes()[..])
            .bind(token);
        Ok(self.execute_bounded(query).await? == 1)
    }
}
