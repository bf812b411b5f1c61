//! Lease mode written once for a dialect whose lease is one upsert that commits on its
//! own (PostgreSQL, on either client): the driver names the statement
//! ([`UpsertLease::LEASE_ACQUIRE`]) and gets [`LeaseStore`]. MySQL and SQLite take the
//! key's row lock or the write lock first, and implement [`LeaseStore`] themselves.

use std::time::Duration;

use super::queries::{Param, Queries};
use super::rows::Row;
use super::{LeaseStore, Store};
use crate::engine::error::Error;
use crate::engine::record::{LeaseClaim, NewRecord};

/// A store whose lease is one upsert: it inserts the PROCESSING record, or takes over one
/// whose holder's lease ran out (or that failed retryably), and returns the new fencing
/// token and whether it took over; no row when the key is not free.
#[doc(hidden)]
pub trait UpsertLease: Store {
    /// The upsert. Id, scope, raw key, fingerprint, lease, time to live.
    const LEASE_ACQUIRE: &'static <Self as Queries>::Statement;
}

impl<S: UpsertLease> LeaseStore for S {
    /// The upsert commits on its own; only when it did not take the key is the record
    /// read, to say why.
    async fn lease_acquire(
        &self,
        record: &NewRecord<'_>,
        lease: Duration,
    ) -> Result<LeaseClaim, Error> {
        let params = [
            Param::Id(record.id),
            Param::Text(record.scope),
            Param::OptText(record.raw_key),
            Param::Bytes(&record.fingerprint.0),
            Param::Duration(lease),
            Param::Duration(record.ttl),
        ];
        let acquired = self.query_opt(Self::LEASE_ACQUIRE, &params, acquired);
        if let Some(claim) = acquired.await? {
            return Ok(claim);
        }
        let found = self.lookup(record.id).await?;
        Ok(LeaseClaim::not_acquired(found, record.fingerprint))
    }
}

/// The upsert's row: the fencing token, and whether it took over a record (an upsert that
/// updated leaves its transaction in the row's `xmax`; a fresh insert leaves 0).
fn acquired<R: Row>(row: &R) -> Result<LeaseClaim, R::Error> {
    Ok(LeaseClaim::Acquired {
        token: row.i64(0)?,
        took_over: row.boolean(1)?,
    })
}
