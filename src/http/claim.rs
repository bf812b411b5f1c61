//! The claim of a keyed request in atomic mode: the answers found before the handler runs
//! (a replay, 409 while in flight, 422 for another request under the key) and the
//! transaction handed to it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::response::Response;

use std::time::{Duration, Instant};

use crate::engine::crypto::{self};
use crate::engine::record::{Claim, Existing, ExistingKind};
use crate::engine::telemetry::{self, RequestOutcome};
use crate::http::complete::{replay, schema_missing_logged_once};
use crate::http::rejection::{Rejection, RejectionKind};
use crate::http::state::RequestState;
use crate::store::{LeaseStore, TxHandle};

impl<D: LeaseStore> RequestState<D> {
    /// A key can be claimed once per request, by one kind of extractor.
    pub(crate) fn first_claim(&self) -> Result<(), Rejection> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(Rejection::new(
                RejectionKind::ConflictingExtractors,
                "this request's key was already claimed by another extractor of the handler: \
                 a handler takes IdempotentTx (atomic mode) or one IdempotentLease (lease \
                 mode), not both",
            ));
        }
        Ok(())
    }

    /// Atomic mode, the extractor's work: begin, lock, look up — and decide.
    pub(crate) async fn claim(self: &Arc<Self>) -> Result<D::Handle, Response> {
        let held = || {
            self.reject(Rejection::new(
                RejectionKind::TransactionLeaked,
                "this request's transaction is already held by another extractor; \
                 take one transaction extractor per handler",
            ))
        };
        let Some(mut slot) = self.tx.try_slot() else {
            return Err(held());
        };
        if slot.is_some() {
            // A second extractor in the same handler shares the transaction, where the
            // driver's handles can share it.
            drop(slot);
            return D::Handle::on_shared(&self.tx).ok_or_else(held);
        }
        self.first_claim().map_err(|r| self.reject(r))?;
        if self.key.is_none() {
            // No key, and none required: a plain transaction, nothing to look up.
            let conn = self.config.store.begin().await.map_err(|e| {
                tracing::warn!(error = %crate::engine::error::Chain(&e), "could not begin a transaction");
                self.unavailable(e)
            })?;
            *slot = Some(conn);
            drop(slot);
            return D::Handle::on_shared(&self.tx).ok_or_else(held);
        }
        if let Some(answer) = self.answer_from_cache() {
            return Err(answer);
        }
        // No pre-filter when a duplicate is to wait for the first in PostgreSQL.
        let lock = self
            .config
            .wait_for_in_flight
            .is_none()
            .then_some(self.config.handler_timeout);
        // The Redis front line, then the hot-key limiter: the last answers before PostgreSQL.
        if let Some(answer) = self.answer_before_store(lock).await {
            return Err(answer);
        }
        let started = Instant::now();
        let config = &self.config;
        let (claim, conn) = config
            .store
            .claim(self.id, self.fingerprint, config.wait_for_in_flight)
            .await
            .map_err(|e| {
                tracing::warn!(record = %self.id, error = %crate::engine::error::Chain(&e), "claim failed");
                self.unavailable(e)
            })?;
        telemetry::claim_time("atomic", started);
        match claim {
            Claim::Run { replaces } => {
                tracing::debug!(record = %self.id, replaces, "claimed");
                self.replaces.store(replaces, Ordering::Release);
                *slot = Some(conn);
                drop(slot);
                D::Handle::on_shared(&self.tx).ok_or_else(held)
            }
            Claim::InFlight => {
                tracing::debug!(record = %self.id, "in flight");
                telemetry::request(RequestOutcome::InFlight);
                Err(self.reject(self.in_flight(self.config.retry_after)))
            }
            Claim::Existing {
                existing,
                holds_lock,
            } => {
                if holds_lock {
                    // Release the key's lock before answering, so the client's next
                    // retry cannot find it still held.
                    D::rollback(conn).await;
                } else {
                    // Nothing held: the ROLLBACK can finish in the background.
                    drop(conn);
                }
                Err(self.answer_existing(existing).await)
            }
        }
    }

    pub(crate) fn unavailable(&self, error: crate::engine::error::Error) -> Response {
        telemetry::request(RequestOutcome::StoreError);
        if error.is_schema_missing() {
            schema_missing_logged_once(&error);
            return self.reject(
                Rejection::new(
                    RejectionKind::SchemaMissing,
                    "the idempotency tables are missing or older than this version needs; \
                     run axum_idempotency::migrate against this database",
                )
                .with_source(error),
            );
        }
        self.reject(
            Rejection::new(
                RejectionKind::StoreUnavailable,
                "the idempotency store is unavailable; retry later",
            )
            .with_retry_after(self.config.retry_after)
            .with_source(error),
        )
    }

    pub(crate) fn in_flight(&self, retry_after: u32) -> Rejection {
        Rejection::new(
            RejectionKind::InFlight,
            "a request with this Idempotency-Key is still being processed",
        )
        .with_retry_after(retry_after.max(1))
    }

    /// A record this request may not replace: the stored response if the request is the
    /// same, 422 if not, 409 while a lease holder is at work.
    pub(crate) async fn answer_existing(&self, existing: Existing) -> Response {
        if existing.fingerprint != self.fingerprint {
            tracing::info!(record = %self.id, "key reused with a different request");
            telemetry::request(RequestOutcome::PayloadMismatch);
            return self.reject(Rejection::new(
                RejectionKind::KeyReused,
                "this Idempotency-Key was already used for a different request",
            ));
        }
        let stored = match existing.kind {
            ExistingKind::Completed(stored) => stored,
            ExistingKind::Leased { retry_after } => {
                telemetry::request(RequestOutcome::InFlight);
                return self.reject(self.in_flight(retry_after));
            }
            ExistingKind::Replaceable => {
                telemetry::request(RequestOutcome::InFlight);
                return self.reject(self.in_flight(1));
            }
        };
        let body = match crypto::open_body(
            self.config.body_keys.as_ref(),
            self.id,
            stored.body_key_id,
            stored.body,
        ) {
            Ok(body) => body,
            Err(e) => {
                // Never replay what cannot be decrypted; restoring the key makes it replay.
                tracing::error!(record = %self.id, error = %e,
                    "stored response could not be decrypted; not replayed");
                return self.unavailable(crate::engine::error::Error::Encryption(e));
            }
        };
        self.remember(stored.status, &stored.headers, &body, stored.expires_in)
            .await;
        replay(stored.status, stored.headers, body)
    }

    /// The lifetime left to a record stored now: its `expires_at` was computed from the
    /// transaction's start, so a cached copy must not outlive it.
    pub(crate) fn remaining_ttl(&self) -> Duration {
        self.config.ttl.saturating_sub(self.started.elapsed())
    }

    /// Gives up on whatever the handler left open: rolls the transaction back, or marks
    /// the lease failed so a retry may run again. `false` if nothing was claimed.
    pub(crate) async fn abandon(&self) -> bool {
        // PostgreSQL's own lock still guards the key until the rollback below.
        self.release_redis_lock().await;
        if let Some(token) = self.lease_token() {
            self.end_lease_quietly(token).await;
            telemetry::request(RequestOutcome::RolledBack);
            return true;
        }
        match self.tx.take().await {
            Some(conn) => {
                D::rollback(conn).await;
                telemetry::request(RequestOutcome::RolledBack);
                true
            }
            None => false,
        }
    }
}
