//! IdempotencyKey::parse and from_header accept exactly the documented language and round-trip.
//! The property lives in `axum_idempotency::__fuzz::key`, shared with fuzz/tests/corpus.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axum_idempotency::__fuzz::key(data));
