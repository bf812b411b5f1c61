//! Encryption at rest of stored response bodies and inbox payloads (feature `encryption`).
//!
//! A sealed value is stored as
//!
//! ```text
//! version (1 byte, 0x01) | key id (1 byte) | nonce (12 bytes, random) | ciphertext | tag (16 bytes)
//! ```
//!
//! encrypted with AES-256-GCM. The associated data binds the value to where it is stored
//! (the record's id, or the inbox message's group and id) and to its version and key id, so
//! a ciphertext copied into another row does not open. Next to it, the row's `body_key_id`
//! (or `payload_key_id`) column holds the key id; `NULL` there means the value is plaintext —
//! rows written before encryption was turned on, or by an instance without it.
//!
//! The type [`EncryptionError`] and the check of that column exist in every build, so that a
//! build without the feature refuses a sealed record (503) rather than replaying ciphertext.

use std::fmt;

use bytes::Bytes;

use crate::engine::key::RecordId;

/// Version byte of the sealed format.
#[cfg(feature = "encryption")]
const VERSION: u8 = 1;
#[cfg(feature = "encryption")]
const NONCE_LEN: usize = 12;
#[cfg(feature = "encryption")]
const TAG_LEN: usize = 16;
/// Domain separation of the associated data.
#[cfg(feature = "encryption")]
const BODY_LABEL: &[u8] = b"axum-idempotency/body";
#[cfg(feature = "encryption")]
const PAYLOAD_LABEL: &[u8] = b"axum-idempotency/payload";

/// Why a stored body or payload could not be encrypted or decrypted.
///
/// A record that cannot be decrypted is never replayed: the request gets `503`
/// (`store_unavailable`) and the error is logged, so that restoring the missing key makes
/// the record replay again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncryptionError {
    /// The value was stored under this key id, which this process does not hold: the key
    /// was retired too early, no keys are configured, or the crate was built without the
    /// `encryption` feature.
    UnknownKey(i16),
    /// The stored bytes are not in the sealed format, or fail authentication: damaged,
    /// copied from another row, or sealed with a different key under the same id.
    Corrupt,
    /// The value is too large for AES-GCM (over 64 GiB).
    TooLarge,
}

impl fmt::Display for EncryptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKey(id) => {
                write!(f, "stored value is encrypted under unknown key id {id}")
            }
            Self::Corrupt => f.write_str("stored value failed to decrypt (damaged or moved)"),
            Self::TooLarge => f.write_str("value too large to encrypt"),
        }
    }
}

impl std::error::Error for EncryptionError {}

/// A stored body: plaintext, or sealed under a key id.
#[derive(Debug)]
pub(crate) struct StoredBody<'a> {
    pub(crate) bytes: std::borrow::Cow<'a, [u8]>,
    /// `None`: plaintext.
    pub(crate) key_id: Option<i16>,
}

impl<'a> StoredBody<'a> {
    pub(crate) fn plain(bytes: &'a [u8]) -> Self {
        Self {
            bytes: std::borrow::Cow::Borrowed(bytes),
            key_id: None,
        }
    }
}

/// Opens a response body read from the store; `key_id` is its `body_key_id` column.
pub(crate) fn open_body(
    keys: Option<&BodyKeys>,
    record: RecordId,
    key_id: Option<i16>,
    bytes: Bytes,
) -> Result<Bytes, EncryptionError> {
    let Some(key_id) = key_id else {
        return Ok(bytes);
    };
    #[cfg(feature = "encryption")]
    if let Some(keys) = keys {
        return keys
            .open(BODY_LABEL, record.to_hex().as_bytes(), key_id, &bytes)
            .map(Bytes::from);
    }
    let _ = (keys, record, bytes);
    Err(EncryptionError::UnknownKey(key_id))
}

