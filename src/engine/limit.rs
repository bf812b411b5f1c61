//! The hot-key limiter: at most `n` attempts per (scope, key) and second reach the
//! database.
//!
//! A client that retries one key in a tight loop would otherwise take a pooled connection
//! for every attempt (the claim, a replay or a 409) and starve every other key of the
//! pool. The limiter counts the attempts of each record id in fixed one-second windows,
//! and refuses the ones past `n` before anything is sent to PostgreSQL.
//!
//! Each key's counter is one `AtomicU64` packing the window (the high 32 bits: seconds
//! since the limiter was made) and the attempts counted in it (the low 32 bits), so an
//! attempt is one compare-and-swap and a refused attempt only a load. The counters live in
//! a bounded [`quick_cache`] cache: memory stays bounded however many distinct keys
//! arrive. Its eviction keeps entries that are used again and again (a hot key) and lets
//! one-off keys go first; a counter that is evicted anyway starts over, which can only let
//! more attempts through, never refuse one that was within the limit.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use quick_cache::sync::Cache;

use crate::engine::key::RecordId;

/// Counters kept at most, one per key seen recently (about 100 bytes each).
pub(crate) const TRACKED_KEYS: usize = 65_536;

/// Per-key attempt counters in one-second windows, bounded in memory.
pub(crate) struct AttemptLimiter {
    limit: u32,
    epoch: Instant,
    counters: Cache<RecordId, Arc<AtomicU64>>,
}

impl AttemptLimiter {
    /// At most `limit` attempts per key and second (a `limit` of 0 counts as 1), with
    /// counters for about `tracked_keys` keys.
    pub(crate) fn new(limit: u32, tracked_keys: usize) -> Self {
        Self {
            limit: limit.max(1),
            epoch: Instant::now(),
            counters: Cache::new(tracked_keys.max(1)),
        }
    }

    /// Attempts per key and second that are let through.
    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// Counts an attempt on `id`: `true` if it may go on to the database, `false` if the
    /// key already had its `limit` attempts in the current second.
    pub(crate) fn admit(&self, id: RecordId) -> bool {
        self.admit_in(id, self.window())
    }

    /// Whether `id` has used up this second's attempts, without counting one: lets a caller
    /// skip work (the Redis in-flight lock) that [`admit`](Self::admit) would refuse anyway.
    #[cfg(feature = "redis")]
    pub(crate) fn exhausted(&self, id: RecordId) -> bool {
        self.exhausted_in(id, self.window())
    }

    #[cfg(any(test, feature = "redis"))]
    fn exhausted_in(&self, id: RecordId, window: u32) -> bool {
        let Some(counter) = self.counters.get(&id) else {
            return false;
        };
        let (counted_window, count) = unpack(counter.load(Ordering::Acquire));
        (counted_window == window || is_later(counted_window, window)) && count >= self.limit
    }

    /// The current window: whole seconds since the limiter was made (wrapping after 136
    /// years, which the comparison in [`admit_in`](Self::admit_in) tolerates).
    fn window(&self) -> u32 {
        // Truncation intended: only the difference between nearby windows matters.
        self.epoch.elapsed().as_secs() as u32
    }

