//! [`Store`] for tokio-postgres: every statement pipelined where the protocol allows, in
//! one round trip per step.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::PgStore;
use super::conn::{TxConn, begin_wait_and_look_up, lock_timeout};
use super::statement::{self, Db};
use super::tx::PgTx;
use crate::engine::error::Error;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::record::{Claim, CommitError, Completion, Deferred, NewRecord};
use crate::store::rows::impl_row;
use crate::store::{Store, rows, sql};

impl_row!(tokio_postgres::Row, tokio_postgres::Error);

impl tokio_postgres::types::ToSql for RecordId {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(self.as_bytes());
        Ok(tokio_postgres::types::IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::UUID
    }

    tokio_postgres::types::to_sql_checked!();
}

impl Store for PgStore {
    type Handle = PgTx;
    type Tx = PgTx;

    const DRIVER: &'static str = "tokio-postgres";

    fn set_prepared_statements(&mut self, enabled: bool) {
        self.prepared = enabled;
    }

    fn set_optimistic_claim(&mut self, bound: Option<Duration>) {
        self.optimistic = bound;
    }

    async fn migrate(&self) -> Result<(), Error> {
        super::migrate::run(self.checkout().await?).await
    }

    /// By default, first a lookup outside any transaction: a replay, a 422 or a 409 for a
    /// leased key needs nothing more. A key with no record is claimed lazily: nothing more
    /// is sent now, and `BEGIN` with the key's lock attempt leaves in one pipeline with the
    /// handler's first statement (see [`TxConn::lazy`]); a twin that commits in between is
    /// caught by the record's primary key at the insert. A key whose record may be
    /// replaced (expired, abandoned, failed retryably) is claimed eagerly: `BEGIN`, the lock
    /// attempt and the lookup again, pipelined in one round trip, the lookup a statement of
    /// its own after the lock, so its READ COMMITTED snapshot sees whatever the previous
    /// holder committed. With `wait`, the lock is awaited (bounded by a transaction-local
    /// `lock_timeout`, reset before the handler runs) instead of tried.
    async fn claim(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        wait: Option<Duration>,
    ) -> Result<(Claim, TxConn), Error> {
        let lock_key = id.lock_key();
        // The optimistic claim bounds a twin's wait itself: no lock to wait for.
        let Some(wait) = wait.filter(|_| self.optimistic.is_none()) else {
            let mut conn = TxConn::lazy(self.checkout().await?, self.prepared, id);
            let db = self.db(conn.pooled());
            let lookup = db.prepare(&statement::LOOKUP).await?;
            let lookup_params: [&(dyn ToSql + Sync); 1] = [&id];
            let peeked = db.query_opt(&lookup, &lookup_params).await?;
            let Some(peeked) = peeked.map(|row| rows::lookup(&row)).transpose()? else {
                conn.set_optimistic(self.optimistic);
                return Ok((Claim::Run { replaces: false }, conn));
            };
            if let Some(claim) = Claim::from_peek(Some(peeked)) {
                // Outside any transaction: the connection is clean.
                return Ok((claim, conn));
            }
            let try_lock = db.prepare(&statement::TRY_LOCK).await?;
            let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
            conn.beginning();
            let client = db.client();
            let (begin, locked, found) = tokio::join!(
                biased;
                client.batch_execute("BEGIN"),
                db.query_one(&try_lock, &lock_params),
                db.query_opt(&lookup, &lookup_params),
            );
            begin?;
            let locked: bool = locked?.try_get(0)?;
            conn.begun(true, false);
            let found = found?.map(|row| rows::lookup(&row)).transpose()?;
            return Ok((Claim::decide(locked, found, fingerprint), conn));
        };
        let conn = TxConn::new(self.checkout().await?, self.prepared);
        let db = self.db(conn.pooled());
        let lookup_params: [&(dyn ToSql + Sync); 1] = [&id];
        let Some(found) =
            begin_wait_and_look_up(db, lock_key, wait, &statement::LOOKUP, &lookup_params, None)
                .await?
        else {
            return Ok((Claim::InFlight, conn));
        };
        let found = found.map(|row| rows::lookup(&row)).transpose()?;
        Ok((Claim::decide(true, found, fingerprint), conn))
    }

