//! The console session and its CSRF tokens: a random session id in a cookie the console
//! sets, and a token that is HMAC-SHA256 of that id under a random key of this process.
//! A form carries the token; a POST whose token is not the one of its cookie's session is
//! refused before it changes anything.

use http::HeaderMap;
use http::header::COOKIE;
use sha2::{Digest, Sha256};

use crate::engine::key::hex;

/// The session cookie's name.
pub(crate) const COOKIE_NAME: &str = "axum_idempotency_console";

/// The per-process key the tokens are computed under.
#[derive(Clone)]
pub(crate) struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub(crate) fn random() -> Self {
        Self(random_bytes())
    }

    /// The token of session `session`.
    pub(crate) fn token(&self, session: &str) -> String {
        hex(&hmac_sha256(&self.0, session.as_bytes()))
    }

    /// Whether `token` is the token of `session`, compared in constant time.
    pub(crate) fn verify(&self, session: &str, token: &str) -> bool {
        let expected = self.token(session);
        expected.len() == token.len()
            && expected
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// A fresh session id: 32 random bytes, 64 hex digits.
pub(crate) fn new_session() -> String {
    hex(&random_bytes())
}

fn random_bytes() -> [u8; 32] {
    let mut bytes = [0; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes
}

/// The session id of the request's console cookie, if it has a well-formed one.
pub(crate) fn session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_owned())
        .filter(|value| value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `Set-Cookie` value of a new session: not readable by scripts, never sent with
/// another site's requests.
pub(crate) fn set_cookie(session: &str) -> String {
    format!("{COOKIE_NAME}={session}; Path=/; HttpOnly; SameSite=Strict")
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key` (at most one block long).
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape() {
        // RFC 4231 test case 2 uses the 4-byte key "Jefe"; zero-padded to 32 bytes the
        // HMAC is the same (keys shorter than a block are zero-padded).
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex(&hmac_sha256(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_token_verifies_only_for_its_session() {
        let secret = Secret::random();
        let (a, b) = (new_session(), new_session());
        assert!(secret.verify(&a, &secret.token(&a)));
        assert!(!secret.verify(&b, &secret.token(&a)));
        assert!(!secret.verify(&a, ""));
        assert!(!Secret::random().verify(&a, &secret.token(&a)));
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let id = new_session();
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            format!("a=1; {COOKIE_NAME}={id}; b=2").parse().unwrap(),
        );
        assert_eq!(session(&headers), Some(id));
        headers.insert(COOKIE, format!("{COOKIE_NAME}=<x>").parse().unwrap());
        assert_eq!(session(&headers), None);
    }
}
