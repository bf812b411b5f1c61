//! Everything that talks SQL: the schema migrations, the claim (lock and lookup), the final
//! insert-and-commit, and the codec for stored responses.
//!
//! Tables are created and used without a schema qualifier, so they live in the first schema
//! of the connections' `search_path`.

use bytes::Bytes;
use deadpool_postgres::{ClientWrapper, Pool};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Statement};

use crate::Error;
use crate::crypto::StoredBody;
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;

/// One statement the crate runs, with the types of its parameters.
///
/// The types are declared rather than inferred, so that a statement can run without being
/// prepared first (see [`Db`]); `sql_types_match_the_server` checks them against what
/// PostgreSQL infers.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) text: &'static str,
    pub(crate) types: &'static [Type],
}

/// A statement ready to run on one connection: prepared and cached, or to be sent as an
/// unnamed statement with its declared parameter types.
#[derive(Debug)]
pub(crate) enum Stmt {
    Prepared(Statement),
    Typed(&'static Sql),
}

/// A connection as the crate's statements use it: with named prepared statements, cached
/// per pooled connection (the default), or without any (`prepared_statements(false)`).
///
/// Without, every statement is sent as Parse/Bind/Describe/Execute/Sync of the unnamed
/// statement with explicit parameter types (`query_typed`): one round trip, and nothing
/// outlives it on the server connection — what a transaction-pooling PgBouncer without
/// prepared-statement support (before 1.21, or without `max_prepared_statements`) needs,
/// since it hands every transaction (and every autocommit statement) to whichever server
/// connection is free, where a statement prepared on another one does not exist.
///
/// Pipelining: callers [`prepare`](Self::prepare) every statement before a `tokio::join!`
/// and run them inside it. Both kinds of statement write their messages to the connection
/// on their future's first poll, before they first wait (tokio-postgres' `query_typed_raw`
/// and `execute_typed` encode and send before their first `.await`; so do `query`/`execute`
/// of a prepared `Statement`), and every `join!` here is `biased`, so it polls its branches
/// in the order written: the statements reach the server in that order.
#[derive(Clone, Copy)]
pub(crate) struct Db<'a> {
    client: &'a ClientWrapper,
    prepared: bool,
}

impl<'a> Db<'a> {
    pub(crate) fn new(client: &'a ClientWrapper, prepared: bool) -> Self {
        Self { client, prepared }
    }

    /// The underlying connection, for `batch_execute` (simple-protocol BEGIN, COMMIT, ...).
    pub(crate) fn client(self) -> &'a ClientWrapper {
        self.client
    }

    /// Prepares `sql` (once per pooled connection) when prepared statements are on;
    /// otherwise costs nothing. Call it before a pipelined `join!`, never inside one.
    pub(crate) async fn prepare(self, sql: &'static Sql) -> Result<Stmt, tokio_postgres::Error> {
        if self.prepared {
            let statement = self
                .client
                .prepare_typed_cached(sql.text, sql.types)
                .await?;
            Ok(Stmt::Prepared(statement))
        } else {
            Ok(Stmt::Typed(sql))
        }
    }

    pub(crate) async fn query(
        self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match statement {
            Stmt::Prepared(statement) => self.client.query(statement, params).await,
            Stmt::Typed(sql) => self.client.query_typed(sql.text, &typed(sql, params)).await,
        }
    }

    pub(crate) async fn query_one(
        self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        match statement {
            Stmt::Prepared(statement) => self.client.query_one(statement, params).await,
            Stmt::Typed(sql) => {
                self.client
                    .query_typed_one(sql.text, &typed(sql, params))
                    .await
            }
        }
    }

    pub(crate) async fn query_opt(
        self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        match statement {
            Stmt::Prepared(statement) => self.client.query_opt(statement, params).await,
            Stmt::Typed(sql) => {
                self.client
                    .query_typed_opt(sql.text, &typed(sql, params))
                    .await
            }
        }
    }

    pub(crate) async fn execute(
        self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match statement {
            Stmt::Prepared(statement) => self.client.execute(statement, params).await,
            Stmt::Typed(sql) => {
                self.client
                    .execute_typed(sql.text, &typed(sql, params))
                    .await
            }
        }
    }
}

impl std::fmt::Debug for Db<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("prepared", &self.prepared)
            .finish_non_exhaustive()
    }
}

