//! The gateway's settings, from the environment. Every mistake is one line naming the
//! variable, and the gateway does not start.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderName, Method, Uri};

/// Where the gateway keeps its records (`DATABASE_URL`).
#[derive(Debug, Clone)]
pub(crate) enum Store {
    /// `sqlite:PATH`, or unset: `gateway.db` in the working directory.
    Sqlite(String),
    /// `postgres://…` or `postgresql://…`.
    Postgres(String),
    /// `mysql://…` or `mariadb://…`.
    MySql(String),
}

impl Store {
    /// The store as it may be printed: the file, or the URL without its password.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Sqlite(path) => {
                let absolute = std::path::absolute(path).unwrap_or_else(|_| path.into());
                format!("SQLite file {}", absolute.display())
            }
            Self::Postgres(url) => format!("PostgreSQL {}", redacted(url)),
            Self::MySql(url) => format!("MySQL/MariaDB {}", redacted(url)),
        }
    }
}

/// Everything the gateway is started with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) upstream: Uri,
    pub(crate) bind: SocketAddr,
    pub(crate) store: Store,
    /// Methods whose keyed requests are guarded; empty: none (a plain reverse proxy).
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) scope_header: Option<HeaderName>,
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    pub(crate) upstream_timeout: Duration,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) keep_headers: Vec<HeaderName>,
    pub(crate) ttl: Duration,
    /// Bytes of completed answers kept in memory for replays; 0: none.
    pub(crate) cache_bytes: u64,
    pub(crate) metrics_addr: Option<SocketAddr>,
    pub(crate) console_addr: Option<SocketAddr>,
    pub(crate) console_token: Option<String>,
}

impl Settings {
    /// Reads the environment.
    pub(crate) fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings from `var` (the environment, or a test's table).
    pub(crate) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let upstream = var("UPSTREAM_URL")
            .ok_or("UPSTREAM_URL is required: where requests go, e.g. http://127.0.0.1:9000")?;
        let upstream = parse_upstream(&upstream)?;
        let seconds = |name: &str, default: u64| -> Result<Duration, String> {
            match var(name) {
                None => Ok(Duration::from_secs(default)),
                Some(value) => value
                    .trim()
                    .parse::<u64>()
                    .map(Duration::from_secs)
                    .map_err(|_| {
                        format!("{name} must be a whole number of seconds, not {value:?}")
                    }),
            }
        };
        let bytes = |name: &str, default: usize| -> Result<usize, String> {
            match var(name) {
                None => Ok(default),
                Some(value) => match value.trim().parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!(
                        "{name} must be a positive number of bytes, not {value:?}"
                    )),
                },
            }
        };
        let address = |name: &str| -> Result<Option<SocketAddr>, String> {
            var(name)
                .map(|value| {
                    value.trim().parse().map_err(|_| {
                        format!("{name} must be an address such as 127.0.0.1:9090, not {value:?}")
                    })
                })
                .transpose()
        };
        let lease = seconds("GATEWAY_LEASE_SECS", 30)?;
        let upstream_timeout = seconds("GATEWAY_UPSTREAM_TIMEOUT_SECS", 25)?;
        if lease.is_zero() {
            return Err("GATEWAY_LEASE_SECS must be at least 1".to_owned());
        }
        if upstream_timeout.is_zero() || upstream_timeout >= lease {
            return Err(format!(
                "GATEWAY_UPSTREAM_TIMEOUT_SECS ({}) must be at least 1 and below GATEWAY_LEASE_SECS ({}): \
                 a forwarded request must end before its key's lease does",
                upstream_timeout.as_secs(),
                lease.as_secs()
            ));
        }
        let ttl = seconds("RECORD_TTL_SECS", 86_400)?;
        if ttl.is_zero() {
            return Err("RECORD_TTL_SECS must be at least 1".to_owned());
        }
        Ok(Self {
            upstream,
            bind: address("BIND_ADDR")?.unwrap_or_else(|| ([127, 0, 0, 1], 8080).into()),
            store: parse_store(var("DATABASE_URL"))?,
            methods: parse_methods(&var("GATEWAY_METHODS").unwrap_or_else(|| "POST,PATCH".into()))?,
            key_required: parse_bool("GATEWAY_KEY_REQUIRED", var("GATEWAY_KEY_REQUIRED"))?,
            scope_header: var("GATEWAY_SCOPE_HEADER")
                .filter(|name| !name.trim().is_empty())
                .map(|name| header_name("GATEWAY_SCOPE_HEADER", &name))
                .transpose()?,
            wait: seconds("GATEWAY_WAIT_SECS", 0)?,
            lease,
            upstream_timeout,
            body_limit: bytes("GATEWAY_BODY_LIMIT_BYTES", 1 << 20)?,
            response_limit: bytes("GATEWAY_RESPONSE_LIMIT_BYTES", 1 << 20)?,
            keep_headers: var("GATEWAY_KEEP_HEADERS")
                .unwrap_or_default()
                .split(',')
                .filter(|name| !name.trim().is_empty())
                .map(|name| header_name("GATEWAY_KEEP_HEADERS", name))
                .collect::<Result<_, _>>()?,
            ttl,
            cache_bytes: match var("GATEWAY_CACHE_BYTES") {
                None => 64 << 20,
                Some(value) => value.trim().parse().map_err(|_| {
                    format!(
                        "GATEWAY_CACHE_BYTES must be a number of bytes (0: no cache), not {value:?}"
                    )
                })?,
            },
            metrics_addr: address("METRICS_ADDR")?,
            console_addr: address("CONSOLE_ADDR")?,
            console_token: var("CONSOLE_TOKEN").filter(|token| !token.is_empty()),
        })
    }
}