    /// One round trip: (rollback and re-lock, for a stored 4xx whose writes are
    /// discarded), (delete the record being replaced), insert and COMMIT are pipelined. If
    /// any of them fails, PostgreSQL turns the COMMIT into a ROLLBACK, so the handler's
    /// writes never commit without their record.
    async fn commit(
        conn: &mut TxConn,
        record: &NewRecord<'_>,
        completion: Completion,
    ) -> Result<(), CommitError> {
        if conn.deferred() != Deferred::Granted {
            return Err(CommitError::InFlight);
        }
        if conn.is_lazy() {
            return commit_lazy(conn, record).await;
        }
        let prepared = conn.prepared();
        let db = Db::new(conn.pooled(), prepared);
        let client = db.client();
        let failed = |e| CommitError::Failed(Error::Postgres(e));
        let insert = db.prepare(&statement::INSERT).await.map_err(failed)?;
        // After a rollback the transaction starts afresh, so look for a replaceable record
        // again.
        let delete = if completion.replaces || completion.discard_handler_writes.is_some() {
            Some(
                db.prepare(&statement::DELETE_REPLACEABLE)
                    .await
                    .map_err(failed)?,
            )
        } else {
            None
        };
        let relock = match completion.discard_handler_writes {
            Some(timeout) => Some((
                db.prepare(&statement::SET_LOCK_TIMEOUT)
                    .await
                    .map_err(failed)?,
                db.prepare(&statement::WAIT_LOCK).await.map_err(failed)?,
                lock_timeout(timeout),
            )),
            None => None,
        };
        let lock_key = record.id.lock_key();
        let status = record.status.as_u16() as i16;
        let ttl = record.ttl.as_secs_f64();
        let fingerprint = &record.fingerprint.0[..];
        let body = &*record.body.bytes;
        let insert_params: [&(dyn ToSql + Sync); 9] = [
            &record.id,
            &record.scope,
            &record.raw_key,
            &fingerprint,
            &status,
            &record.headers,
            &body,
            &record.body.key_id,
            &ttl,
        ];
        let (relocked, deleted, inserted, committed) = tokio::join!(
            biased;
            async {
                let Some((set_timeout, lock, timeout)) = &relock else {
                    return Ok(());
                };
                // Discard the handler's writes, then take the key again in a new
                // transaction; if another request got in between, the insert below meets
                // its record.
                let timeout_params: [&(dyn ToSql + Sync); 1] = [timeout];
                let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
                let (rolled_back, begun, timeout_set, locked, reset) = tokio::join!(
                    biased;
                    client.batch_execute("ROLLBACK"),
                    client.batch_execute("BEGIN"),
                    db.query_one(set_timeout, &timeout_params),
                    db.query_one(lock, &lock_params),
                    client.batch_execute(sql::RESET_LOCK_TIMEOUT),
                );
                rolled_back?;
                begun?;
                timeout_set?;
                locked?;
                reset
            },
            async {
                match &delete {
                    Some(delete) => db.execute(delete, &[&record.id]).await.map(drop),
                    None => Ok(()),
                }
            },
            db.execute(&insert, &insert_params),
            client.batch_execute("COMMIT"),
        );
        relocked.map_err(failed)?;
        deleted.map_err(failed)?;
        match inserted {
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                // The COMMIT after the failed insert was a ROLLBACK.
                conn.mark_ended();
                return Err(CommitError::Conflict);
            }
            Err(e) if conn.optimistic().is_some() && waited_out(&e) => {
                // An optimistic twin waited past its bound on the winner's uncommitted
                // key (or deadlocked with it): rolled back, the winner is in flight.
                conn.mark_ended();
                return Err(CommitError::InFlight);
            }
            inserted => inserted.map_err(failed)?,
        };
        committed.map_err(failed)?;
        conn.mark_ended();
        Ok(())
    }

    /// Lazy too: `BEGIN` leaves with the handler's first statement.
    async fn begin(&self) -> Result<TxConn, Error> {
        Ok(TxConn::plain(self.checkout().await?, self.prepared))
    }

    async fn rollback(conn: TxConn) {
        conn.rollback().await;
    }

    fn deferred(conn: &TxConn) -> Deferred {
        conn.deferred()
    }
}

/// The completion of a lazy claim whose handler sent no statement: `BEGIN`, the record's
/// insert with the key's lock attempt in the same statement, and `COMMIT`, in one round
/// trip. A key another request holds inserts nothing; a record a twin committed meanwhile
/// meets the primary key.
async fn commit_lazy(conn: &mut TxConn, record: &NewRecord<'_>) -> Result<(), CommitError> {
    let failed = |e| CommitError::Failed(Error::Postgres(e));
    let db = Db::new(conn.pooled(), conn.prepared());
    let insert = db
        .prepare(&statement::INSERT_IF_LOCKED)
        .await
        .map_err(failed)?;
    let lock_key = record.id.lock_key();
    let status = record.status.as_u16() as i16;
    let ttl = record.ttl.as_secs_f64();
    let fingerprint = &record.fingerprint.0[..];
    let body = &*record.body.bytes;
    let params: [&(dyn ToSql + Sync); 10] = [
        &record.id,
        &record.scope,
        &record.raw_key,
        &fingerprint,
        &status,
        &record.headers,
        &body,
        &record.body.key_id,
        &ttl,
        &lock_key,
    ];
    // The optimistic claim bounds the insert's wait on a twin's uncommitted key.
    let set_timeout = match conn.optimistic() {
        Some(bound) => Some((
            db.prepare(&statement::SET_LOCK_TIMEOUT)
                .await
                .map_err(failed)?,
            lock_timeout(bound),
        )),
        None => None,
    };
    conn.beginning();
    let client = db.client();
    let (begun, timeout_set, inserted, committed) = tokio::join!(
        biased;
        client.batch_execute("BEGIN"),
        async {
            match &set_timeout {
                Some((set, timeout)) => db.query_one(set, &[timeout]).await.map(drop),
                None => Ok(()),
            }
        },
        db.execute(&insert, &params),
        client.batch_execute("COMMIT"),
    );
    begun.map_err(failed)?;
    timeout_set.map_err(failed)?;
    let inserted = match inserted {
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            // The COMMIT after the failed insert was a ROLLBACK.
            conn.mark_ended();
            return Err(CommitError::Conflict);
        }
        Err(e) if conn.optimistic().is_some() && waited_out(&e) => {
            conn.mark_ended();
            return Err(CommitError::InFlight);
        }
        inserted => inserted.map_err(failed)?,
    };
    committed.map_err(failed)?;
    conn.mark_ended();
    if inserted == 0 {
        return Err(CommitError::InFlight);
    }
    Ok(())
}

/// A record insert that gave up on a twin's uncommitted key: its wait ran past the
/// optimistic claim's `lock_timeout`, or the two deadlocked.
fn waited_out(error: &tokio_postgres::Error) -> bool {
    matches!(
        error.code(),
        Some(code) if *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
    )
}