/// Seals a response body for the record `record`, if keys are configured. Empty bodies
/// stay plaintext: there is nothing to hide, and lease mode's placeholders are empty.
pub(crate) fn seal_body<'a>(
    keys: Option<&BodyKeys>,
    record: RecordId,
    body: &'a [u8],
) -> Result<StoredBody<'a>, EncryptionError> {
    #[cfg(feature = "encryption")]
    if let Some(keys) = keys.filter(|_| !body.is_empty()) {
        return keys.seal(BODY_LABEL, record.to_hex().as_bytes(), body);
    }
    let _ = (keys, record);
    Ok(StoredBody::plain(body))
}

/// Seals an inbox payload for the message `message_id` of `group`, if keys are configured.
pub(crate) fn seal_payload<'a>(
    keys: Option<&BodyKeys>,
    group: &str,
    message_id: &str,
    payload: &'a [u8],
) -> Result<StoredBody<'a>, EncryptionError> {
    #[cfg(feature = "encryption")]
    if let Some(keys) = keys {
        return keys.seal(PAYLOAD_LABEL, &payload_context(group, message_id), payload);
    }
    let _ = (keys, group, message_id);
    Ok(StoredBody::plain(payload))
}

/// Group and message id, length-prefixed so that no two pairs give the same bytes.
#[cfg(feature = "encryption")]
fn payload_context(group: &str, message_id: &str) -> Vec<u8> {
    let mut context = Vec::with_capacity(8 + group.len() + message_id.len());
    context.extend_from_slice(&(group.len() as u64).to_be_bytes());
    context.extend_from_slice(group.as_bytes());
    context.extend_from_slice(message_id.as_bytes());
    context
}

/// Opens an inbox payload; for tests and tools that read `inbox_messages.payload`.
#[cfg(all(test, feature = "encryption"))]
pub(crate) fn open_payload(
    keys: &BodyKeys,
    group: &str,
    message_id: &str,
    key_id: i16,
    sealed: &[u8],
) -> Result<Vec<u8>, EncryptionError> {
    keys.open(
        PAYLOAD_LABEL,
        &payload_context(group, message_id),
        key_id,
        sealed,
    )
}

/// The keys that encrypt stored response bodies and inbox payloads at rest (feature
/// `encryption`): AES-256-GCM, one current key that seals new values, and old keys that
/// still open values sealed before a rotation.
///
/// Each key has a one-byte id, stored with every value it seals. To rotate: deploy with
/// the new key as current and the previous one as old; once no live row uses the old id
/// (`SELECT count(*) FROM idempotency_records WHERE body_key_id = 1`, or simply after the
/// records' TTL and the inbox retention have passed), drop it.
///
/// Keys are 32 random bytes from a secret store; never derive them from a password.
///
/// ```
/// use axum_idempotency::BodyKeys;
///
/// # fn load(_: &str) -> [u8; 32] { [7; 32] }
/// // One key:
/// let keys = BodyKeys::new(1, load("idempotency-key-1"));
///
/// // After a rotation: new values under key 2, values under key 1 still readable.
/// let keys = BodyKeys::new(2, load("idempotency-key-2"))
///     .with_old_key(1, load("idempotency-key-1"));
/// assert_eq!(keys.current_id(), 2);
/// ```
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
#[derive(Clone)]
pub struct BodyKeys {
    current: u8,
    /// The current key first.
    keys: Vec<(u8, aes_gcm::Aes256Gcm)>,
}

/// Uninhabited without the `encryption` feature: no keys can be configured.
#[cfg(not(feature = "encryption"))]
#[derive(Clone, Debug)]
pub(crate) enum BodyKeys {}

#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
impl BodyKeys {
    /// Keys whose current key, used to seal every new value, is `key` under `id`.
    pub fn new(id: u8, key: [u8; 32]) -> Self {
        Self {
            current: id,
            keys: vec![(id, cipher(key))],
        }
    }

