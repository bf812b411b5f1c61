//! Metric names and recording helpers. Every metric goes through the `metrics` facade, so
//! any exporter the application installs (Prometheus, StatsD, …) receives them; without
//! one they cost next to nothing.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idempotency_requests_total` | counter | `outcome` | keyed HTTP requests by outcome: `executed`, `replayed`, `in_flight`, `payload_mismatch`, `missing_key`, `invalid_key`, `rolled_back`, `store_error`, `lease_lost`, `body_rejected`, `too_many_attempts` (refused by the hot-key limiter before PostgreSQL) |
//! | `idempotency_inbox_messages_total` | counter | `outcome` | messages by outcome: `processed`, `duplicate`, `failed`, `gave_up`, `busy` |
//! | `idempotency_retry_success_total` | counter | `kind` (`inbox`, `lease`) | work that succeeded after an earlier failed attempt |
//! | `idempotency_unique_conflicts_total` | counter | | concurrent inserts caught by the primary-key backstop |
//! | `idempotency_lease_takeovers_total` | counter | | leases taken over after their holder's lease ran out or failed retryably |
//! | `idempotency_claim_seconds` | histogram | `mode` (`atomic`, `lease`, `inbox`) | time to claim a key (checkout, lock, lookup) |
//! | `idempotency_commit_seconds` | histogram | `mode` | time to store the record and commit |
//! | `idempotency_stale_processing` | gauge | | PROCESSING records past their lease (set by the sweeper) |
//! | `idempotency_stale_processing_oldest_seconds` | gauge | | how long the oldest of them is past its lease |
//! | `idempotency_purged_total` | counter | `table` | records purged by the sweeper |
//! | `idempotency_archived_total` | counter | | records the sweeper wrote to the archive before purging them (`Sweeper::archive`: the `idempotency_records_archive` table; `Sweeper::archive_to`: a sink) |
//! | `idempotency_archive_errors_total` | counter | `archive` (`table`, `sink`) | sweeper runs whose archiving failed (nothing of the failed batch was purged) |
//! | `idempotency_archive_lag_seconds` | gauge | | how long ago the archive last caught up: 0 after a run that archived every record due, growing while runs fail |
//! | `idempotency_stale_marked_failed_total` | counter | | stale PROCESSING records the sweeper marked FAILED |
//! | `idempotency_sweeper_runs_total` | counter | | sweeper passes that completed |
//! | `idempotency_sweeper_last_run_timestamp_seconds` | gauge | | Unix time at the end of the last completed sweeper pass |
//! | `idempotency_outbox_published_total` | counter | | outbox messages the broker confirmed |
//! | `idempotency_outbox_publish_failures_total` | counter | `reason` (`refused`, `unavailable`) | failed publishes: the broker refused the message, or was unavailable |
//! | `idempotency_outbox_parked_total` | counter | | outbox messages parked as FAILED after `max_attempts` refusals |
//! | `idempotency_outbox_pending` | gauge | | outbox messages waiting to be published (set by the relay after a batch, at most once a second) |
//! | `idempotency_outbox_oldest_pending_seconds` | gauge | | how long the oldest of them has waited |
//! | `idempotency_outbox_lag_seconds` | histogram | | from the enqueueing insert to the broker's confirm |
//! | `idempotency_redis_total` | counter | `result` | the Redis front line (feature `redis`): `hit` (a completed response answered the claim), `miss` (nothing there; PostgreSQL decides), `in_flight` (another request held the key: 409 with no PostgreSQL trip), `limited` (the shared hot-key limiter refused the attempt: 429 with no PostgreSQL trip), `error` (a lookup that failed, timed out, found an unreadable value or was skipped during the back-off after a failure, or a failed write; PostgreSQL decides) |

use std::time::{Duration, Instant};

pub(crate) const REQUESTS: &str = "idempotency_requests_total";
pub(crate) const INBOX_MESSAGES: &str = "idempotency_inbox_messages_total";
pub(crate) const RETRY_SUCCESS: &str = "idempotency_retry_success_total";
pub(crate) const UNIQUE_CONFLICTS: &str = "idempotency_unique_conflicts_total";
pub(crate) const LEASE_TAKEOVERS: &str = "idempotency_lease_takeovers_total";
pub(crate) const CLAIM_SECONDS: &str = "idempotency_claim_seconds";
pub(crate) const COMMIT_SECONDS: &str = "idempotency_commit_seconds";
pub(crate) const PURGED: &str = "idempotency_purged_total";
pub(crate) const ARCHIVED: &str = "idempotency_archived_total";
pub(crate) const ARCHIVE_ERRORS: &str = "idempotency_archive_errors_total";
pub(crate) const ARCHIVE_LAG: &str = "idempotency_archive_lag_seconds";
pub(crate) const STALE_PROCESSING: &str = "idempotency_stale_processing";
pub(crate) const STALE_OLDEST_SECONDS: &str = "idempotency_stale_processing_oldest_seconds";
pub(crate) const STALE_MARKED_FAILED: &str = "idempotency_stale_marked_failed_total";
pub(crate) const SWEEPER_RUNS: &str = "idempotency_sweeper_runs_total";
pub(crate) const SWEEPER_LAST_RUN: &str = "idempotency_sweeper_last_run_timestamp_seconds";
pub(crate) const OUTBOX_PUBLISHED: &str = "idempotency_outbox_published_total";
pub(crate) const OUTBOX_PUBLISH_FAILURES: &str = "idempotency_outbox_publish_failures_total";
pub(crate) const OUTBOX_PARKED: &str = "idempotency_outbox_parked_total";
pub(crate) const OUTBOX_PENDING: &str = "idempotency_outbox_pending";
pub(crate) const OUTBOX_OLDEST_PENDING: &str = "idempotency_outbox_oldest_pending_seconds";
pub(crate) const OUTBOX_LAG: &str = "idempotency_outbox_lag_seconds";
#[cfg(feature = "redis")]
pub(crate) const REDIS: &str = "idempotency_redis_total";

