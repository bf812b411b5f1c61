//! The Inbox message-id check accepts exactly 1-255 bytes of 0x21..=0x7e.
//! The property lives in `axum_idempotency::__fuzz::message_id`, shared with fuzz/tests/corpus.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axum_idempotency::__fuzz::message_id(data));