/// Pairs each parameter with its declared type.
fn typed<'p>(sql: &Sql, params: &[&'p (dyn ToSql + Sync)]) -> Vec<(&'p (dyn ToSql + Sync), Type)> {
    debug_assert_eq!(params.len(), sql.types.len(), "{}", sql.text);
    params
        .iter()
        .copied()
        .zip(sql.types.iter().cloned())
        .collect()
}

/// One migration file, embedded at compile time.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Append-only: a released file never changes, a new one gets the next number.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idempotency_records",
        sql: include_str!("../migrations/0001_idempotency_records.sql"),
    },
    Migration {
        version: 2,
        name: "inbox_messages",
        sql: include_str!("../migrations/0002_inbox_messages.sql"),
    },
    Migration {
        version: 3,
        name: "lease_state",
        sql: include_str!("../migrations/0003_lease_state.sql"),
    },
    Migration {
        version: 4,
        name: "claim_function",
        sql: include_str!("../migrations/0004_claim_function.sql"),
    },
    Migration {
        version: 5,
        name: "body_encryption",
        sql: include_str!("../migrations/0005_body_encryption.sql"),
    },
    Migration {
        version: 6,
        name: "fencing_tokens",
        sql: include_str!("../migrations/0006_fencing_tokens.sql"),
    },
];

/// Advisory lock that serialises concurrent `migrate` calls (any schema, one database).
const MIGRATION_LOCK: i64 = 0x6178_6964_656d_0001;

