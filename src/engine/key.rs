//! The `Idempotency-Key` header: parsing, validation and the record id derived from it.
//!
//! The header follows draft-ietf-httpapi-idempotency-key-header: its value is a Structured
//! Field string (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`). Many clients (Stripe-style SDKs)
//! send the bare value instead, so both forms are accepted and name the same key.

use std::fmt;

use http::HeaderValue;
use sha2::{Digest, Sha256};

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The response header of a lease-mode replay whose body was too large to store
/// ([`IdempotencyLayer::response_limit`](crate::IdempotencyLayer::response_limit)): the
/// first answer went out whole; a repeat gets its status and headers, an empty body and
/// this header, `true`.
pub const BODY_OMITTED_HEADER: &str = "idempotent-body-omitted";

/// The longest key accepted, in characters after unquoting.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1–255 printable ASCII characters.
///
/// The quoted form `"abc"` and the bare form `abc` parse to the same key; parameters after
/// the quoted form (`"abc";v=1`) are validated and do not change it.
///
/// ```
/// use axum_idempotency::IdempotencyKey;
///
/// let quoted = IdempotencyKey::parse(br#""order-42""#).unwrap();
/// let bare = IdempotencyKey::parse(b"order-42").unwrap();
/// assert_eq!(quoted, bare);
/// assert_eq!(bare.as_str(), "order-42");
/// assert_eq!(IdempotencyKey::parse(br#""order-42";v=1"#).unwrap(), bare);
/// assert!(IdempotencyKey::parse(br#""order-42";V=1"#).is_err()); // keys are lowercase
///
/// assert!(IdempotencyKey::parse(b"").is_err());
/// assert!(IdempotencyKey::parse("caf\u{e9}".as_bytes()).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Box<str>);

impl IdempotencyKey {
    /// Parses a header value: a Structured Field string, with or without parameters, or a
    /// bare token.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let key = match raw {
            [b'"', rest @ ..] => {
                let (inner, parameters) = split_sf_string(rest)?;
                let key = unquote(inner)?;
                check_parameters(parameters)?;
                key
            }
            _ => bare(raw)?,
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        Ok(Self(key.into_boxed_str()))
    }

    /// Parses the value of an `Idempotency-Key` header.
    pub fn from_header(value: &HeaderValue) -> Result<Self, KeyError> {
        Self::parse(value.as_bytes())
    }

    /// The key as the client meant it (unquoted).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Keys can be secrets the client reuses: `Debug` shows a short digest, never the key.
impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = Sha256::digest(self.0.as_bytes());
        write!(f, "IdempotencyKey(sha256:{})", hex(&digest[..6]))
    }
}

fn bare(raw: &[u8]) -> Result<String, KeyError> {
    // Refuse over-long input before looking at it byte by byte.
    if raw.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: raw.len() });
    }
    for (position, &byte) in raw.iter().enumerate() {
        if byte == b' ' {
            return Err(KeyError::SpaceInBareKey { position });
        }
        if !(0x21..=0x7e).contains(&byte) {
            return Err(KeyError::InvalidCharacter { position });
        }
        if byte == b'"' {
            return Err(KeyError::BrokenQuoting);
        }
    }
    // Every byte is ASCII, so this cannot fail.
    String::from_utf8(raw.to_vec()).map_err(|_| KeyError::InvalidCharacter { position: 0 })
}

fn unquote(inner: &[u8]) -> Result<String, KeyError> {
    // Escapes at most halve the length; anything longer than this cannot fit.
    if inner.len() > 2 * MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: inner.len() });
    }
    let mut out = String::with_capacity(inner.len());
    let mut bytes = inner.iter().enumerate();
    while let Some((position, &byte)) = bytes.next() {
        match byte {
            b'\\' => match bytes.next() {
                Some((_, &escaped @ (b'"' | b'\\'))) => out.push(char::from(escaped)),
                _ => return Err(KeyError::BrokenQuoting),
            },
            b'"' => return Err(KeyError::BrokenQuoting),
            // sf-string: printable ASCII including space.
            0x20..=0x7e => out.push(char::from(byte)),
            _ => {
                return Err(KeyError::InvalidCharacter {
                    position: position + 1,
                });
            }
        }
    }
    Ok(out)
}

