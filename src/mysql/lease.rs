//! Lease mode on MySQL/MariaDB: the PROCESSING record committed in a short transaction of
//! its own (the key's row lock, a fencing token from the counter, the insert or takeover),
//! and its fenced completion — for a free key two round trips (the commit alone) and one
//! on MariaDB.

use std::time::Duration;

use ::sqlx::Row;

use super::MySqlStore;
use super::batch;
use super::conn::{COLUMN_CANNOT_BE_NULL, DUPLICATE_KEY, error_number, lock_refused};
use crate::engine::error::Error;
use crate::engine::record::{LeaseClaim, LeaseEnd, NewRecord};
use crate::store::queries::Queries;
use crate::store::queries::lease_complete_params;
use crate::store::{LeaseStore, rows};

impl LeaseStore for MySqlStore {
    /// For a free key, one text query ([`batch::lease_acquire`]: `BEGIN`, the key's locking
    /// read, the token drawn, the PROCESSING record) and the commit. A key with a record
    /// stops that query at the insert, with the row read and locked: then one more for a
    /// takeover ([`batch::lease_take_over`]) and its commit, or the rollback.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let server = self.server_known().await?;
        let (mut conn, answered) = self
            .run(batch::lease_acquire(record, lease, server))
            .await?;
        let error = match answered.error {
            None => {
                conn.finish(true).await?;
                let token = i64::try_from(answered.last_insert_id).unwrap_or(i64::MAX);
                return Ok(LeaseClaim::Acquired {
                    token,
                    took_over: false,
                });
            }
            Some(error) => error,
        };
        let row = match error_number(&error) {
            // A twin holds the key.
            _ if lock_refused(&error) => None,
            Some(DUPLICATE_KEY) => answered.rows.first(),
            // The counter's row is missing: the token would be NULL.
            Some(COLUMN_CANNOT_BE_NULL) => {
                conn.reset().await;
                return Err(Error::SchemaMissing(Box::new(Error::InvalidArgument(
                    "the fencing-token counter row is missing from idempotency_counters",
                ))));
            }
            _ => {
                conn.reset().await;
                return Err(error.into());
            }
        };
        let Some(row) = row else {
            // Refused, or a twin inserted the key after the locking read.
            conn.reset().await;
            return Ok(LeaseClaim::Raced);
        };
        if !row.try_get::<bool, _>(10)? {
            let found = rows::lookup(row)?;
            conn.reset().await;
            return Ok(LeaseClaim::not_acquired(Some(found), record.fingerprint));
        }
        // Replaceable, and locked: the token drawn before the insert failed takes it over.
        let drawn = i64::try_from(answered.last_insert_id).unwrap_or(i64::MAX);
        let took = conn.run(batch::lease_take_over(record, lease, drawn)).await;
        if let Some(error) = took.error {
            conn.reset().await;
            return Err(error.into());
        }
        conn.finish(true).await?;
        let token = match took.rows.first() {
            Some(row) => row.try_get(0)?,
            None => drawn,
        };
        Ok(LeaseClaim::Acquired {
            token,
            took_over: true,
        })
    }

    /// One text query ([`batch::lease_complete`]: the fenced `UPDATE`, its lock wait
    /// bounded), and — but on MariaDB, where it is one autocommit statement — the commit
    /// when it changed the holder's record.
    async fn lease_complete(
        &self,
        record: &NewRecord<'_>,
        token: i64,
        end: LeaseEnd,
    ) -> Result<bool, Error> {
        let server = self.server_known().await?;
        let lean = server.mariadb && !server.galera;
        let Some(query) = batch::lease_complete(record, token, end, server) else {
            let params = lease_complete_params(record, token, end);
            return self
                .query_changed(Self::STATEMENTS.lease_complete, &params)
                .await;
        };
        let (mut conn, answered) = self.run(query).await?;
        match answered.error {
            // One autocommit statement: committed, or nothing to commit.
            None if lean => {
                conn.settle();
                Ok(answered.rows_affected == 1)
            }
            // The holder's record, still under its token.
            None if answered.rows_affected == 1 => {
                conn.finish(true).await?;
                Ok(true)
            }
            // The lease was taken over: nothing to commit.
            None => {
                conn.reset().await;
                Ok(false)
            }
            Some(error) => {
                conn.reset().await;
                Err(error.into())
            }
        }
    }
}
