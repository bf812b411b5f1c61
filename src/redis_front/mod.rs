//! The optional Redis front line (feature `redis`): "a fast layer in front for speed, the
//! database behind it for correctness, never Redis alone".
//!
//! Three things, all shared by every app instance that uses the same Redis and prefix:
//!
//! - **Completed responses.** After a response is stored in PostgreSQL it is also written to
//!   `<prefix>:resp:<record id>` with the record's remaining lifetime, so a retry that lands
//!   on any instance is replayed (or refused with 422) without a database trip.
//! - **An in-flight pre-filter.** Before the PostgreSQL claim, `SET <prefix>:lock:<record id>
//!   NX PX <deadline>`; if another request holds it, the answer is 409 at once. The lock is
//!   deleted when the request ends and expires on its own (handler deadline plus a margin),
//!   so a crashed holder can only delay a retry, never refuse it for good.
//! - **A shared hot-key limiter** (with
//!   [`key_attempt_limit_shared`](crate::IdempotencyLayer::key_attempt_limit_shared)): an
//!   attempt that would go on to PostgreSQL increments `<prefix>:hits:<record id>`, which
//!   expires one second after the attempt that created it; past the limit the answer is
//!   429 at once, and no lock is taken.
//!
//! The lookup, the count and the lock are one script call (`EVALSHA`), one round trip,
//! atomic in Redis: neither a replay nor a refused attempt takes a lock it would have to
//! give back. Storing the response and deleting the lock after the commit are one
//! pipelined round trip. Every Redis error or timeout is logged and skipped: the request
//! goes on to PostgreSQL, which decides as it would without Redis. After a lost
//! connection, a failed connection attempt or a timeout, Redis is left alone for
//! [`BACKOFF`], so a dead Redis costs one connection attempt per back-off, not a timeout
//! per request. A lock that could not be deleted is deleted after the next reconnect (a
//! Redis that keeps its data would otherwise hold it to its expiry).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{Client, Script, Value};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;
use crate::engine::telemetry::{self, RedisOutcome};

mod codec;
mod link;

use codec::{decode, encode};
use link::{Link, Ran};

/// Key prefix unless [`IdempotencyLayer::redis_prefix`](crate::IdempotencyLayer::redis_prefix)
/// says otherwise.
pub(crate) const DEFAULT_PREFIX: &str = "axum-idempotency";
/// Per-operation deadline (connecting included) unless
/// [`IdempotencyLayer::redis_timeout`](crate::IdempotencyLayer::redis_timeout) says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);
/// How long Redis is skipped after a failed connection, a lost one or a timeout.
pub(crate) const BACKOFF: Duration = Duration::from_secs(1);
/// Added to the request's deadline for the lock's expiry.
pub(crate) const LOCK_MARGIN: Duration = Duration::from_secs(1);

/// Locks kept for deletion after a reconnect, at most; the rest expire on their own.
const MAX_UNRELEASED: usize = 10_000;

/// `KEYS[1]` the response, `KEYS[2]` the lock, `KEYS[3]` the hot-key counter; `ARGV[1]`
/// the lock's lifetime in ms (`0`: take no lock), `ARGV[2]` the attempts per key and second
/// (`0`: count nothing). Answers `{response, pttl}`, or `LOCKED`, `HELD`, `NOT_LOCKED` or
/// `LIMITED`. Only an attempt that would go on to PostgreSQL is counted: not a replay, not
/// one that finds the lock held. The counter expires one second after the attempt that
/// opened it; a refused attempt takes no lock.
static LOOKUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local response = redis.call('GET', KEYS[1])
if response then
  return {response, redis.call('PTTL', KEYS[1])}
end
if ARGV[1] ~= '0' and redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
if ARGV[2] ~= '0' then
  local attempts = redis.call('INCR', KEYS[3])
  if redis.call('PTTL', KEYS[3]) < 0 then
    redis.call('PEXPIRE', KEYS[3], 1000)
  end
  if attempts > tonumber(ARGV[2]) then
    return 3
  end
end
if ARGV[1] == '0' then
  return 2
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return 1
end
return 0
",
    )
});
const LOCKED: i64 = 1;
const NOT_LOCKED: i64 = 2;
const HELD: i64 = 0;
const LIMITED: i64 = 3;

/// Settings that may be given before or after the client.
#[derive(Debug, Clone)]
pub(crate) struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A completed response read from Redis.
#[derive(Debug)]
pub(crate) struct RedisResponse {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The key's remaining lifetime, if Redis told it.
    pub(crate) ttl: Option<Duration>,
}

/// What Redis said about a key before the PostgreSQL claim.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// A completed response (the caller checks the fingerprint).
    Hit(RedisResponse),
    /// Nothing completed; `locked` if this request now holds the in-flight lock. With a
    /// limit given, the attempt was counted in Redis and is within it.
    Miss { locked: bool },
    /// Another request holds the in-flight lock.
    InFlight,
    /// The key had its attempts for this second (shared hot-key limiter).
    Limited,
    /// Redis did not answer; PostgreSQL decides.
    Unavailable,
}

/// One layer's Redis client, connection and back-off state. Shared by every clone of the
/// layer through the configuration's `Arc`.
pub(crate) struct RedisFront {
    client: Client,
    options: RedisOptions,
    link: Mutex<Link>,
    generations: AtomicU64,
}