    /// [`admit`](Self::admit) in the given window.
    fn admit_in(&self, id: RecordId, window: u32) -> bool {
        let counter = match self.counters.get_or_insert_with(&id, || {
            Ok::<_, Infallible>(Arc::new(AtomicU64::new(pack(window, 0))))
        }) {
            Ok(counter) => counter,
            Err(never) => match never {},
        };
        let mut current = counter.load(Ordering::Acquire);
        loop {
            let (counted_window, count) = unpack(current);
            // A thread that read the clock just before another one moved the counter to the
            // next second counts in that newer window, rather than reset it to an old one.
            let window = if is_later(counted_window, window) {
                counted_window
            } else {
                window
            };
            let next = if counted_window != window {
                pack(window, 1)
            } else if count < self.limit {
                pack(window, count + 1)
            } else {
                return false;
            };
            match counter.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

impl fmt::Debug for AttemptLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptLimiter")
            .field("limit", &self.limit)
            .field("tracked", &self.counters.len())
            .field("capacity", &self.counters.capacity())
            .finish()
    }
}

fn pack(window: u32, count: u32) -> u64 {
    (u64::from(window) << 32) | u64::from(count)
}

fn unpack(value: u64) -> (u32, u32) {
    ((value >> 32) as u32, value as u32)
}

/// `a` is a later window than `b` (by less than half the wrapping range).
fn is_later(a: u32, b: u32) -> bool {
    let ahead = a.wrapping_sub(b);
    ahead != 0 && ahead < u32::MAX / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::key::IdempotencyKey;
    use std::sync::atomic::AtomicUsize;

    fn id(key: &str) -> RecordId {
        RecordId::new("", &IdempotencyKey::parse(key.as_bytes()).unwrap())
    }

    #[test]
    fn the_limit_holds_within_a_window_and_the_window_rolls_over() {
        let limiter = AttemptLimiter::new(3, 1024);
        let admitted = |window| {
            (0..10)
                .filter(|_| limiter.admit_in(id("a"), window))
                .count()
        };
        assert_eq!(admitted(7), 3);
        assert!(
            !limiter.admit_in(id("a"), 7),
            "still refused in the same second"
        );
        assert_eq!(admitted(8), 3, "the next second starts over");
        assert_eq!(admitted(20), 3, "so does a much later one");
    }

    #[test]
    fn exhausted_says_what_admit_would_answer_without_counting() {
        let limiter = AttemptLimiter::new(2, 1024);
        assert!(!limiter.exhausted_in(id("a"), 3), "a key never seen");
        assert!(limiter.admit_in(id("a"), 3));
        assert!(!limiter.exhausted_in(id("a"), 3));
        assert!(!limiter.exhausted_in(id("a"), 3), "asking counts nothing");
        assert!(limiter.admit_in(id("a"), 3));
        assert!(limiter.exhausted_in(id("a"), 3));
        assert!(!limiter.admit_in(id("a"), 3));
        assert!(
            !limiter.exhausted_in(id("a"), 4),
            "the next second starts over"
        );
        assert!(
            limiter.exhausted_in(id("a"), 2),
            "a late clock reading sees the newer window"
        );
    }

    #[test]
    fn keys_are_counted_apart() {
        let limiter = AttemptLimiter::new(2, 1024);
        assert!(limiter.admit_in(id("a"), 0));
        assert!(limiter.admit_in(id("a"), 0));
        assert!(!limiter.admit_in(id("a"), 0));
        assert!(
            limiter.admit_in(id("b"), 0),
            "another key has its own count"
        );
        let scoped = RecordId::new("tenant-2", &IdempotencyKey::parse(b"a").unwrap());
        assert!(
            limiter.admit_in(scoped, 0),
            "so has the same key in another scope"
        );
    }

    #[test]
    fn a_late_clock_reading_does_not_reset_a_newer_window() {
        let limiter = AttemptLimiter::new(2, 1024);
        assert!(limiter.admit_in(id("a"), 5));
        assert!(limiter.admit_in(id("a"), 5));
        // A thread that read second 4 arrives after the counter moved to second 5.
        assert!(!limiter.admit_in(id("a"), 4));
        // Across the wrap of the window number, later is still later.
        assert!(limiter.admit_in(id("b"), u32::MAX));
        assert!(limiter.admit_in(id("b"), u32::MAX));
        assert!(!limiter.admit_in(id("b"), u32::MAX));
        assert!(limiter.admit_in(id("b"), 0), "second 0 follows u32::MAX");
    }

    #[test]
    fn zero_counts_as_one() {
        let limiter = AttemptLimiter::new(0, 16);
        assert_eq!(limiter.limit(), 1);
        assert!(limiter.admit_in(id("a"), 0));
        assert!(!limiter.admit_in(id("a"), 0));
    }

    #[test]
    fn the_real_clock_admits_the_limit_in_the_current_second() {
        let limiter = AttemptLimiter::new(5, 16);
        let before = limiter.window();
        let admitted = (0..50).filter(|_| limiter.admit(id("a"))).count();
        if limiter.window() == before {
            assert_eq!(admitted, 5);
        } else {
            // The second changed during the loop: one more window was open.
            assert!((5..=10).contains(&admitted), "{admitted}");
        }
    }

    /// Real threads race on one key: exactly `limit` attempts get through per window, and
    /// the next window admits `limit` again.
    #[test]
    fn the_bound_holds_under_concurrency() {
        let limiter = Arc::new(AttemptLimiter::new(100, 1024));
        for window in [1, 2] {
            let admitted = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (limiter, admitted) = (Arc::clone(&limiter), Arc::clone(&admitted));
                    std::thread::spawn(move || {
                        for _ in 0..5_000 {
                            if limiter.admit_in(id("hot"), window) {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            assert_eq!(admitted.load(Ordering::Relaxed), 100, "window {window}");
        }
    }

    /// Fresh keys in first contact race on their counter's creation: one counter per key,
    /// so the bound still holds.
    #[test]
    fn concurrent_first_attempts_share_one_counter() {
        let limiter = Arc::new(AttemptLimiter::new(3, 4096));
        let admitted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (limiter, admitted) = (Arc::clone(&limiter), Arc::clone(&admitted));
                std::thread::spawn(move || {
                    for key in 0..200 {
                        if limiter.admit_in(id(&format!("k{key}")), 0) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 200 * 3);
    }

    /// A flood of one-off keys stays within the capacity, and a key used all along keeps its
    /// counter (and so its limit) through it.
    #[test]
    fn memory_stays_bounded_and_a_hot_key_survives_a_flood() {
        let limiter = AttemptLimiter::new(2, 1000);
        let capacity = limiter.counters.capacity();
        assert!(capacity <= 1000 + 64, "capacity {capacity}");
        assert!(limiter.admit_in(id("hot"), 0));
        assert!(limiter.admit_in(id("hot"), 0));
        for key in 0..100_000 {
            limiter.admit_in(id(&format!("one-off-{key}")), 0);
            if key % 100 == 0 {
                assert!(!limiter.admit_in(id("hot"), 0), "after {key} one-off keys");
            }
        }
        let tracked = limiter.counters.len() as u64;
        assert!(
            tracked <= capacity,
            "{tracked} counters for a capacity of {capacity}"
        );
        assert!(!limiter.admit_in(id("hot"), 0));
    }
}
