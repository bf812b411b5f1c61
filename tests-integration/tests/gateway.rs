//! `idempotency-gateway`, driven from outside as its users run it: the binary as a child
//! process, an upstream the test runs (it counts the calls per key), the store a SQLite file
//! of the test's own or a schema of the test's own on PostgreSQL. Every row of the guide's
//! table of answers, each with the upstream's call count checked.

#![cfg(feature = "gateway")]

mod common;
#[path = "gateway/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use harness::*;

/// The gateway on a SQLite file in a directory of its own, in front of `upstream`.
async fn gateway(dir: &TempDir, upstream: &str, env: &[(&str, &str)]) -> Gateway {
    let mut all = vec![("UPSTREAM_URL", upstream)];
    all.extend_from_slice(env);
    Gateway::start(&dir.0, &all).await
}

/// The PostgreSQL of `DATABASE_URL` with a schema of the test's own (`None`, and the test
/// says it skipped, without one).
struct PgSchema {
    url: String,
    schema: String,
}

impl PgSchema {
    async fn new() -> Option<Self> {
        let Ok(base) = std::env::var("DATABASE_URL") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "DATABASE_URL is unset (CI is set, so this is an error)"
            );
            eprintln!("skipped: DATABASE_URL is unset");
            return None;
        };
        let schema = common::unique_name("gateway");
        let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .unwrap();
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-c%20search_path%3D{schema}");
        Some(Self { url, schema })
    }

    /// The same database through `host:port` (a [`Link`]).
    fn through(&self, addr: std::net::SocketAddr) -> String {
        let base = std::env::var("DATABASE_URL").unwrap();
        let at = base.rfind('@').unwrap() + 1;
        let end = base[at..].find('/').map_or(base.len(), |i| at + i);
        let via = format!("{}{addr}{}", &base[..at], &base[end..]);
        let separator = if via.contains('?') { '&' } else { '?' };
        format!("{via}{separator}options=-c%20search_path%3D{}", self.schema)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let base = std::env::var("DATABASE_URL").unwrap();
        let schema = self.schema.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok((client, connection)) =
                    tokio_postgres::connect(&base, tokio_postgres::NoTls).await
                {
                    tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// First time: forwarded once with the client's key and a fencing token, answered and
/// stored. Again: the stored answer, replayed; the upstream not called. Another body: 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_is_forwarded_once_and_replayed() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(
        &dir,
        &upstream.url(),
        &[("GATEWAY_KEEP_HEADERS", "X-Request-Id")],
    )
    .await;

    let first = post(&gw.url("/orders"), "\"order 1\"", r#"{"amount": 5}"#).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(upstream.calls("\"order 1\""), 1);
    let seen = upstream.seen().pop().unwrap();
    assert_eq!(
        seen.key(),
        Some("\"order 1\""),
        "the client's key, unchanged"
    );
    let token = seen.token().expect("a fencing token");
    assert!(token > 0);
    assert_eq!(first.json()["token"], token);
    assert_eq!(seen.body, r#"{"amount": 5}"#);

    for _ in 0..2 {
        let again = post(&gw.url("/orders"), "\"order 1\"", r#"{"amount": 5}"#).await;
        assert_eq!(again.status, 201);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(again.header("location"), Some("/orders/1"));
        assert_eq!(again.header("x-request-id"), Some("req-1"), "a kept header");
        assert_eq!(again.header("x-other"), None, "not kept");
    }
    assert_eq!(
        upstream.calls("\"order 1\""),
        1,
        "the upstream was not called again"
    );

    let other = post(&gw.url("/orders"), "\"order 1\"", r#"{"amount": 6}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.code(), "key_reused");
    assert_eq!(upstream.calls("\"order 1\""), 1);
}

/// A request without a key, or of a method not guarded, is proxied: no key or token added,
/// nothing stored, every one reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_key_or_of_other_methods_pass_through() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(&dir, &upstream.url(), &[]).await;
    for _ in 0..2 {
        let answer = send("POST", &gw.url("/orders"), None, &[], "{}").await;
        assert_eq!(answer.status, 201);
        assert!(!answer.replayed());
        let answer = send("PUT", &gw.url("/orders/1"), Some("k-put"), &[], "{}").await;
        assert_eq!(answer.status, 201);
        let answer = send("GET", &gw.url("/orders/1?x=1"), Some("k-get"), &[], "").await;
        assert_eq!(answer.status, 201);
    }
    assert_eq!(upstream.total(), 6, "each reached the upstream");
    for seen in upstream.seen() {
        assert_eq!(
            seen.token(),
            None,
            "no fencing token on {} {}",
            seen.method,
            seen.path
        );
    }
    assert_eq!(upstream.calls(""), 2);
    assert_eq!(
        upstream.calls("k-put"),
        2,
        "the client's own header passes, unguarded"
    );
    assert_eq!(upstream.calls("k-get"), 2);
    // Nothing was stored: a guarded request under those keys runs.
    let guarded = post(&gw.url("/orders"), "k-put", "{}").await;
    assert!(!guarded.replayed());
    assert_eq!(upstream.calls("k-put"), 3);
}

/// 5xx, 408, 409, 425 and 429 are returned and not stored: the retry reaches the upstream.
/// Any other 2xx–4xx is stored; a redirect is returned, not followed, and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_answers_free_the_key_and_final_ones_are_stored() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(&dir, &upstream.url(), &[]).await;
    for code in [500, 502, 503, 504, 408, 409, 425, 429] {
        let key = format!("retry-{code}");
        let path = format!("/status/{code}");
        for call in 1..=2 {
            let answer = post(&gw.url(&path), &key, "{}").await;
            assert_eq!(answer.status, code);
            assert!(!answer.replayed());
            assert_eq!(answer.json()["call"], call);
        }
        assert_eq!(
            upstream.calls(&key),
            2,
            "{code}: the key was free for the retry"
        );
    }
    for code in [200, 201, 202, 204, 400, 404, 410, 422] {
        let key = format!("final-{code}");
        let path = format!("/status/{code}");
        let first = post(&gw.url(&path), &key, "{}").await;
        assert_eq!(first.status, code);
        let again = post(&gw.url(&path), &key, "{}").await;
        assert_eq!((again.status, again.replayed()), (code, true), "{code}");
        assert_eq!(again.body, first.body);
        assert_eq!(upstream.calls(&key), 1, "{code}: stored");
    }
    let redirect = post(&gw.url("/redirect"), "redirect", "{}").await;
    assert_eq!(redirect.status, 302);
    assert_eq!(redirect.header("location"), Some("/elsewhere"));
    let again = post(&gw.url("/redirect"), "redirect", "{}").await;
    assert_eq!((again.status, again.replayed()), (302, true));
    assert_eq!(again.header("location"), Some("/elsewhere"));
    assert_eq!(upstream.calls("redirect"), 1);
    assert!(
        upstream.seen().iter().all(|seen| seen.path != "/elsewhere"),
        "the redirect was not followed"
    );
}

/// An answer over `GATEWAY_RESPONSE_LIMIT_BYTES` is returned whole and kept without its
/// body: a repeat gets the status and headers, an empty body and `Idempotent-Body-Omitted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_is_returned_whole_and_kept_without_its_body() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(
        &dir,
        &upstream.url(),
        &[("GATEWAY_RESPONSE_LIMIT_BYTES", "1000")],
    )
    .await;
    let first = post(&gw.url("/big/5000"), "big", "{}").await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), 5000, "returned whole");
    for _ in 0..2 {
        let again = post(&gw.url("/big/5000"), "big", "{}").await;
        assert_eq!(again.status, 201);
        assert!(again.replayed());
        assert_eq!(again.header("idempotent-body-omitted"), Some("true"));
        assert_eq!(again.header("content-type"), Some("text/plain"));
        assert!(again.body.is_empty());
    }
    assert_eq!(upstream.calls("big"), 1, "never forwarded again");
    let small = post(&gw.url("/big/900"), "small", "{}").await;
    let again = post(&gw.url("/big/900"), "small", "{}").await;
    assert_eq!(
        (again.body.len(), again.header("idempotent-body-omitted")),
        (900, None)
    );
    assert_eq!(again.body, small.body);
}