impl RedisFront {
    pub(crate) fn new(client: Client, options: RedisOptions) -> Self {
        Self {
            client,
            options,
            link: Mutex::new(Link::default()),
            generations: AtomicU64::new(0),
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    fn key(&self, kind: &str, id: RecordId) -> String {
        format!("{}:{kind}:{}", self.options.prefix, id.to_hex())
    }

    fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks the key's completed response up and, with `lock` set and no response found,
    /// takes the in-flight lock for that long: one round trip, atomic in Redis, so a replay
    /// never takes a lock it would have to give back. With `limit`, an attempt that would go
    /// on to PostgreSQL is counted first, and refused past `limit` in the current second.
    pub(crate) async fn lookup(
        &self,
        id: RecordId,
        lock: Option<Duration>,
        limit: Option<u32>,
    ) -> Lookup {
        let resp = self.key("resp", id);
        let lock_key = self.key("lock", id);
        let hits = self.key("hits", id);
        let lock_ms = lock.map_or(0, |lock_for| millis(lock_for).max(1));
        let limit = limit.unwrap_or(0);
        let answer = self
            .run("lookup", |mut conn| async move {
                LOOKUP
                    .key(resp)
                    .key(lock_key)
                    .key(hits)
                    .arg(lock_ms)
                    .arg(limit)
                    .invoke_async::<Value>(&mut conn)
                    .await
            })
            .await;
        let answer = match answer {
            Ran::Done(answer) => answer,
            Ran::Failed | Ran::Skipped => {
                telemetry::redis(RedisOutcome::Error);
                return Lookup::Unavailable;
            }
        };
        let lookup = match answer {
            Value::Array(found) => match <[Value; 2]>::try_from(found) {
                Ok([Value::BulkString(value), Value::Int(pttl)]) => {
                    match decode(Bytes::from(value), pttl) {
                        Some(response) => Lookup::Hit(response),
                        None => {
                            tracing::debug!(record = %id, "undecodable response in Redis; asking PostgreSQL");
                            Lookup::Unavailable
                        }
                    }
                }
                _ => Lookup::Unavailable,
            },
            Value::Int(LOCKED) => Lookup::Miss { locked: true },
            Value::Int(HELD) => Lookup::InFlight,
            Value::Int(NOT_LOCKED) => Lookup::Miss { locked: false },
            Value::Int(LIMITED) => Lookup::Limited,
            _ => Lookup::Unavailable,
        };
        telemetry::redis(match lookup {
            Lookup::Hit(_) => RedisOutcome::Hit,
            Lookup::Miss { .. } => RedisOutcome::Miss,
            Lookup::InFlight => RedisOutcome::InFlight,
            Lookup::Limited => RedisOutcome::Limited,
            Lookup::Unavailable => RedisOutcome::Error,
        });
        lookup
    }

    /// Shares a response PostgreSQL has stored, for `ttl` (the record's remaining
    /// lifetime), and with `release` deletes this request's lock in the same round trip.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn store(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        ttl: Duration,
        release: bool,
    ) {
        let ttl = millis(ttl);
        if ttl == 0 && !release {
            return;
        }
        let mut pipe = ::redis::pipe();
        if ttl > 0 {
            pipe.cmd("SET")
                .arg(self.key("resp", id))
                .arg(encode(fingerprint, status, headers, body))
                .arg("PX")
                .arg(ttl)
                .ignore();
        }
        if release {
            pipe.cmd("DEL").arg(self.key("lock", id)).ignore();
        }
        let ran = self
            .run("store", |mut conn| async move {
                pipe.query_async::<()>(&mut conn).await
            })
            .await;
        if release && !matches!(ran, Ran::Done(())) {
            self.release_later(id);
        }
        if let Ran::Failed = ran {
            telemetry::redis(RedisOutcome::Error);
        }
    }

    /// Deletes this request's in-flight lock.
    pub(crate) async fn release(&self, id: RecordId) {
        let key = self.key("lock", id);
        let ran = self
            .run("release", |mut conn| async move {
                ::redis::cmd("DEL")
                    .arg(key)
                    .query_async::<()>(&mut conn)
                    .await
            })
            .await;
        if !matches!(ran, Ran::Done(())) {
            self.release_later(id);
        }
        if let Ran::Failed = ran {
            telemetry::redis(RedisOutcome::Error);
        }
    }

    /// [`release`](Self::release) in a task of its own, when no one should wait for it.
    pub(crate) fn release_in_background(self: &Arc<Self>, id: RecordId) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let front = Arc::clone(self);
                runtime.spawn(async move { front.release(id).await });
            }
            Err(_) => self.release_later(id),
        }
    }

    /// A lock that could not be deleted now is deleted after the next (re)connect, so a
    /// Redis that keeps its data does not hold finished keys until their locks expire.
    fn release_later(&self, id: RecordId) {
        let mut link = self.link();
        if link.unreleased.len() < MAX_UNRELEASED {
            link.unreleased.push(id);
        }
    }

    /// Deletes the locks [`release_later`](Self::release_later) kept, on a fresh connection.
    fn release_kept(&self, ids: Vec<RecordId>, conn: &MultiplexedConnection) {
        let mut conn = conn.clone();
        let keys: Vec<String> = ids.into_iter().map(|id| self.key("lock", id)).collect();
        let timeout = self.options.timeout;
        tokio::spawn(async move {
            for chunk in keys.chunks(1000) {
                let mut del = ::redis::cmd("DEL");
                del.arg(chunk);
                let deleted = tokio::time::timeout(timeout, del.query_async::<()>(&mut conn)).await;
                if !matches!(deleted, Ok(Ok(()))) {
                    tracing::debug!("could not delete kept locks; they expire on their own");
                    return;
                }
            }
        });
    }
}

impl std::fmt::Debug for RedisFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the client: its connection info may hold a password.
        let link = self.link();
        f.debug_struct("RedisFront")
            .field("prefix", &self.options.prefix)
            .field("timeout", &self.options.timeout)
            .field("connected", &link.conn.is_some())
            .finish_non_exhaustive()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