/// Splits what follows a Structured Field string's opening quote at its closing quote:
/// the string's content (escapes still in it) and what follows the quote.
fn split_sf_string(rest: &[u8]) -> Result<(&[u8], &[u8]), KeyError> {
    let mut at = 0;
    while at < rest.len() {
        match rest[at] {
            b'\\' => at += 2,
            b'"' => return Ok((&rest[..at], &rest[at + 1..])),
            _ => at += 1,
        }
    }
    Err(KeyError::BrokenQuoting)
}

/// Checks the parameters after an Item's bare item (RFC 8941 §3.1.2): each
/// `;` *SP key [ `=` bare-item ], keys `lcalpha / "*"` then `lcalpha / DIGIT / _ - . *`.
fn check_parameters(mut rest: &[u8]) -> Result<(), KeyError> {
    let malformed = || KeyError::MalformedParameters;
    while let [b';', after @ ..] = rest {
        let spaces = after.iter().take_while(|&&b| b == b' ').count();
        let name = &after[spaces..];
        let Some(&(b'a'..=b'z' | b'*')) = name.first() else {
            return Err(malformed());
        };
        let len = 1 + name[1..]
            .iter()
            .take_while(|&&b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'))
            .count();
        rest = &name[len..];
        if let [b'=', value @ ..] = rest {
            rest = skip_bare_item(value).ok_or_else(malformed)?;
        }
    }
    if rest.is_empty() {
        Ok(())
    } else {
        Err(malformed())
    }
}

/// What follows a parameter's value (RFC 8941 §4.2.3.1: an integer, a decimal, a string, a
/// token, a byte sequence or a boolean), or `None` if none starts `value`.
fn skip_bare_item(value: &[u8]) -> Option<&[u8]> {
    let digits = |bytes: &[u8]| bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    match value.first()? {
        b'-' | b'0'..=b'9' => {
            let sign = usize::from(value[0] == b'-');
            let whole = digits(&value[sign..]);
            let mut end = sign + whole;
            if whole == 0 {
                return None;
            }
            if value.get(end) == Some(&b'.') {
                let fraction = digits(&value[end + 1..]);
                if whole > 12 || !(1..=3).contains(&fraction) {
                    return None;
                }
                end += 1 + fraction;
            } else if whole > 15 {
                return None;
            }
            Some(&value[end..])
        }
        b'"' => {
            // A string of any length: the key's length limit is the key's alone.
            let (inner, after) = split_sf_string(&value[1..]).ok()?;
            let mut bytes = inner.iter();
            while let Some(&byte) = bytes.next() {
                match byte {
                    b'\\' => match bytes.next() {
                        Some(b'"' | b'\\') => {}
                        _ => return None,
                    },
                    0x20..=0x7e => {}
                    _ => return None,
                }
            }
            Some(after)
        }
        b'?' => match value.get(1)? {
            b'0' | b'1' => Some(&value[2..]),
            _ => None,
        },
        b':' => {
            let len = value[1..]
                .iter()
                .take_while(|&&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
                .count();
            (value.get(1 + len) == Some(&b':')).then(|| &value[2 + len..])
        }
        b'a'..=b'z' | b'A'..=b'Z' | b'*' => {
            let len = 1 + value[1..]
                .iter()
                .take_while(|&&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
                .count();
            Some(&value[len..])
        }
        _ => None,
    }
}

/// Why an `Idempotency-Key` value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty (`""` or an empty header).
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] characters.
    TooLong {
        /// Length seen, in bytes.
        len: usize,
    },
    /// A byte outside printable ASCII (a control character, or not ASCII).
    InvalidCharacter {
        /// Byte offset in the header value.
        position: usize,
    },
    /// A space in a bare (unquoted) key: a key with spaces must be sent quoted,
    /// `Idempotency-Key: "order 42"`.
    SpaceInBareKey {
        /// Byte offset in the header value.
        position: usize,
    },
    /// A quote that does not open and close a Structured Field string, or a bad escape.
    BrokenQuoting,
    /// What follows the quoted key is not a list of Structured Field parameters
    /// (`;name=value`, RFC 8941).
    MalformedParameters,
    /// The request carries the header more than once.
    Repeated,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("the Idempotency-Key is empty"),
            Self::TooLong { len } => write!(
                f,
                "the Idempotency-Key is {len} bytes long; at most {MAX_KEY_LEN} characters are allowed"
            ),
            Self::InvalidCharacter { position } => write!(
                f,
                "the Idempotency-Key has a character outside printable ASCII at byte {position}"
            ),
            Self::SpaceInBareKey { position } => write!(
                f,
                "a bare Idempotency-Key cannot contain spaces (byte {position}); \
                 quote it: \"your key\""
            ),
            Self::BrokenQuoting => f.write_str(
                "the Idempotency-Key is neither a bare token nor a well-formed quoted string",
            ),
            Self::MalformedParameters => f.write_str(
                "what follows the quoted Idempotency-Key is not a list of parameters \
                 (;name or ;name=value, names in lowercase, RFC 8941)",
            ),
            Self::Repeated => f.write_str("the Idempotency-Key header is sent more than once"),
        }
    }
}

