//! [`IdempotencyLayer`] and its configuration.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use tower_layer::Layer;

use super::Idempotency;
use super::config::ClaimMode;
use crate::engine::cache::ResponseCache;
use crate::engine::fingerprint::parse_pointer;
use crate::engine::limit::{AttemptLimiter, TRACKED_KEYS};
use crate::http::config::{Config, StoreDecision};
use crate::http::rejection::Rejection;
#[cfg(feature = "redis")]
use crate::redis_front::{RedisFront, RedisOptions};
use crate::store::{IntoStore, LeaseStore, Store};

/// Makes POST and PATCH handlers that take [`IdempotentTx`](crate::IdempotentTx) take
/// effect once per `Idempotency-Key`, storing the response in the same PostgreSQL
/// transaction as the handler's own rows.
///
/// For requests on a covered method with a key, the layer validates the key, buffers the
/// body (up to [`body_limit`](Self::body_limit)), computes the request's fingerprint and
/// hands the extractor a lazy handle; the database is only touched when the handler takes
/// `IdempotentTx`. Other requests pass through untouched.
///
/// Every builder method consumes the layer and returns it; cloning the finished layer (as
/// `Router::layer` does per route) only bumps a reference count.
///
/// # Example
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use axum_idempotency::{IdempotencyLayer};
/// use axum_idempotency::postgres::IdempotentTx;
/// use std::time::Duration;
///
/// # async fn create_order(_tx: IdempotentTx) {}
/// # fn app(pool: deadpool_postgres::Pool) -> Router {
/// // The defaults: POST and PATCH, 1 MiB bodies, records kept for 24 hours,
/// // 409 + `Retry-After: 1` while a key is in flight.
/// let default = IdempotencyLayer::new(pool.clone());
///
/// // Customised: one key space per user, a longer retention, and a short wait for an
/// // in-flight request instead of an immediate 409.
/// let layer = IdempotencyLayer::new(pool)
///     .scope(|parts| {
///         parts.headers.get("x-user-id")?.to_str().ok().map(str::to_owned)
///     })
///     .ttl(Duration::from_secs(3 * 24 * 3600))
///     .wait_for_in_flight(Duration::from_secs(2));
///
/// Router::new()
///     .route("/orders", post(create_order))
///     .layer(layer)
/// # }
/// ```
pub struct IdempotencyLayer<D: Store> {
    config: Arc<Config<D>>,
}

impl<D: Store> Clone for IdempotencyLayer<D> {
    fn clone(&self) -> Self {
        Self {
            config: Arc::clone(&self.config),
        }
    }
}

impl<D: Store + std::fmt::Debug> std::fmt::Debug for IdempotencyLayer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl<D: LeaseStore> IdempotencyLayer<D> {
    /// A layer that stores records through `pool` — a deadpool or bb8 pool of
    /// tokio-postgres connections, an `sqlx::PgPool`, or a [`Store`] (see [`IntoStore`]) —
    /// with the defaults described on each builder method. Run [`migrate`](crate::migrate)
    /// once before serving.
    pub fn new<P: IntoStore<Store = D>>(pool: P) -> Self {
        Self {
            config: Arc::new(Config::new(pool.into_store())),
        }
    }

    /// Whether a request without a key is refused (`key_required`), and whether hot keys
    /// get 429 (`key_attempt_limit`): what the layer's OpenAPI declaration follows.
    #[cfg_attr(not(feature = "utoipa"), allow(dead_code))]
    pub(crate) fn contract(&self) -> (bool, bool) {
        (
            self.config.key_required,
            self.config.attempt_limit.is_some(),
        )
    }

    fn with(mut self, f: impl FnOnce(&mut Config<D>)) -> Self {
        let config = Arc::make_mut(&mut self.config);
        f(config);
        // Whatever order the settings came in, the store knows the twins' bound: the
        // in-flight wait, else half the handler deadline, so a twin past it is answered
        // 409 before its own deadline ends it.
        let bound = (config.claim_mode == ClaimMode::Optimistic).then(|| {
            config
                .wait_for_in_flight
                .unwrap_or(config.handler_timeout / 2)
        });
        config.store.set_optimistic_claim(bound);
        self
    }

