//! The troubleshooting console in a real browser: the orders example serves it at
//! `/admin/` (behind HTTP Basic authentication), and headless Chromium, driven through
//! chromedriver's W3C WebDriver API, uses it as an operator does. Screenshots of each page
//! go to `target/console-screenshots/`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them) and RabbitMQ;
//! without them the test says it skipped, except under `CI`, where it fails.
#![cfg(all(feature = "console", feature = "rabbitmq", feature = "deadpool"))]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum_idempotency::outbox::{OutboxMessage, OutboxRelay, RabbitPublisher};
use axum_idempotency::{IdempotencyLayer, IdempotentLease};
use common::*;
use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::ServiceExt;

const PASSWORD: &str = "console-test-password";

/// A binary on `PATH` (or in /usr/bin), or `None` when the test is to be skipped.
fn binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is not installed (CI is set, so this is an error): \
             apt-get install chromium chromium-driver"
        );
        eprintln!("skipped: {name} is not installed");
    }
    found
}

/// One HTTP/1.1 exchange; status, headers, body (read to its `content-length`, or to the
/// end of the connection without one).
async fn http(addr: &str, request: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let mut buf = vec![0u8; 16384];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut buf))
            .await
            .expect("an answer within 60 s")
            .unwrap();
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
        let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok());
        if length.is_some_and(|length| response.len() >= end + 4 + length) {
            break;
        }
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, head.to_owned(), body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = text.bytes().filter(|b| *b != b'=').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| {
            acc | (u32::from(value(*c)) << (18 - 6 * i))
        });
        let b = n.to_be_bytes();
        out.extend_from_slice(&b[1..chunk.len()]);
    }
    out
}

fn authorization() -> String {
    format!("Basic {}", base64(format!("admin:{PASSWORD}").as_bytes()))
}