impl std::error::Error for KeyError {}

/// The primary key of a stored record: the first 16 bytes of SHA-256 over (scope, key).
///
/// Sent to PostgreSQL as a `uuid` (16 bytes, half the index of a 32-byte `bytea`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordId([u8; 16]);

impl RecordId {
    pub(crate) fn new(scope: &str, key: &IdempotencyKey) -> Self {
        Self::from_parts(scope, key.as_str())
    }

    /// The id of (scope, key); the inbox uses (consumer group, message id).
    pub(crate) fn from_parts(scope: &str, key: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"axum-idempotency/v1\0");
        hasher.update((scope.len() as u64).to_be_bytes());
        hasher.update(scope.as_bytes());
        hasher.update(key.as_bytes());
        let digest = hasher.finalize();
        let mut id = [0; 16];
        id.copy_from_slice(&digest[..16]);
        Self(id)
    }

    /// All 16 bytes as 32 hex digits, for keys kept outside PostgreSQL and for the
    /// associated data of sealed bodies (so `encryption` needs it without `redis`).
    #[cfg(any(feature = "redis", feature = "encryption"))]
    pub(crate) fn to_hex(self) -> String {
        hex(&self.0)
    }

    /// The id as a database returned it: 16 bytes (a damaged row's shorter or longer
    /// value is padded or cut, and then matches no record).
    pub(crate) fn from_slice(bytes: &[u8]) -> Self {
        let mut id = [0; 16];
        let n = bytes.len().min(16);
        id[..n].copy_from_slice(&bytes[..n]);
        Self(id)
    }

    /// The id as it is shown: 32 hex digits.
    pub(crate) fn from_hex(hex: &str) -> Option<Self> {
        let digits: Vec<u32> = hex.chars().map(|c| c.to_digit(16)).collect::<Option<_>>()?;
        if digits.len() != 32 {
            return None;
        }
        let mut id = [0; 16];
        for (byte, pair) in id.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = u8::try_from(pair[0] * 16 + pair[1]).ok()?;
        }
        Some(Self(id))
    }

    /// The 16 bytes, as bound to a `uuid` parameter.
    pub(crate) fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The key of the transaction-scoped advisory lock that serialises requests for this record.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    pub(crate) fn lock_key(self) -> i64 {
        let mut high = [0; 8];
        high.copy_from_slice(&self.0[..8]);
        i64::from_be_bytes(high)
    }
}

/// Logs and spans show this, never the raw key.
impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0[..8]))
    }
}

impl fmt::Debug for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordId({})", hex(&self.0))
    }
}

/// Message ids follow the rules of HTTP keys: 1–255 printable ASCII characters, no spaces.
pub(crate) fn validate_message_id(id: &str) -> Result<(), KeyError> {
    if id.is_empty() {
        return Err(KeyError::Empty);
    }
    if id.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong { len: id.len() });
    }
    match id.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
        Some(position) => Err(KeyError::InvalidCharacter { position }),
        None => Ok(()),
    }
}

