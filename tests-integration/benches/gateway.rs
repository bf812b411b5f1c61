//! `idempotency-gateway` against a pass-through: the same binary with nothing guarded
//! (`GATEWAY_METHODS=`), in front of an upstream in this process that answers at once.
//!
//! ```text
//! cargo bench --bench gateway --features gateway                       # SQLite, and PostgreSQL at DATABASE_URL
//! cargo bench --bench gateway --features gateway -- --seconds 5 --rounds 3 --concurrency 16
//! cargo bench --bench gateway --features gateway -- --only sqlite      # or postgres
//! ```
//!
//! Per store and round, three runs at the same concurrency: `pass-through` (keyed POSTs
//! through the unguarded gateway: the proxy hop alone), `new` (a fresh key each: lease claim,
//! forward, fenced completion) and `replay` (keys answered before: the stored answer, the
//! upstream not called). Each is reported as a ratio to `pass-through` of its round, with
//! its p50 latency and what the guarding adds to it; the median round is printed last.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use tokio::io::AsyncBufReadExt;

mod support;

use support::http::Connection;

/// The upstream: 201 and a small JSON body, at once.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let app = Router::new().fallback(move || {
        let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
        std::future::ready(
            (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                format!(r#"{{"order_no":"ORD-{n}","amount":299}}"#),
            )
                .into_response(),
        )
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// The release build of the gateway, built now if needed.
fn gateway_binary() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "axum-idempotency",
            "--features",
            "gateway",
        ])
        .args(["--bin", "idempotency-gateway"])
        .status()
        .unwrap();
    assert!(status.success(), "building the gateway failed");
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("idempotency-gateway")
}

/// A gateway process with `env`; killed when dropped.
struct Gateway {
    _child: tokio::process::Child,
    addr: SocketAddr,
}

async fn start_gateway(upstream: SocketAddr, env: &[(&str, &str)]) -> Gateway {
    let mut command = tokio::process::Command::new(gateway_binary());
    command
        .env("UPSTREAM_URL", format!("http://{upstream}"))
        .env("BIND_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the gateway exited");
        if let Some((_, rest)) = line.split_once("listening on http://") {
            break rest.split(',').next().unwrap().parse().unwrap();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Gateway {
        _child: child,
        addr,
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    PassThrough,
    New,
    Replay,
}

struct Figures {
    rps: f64,
    p50: Duration,
}

static KEYS: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> String {
    format!(
        "bench-{}-{}",
        std::process::id(),
        KEYS.fetch_add(1, Ordering::Relaxed)
    )
}

const BODY: &str = r#"{"user_id":1001,"amount":299}"#;

/// `concurrency` connections sending `path`'s requests for `seconds`.
async fn run(addr: SocketAddr, path: Path, concurrency: usize, seconds: Duration) -> Figures {
    // Replays: one key per connection, answered once before the run.
    let mut replay_keys = Vec::new();
    if path == Path::Replay {
        let mut connection = Connection::open(addr).await;
        for _ in 0..concurrency {
            let key = fresh_key();
            assert_eq!(connection.post("/orders", Some(&key), BODY).await, 201);
            replay_keys.push(key);
        }
    }
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|worker| {
            let replay = replay_keys.get(worker).cloned();
            tokio::spawn(async move {
                let mut connection = Connection::open(addr).await;
                let mut latencies = Vec::new();
                while started.elapsed() < seconds {
                    let key = replay.clone().unwrap_or_else(fresh_key);
                    let sent = Instant::now();
                    let status = connection.post("/orders", Some(&key), BODY).await;
                    assert_eq!(status, 201, "{path:?}");
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Figures {
        rps: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: latencies[latencies.len() / 2],
    }
}

fn flag<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// A fresh schema on `DATABASE_URL`, its URL with the schema as the search path.
async fn postgres_schema() -> Option<(String, tokio_postgres::Client, String)> {
    let base = std::env::var("DATABASE_URL").ok()?;
    let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(connection);
    let schema = format!("gateway_bench_{}", std::process::id());
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    Some((
        format!("{base}{separator}options=-c%20search_path%3D{schema}"),
        client,
        schema,
    ))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = Duration::from_secs(flag(&args, "--seconds", 5));
    let rounds: usize = flag(&args, "--rounds", 3);
    let concurrency: usize = flag(&args, "--concurrency", 16);
    let only: String = flag(&args, "--only", "sqlite,postgres".to_owned());
    let upstream = upstream().await;
    let dir = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let mut stores: Vec<(&str, String)> = Vec::new();
    if only.contains("sqlite") {
        stores.push((
            "SQLite",
            format!("sqlite:{}", dir.join("gateway.db").display()),
        ));
    }
    let mut postgres = None;
    if only.contains("postgres") {
        match postgres_schema().await {
            Some((url, client, schema)) => {
                stores.push(("PostgreSQL", url));
                postgres = Some((client, schema));
            }
            None => println!("PostgreSQL skipped: DATABASE_URL is unset or unreachable"),
        }
    }
    println!(
        "idempotency-gateway against the same binary unguarded, c = {concurrency}, {} s a run, {rounds} rounds",
        seconds.as_secs()
    );
    for (name, url) in &stores {
        let extra = std::env::var("GATEWAY_BENCH_ENV").unwrap_or_default();
        let mut env = vec![("DATABASE_URL", url.as_str())];
        for pair in extra.split(',').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap();
            env.push((name, value));
        }
        let guarded = start_gateway(upstream, &env).await;
        let plain = start_gateway(
            upstream,
            &[("DATABASE_URL", url.as_str()), ("GATEWAY_METHODS", "")],
        )
        .await;
        // Warm both: connections, statements, the page cache.
        run(
            plain.addr,
            Path::PassThrough,
            concurrency,
            Duration::from_secs(1),
        )
        .await;
        run(guarded.addr, Path::New, concurrency, Duration::from_secs(1)).await;
        println!("\n{name}");
        println!(
            "round | pass-through rps, p50 | new × pass, p50 (added) | replay × pass, p50 (added)"
        );
        let mut rows = Vec::new();
        for round in 1..=rounds {
            let pass = run(plain.addr, Path::PassThrough, concurrency, seconds).await;
            let new = run(guarded.addr, Path::New, concurrency, seconds).await;
            let replay = run(guarded.addr, Path::Replay, concurrency, seconds).await;
            let added = |f: &Figures| {
                let (a, b) = (f.p50.as_secs_f64(), pass.p50.as_secs_f64());
                format!("{:+.0} µs", (a - b) * 1e6)
            };
            println!(
                "{round} | {:.0}, {} | {:.2}, {} ({}) | {:.2}, {} ({})",
                pass.rps,
                micros(pass.p50),
                new.rps / pass.rps,
                micros(new.p50),
                added(&new),
                replay.rps / pass.rps,
                micros(replay.p50),
                added(&replay),
            );
            rows.push((new.rps / pass.rps, replay.rps / pass.rps));
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "median: new {:.2} × pass-through, replay {:.2} ×",
            median(rows.iter().map(|r| r.0).collect()),
            median(rows.iter().map(|r| r.1).collect()),
        );
    }
    if let Some((client, schema)) = postgres {
        let _ = client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