/// Creates or upgrades the crate's tables. Safe to call from every instance at start-up:
/// concurrent calls wait for each other, and applied versions are recorded in
/// `axum_idempotency_migrations`.
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::Error> {
/// axum_idempotency::migrate(&pool).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &Pool) -> Result<(), Error> {
    // Safe behind a transaction-pooling PgBouncer, whatever the prepared-statement setting:
    // everything runs in one transaction (so on one server connection), and only as simple
    // queries and unnamed typed statements — nothing prepared survives the transaction.
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute_typed(
        "SELECT pg_advisory_xact_lock($1)",
        &[(&MIGRATION_LOCK, Type::INT8)],
    )
    .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS axum_idempotency_migrations (
            version    integer     PRIMARY KEY,
            name       text        NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .await?;
    let current: i32 = tx
        .query_typed_one(
            "SELECT coalesce(max(version), 0) FROM axum_idempotency_migrations",
            &[],
        )
        .await?
        .get(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    if current > known {
        return Err(Error::UnknownSchemaVersion {
            found: current,
            known,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.batch_execute(migration.sql).await?;
        tx.execute_typed(
            "INSERT INTO axum_idempotency_migrations (version, name) VALUES ($1, $2)",
            &[
                (&migration.version, Type::INT4),
                (&migration.name, Type::TEXT),
            ],
        )
        .await?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied migration"
        );
    }
    tx.commit().await?;
    Ok(())
}

/// The default claim: see [`claim`] and migrations 0004 and 0005.
const CLAIM: Sql = Sql {
    text: "SELECT * FROM axum_idempotency_claim_v2($1, $2)",
    types: &[Type::UUID, Type::INT8],
};
const WAIT_LOCK: Sql = Sql {
    text: "SELECT pg_advisory_xact_lock($1)::text",
    types: &[Type::INT8],
};
const SET_LOCK_TIMEOUT: Sql = Sql {
    text: "SELECT set_config('lock_timeout', $1, true)",
    types: &[Type::TEXT],
};
/// The wait's lock timeout must not apply to the handler's own statements.
const RESET_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout TO DEFAULT";
const LOOKUP: Sql = Sql {
    text: "SELECT status, headers, body, fingerprint, expires_at <= now(), state, \
                      retryable, ceil(extract(epoch FROM locked_until - now()))::int4, \
                      extract(epoch FROM expires_at - now())::float8, body_key_id \
                      FROM idempotency_records WHERE id = $1",
    types: &[Type::UUID],
};
/// Removes a record the claim found replaceable (expired, an abandoned lease, a retryable
/// failure), under the key's lock.
const DELETE_REPLACEABLE: Sql = Sql {
    text: "DELETE FROM idempotency_records WHERE id = $1 \
    AND (expires_at <= now() OR (state = 'PROCESSING' AND locked_until <= now()) \
         OR (state = 'FAILED' AND retryable))",
    types: &[Type::UUID],
};
const INSERT: Sql = Sql {
    text: "INSERT INTO idempotency_records \
                      (id, scope, idempotency_key, fingerprint, status, headers, body, \
                       body_key_id, expires_at) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9))",
    types: &[
        Type::UUID,
        Type::TEXT,
        Type::TEXT,
        Type::BYTEA,
        Type::INT2,
        Type::BYTEA,
        Type::BYTEA,
        Type::INT2,
        Type::FLOAT8,
    ],
};

/// A completed response as stored.
#[derive(Debug)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    /// As stored: sealed when `body_key_id` is set (see [`crate::crypto`]).
    pub(crate) body: Bytes,
    /// The key the body is sealed under; `None` for plaintext.
    pub(crate) body_key_id: Option<i16>,
    /// How long the record stays live.
    pub(crate) expires_in: std::time::Duration,
}

/// A record found for the key.
#[derive(Debug)]
pub(crate) struct Existing {
    pub(crate) fingerprint: Fingerprint,
    /// Past its `expires_at`: treated as absent.
    pub(crate) expired: bool,
    pub(crate) kind: ExistingKind,
}

#[derive(Debug)]
pub(crate) enum ExistingKind {
    /// A final response to replay: SUCCESS, or a FAILED lease that is not retryable.
    Completed(StoredResponse),
    /// A lease-mode holder is still within its lease; seconds left.
    Leased { retry_after: u32 },
    /// Free to be taken over: a lease that ran out, or a retryable failure.
    Replaceable,
}

impl Existing {
    /// Whether a request with `fingerprint` may run in place of this record.
    pub(crate) fn can_be_replaced_by(&self, fingerprint: Fingerprint) -> bool {
        self.expired
            || (matches!(self.kind, ExistingKind::Replaceable) && self.fingerprint == fingerprint)
    }
}

fn existing(row: &tokio_postgres::Row) -> Result<Existing, tokio_postgres::Error> {
    let fingerprint: &[u8] = row.try_get(3)?;
    let expired: bool = row.try_get(4)?;
    let state: &str = row.try_get(5)?;
    let retryable: bool = row.try_get(6)?;
    let lease_left: Option<i32> = row.try_get(7)?;
    let kind = match state {
        "SUCCESS" => ExistingKind::Completed(stored_response(row)?),
        "FAILED" if !retryable => ExistingKind::Completed(stored_response(row)?),
        "PROCESSING" if lease_left.is_some_and(|left| left > 0) => ExistingKind::Leased {
            retry_after: lease_left
                .and_then(|left| u32::try_from(left).ok())
                .unwrap_or(1),
        },
        _ => ExistingKind::Replaceable,
    };
    Ok(Existing {
        fingerprint: Fingerprint(fingerprint.try_into().unwrap_or([0; 32])),
        expired,
        kind,
    })
}

/// What the claim found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The lock is ours and the key is free: run the handler. `replaces` says a record for
    /// the id is still in the table (expired, or replaceable) and must be deleted first.
    Run { replaces: bool },
    /// Another transaction holds the lock: the key is in flight.
    InFlight,
    /// A record that this request may not replace; `holds_lock` says whether the key's
    /// lock was taken (and must be released before answering).
    Existing {
        existing: Existing,
        holds_lock: bool,
    },
}

/// Opens the transaction and claims the key — one round trip once prepared.
///
/// By default, `BEGIN` and one call of `axum_idempotency_claim_v2` (migrations 0004, 0005) are
/// pipelined: a completed record is returned without taking the lock (it never changes);
/// otherwise the key's transaction-scoped advisory lock is tried and the record read again
/// in a fresh READ COMMITTED snapshot. With `wait`, the lock is awaited (bounded by a
/// transaction-local `lock_timeout`, reset before the handler runs) and the lookup runs as
/// a statement of its own after it.
pub(crate) async fn claim(
    db: Db<'_>,
    id: RecordId,
    fingerprint: Fingerprint,
    wait: Option<std::time::Duration>,
) -> Result<Claim, tokio_postgres::Error> {
    let client = db.client();
    let lock_key = id.lock_key();
    let Some(wait) = wait else {
        let claim = db.prepare(&CLAIM).await?;
        let params: [&(dyn ToSql + Sync); 2] = [&id, &lock_key];
        let (begin, row) =
            tokio::join!(biased; client.batch_execute("BEGIN"), db.query_one(&claim, &params));
        begin?;
        let row = row?;
        let locked: bool = row.try_get(9)?;
        let found: bool = row.try_get(10)?;
        return match (locked, found) {
            (false, false) => Ok(Claim::InFlight),
            (true, false) => Ok(Claim::Run { replaces: false }),
            (holds_lock, true) => classify(existing(&row)?, fingerprint, holds_lock),
        };
    };
    let lookup = db.prepare(&LOOKUP).await?;
    let set_timeout = db.prepare(&SET_LOCK_TIMEOUT).await?;
    let lock = db.prepare(&WAIT_LOCK).await?;
    let timeout = format!("{}ms", wait.as_millis().max(1));
    let timeout_params: [&(dyn ToSql + Sync); 1] = [&timeout];
    let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
    let lookup_params: [&(dyn ToSql + Sync); 1] = [&id];
    let (begin, timeout_set, locked, reset, found) = tokio::join!(
        biased;
        client.batch_execute("BEGIN"),
        db.query_one(&set_timeout, &timeout_params),
        db.query_one(&lock, &lock_params),
        client.batch_execute(RESET_LOCK_TIMEOUT),
        db.query_opt(&lookup, &lookup_params),
    );
    begin?;
    timeout_set?;
    match locked {
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            return Ok(Claim::InFlight);
        }
        locked => locked?,
    };
    reset?;
    match found? {
        None => Ok(Claim::Run { replaces: false }),
        Some(row) => classify(existing(&row)?, fingerprint, true),
    }
}