/// While the first is upstream, the same key is 409 `in_flight` with `Retry-After`; with
/// `GATEWAY_WAIT_SECS`, it waits for the first answer and replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_in_flight_is_409_or_waits_for_the_answer() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(&dir, &upstream.url(), &[]).await;
    let first = tokio::spawn({
        let url = gw.url("/stall-first");
        async move { post(&url, "twin", "{}").await }
    });
    eventually(|| upstream.calls("twin") == 1).await;
    let twin = post(&gw.url("/stall-first"), "twin", "{}").await;
    assert_eq!(twin.status, 409);
    assert_eq!(twin.code(), "in_flight");
    let retry_after = twin.retry_after();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    upstream.release();
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(upstream.calls("twin"), 1);
    drop(gw);

    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(&dir, &upstream.url(), &[("GATEWAY_WAIT_SECS", "5")]).await;
    let first = tokio::spawn({
        let url = gw.url("/stall-first");
        async move { post(&url, "waiter", "{}").await }
    });
    eventually(|| upstream.calls("waiter") == 1).await;
    let waiting = tokio::spawn({
        let url = gw.url("/stall-first");
        async move { post(&url, "waiter", "{}").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    upstream.release();
    let first = first.await.unwrap();
    let waited = waiting.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(
        (waited.status, waited.replayed()),
        (201, true),
        "{waited:?}"
    );
    assert_eq!(waited.body, first.body);
    assert_eq!(upstream.calls("waiter"), 1);

    // Past the wait, the twin is 409.
    let slow = tokio::spawn({
        let url = gw.url("/stall-first");
        async move { post(&url, "long", "{}").await }
    });
    eventually(|| upstream.calls("long") == 1).await;
    let started = Instant::now();
    let twin = post(&gw.url("/stall-first"), "long", "{}").await;
    assert_eq!(twin.status, 409);
    assert_eq!(twin.code(), "in_flight");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "it waited first"
    );
    upstream.release();
    assert_eq!(slow.await.unwrap().status, 201);
    assert_eq!(upstream.calls("long"), 1);
}

/// The upstream refuses the connection: 502, nothing stored, the key free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_502_and_frees_the_key() {
    let dir = TempDir::new();
    let port = free_port().await;
    let url = format!("http://127.0.0.1:{port}");
    let gw = gateway(&dir, &url, &[]).await;
    let refused = post(&gw.url("/orders"), "refused", "{}").await;
    assert_eq!(refused.status, 502);
    assert_eq!(refused.code(), "upstream_unreachable");
    // The upstream comes up on that port: the retry is forwarded at once.
    let upstream = Upstream::on(
        tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap(),
    );
    let retry = post(&gw.url("/orders"), "refused", "{}").await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(upstream.calls("refused"), 1);
}