/// Outcome of a keyed HTTP request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RequestOutcome {
    Executed,
    Replayed,
    InFlight,
    PayloadMismatch,
    MissingKey,
    InvalidKey,
    RolledBack,
    StoreError,
    LeaseLost,
    BodyRejected,
    TooManyAttempts,
    OutcomeUnknown,
}

impl RequestOutcome {
    fn label(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::PayloadMismatch => "payload_mismatch",
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::RolledBack => "rolled_back",
            Self::StoreError => "store_error",
            Self::LeaseLost => "lease_lost",
            Self::BodyRejected => "body_rejected",
            Self::TooManyAttempts => "too_many_attempts",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

pub(crate) fn request(outcome: RequestOutcome) {
    metrics::counter!(REQUESTS, "outcome" => outcome.label()).increment(1);
}

pub(crate) fn inbox_message(outcome: &'static str) {
    metrics::counter!(INBOX_MESSAGES, "outcome" => outcome).increment(1);
}

pub(crate) fn retry_success(kind: &'static str) {
    metrics::counter!(RETRY_SUCCESS, "kind" => kind).increment(1);
}

pub(crate) fn unique_conflict() {
    metrics::counter!(UNIQUE_CONFLICTS).increment(1);
}

pub(crate) fn lease_takeover() {
    metrics::counter!(LEASE_TAKEOVERS).increment(1);
}

pub(crate) fn claim_time(mode: &'static str, started: Instant) {
    metrics::histogram!(CLAIM_SECONDS, "mode" => mode).record(started.elapsed().as_secs_f64());
}

pub(crate) fn commit_time(mode: &'static str, started: Instant) {
    metrics::histogram!(COMMIT_SECONDS, "mode" => mode).record(started.elapsed().as_secs_f64());
}

pub(crate) fn purged(table: &'static str, rows: u64) {
    metrics::counter!(PURGED, "table" => table).increment(rows);
}

pub(crate) fn archived(rows: u64) {
    metrics::counter!(ARCHIVED).increment(rows);
}

pub(crate) fn archive_failed(archive: &'static str) {
    metrics::counter!(ARCHIVE_ERRORS, "archive" => archive).increment(1);
}

pub(crate) fn archive_lag(behind: Duration) {
    metrics::gauge!(ARCHIVE_LAG).set(behind.as_secs_f64());
}

pub(crate) fn stale_processing(count: u64, oldest: Option<Duration>) {
    metrics::gauge!(STALE_PROCESSING).set(count as f64);
    metrics::gauge!(STALE_OLDEST_SECONDS).set(oldest.map_or(0.0, |age| age.as_secs_f64()));
}

pub(crate) fn stale_marked_failed(rows: u64) {
    metrics::counter!(STALE_MARKED_FAILED).increment(rows);
}

/// A sweeper pass completed now.
pub(crate) fn sweeper_ran() {
    metrics::counter!(SWEEPER_RUNS).increment(1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    metrics::gauge!(SWEEPER_LAST_RUN).set(now);
}

pub(crate) fn outbox_settled(published: usize, parked: u64) {
    metrics::counter!(OUTBOX_PUBLISHED).increment(published as u64);
    metrics::counter!(OUTBOX_PARKED).increment(parked);
}

pub(crate) fn outbox_publish_failure(reason: &'static str) {
    metrics::counter!(OUTBOX_PUBLISH_FAILURES, "reason" => reason).increment(1);
}

pub(crate) fn outbox_lag(seconds: f64) {
    metrics::histogram!(OUTBOX_LAG).record(seconds);
}

pub(crate) fn outbox_pending(count: i64, oldest_seconds: Option<f64>) {
    metrics::gauge!(OUTBOX_PENDING).set(count as f64);
    metrics::gauge!(OUTBOX_OLDEST_PENDING).set(oldest_seconds.unwrap_or(0.0));
}

/// What the Redis front line did for a request.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum RedisOutcome {
    Hit,
    Miss,
    InFlight,
    Limited,
    Error,
}

#[cfg(feature = "redis")]
pub(crate) fn redis(outcome: RedisOutcome) {
    let result = match outcome {
        RedisOutcome::Hit => "hit",
        RedisOutcome::Miss => "miss",
        RedisOutcome::InFlight => "in_flight",
        RedisOutcome::Limited => "limited",
        RedisOutcome::Error => "error",
    };
    metrics::counter!(REDIS, "result" => result).increment(1);
}
