//! The gateway's test harness: the binary as a child process, an upstream the test runs
//! (it counts calls per key, remembers what it saw, and can stall), raw TCP upstreams that
//! misbehave, and a TCP link to PostgreSQL the test can cut.

#![allow(unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::common::unique_name;

/// `target/<profile>/idempotency-gateway`, built if `cargo test` has not built it yet.
pub fn gateway_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = profile_dir.join("idempotency-gateway");
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = std::process::Command::new(cargo)
            .args(["build", "-p", "axum-idempotency", "--features", "gateway"])
            .args(["--bin", "idempotency-gateway"])
            .status()
            .unwrap();
        assert!(status.success(), "building the gateway failed");
    }
    binary
}

/// A directory of the test's own, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let dir = std::env::temp_dir()
            .join("axum-idempotency-tests")
            .join(unique_name("gateway"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running gateway: its address, and its metrics and console addresses when asked for.
pub struct Gateway {
    pub child: tokio::process::Child,
    pub addr: String,
    pub metrics: Option<String>,
    pub console: Option<String>,
    pub stderr: Arc<Mutex<String>>,
}

impl Gateway {
    /// The gateway in `dir` with `env` (`BIND_ADDR` on an ephemeral port unless set).
    pub async fn start(dir: &std::path::Path, env: &[(&str, &str)]) -> Self {
        let mut command = tokio::process::Command::new(gateway_binary());
        command
            .current_dir(dir)
            .env_remove("DATABASE_URL")
            .env("BIND_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "axum_idempotency=warn,idempotency_gateway=warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        drain(child.stderr.take().unwrap(), Arc::clone(&stderr));
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut metrics, mut console) = (None, None);
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let url = |line: &str| {
                    let at = line.find("http://").unwrap() + "http://".len();
                    line[at..].split([',', ' ']).next().unwrap().to_owned()
                };
                if line.contains("gateway metrics on") {
                    metrics = Some(url(&line));
                } else if line.contains("gateway console on") {
                    console = Some(url(&line));
                } else if line.contains("listening on http://") {
                    return Some(url(&line));
                }
            }
            None
        })
        .await
        .expect("the gateway did not start in 30 s");
        let Some(addr) = found else {
            let status = child.wait().await.unwrap();
            panic!("the gateway exited ({status}): {}", stderr.lock().unwrap());
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            child,
            addr,
            metrics,
            console,
            stderr,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGKILL: no drain, no goodbye.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The gateway started with `env` that must not serve: its exit code and stderr.
pub async fn fails_to_start(dir: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(gateway_binary());
    command
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env("BIND_ADDR", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("the gateway neither served nor exited in 30 s")
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn drain(mut from: impl tokio::io::AsyncRead + Unpin + Send + 'static, into: Arc<Mutex<String>>) {
    tokio::spawn(async move {
        let mut buf = vec![0; 4096];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
}

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Seen {
    pub fn key(&self) -> Option<&str> {
        self.headers
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap())
    }

    pub fn token(&self) -> Option<i64> {
        self.headers
            .get("idempotency-fencing-token")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }
}

/// The upstream the tests run, on an ephemeral port.
///
/// | path | answer |
/// |---|---|
/// | `/status/N` | status N, `{"call": n}` |
/// | `/redirect` | 302 to `/elsewhere` |
/// | `/big/N` | 201 with N bytes of `text/plain` |
/// | `/stall-first` | the first call of a key waits for [`Upstream::release`] (at most 30 s); later calls answer at once |
/// | `/slow` | 201 after 100 ms |
/// | anything else | 201 `{"call", "key", "token", "body"}`, `Location: /orders/<call>`, `X-Request-Id` |
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
}

struct UpstreamState {
    seen: Mutex<Vec<Seen>>,
    calls: Mutex<HashMap<String, usize>>,
    gate: Semaphore,
}

impl Upstream {
    pub async fn start() -> Self {
        Self::on(TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    pub fn on(listener: TcpListener) -> Self {
        let state = Arc::new(UpstreamState {
            seen: Mutex::new(Vec::new()),
            calls: Mutex::new(HashMap::new()),
            gate: Semaphore::new(0),
        });
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&state));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many times a request with `key` arrived.
    pub fn calls(&self, key: &str) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn total(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    /// Lets one stalled request answer.
    pub fn release(&self) {
        self.state.gate.add_permits(1);
    }
}

async fn answer(State(state): State<Arc<UpstreamState>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        body: body.clone(),
    };
    let key = seen.key().unwrap_or("").to_owned();
    let call = {
        let mut calls = state.calls.lock().unwrap();
        let n = calls.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let token = seen.token();
    state.seen.lock().unwrap().push(seen);
    let path = parts.uri.path();
    if let Some(code) = path.strip_prefix("/status/") {
        let status = StatusCode::from_u16(code.parse().unwrap()).unwrap();
        return (status, axum::Json(serde_json::json!({ "call": call }))).into_response();
    }
    if path == "/redirect" {
        return (StatusCode::FOUND, [("location", "/elsewhere")], "moved").into_response();
    }
    if let Some(n) = path.strip_prefix("/big/") {
        let body = "b".repeat(n.parse().unwrap());
        return (StatusCode::CREATED, [("content-type", "text/plain")], body).into_response();
    }
    if path == "/stall-first" && call == 1 {
        if let Ok(Ok(permit)) =
            tokio::time::timeout(Duration::from_secs(30), state.gate.acquire()).await
        {
            permit.forget();
        }
    }
    if path == "/slow" {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = serde_json::json!({
        "call": call,
        "key": key,
        "token": token,
        "body": String::from_utf8_lossy(&body),
    });
    (
        StatusCode::CREATED,
        [
            ("location", format!("/orders/{call}")),
            ("x-request-id", format!("req-{call}")),
            ("x-other", "not kept".to_owned()),
        ],
        axum::Json(answer),
    )
        .into_response()
}

/// A raw upstream: for each connection, reads the request's head, counts it, then sends
/// `reply` (nothing: closes the connection after the request was sent).
pub struct RawUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl RawUpstream {
    pub async fn start(reply: &'static str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { addr, requests }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A TCP link to `target` the test can cut: connections are refused and those open are
/// reset, as when the server is down.
pub struct Link {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Link {
    pub async fn to(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::clone(&conns);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().unwrap().push(conn);
            }
        });
        Self { addr, task, conns }
    }

    pub fn cut(&self) {
        self.task.abort();
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut();
    }
}

/// An answer as a client sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem document's `code`, checking the content type.
    pub fn code(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        self.json()["code"].as_str().unwrap().to_owned()
    }

    pub fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After: {self:?}"))
            .parse()
            .unwrap()
    }
}

/// A client that follows no redirect.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `method url` with `key` (if any), `headers` and `body`.
pub async fn send(
    method: &str,
    url: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = client()
        .request(method.parse().unwrap(), url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    Answer {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.unwrap(),
    }
}

/// `POST url` under `key` with `body`.
pub async fn post(url: &str, key: &str, body: &str) -> Answer {
    send("POST", url, Some(key), &[], body).await
}

/// A free port on loopback, nothing listening on it.
pub async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Keeps `body` flowing in chunks to `addr` as a chunked `POST path` under `key`; the
/// status line of the answer.
pub async fn post_chunked(addr: &str, path: &str, key: &str, body: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(64) {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
        if stream.write_all(&framed).await.is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}