/// The upstream times out: 504, and the key stays held until its lease ends (409 with the
/// seconds left); then the retry is forwarded with a higher fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_holds_the_key_until_the_lease_ends() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(
        &dir,
        &upstream.url(),
        &[
            ("GATEWAY_LEASE_SECS", "3"),
            ("GATEWAY_UPSTREAM_TIMEOUT_SECS", "1"),
        ],
    )
    .await;
    let claimed = Instant::now();
    let timed_out = post(&gw.url("/stall-first"), "slow", "{}").await;
    assert_eq!(timed_out.status, 504);
    assert_eq!(timed_out.code(), "upstream_timed_out");
    let first_token = upstream.seen()[0].token().unwrap();
    let held = post(&gw.url("/stall-first"), "slow", "{}").await;
    assert_eq!(held.status, 409);
    assert_eq!(held.code(), "in_flight");
    assert!(
        (1..=2).contains(&held.retry_after()),
        "{}",
        held.retry_after()
    );
    assert_eq!(upstream.calls("slow"), 1, "not forwarded while held");

    tokio::time::sleep(
        Duration::from_secs(3).saturating_sub(claimed.elapsed()) + Duration::from_millis(300),
    )
    .await;
    let retry = post(&gw.url("/stall-first"), "slow", "{}").await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(upstream.calls("slow"), 2);
    let second_token = upstream.seen()[1].token().unwrap();
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );
    upstream.release();
}

