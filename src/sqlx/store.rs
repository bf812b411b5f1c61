//! [`Store`] for sqlx: the same statements as the tokio-postgres driver, one round trip
//! each (so the claim after the first lookup is one call of the claim function).

use std::time::Duration;

use ::sqlx::postgres::types::Oid;
use ::sqlx::postgres::{PgArgumentBuffer, PgRow, PgTypeInfo, Postgres};
use ::sqlx::{PgConnection, Row};

use super::SqlxStore;
use super::SqlxTx;
use super::conn::{
    SqlxConn, UNIQUE_VIOLATION, broke_connection, sql_state, statement, timed_out, wait_lock,
};
use crate::engine::error::Error;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::record::{Claim, CommitError, Completion, NewRecord};
use crate::store::rows::impl_row;
use crate::store::{Store, rows, sql};

impl_row!(PgRow, ::sqlx::Error);

/// `uuid`'s built-in type oid.
const UUID_OID: Oid = Oid(2950);

impl ::sqlx::Type<Postgres> for RecordId {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(UUID_OID)
    }
}

impl ::sqlx::Encode<'_, Postgres> for RecordId {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
        buf.extend_from_slice(self.as_bytes());
        Ok(::sqlx::encode::IsNull::No)
    }
}

impl Store for SqlxStore {
    type Handle = SqlxTx;
    type Tx = PgConnection;

    const DRIVER: &'static str = "sqlx";

    fn set_prepared_statements(&mut self, enabled: bool) {
        self.persistent = enabled;
    }

    async fn migrate(&self) -> Result<(), Error> {
        super::migrate::run(&self.pool).await
    }

    /// By default, first a lookup outside any transaction (a replay, a 422 or a 409 for a
    /// leased key needs nothing more), then `BEGIN` and the claim function on the same
    /// connection — one checkout, so a new key pays no second checkout (nor the pool's
    /// `test_before_acquire` ping). With `wait`, `BEGIN`, the bounded lock wait and the
    /// lookup after it.
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, SqlxConn), Error> {
        let lock_key = id.lock_key();
        let link = &self.link;
        let Some(wait) = wait else {
            let mut pooled = self.acquire().await?;
            let peeked = link
                .within(
                    Duration::ZERO,
                    self.query(sql::LOOKUP)
                        .bind(id)
                        .fetch_optional(&mut *pooled),
                )
                .await;
            if peeked.as_ref().is_err_and(broke_connection) {
                pooled.close_on_drop();
            }
            let peeked = peeked?.map(|row| rows::lookup(&row)).transpose()?;
            if let Some(claim) = Claim::from_peek(peeked) {
                // Outside any transaction: the connection goes back to the pool as it is.
                return Ok((claim, self.ended()));
            }
            // The transaction begins on the connection just used.
            let mut conn = SqlxConn::begin(self, pooled).await?;
            let row = link
                .within(
                    Duration::ZERO,
                    self.query(sql::CLAIM)
                        .bind(id)
                        .bind(lock_key)
                        .fetch_one(conn.connection_mut()),
                )
                .await?;
            let locked: bool = row.try_get(9)?;
            let found: bool = row.try_get(10)?;
            let found = if found {
                Some(rows::record_row(&row, 11)?)
            } else {
                None
            };
            return Ok((Claim::decide(locked, found, fingerprint), conn));
        };
        let mut conn = self.begin().await?;
        let locking = wait_lock(conn.connection_mut(), lock_key, wait, self.persistent);
        match link.within(wait, locking).await {
            Err(e) if timed_out(&e) => return Ok((Claim::InFlight, conn)),
            locked => locked?,
        }
        let found = link
            .within(
                Duration::ZERO,
                self.query(sql::LOOKUP)
                    .bind(id)
                    .fetch_optional(conn.connection_mut()),
            )
            .await?;
        let found = found.map(|row| rows::lookup(&row)).transpose()?;
        Ok((Claim::decide(true, found, fingerprint), conn))
    }

    async fn commit(
        conn: &mut SqlxConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        let failed = |e: ::sqlx::Error| CommitError::Failed(Error::Sqlx(e));
        let persistent = conn.persistent;
        let link = conn.link.clone();
        if let Some(timeout) = completion.discard_handler_writes {
            // Discard the handler's writes, then take the key again in a new transaction;
            // if another request got in between, the insert below meets its record.
            conn.rollback().await.map_err(failed)?;
            let pooled = link
                .within(Duration::ZERO, conn.pool.acquire())
                .await
                .map_err(failed)?;
            *conn = SqlxConn::begin(&conn.store(), pooled)
                .await
                .map_err(failed)?;
            let locking = wait_lock(
                conn.connection_mut(),
                record.id.lock_key(),
                timeout,
                persistent,
            );
            link.within(timeout, locking).await.map_err(failed)?;
        }
        let connection = conn.connection_mut();
        if completion.replaces || completion.discard_handler_writes.is_some() {
            link.within(
                Duration::ZERO,
                statement(sql::DELETE_REPLACEABLE, persistent)
                    .bind(record.id)
                    .execute(&mut *connection),
            )
            .await
            .map_err(failed)?;
        }
        let inserted = link
            .within(
                Duration::ZERO,
                statement(sql::INSERT, persistent)
                    .bind(record.id)
                    .bind(record.scope)
                    .bind(record.raw_key)
                    .bind(&record.fingerprint.0[..])
                    .bind(record.status.as_u16() as i16)
                    .bind(&record.headers[..])
                    .bind(&*record.body.bytes)
                    .bind(record.body.key_id)
                    .bind(record.ttl.as_secs_f64())
                    .execute(&mut *connection),
            )
            .await;
        match inserted {
            Err(e) if sql_state(&e).as_deref() == Some(UNIQUE_VIOLATION) => {
                conn.rollback().await.map_err(failed)?;
                return Err(CommitError::Conflict);
            }
            // Left open, the connection is closed when `conn` drops.
            inserted => inserted.map_err(failed)?,
        };
        conn.commit().await.map_err(failed)
    }

    async fn begin(&self) -> Result<SqlxConn, Error> {
        SqlxStore::begin(self).await
    }

    async fn rollback(mut conn: SqlxConn) {
        if conn.is_open() {
            if let Err(error) = conn.rollback().await {
                tracing::debug!(%error, "ROLLBACK failed; the connection is closed");
            }
        }
    }

    async fn link_lost(&self) -> Error {
        self.link.lost(&self.pool).await;
        Error::Sqlx(::sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the database could not be reached within {:?}",
                self.link.timeout
            ),
        )))
    }
}
