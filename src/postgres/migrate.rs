//! `migrate` on tokio-postgres: the shared migration files, in one transaction.

use tokio_postgres::types::Type;

use super::conn::TxConn;
use super::pool::PooledClient;
use crate::engine::error::Error;
use crate::store::{migrations, sql};

/// Applies the migrations `conn`'s schema lacks.
pub(super) async fn run(conn: Box<dyn PooledClient>) -> Result<(), Error> {
    // Safe behind a transaction-pooling PgBouncer, whatever the prepared-statement
    // setting: everything runs in one transaction (so on one server connection), and
    // only as simple queries and unnamed typed statements — nothing prepared survives
    // the transaction.
    let mut conn = TxConn::new(conn, false);
    match apply(conn.client()).await {
        Ok(()) => {
            conn.mark_ended();
            Ok(())
        }
        Err(error) => {
            // Roll back before answering, so the connection is back in its pool, without
            // the migration lock or any table lock, by the time the caller sees the error.
            conn.rollback().await;
            Err(error)
        }
    }
}

/// `BEGIN`, the migration lock, the pending migrations, `COMMIT`.
async fn apply(client: &tokio_postgres::Client) -> Result<(), Error> {
    client.batch_execute("BEGIN").await?;
    client
        .execute_typed(
            sql::MIGRATION_LOCK,
            &[(&migrations::MIGRATION_LOCK, Type::INT8)],
        )
        .await?;
    client.batch_execute(sql::CREATE_MIGRATIONS_TABLE).await?;
    let current: i32 = client
        .query_typed_one(sql::SCHEMA_VERSION, &[])
        .await?
        .get(0);
    for migration in migrations::pending(migrations::POSTGRES, current)? {
        client.batch_execute(migration.sql).await?;
        client
            .execute_typed(
                sql::RECORD_MIGRATION,
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
    client.batch_execute("COMMIT").await?;
    Ok(())
}