/// A stable key for one downstream effect of the operation `id`: 32 hex characters of
/// SHA-256 over (id, label).
pub(crate) fn derive_key(id: RecordId, label: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"axum-idempotency/derive/v1\0");
    hasher.update(id.0);
    hasher.update(label.as_bytes());
    hex(&hasher.finalize()[..16])
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The key language as the documentation states it, written independently of the parser:
/// the property tests and the fuzz target hold the parser to it.
#[cfg(any(test, fuzzing))]
pub(crate) mod model;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_quoted_and_bare_forms() {
        for (raw, key) in [
            (&br#""abc""#[..], "abc"),
            (b"abc", "abc"),
            (br#""a b""#, "a b"),
            (br#""say \"hi\" \\o/""#, r#"say "hi" \o/"#),
            (
                b"8e03978e-40d5-43e8-bc93-6894a57f9324",
                "8e03978e-40d5-43e8-bc93-6894a57f9324",
            ),
        ] {
            assert_eq!(IdempotencyKey::parse(raw).unwrap().as_str(), key, "{raw:?}");
        }
    }

    #[test]
    fn a_space_in_a_bare_key_says_to_quote_it() {
        let error = IdempotencyKey::parse(b"order 42").unwrap_err();
        assert_eq!(error, KeyError::SpaceInBareKey { position: 5 });
        assert!(error.to_string().contains("quote it"), "{error}");
        assert_eq!(
            IdempotencyKey::parse(br#""order 42""#).unwrap().as_str(),
            "order 42"
        );
    }

    #[test]
    fn rejects_malformed_keys() {
        let long = "k".repeat(256);
        let long_quoted = format!("\"{long}\"");
        for raw in [
            &b""[..],
            b"\"\"",
            long.as_bytes(),
            long_quoted.as_bytes(),
            b"a b",
            b"tab\there",
            b"nul\0",
            b"\x7f",
            "caf\u{e9}".as_bytes(),
            b"\xff\xfe",
            b"\"unterminated",
            b"\"",
            b"un\"quoted",
            b"\"bad\\escape\"",
            b"\"trailing\\\"",
            b"\"inner\"quote\"",
        ] {
            assert!(IdempotencyKey::parse(raw).is_err(), "{raw:?} was accepted");
        }
    }

    #[test]
    fn length_limit_counts_unquoted_characters() {
        let max = "k".repeat(MAX_KEY_LEN);
        assert!(IdempotencyKey::parse(max.as_bytes()).is_ok());
        assert!(IdempotencyKey::parse(format!("\"{max}\"").as_bytes()).is_ok());
        let escaped = "\\\\".repeat(MAX_KEY_LEN);
        assert_eq!(
            IdempotencyKey::parse(format!("\"{escaped}\"").as_bytes())
                .unwrap()
                .as_str()
                .len(),
            MAX_KEY_LEN
        );
    }

    #[test]
    fn parameters_are_checked_and_ignored() {
        let long = format!(r#""k";note="{}";v=1"#, "x".repeat(4 * MAX_KEY_LEN));
        for raw in [
            &br#""k";v=1"#[..],
            br#""k"; a; b=?0;c=-1.5;d=tok/en:1;e=:aGk=:;f="a;\"b\"""#,
            long.as_bytes(),
        ] {
            assert_eq!(IdempotencyKey::parse(raw).unwrap().as_str(), "k", "{raw:?}");
        }
        for raw in [
            &br#""k";V=1"#[..],
            br#""k" ;v=1"#,
            br#""k";v="#,
            br#""k";v=1.2345"#,
            br#""k";v="open"#,
            br#""k"v"#,
            br#""k";;"#,
        ] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(KeyError::MalformedParameters),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn debug_hides_the_key() {
        let key = IdempotencyKey::parse(b"secret-key").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
    }

    #[test]
    fn record_id_separates_scopes() {
        let key = IdempotencyKey::parse(b"k1").unwrap();
        assert_ne!(RecordId::new("alice", &key), RecordId::new("bob", &key));
        assert_eq!(RecordId::new("alice", &key), RecordId::new("alice", &key));
        // The length prefix keeps ("ab", "c") apart from ("a", "bc").
        let c = IdempotencyKey::parse(b"c").unwrap();
        let bc = IdempotencyKey::parse(b"bc").unwrap();
        assert_ne!(RecordId::new("ab", &c), RecordId::new("a", &bc));
    }
    mod properties {
        use super::*;
        use crate::engine::key::model::{key as model, sf_string};
        use crate::engine::testing::Gen;

        /// Bytes biased towards the interesting ones: quotes, backslashes, space, the
        /// edges of printable ASCII, and anything else.
        fn hostile_byte(g: &mut Gen) -> u8 {
            match g.weighted(&[4, 1, 1, 1, 1, 1]) {
                0 => g.u8_in(0x21..=0x7e),
                1 => b'"',
                2 => b'\\',
                3 => b' ',
                4 => *g.pick(&[0x00, 0x09, 0x1f, 0x7f, 0x80, 0xc3, 0xe9, 0xff]),
                _ => g.u8_in(0..=0xff),
            }
        }

        /// The bytes parameters are made of, and a few that break them.
        fn parameter_byte(g: &mut Gen) -> u8 {
            match g.weighted(&[3, 3, 2, 6, 3, 1]) {
                0 => b';',
                1 => b'=',
                2 => b' ',
                3 => g.u8_in(b'a'..=b'z'),
                4 => g.u8_in(b'0'..=b'9'),
                _ => *g.pick(b"\"?:-.*_/+AZ\\\t"),
            }
        }

        fn hostile_bytes(g: &mut Gen) -> Vec<u8> {
            match g.below(5) {
                0 => g.vec(0..600, |g| g.u8_in(0..=0xff)),
                1 => g.vec(0..300, hostile_byte),
                // Wrapped in quotes, so the quoted branch is exercised often.
                2 => {
                    let mut raw = vec![b'"'];
                    raw.extend(g.vec(0..300, hostile_byte));
                    raw.push(b'"');
                    raw
                }
                // A quoted key and parameters, well-formed or nearly.
                3 => {
                    let key = g.vec(1..20, |g| g.u8_in(0x21..=0x7e));
                    let params = g.vec(0..40, parameter_byte);
                    let mut raw: Vec<u8> = format!(
                        "\"{}\"",
                        String::from_utf8(key)
                            .unwrap()
                            .replace('\\', "\\\\")
                            .replace('"', "\\\"")
                    )
                    .into_bytes();
                    raw.extend(params);
                    raw
                }
                // Around the length limit.
                _ => vec![b'k'; g.usize_in(250..=262)],
            }
        }

        #[test]
        fn parse_never_panics_and_accepts_exactly_the_documented_language() {
            let mut g = Gen::new(0x6b65_795f_6c61_6e67);
            for _ in 0..512 {
                let raw = hostile_bytes(&mut g);
                let parsed = IdempotencyKey::parse(&raw);
                let expected = model(&raw);
                assert_eq!(
                    parsed.as_ref().ok().map(IdempotencyKey::as_str),
                    expected.as_deref(),
                    "{raw:?} parsed to {parsed:?}"
                );
                if let Ok(key) = parsed {
                    assert!((1..=MAX_KEY_LEN).contains(&key.as_str().len()), "{raw:?}");
                    assert!(
                        key.as_str().bytes().all(|b| (0x20..=0x7e).contains(&b)),
                        "{raw:?}"
                    );
                }
            }
        }

        #[test]
        fn every_printable_key_round_trips_as_an_sf_string() {
            let mut g = Gen::new(0x726f_756e_6474_7269);
            for _ in 0..512 {
                let key = g.printable_string(1..=MAX_KEY_LEN);
                let quoted = IdempotencyKey::parse(sf_string(&key).as_bytes()).unwrap();
                assert_eq!(quoted.as_str(), key.as_str(), "{key:?}");
                // The bare form, where it exists, names the same key.
                if !key.contains([' ', '"']) {
                    let bare = IdempotencyKey::parse(key.as_bytes()).unwrap();
                    assert_eq!(&bare, &quoted, "{key:?}");
                    assert_eq!(
                        RecordId::new("s", &bare),
                        RecordId::new("s", &quoted),
                        "{key:?}"
                    );
                } else {
                    assert!(IdempotencyKey::parse(key.as_bytes()).is_err(), "{key:?}");
                }
            }
        }

        #[test]
        fn keys_past_the_limit_are_refused_in_both_forms() {
            let mut g = Gen::new(0x746f_6f5f_6c6f_6e67);
            for _ in 0..512 {
                let key = String::from_utf8(g.vec(MAX_KEY_LEN + 1..1200, |g| g.u8_in(0x21..=0x7e)))
                    .unwrap();
                let bare_err = IdempotencyKey::parse(key.as_bytes()).unwrap_err();
                let quoted_err = IdempotencyKey::parse(sf_string(&key).as_bytes()).unwrap_err();
                if !key.contains('"') {
                    assert!(
                        matches!(bare_err, KeyError::TooLong { .. }),
                        "{key:?}: {bare_err:?}"
                    );
                }
                assert!(
                    matches!(quoted_err, KeyError::TooLong { .. }),
                    "{key:?}: {quoted_err:?}"
                );
            }
        }
    }
}
