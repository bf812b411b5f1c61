//! An optional in-process cache of completed responses.
//!
//! A completed record never changes until it expires, so its response can be replayed
//! from memory with no database trip. The cache is keyed by the record id (scope and key),
//! bounded by the bytes it holds, honours each record's expiry, and replays only to a
//! request with the same fingerprint (another request gets the same 422 the database
//! would give). It is per process: another instance, or this one after a restart, falls
//! back to PostgreSQL, which stays the source of truth.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

use crate::engine::fingerprint::Fingerprint;
use crate::engine::key::RecordId;

/// A completed response held in memory.
#[derive(Debug)]
pub(crate) struct CachedResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) fingerprint: Fingerprint,
    expires: Instant,
    weight: u64,
}

#[derive(Debug, Clone, Copy)]
struct ByBytes;

impl Weighter<RecordId, Arc<CachedResponse>> for ByBytes {
    fn weight(&self, _key: &RecordId, value: &Arc<CachedResponse>) -> u64 {
        value.weight
    }
}

/// Bounded by total bytes; least recently used entries go first.
pub(crate) struct ResponseCache {
    entries: Cache<RecordId, Arc<CachedResponse>, ByBytes>,
}

/// Rough per-entry overhead beyond the body and headers.
const ENTRY_OVERHEAD: u64 = 128;

impl ResponseCache {
    pub(crate) fn new(max_bytes: u64) -> Self {
        // Sized for ~1 KiB responses; the weight bound is what holds.
        let estimated_items = usize::try_from(max_bytes / 1024)
            .unwrap_or(usize::MAX)
            .max(16);
        Self {
            entries: Cache::with_weighter(estimated_items, max_bytes, ByBytes),
        }
    }

    /// The live entry for `id`, if any.
    pub(crate) fn get(&self, id: RecordId) -> Option<Arc<CachedResponse>> {
        let entry = self.entries.get(&id)?;
        if entry.expires <= Instant::now() {
            self.entries.remove(&id);
            return None;
        }
        Some(entry)
    }

    /// Remembers a completed response for `ttl` (the record's remaining lifetime).
    pub(crate) fn insert(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        ttl: Duration,
    ) {
        let header_bytes: usize = headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        let weight = ENTRY_OVERHEAD + (body.len() + header_bytes) as u64;
        let entry = CachedResponse {
            status,
            headers,
            body,
            fingerprint,
            expires: Instant::now() + ttl,
            weight,
        };
        self.entries.insert(id, Arc::new(entry));
    }
}

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("entries", &self.entries.len())
            .field("weight", &self.entries.weight())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::key::IdempotencyKey;

    fn id(key: &str) -> RecordId {
        RecordId::new("", &IdempotencyKey::parse(key.as_bytes()).unwrap())
    }

    #[test]
    fn expired_entries_are_not_returned() {
        let cache = ResponseCache::new(1 << 20);
        let fp = Fingerprint([1; 32]);
        cache.insert(
            id("a"),
            fp,
            StatusCode::CREATED,
            HeaderMap::new(),
            Bytes::from_static(b"x"),
            Duration::ZERO,
        );
        assert!(cache.get(id("a")).is_none());
        cache.insert(
            id("b"),
            fp,
            StatusCode::CREATED,
            HeaderMap::new(),
            Bytes::from_static(b"y"),
            Duration::from_secs(60),
        );
        assert_eq!(cache.get(id("b")).unwrap().body, "y");
    }

    #[test]
    fn the_byte_bound_holds() {
        let cache = ResponseCache::new(64 * 1024);
        let body = Bytes::from(vec![0u8; 1024]);
        for i in 0..1000 {
            cache.insert(
                id(&format!("k{i}")),
                Fingerprint([0; 32]),
                StatusCode::OK,
                HeaderMap::new(),
                body.clone(),
                Duration::from_secs(60),
            );
        }
        assert!(cache.entries.weight() <= 64 * 1024);
        assert!(cache.entries.len() < 1000);
        assert!(cache.get(id("k999")).is_some(), "recent entries stay");
    }
}
