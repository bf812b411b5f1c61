//! `migrate` on sqlx: the shared migration files, in one transaction.

use ::sqlx::{Executor, PgConnection, PgPool, Row};

use super::conn::statement;
use crate::engine::error::Error;
use crate::store::{migrations, sql};

/// Applies the migrations the pool's schema lacks. Unprepared throughout, like the
/// tokio-postgres driver's: safe behind a transaction-pooling PgBouncer.
pub(super) async fn run(pool: &PgPool) -> Result<(), Error> {
    let mut tx = pool.begin().await?;
    match apply(&mut tx).await {
        Ok(()) => Ok(tx.commit().await?),
        Err(error) => {
            // Roll back before answering, so the connection is back in its pool, without
            // the migration lock or any table lock, by the time the caller sees the error.
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "ROLLBACK failed; the pool closes the connection");
            }
            Err(error)
        }
    }
}

/// The migration lock and the pending migrations, in `tx`.
async fn apply(tx: &mut PgConnection) -> Result<(), Error> {
    statement(sql::MIGRATION_LOCK, false)
        .bind(migrations::MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    tx.execute(sql::CREATE_MIGRATIONS_TABLE).await?;
    let current: i32 = statement(sql::SCHEMA_VERSION, false)
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
    for migration in migrations::pending(migrations::POSTGRES, current)? {
        ::sqlx::raw_sql(migration.sql).execute(&mut *tx).await?;
        statement(sql::RECORD_MIGRATION, false)
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut *tx)
            .await?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied migration"
        );
    }
    Ok(())
}