    /// Derives the key's scope (tenant, user, API client) from the request. The same key
    /// in two scopes names two independent operations, and a stored response is never
    /// replayed to another scope. `None` puts the request in the shared, unscoped key
    /// space.
    ///
    /// Default: no scope function; every request is unscoped. Behind authentication,
    /// derive the scope from the authenticated principal, not from a header the client
    /// chooses freely.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(pool).scope(|parts| {
    ///     parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
    /// });
    /// # }
    /// ```
    #[must_use]
    pub fn scope<F>(self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.with(|c| c.scope = Some(Arc::new(scope)))
    }

    /// Whether a request on a covered method must carry an `Idempotency-Key`. Default:
    /// `true` — a route whose handler takes [`IdempotentTx`](crate::IdempotentTx) answers
    /// 400 `missing_key` without one.
    ///
    /// With `false`, a request without a key means "no idempotency, just run": the handler
    /// runs once per request, in a transaction of its own that commits or rolls back by the
    /// same store policy (a 2xx/3xx commits), and no record is written, so nothing is ever
    /// replayed and no `Idempotent-Replayed` header is sent. A request *with* a key gets
    /// the full treatment as before; a malformed key is still 400. Lease mode
    /// ([`IdempotentLease`](crate::IdempotentLease)) needs a key either way.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// // Clients that send a key get idempotency; the others just run.
    /// let layer = IdempotencyLayer::new(pool).key_required(false);
    /// # }
    /// ```
    #[must_use]
    pub fn key_required(self, required: bool) -> Self {
        self.with(|c| c.key_required = required)
    }