fn classify(
    existing: Existing,
    fingerprint: Fingerprint,
    holds_lock: bool,
) -> Result<Claim, tokio_postgres::Error> {
    if holds_lock && existing.can_be_replaced_by(fingerprint) {
        return Ok(Claim::Run { replaces: true });
    }
    Ok(Claim::Existing {
        existing,
        holds_lock,
    })
}

/// Looks a record up outside any transaction (after the unique-key backstop fired).
pub(crate) async fn lookup(
    db: Db<'_>,
    id: RecordId,
) -> Result<Option<Existing>, tokio_postgres::Error> {
    let lookup = db.prepare(&LOOKUP).await?;
    match db.query_opt(&lookup, &[&id]).await? {
        Some(row) => Ok(Some(existing(&row)?).filter(|existing| !existing.expired)),
        None => Ok(None),
    }
}

/// Lease mode: take the key by committing a PROCESSING record, or take over one whose
/// holder's lease ran out (or that failed retryably), with a higher fencing token.
const LEASE_ACQUIRE: Sql = Sql {
    text: "INSERT INTO idempotency_records AS r \
    (id, scope, idempotency_key, fingerprint, state, fencing_token, locked_until, \
     status, headers, body, expires_at) \
    VALUES ($1, $2, $3, $4, 'PROCESSING', nextval('idempotency_fencing_tokens'), \
            now() + make_interval(secs => $5), 0, '', '', now() + make_interval(secs => $6)) \
    ON CONFLICT (id) DO UPDATE SET \
        state = 'PROCESSING', retryable = false, \
        fencing_token = GREATEST(r.fencing_token + 1, EXCLUDED.fencing_token), \
        locked_until = EXCLUDED.locked_until, scope = EXCLUDED.scope, \
        idempotency_key = EXCLUDED.idempotency_key, fingerprint = EXCLUDED.fingerprint, \
        status = 0, headers = '', body = '', body_key_id = NULL, updated_at = now(), \
        created_at = CASE WHEN r.expires_at <= now() THEN now() ELSE r.created_at END, \
        expires_at = EXCLUDED.expires_at \
    WHERE r.expires_at <= now() \
       OR (r.fingerprint = EXCLUDED.fingerprint \
           AND ((r.state = 'PROCESSING' AND r.locked_until <= now()) \
                OR (r.state = 'FAILED' AND r.retryable))) \
    RETURNING fencing_token, xmax <> '0'::xid",
    types: &[
        Type::UUID,
        Type::TEXT,
        Type::TEXT,
        Type::BYTEA,
        Type::FLOAT8,
        Type::FLOAT8,
    ],
};