    /// Adds a retired key, kept to open values sealed under `id` before a rotation. If `id`
    /// is already present (the current id included), the key given first is kept and this
    /// one ignored.
    #[must_use]
    pub fn with_old_key(mut self, id: u8, key: [u8; 32]) -> Self {
        if self.keys.iter().all(|(known, _)| *known != id) {
            self.keys.push((id, cipher(key)));
        }
        self
    }

    /// The id of the key that seals new values.
    pub fn current_id(&self) -> u8 {
        self.current
    }

    fn seal<'a>(
        &self,
        label: &[u8],
        context: &[u8],
        plaintext: &[u8],
    ) -> Result<StoredBody<'a>, EncryptionError> {
        use aes_gcm::aead::{Aead, AeadCore, OsRng, Payload};

        let (id, cipher) = &self.keys[0];
        let nonce = aes_gcm::Aes256Gcm::generate_nonce(&mut OsRng);
        let header = [VERSION, *id];
        let aad = associated_data(label, &header, context);
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| EncryptionError::TooLarge)?;
        let mut sealed = Vec::with_capacity(header.len() + NONCE_LEN + ciphertext.len());
        sealed.extend_from_slice(&header);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&ciphertext);
        Ok(StoredBody {
            bytes: std::borrow::Cow::Owned(sealed),
            key_id: Some(i16::from(*id)),
        })
    }

    fn open(
        &self,
        label: &[u8],
        context: &[u8],
        key_id: i16,
        sealed: &[u8],
    ) -> Result<Vec<u8>, EncryptionError> {
        use aes_gcm::aead::{Aead, Payload};

        let cipher = u8::try_from(key_id)
            .ok()
            .and_then(|id| self.keys.iter().find(|(known, _)| *known == id))
            .map(|(_, cipher)| cipher)
            .ok_or(EncryptionError::UnknownKey(key_id))?;
        if sealed.len() < 2 + NONCE_LEN + TAG_LEN
            || sealed[0] != VERSION
            || i16::from(sealed[1]) != key_id
        {
            return Err(EncryptionError::Corrupt);
        }
        let (header, rest) = sealed.split_at(2);
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        let aad = associated_data(label, header, context);
        cipher
            .decrypt(
                aes_gcm::Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| EncryptionError::Corrupt)
    }
}

#[cfg(feature = "encryption")]
fn cipher(key: [u8; 32]) -> aes_gcm::Aes256Gcm {
    use aes_gcm::KeyInit;
    aes_gcm::Aes256Gcm::new(&key.into())
}

#[cfg(feature = "encryption")]
fn associated_data(label: &[u8], header: &[u8], context: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(label.len() + 1 + header.len() + context.len());
    aad.extend_from_slice(label);
    aad.push(0);
    aad.extend_from_slice(header);
    aad.extend_from_slice(context);
    aad
}

#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
impl fmt::Debug for BodyKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<u8> = self.keys.iter().map(|(id, _)| *id).collect();
        f.debug_struct("BodyKeys")
            .field("current", &self.current)
            .field("ids", &ids)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, feature = "encryption"))]
mod tests {
    use super::*;

    fn record() -> RecordId {
        RecordId::from_parts("scope", "key-1")
    }

    #[test]
    fn body_round_trips_and_hides_plaintext() {
        let keys = BodyKeys::new(3, [1; 32]);
        let body = b"{\"card\":\"4111111111111111\"}";
        let sealed = seal_body(Some(&keys), record(), body).unwrap();
        assert_eq!(sealed.key_id, Some(3));
        assert_eq!(sealed.bytes.len(), body.len() + 2 + NONCE_LEN + TAG_LEN);
        assert!(!sealed.bytes.windows(4).any(|w| w == b"4111"));
        let opened = open_body(
            Some(&keys),
            record(),
            sealed.key_id,
            Bytes::from(sealed.bytes.into_owned()),
        )
        .unwrap();
        assert_eq!(&opened[..], body);
    }