/// The upstream closes the connection after the request was sent: 502, and the key stays
/// held until its lease ends, as for a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_after_sending_holds_the_key() {
    let dir = TempDir::new();
    let upstream = RawUpstream::start("").await;
    let gw = gateway(
        &dir,
        &upstream.url(),
        &[
            ("GATEWAY_LEASE_SECS", "2"),
            ("GATEWAY_UPSTREAM_TIMEOUT_SECS", "1"),
        ],
    )
    .await;
    let closed = post(&gw.url("/orders"), "closed", "{}").await;
    assert_eq!(closed.status, 502);
    assert_eq!(closed.code(), "upstream_closed");
    let held = post(&gw.url("/orders"), "closed", "{}").await;
    assert_eq!((held.status, held.code().as_str()), (409, "in_flight"));
    assert_eq!(upstream.requests.lock().unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let again = post(&gw.url("/orders"), "closed", "{}").await;
    assert_eq!(again.status, 502);
    let requests = upstream.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "forwarded again after the lease");
    let token = |head: &str| -> i64 {
        head.lines()
            .find_map(|line| line.strip_prefix("idempotency-fencing-token: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert!(token(&requests[1]) > token(&requests[0]));
}

/// The gateway SIGKILLed while a request is upstream: restarted on the same file, it keeps
/// the lease (409 until it ends), then forwards the retry with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_keeps_the_lease_across_a_restart() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let env = [
        ("GATEWAY_LEASE_SECS", "3"),
        ("GATEWAY_UPSTREAM_TIMEOUT_SECS", "2"),
    ];
    let gw = gateway(&dir, &upstream.url(), &env).await;
    let url = gw.url("/stall-first");
    let claimed = Instant::now();
    let pending = tokio::spawn(async move {
        let _ = client()
            .post(url)
            .header("idempotency-key", "killed")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await;
    });
    eventually(|| upstream.calls("killed") == 1).await;
    gw.kill().await;
    let _ = pending.await;

    let gw = gateway(&dir, &upstream.url(), &env).await;
    let held = post(&gw.url("/stall-first"), "killed", "{}").await;
    assert_eq!((held.status, held.code().as_str()), (409, "in_flight"));
    assert_eq!(upstream.calls("killed"), 1);
    tokio::time::sleep(
        Duration::from_secs(3).saturating_sub(claimed.elapsed()) + Duration::from_millis(300),
    )
    .await;
    let retry = post(&gw.url("/stall-first"), "killed", "{}").await;
    assert_eq!(retry.status, 201, "{retry:?}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].token().unwrap() > seen[0].token().unwrap());
    upstream.release();
}

/// A guarded keyed body over `GATEWAY_BODY_LIMIT_BYTES`, by `Content-Length` or while a
/// chunked body arrives, is 413 and nothing is forwarded; pass-through bodies are not
/// limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_413_and_not_forwarded() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(
        &dir,
        &upstream.url(),
        &[("GATEWAY_BODY_LIMIT_BYTES", "100")],
    )
    .await;
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(200));
    let answer = post(&gw.url("/orders"), "large", &big).await;
    assert_eq!(answer.status, 413);
    let status = post_chunked(&gw.addr, "/orders", "chunked", big.as_bytes()).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert_eq!(upstream.total(), 0, "nothing forwarded");
    let passed = send("POST", &gw.url("/orders"), None, &[], &big).await;
    assert_eq!(passed.status, 201);
    assert_eq!(upstream.seen()[0].body.len(), big.len());
}

/// `GATEWAY_KEY_REQUIRED=true`: a guarded method without a key is 400 `missing_key`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_key_is_400_without_it() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(&dir, &upstream.url(), &[("GATEWAY_KEY_REQUIRED", "true")]).await;
    let answer = send("POST", &gw.url("/orders"), None, &[], "{}").await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.code(), "missing_key");
    let invalid = send(
        "POST",
        &gw.url("/orders"),
        Some("\"unterminated"),
        &[],
        "{}",
    )
    .await;
    assert_eq!(
        (invalid.status, invalid.code().as_str()),
        (400, "invalid_key")
    );
    let get = send("GET", &gw.url("/orders"), None, &[], "").await;
    assert_eq!(get.status, 201, "other methods pass");
    assert_eq!(upstream.total(), 1);
}