/// Lease mode: the holder's completion, fenced by its token.
const LEASE_COMPLETE: Sql = Sql {
    text: "UPDATE idempotency_records SET \
        state = $3, retryable = $4, status = $5, headers = $6, body = $7, body_key_id = $8, \
        locked_until = NULL, updated_at = now(), expires_at = now() + make_interval(secs => $9) \
    WHERE id = $1 AND fencing_token = $2 AND state = 'PROCESSING'",
    types: &[
        Type::UUID,
        Type::INT8,
        Type::TEXT,
        Type::BOOL,
        Type::INT2,
        Type::BYTEA,
        Type::BYTEA,
        Type::INT2,
        Type::FLOAT8,
    ],
};

/// What a lease claim found.
#[derive(Debug)]
pub(crate) enum LeaseClaim {
    /// The lease is ours, under this fencing token; `took_over` says an earlier record for
    /// the key (an expired lease, a retryable failure, an expired record) was replaced.
    Acquired { token: i64, took_over: bool },
    /// A record this request may not take over.
    Existing(Existing),
    /// The record changed between the two statements; try again shortly.
    Raced,
}

/// Commits the PROCESSING record (autocommit, one statement) and, pipelined in the same
/// round trip, reads the record in case the key was not free.
pub(crate) async fn lease_acquire(
    db: Db<'_>,
    record: &NewRecord<'_>,
    lease: std::time::Duration,
) -> Result<LeaseClaim, tokio_postgres::Error> {
    let acquire = db.prepare(&LEASE_ACQUIRE).await?;
    let lookup = db.prepare(&LOOKUP).await?;
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
    let lookup_params: [&(dyn ToSql + Sync); 1] = [&record.id];
    let (acquired, found) = tokio::join!(
        biased;
        db.query_opt(&acquire, &acquire_params),
        db.query_opt(&lookup, &lookup_params),
    );
    if let Some(row) = acquired? {
        return Ok(LeaseClaim::Acquired {
            token: row.try_get(0)?,
            // An upsert that updated leaves its transaction in the row's `xmax`; a fresh
            // insert leaves 0.
            took_over: row.try_get(1)?,
        });
    }
    match found? {
        Some(row) => {
            let existing = existing(&row)?;
            if existing.can_be_replaced_by(record.fingerprint) {
                Ok(LeaseClaim::Raced)
            } else {
                Ok(LeaseClaim::Existing(existing))
            }
        }
        None => Ok(LeaseClaim::Raced),
    }
}

/// The final state a lease holder writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseEnd {
    Success,
    /// Replayed to retries like a success.
    FinalFailure,
    /// The next retry runs again.
    RetryableFailure,
}

/// Writes the holder's result if its token is still current. `Ok(false)`: the lease was
/// taken over, and nothing was written.
pub(crate) async fn lease_complete(
    db: Db<'_>,
    record: &NewRecord<'_>,
    token: i64,
    end: LeaseEnd,
) -> Result<bool, tokio_postgres::Error> {
    let complete = db.prepare(&LEASE_COMPLETE).await?;
    let state = match end {
        LeaseEnd::Success => "SUCCESS",
        LeaseEnd::FinalFailure | LeaseEnd::RetryableFailure => "FAILED",
    };
    let retryable = end == LeaseEnd::RetryableFailure;
    let status = record.status.as_u16() as i16;
    let ttl = record.ttl.as_secs_f64();
    let body = &*record.body.bytes;
    let params: [&(dyn ToSql + Sync); 9] = [
        &record.id,
        &token,
        &state,
        &retryable,
        &status,
        &record.headers,
        &body,
        &record.body.key_id,
        &ttl,
    ];
    Ok(db.execute(&complete, &params).await? == 1)
}

fn stored_response(row: &tokio_postgres::Row) -> Result<StoredResponse, tokio_postgres::Error> {
    let status: i16 = row.try_get(0)?;
    let headers: &[u8] = row.try_get(1)?;
    let body: Vec<u8> = row.try_get(2)?;
    let expires_in: f64 = row.try_get(8)?;
    let body_key_id: Option<i16> = row.try_get("body_key_id")?;
    Ok(StoredResponse {
        // A status outside 100..=999 can only come from a hand-edited row.
        status: u16::try_from(status)
            .ok()
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        headers: decode_headers(headers),
        body: Bytes::from(body),
        body_key_id,
        expires_in: std::time::Duration::try_from_secs_f64(expires_in).unwrap_or_default(),
    })
}

/// The record written with the handler's work.
#[derive(Debug)]
pub(crate) struct NewRecord<'a> {
    pub(crate) id: RecordId,
    pub(crate) scope: &'a str,
    pub(crate) raw_key: Option<&'a str>,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: StoredBody<'a>,
    pub(crate) ttl: std::time::Duration,
}

