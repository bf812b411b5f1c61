//! Stored bodies: plaintext passes through, arbitrary bytes never open, seal -> open round-trips.
//! The property lives in `axum_idempotency::__fuzz::body`, shared with fuzz/tests/corpus.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axum_idempotency::__fuzz::body(data));
