//! Entry points for the fuzz targets under `fuzz/` and for the corpus replay
//! (`fuzz/tests/corpus.rs`).
//!
//! **Not public API.** This module exists only when the crate is compiled with
//! `--cfg fuzzing` (which `cargo fuzz` and `cargo afl` set), never through a cargo feature;
//! anything in it may change or disappear in any release.
//!
//! Each function takes arbitrary bytes, runs one parser or codec of the engine on them and
//! checks a property, panicking when it does not hold. The `cargo fuzz` targets call them
//! from `fuzz_target!`, and `fuzz/tests/corpus.rs` replays the committed corpora
//! (`fuzz/corpus/<target>/`) through the same functions on stable Rust.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use serde_json::Value;

use crate::engine::crypto::{EncryptionError, open_body, seal_body};
use crate::engine::fingerprint::{DEFAULT_MAX_JSON_DEPTH, Fingerprinter, parse_pointer};
use crate::engine::key::model::{key as key_model, sf_string};
use crate::engine::key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
use crate::engine::key::{RecordId, validate_message_id};
use crate::engine::record::{decode_headers, encode_headers};

/// One target's property check: panics when the property does not hold for the input.
pub type Check = fn(&[u8]);

/// Every target, by name: the name of its file under `fuzz/fuzz_targets/` and of its corpus
/// directory under `fuzz/corpus/`.
pub const TARGETS: &[(&str, Check)] = &[
    ("key", key),
    ("fingerprint", fingerprint),
    ("headers", headers),
    ("body", body),
    ("message_id", message_id),
];

