//! Request fingerprints: what makes two requests "the same request" for one key.
//!
//! The fingerprint is SHA-256 over the method, the path and query, the configured headers and
//! the body. JSON bodies are hashed in canonical form — object keys sorted, insignificant
//! whitespace dropped, configured fields removed — so a client that re-serialises the same
//! document gets the same fingerprint. Anything that is not JSON, is not valid JSON, or nests
//! deeper than the configured depth is hashed byte for byte.

use http::HeaderName;
use http::request::Parts;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Default bound on JSON nesting for canonicalisation.
pub(crate) const DEFAULT_MAX_JSON_DEPTH: usize = 32;

/// A SHA-256 request fingerprint.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(pub(crate) [u8; 32]);

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", crate::engine::key::hex(&self.0))
    }
}

/// How fingerprints are computed; part of the layer's configuration.
#[derive(Debug, Clone)]
pub(crate) struct Fingerprinter {
    pub(crate) headers: Vec<HeaderName>,
    /// JSON Pointers (RFC 6901), already split into unescaped segments.
    pub(crate) ignored: Vec<Vec<String>>,
    pub(crate) max_json_depth: usize,
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Self {
            headers: Vec::new(),
            ignored: Vec::new(),
            max_json_depth: DEFAULT_MAX_JSON_DEPTH,
        }
    }
}

impl Fingerprinter {
    pub(crate) fn compute(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        let mut hasher = Sha256::new();
        field(&mut hasher, b'M', parts.method.as_str().as_bytes());
        let target = parts
            .uri
            .path_and_query()
            .map_or("/", |target| target.as_str());
        field(&mut hasher, b'U', target.as_bytes());
        for name in &self.headers {
            for value in parts.headers.get_all(name) {
                field(&mut hasher, b'H', name.as_str().as_bytes());
                field(&mut hasher, b'V', value.as_bytes());
            }
        }
        match self.canonical_json(parts, body) {
            Some(canonical) => field(&mut hasher, b'J', &canonical),
            None => field(&mut hasher, b'B', body),
        }
        Fingerprint(hasher.finalize().into())
    }

    /// The canonical form of a JSON body (`None`: not JSON, invalid, or too deep: hashed
    /// byte for byte).
    pub(crate) fn canonical_json(&self, parts: &Parts, body: &[u8]) -> Option<Vec<u8>> {
        if !is_json(parts) {
            return None;
        }
        // serde_json refuses nesting past 128 levels, so parsing cannot overflow the stack.
        // Floats are parsed correctly rounded (serde_json's `float_roundtrip`), so every
        // spelling of one number, and its own re-serialisation, is the same value.
        let mut value: Value = serde_json::from_slice(body).ok()?;
        if depth_exceeds(&value, self.max_json_depth) {
            return None;
        }
        for pointer in &self.ignored {
            remove_pointer(&mut value, pointer);
        }
        let mut out = Vec::with_capacity(body.len());
        write_canonical(&mut out, &value);
        Some(out)
    }
}

