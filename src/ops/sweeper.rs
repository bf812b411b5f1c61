//! The sweeper: purges expired records and watches for leases that outlived their holder.
//!
//! Records are kept past their `expires_at` only as long as the retention for their state
//! says — successes briefly, failures longer, for troubleshooting — and then deleted in
//! bounded batches. Each batch is one autocommit statement that locks its rows with
//! `FOR UPDATE SKIP LOCKED`, so a batch never waits for a row a live request holds, and
//! several instances sweeping at once split the work instead of repeating or deadlocking
//! on it. Between two batches the sweeper pauses at least as long as the batch took, so a
//! large backlog is purged at no more than half of one connection's time.
//!
//! After purging, the sweeper reports PROCESSING records whose lease has lapsed — a holder
//! that crashed, or one that is far slower than its lease — and can mark them FAILED and
//! retryable, so the next retry of the key runs again instead of waiting for the lease
//! takeover.
//!
//! The metrics it emits are listed on [`Sweeper`].
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum_idempotency::Sweeper;
//!
//! # async fn run(pool: deadpool_postgres::Pool) {
//! let sweeper = Sweeper::new(pool)
//!     .interval(Duration::from_secs(300))
//!     .failure_retention(Duration::from_secs(14 * 24 * 3600))
//!     .mark_stale_failed_after(Duration::from_secs(600))
//!     .spawn();
//!
//! // ... serve until told to stop ...
//!
//! sweeper.shutdown().await;
//! # }
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::engine::error::Error;
use crate::engine::key::hex;
use crate::engine::record::{Archive, RetentionParams, SweepBatch};
use crate::engine::telemetry;
use crate::ops::archive::{ArchiveSink, DynSink};
use crate::store::{IntoStore, MaintenanceStore, Store};

/// The shortest pause between two batches. The pause is at least as long as the batch
/// took, so a long purge spends at most half of its time deleting and leaves room for live
/// traffic whatever the batch size and the machine.
const MIN_BATCH_PAUSE: Duration = Duration::from_millis(5);
/// Record ids named in the stale-lease warning.
const STALE_IDS_LOGGED: i64 = 10;

/// Purges expired idempotency and inbox records and reports stale leases, once or on a
/// timer.
///
/// Cloning is cheap (one `Arc`). Several application instances can run a sweeper against
/// the same database at once: batches lock with `SKIP LOCKED`, so they split the rows
/// between them and never wait for each other or for live requests.
///
/// Defaults: every 60 s, 1000 rows a batch, SUCCESS records deleted as soon as they
/// expire, FAILED records kept 7 days past expiry, stale PROCESSING records reported but
/// not changed.
///
/// # Metrics
///
/// Emitted through the `metrics` facade on every run:
///
/// | name | kind | labels | meaning |
/// | --- | --- | --- | --- |
/// | `idempotency_purged_total` | counter | `table` = `idempotency_records`, `inbox_messages`, `idempotency_outbox` or `idempotency_records_archive` | rows deleted |
/// | `idempotency_archived_total` | counter | | records written to the archive (table or sink) before they were purged ([`archive`](Sweeper::archive), [`archive_to`](Sweeper::archive_to)) |
/// | `idempotency_archive_errors_total` | counter | `archive` = `table` or `sink` | runs whose archiving failed: nothing of the failed batch was purged |
/// | `idempotency_archive_lag_seconds` | gauge | | how long ago the archive last caught up (0 after a run that archived every record due; grows while runs fail) |
/// | `idempotency_stale_processing` | gauge | | PROCESSING records past their lease |
/// | `idempotency_stale_processing_oldest_seconds` | gauge | | how long ago the oldest of them lost its lease (0 when none) |
/// | `idempotency_stale_marked_failed_total` | counter | | stale records marked FAILED and retryable |
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
///
/// use axum_idempotency::Sweeper;
///
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::Error> {
/// // Defaults, one run now:
/// let report = Sweeper::new(pool.clone()).run_once().await?;
/// println!("purged {} records", report.purged_records);
///
/// // Customised, in the background:
/// let handle = Sweeper::new(pool)
///     .interval(Duration::from_secs(30))
///     .batch_size(500)
///     .success_grace(Duration::from_secs(3600))
///     .failure_retention(Duration::from_secs(30 * 24 * 3600))
///     .mark_stale_failed_after(Duration::from_secs(300))
///     .spawn();
///
/// // ... serve until told to stop ...
///
/// handle.shutdown().await;
/// # Ok(()) }
/// ```
pub struct Sweeper<D: Store> {
    config: Arc<SweeperConfig<D>>,
}

impl<D: Store> Clone for Sweeper<D> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
        }
    }
}