    /// The methods the layer acts on. Default: `POST` and `PATCH`.
    #[must_use]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.with(|c| c.methods = methods.into_iter().collect())
    }

    /// Largest request body the layer buffers; larger ones get 413 before the handler
    /// runs. Checked against `Content-Length` first, then while reading. Default: 1 MiB.
    #[must_use]
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with(|c| c.body_limit = bytes)
    }

    /// How long the whole request body may take to arrive; slower ones get 408. Default:
    /// 30 seconds.
    #[must_use]
    pub fn body_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.body_timeout = timeout)
    }

    /// Largest response body that can be stored. Default: 1 MiB. In atomic mode a larger
    /// one rolls the work back and answers 500. In lease mode the work has happened
    /// outside the database: the response goes out whole and is kept without its body, so
    /// a repeat gets its status and headers, an empty body and
    /// [`Idempotent-Body-Omitted: true`](crate::BODY_OMITTED_HEADER), and never runs again.
    #[must_use]
    pub fn response_limit(self, bytes: usize) -> Self {
        self.with(|c| c.response_limit = bytes)
    }

    /// How long a stored response is replayed. After that the key is treated as new.
    /// Default: 24 hours.
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|c| c.ttl = ttl)
    }

    /// Also store (and replay) this response header. `Content-Type` and `Location` are
    /// always kept; `Set-Cookie` never is, even when listed.
    #[must_use]
    pub fn keep_header(self, name: HeaderName) -> Self {
        self.with(|c| {
            if !c.kept_headers.contains(&name) {
                c.kept_headers.push(name);
            }
        })
    }

    /// Include this request header in the fingerprint, so the same key with another value
    /// of it is a different request (422). Default: no headers.
    #[must_use]
    pub fn fingerprint_header(self, name: HeaderName) -> Self {
        self.with(|c| c.fingerprint.headers.push(name))
    }

    /// Leave a JSON field out of the fingerprint — a client timestamp or a trace id that
    /// changes between retries of the same operation. Takes a JSON Pointer
    /// (`/meta/sent_at`) or a top-level field name (`sent_at`).
    #[must_use]
    pub fn ignore_json_field(self, field: &str) -> Self {
        let segments = parse_pointer(field).unwrap_or_else(|| vec![field.to_owned()]);
        self.with(|c| c.fingerprint.ignored.push(segments))
    }

    /// Deepest JSON nesting that is canonicalised; deeper bodies are fingerprinted byte for
    /// byte. Default: 32.
    #[must_use]
    pub fn max_json_depth(self, depth: usize) -> Self {
        self.with(|c| c.fingerprint.max_json_depth = depth)
    }

    /// Decides, from the handler's status code, whether to commit, store the response
    /// without committing, or discard. Default: [`StoreDecision::for_status`].
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::{IdempotencyLayer, StoreDecision};
    /// use http::StatusCode;
    ///
    /// // Also let a retry after 403 run again (permissions may have been granted since).
    /// let layer = IdempotencyLayer::new(pool).store_policy(|status| match status {
    ///     StatusCode::FORBIDDEN => StoreDecision::Discard,
    ///     other => StoreDecision::for_status(other),
    /// });
    /// # }
    /// ```
    #[must_use]
    pub fn store_policy(self, policy: fn(StatusCode) -> StoreDecision) -> Self {
        self.with(|c| c.store_policy = policy)
    }

    /// Whether a 4xx answered before the handler used its transaction is stored. Default:
    /// `false`.
    ///
    /// A request refused before any work began — an extractor's rejection (415 without
    /// `Content-Type`, 400 for a body that does not parse) or the handler's own validation
    /// before its first statement or enqueue — is answered and not stored, and the key
    /// stays free: the client's corrected request under the same key runs, instead of
    /// getting the refusal again or 422 for a key reused with another body. A 4xx after
    /// the handler's first statement is stored (without its writes) as
    /// [`store_policy`](Self::store_policy) says. `true` stores both. Lease mode stores
    /// its 4xx either way: its record commits before the handler runs.
    #[must_use]
    pub fn store_rejections_before_work(self, enabled: bool) -> Self {
        self.with(|c| c.store_rejections_before_work = enabled)
    }

    /// While another request with the same key is in flight, wait up to `timeout` for it
    /// to finish and then replay its response, instead of answering 409 at once. In atomic
    /// mode the waiting request holds a pooled connection, waiting on the key's lock; in
    /// lease mode it polls the record (no connection held between polls) and, should the
    /// holder's lease run out meanwhile, takes the key over. Default: no waiting.
    #[must_use]
    pub fn wait_for_in_flight(self, timeout: Duration) -> Self {
        self.with(|c| c.wait_for_in_flight = Some(timeout))
    }

    /// How a key with no record is claimed: [`ClaimMode::Locked`] (the default) or
    /// [`ClaimMode::Optimistic`], which sends no lock and lets the record's primary key
    /// decide between twins. What each costs and promises: the guide's
    /// [claim modes](crate::guide::atomic#claim-modes).
    ///
    /// ```no_run
    /// use axum_idempotency::{ClaimMode, IdempotencyLayer};
    ///
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// let layer = IdempotencyLayer::new(pool).claim_mode(ClaimMode::Optimistic);
    /// # }
    /// ```
    #[must_use]
    pub fn claim_mode(self, mode: ClaimMode) -> Self {
        self.with(|c| c.claim_mode = mode)
    }

    /// Seconds sent in `Retry-After` with 409 and 503 answers. Default: 1.
    #[must_use]
    pub fn retry_after(self, seconds: u32) -> Self {
        self.with(|c| c.retry_after = seconds)
    }

    /// Renders the crate's own error answers. Default: RFC 9457 problem documents
    /// ([`Rejection::problem_response`]). `Retry-After` and the [`Rejection`] in the
    /// response extensions are added to whatever the closure returns.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum::{Json, response::IntoResponse};
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(pool).on_rejection(|rejection| {
    ///     let body = serde_json::json!({ "error": rejection.kind().code() });
    ///     (rejection.status(), Json(body)).into_response()
    /// });
    /// # }
    /// ```
    #[must_use]
    pub fn on_rejection<F>(self, render: F) -> Self
    where
        F: Fn(&Rejection) -> Response + Send + Sync + 'static,
    {
        self.with(|c| c.on_rejection = Some(Arc::new(render)))
    }

    /// Whether a keyed request keeps running when the client goes away. When `true` (the
    /// default), handler and commit run in a task of their own, so a response lost on the
    /// way back is still committed and the client's retry gets it replayed. When `false`,
    /// a disconnect cancels the handler and rolls its work back.
    #[must_use]
    pub fn finish_on_disconnect(self, enabled: bool) -> Self {
        self.with(|c| c.finish_on_disconnect = enabled)
    }

    /// Deadline for handler plus commit of a keyed request. Past it the work is rolled back
    /// and the answer is 503. Default: 60 seconds.
    #[must_use]
    pub fn handler_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.handler_timeout = timeout)
    }

    /// Store the raw key in the record (column `idempotency_key`) for troubleshooting.
    /// Default: off — only a digest identifies the record.
    #[must_use]
    pub fn store_raw_key(self, enabled: bool) -> Self {
        self.with(|c| c.store_raw_key = enabled)
    }

    /// How long a lease-mode claim ([`IdempotentLease`](crate::IdempotentLease)) holds the
    /// key. Duplicates get 409 until then; after it, a retry takes the key over. Choose it
    /// longer than the handler's slowest run. Default: 30 seconds.
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|c| c.lease = lease)
    }

    /// Whether the layer's own statements (claim, lookup, record insert, lease writes) are
    /// prepared — once per pooled connection, then reused — or sent unprepared, each as one
    /// round trip of the unnamed statement with its parameter types declared. Pipelining is
    /// the same either way.
    ///
    /// Default: `true`. Turn it off behind PgBouncer in transaction pooling mode when it does
    /// not support prepared statements — before 1.21, or without `max_prepared_statements`:
    /// each transaction may then run on another server connection, where a statement
    /// prepared earlier does not exist, and requests fail with 503. Statements the handler
    /// runs through [`IdempotentTx`](crate::IdempotentTx) are the handler's business: as
    /// SQL text they run inside the request's transaction and are fine; do not use
    /// [`IdempotentTx::prepare_cached`](crate::postgres::PgTx::prepare_cached) there. The
    /// same setting exists on [`Inbox`](crate::Inbox::prepared_statements),
    /// [`Sweeper`](crate::Sweeper::prepared_statements) and
    /// [`Admin`](crate::Admin::prepared_statements).
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// // `pool` connects through PgBouncer 1.18, pool_mode = transaction.
    /// let layer = IdempotencyLayer::new(pool).prepared_statements(false);
    /// # }
    /// ```
    #[must_use]
    pub fn prepared_statements(self, enabled: bool) -> Self {
        self.with(|c| c.store.set_prepared_statements(enabled))
    }

    /// Keep completed responses in memory, up to `max_bytes`, and replay them with no
    /// database trip. Completed records never change, so this is safe: entries honour
    /// the record's expiry and replay only to a request with the same scope, key and
    /// fingerprint. The cache is per process; PostgreSQL stays the source of truth.
    /// Default: off.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(pool).cache_responses(64 * 1024 * 1024);
    /// # }
    /// ```
    #[must_use]
    pub fn cache_responses(self, max_bytes: u64) -> Self {
        self.with(|c| c.cache = Some(Arc::new(ResponseCache::new(max_bytes))))
    }

    /// Lets at most `per_second` attempts of each key (each scope and `Idempotency-Key`)
    /// per second reach the database; the others get 429 `too_many_attempts` with
    /// `Retry-After: 1`, before any statement is sent. A client that retries one key in a
    /// tight loop then costs the others a counter check, not the pool.
    ///
    /// The count runs in fixed one-second windows, in process: at most 65 536 keys'
    /// counters are kept (about 100 bytes each), those of keys used again and again longest.
    /// What is counted is what would reach PostgreSQL: after key validation, body buffering
    /// and the fingerprint, when the handler's extractor ([`IdempotentTx`](crate::IdempotentTx)
    /// or [`IdempotentLease`](crate::IdempotentLease)) claims the key. Replays from the
    /// [in-process cache](Self::cache_responses), and the replays and 409s of the Redis
    /// front line (feature `redis`), cost no database trip and are neither counted
    /// nor limited. A `per_second` of 0 counts as 1. Refusals are counted in
    /// `idempotency_requests_total{outcome="too_many_attempts"}`. Default: no limit.
    ///
    /// With several instances each counts its own attempts, so a key may reach the
    /// database up to `per_second` times per instance; with feature `redis`,
    /// `key_attempt_limit_shared` counts across them.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) {
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// // A key retried in a loop reaches PostgreSQL at most 20 times a second.
    /// let layer = IdempotencyLayer::new(pool).key_attempt_limit(20);
    /// # }
    /// ```
    #[must_use]
    pub fn key_attempt_limit(self, per_second: u32) -> Self {
        self.with(|c| {
            c.attempt_limit = Some(Arc::new(AttemptLimiter::new(per_second, TRACKED_KEYS)));
            #[cfg(feature = "redis")]
            {
                c.attempt_limit_shared = false;
            }
        })
    }

    /// Like [`key_attempt_limit`](Self::key_attempt_limit), but counted in the layer's
    /// [Redis](Self::redis) (feature `redis`), so the limit holds across every instance that
    /// shares the Redis and the [prefix](Self::redis_prefix): at most `per_second` attempts
    /// of a key per second reach the database, whichever instances they land on.
    ///
    /// The count is part of the front line's lookup script, in the same round trip:
    /// `INCR <prefix>:hits:<record id>`, which expires one second after an attempt opened
    /// it. A refused attempt takes no in-flight lock and is counted in
    /// `idempotency_redis_total{result="limited"}`. The limiter fails open to the
    /// in-process count: while Redis does not answer (an error, a timeout, the back-off
    /// after a failure; counted as `result="error"` and logged), or without
    /// [`redis`](Self::redis) at all, each instance counts its own attempts as
    /// [`key_attempt_limit`](Self::key_attempt_limit) does. Redis never turns an attempt
    /// into an error answer.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::redis::RedisError> {
    /// use axum_idempotency::IdempotencyLayer;
    ///
    /// let client = axum_idempotency::redis::Client::open("redis://127.0.0.1:6379")?;
    /// // 20 attempts per key and second across all instances.
    /// let layer = IdempotencyLayer::new(pool)
    ///     .redis(client)
    ///     .key_attempt_limit_shared(20);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn key_attempt_limit_shared(self, per_second: u32) -> Self {
        self.with(|c| {
            c.attempt_limit = Some(Arc::new(AttemptLimiter::new(per_second, TRACKED_KEYS)));
            c.attempt_limit_shared = true;
        })
    }

    /// Encrypts stored response bodies at rest (feature `encryption`): AES-256-GCM under
    /// the current key of `keys`, with a random nonce, bound to the record it belongs to.
    /// Records sealed under an old key of `keys` still replay, and so do records stored in
    /// plaintext (written before encryption was turned on): the record's `body_key_id`
    /// column says which. A record under a key id that `keys` does not hold, or one that
    /// fails to decrypt, is never replayed: the request gets 503 (`store_unavailable`) and
    /// the error is logged. Default: off — bodies are stored as they are.
    ///
    /// Only the body is encrypted: the status, the [kept headers](Self::keep_header) and
    /// the request fingerprint (a SHA-256) are not. The in-process
    /// [cache](Self::cache_responses) and the Redis front line hold responses in
    /// plaintext. Every instance that shares the records must be given the keys: one
    /// without them answers a sealed record 503 rather than replay ciphertext.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool, key_2: [u8; 32], key_1: [u8; 32]) {
    /// use axum_idempotency::{BodyKeys, IdempotencyLayer};
    ///
    /// // New bodies under key 2; bodies stored under key 1 before the rotation still replay.
    /// let layer = IdempotencyLayer::new(pool)
    ///     .encrypt_bodies(BodyKeys::new(2, key_2).with_old_key(1, key_1));
    /// # }
    /// ```
    #[cfg(feature = "encryption")]
    #[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
    #[must_use]
    pub fn encrypt_bodies(self, keys: crate::engine::crypto::BodyKeys) -> Self {
        self.with(|c| c.body_keys = Some(keys))
    }

    /// Puts Redis in front of PostgreSQL (feature `redis`): "a fast layer in front for
    /// speed, the database behind it for correctness, never Redis alone". Every app
    /// instance whose layer uses the same Redis and [prefix](Self::redis_prefix) shares:
    ///
    /// - **completed responses**: once a response is stored in PostgreSQL it is also kept
    ///   in Redis (`<prefix>:resp:<record id>`, for the record's remaining lifetime), and a
    ///   retry on any instance is replayed from there — or refused with 422 if its
    ///   fingerprint differs — without a database trip;
    /// - **an in-flight pre-filter**: before the PostgreSQL claim the request takes
    ///   `<prefix>:lock:<record id>` (`SET NX` with an expiry of
    ///   [`handler_timeout`](Self::handler_timeout) plus one second; in lease mode the
    ///   shorter of that and the [lease](Self::lease)); a duplicate arriving meanwhile gets
    ///   409 with `Retry-After` at once. The lock is deleted when the request ends.
    ///
    /// The lookup and the lock are one atomic script call, one round trip. With
    /// [`wait_for_in_flight`](Self::wait_for_in_flight) set, no lock is taken and a
    /// duplicate goes on to wait in PostgreSQL as configured.
    ///
    /// PostgreSQL stays the source of truth. A Redis error or an operation slower than
    /// [`redis_timeout`](Self::redis_timeout) is logged and skipped: the request goes on
    /// to PostgreSQL and is decided as without Redis — slower, never an error answer,
    /// never a second execution. After a lost connection, a failed connection attempt or
    /// a timeout, Redis is left alone for one second, so a dead Redis costs one refused
    /// connection attempt a second rather than a wait on every request. A lock left by a
    /// crashed instance only delays retries of its key until the lock expires.
    ///
    /// The layer opens one multiplexed connection (shared by its clones) on first use and
    /// reconnects by itself; outcomes are counted in `idempotency_redis_total`. Layers that
    /// share a Redis and a prefix must share the database, or one app could replay
    /// another's responses. Default: no Redis.
    ///
    /// ```no_run
    /// # fn f(pool: deadpool_postgres::Pool) -> Result<(), axum_idempotency::redis::RedisError> {
    /// use axum_idempotency::IdempotencyLayer;
    /// use std::time::Duration;
    ///
    /// let client = axum_idempotency::redis::Client::open("redis://127.0.0.1:6379")?;
    /// // Defaults: keys under `axum-idempotency:`, 200 ms per Redis operation.
    /// let layer = IdempotencyLayer::new(pool.clone()).redis(client.clone());
    ///
    /// // Customised: a prefix of this service's own, a tighter deadline.
    /// let layer = IdempotencyLayer::new(pool)
    ///     .redis(client)
    ///     .redis_prefix("orders-api")
    ///     .redis_timeout(Duration::from_millis(50));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redis(self, client: redis::Client) -> Self {
        self.with(|c| {
            let front = RedisFront::new(client, c.redis_options.clone());
            c.redis = Some(Arc::new(front));
        })
    }

    /// The prefix of every Redis key the layer writes (see [`redis`](Self::redis)). Give
    /// each service (each database) a prefix of its own when they share a Redis. Default:
    /// `axum-idempotency`.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redis_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.with_redis_options(|options| options.prefix = prefix)
    }

    /// Deadline for each Redis operation, connecting included; past it the request goes on
    /// with PostgreSQL alone (see [`redis`](Self::redis)). Default: 200 milliseconds.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[must_use]
    pub fn redis_timeout(self, timeout: Duration) -> Self {
        self.with_redis_options(|options| options.timeout = timeout)
    }

    #[cfg(feature = "redis")]
    fn with_redis_options(self, f: impl FnOnce(&mut RedisOptions)) -> Self {
        self.with(|c| {
            f(&mut c.redis_options);
            if let Some(front) = &c.redis {
                let front = RedisFront::new(front.client().clone(), c.redis_options.clone());
                c.redis = Some(Arc::new(front));
            }
        })
    }

    /// Waits for the requests still finishing after their clients went away (see
    /// [`finish_on_disconnect`](Self::finish_on_disconnect)). Call it after the server has
    /// shut down, before the process exits.
    pub async fn drain(&self) {
        let tasks = &self.config.tasks;
        tasks.close();
        tasks.wait().await;
        tasks.reopen();
    }
}

impl<S, D: LeaseStore> Layer<S> for IdempotencyLayer<D> {
    type Service = Idempotency<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, Arc::clone(&self.config))
    }
}