fn parse_upstream(value: &str) -> Result<Uri, String> {
    let uri: Uri = value
        .trim()
        .parse()
        .map_err(|_| format!("UPSTREAM_URL is not a URL: {value:?}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "UPSTREAM_URL must be an http:// URL with a host, such as http://127.0.0.1:9000, not {value:?}"
        ));
    }
    if uri.query().is_some() {
        return Err(format!("UPSTREAM_URL must not have a query: {value:?}"));
    }
    Ok(uri)
}

fn parse_store(url: Option<String>) -> Result<Store, String> {
    let Some(url) = url.filter(|url| !url.trim().is_empty()) else {
        return Ok(Store::Sqlite("gateway.db".to_owned()));
    };
    let scheme = url.split(':').next().unwrap_or_default();
    match scheme {
        "sqlite" => {
            let path = url["sqlite:".len()..].trim_start_matches("//");
            let path = path.split('?').next().unwrap_or(path);
            if path.is_empty() {
                return Err("DATABASE_URL sqlite: needs a file, e.g. sqlite:gateway.db".to_owned());
            }
            Ok(Store::Sqlite(path.to_owned()))
        }
        "postgres" | "postgresql" => Ok(Store::Postgres(url)),
        "mysql" | "mariadb" => Ok(Store::MySql(url.replacen("mariadb:", "mysql:", 1))),
        _ => Err(format!(
            "DATABASE_URL must start with sqlite:, postgres:// or mysql:// (it starts with {scheme:?})"
        )),
    }
}

fn parse_methods(value: &str) -> Result<Vec<Method>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|method| !method.is_empty())
        .map(|method| {
            Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("GATEWAY_METHODS: {method:?} is not an HTTP method"))
        })
        .collect()
}

fn parse_bool(name: &str, value: Option<String>) -> Result<bool, String> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(false),
        Some(value) if value.eq_ignore_ascii_case("true") || value == "1" => Ok(true),
        Some(value) if value.eq_ignore_ascii_case("false") || value == "0" => Ok(false),
        Some(value) => Err(format!("{name} must be true or false, not {value:?}")),
    }
}