impl<D: Store + std::fmt::Debug> std::fmt::Debug for Sweeper<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("config", &self.config)
            .finish()
    }
}

#[derive(Clone, Debug)]
struct SweeperConfig<D> {
    store: D,
    interval: Duration,
    batch_size: u32,
    success_grace: Duration,
    failure_retention: Duration,
    outbox_sent_retention: Duration,
    outbox_failed_retention: Duration,
    mark_stale_failed_after: Option<Duration>,
    archive: Option<Archive>,
    /// Where archived records go: the built-in table when `None`.
    sink: Option<Arc<dyn DynSink>>,
    archive_retention: Option<Duration>,
    /// When the archive last caught up (wrote every record due), for the lag gauge.
    caught_up: Arc<Mutex<Instant>>,
}

/// What one [`Sweeper::run_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Rows deleted from `idempotency_records`.
    pub purged_records: u64,
    /// Rows deleted from `inbox_messages`.
    pub purged_messages: u64,
    /// Settled rows deleted from `idempotency_outbox`.
    pub purged_outbox: u64,
    /// Of `purged_records`, those written to `idempotency_records_archive` first (all of
    /// them with [`Sweeper::archive`], none without).
    pub archived_records: u64,
    /// Rows deleted from `idempotency_records_archive` past
    /// [`archive_retention`](Sweeper::archive_retention).
    pub purged_archive: u64,
    /// PROCESSING records past their lease, counted before any was marked FAILED.
    pub stale_processing: u64,
    /// How long ago the oldest of them lost its lease.
    pub oldest_stale: Option<Duration>,
    /// Stale records this run marked FAILED and retryable.
    pub marked_failed: u64,
}

