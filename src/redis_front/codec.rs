//! The value a completed response is stored as in Redis, and reading it back.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use super::RedisResponse;
use crate::engine::fingerprint::Fingerprint;
use crate::engine::record::{decode_headers, encode_headers};

/// Version byte of the stored response encoding.
const FORMAT: u8 = 1;

/// `FORMAT`, fingerprint (32), status (u16), headers' length (u32), headers
/// ([`encode_headers`]), body.
pub(super) fn encode(
    fingerprint: Fingerprint,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Vec<u8> {
    let headers = encode_headers(headers.iter());
    let mut out = Vec::with_capacity(1 + 32 + 2 + 4 + headers.len() + body.len());
    out.push(FORMAT);
    out.extend_from_slice(&fingerprint.0);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    out.extend_from_slice(
        &u32::try_from(headers.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(&headers);
    out.extend_from_slice(body);
    out
}

/// Reads [`encode`]'s format; `None` for anything else. `pttl` is Redis' `PTTL` answer.
pub(super) fn decode(value: Bytes, pttl: i64) -> Option<RedisResponse> {
    let (&format, rest) = value.split_first()?;
    if format != FORMAT || rest.len() < 32 + 2 + 4 {
        return None;
    }
    let fingerprint = Fingerprint(rest[..32].try_into().ok()?);
    let status = StatusCode::from_u16(u16::from_be_bytes(rest[32..34].try_into().ok()?)).ok()?;
    let headers_len = u32::from_be_bytes(rest[34..38].try_into().ok()?) as usize;
    let headers_at: usize = 1 + 38;
    let body_at = headers_at.checked_add(headers_len)?;
    if body_at > value.len() {
        return None;
    }
    Some(RedisResponse {
        fingerprint,
        status,
        headers: decode_headers(&value[headers_at..body_at]),
        body: value.slice(body_at..),
        ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn responses_round_trip() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("location", HeaderValue::from_static("/orders/7"));
        let encoded = encode(
            Fingerprint([7; 32]),
            StatusCode::CREATED,
            &headers,
            b"{\"id\":7}",
        );
        let decoded = decode(Bytes::from(encoded), 1500).unwrap();
        assert_eq!(decoded.fingerprint, Fingerprint([7; 32]));
        assert_eq!(decoded.status, StatusCode::CREATED);
        assert_eq!(decoded.headers, headers);
        assert_eq!(decoded.body, "{\"id\":7}");
        assert_eq!(decoded.ttl, Some(Duration::from_millis(1500)));
        let empty = encode(
            Fingerprint([0; 32]),
            StatusCode::NO_CONTENT,
            &HeaderMap::new(),
            b"",
        );
        let decoded = decode(Bytes::from(empty), -1).unwrap();
        assert!(decoded.body.is_empty() && decoded.headers.is_empty() && decoded.ttl.is_none());
    }

    #[test]
    fn damaged_values_are_refused() {
        let encoded = encode(
            Fingerprint([1; 32]),
            StatusCode::OK,
            &HeaderMap::new(),
            b"body",
        );
        for cut in 0..39 {
            assert!(
                decode(Bytes::copy_from_slice(&encoded[..cut]), 10).is_none(),
                "cut at {cut}"
            );
        }
        let mut other_format = encoded.clone();
        other_format[0] = 9;
        assert!(decode(Bytes::from(other_format), 10).is_none());
        let mut bad_status = encoded.clone();
        bad_status[33..35].copy_from_slice(&0u16.to_be_bytes());
        assert!(decode(Bytes::from(bad_status), 10).is_none());
        let mut long_headers = encoded;
        long_headers[35..39].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(Bytes::from(long_headers), 10).is_none());
        assert!(decode(Bytes::from_static(b"garbage"), 10).is_none());
    }
}
