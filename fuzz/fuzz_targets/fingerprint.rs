//! The JSON canonicaliser: fingerprints are stable under re-serialisation; never panics.
//! The property lives in `axum_idempotency::__fuzz::fingerprint`, shared with fuzz/tests/corpus.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axum_idempotency::__fuzz::fingerprint(data));