/// Splits an RFC 6901 JSON Pointer (`/order/client_sent_at`) into unescaped segments.
pub(crate) fn parse_pointer(pointer: &str) -> Option<Vec<String>> {
    let rest = pointer.strip_prefix('/')?;
    Some(
        rest.split('/')
            .map(|segment| segment.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

fn field(hasher: &mut Sha256, tag: u8, bytes: &[u8]) {
    hasher.update([tag]);
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

fn is_json(parts: &Parts) -> bool {
    let Some(content_type) = parts.headers.get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(content_type) = content_type.to_str() else {
        return false;
    };
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn depth_exceeds(value: &Value, max: usize) -> bool {
    // Iterative, so the check itself needs no stack.
    let mut stack = vec![(value, 1usize)];
    while let Some((value, depth)) = stack.pop() {
        match value {
            Value::Array(items) if depth > max && !items.is_empty() => return true,
            Value::Object(map) if depth > max && !map.is_empty() => return true,
            Value::Array(items) => stack.extend(items.iter().map(|child| (child, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|child| (child, depth + 1))),
            _ => {}
        }
    }
    false
}

fn remove_pointer(value: &mut Value, segments: &[String]) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut target = value;
    for segment in parents {
        target = match target {
            Value::Object(map) => match map.get_mut(segment) {
                Some(child) => child,
                None => return,
            },
            Value::Array(items) => {
                match segment.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(child) => child,
                    None => return,
                }
            }
            _ => return,
        };
    }
    match target {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Some(index) = last.parse::<usize>().ok().filter(|&i| i < items.len()) {
                items.remove(index);
            }
        }
        _ => {}
    }
}

/// Compact JSON with object keys in byte order, whatever order the parser kept.
fn write_canonical(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, child)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // Serialising a string into a Vec cannot fail.
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_canonical(out, child);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, child) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, child);
            }
            out.push(b']');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(method: &str, uri: &str, content_type: Option<&str>) -> Parts {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(content_type) = content_type {
            builder = builder.header("content-type", content_type);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn json(body: &str) -> Fingerprint {
        Fingerprinter::default().compute(
            &parts("POST", "/orders", Some("application/json")),
            body.as_bytes(),
        )
    }

    #[test]
    fn json_key_order_and_whitespace_do_not_matter() {
        assert_eq!(
            json(r#"{"a":1,"b":[1,2]}"#),
            json("{ \"b\" : [1, 2],\n \"a\": 1 }")
        );
        assert_ne!(json(r#"{"a":1}"#), json(r#"{"a":2}"#));
        assert_ne!(json(r#"[1,2]"#), json(r#"[2,1]"#));
    }

    #[test]
    fn nested_objects_are_sorted_too() {
        assert_eq!(
            json(r#"{"x":{"b":1,"a":{"d":1,"c":2}}}"#),
            json(r#"{"x":{"a":{"c":2,"d":1},"b":1}}"#)
        );
    }

    #[test]
    fn method_path_query_and_headers_count() {
        let fp = Fingerprinter {
            headers: vec![HeaderName::from_static("x-tenant")],
            ..Fingerprinter::default()
        };
        let base = fp.compute(&parts("POST", "/a?x=1", None), b"body");
        assert_ne!(base, fp.compute(&parts("PATCH", "/a?x=1", None), b"body"));
        assert_ne!(base, fp.compute(&parts("POST", "/b?x=1", None), b"body"));
        assert_ne!(base, fp.compute(&parts("POST", "/a?x=2", None), b"body"));
        assert_ne!(base, fp.compute(&parts("POST", "/a?x=1", None), b"bodz"));
        let mut with_header = parts("POST", "/a?x=1", None);
        with_header
            .headers
            .insert("x-tenant", "t1".parse().unwrap());
        assert_ne!(base, fp.compute(&with_header, b"body"));
        // Headers not configured are ignored.
        let mut other_header = parts("POST", "/a?x=1", None);
        other_header
            .headers
            .insert("x-trace", "t1".parse().unwrap());
        assert_eq!(base, fp.compute(&other_header, b"body"));
    }

    #[test]
    fn ignored_fields_are_removed() {
        let fp = Fingerprinter {
            ignored: vec![
                parse_pointer("/sent_at").unwrap(),
                parse_pointer("/meta/trace~1id").unwrap(),
            ],
            ..Fingerprinter::default()
        };
        let p = parts("POST", "/orders", Some("application/json"));
        assert_eq!(
            fp.compute(
                &p,
                br#"{"amount":1,"sent_at":"10:00","meta":{"trace/id":"a","v":1}}"#
            ),
            fp.compute(
                &p,
                br#"{"amount":1,"sent_at":"10:01","meta":{"trace/id":"b","v":1}}"#
            )
        );
        assert_ne!(
            fp.compute(&p, br#"{"amount":1,"meta":{"v":1}}"#),
            fp.compute(&p, br#"{"amount":2,"meta":{"v":1}}"#)
        );
    }

    #[test]
    fn invalid_or_deep_json_falls_back_to_bytes() {
        let p = parts("POST", "/orders", Some("application/json"));
        let fp = Fingerprinter::default();
        // Not JSON: stable, and different bytes differ.
        assert_eq!(fp.compute(&p, b"{nope"), fp.compute(&p, b"{nope"));
        assert_ne!(fp.compute(&p, b"{nope"), fp.compute(&p, b"{nope "));
        // Deeper than the bound: hashed as bytes, so whitespace matters again.
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        let deep_spaced = format!("{} {}", "[".repeat(40), "]".repeat(40));
        assert_ne!(
            fp.compute(&p, deep.as_bytes()),
            fp.compute(&p, deep_spaced.as_bytes())
        );
        // Far past serde_json's own limit: no stack overflow, a stable answer.
        let very_deep = "[".repeat(100_000);
        assert_eq!(
            fp.compute(&p, very_deep.as_bytes()),
            fp.compute(&p, very_deep.as_bytes())
        );
    }

    #[test]
    fn floats_are_canonical_whatever_their_spelling() {
        // serde_json's default best-effort parse put `4567e24` one ULP away from `4.567e27`,
        // and the re-serialisation of that (`4.5669999999999997e27`) was yet another
        // fingerprint; with `float_roundtrip` every spelling is the same value.
        assert_eq!(json("[4567e24]"), json("[4.567e27]"));
        assert_eq!(json("[4567e24]"), json("[4.567E+27]"));
        assert_eq!(
            json("[-92233720345678754e-8]"),
            json("[-922337203.45678754]")
        );
        assert_eq!(json("[0.1, 1e-1, 10e-2]"), json("[0.1,0.1,0.1]"));
        assert_eq!(
            json("[18446744073709551616]"),
            json("[1.8446744073709552e19]")
        );
        assert_ne!(json("[4567e24]"), json("[4.5669999999999997e27]"));
        assert_ne!(json("[1]"), json("[1.0]"));
        assert_eq!(json("[-0]"), json("[-0.0]"));
        // Strings that look like numbers do not shift the literals.
        assert_eq!(
            json(r#"{"a":"1e5 \" 2","b":[3, 1.5e300]}"#),
            json(r#"{"b":[3,15e299],"a":"1e5 \" 2"}"#)
        );
    }

    #[test]
    fn every_float_is_a_fixed_point_of_canonicalisation() {
        let fp = Fingerprinter::default();
        let p = parts("POST", "/orders", Some("application/json"));
        for literal in [
            "4567e24",
            "92233720345678754e24",
            "5e-324",
            "2.2250738585072014e-308",
        ] {
            let body = format!("[{literal}]");
            let canonical = fp.canonical_json(&p, body.as_bytes()).unwrap();
            assert_eq!(
                fp.canonical_json(&p, &canonical).unwrap(),
                canonical,
                "{literal}"
            );
        }
        assert_eq!(
            fp.canonical_json(&p, b"[4567e24]").unwrap(),
            b"[4.567e+27]".to_vec()
        );
    }

    #[test]
    fn json_is_recognised_by_media_type() {
        for content_type in [
            "application/json",
            "application/json; charset=utf-8",
            "application/problem+json",
            "Application/JSON",
        ] {
            let p = parts("POST", "/", Some(content_type));
            assert_eq!(
                Fingerprinter::default().compute(&p, br#"{"a":1,"b":2}"#),
                Fingerprinter::default().compute(&p, br#"{"b":2,"a":1}"#),
                "{content_type}"
            );
        }
        let text = parts("POST", "/", Some("text/plain"));
        assert_ne!(
            Fingerprinter::default().compute(&text, br#"{"a":1,"b":2}"#),
            Fingerprinter::default().compute(&text, br#"{"b":2,"a":1}"#)
        );
    }
    mod properties {
        use super::*;
        use crate::engine::testing::{ANY_BUT_NEWLINE, Gen};

        fn json_parts() -> Parts {
            parts("POST", "/orders", Some("application/json"))
        }

        fn leaf(g: &mut Gen) -> Value {
            match g.below(6) {
                0 => Value::Null,
                1 => Value::from(g.bool()),
                2 => Value::from(g.u64() as i64),
                3 => Value::from(g.u64()),
                4 => Value::from(g.finite_f64()),
                _ => Value::from(g.string(0..=12, ANY_BUT_NEWLINE)),
            }
        }

        /// A JSON document at most six containers deep, of about 64 values. Each level
        /// down is less likely to open a container: at the top nine documents in ten are
        /// one, one level down a quarter of the values, then a few in a hundred, and from
        /// three levels down almost none.
        fn arb_json(g: &mut Gen) -> Value {
            json(g, 6)
        }

        /// A value that opens at most `levels` containers.
        fn json(g: &mut Gen, levels: u32) -> Value {
            const DESIRED_SIZE: f64 = 64.0;
            const BRANCH_SIZE: f64 = 8.0;
            if levels == 0 {
                return leaf(g);
            }
            let depth_from_top = 6 - levels as i32;
            let branch = (DESIRED_SIZE / (2.0 * BRANCH_SIZE).powi(depth_from_top + 1)).min(0.9);
            if !g.chance(branch) {
                return json(g, levels - 1);
            }
            if g.bool() {
                Value::Array(g.vec(0..8, |g| json(g, levels - 1)))
            } else {
                Value::Object(
                    g.vec(0..8, |g| {
                        (g.string(0..=8, ANY_BUT_NEWLINE), json(g, levels - 1))
                    })
                    .into_iter()
                    .collect(),
                )
            }
        }

        /// Writes `value` as JSON with object members in an order and with whitespace
        /// chosen by `seed`: the same document as another client might serialise it.
        fn render(out: &mut String, value: &Value, seed: &mut u64) {
            fn next(seed: &mut u64) -> u64 {
                *seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                *seed >> 33
            }
            fn space(out: &mut String, seed: &mut u64) {
                out.push_str(["", " ", "\n", "\t", "\r\n  "][(next(seed) % 5) as usize]);
            }
            match value {
                Value::Object(map) => {
                    let mut entries: Vec<_> = map.iter().collect();
                    let len = entries.len().max(1);
                    entries.rotate_left((next(seed) as usize) % len);
                    if next(seed) % 2 == 0 {
                        entries.reverse();
                    }
                    out.push('{');
                    for (i, (key, child)) in entries.into_iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        space(out, seed);
                        out.push_str(&serde_json::to_string(key).unwrap());
                        space(out, seed);
                        out.push(':');
                        space(out, seed);
                        render(out, child, seed);
                        space(out, seed);
                    }
                    out.push('}');
                }
                Value::Array(items) => {
                    out.push('[');
                    for (i, child) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        space(out, seed);
                        render(out, child, seed);
                        space(out, seed);
                    }
                    out.push(']');
                }
                scalar => out.push_str(&serde_json::to_string(scalar).unwrap()),
            }
        }

        fn arb_body(g: &mut Gen) -> Vec<u8> {
            match g.below(3) {
                0 => g.vec(0..512, |g| g.u8_in(0..=0xff)),
                // JSON-ish noise: brackets, quotes, digits, exponents, escapes.
                1 => g.vec(0..512, |g| {
                    *g.pick(b"{}[]\":,0123456789eE+-.\\u \ntrfnalse\xff\xc3")
                }),
                _ => arb_json(g).to_string().into_bytes(),
            }
        }

        #[test]
        fn arbitrary_bodies_fingerprint_deterministically() {
            let mut g = Gen::new(0x626f_6479_6279_7465);
            for _ in 0..256 {
                let body = arb_body(&mut g);
                let fp = Fingerprinter::default();
                for p in [json_parts(), parts("POST", "/orders", None)] {
                    assert_eq!(fp.compute(&p, &body), fp.compute(&p, &body), "{body:?}");
                }
            }
        }

        #[test]
        fn member_order_and_whitespace_do_not_change_the_fingerprint() {
            let mut g = Gen::new(0x6f72_6465_7273_7061);
            for _ in 0..256 {
                let value = arb_json(&mut g);
                let seed = g.u64();
                let compact = value.to_string();
                let mut reordered = String::new();
                render(&mut reordered, &value, &mut seed.clone());
                let pretty = serde_json::to_string_pretty(&value).unwrap();
                let fp = Fingerprinter::default();
                let p = json_parts();
                let expected = fp.compute(&p, compact.as_bytes());
                assert_eq!(
                    fp.compute(&p, reordered.as_bytes()),
                    expected,
                    "{compact} as {reordered}"
                );
                assert_eq!(fp.compute(&p, pretty.as_bytes()), expected, "{compact}");
                // Not a JSON media type: the bytes count, and equal bytes agree.
                let text = parts("POST", "/orders", Some("text/plain"));
                assert_eq!(
                    fp.compute(&text, compact.as_bytes()),
                    fp.compute(&text, compact.as_bytes()),
                    "{compact}"
                );
            }
        }

        #[test]
        fn another_document_is_another_fingerprint() {
            let mut g = Gen::new(0x616e_6f74_6865_7264);
            let mut checked = 0;
            // Pairs of equal documents are drawn again; 256 pairs of different ones are
            // checked.
            for _ in 0..4 * 256 {
                let (a, b) = (arb_json(&mut g), arb_json(&mut g));
                if a == b {
                    continue;
                }
                let fp = Fingerprinter::default();
                let p = json_parts();
                assert_ne!(
                    fp.compute(&p, a.to_string().as_bytes()),
                    fp.compute(&p, b.to_string().as_bytes()),
                    "{a} and {b}"
                );
                checked += 1;
                if checked == 256 {
                    return;
                }
            }
            panic!("only {checked} pairs of different documents");
        }

        /// Stable, and computed without overflowing the test thread's stack.
        fn stable(body: &[u8]) -> Fingerprint {
            let fp = Fingerprinter::default();
            let p = json_parts();
            let first = fp.compute(&p, body);
            assert_eq!(first, fp.compute(&p, body));
            first
        }

        #[test]
        fn deep_nesting_is_stable() {
            for depth in [31, 32, 33, 127, 128, 129, 100_000] {
                for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
                    let unclosed = open.repeat(depth);
                    stable(unclosed.as_bytes());
                    let closed = format!("{}1{}", open.repeat(depth), close.repeat(depth));
                    stable(closed.as_bytes());
                }
            }
            // At and below the configured depth the document is canonicalised.
            let within = format!("{}{}", "[".repeat(32), "]".repeat(32));
            let within_spaced = format!("{} {}", "[".repeat(32), "]".repeat(32));
            assert_eq!(stable(within.as_bytes()), stable(within_spaced.as_bytes()));
        }

        #[test]
        fn huge_numbers_are_stable() {
            let digits = format!("1{}", "0".repeat(399));
            let bodies = [
                "1e999999".to_owned(),
                "-1e999999".to_owned(),
                "1e-999999".to_owned(),
                format!("{{\"amount\":{digits}}}"),
                format!("{{\"amount\":-{digits}}}"),
                format!("{{\"amount\":0.{digits}}}"),
                "18446744073709551616".to_owned(),
            ];
            for body in &bodies {
                stable(body.as_bytes());
            }
            // Out of f64 range: not canonicalised, so the exact bytes count.
            assert_ne!(stable(b"1e999999"), stable(b"1e9999999"));
            assert_ne!(
                stable(format!("[{digits}]").as_bytes()),
                stable(format!("[{digits}1]").as_bytes())
            );
        }

        #[test]
        fn duplicate_keys_and_invalid_utf8_are_stable() {
            let duplicate = stable(br#"{"a":1,"a":2}"#);
            assert_eq!(duplicate, stable(br#"{ "a" : 1 , "a" : 2 }"#));
            assert_ne!(duplicate, stable(br#"{"a":1}"#));
            for body in [
                &b"{\"a\":\"\xff\"}"[..],
                b"\xff\xfe\xfd",
                b"{\"\xc3\":1}",
                b"\"\\ud800\"",
                b"{\"a\":\"\\ud800\"}",
                b"\xef\xbb\xbf{}",
            ] {
                stable(body);
            }
        }
    }
}