/// `GATEWAY_SCOPE_HEADER`: the same key under two values of the header is two requests;
/// requests without the header share a scope of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_scoped_by_the_scope_header() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(
        &dir,
        &upstream.url(),
        &[("GATEWAY_SCOPE_HEADER", "Authorization")],
    )
    .await;
    let url = gw.url("/orders");
    let alice = send(
        "POST",
        &url,
        Some("k"),
        &[("authorization", "Bearer alice")],
        "{}",
    )
    .await;
    let bob = send(
        "POST",
        &url,
        Some("k"),
        &[("authorization", "Bearer bob")],
        "{}",
    )
    .await;
    let nobody = send("POST", &url, Some("k"), &[], "{}").await;
    assert_eq!([alice.status, bob.status, nobody.status], [201; 3]);
    assert_eq!(upstream.calls("k"), 3, "three scopes");
    let again = send(
        "POST",
        &url,
        Some("k"),
        &[("authorization", "Bearer alice")],
        "{}",
    )
    .await;
    assert!(again.replayed());
    assert_eq!(again.body, alice.body);
    let again = send("POST", &url, Some("k"), &[], "{}").await;
    assert!(again.replayed(), "no header: one shared scope");
    assert_eq!(again.body, nobody.body);
    assert_eq!(upstream.calls("k"), 3);
}

/// Hop-by-hop headers and those `Connection` names are dropped both ways, end-to-end ones
/// pass, `Host` is the upstream's, `X-Forwarded-For` is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_dropped_both_ways() {
    let dir = TempDir::new();
    let upstream = RawUpstream::start(
        "HTTP/1.1 200 OK\r\nConnection: close, X-Private\r\nX-Private: secret\r\n\
         Keep-Alive: timeout=5\r\nX-End: e2e\r\nContent-Length: 2\r\n\r\nok",
    )
    .await;
    let gw = gateway(&dir, &upstream.url(), &[]).await;
    let answer = send(
        "GET",
        &gw.url("/anything"),
        None,
        &[
            ("connection", "keep-alive, X-Drop"),
            ("x-drop", "1"),
            ("keep-alive", "timeout=9"),
            ("te", "trailers"),
            ("x-keep", "2"),
            ("x-forwarded-for", "10.9.8.7"),
            ("idempotency-fencing-token", "12345"),
        ],
        "",
    )
    .await;
    assert_eq!((answer.status, &answer.body[..]), (200, &b"ok"[..]));
    assert_eq!(answer.header("x-end"), Some("e2e"));
    assert_eq!(answer.header("x-private"), None);
    assert_eq!(answer.header("keep-alive"), None);
    let head = upstream.requests.lock().unwrap()[0].to_ascii_lowercase();
    let has = |line: &str| head.lines().any(|l| l == line);
    assert!(has(&format!("host: {}", upstream.addr)), "{head}");
    assert!(has("x-keep: 2"), "{head}");
    assert!(has("x-forwarded-for: 10.9.8.7, 127.0.0.1"), "{head}");
    for gone in [
        "x-drop:",
        "keep-alive:",
        "te:",
        "idempotency-fencing-token:",
    ] {
        assert!(
            !head.lines().any(|l| l.starts_with(gone)),
            "{gone} in {head}"
        );
    }
}

/// The store unreachable at start: the gateway exits non-zero with one line naming it.
/// A timeout not below the lease: one line saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_unreachable_at_start_or_a_bad_setting_is_one_line() {
    let dir = TempDir::new();
    let port = free_port().await;
    for (env, expected) in [
        (
            vec![(
                "DATABASE_URL",
                format!("postgres://gw:secret@127.0.0.1:{port}/db"),
            )],
            format!("PostgreSQL postgres://gw:***@127.0.0.1:{port}/db"),
        ),
        (
            vec![("DATABASE_URL", format!("mysql://root@127.0.0.1:{port}/db"))],
            format!("MySQL/MariaDB mysql://root@127.0.0.1:{port}/db"),
        ),
        (
            vec![("DATABASE_URL", "sqlite:/nonexistent-dir/gw.db".to_owned())],
            "SQLite file /nonexistent-dir/gw.db".to_owned(),
        ),
        (
            vec![("GATEWAY_UPSTREAM_TIMEOUT_SECS", "30".to_owned())],
            "must be at least 1 and below GATEWAY_LEASE_SECS (30)".to_owned(),
        ),
    ] {
        let mut env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (*n, v.as_str())).collect();
        env.push(("UPSTREAM_URL", "http://127.0.0.1:9"));
        let (code, stderr) = fails_to_start(&dir.0, &env).await;
        assert_eq!(code, Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(&expected), "{expected} in {stderr}");
        assert!(!stderr.contains("secret"), "{stderr}");
    }
}

