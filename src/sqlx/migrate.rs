//! `migrate` on sqlx: the shared migration files, in one transaction.

use ::sqlx::{PgConnection, PgPool, Postgres};

use super::conn::statement;
use crate::engine::error::Error;
use crate::store::sqlx_tx::{MigrationTable, apply_migrations};
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
    let table = MigrationTable {
        create: sql::CREATE_MIGRATIONS_TABLE,
        version: sql::SCHEMA_VERSION,
        record: sql::RECORD_MIGRATION,
    };
    apply_migrations::<Postgres>(tx, &table, migrations::POSTGRES).await?;
    Ok(())
}