impl<D: MaintenanceStore> Sweeper<D> {
    /// A sweeper over the crate's tables in `pool`'s database (any pool the crate supports,
    /// see [`IntoStore`]), with the defaults above.
    pub fn new<P: IntoStore<Store = D>>(pool: P) -> Self {
        Self {
            config: Arc::new(SweeperConfig {
                store: pool.into_store(),
                interval: Duration::from_secs(60),
                batch_size: 1000,
                success_grace: Duration::ZERO,
                failure_retention: Duration::from_secs(7 * 24 * 3600),
                outbox_sent_retention: Duration::from_secs(24 * 3600),
                outbox_failed_retention: Duration::from_secs(30 * 24 * 3600),
                mark_stale_failed_after: None,
                archive: None,
                sink: None,
                archive_retention: None,
                caught_up: Arc::new(Mutex::new(Instant::now())),
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut SweeperConfig<D>)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Archives every record before purging it: the batch writes its records to
    /// `idempotency_records_archive` (created by [`migrate`](crate::migrate), schema
    /// version 2) and deletes them from `idempotency_records` in one transaction, so a
    /// record is never gone from both, and a batch repeated after a crash adds no second
    /// copy (the archive's key is the record's id and creation time). A key used again
    /// after its record was purged runs as new, and its second record is archived beside
    /// the first. `what` says whether the stored response is kept ([`Archive::Records`]) or
    /// left out ([`Archive::Metadata`]). Default: no archive, purged records are deleted.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use axum_idempotency::{Archive, Sweeper};
    ///
    /// # async fn run(pool: deadpool_postgres::Pool) {
    /// let sweeper = Sweeper::new(pool)
    ///     .archive(Archive::Metadata)
    ///     .archive_retention(Duration::from_secs(365 * 24 * 3600))
    ///     .spawn();
    /// # }
    /// ```
    #[must_use]
    pub fn archive(self, what: Archive) -> Self {
        self.with(|c| {
            c.archive = Some(what);
            c.sink = None;
        })
    }

    /// Archives every record into `sink` before purging it, instead of the built-in table:
    /// a batch of expired records is read, written to the sink, and then deleted — each
    /// record only if it is still the one the sink was given, so nothing is deleted that
    /// the sink does not hold, and a key used again in between keeps its new record. A
    /// sink that fails deletes nothing: the run ends with [`Error::Archive`] (the other
    /// tables are still swept), the error is counted and the batch is sent again on the
    /// next run. Delivery is at least once (a crash between the write and the delete, two
    /// sweepers on one batch); each row's [`archive_id`](crate::ArchivedRow::archive_id) is
    /// stable, so the sink can drop repeats. No lock or transaction is held while the sink
    /// writes; a sink should bound its own writes, since the sweeper waits for them.
    ///
    /// `what` says whether the sink receives the stored response ([`Archive::Records`]; a
    /// body encrypted at rest stays sealed) or metadata only ([`Archive::Metadata`]).
    /// [`archive_retention`](Self::archive_retention) applies to the built-in table only.
    ///
    /// ```no_run
    /// use axum_idempotency::{Archive, ArchiveSink, ArchivedRow, BoxError, Sweeper};
    ///
    /// struct Log;
    ///
    /// impl ArchiveSink for Log {
    ///     async fn write(&self, rows: &[ArchivedRow]) -> Result<(), BoxError> {
    ///         for row in rows {
    ///             println!("{} {} {}", row.archive_id, row.record.state, row.record.status);
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// # async fn run(pool: deadpool_postgres::Pool) {
    /// let sweeper = Sweeper::new(pool).archive_to(Log, Archive::Metadata).spawn();
    /// # }
    /// ```
    #[must_use]
    pub fn archive_to(self, sink: impl ArchiveSink, what: Archive) -> Self {
        let sink: Arc<dyn DynSink> = Arc::new(sink);
        self.with(|c| {
            c.archive = Some(what);
            c.sink = Some(sink);
        })
    }

    /// Deletes archived records once they were archived this long ago. Default: archived
    /// records are kept.
    #[must_use]
    pub fn archive_retention(self, retention: Duration) -> Self {
        self.with(|c| c.archive_retention = Some(retention))
    }

    /// Time between two runs of a [`spawn`](Self::spawn)ed sweeper; the first run starts at
    /// once. A run that overruns delays the next one rather than stacking.
    ///
    /// Default: 60 s. A zero interval is raised to 1 ms.
    #[must_use]
    pub fn interval(self, interval: Duration) -> Self {
        self.with(|c| c.interval = interval.max(Duration::from_millis(1)))
    }

    /// Rows deleted (or marked) by one statement. Smaller batches hold their row locks and
    /// write their WAL in smaller pieces; larger ones spend fewer round trips. Either way
    /// the pause after a batch is at least as long as the batch took.
    ///
    /// Default: 1000. Zero is raised to 1.
    #[must_use]
    pub fn batch_size(self, rows: u32) -> Self {
        self.with(|c| c.batch_size = rows.max(1))
    }

    /// How long a SUCCESS record (HTTP or inbox) is kept past its `expires_at`. An expired
    /// record is already ignored by lookups, so this is for inspection only.
    ///
    /// Default: zero — deleted as soon as it expires.
    #[must_use]
    pub fn success_grace(self, grace: Duration) -> Self {
        self.with(|c| c.success_grace = grace)
    }

    /// How long a FAILED record (HTTP or inbox), or an abandoned PROCESSING one, is kept past
    /// its `expires_at`, so failures can still be looked into after the key could be reused.
    ///
    /// Default: 7 days.
    #[must_use]
    pub fn failure_retention(self, retention: Duration) -> Self {
        self.with(|c| c.failure_retention = retention)
    }

    /// How long an outbox message is kept after the broker confirmed it (pending messages
    /// are never purged). Default: 1 day.
    #[must_use]
    pub fn outbox_sent_retention(self, retention: Duration) -> Self {
        self.with(|c| c.outbox_sent_retention = retention)
    }

    /// How long an outbox message parked as FAILED is kept after it was enqueued, to be
    /// looked into and requeued. Default: 30 days.
    #[must_use]
    pub fn outbox_failed_retention(self, retention: Duration) -> Self {
        self.with(|c| c.outbox_failed_retention = retention)
    }

    /// Marks PROCESSING records whose lease ended more than `after` ago FAILED and
    /// retryable. The next retry of such a key runs the handler again, and the lost holder,
    /// should it come back, has its fenced completion refused.
    ///
    /// Default: off — stale records are reported (log and metrics), never changed.
    #[must_use]
    pub fn mark_stale_failed_after(self, after: Duration) -> Self {
        self.with(|c| c.mark_stale_failed_after = Some(after))
    }

    /// Whether the sweeper's statements are prepared (once per pooled connection, then
    /// reused) or sent unprepared with their parameter types, one round trip each.
    ///
    /// Default: `true`. Turn it off behind a PgBouncer in transaction pooling mode that
    /// does not support prepared statements (before 1.21, or `max_prepared_statements`
    /// unset): there every batch may run on another server connection, where a statement
    /// prepared earlier does not exist.
    #[must_use]
    pub fn prepared_statements(self, enabled: bool) -> Self {
        self.with(|c| c.store.set_prepared_statements(enabled))
    }

    /// Runs one sweep: purges expired records of both tables and settled outbox messages batch by batch, reports the
    /// PROCESSING records past their lease (metrics, and a warning naming up to ten record
    /// ids, never keys), then marks them failed if configured.
    ///
    /// Every batch is its own autocommit statement, so an error or a cancelled future
    /// leaves no batch half done; the next run continues where this one stopped.
    pub async fn run_once(&self) -> Result<SweepReport, Error> {
        let config = &*self.config;
        let limit = i64::from(config.batch_size);
        let retention = RetentionParams {
            success_grace: config.success_grace,
            failure_retention: config.failure_retention,
            limit,
            archive: None,
        };

        let records = RetentionParams {
            archive: config.archive,
            ..retention
        };
        // A failed record purge (a failing sink, above all) does not keep the other tables
        // from being swept; the run reports it at the end.
        let mut failed = None;
        let purged_records = match &config.sink {
            Some(sink) => self.export_batches(&**sink, records).await,
            None => self.batches(SweepBatch::PurgeRecords(records)).await,
        };
        let purged_records = self
            .archive_outcome(purged_records)
            .unwrap_or_else(|error| {
                failed = Some(error);
                0
            });
        telemetry::purged("idempotency_records", purged_records);
        let archived_records = if config.archive.is_some() {
            telemetry::archived(purged_records);
            purged_records
        } else {
            0
        };
        let purged_archive = match config.archive_retention {
            Some(older_than) => {
                let purged = self
                    .batches(SweepBatch::PurgeArchive { older_than, limit })
                    .await?;
                telemetry::purged("idempotency_records_archive", purged);
                purged
            }
            None => 0,
        };
        let purged_messages = self.batches(SweepBatch::PurgeMessages(retention)).await?;
        telemetry::purged("inbox_messages", purged_messages);
        let outbox = RetentionParams {
            success_grace: config.outbox_sent_retention,
            failure_retention: config.outbox_failed_retention,
            limit,
            archive: None,
        };
        let purged_outbox = self.batches(SweepBatch::PurgeOutbox(outbox)).await?;
        telemetry::purged("idempotency_outbox", purged_outbox);

        let (stale_processing, oldest_stale) = self.report_stale().await?;

        let marked_failed = match config.mark_stale_failed_after {
            Some(after) if stale_processing > 0 => {
                let marked = self
                    .batches(SweepBatch::MarkStaleFailed { after, limit })
                    .await?;
                telemetry::stale_marked_failed(marked);
                if marked > 0 {
                    tracing::info!(marked, "marked stale PROCESSING records FAILED (retryable)");
                }
                marked
            }
            _ => 0,
        };

        if let Some(error) = failed {
            return Err(error);
        }
        let report = SweepReport {
            purged_records,
            purged_messages,
            purged_outbox,
            archived_records,
            purged_archive,
            stale_processing,
            oldest_stale,
            marked_failed,
        };
        tracing::debug!(?report, "sweep finished");
        telemetry::sweeper_ran();
        Ok(report)
    }

    /// Counts a failed archive and sets the lag gauge (when archiving).
    fn archive_outcome(&self, purged: Result<u64, Error>) -> Result<u64, Error> {
        let config = &*self.config;
        if config.archive.is_none() {
            return purged;
        }
        let mut caught_up = config.caught_up.lock().unwrap_or_else(|e| e.into_inner());
        match &purged {
            Ok(_) => *caught_up = Instant::now(),
            Err(error) => {
                let into = if config.sink.is_some() {
                    "sink"
                } else {
                    "table"
                };
                telemetry::archive_failed(into);
                tracing::warn!(
                    error = error as &dyn std::error::Error,
                    archive = into,
                    behind_seconds = caught_up.elapsed().as_secs(),
                    "archiving expired idempotency records failed; nothing of the batch was \
                     purged, it is retried on the next run"
                );
            }
        }
        telemetry::archive_lag(match purged {
            Ok(_) => Duration::ZERO,
            Err(_) => caught_up.elapsed(),
        });
        purged
    }

    /// Sink batches: read a batch, write it to the sink, delete what is still as written;
    /// until a batch is short, or none of it could be deleted (rows live requests hold, or
    /// changed since: sent again next run).
    async fn export_batches(
        &self,
        sink: &dyn DynSink,
        records: RetentionParams,
    ) -> Result<u64, Error> {
        let store = &self.config.store;
        let batch_size = usize::try_from(self.config.batch_size).unwrap_or(usize::MAX);
        let mut total = 0;
        loop {
            let started = tokio::time::Instant::now();
            let rows = store.export_batch(records).await?;
            if rows.is_empty() {
                return Ok(total);
            }
            sink.write_dyn(&rows).await.map_err(Error::Archive)?;
            let stamps: Vec<_> = rows.iter().map(|row| row.stamp).collect();
            let purged = store.purge_exported(&stamps).await?;
            total += purged;
            if rows.len() < batch_size || purged == 0 {
                return Ok(total);
            }
            tokio::time::sleep(started.elapsed().max(MIN_BATCH_PAUSE)).await;
        }
    }

    /// Runs a batched statement until a batch affects fewer rows than the batch size.
    async fn batches(&self, batch: SweepBatch) -> Result<u64, Error> {
        let batch_size = u64::from(self.config.batch_size);
        let mut total = 0;
        loop {
            // A connection per batch: none is held back from the pool during the pause.
            let started = tokio::time::Instant::now();
            let affected = self.config.store.sweep_batch(batch).await?;
            let took = started.elapsed();
            total += affected;
            if affected < batch_size {
                return Ok(total);
            }
            tokio::time::sleep(took.max(MIN_BATCH_PAUSE)).await;
        }
    }

    /// Counts PROCESSING records past their lease, sets the gauges and logs the stalest ids.
    async fn report_stale(&self) -> Result<(u64, Option<Duration>), Error> {
        let summary = self.config.store.stale_summary().await?;
        let (count, oldest) = (summary.count, summary.oldest_seconds);
        let count = u64::try_from(count).unwrap_or(0);
        let oldest = oldest.map(|secs| Duration::try_from_secs_f64(secs).unwrap_or_default());
        telemetry::stale_processing(count, oldest);
        if count > 0 {
            let ids = self.config.store.stale_ids(STALE_IDS_LOGGED).await?;
            let ids = ids
                .iter()
                // The same short form as the record id in the layer's spans.
                .map(|id| hex(&id[..id.len().min(8)]))
                .collect::<Vec<_>>();
            tracing::warn!(
                count,
                oldest_seconds = oldest.map_or(0, |age| age.as_secs()),
                records = %ids.join(","),
                "PROCESSING idempotency records past their lease: \
                 their holders crashed or are far slower than the lease"
            );
        }
        Ok((count, oldest))
    }

    /// Runs [`run_once`](Self::run_once) now and then every [`interval`](Self::interval) on
    /// a tokio task, until [`SweeperHandle::shutdown`]. A failed run is logged and the next
    /// one goes ahead on schedule.
    ///
    /// Must be called within a tokio runtime. Dropping the handle detaches the task; it then
    /// runs until the runtime shuts down.
    #[must_use = "dropping the handle leaves the sweeper running with no way to stop it"]
    pub fn spawn(self) -> SweeperHandle {
        let token = CancellationToken::new();
        let stop = token.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(self.config.interval);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                // A run cut short by shutdown stops between (or inside) single autocommit
                // statements: nothing is left half done.
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    result = self.run_once() => {
                        if let Err(error) = result {
                            tracing::error!(
                                error = &error as &dyn std::error::Error,
                                "idempotency sweep failed"
                            );
                        }
                    }
                }
            }
        });
        SweeperHandle { token, task }
    }
}

/// Controls a [`Sweeper::spawn`]ed task.
#[derive(Debug)]
pub struct SweeperHandle {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl SweeperHandle {
    /// Stops the sweeper and waits for its task to end. A run in progress is abandoned
    /// between statements; every finished batch stays done.
    pub async fn shutdown(self) {
        self.token.cancel();
        if let Err(error) = self.task.await {
            if error.is_panic() {
                std::panic::resume_unwind(error.into_panic());
            }
        }
    }
}