/// A chromedriver process and one browser session of headless Chromium.
struct Browser {
    driver: tokio::process::Child,
    addr: String,
    session: String,
    _profile: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = tokio::process::Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        for _ in 0..100 {
            if let Ok(stream) = TcpStream::connect(&addr).await {
                drop(stream);
                let (status, _, body) = http(
                    &addr,
                    "GET /status HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                )
                .await;
                if status == 200 && body.contains("\"ready\":true") {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = TempDir(std::env::temp_dir().join(unique_name("console-chromium")));
        std::fs::create_dir_all(&profile.0).unwrap();
        let mut browser = Self {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        let created = browser
            .command(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": chromium,
                        "args": [
                            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                            "--no-first-run", "--disable-background-networking",
                            "--disable-component-update", "--disable-sync",
                            "--window-size=1100,820",
                            format!("--user-data-dir={}", browser._profile.0.display()),
                        ],
                    },
                }}}),
            )
            .await
            .expect("a browser session");
        browser.session = created["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    /// One WebDriver command; its `value`, or the WebDriver error's.
    async fn command(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let body = if method == "GET" || method == "DELETE" {
            String::new()
        } else {
            body.to_string()
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let (status, _, answer) = http(&self.addr, &request).await;
        let answer: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
        let value = answer["value"].clone();
        if status == 200 { Ok(value) } else { Err(value) }
    }

    async fn session(&self, method: &str, path: &str, body: Value) -> Value {
        self.command(method, &format!("/session/{}{path}", self.session), body)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Sends `Authorization` with every request from now on (Chrome DevTools Protocol).
    async fn log_in(&self, authorization: &str) {
        let cdp = |cmd: &str, params: Value| json!({"cmd": cmd, "params": params});
        self.session(
            "POST",
            "/goog/cdp/execute",
            cdp("Network.enable", json!({})),
        )
        .await;
        self.session(
            "POST",
            "/goog/cdp/execute",
            cdp(
                "Network.setExtraHTTPHeaders",
                json!({"headers": {"Authorization": authorization}}),
            ),
        )
        .await;
    }

    async fn go(&self, url: &str) {
        self.session("POST", "/url", json!({ "url": url })).await;
    }

    async fn title(&self) -> String {
        self.session("GET", "/title", Value::Null)
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn source(&self) -> String {
        self.session("GET", "/source", Value::Null)
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The first element matching `css`, waiting up to 10 s for it.
    async fn find(&self, css: &str) -> String {
        for _ in 0..100 {
            let found = self
                .command(
                    "POST",
                    &format!("/session/{}/element", self.session),
                    json!({"using": "css selector", "value": css}),
                )
                .await;
            if let Ok(element) = found {
                return element["element-6066-11e4-a52e-4f735466cecf"]
                    .as_str()
                    .unwrap()
                    .to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no element {css} on the page: {}", self.source().await);
    }

    /// `command` on the first element matching `css`, found again while the element goes
    /// stale under it (a page still loading after the last click), for up to 10 s.
    async fn on_element(&self, css: &str, method: &str, command: &str, body: Value) -> Value {
        let mut last = Value::Null;
        for _ in 0..100 {
            let element = self.find(css).await;
            let path = format!("/session/{}/element/{element}/{command}", self.session);
            match self.command(method, &path, body.clone()).await {
                Ok(value) => return value,
                Err(error) => last = error,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{method} {command} on {css}: {last}");
    }

    async fn text(&self, css: &str) -> String {
        self.on_element(css, "GET", "text", Value::Null)
            .await
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Waits up to 10 s for the text of `css` to contain `needle` (a click's navigation
    /// may still be under way when it returns); the last text seen.
    async fn text_containing(&self, css: &str, needle: &str) -> String {
        let mut text = String::new();
        for _ in 0..100 {
            text = self.text(css).await;
            if text.contains(needle) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        text
    }

    async fn click(&self, css: &str) {
        self.on_element(css, "POST", "click", json!({})).await;
    }

    async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.session("POST", &format!("/element/{element}/clear"), json!({}))
            .await;
        self.session(
            "POST",
            &format!("/element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    async fn script(&self, script: &str) -> Value {
        self.session(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Whether an alert, confirm or prompt is open.
    async fn alert_open(&self) -> bool {
        self.command(
            "GET",
            &format!("/session/{}/alert/text", self.session),
            Value::Null,
        )
        .await
        .is_ok()
    }

    async fn screenshot(&self, name: &str) {
        let png = self.session("GET", "/screenshot", Value::Null).await;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{name}.png")),
            unbase64(png.as_str().unwrap()),
        )
        .unwrap();
    }

    /// The value of the console's session cookie.
    async fn console_cookie(&self) -> String {
        let cookie = self
            .session("GET", "/cookie/axum_idempotency_console", Value::Null)
            .await;
        cookie["value"].as_str().unwrap().to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
    }
}

fn post_order(key: &str, amount: i64) -> String {
    let body = format!(r#"{{"user_id": 1001, "amount": {amount}}}"#);
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nconnection: close\r\nidempotency-key: {key}\r\n\
         x-user-id: 1001\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A form POST to the console with these credentials, cookie and fields.
fn console_post(path: &str, cookie: Option<&str>, form: &str) -> String {
    let cookie = cookie.map_or(String::new(), |c| {
        format!("cookie: axum_idempotency_console={c}\r\n")
    });
    format!(
        "POST /admin/{path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
         authorization: {}\r\n{cookie}content-type: application/x-www-form-urlencoded\r\n\
         content-length: {}\r\n\r\n{form}",
        authorization(),
        form.len()
    )
}

/// Lease mode in this process, on the example's schema: `POST /charge` whose first call
/// never answers (its holder is lost) and whose later calls answer 201 with their attempt.
fn lease_app(db: &TestDb, calls: Arc<AtomicUsize>) -> Router {
    let layer = scoped(IdempotencyLayer::new(db.pool.clone()).lease(Duration::from_secs(1)));
    Router::new()
        .route(
            "/charge",
            post(move |_lease: IdempotentLease| {
                let calls = Arc::clone(&calls);
                async move {
                    let attempt = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    if attempt == 1 {
                        std::future::pending::<()>().await;
                    }
                    (StatusCode::CREATED, format!("{{\"attempt\":{attempt}}}"))
                }
            }),
        )
        .layer(layer)
}

fn charge(key: &str) -> Request<Body> {
    Request::post("/charge")
        .header("idempotency-key", key)
        .header("x-user-id", "1001")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount": 5}"#))
        .unwrap()
}

async fn scalar_text(db: &TestDb, sql: &str) -> Option<String> {
    db.admin
        .query_opt(&sql.replace("{schema}", &db.schema), &[])
        .await
        .unwrap()
        .map(|row| row.get(0))
}

#[test]
fn an_operator_uses_the_console_in_a_browser() {
    if !common::Database::Postgres.configured() {
        return;
    }
    // The scenario's future is large in a debug build: run it on a thread with room.
    std::thread::Builder::new()
        .stack_size(64 * 1024 * 1024)
        .spawn(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_stack_size(16 * 1024 * 1024)
                .enable_all()
                .build()
                .unwrap()
                .block_on(Box::pin(scenario()));
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn scenario() {
    let (Some(chromium), Some(chromedriver)) = (binary("chromium"), binary("chromedriver")) else {
        return;
    };
    let Some(rabbit) = common::rabbit::connect().await else {
        return;
    };
    let db = TestDb::bare(2).await;
    axum_idempotency::migrate(&db.pool).await.unwrap();
    // A message its consumer gave up on after five failed attempts.
    db.admin
        .batch_execute(&format!(
            "INSERT INTO {}.inbox_messages (consumer_group, message_id, status, attempts, \
             last_error, expires_at) VALUES ('coupon-service', 'msg-9', 'FAILED', 5, \
             'coupon service: <b>timeout</b>', now() + interval '1 day')",
            db.schema
        ))
        .await
        .unwrap();

    // A message the broker refuses (no queue takes its topic), parked after one attempt
    // by a relay of this test, before the example's relay runs.
    let topic = unique_name("console-parked");
    {
        let client = db.pool.get().await.unwrap();
        axum_idempotency::postgres::enqueue(
            &**client,
            &OutboxMessage::new(topic.as_str(), r#"{"order_no":"ORD-77"}"#).id("parked-77"),
        )
        .await
        .unwrap();
    }
    let report = OutboxRelay::new(db.pool.clone(), RabbitPublisher::new(amqp_url()))
        .max_attempts(1)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.parked, 1, "{report:?}");

    // A stuck lease: the first holder of key `lease-stuck` never finishes.
    let calls = Arc::new(AtomicUsize::new(0));
    let lease = lease_app(&db, Arc::clone(&calls));
    let stuck = tokio::spawn(lease.clone().oneshot(charge("lease-stuck")));
    eventually("the lease holder to start", async || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    stuck.abort();

    let payments = unique_name("console-payments");
    let (_example, addr) = start_example(
        "orders",
        &[
            ("DATABASE_URL", &schema_url(&db.schema)),
            ("ADMIN_PASSWORD", PASSWORD),
            ("AMQP_URL", &amqp_url()),
            ("PAYMENTS_QUEUE", &payments),
        ],
    )
    .await;
    let base = format!("http://{addr}/admin/");

    // Keys created over HTTP, one of them hostile.
    assert_eq!(http(&addr, &post_order("console-1", 299)).await.0, 201);
    let hostile = r#""<script>alert(1)</script>""#;
    assert_eq!(http(&addr, &post_order(hostile, 5)).await.0, 201);

    let browser = Browser::start(&chromium, &chromedriver).await;

    // Log in: without credentials the console is refused; with them it answers.
    browser.go(&base).await;
    assert!(
        !browser.source().await.contains("idempotency console"),
        "no console without credentials"
    );
    browser.log_in(&authorization()).await;
    browser.go(&base).await;
    assert_eq!(browser.title().await, "Overview · idempotency console");
    let records = browser.text("main").await;
    assert!(records.contains("stale leases"), "{records}");
    browser.screenshot("overview").await;

    // Find the key created over HTTP: its state, status, and its body on request.
    browser.click("nav a[href=key]").await;
    browser.type_into("input[name=scope]", "1001").await;
    browser.type_into("input[name=key]", "console-1").await;
    browser.click("form[action=key] button").await;
    assert_eq!(browser.text("#state").await, "SUCCESS");
    let record = browser.text("#record").await;
    assert!(record.contains("201"), "{record}");
    assert_eq!(
        browser
            .script("return document.getElementById('body') === null")
            .await,
        json!(true),
        "no body until asked"
    );
    browser.screenshot("key").await;
    browser.click("#show-body").await;
    let body = browser.text("#body").await;
    assert!(body.contains("\"amount\":299"), "{body}");
    browser.screenshot("key-body").await;

    // A key whose record the sweeper archived: listed with its answer, on request.
    assert_eq!(
        http(&addr, &post_order("console-archived", 412)).await.0,
        201
    );
    let admin = axum_idempotency::Admin::new(db.pool.clone());
    let id = admin
        .lookup("1001", "console-archived")
        .await
        .unwrap()
        .unwrap()
        .id;
    db.admin
        .batch_execute(&format!(
            "UPDATE {}.idempotency_records SET expires_at = now() - interval '1 second' \
             WHERE id = '{id}'::uuid",
            db.schema
        ))
        .await
        .unwrap();
    let report = axum_idempotency::Sweeper::new(db.pool.clone())
        .archive(axum_idempotency::Archive::Records)
        .run_once()
        .await
        .unwrap();
    assert_eq!(report.archived_records, 1, "{report:?}");
    browser
        .go(&format!("{base}key?scope=1001&key=console-archived"))
        .await;
    assert!(browser.text("#result").await.contains("No record for key"));
    let archived = browser.text("#archived").await;
    assert!(
        archived.contains("SUCCESS") && archived.contains("201"),
        "{archived}"
    );
    browser.click("#show-archived-bodies").await;
    let answer = browser
        .text_containing(".archived-body", "\"amount\":412")
        .await;
    assert!(answer.contains("\"amount\":412"), "{answer}");
    browser.screenshot("key-archived").await;

    // The hostile key renders as text and runs nothing.
    browser
        .go(&format!(
            "{base}key?scope=1001&key=%22%3Cscript%3Ealert(1)%3C%2Fscript%3E%22&body=1"
        ))
        .await;
    assert_eq!(browser.text("#state").await, "SUCCESS");
    assert!(browser.text("#record").await.contains(hostile));
    assert_eq!(browser.title().await, "Key · idempotency console");
    assert!(!browser.alert_open().await, "no alert ran");
    assert_eq!(
        browser
            .script("return document.querySelectorAll('script').length")
            .await,
        json!(0)
    );
    assert!(
        browser
            .source()
            .await
            .contains("&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;")
    );
    browser.screenshot("key-hostile").await;

    // The stuck lease: listed once its lease ran out, released, and the retry runs.
    let mut listed = String::new();
    for _ in 0..50 {
        browser.go(&format!("{base}stale")).await;
        listed = browser.text("main").await;
        if listed.contains("1001") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(listed.contains("1001"), "{listed}");
    browser.screenshot("stale").await;
    let token_before = scalar_text(
        &db,
        "SELECT fencing_token::text FROM {schema}.idempotency_records WHERE state = 'PROCESSING'",
    )
    .await
    .unwrap();
    browser.click("#leases button").await;
    assert!(
        browser
            .text_containing("main", "Done.")
            .await
            .contains("Done.")
    );
    assert!(browser.text("#result").await.contains("No stale leases"));
    assert_eq!(
        scalar_text(
            &db,
            "SELECT state || ' ' || retryable FROM {schema}.idempotency_records \
             WHERE fencing_token > 0"
        )
        .await
        .as_deref(),
        Some("FAILED true"),
        "released as the sweeper does"
    );
    // A second submit of the same release (same session, token, fencing token) changes
    // nothing more.
    let cookie = browser.console_cookie().await;
    browser
        .go(&format!("{base}key?scope=1001&key=lease-stuck"))
        .await;
    let csrf = browser
        .script("return document.querySelector('input[name=csrf]').value")
        .await;
    let csrf = csrf.as_str().unwrap().to_owned();
    let id = browser
        .script("return document.querySelector('input[name=id]').value")
        .await;
    let id = id.as_str().unwrap().to_owned();
    let again = console_post(
        "release-lease",
        Some(&cookie),
        &format!("csrf={csrf}&id={id}&token={token_before}"),
    );
    let (status, head, _) = http(&addr, &again).await;
    assert_eq!(status, 303, "{head}");
    assert!(head.contains("done=unchanged"), "{head}");
    // The client's retry runs the handler again.
    let retry = lease.clone().oneshot(charge("lease-stuck")).await.unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the retry ran");
    browser
        .go(&format!("{base}key?scope=1001&key=lease-stuck"))
        .await;
    assert_eq!(browser.text("#state").await, "SUCCESS");

    // A forged POST — a form with a made-up token, and one without the session cookie —
    // is refused and changes nothing.
    browser
        .go(&format!("{base}key?scope=1001&key=console-1"))
        .await;
    browser
        .script(&format!(
            "const f = document.createElement('form'); f.method = 'post'; \
             f.action = 'delete-record'; \
             for (const [n, v] of [['id', '{id}'], ['token', '0'], ['csrf', '{}']]) {{ \
               const i = document.createElement('input'); i.name = n; i.value = v; \
               f.appendChild(i); }} \
             document.body.appendChild(f); f.submit(); return 1;",
            "0".repeat(64),
            id = browser
                .script("return document.querySelector('input[name=id]').value")
                .await
                .as_str()
                .unwrap()
        ))
        .await;
    let refused = browser.text("body").await;
    assert!(
        refused.contains("403") && refused.contains("CSRF"),
        "{refused}"
    );
    browser.screenshot("forged-post").await;
    let (status, _, _) = http(
        &addr,
        &console_post(
            "delete-record",
            None,
            &format!("csrf={csrf}&id={id}&token=0"),
        ),
    )
    .await;
    assert_eq!(status, 403, "a token without its session cookie");
    browser
        .go(&format!("{base}key?scope=1001&key=console-1"))
        .await;
    assert_eq!(browser.text("#state").await, "SUCCESS", "nothing changed");

    // The parked message: shown with the broker's refusal, requeued once a queue takes
    // its topic, and published by the example's relay.
    browser.go(&format!("{base}outbox?state=parked")).await;
    let parked = browser.text("#messages").await;
    assert!(parked.contains("parked-77"), "{parked}");
    assert!(parked.contains("unroutable"), "{parked}");
    browser.screenshot("outbox-parked").await;
    let channel = rabbit.create_channel().await.unwrap();
    channel
        .queue_declare(
            topic.as_str().into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    browser.click("#messages button").await;
    assert!(browser.text("#result").await.contains("None"));
    let mut published = None;
    for _ in 0..100 {
        if let Some(delivery) = channel
            .basic_get(topic.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            published = Some(delivery);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let published = published.expect("the requeued message was published");
    assert_eq!(
        published
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str()),
        Some("parked-77")
    );
    eventually("the message to be marked SENT", async || {
        scalar_text(
            &db,
            "SELECT state FROM {schema}.idempotency_outbox WHERE message_id = 'parked-77'",
        )
        .await
        .as_deref()
            == Some("SENT")
    })
    .await;
    browser.go(&format!("{base}outbox")).await;
    browser.screenshot("outbox-pending").await;

    // The given-up message: listed per group, its attempts reset so the next delivery
    // runs the work again.
    browser.go(&format!("{base}inbox")).await;
    browser.screenshot("inbox").await;
    browser.click("a[href='inbox?group=coupon-service']").await;
    let messages = browser.text("#messages").await;
    assert!(
        messages.contains("msg-9") && messages.contains("given up"),
        "{messages}"
    );
    assert!(
        messages.contains("<b>timeout</b>"),
        "the error as text: {messages}"
    );
    browser.screenshot("inbox-group").await;
    browser.click("#messages button").await;
    assert!(
        browser
            .text_containing("main", "Done.")
            .await
            .contains("Done.")
    );
    assert_eq!(
        scalar_text(
            &db,
            "SELECT attempts::text FROM {schema}.inbox_messages WHERE message_id = 'msg-9'"
        )
        .await
        .as_deref(),
        Some("0")
    );
    browser.session("DELETE", "", Value::Null).await;
}

/// The `Admin` operations behind the console's pages and actions, on every driver: keyset
/// pages that neither skip nor repeat a row, and repairs fenced on what the page showed.
async fn admin_pages_and_fenced_repairs<D: PgDriver>()
where
    D::Store: axum_idempotency::MaintenanceStore
        + axum_idempotency::InboxStore
        + axum_idempotency::OutboxStore,
{
    use axum_idempotency::{Admin, OutboxState};

    let db = TestDb::new(2).await;
    db.admin
        .batch_execute(&format!(
            "SET search_path = {schema};
             INSERT INTO idempotency_records (id, scope, fingerprint, status, headers, body,
                 expires_at, state, fencing_token, locked_until)
             SELECT md5(i::text)::uuid, 's', '\\x00', 0, '', '', now() + interval '1 day',
                    'PROCESSING', i, now() - i * interval '1 minute'
             FROM generate_series(1, 5) AS i;
             INSERT INTO inbox_messages (consumer_group, message_id, status, attempts,
                 last_error, updated_at, expires_at)
             SELECT 'g', 'm-' || i, 'FAILED', 5, 'boom', now() - i * interval '1 second',
                    now() + interval '1 day'
             FROM generate_series(1, 5) AS i;
             INSERT INTO idempotency_outbox (message_id, topic, payload, state, attempts)
             SELECT 'o-' || i, 't', '', 'FAILED', 10 FROM generate_series(1, 5) AS i;",
            schema = db.schema
        ))
        .await
        .unwrap();
    let admin = Admin::new(D::pool(&db));

    // Stale leases, the longest-expired first, two a page.
    let mut tokens = Vec::new();
    let mut after = None;
    loop {
        let page = admin.stale_page(after.as_deref(), 2).await.unwrap();
        assert!(page.items.len() <= 2);
        tokens.extend(page.items.iter().map(|r| r.fencing_token));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(tokens, [5, 4, 3, 2, 1]);
    let oldest = admin.stale_page(None, 1).await.unwrap().items.remove(0);
    assert!(
        !admin.release_lease(&oldest.id, 4).await.unwrap(),
        "another token"
    );
    assert!(admin.release_lease(&oldest.id, 5).await.unwrap());
    assert!(
        !admin.release_lease(&oldest.id, 5).await.unwrap(),
        "idempotent"
    );
    let released = admin.record(&oldest.id).await.unwrap().unwrap();
    assert_eq!(
        (released.state.as_str(), released.retryable),
        ("FAILED", true)
    );
    assert!(!admin.delete_record(&oldest.id, 4).await.unwrap());
    assert!(admin.delete_record(&oldest.id, 5).await.unwrap());
    assert!(!admin.delete_record(&oldest.id, 5).await.unwrap());
    assert_eq!(admin.record(&oldest.id).await.unwrap(), None);
    assert!(matches!(
        admin.release_lease("not-hex", 1).await,
        Err(axum_idempotency::Error::InvalidArgument(_))
    ));

    // Failed messages, the most recent first; a reset is idempotent.
    let first = admin.failed_page("g", None, 3).await.unwrap();
    let second = admin
        .failed_page("g", first.next.as_deref(), 3)
        .await
        .unwrap();
    let ids: Vec<_> = first
        .items
        .iter()
        .chain(&second.items)
        .map(|m| m.message_id.as_str())
        .collect();
    assert_eq!(ids, ["m-1", "m-2", "m-3", "m-4", "m-5"]);
    assert_eq!(second.next, None);
    assert!(admin.reset_attempts("g", "m-1").await.unwrap());
    assert!(!admin.reset_attempts("g", "m-1").await.unwrap());
    assert_eq!(
        admin
            .inbox_message("g", "m-1")
            .await
            .unwrap()
            .unwrap()
            .attempts,
        0
    );

    // Parked outbox messages in commit order; the overview counts them all.
    let first = admin
        .outbox_page(OutboxState::Failed, None, 4)
        .await
        .unwrap();
    let rest = admin
        .outbox_page(OutboxState::Failed, first.next.as_deref(), 4)
        .await
        .unwrap();
    assert_eq!(first.items.len() + rest.items.len(), 5);
    assert_eq!(rest.next, None);
    let overview = admin.overview(5).await.unwrap();
    assert_eq!(
        (overview.stale, overview.processing, overview.outbox_parked),
        (4, 4, 5)
    );
    // The table was never analysed: the estimate still covers the rows counted beside it.
    assert!(
        overview.records_estimate >= overview.processing + overview.failed,
        "{overview:?}"
    );
    assert_eq!(overview.inbox.len(), 1);
    assert_eq!(
        (overview.inbox[0].failed, overview.inbox[0].given_up),
        (5, 4)
    );
}

for_each_driver! {
    #[tokio::test] async admin_pages_and_fenced_repairs;
}

/// The sqlx example mounts the same console: 404 without `ADMIN_PASSWORD`; with it, 401
/// without credentials, a key's page with them, and a POST without its session's token
/// refused.
#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlx_example_serves_the_console_behind_basic_auth() {
    if !common::Database::Postgres.configured() {
        return;
    }
    let get = |path: &str, auth: bool| {
        let auth = if auth {
            format!("authorization: {}\r\n", authorization())
        } else {
            String::new()
        };
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{auth}\r\n")
    };
    let db = TestDb::bare(1).await;
    let url = schema_url(&db.schema);
    {
        let (_example, addr) = start_example("orders_sqlx", &[("DATABASE_URL", &url)]).await;
        assert_eq!(http(&addr, &get("/admin/", true)).await.0, 404);
    }
    let (_example, addr) = start_example(
        "orders_sqlx",
        &[("DATABASE_URL", &url), ("ADMIN_PASSWORD", PASSWORD)],
    )
    .await;
    assert_eq!(http(&addr, &post_order("sqlx-1", 10)).await.0, 201);
    assert_eq!(http(&addr, &get("/admin/", false)).await.0, 401);
    let (status, head, page) = http(&addr, &get("/admin/key?scope=1001&key=sqlx-1", true)).await;
    assert_eq!(status, 200, "{head}");
    assert!(page.contains("<td id=\"state\">SUCCESS</td>"), "{page}");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    let id = page
        .split("name=\"id\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let forged = console_post(
        "delete-record",
        Some(&"a".repeat(64)),
        &format!("csrf={}&id={id}&token=0", "0".repeat(64)),
    );
    let (status, _, problem) = http(&addr, &forged).await;
    assert_eq!(status, 403, "{problem}");
    assert!(problem.contains("CSRF"), "{problem}");
    let (_, _, page) = http(&addr, &get("/admin/key?scope=1001&key=sqlx-1", true)).await;
    assert!(page.contains("SUCCESS"), "nothing changed: {page}");
}