/// Why the final insert-and-commit did not commit.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// The primary key already holds a live record: a concurrent request won. The
    /// transaction has been rolled back.
    Conflict,
    /// The insert or the COMMIT failed — or its answer was lost, so the outcome is
    /// unknown: nothing stored, or committed and replayable.
    Failed(tokio_postgres::Error),
}

/// Inserts the record and commits — one round trip: (rollback and re-lock, for a stored 4xx
/// whose writes are discarded), (delete the record being replaced), insert and COMMIT are
/// pipelined. If any of them fails, PostgreSQL turns
/// the COMMIT into a ROLLBACK, so the handler's writes never commit without their record.
pub(crate) async fn insert_and_commit(
    db: Db<'_>,
    record: &NewRecord<'_>,
    discard_handler_writes: Option<std::time::Duration>,
    replaces: bool,
) -> Result<(), CommitError> {
    let client = db.client();
    let insert = db.prepare(&INSERT).await.map_err(CommitError::Failed)?;
    // After a rollback the transaction starts afresh, so look for a replaceable record again.
    let delete = if replaces || discard_handler_writes.is_some() {
        Some(
            db.prepare(&DELETE_REPLACEABLE)
                .await
                .map_err(CommitError::Failed)?,
        )
    } else {
        None
    };
    let relock = match discard_handler_writes {
        Some(timeout) => Some((
            db.prepare(&SET_LOCK_TIMEOUT)
                .await
                .map_err(CommitError::Failed)?,
            db.prepare(&WAIT_LOCK).await.map_err(CommitError::Failed)?,
            format!("{}ms", timeout.as_millis().max(1)),
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
            // Discard the handler's writes, then take the key again in a new transaction;
            // if another request got in between, the insert below meets its record.
            let timeout_params: [&(dyn ToSql + Sync); 1] = [timeout];
            let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
            let (rolled_back, begun, timeout_set, locked, reset) = tokio::join!(
                biased;
                client.batch_execute("ROLLBACK"),
                client.batch_execute("BEGIN"),
                db.query_one(set_timeout, &timeout_params),
                db.query_one(lock, &lock_params),
                client.batch_execute(RESET_LOCK_TIMEOUT),
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
    relocked.map_err(CommitError::Failed)?;
    deleted.map_err(CommitError::Failed)?;
    match inserted {
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            return Err(CommitError::Conflict);
        }
        inserted => inserted.map_err(CommitError::Failed)?,
    };
    committed.map_err(CommitError::Failed)
}

/// The inbox record of a message, as found under its lock.
#[derive(Debug)]
pub(crate) struct InboxRecord {
    pub(crate) succeeded: bool,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    /// Within the retention window; an expired record counts as absent.
    pub(crate) live: bool,
    pub(crate) payload_digest: Option<Vec<u8>>,
}

const INBOX_LOOKUP: Sql = Sql {
    text: "SELECT status = 'SUCCESS', attempts, last_error, expires_at > now(), \
                            payload_digest FROM inbox_messages \
                            WHERE consumer_group = $1 AND message_id = $2",
    types: &[Type::TEXT, Type::TEXT],
};
/// Records success with the consumer's work. An upsert, so that a FAILED or expired row
/// (which a concurrent sweep may delete at any moment) is replaced, and the record is
/// always written when the work commits.
const INBOX_RECORD_SUCCESS: Sql = Sql {
    text: "INSERT INTO inbox_messages AS m \
    (consumer_group, message_id, status, attempts, payload_digest, payload, payload_key_id, \
     expires_at) \
    VALUES ($1, $2, 'SUCCESS', $3, $4, $5, $6, now() + make_interval(secs => $7)) \
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET \
        status = 'SUCCESS', attempts = EXCLUDED.attempts, \
        payload_digest = EXCLUDED.payload_digest, payload = EXCLUDED.payload, \
        payload_key_id = EXCLUDED.payload_key_id, \
        last_error = NULL, updated_at = now(), expires_at = EXCLUDED.expires_at",
    types: &[
        Type::TEXT,
        Type::TEXT,
        Type::INT4,
        Type::BYTEA,
        Type::BYTEA,
        Type::INT2,
        Type::FLOAT8,
    ],
};
const INBOX_RECORD_FAILURE: Sql = Sql {
    text: "INSERT INTO inbox_messages AS m \
    (consumer_group, message_id, status, attempts, payload_digest, payload, payload_key_id, \
     last_error, expires_at) \
    VALUES ($1, $2, 'FAILED', 1, $3, $4, $5, $6, now() + make_interval(secs => $7)) \
    ON CONFLICT (consumer_group, message_id) DO UPDATE SET \
        status = 'FAILED', \
        attempts = CASE WHEN m.status = 'SUCCESS' OR m.expires_at <= now() \
                        THEN 1 ELSE m.attempts + 1 END, \
        payload_digest = EXCLUDED.payload_digest, payload = EXCLUDED.payload, \
        payload_key_id = EXCLUDED.payload_key_id, \
        last_error = EXCLUDED.last_error, updated_at = now(), expires_at = EXCLUDED.expires_at \
    WHERE m.status = 'FAILED' OR m.expires_at <= now() \
    RETURNING attempts",
    types: &[
        Type::TEXT,
        Type::TEXT,
        Type::BYTEA,
        Type::BYTEA,
        Type::INT2,
        Type::TEXT,
        Type::FLOAT8,
    ],
};

/// Begins the message's transaction, waits (bounded) for its advisory lock, and reads its
/// record — one round trip once prepared. `Ok(None)` from the outer option means the lock
/// was not granted in time.
pub(crate) async fn inbox_claim(
    db: Db<'_>,
    id: RecordId,
    group: &str,
    message_id: &str,
    wait: std::time::Duration,
) -> Result<Option<Option<InboxRecord>>, tokio_postgres::Error> {
    let client = db.client();
    let set_timeout = db.prepare(&SET_LOCK_TIMEOUT).await?;
    let lock = db.prepare(&WAIT_LOCK).await?;
    let lookup = db.prepare(&INBOX_LOOKUP).await?;
    let timeout = format!("{}ms", wait.as_millis().max(1));
    let lock_key = id.lock_key();
    let timeout_params: [&(dyn ToSql + Sync); 1] = [&timeout];
    let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
    let lookup_params: [&(dyn ToSql + Sync); 2] = [&group, &message_id];
    let (begin, timeout_set, locked, reset, found) = tokio::join!(
        biased;
        client.batch_execute("BEGIN"),
        db.query_one(&set_timeout, &timeout_params),
        db.query_one(&lock, &lock_params),
        client.batch_execute(RESET_LOCK_TIMEOUT),
        db.query_opt(&lookup, &lookup_params),
    );
    begin?;
    timeout_set?;
    match locked {
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => return Ok(None),
        locked => locked?,
    };
    reset?;
    let Some(row) = found? else {
        return Ok(Some(None));
    };
    Ok(Some(Some(InboxRecord {
        succeeded: row.try_get(0)?,
        attempts: row.try_get(1)?,
        last_error: row.try_get(2)?,
        live: row.try_get(3)?,
        payload_digest: row.try_get(4)?,
    })))
}

/// What the inbox writes about a message.
#[derive(Debug)]
pub(crate) struct InboxWrite<'a> {
    pub(crate) group: &'a str,
    pub(crate) message_id: &'a str,
    pub(crate) payload_digest: Option<&'a [u8]>,
    /// Sealed when `payload_key_id` is set.
    pub(crate) payload: Option<&'a [u8]>,
    pub(crate) payload_key_id: Option<i16>,
    pub(crate) retention: std::time::Duration,
}

/// Records success and commits with the consumer's work, pipelined in one round trip.
pub(crate) async fn inbox_commit(
    db: Db<'_>,
    write: &InboxWrite<'_>,
    attempts: i32,
) -> Result<(), tokio_postgres::Error> {
    let statement = db.prepare(&INBOX_RECORD_SUCCESS).await?;
    let retention = write.retention.as_secs_f64();
    let params: [&(dyn ToSql + Sync); 7] = [
        &write.group,
        &write.message_id,
        &attempts,
        &write.payload_digest,
        &write.payload,
        &write.payload_key_id,
        &retention,
    ];
    let (written, committed) = tokio::join!(
        biased;
        db.execute(&statement, &params),
        db.client().batch_execute("COMMIT"),
    );
    written?;
    committed
}

/// Records a failed attempt after the rollback, in a transaction of its own. Returns the
/// attempt count, or `None` if the message has meanwhile succeeded elsewhere.
pub(crate) async fn inbox_record_failure(
    db: Db<'_>,
    write: &InboxWrite<'_>,
    error: &str,
) -> Result<Option<i32>, tokio_postgres::Error> {
    let statement = db.prepare(&INBOX_RECORD_FAILURE).await?;
    let retention = write.retention.as_secs_f64();
    let params: [&(dyn ToSql + Sync); 7] = [
        &write.group,
        &write.message_id,
        &write.payload_digest,
        &write.payload,
        &write.payload_key_id,
        &error,
        &retention,
    ];
    let row = db.query_opt(&statement, &params).await?;
    row.map(|row| row.try_get(0)).transpose()
}

/// Encodes kept headers as length-prefixed (name, value) pairs.
pub(crate) fn encode_headers<'a>(
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let (name, value) = (name.as_str().as_bytes(), value.as_bytes());
        // Header lines this long never reach a handler; skip rather than truncate.
        let (Ok(name_len), Ok(value_len)) = (u16::try_from(name.len()), u32::try_from(value.len()))
        else {
            continue;
        };
        out.extend_from_slice(&name_len.to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&value_len.to_be_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// Decodes [`encode_headers`]' format; a damaged entry ends the list.
pub(crate) fn decode_headers(mut bytes: &[u8]) -> HeaderMap {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if bytes.len() < n {
            return None;
        }
        let (head, tail) = bytes.split_at(n);
        *bytes = tail;
        Some(head)
    }
    let mut headers = HeaderMap::new();
    while !bytes.is_empty() {
        let entry = (|| {
            let name_len = u16::from_be_bytes(take(&mut bytes, 2)?.try_into().ok()?);
            let name = HeaderName::from_bytes(take(&mut bytes, name_len.into())?).ok()?;
            let value_len = u32::from_be_bytes(take(&mut bytes, 4)?.try_into().ok()?);
            let value = HeaderValue::from_bytes(take(&mut bytes, value_len as usize)?).ok()?;
            Some((name, value))
        })();
        match entry {
            Some((name, value)) => {
                headers.append(name, value);
            }
            None => break,
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("link", HeaderValue::from_static("</a>; rel=a"));
        headers.append("link", HeaderValue::from_static("</b>; rel=b"));
        headers.insert("x-opaque", HeaderValue::from_bytes(b"\xe9t\xe9").unwrap());
        let decoded = decode_headers(&encode_headers(headers.iter()));
        assert_eq!(decoded, headers);
    }

    /// Every statement's declared parameter types are the ones PostgreSQL infers from its
    /// text, so running it unprepared with those types (`prepared_statements(false)`) means
    /// exactly what preparing it means. Needs the database named by `DATABASE_URL`.
    #[tokio::test]
    async fn sql_types_match_the_server() {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let schema = format!("axi_sql_types_{}", std::process::id());
        let mut config: tokio_postgres::Config = url.parse().unwrap();
        config.options(format!("-c search_path={schema}"));
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .await
            .unwrap();
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        let pool = Pool::builder(manager).max_size(1).build().unwrap();
        migrate(&pool).await.unwrap();
        pool.close();

        let ours: &[&Sql] = &[
            &CLAIM,
            &WAIT_LOCK,
            &SET_LOCK_TIMEOUT,
            &LOOKUP,
            &DELETE_REPLACEABLE,
            &INSERT,
            &LEASE_ACQUIRE,
            &LEASE_COMPLETE,
            &INBOX_LOOKUP,
            &INBOX_RECORD_SUCCESS,
            &INBOX_RECORD_FAILURE,
        ];
        let all = ours
            .iter()
            .chain(crate::sweeper::STATEMENTS)
            .chain(crate::admin::STATEMENTS);
        let mut checked = 0;
        for sql in all {
            let inferred = client.prepare(sql.text).await.unwrap();
            assert_eq!(inferred.params(), sql.types, "{}", sql.text);
            checked += 1;
        }
        assert_eq!(checked, 20);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }

    #[test]
    fn damaged_headers_decode_without_panicking() {
        let encoded = encode_headers(
            [(
                HeaderName::from_static("location"),
                HeaderValue::from_static("/orders/1"),
            )]
            .iter()
            .map(|(n, v)| (n, v)),
        );
        for cut in 0..encoded.len() {
            let _ = decode_headers(&encoded[..cut]);
        }
        assert_eq!(decode_headers(&[0xff; 7]).len(), 0);
    }
}
