//! The request's inputs: `application/x-www-form-urlencoded` query strings and form
//! bodies, and who is acting.

use http::HeaderMap;
use http::header::AUTHORIZATION;

/// The (name, value) pairs of a query string or urlencoded form body, decoded.
#[derive(Debug, Default)]
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    pub(crate) fn parse(input: &[u8]) -> Self {
        Self(
            input
                .split(|b| *b == b'&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let mut parts = pair.splitn(2, |b| *b == b'=');
                    let name = decode(parts.next().unwrap_or_default());
                    let value = decode(parts.next().unwrap_or_default());
                    (name, value)
                })
                .collect(),
        )
    }

    /// The first value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn decode(input: &[u8]) -> String {
    fn digit(b: u8) -> Option<u8> {
        char::from(b)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    }
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                input.get(i + 1).and_then(|b| digit(*b)),
                input.get(i + 2).and_then(|b| digit(*b)),
            ) {
                (Some(high), Some(low)) => {
                    out.push(high * 16 + low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The identity the application put on the request for the console's log: a
/// [`ConsoleUser`](super::ConsoleUser) extension, else the user name of HTTP Basic
/// credentials, else `anonymous`.
pub(crate) fn basic_user(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64(credentials.trim())?;
    let decoded = String::from_utf8(decoded).ok()?;
    decoded.split_once(':').map(|(user, _)| user.to_owned())
}

/// Standard base64 with padding.
fn base64(input: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let input = input.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    for chunk in input.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode() {
        let form = Form::parse(b"scope=&key=%22%3Cb%3E%22+x&lease=a:1&lease=b:2&bad=%zz%4");
        assert_eq!(form.get("scope"), Some(""));
        assert_eq!(form.get("key"), Some("\"<b>\" x"));
        assert_eq!(form.all("lease").collect::<Vec<_>>(), ["a:1", "b:2"]);
        assert_eq!(form.get("bad"), Some("%zz%4"));
        assert_eq!(form.get("missing"), None);
    }

    #[test]
    fn the_basic_user_is_read() {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, "Basic YWRtaW46c2VjcmV0".parse().unwrap());
        assert_eq!(basic_user(&headers).as_deref(), Some("admin"));
        headers.insert(AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(basic_user(&headers), None);
    }
}
