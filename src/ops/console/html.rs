//! HTML output: escaping (everything shown comes from callers and is data, never markup),
//! the page frame, and times as an operator reads them.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

/// `text` with the characters that mean something in HTML (text or a quoted attribute)
/// replaced by their references.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` percent-encoded for a query string value.
pub(crate) fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// The navigation entries: (link, label).
const NAV: &[(&str, &str)] = &[
    ("./", "Overview"),
    ("key", "Key"),
    ("stale", "Stale leases"),
    ("inbox", "Inbox"),
    ("outbox", "Outbox"),
];

/// A whole page: `title` (plain text) and `body` (markup built from escaped parts).
pub(crate) fn page(title: &str, current: &str, body: &str) -> String {
    let mut nav = String::new();
    for (link, label) in NAV {
        let class = if *label == current {
            " class=\"current\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{link}\"{class}>{label}</a>");
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · idempotency console</title>\
         <link rel=\"stylesheet\" href=\"console.css\"></head>\
         <body><header><strong>idempotency console</strong><nav>{nav}</nav></header>\
         <main><h1>{title}</h1>{body}</main></body></html>\n",
        title = escape(title),
    )
}

/// A time as `2026-12-01 21:14:03 UTC`.
pub(crate) fn time(at: SystemTime) -> String {
    let secs = match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A duration in seconds as `3 h 2 min`, `41 s`.
pub(crate) fn age(seconds: f64) -> String {
    let secs = seconds.max(0.0).round() as u64;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min {} s", secs / 60, secs % 60),
        3600..86_400 => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
        _ => format!("{} d {} h", secs / 86_400, secs % 86_400 / 3600),
    }
}

/// Seconds from now until `at` (negative: past).
pub(crate) fn until(at: SystemTime) -> f64 {
    match at.duration_since(SystemTime::now()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Seconds since `at`.
pub(crate) fn since(at: SystemTime) -> f64 {
    SystemTime::now()
        .duration_since(at)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_text_is_escaped() {
        assert_eq!(
            escape(r#""<script>alert(1)</script>" & 'x'"#),
            "&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot; &amp; &#39;x&#39;"
        );
        assert_eq!(url("a b&c=\"é"), "a%20b%26c%3D%22%C3%A9");
    }

    #[test]
    fn times_are_civil_utc() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_159_643);
        assert_eq!(time(at), "2026-12-01 21:14:03 UTC");
        assert_eq!(time(SystemTime::UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        assert_eq!(age(3725.0), "1 h 2 min");
    }
}
