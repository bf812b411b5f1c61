//! The stored-header codec: decode never panics; encode -> decode round-trips.
//! The property lives in `axum_idempotency::__fuzz::headers`, shared with fuzz/tests/corpus.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axum_idempotency::__fuzz::headers(data));
