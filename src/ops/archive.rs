//! Archive sinks: where the [`Sweeper`](crate::Sweeper) sends the records it purges when
//! they should go somewhere other than the built-in `idempotency_records_archive` table —
//! a file of JSON lines, object storage, a log pipeline.
//!
//! A sink batch runs in three steps, none of which holds a lock or a transaction across
//! the sink: the batch's expired records are read; the sink writes them; the records are
//! deleted, each only if it is still the one that was written (same record id, creation
//! and update time). So nothing is deleted before the sink holds it, a sink that fails
//! deletes nothing (the error is counted, logged and the batch retried on the next run),
//! and a record that changed in between (its key used again) stays. Delivery is
//! at least once: a crash between the write and the delete, or two sweepers reading the
//! same batch, send a record again — with the same [`ArchivedRow::archive_id`], so the
//! sink can drop the repeat.

use std::future::Future;
use std::pin::Pin;

use crate::engine::archive::{ArchivedRow, BoxError};

/// Somewhere the [`Sweeper`](crate::Sweeper) writes records before it purges them (see
/// [`Sweeper::archive_to`](crate::Sweeper::archive_to)).
///
/// `write` returns once the rows are durable where the sink keeps them; an error leaves
/// every row of the batch in the table, to be sent again on the next run. Rows may arrive
/// more than once: drop repeats by [`ArchivedRow::archive_id`].
///
/// # Example
///
/// ```
/// use std::sync::Mutex;
///
/// use axum_idempotency::{ArchiveSink, ArchivedRow, BoxError};
///
/// /// Keeps the ids it was given (a real sink writes somewhere durable).
/// #[derive(Default)]
/// struct Ids(Mutex<Vec<String>>);
///
/// impl ArchiveSink for Ids {
///     async fn write(&self, rows: &[ArchivedRow]) -> Result<(), BoxError> {
///         let mut ids = self.0.lock().unwrap();
///         ids.extend(rows.iter().map(|row| row.archive_id.clone()));
///         Ok(())
///     }
/// }
/// ```
pub trait ArchiveSink: Send + Sync + 'static {
    /// Writes one batch.
    fn write(&self, rows: &[ArchivedRow]) -> impl Future<Output = Result<(), BoxError>> + Send;
}

type WriteFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>>;

/// [`ArchiveSink`] as a trait object.
pub(crate) trait DynSink: Send + Sync {
    fn write_dyn<'a>(&'a self, rows: &'a [ArchivedRow]) -> WriteFuture<'a>;
}

impl<S: ArchiveSink> DynSink for S {
    fn write_dyn<'a>(&'a self, rows: &'a [ArchivedRow]) -> WriteFuture<'a> {
        Box::pin(self.write(rows))
    }
}

impl std::fmt::Debug for dyn DynSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArchiveSink")
    }
}
