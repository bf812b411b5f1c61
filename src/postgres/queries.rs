//! The query seam on tokio-postgres: [`Queries`](crate::store::queries::Queries) on the
//! pool, [`TxQueries`](crate::store::queries::TxQueries) on the crate's transaction, and
//! the seam's parameters as tokio-postgres binds them.

use bytes::BytesMut;
use tokio_postgres::Row;
use tokio_postgres::types::{IsNull, ToSql, Type};

use super::PgStore;
use super::conn::TxConn;
use super::statement::{self, Db, Sql};
use crate::engine::error::Error;
use crate::store::sql;

/// Lease mode: the upsert, prepared like the seam's statements.
impl crate::store::UpsertLease for PgStore {
    const LEASE_ACQUIRE: &'static Sql = &statement::LEASE_ACQUIRE;
}

/// The seam's statements, prepared once per connection, run on a pooled client.
impl crate::store::queries::Queries for PgStore {
    type Statement = Sql;
    type Row = Row;

    const STATEMENTS: crate::store::queries::Statements<Sql> =
        crate::store::queries::statements!(&statement::);

    async fn query_rows<T: Send>(
        &self,
        statement: &'static Sql,
        params: &[crate::store::queries::Param<'_>],
        map: fn(&Row) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Vec<T>, Error> {
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        self.rows(statement, &params, map).await
    }

    async fn query_affected(
        &self,
        statement: &'static Sql,
        params: &[crate::store::queries::Param<'_>],
    ) -> Result<u64, Error> {
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        self.execute(statement, &params).await
    }
}

/// The seam on the crate's transaction: each statement prepared (or not) as the store says.
impl crate::store::queries::TxQueries for TxConn {
    type Statement = Sql;
    type Row = Row;

    async fn tx_rows<T: Send>(
        &mut self,
        statement: &'static Sql,
        params: &[crate::store::queries::Param<'_>],
        map: fn(&Row) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Vec<T>, Error> {
        let db = Db::new(self.pooled(), self.prepared());
        let statement = db.prepare(statement).await?;
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = db.query(&statement, &params).await?;
        Ok(rows.iter().map(map).collect::<Result<_, _>>()?)
    }

    async fn tx_affected(
        &mut self,
        statement: &'static Sql,
        params: &[crate::store::queries::Param<'_>],
    ) -> Result<u64, Error> {
        let db = Db::new(self.pooled(), self.prepared());
        let statement = db.prepare(statement).await?;
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as _).collect();
        Ok(db.execute(&statement, &params).await?)
    }

    async fn tx_rollback_work(&mut self) -> Result<(), Error> {
        Ok(self
            .client()
            .batch_execute(sql::INBOX_ROLLBACK_WORK)
            .await?)
    }

    /// A plain transaction whose handler sent no statement never began: nothing to
    /// commit. One whose first statement's pipeline was dropped midway may have begun, so
    /// it commits rather than go back to the pool inside a transaction.
    async fn tx_commit(&mut self) -> Result<(), Error> {
        if self.in_transaction() {
            self.client().batch_execute("COMMIT").await?;
        }
        self.mark_ended();
        Ok(())
    }
}

/// A seam parameter as tokio-postgres binds it: as the value it carries (type-checked
/// against the statement's parameter), a duration as seconds in a `float8`.
impl ToSql for crate::store::queries::Param<'_> {
    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use crate::store::queries::Param;
        let seconds;
        let value: &(dyn ToSql + Sync) = match self {
            Param::Id(id) => id,
            Param::Text(text) => text,
            Param::OptText(text) => text,
            Param::Bool(value) => value,
            Param::I16(value) => value,
            Param::OptI16(value) => value,
            Param::I32(value) => value,
            Param::I64(value) => value,
            Param::Bytes(bytes) => bytes,
            Param::OptBytes(bytes) => bytes,
            Param::Duration(duration) => {
                seconds = duration.as_secs_f64();
                &seconds
            }
        };
        value.to_sql_checked(ty, out)
    }

    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.to_sql_checked(ty, out)
    }

    /// Each variant checks its own type, in `to_sql_checked`.
    fn accepts(_: &Type) -> bool {
        true
    }
}
