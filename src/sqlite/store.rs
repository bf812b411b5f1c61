//! [`Store`] for SQLite: the claim (a look-up outside any transaction, then
//! `BEGIN IMMEDIATE` and the look-up again under SQLite's write lock) and the completion
//! (the record's insert, then `COMMIT`).

use std::time::Duration;

use ::sqlx::sqlite::SqliteRow;
use ::sqlx::{Row, SqliteConnection};

use super::SqliteTx;
use super::conn::{SqliteConn, begin_immediate, is_unique_violation, statement};
use super::{SqliteStore, sql};
use crate::engine::error::Error;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::record::{Claim, CommitError, Completion, NewRecord};
use crate::store::rows::impl_row;
use crate::store::{Store, rows};

impl_row!(SqliteRow, ::sqlx::Error);

impl Store for SqliteStore {
    type Handle = SqliteTx;
    type Tx = SqliteConnection;

    const DRIVER: &'static str = "sqlite";

    fn set_prepared_statements(&mut self, enabled: bool) {
        self.persistent = enabled;
    }

    async fn migrate(&self) -> Result<(), Error> {
        super::migrate::run(&self.pool).await
    }

    /// The record's look-up outside any transaction (a replay, a 422 or a 409 for a leased
    /// key needs nothing more; WAL readers never wait); a key another request of this
    /// process holds is in flight at once (unless the layer waits); then, on the same
    /// connection,
    /// `BEGIN IMMEDIATE` — SQLite's write lock, so the key's too: it waits for a twin's
    /// COMMIT, bounded by `wait` and the busy timeout — and the look-up again under it.
    /// Three round trips to the connection's worker before the handler's first statement.
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, SqliteConn), Error> {
        let mut pooled = self.pool.acquire().await?;
        let peeked = self
            .query(sql::LOOKUP)
            .bind(&id.as_bytes()[..])
            .fetch_optional(&mut *pooled)
            .await?;
        let peeked = peeked.as_ref().map(rows::lookup).transpose()?;
        if let Some(claim) = Claim::from_peek(peeked) {
            // Outside any transaction: the connection goes back to the pool as it is.
            return Ok((claim, self.ended()));
        }
        if wait.is_none() && self.in_flight.holds(id) {
            // A request of this process runs the key: in flight, at once.
            return Ok((Claim::InFlight, self.ended()));
        }
        let Some(tx) = begin_immediate(pooled, wait).await? else {
            // The holder did not commit within the wait: in flight.
            return Ok((Claim::InFlight, self.ended()));
        };
        let mut conn = self.open(tx);
        let found = self
            .query(sql::LOOKUP)
            .bind(&id.as_bytes()[..])
            .fetch_optional(conn.connection_mut())
            .await?;
        let found = found.as_ref().map(rows::lookup).transpose()?;
        let claim = Claim::decide(true, found, fingerprint);
        if matches!(claim, Claim::Run { .. }) {
            conn.key = Some(self.in_flight.enter(id));
        }
        Ok((claim, conn))
    }

    async fn commit(
        conn: &mut SqliteConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        let failed = |e: ::sqlx::Error| CommitError::Failed(Error::Sqlx(e));
        let persistent = conn.persistent;
        if completion.discard_handler_writes.is_some() {
            // Discard the handler's writes, then take the write lock again in a new
            // transaction (waiting up to the busy timeout); if another request got in
            // between, the insert below meets its record.
            let handler_tx = conn.tx.take().expect("an open transaction");
            handler_tx.rollback().await.map_err(failed)?;
            conn.tx = Some(
                conn.pool
                    .begin_with(sql::BEGIN_IMMEDIATE)
                    .await
                    .map_err(failed)?,
            );
        }
        let connection = conn.connection_mut();
        if completion.replaces || completion.discard_handler_writes.is_some() {
            statement(sql::DELETE_REPLACEABLE, persistent)
                .bind(&record.id.as_bytes()[..])
                .execute(&mut *connection)
                .await
                .map_err(failed)?;
        }
        let inserted = statement(sql::INSERT, persistent)
            .bind(&record.id.as_bytes()[..])
            .bind(record.scope)
            .bind(record.raw_key)
            .bind(&record.fingerprint.0[..])
            .bind(i16::try_from(record.status.as_u16()).unwrap_or(i16::MAX))
            .bind(&record.headers[..])
            .bind(&*record.body.bytes)
            .bind(record.body.key_id)
            .bind(record.ttl.as_secs_f64())
            .execute(&mut *connection)
            .await;
        let tx = conn.tx.take().expect("an open transaction");
        // Committed or not, the key is no longer this process's to hold once this returns.
        let _key = conn.key.take();
        match inserted {
            Err(e) if is_unique_violation(&e) => {
                tx.rollback().await.map_err(failed)?;
                return Err(CommitError::Conflict);
            }
            // Dropped unfinished, the transaction rolls back.
            inserted => inserted.map_err(failed)?,
        };
        tx.commit().await.map_err(failed)
    }

    async fn begin(&self) -> Result<SqliteConn, Error> {
        SqliteStore::begin(self).await
    }

    async fn rollback(mut conn: SqliteConn) {
        if let Some(tx) = conn.tx.take() {
            if let Err(error) = tx.rollback().await {
                tracing::debug!(%error, "ROLLBACK failed");
            }
        }
    }
}
