//! The driver's view of a connection: the crate's statements, with their declared
//! parameter types, prepared and cached per connection or sent unprepared.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, Statement};

use super::pool::PooledClient;
use crate::store::sql;

/// One statement the crate runs, with the types of its parameters.
///
/// The types are declared rather than inferred, so that a statement can run without being
/// prepared first (see [`Db`]); `sql_types_match_the_server` checks them against what
/// PostgreSQL infers.
#[derive(Debug)]
pub struct Sql {
    pub(crate) text: &'static str,
    pub(crate) types: &'static [Type],
}

pub(crate) const TRY_LOCK: Sql = Sql {
    text: sql::TRY_LOCK,
    types: &[Type::INT8],
};
pub(crate) const WAIT_LOCK: Sql = Sql {
    text: sql::WAIT_LOCK,
    types: &[Type::INT8],
};
pub(crate) const SET_LOCK_TIMEOUT: Sql = Sql {
    text: sql::SET_LOCK_TIMEOUT,
    types: &[Type::TEXT],
};
pub(crate) const LOOKUP: Sql = Sql {
    text: sql::LOOKUP,
    types: &[Type::UUID],
};
pub(crate) const DELETE_REPLACEABLE: Sql = Sql {
    text: sql::DELETE_REPLACEABLE,
    types: &[Type::UUID],
};
pub(crate) const INSERT: Sql = Sql {
    text: sql::INSERT,
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
pub(crate) const EXISTS: Sql = Sql {
    text: sql::EXISTS,
    types: &[Type::UUID],
};
pub(crate) const INSERT_IF_LOCKED: Sql = Sql {
    text: sql::INSERT_IF_LOCKED,
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
        Type::INT8,
    ],
};
pub(crate) const LEASE_ACQUIRE: Sql = Sql {
    text: sql::LEASE_ACQUIRE,
    types: &[
        Type::UUID,
        Type::TEXT,
        Type::TEXT,
        Type::BYTEA,
        Type::FLOAT8,
        Type::FLOAT8,
    ],
};
pub(crate) const LEASE_COMPLETE: Sql = Sql {
    text: sql::LEASE_COMPLETE,
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
pub(crate) const INBOX_LOOKUP: Sql = Sql {
    text: sql::INBOX_LOOKUP,
    types: &[Type::TEXT, Type::TEXT],
};
pub(crate) const INBOX_RECORD_SUCCESS: Sql = Sql {
    text: sql::INBOX_RECORD_SUCCESS,
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
pub(crate) const INBOX_RECORD_FAILURE: Sql = Sql {
    text: sql::INBOX_RECORD_FAILURE,
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
pub(crate) const PURGE_RECORDS: Sql = Sql {
    text: sql::PURGE_RECORDS,
    types: &[Type::FLOAT8, Type::FLOAT8, Type::FLOAT8, Type::INT8],
};
pub(crate) const PURGE_RECORDS_ARCHIVING: Sql = Sql {
    text: sql::PURGE_RECORDS_ARCHIVING,
    types: &[
        Type::FLOAT8,
        Type::FLOAT8,
        Type::FLOAT8,
        Type::INT8,
        Type::BOOL,
    ],
};
pub(crate) const PURGE_ARCHIVE: Sql = Sql {
    text: sql::PURGE_ARCHIVE,
    types: &[Type::FLOAT8, Type::INT8],
};
pub(crate) const PURGE_MESSAGES: Sql = Sql {
    text: sql::PURGE_MESSAGES,
    types: &[Type::FLOAT8, Type::FLOAT8, Type::FLOAT8, Type::INT8],
};
pub(crate) const SCHEMA_TABLE: Sql = Sql {
    text: sql::SCHEMA_TABLE,
    types: &[],
};
pub(crate) const SCHEMA_VERSION: Sql = Sql {
    text: sql::SCHEMA_VERSION,
    types: &[],
};
pub(crate) const STALE_SUMMARY: Sql = Sql {
    text: sql::STALE_SUMMARY,
    types: &[],
};
pub(crate) const STALE_IDS: Sql = Sql {
    text: sql::STALE_IDS,
    types: &[Type::INT8],
};
pub(crate) const MARK_STALE_FAILED: Sql = Sql {
    text: sql::MARK_STALE_FAILED,
    types: &[Type::FLOAT8, Type::INT8],
};
pub(crate) const EXPORT_RECORDS: Sql = Sql {
    text: sql::EXPORT_RECORDS,
    types: &[
        Type::FLOAT8,
        Type::FLOAT8,
        Type::FLOAT8,
        Type::INT8,
        Type::BOOL,
    ],
};
pub(crate) const PURGE_EXPORTED: Sql = Sql {
    text: sql::PURGE_EXPORTED,
    types: &[Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::INT8_ARRAY],
};
pub(crate) const ADMIN_RECORD: Sql = Sql {
    text: sql::ADMIN_RECORD,
    types: &[Type::UUID],
};
pub(crate) const ADMIN_ARCHIVED: Sql = Sql {
    text: sql::ADMIN_ARCHIVED,
    types: &[Type::UUID],
};
pub(crate) const ADMIN_STALE: Sql = Sql {
    text: sql::ADMIN_STALE,
    types: &[Type::INT8],
};
pub(crate) const ADMIN_MESSAGE: Sql = Sql {
    text: sql::ADMIN_MESSAGE,
    types: &[Type::TEXT, Type::TEXT],
};
pub(crate) const ADMIN_FAILED_MESSAGES: Sql = Sql {
    text: sql::ADMIN_FAILED_MESSAGES,
    types: &[Type::TEXT, Type::INT8],
};

pub(crate) const PURGE_OUTBOX: Sql = Sql {
    text: sql::PURGE_OUTBOX,
    types: &[Type::FLOAT8, Type::FLOAT8, Type::FLOAT8, Type::INT8],
};
pub(crate) const OUTBOX_ENQUEUE: Sql = Sql {
    text: sql::OUTBOX_ENQUEUE,
    types: &[Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT, Type::BYTEA],
};
pub(crate) const OUTBOX_LOCK_BATCH: Sql = Sql {
    text: sql::OUTBOX_LOCK_BATCH,
    types: &[Type::INT8],
};
pub(crate) const OUTBOX_BARRIERS: Sql = Sql {
    text: sql::OUTBOX_BARRIERS,
    types: &[Type::TEXT_ARRAY, Type::INT8_ARRAY],
};
pub(crate) const OUTBOX_MARK_SENT: Sql = Sql {
    text: sql::OUTBOX_MARK_SENT,
    types: &[Type::INT8_ARRAY],
};
pub(crate) const OUTBOX_MARK_FAILED: Sql = Sql {
    text: sql::OUTBOX_MARK_FAILED,
    types: &[
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT4,
        Type::FLOAT8,
        Type::FLOAT8,
    ],
};
pub(crate) const OUTBOX_PENDING: Sql = Sql {
    text: sql::OUTBOX_PENDING,
    types: &[],
};
pub(crate) const ADMIN_OUTBOX: Sql = Sql {
    text: sql::ADMIN_OUTBOX,
    types: &[Type::TEXT, Type::INT8],
};
pub(crate) const ADMIN_REQUEUE_OUTBOX: Sql = Sql {
    text: sql::ADMIN_REQUEUE_OUTBOX,
    types: &[Type::TEXT],
};
pub(crate) const ADMIN_STALE_PAGE: Sql = Sql {
    text: sql::ADMIN_STALE_PAGE,
    types: &[Type::INT8, Type::UUID, Type::INT8],
};
pub(crate) const ADMIN_RECORD_RESPONSE: Sql = Sql {
    text: sql::ADMIN_RECORD_RESPONSE,
    types: &[Type::UUID],
};
pub(crate) const ADMIN_RELEASE_LEASE: Sql = Sql {
    text: sql::ADMIN_RELEASE_LEASE,
    types: &[Type::UUID, Type::INT8],
};
pub(crate) const ADMIN_DELETE_RECORD: Sql = Sql {
    text: sql::ADMIN_DELETE_RECORD,
    types: &[Type::UUID, Type::INT8],
};
pub(crate) const ADMIN_RECORD_COUNTS: Sql = Sql {
    text: sql::ADMIN_RECORD_COUNTS,
    types: &[],
};
pub(crate) const ADMIN_FAILED_PAGE: Sql = Sql {
    text: sql::ADMIN_FAILED_PAGE,
    types: &[Type::TEXT, Type::INT8, Type::TEXT, Type::INT8],
};
pub(crate) const ADMIN_FAILED_GROUPS: Sql = Sql {
    text: sql::ADMIN_FAILED_GROUPS,
    types: &[Type::INT4, Type::INT8],
};
pub(crate) const ADMIN_RESET_INBOX: Sql = Sql {
    text: sql::ADMIN_RESET_INBOX,
    types: &[Type::TEXT, Type::TEXT],
};
pub(crate) const ADMIN_OUTBOX_PENDING_PAGE: Sql = Sql {
    text: sql::ADMIN_OUTBOX_PENDING_PAGE,
    types: &[Type::INT8, Type::INT8],
};
pub(crate) const ADMIN_OUTBOX_PARKED_PAGE: Sql = Sql {
    text: sql::ADMIN_OUTBOX_PARKED_PAGE,
    types: &[Type::INT8, Type::INT8],
};
pub(crate) const OUTBOX_PARKED: Sql = Sql {
    text: sql::OUTBOX_PARKED,
    types: &[],
};

/// Every statement above, for the check of their declared parameter types.
#[cfg(test)]
pub(crate) const STATEMENTS: &[&Sql] = &[
    &TRY_LOCK,
    &WAIT_LOCK,
    &SET_LOCK_TIMEOUT,
    &LOOKUP,
    &DELETE_REPLACEABLE,
    &INSERT,
    &INSERT_IF_LOCKED,
    &EXISTS,
    &LEASE_ACQUIRE,
    &LEASE_COMPLETE,
    &INBOX_LOOKUP,
    &INBOX_RECORD_SUCCESS,
    &INBOX_RECORD_FAILURE,
    &PURGE_RECORDS,
    &PURGE_RECORDS_ARCHIVING,
    &PURGE_ARCHIVE,
    &PURGE_MESSAGES,
    &SCHEMA_TABLE,
    &SCHEMA_VERSION,
    &STALE_SUMMARY,
    &STALE_IDS,
    &MARK_STALE_FAILED,
    &EXPORT_RECORDS,
    &PURGE_EXPORTED,
    &ADMIN_RECORD,
    &ADMIN_ARCHIVED,
    &ADMIN_STALE,
    &ADMIN_MESSAGE,
    &ADMIN_FAILED_MESSAGES,
    &PURGE_OUTBOX,
    &OUTBOX_ENQUEUE,
    &OUTBOX_LOCK_BATCH,
    &OUTBOX_BARRIERS,
    &OUTBOX_MARK_SENT,
    &OUTBOX_MARK_FAILED,
    &OUTBOX_PENDING,
    &ADMIN_OUTBOX,
    &ADMIN_REQUEUE_OUTBOX,
    &ADMIN_STALE_PAGE,
    &ADMIN_RECORD_RESPONSE,
    &ADMIN_RELEASE_LEASE,
    &ADMIN_DELETE_RECORD,
    &ADMIN_RECORD_COUNTS,
    &ADMIN_FAILED_PAGE,
    &ADMIN_FAILED_GROUPS,
    &ADMIN_RESET_INBOX,
    &ADMIN_OUTBOX_PENDING_PAGE,
    &ADMIN_OUTBOX_PARKED_PAGE,
    &OUTBOX_PARKED,
];

/// A statement ready to run on one connection: prepared and cached, or to be sent as an
/// unnamed statement with its declared parameter types.
#[derive(Debug)]
pub(crate) enum Stmt {
    Prepared(Statement),
    Typed(&'static Sql),
}

/// A connection as the crate's statements use it: with named prepared statements, cached
/// per pooled connection (the default, where the pool keeps a cache), or without any
/// (`prepared_statements(false)`, or a pool without a statement cache).
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
    conn: &'a dyn PooledClient,
    prepared: bool,
}

impl<'a> Db<'a> {
    pub(crate) fn new(conn: &'a dyn PooledClient, prepared: bool) -> Self {
        Self { conn, prepared }
    }

    /// The underlying connection, for `batch_execute` (simple-protocol BEGIN, COMMIT, ...).
    pub(crate) fn client(self) -> &'a Client {
        self.conn.client()
    }

    /// Prepares `sql` (once per pooled connection) when prepared statements are on and the
    /// pool caches them; otherwise costs nothing. Call it before a pipelined `join!`, never
    /// inside one.
    pub(crate) async fn prepare(self, sql: &'static Sql) -> Result<Stmt, tokio_postgres::Error> {
        if self.prepared {
            if let Some(prepare) = self.conn.prepare_cached(sql.text, sql.types) {
                return Ok(Stmt::Prepared(prepare.await?));
            }
        }
        Ok(Stmt::Typed(sql))
    }

    pub(crate) async fn query(
        self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match statement {
            Stmt::Prepared(statement) => self.client().query(statement, params).await,
            Stmt::Typed(sql) => {
                self.client()
                    .query_typed(sql.text, &typed(sql, params))
                    .await
            }
        }
    }

    pub(crate) async fn query_one(
        self,
        statement: &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        match statement {
            Stmt::Prepared(statement) => self.client().query_one(statement, params).await,
            Stmt::Typed(sql) => {
                self.client()
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
            Stmt::Prepared(statement) => self.client().query_opt(statement, params).await,
            Stmt::Typed(sql) => {
                self.client()
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
            Stmt::Prepared(statement) => self.client().execute(statement, params).await,
            Stmt::Typed(sql) => {
                self.client()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement's declared parameter types are the ones PostgreSQL infers from its
    /// text, so running it unprepared with those types (`prepared_statements(false)`) means
    /// exactly what preparing it means. Needs the database named by `DATABASE_URL`.
    #[cfg(feature = "deadpool")]
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
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(1)
            .build()
            .unwrap();
        crate::store::migrate(&pool).await.unwrap();
        pool.close();

        let mut checked = 0;
        for sql in STATEMENTS {
            let inferred = client.prepare(sql.text).await.unwrap();
            assert_eq!(inferred.params(), sql.types, "{}", sql.text);
            checked += 1;
        }
        assert_eq!(checked, 49);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
}