fn header_name(variable: &str, name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{variable}: {name:?} is not a header name"))
}

/// `url` without its password.
pub(crate) fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => match url[scheme + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
        Settings::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = settings(&[("UPSTREAM_URL", "http://127.0.0.1:9000")]).unwrap();
        assert_eq!(s.bind, "127.0.0.1:8080".parse().unwrap());
        assert!(matches!(s.store, Store::Sqlite(ref path) if path == "gateway.db"));
        assert_eq!(s.methods, [Method::POST, Method::PATCH]);
        assert!(!s.key_required);
        assert_eq!(s.scope_header, None);
        assert_eq!(s.wait, Duration::ZERO);
        assert_eq!(s.lease, Duration::from_secs(30));
        assert_eq!(s.upstream_timeout, Duration::from_secs(25));
        assert_eq!((s.body_limit, s.response_limit), (1 << 20, 1 << 20));
        assert!(s.keep_headers.is_empty());
        assert_eq!(s.ttl, Duration::from_secs(86_400));
        assert_eq!(s.cache_bytes, 64 << 20);
        assert_eq!((s.metrics_addr, s.console_addr), (None, None));
        assert_eq!(s.console_token, None);
    }

    #[test]
    fn every_mistake_is_one_line_naming_its_variable() {
        let upstream = ("UPSTREAM_URL", "http://127.0.0.1:9000");
        for (vars, names) in [
            (vec![], "UPSTREAM_URL"),
            (vec![("UPSTREAM_URL", "https://x")], "UPSTREAM_URL"),
            (
                vec![upstream, ("GATEWAY_LEASE_SECS", "20")],
                "GATEWAY_UPSTREAM_TIMEOUT_SECS",
            ),
            (
                vec![upstream, ("GATEWAY_UPSTREAM_TIMEOUT_SECS", "30")],
                "GATEWAY_LEASE_SECS",
            ),
            (
                vec![upstream, ("GATEWAY_METHODS", "PO ST")],
                "GATEWAY_METHODS",
            ),
            (
                vec![upstream, ("GATEWAY_KEY_REQUIRED", "yes")],
                "GATEWAY_KEY_REQUIRED",
            ),
            (
                vec![upstream, ("GATEWAY_BODY_LIMIT_BYTES", "0")],
                "GATEWAY_BODY_LIMIT_BYTES",
            ),
            (
                vec![upstream, ("DATABASE_URL", "redis://x")],
                "DATABASE_URL",
            ),
            (vec![upstream, ("METRICS_ADDR", "nine")], "METRICS_ADDR"),
            (
                vec![upstream, ("GATEWAY_SCOPE_HEADER", "a b")],
                "GATEWAY_SCOPE_HEADER",
            ),
        ] {
            let error = settings(&vars).unwrap_err();
            assert!(error.contains(names), "{error}");
            assert!(!error.contains('\n'), "{error}");
        }
    }

    #[test]
    fn stores_and_lists_are_read_as_written() {
        let s = settings(&[
            ("UPSTREAM_URL", "http://upstream:9000"),
            ("DATABASE_URL", "mariadb://app:secret@db/gw"),
            ("GATEWAY_METHODS", "post, put"),
            ("GATEWAY_KEEP_HEADERS", "X-Request-Id,ETag"),
            ("GATEWAY_KEY_REQUIRED", "true"),
        ])
        .unwrap();
        assert!(matches!(s.store, Store::MySql(ref url) if url == "mysql://app:secret@db/gw"));
        assert_eq!(s.store.describe(), "MySQL/MariaDB mysql://app:***@db/gw");
        assert_eq!(s.methods, [Method::POST, Method::PUT]);
        assert_eq!(s.keep_headers.len(), 2);
        assert!(s.key_required);
        let none = settings(&[("UPSTREAM_URL", "http://u"), ("GATEWAY_METHODS", "")]).unwrap();
        assert!(none.methods.is_empty(), "an empty list guards nothing");
    }
}