/// A SQLite file locked past its busy timeout: 503 with `Retry-After`, nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_sqlite_file_is_503_and_nothing_is_forwarded() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let gw = gateway(&dir, &upstream.url(), &[]).await;
    assert_eq!(post(&gw.url("/orders"), "before", "{}").await.status, 201);
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(dir.0.join("gateway.db"));
    let mut locker = sqlx::ConnectOptions::connect(&options).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut locker)
        .await
        .unwrap();
    let locked = post(&gw.url("/orders"), "while-locked", "{}").await;
    assert_eq!(locked.status, 503, "{locked:?}\n{}", gw.log());
    assert_eq!(locked.code(), "store_unavailable");
    assert!(locked.retry_after() >= 1);
    assert_eq!(
        upstream.calls("while-locked"),
        0,
        "fail closed: nothing forwarded"
    );
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let after = post(&gw.url("/orders"), "while-locked", "{}").await;
    assert_eq!(after.status, 201);
    assert_eq!(upstream.calls("while-locked"), 1);
}

/// PostgreSQL cut under the gateway: 503 with `Retry-After`, nothing forwarded; back, the
/// key runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_postgres_is_503_and_nothing_is_forwarded() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let target = std::env::var("DATABASE_URL")
        .ok()
        .and_then(|url| {
            let at = url.rfind('@')? + 1;
            let rest = &url[at..];
            Some(rest[..rest.find('/').unwrap_or(rest.len())].to_owned())
        })
        .unwrap();
    let link = Link::to(target.clone()).await;
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let url = pg.through(link.addr);
    let gw = gateway(&dir, &upstream.url(), &[("DATABASE_URL", url.as_str())]).await;
    assert_eq!(
        post(&gw.url("/orders"), "pg-before", "{}").await.status,
        201
    );
    link.cut();
    let lost = post(&gw.url("/orders"), "pg-lost", "{}").await;
    assert_eq!(lost.status, 503, "{lost:?}\n{}", gw.log());
    assert_eq!(lost.code(), "store_unavailable");
    assert!(lost.retry_after() >= 1);
    assert_eq!(
        upstream.calls("pg-lost"),
        0,
        "fail closed: nothing forwarded"
    );
    drop(gw);
    drop(pg);
}

/// Two gateways on one PostgreSQL database, each key sent to both at once: the upstream is
/// called once per key, and every answer naming a result names that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_database_forward_each_key_once() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let (dir_a, dir_b) = (TempDir::new(), TempDir::new());
    let upstream = Upstream::start().await;
    let env = [
        ("DATABASE_URL", pg.url.as_str()),
        ("GATEWAY_WAIT_SECS", "5"),
    ];
    let a = gateway(&dir_a, &upstream.url(), &env).await;
    let b = gateway(&dir_b, &upstream.url(), &env).await;
    let mut twins = Vec::new();
    for i in 0..60 {
        let key = format!("split-{i}");
        for url in [a.url("/slow"), b.url("/slow")] {
            let key = key.clone();
            twins.push(tokio::spawn(async move {
                (key.clone(), post(&url, &key, "{}").await)
            }));
        }
    }
    let mut bodies: std::collections::HashMap<String, Vec<Vec<u8>>> = Default::default();
    let (mut fresh, mut replayed, mut conflicts) = (0, 0, 0);
    for twin in twins {
        let (key, answer) = twin.await.unwrap();
        match answer.status {
            201 if answer.replayed() => replayed += 1,
            201 => fresh += 1,
            409 => {
                conflicts += 1;
                continue;
            }
            other => panic!("{key}: {other} {answer:?}"),
        }
        bodies.entry(key).or_default().push(answer.body.to_vec());
    }
    eprintln!("twins: {fresh} forwarded, {replayed} replayed, {conflicts} × 409");
    assert_eq!(fresh, 60, "one forwarded answer per key");
    for i in 0..60 {
        let key = format!("split-{i}");
        assert_eq!(upstream.calls(&key), 1, "{key}");
        let answers = &bodies[&key];
        assert!(
            answers.windows(2).all(|w| w[0] == w[1]),
            "{key}: one result"
        );
    }
}