/// `IdempotencyKey::parse` and `from_header` accept exactly the documented language (a bare
/// token, or a Structured Field string, of 1–255 printable characters), agree with each
/// other, and every accepted key parses back to itself when sent quoted (and bare, where a
/// bare form exists).
pub fn key(data: &[u8]) {
    let parsed = IdempotencyKey::parse(data);
    assert_eq!(
        parsed.as_ref().ok().map(IdempotencyKey::as_str),
        key_model(data).as_deref(),
        "{data:?} parsed to {parsed:?}"
    );
    if let Ok(value) = HeaderValue::from_bytes(data) {
        assert_eq!(IdempotencyKey::from_header(&value), parsed, "{data:?}");
    }
    let Ok(key) = parsed else {
        return;
    };
    let text = key.as_str();
    assert!((1..=MAX_KEY_LEN).contains(&text.len()), "{text:?}");
    assert!(text.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{text:?}");
    let quoted = sf_string(text);
    assert_eq!(
        IdempotencyKey::parse(quoted.as_bytes()).as_ref(),
        Ok(&key),
        "{quoted:?}"
    );
    let bare = IdempotencyKey::parse(text.as_bytes());
    if text.contains([' ', '"']) {
        // No bare form: the bytes are refused, or (`"a"`) read as the quoted form of
        // another key.
        assert_ne!(bare.as_ref(), Ok(&key), "{text:?} was accepted bare");
    } else {
        assert_eq!(bare.as_ref(), Ok(&key), "{text:?}");
    }
}

/// The fingerprint of a JSON body never panics and is deterministic. A valid JSON body has a
/// canonical form that is a fixed point (canonicalising it again changes nothing) with the
/// body's fingerprint, and every re-serialisation of the same document (compact, pretty,
/// members in another order) has that fingerprint too; a field named by an ignored JSON
/// Pointer does not count. The parse agrees with serde_json's (up to float rounding). Invalid
/// JSON, and JSON nested deeper than the bound, is hashed byte for byte, exactly as a body
/// that is not JSON.
pub fn fingerprint(data: &[u8]) {
    let fingerprinter = Fingerprinter::default();
    let json = parts("application/json");
    let first = fingerprinter.compute(&json, data);
    assert_eq!(
        first,
        fingerprinter.compute(&json, data),
        "not deterministic"
    );
    // The content type is not among the fingerprinted headers: a body that is not
    // canonicalised hashes the same under either media type.
    let as_bytes = fingerprinter.compute(&parts("text/plain"), data);
    let Some(value) = serde_json::from_slice::<Value>(data).ok() else {
        assert_eq!(first, as_bytes, "invalid JSON was not hashed as bytes");
        return;
    };
    if nesting(&value) > DEFAULT_MAX_JSON_DEPTH {
        assert_eq!(first, as_bytes, "over-deep JSON was not hashed as bytes");
        return;
    }
    assert_ne!(first, as_bytes, "JSON was hashed as bytes");
    let canonical = fingerprinter
        .canonical_json(&json, data)
        .expect("valid JSON has a canonical form");
    assert_eq!(
        fingerprinter.canonical_json(&json, &canonical).as_deref(),
        Some(&canonical[..]),
        "canonical form {:?} is not a fixed point",
        String::from_utf8_lossy(&canonical)
    );
    assert_eq!(first, fingerprinter.compute(&json, &canonical));
    for (how, text) in [
        (
            "compact",
            serde_json::to_vec(&value).expect("values serialise"),
        ),
        (
            "pretty",
            serde_json::to_vec_pretty(&value).expect("values serialise"),
        ),
        ("reversed", reversed_members(&value)),
    ] {
        assert_eq!(
            first,
            fingerprinter.compute(&json, &text),
            "{how} re-serialisation {:?} of {:?}",
            String::from_utf8_lossy(&text),
            String::from_utf8_lossy(data)
        );
    }
    // Ignoring a top-level field is the same as leaving it out.
    if let Value::Object(map) = &value {
        if let Some(name) = map.keys().next() {
            let pointer = format!("/{}", name.replace('~', "~0").replace('/', "~1"));
            let ignoring = Fingerprinter {
                ignored: vec![parse_pointer(&pointer).expect("starts with /")],
                ..Fingerprinter::default()
            };
            let mut without = map.clone();
            without.remove(name);
            let without = serde_json::to_vec(&without).expect("values serialise");
            assert_eq!(
                ignoring.compute(&json, data),
                fingerprinter.compute(&json, &without),
                "ignoring {pointer:?} in {data:?}"
            );
        }
    }
}

/// Decoding stored headers never panics and stops at the first damaged entry; what it
/// decodes re-encodes into at most as many bytes as it read and decodes back to the same
/// headers; an encoding followed by anything decodes to its headers and then the rest's.
pub fn headers(data: &[u8]) {
    let decoded = decode_headers(data);
    let encoded = encode_headers(decoded.iter());
    assert!(encoded.len() <= data.len(), "decoding invented bytes");
    assert_eq!(decode_headers(&encoded), decoded, "round trip of {data:?}");
    let mut joined = encoded;
    joined.extend_from_slice(data);
    let mut expected: HeaderMap = decoded.clone();
    for (name, value) in &decoded {
        expected.append(name.clone(), value.clone());
    }
    assert_eq!(
        decode_headers(&joined),
        expected,
        "concatenation of {data:?}"
    );
}

/// Stored bodies: a plaintext body (no key id) is returned as stored; arbitrary bytes under a
/// key id never panic and never open (`UnknownKey` for an id not held, `Corrupt` otherwise);
/// with the `encryption` feature, seal → open returns the body, also after a rotation, and a
/// sealed body moved to another record, truncated or with one bit flipped does not open, nor
/// does an inbox payload sealed with the same keys.
///
/// Input layout: the first two bytes are the stored key id (big-endian `i16`), the rest the
/// stored (or to-be-sealed) bytes.
pub fn body(data: &[u8]) {
    let (key_id, stored) = match data {
        [high, low, rest @ ..] => (i16::from_be_bytes([*high, *low]), rest),
        _ => (1, data),
    };
    let record = RecordId::from_parts("fuzz", "body");
    let bytes = Bytes::copy_from_slice(stored);
    assert_eq!(
        open_body(None, record, None, bytes.clone()).as_ref(),
        Ok(&bytes)
    );
    let plain = seal_body(None, record, stored).expect("plaintext never fails");
    assert_eq!((plain.key_id, &*plain.bytes), (None, stored));
    assert_eq!(
        open_body(None, record, Some(key_id), bytes.clone()),
        Err(EncryptionError::UnknownKey(key_id))
    );
    #[cfg(feature = "encryption")]
    sealed_body(data, key_id, stored, record);
}

#[cfg(feature = "encryption")]
fn sealed_body(data: &[u8], key_id: i16, stored: &[u8], record: RecordId) {
    use crate::engine::crypto::BodyKeys;
    use crate::engine::crypto::seal_payload;

    let keys = BodyKeys::new(1, [0x11; 32]).with_old_key(2, [0x22; 32]);
    let bytes = Bytes::copy_from_slice(stored);
    assert_eq!(
        open_body(Some(&keys), record, None, bytes.clone()).as_ref(),
        Ok(&bytes)
    );
    let expected = if key_id == 1 || key_id == 2 {
        EncryptionError::Corrupt
    } else {
        EncryptionError::UnknownKey(key_id)
    };
    assert_eq!(
        open_body(Some(&keys), record, Some(key_id), bytes),
        Err(expected),
        "arbitrary bytes opened"
    );

    let sealed = seal_body(Some(&keys), record, stored).expect("small bodies seal");
    if stored.is_empty() {
        assert_eq!((sealed.key_id, sealed.bytes.len()), (None, 0));
        return;
    }
    assert_eq!(sealed.key_id, Some(1));
    // Version, key id, nonce, ciphertext, tag.
    assert_eq!(sealed.bytes.len(), 2 + 12 + stored.len() + 16);
    let sealed_bytes = Bytes::from(sealed.bytes.into_owned());
    let open = |keys: &BodyKeys, record: RecordId, bytes: Bytes| {
        open_body(Some(keys), record, Some(1), bytes)
    };
    assert_eq!(
        open(&keys, record, sealed_bytes.clone()).as_deref(),
        Ok(stored)
    );
    let rotated = BodyKeys::new(3, [0x33; 32]).with_old_key(1, [0x11; 32]);
    assert_eq!(
        open(&rotated, record, sealed_bytes.clone()).as_deref(),
        Ok(stored)
    );
    let elsewhere = RecordId::from_parts("fuzz", "other");
    assert_eq!(
        open(&keys, elsewhere, sealed_bytes.clone()),
        Err(EncryptionError::Corrupt)
    );
    let pick = data.iter().fold(0usize, |acc, &b| {
        acc.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    let cut = pick % sealed_bytes.len();
    assert_eq!(
        open(&keys, record, sealed_bytes.slice(..cut)),
        Err(EncryptionError::Corrupt)
    );
    let mut flipped = sealed_bytes.to_vec();
    flipped[cut] ^= 1 << (pick % 8);
    assert_eq!(
        open(&keys, record, Bytes::from(flipped)),
        Err(EncryptionError::Corrupt)
    );
    let payload = seal_payload(Some(&keys), "fuzz", "body", stored).expect("small payloads seal");
    assert_eq!(
        open(&keys, record, Bytes::from(payload.bytes.into_owned())),
        Err(EncryptionError::Corrupt)
    );
}

/// The Inbox's message-id check accepts exactly 1–255 bytes of `0x21..=0x7e` and says why
/// it refuses anything else; an accepted id without `"` is also a valid bare
/// `Idempotency-Key`, naming the same string. Bytes that are not UTF-8 are checked as their
/// lossy decoding (so U+FFFD, which must be refused, appears).
pub fn message_id(data: &[u8]) {
    let id = String::from_utf8_lossy(data);
    let result = validate_message_id(&id);
    let valid = (1..=MAX_KEY_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic());
    match &result {
        Ok(()) => assert!(valid, "{id:?} was accepted"),
        Err(KeyError::Empty) => assert!(id.is_empty()),
        Err(KeyError::TooLong { len }) => assert!(*len == id.len() && *len > MAX_KEY_LEN),
        Err(KeyError::InvalidCharacter { position }) => {
            assert!(!valid && id.len() <= MAX_KEY_LEN, "{id:?}");
            assert!(!id.as_bytes()[*position].is_ascii_graphic(), "{id:?}");
            assert!(id.as_bytes()[..*position].iter().all(u8::is_ascii_graphic));
        }
        Err(other) => panic!("{id:?}: unexpected {other:?}"),
    }
    assert_eq!(result.is_ok(), valid, "{id:?}: {result:?}");
    if valid && !id.contains('"') {
        let key = IdempotencyKey::parse(id.as_bytes()).expect("a valid id is a bare key");
        assert_eq!(key.as_str(), id);
    }
}

fn parts(content_type: &str) -> http::request::Parts {
    Request::post("/orders?fuzz=1")
        .header(http::header::CONTENT_TYPE, content_type)
        .body(())
        .expect("a valid request")
        .into_parts()
        .0
}

/// Depth of the deepest non-empty array or object (the root is at depth 1; empty
/// containers and scalars add nothing).
fn nesting(value: &Value) -> usize {
    match value {
        Value::Array(items) if !items.is_empty() => {
            1 + items.iter().map(nesting).max().unwrap_or(0)
        }
        Value::Object(map) if !map.is_empty() => 1 + map.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

/// The document with the members of every object written in reverse key order and with
/// spaces around every token: what another client could send for the same value.
fn reversed_members(value: &Value) -> Vec<u8> {
    fn write(out: &mut Vec<u8>, value: &Value) {
        match value {
            Value::Object(map) => {
                out.extend_from_slice(b"{ ");
                for (i, (key, child)) in map.iter().rev().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(b" ,\n");
                    }
                    serde_json::to_writer(&mut *out, key).expect("strings serialise");
                    out.extend_from_slice(b" :\t");
                    write(out, child);
                }
                out.extend_from_slice(b" }");
            }
            Value::Array(items) => {
                out.extend_from_slice(b"[ ");
                for (i, child) in items.iter().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(b" , ");
                    }
                    write(out, child);
                }
                out.extend_from_slice(b" ]");
            }
            scalar => serde_json::to_writer(&mut *out, scalar).expect("scalars serialise"),
        }
    }
    let mut out = Vec::new();
    write(&mut out, value);
    out
}
