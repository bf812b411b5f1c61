use super::MAX_KEY_LEN;

/// The documented language, written independently of the parser: a bare token of
/// 1–255 bytes in `0x21..=0x7e` without `"`, or a Structured Field string whose
/// unescaped content is 1–255 characters of `0x20..=0x7e`, followed by RFC 8941
/// parameters.
pub(crate) fn key(raw: &[u8]) -> Option<String> {
    let key = if raw.first() == Some(&b'"') {
        let (key, after) = string(&raw[1..])?;
        if !parameters(after) {
            return None;
        }
        key
    } else if raw
        .iter()
        .all(|&byte| (0x21..=0x7e).contains(&byte) && byte != b'"')
    {
        String::from_utf8(raw.to_vec()).ok()?
    } else {
        return None;
    };
    (1..=MAX_KEY_LEN).contains(&key.len()).then_some(key)
}

/// A string's unescaped content and what follows its closing quote.
fn string(raw: &[u8]) -> Option<(String, &[u8])> {
    let mut out = String::new();
    let mut i = 0;
    loop {
        match *raw.get(i)? {
            b'\\' => {
                let escaped = *raw.get(i + 1)?;
                if escaped != b'"' && escaped != b'\\' {
                    return None;
                }
                out.push(char::from(escaped));
                i += 2;
            }
            b'"' => return Some((out, &raw[i + 1..])),
            byte @ 0x20..=0x7e => {
                out.push(char::from(byte));
                i += 1;
            }
            _ => return None,
        }
    }
}

/// `*( ";" *SP key [ "=" bare-item ] )`, RFC 8941 §3.1.2.
fn parameters(mut rest: &[u8]) -> bool {
    loop {
        let Some((&first, after)) = rest.split_first() else {
            return true;
        };
        if first != b';' {
            return false;
        }
        rest = after;
        while rest.first() == Some(&b' ') {
            rest = &rest[1..];
        }
        match rest.first() {
            Some(c) if c.is_ascii_lowercase() || *c == b'*' => {}
            _ => return false,
        }
        let name_len = rest
            .iter()
            .position(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c)))
            .unwrap_or(rest.len());
        rest = &rest[name_len..];
        if rest.first() == Some(&b'=') {
            match bare_item(&rest[1..]) {
                Some(after) => rest = after,
                None => return false,
            }
        }
    }
}

/// An integer, decimal, string, token, byte sequence or boolean, and what follows it.
fn bare_item(raw: &[u8]) -> Option<&[u8]> {
    let first = *raw.first()?;
    if first == b'-' || first.is_ascii_digit() {
        let unsigned = if first == b'-' { &raw[1..] } else { raw };
        let whole = unsigned.iter().take_while(|c| c.is_ascii_digit()).count();
        let after = &unsigned[whole..];
        if after.first() == Some(&b'.') {
            let fraction = after[1..].iter().take_while(|c| c.is_ascii_digit()).count();
            let ok = (1..=12).contains(&whole) && (1..=3).contains(&fraction);
            return ok.then(|| &after[1 + fraction..]);
        }
        return (1..=15).contains(&whole).then_some(after);
    }
    match first {
        b'"' => string(&raw[1..]).map(|(_, after)| after),
        b'?' => matches!(raw.get(1), Some(b'0' | b'1')).then(|| &raw[2..]),
        b':' => {
            let end = raw[1..].iter().position(|&c| c == b':')?;
            let content = &raw[1..1 + end];
            content
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(c))
                .then(|| &raw[2 + end..])
        }
        c if c.is_ascii_alphabetic() || c == b'*' => {
            let len = raw
                .iter()
                .position(|c| !(c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(c)))
                .unwrap_or(raw.len());
            Some(&raw[len..])
        }
        _ => None,
    }
}

/// Serialises a key as a Structured Field string.
pub(crate) fn sf_string(key: &str) -> String {
    let mut out = String::from("\"");
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}