/// On MySQL/MariaDB (`MYSQL_URL`, a database of the test's own): forwarded once, replayed,
/// and a twin sent to a second gateway on the same database is not forwarded again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_on_mariadb_forward_once_and_replay() {
    let Ok(server) = std::env::var("MYSQL_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "MYSQL_URL is unset (CI is set, so this is an error)"
        );
        eprintln!("skipped: MYSQL_URL is unset");
        return;
    };
    let server = server.trim_end_matches('/').to_owned();
    let database = common::unique_name("gateway");
    let admin = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&server)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&admin)
        .await
        .unwrap();
    let url = format!("{server}/{database}");
    let (dir_a, dir_b) = (TempDir::new(), TempDir::new());
    let upstream = Upstream::start().await;
    let env = [("DATABASE_URL", url.as_str())];
    let a = gateway(&dir_a, &upstream.url(), &env).await;
    let b = gateway(&dir_b, &upstream.url(), &env).await;
    let first = post(&a.url("/orders"), "maria-1", r#"{"amount": 1}"#).await;
    assert_eq!(first.status, 201, "{first:?}\n{}", a.log());
    for gw in [&a, &b] {
        let again = post(&gw.url("/orders"), "maria-1", r#"{"amount": 1}"#).await;
        assert_eq!((again.status, again.replayed()), (201, true));
        assert_eq!(again.body, first.body);
    }
    let other = post(&b.url("/orders"), "maria-1", r#"{"amount": 2}"#).await;
    assert_eq!((other.status, other.code().as_str()), (422, "key_reused"));
    assert_eq!(upstream.calls("maria-1"), 1);
    drop((a, b));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}")))
        .execute(&admin)
        .await
        .unwrap();
}

/// `METRICS_ADDR` serves the crate's metrics; `CONSOLE_ADDR` the console, read-only without
/// `CONSOLE_TOKEN`, its actions behind `Authorization: Bearer` with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_the_console_are_served_where_asked() {
    let dir = TempDir::new();
    let upstream = Upstream::start().await;
    let side = [
        ("METRICS_ADDR", "127.0.0.1:0"),
        ("CONSOLE_ADDR", "127.0.0.1:0"),
    ];
    let gw = gateway(&dir, &upstream.url(), &side).await;
    post(&gw.url("/orders"), "m-1", "{}").await;
    post(&gw.url("/orders"), "m-1", "{}").await;
    let metrics = send(
        "GET",
        &format!("http://{}/metrics", gw.metrics.as_ref().unwrap()),
        None,
        &[],
        "",
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("idempotency_requests_total{outcome=\"replayed\"} 1")),
        "{text}"
    );
    let console = gw.console.clone().unwrap();
    let page = send("GET", &format!("http://{console}/"), None, &[], "").await;
    assert_eq!(page.status, 200);
    let action = send(
        "POST",
        &format!("http://{console}/release-all"),
        None,
        &[],
        "",
    )
    .await;
    assert_eq!(
        (action.status, action.code().as_str()),
        (403, "console_read_only")
    );
    drop(gw);

    let dir = TempDir::new();
    let mut env = side.to_vec();
    env.push(("CONSOLE_TOKEN", "s3cret"));
    let gw = gateway(&dir, &upstream.url(), &env).await;
    let console = gw.console.clone().unwrap();
    let url = format!("http://{console}/release-all");
    let anonymous = send("POST", &url, None, &[], "").await;
    assert_eq!(
        (anonymous.status, anonymous.code().as_str()),
        (401, "console_token_required")
    );
    let wrong = send("POST", &url, None, &[("authorization", "Bearer nope")], "").await;
    assert_eq!(wrong.status, 401);
    // Past the token, the console's own checks (its CSRF token) answer.
    let bearer = send(
        "POST",
        &url,
        None,
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    assert_ne!(bearer.status, 401, "{bearer:?}");
    let code = bearer.json()["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        !code.starts_with("console_"),
        "the gateway's guard let it through: {bearer:?}"
    );
}

/// Polls `check` every 20 ms until it holds; panics after 10 s.
async fn eventually(check: impl Fn() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the condition did not hold within 10 s");
}