    #[test]
    fn nonces_differ() {
        let keys = BodyKeys::new(1, [1; 32]);
        let a = seal_body(Some(&keys), record(), b"same").unwrap();
        let b = seal_body(Some(&keys), record(), b"same").unwrap();
        assert_ne!(a.bytes, b.bytes);
    }

    #[test]
    fn plaintext_and_empty_bodies_pass_through() {
        let keys = BodyKeys::new(1, [1; 32]);
        assert_eq!(seal_body(Some(&keys), record(), b"").unwrap().key_id, None);
        assert_eq!(seal_body(None, record(), b"x").unwrap().key_id, None);
        let plain = Bytes::from_static(b"legacy");
        assert_eq!(
            open_body(Some(&keys), record(), None, plain.clone()).unwrap(),
            plain
        );
    }

    #[test]
    fn rotation_unknown_keys_and_tampering() {
        let old = BodyKeys::new(1, [1; 32]);
        let sealed = seal_body(Some(&old), record(), b"secret").unwrap();
        let bytes = Bytes::from(sealed.bytes.into_owned());
        let rotated = BodyKeys::new(2, [2; 32]).with_old_key(1, [1; 32]);
        assert_eq!(
            &open_body(Some(&rotated), record(), Some(1), bytes.clone()).unwrap()[..],
            b"secret"
        );
        let new_only = BodyKeys::new(2, [2; 32]);
        assert_eq!(
            open_body(Some(&new_only), record(), Some(1), bytes.clone()),
            Err(EncryptionError::UnknownKey(1))
        );
        assert_eq!(
            open_body(None, record(), Some(1), bytes.clone()),
            Err(EncryptionError::UnknownKey(1))
        );
        // Same id, different key material.
        let wrong = BodyKeys::new(1, [9; 32]);
        assert_eq!(
            open_body(Some(&wrong), record(), Some(1), bytes.clone()),
            Err(EncryptionError::Corrupt)
        );
        // Moved to another record.
        assert_eq!(
            open_body(
                Some(&old),
                RecordId::from_parts("scope", "key-2"),
                Some(1),
                bytes.clone()
            ),
            Err(EncryptionError::Corrupt)
        );
        for cut in 0..bytes.len() {
            assert!(open_body(Some(&old), record(), Some(1), bytes.slice(..cut)).is_err());
        }
        let mut flipped = bytes.to_vec();
        flipped[20] ^= 1;
        assert_eq!(
            open_body(Some(&old), record(), Some(1), Bytes::from(flipped)),
            Err(EncryptionError::Corrupt)
        );
        assert_eq!(
            open_body(Some(&old), record(), Some(300), bytes),
            Err(EncryptionError::UnknownKey(300))
        );
    }

    #[test]
    fn payloads_are_bound_to_their_message() {
        let keys = BodyKeys::new(1, [1; 32]);
        let sealed = seal_payload(Some(&keys), "billing", "m-1", b"payload").unwrap();
        let id = sealed.key_id.unwrap();
        assert_eq!(
            open_payload(&keys, "billing", "m-1", id, &sealed.bytes).unwrap(),
            b"payload"
        );
        assert!(open_payload(&keys, "billing", "m-2", id, &sealed.bytes).is_err());
        assert!(open_payload(&keys, "billin", "gm-1", id, &sealed.bytes).is_err());
        // A payload never opens as a body, and the reverse.
        assert!(
            open_body(
                Some(&keys),
                record(),
                Some(id),
                Bytes::from(sealed.bytes.to_vec())
            )
            .is_err()
        );
    }

    #[test]
    fn debug_shows_no_key_material() {
        let keys = BodyKeys::new(2, [0xab; 32]).with_old_key(1, [0xcd; 32]);
        let debug = format!("{keys:?}");
        assert!(debug.contains("current: 2"), "{debug}");
        assert!(!debug.to_lowercase().contains("ab, ab") && !debug.contains("171"));
    }
}
