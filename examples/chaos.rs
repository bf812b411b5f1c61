//! A bounded chaos run: many keyed requests over real HTTP with duplicate retries,
//! concurrency, client-side timeouts and faults, then the invariants checked against the
//! database.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --release --example chaos -- --keys 20000 --concurrency 32 --seconds 60 --seed 7
//! ```
//!
//! It creates a schema of its own (dropped at the end), migrates it, serves an order
//! handler under [`IdempotencyLayer`] on `127.0.0.1:0` and drives it over loopback with a
//! hand-written HTTP/1.1 client:
//!
//! - every key is sent until it gets a final answer (2xx or 4xx) or its retry budget runs
//!   out; 409 and 5xx are retried;
//! - some keys get a duplicate sent concurrently with their first attempt, some a duplicate
//!   after their answer;
//! - some attempts time out on the client side and drop the connection mid-request (the
//!   layer's default `finish_on_disconnect(true)` completes them);
//! - faults: some connections are cut by the client right after sending the request; now
//!   and then a backend of the app's pool is killed with `pg_terminate_backend`; the
//!   handler sometimes answers 503 after writing its row (rolled back, retried).
//!
//! Then, with the faults switched off, every key is sent once more and must get a 2xx
//! identical to any 2xx answered before, and the database must hold exactly one order row
//! per key, each with its idempotency record, and no 2xx record without its row.
//!
//! Prints one summary line,
//! `keys=.. retries=.. faults=.. timeouts=.. gave_up=.. unresolved=0 rejected=0 duplicates=0 lost=0 mismatched_replays=0 seconds=..`,
//! and exits with status 1 if an invariant does not hold. `keys` counts the keys sent (fewer
//! than `--keys` when the time cap ends the load phase first), `retries` every request past
//! the first per key (duplicates included), `faults` the cut connections, killed backends and
//! injected 503s, `timeouts` the client-side timeouts, `gave_up` the keys whose retry budget
//! ran out during the load phase (the verify phase still resolves them). The invariants:
//! `unresolved` (keys without a 2xx even in the verify phase), `rejected` (final 4xx
//! answers; this handler has none), `duplicates` (keys with more than one order row), `lost`
//! (rows without a record, 2xx records without a row, 2xx answers whose order is not the
//! committed one) and `mismatched_replays` (2xx answers of one key that differ in status,
//! `Content-Type`, `Location` or body).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::IdempotencyLayer;
use axum_idempotency::postgres::IdempotentTx;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_postgres::NoTls;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Per-attempt chances, in percent.
const CUT_PERCENT: u64 = 3;
const SHORT_TIMEOUT_PERCENT: u64 = 5;
const HANDLER_503_PERCENT: u64 = 3;
const CONCURRENT_DUPLICATE_PERCENT: u64 = 10;
const LATE_DUPLICATE_PERCENT: u64 = 10;
/// Attempts per key before it is given up: after the first ten, the pauses grow to
/// 50–250 ms, so a key outlives a few seconds of PostgreSQL being away.
const RETRY_BUDGET: usize = 60;
/// The same in the fault-free verify phase: some 30 s.
const VERIFY_RETRY_BUDGET: usize = 200;
/// Client-side limit of an ordinary attempt.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

struct Options {
    keys: usize,
    concurrency: usize,
    seconds: u64,
    seed: u64,
}

fn parse_options() -> Result<Options, BoxError> {
    let mut options = Options {
        keys: 20_000,
        concurrency: 32,
        seconds: 60,
        seed: SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--keys" => options.keys = value.parse()?,
            "--concurrency" => options.concurrency = value.parse()?,
            "--seconds" => options.seconds = value.parse()?,
            "--seed" => options.seed = value.parse()?,
            other => {
                return Err(format!(
                    "unknown flag {other}; use --keys N --concurrency N --seconds N --seed N"
                )
                .into());
            }
        }
    }
    if options.keys == 0 || options.concurrency == 0 || options.seconds == 0 {
        return Err("--keys, --concurrency and --seconds must be positive".into());
    }
    Ok(options)
}

/// SplitMix64: small, fast and good enough to pick faults.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// What the server side shares with its handler.
struct Server {
    chaos: AtomicBool,
    seed: u64,
    draws: AtomicU64,
    injected_503: AtomicUsize,
}

impl Server {
    fn rng(&self) -> Rng {
        Rng(self.seed
            ^ self
                .draws
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0xA24B_AED4_963E_E407))
    }
}

#[derive(Deserialize)]
struct NewOrder {
    key: String,
    amount: i64,
}

fn unavailable() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, "unavailable").into_response()
}

/// Writes the order row (carrying the key) through the request's transaction, with small
/// random delays, and sometimes fails with 503 after writing it.
async fn create_order(
    State(server): State<Arc<Server>>,
    tx: IdempotentTx,
    Json(order): Json<NewOrder>,
) -> Response {
    let mut rng = server.rng();
    let chaos = server.chaos.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(rng.below(8))).await;
    let row = match tx
        .query_one(
            "INSERT INTO orders (idem_key, amount) VALUES ($1, $2) RETURNING id",
            &[&order.key, &order.amount],
        )
        .await
    {
        Ok(row) => row,
        Err(_) => return unavailable(),
    };
    let id: i64 = row.get(0);
    tokio::time::sleep(Duration::from_millis(rng.below(12))).await;
    if chaos && rng.percent(HANDLER_503_PERCENT) {
        server.injected_503.fetch_add(1, Ordering::Relaxed);
        return unavailable();
    }
    (
        StatusCode::CREATED,
        [("location", format!("/orders/{id}"))],
        Json(serde_json::json!({ "id": id, "key": order.key, "amount": order.amount })),
    )
        .into_response()
}

/// The parts of an answer that a replay must reproduce.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    location: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn order_id(&self) -> Option<i64> {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()?
            .get("id")?
            .as_i64()
    }
}

/// One HTTP/1.1 keep-alive connection.
struct Connection {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl Connection {
    async fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, writer) = stream.into_split();
        Ok(Self {
            reader: BufReader::new(read),
            writer,
        })
    }

    async fn send(&mut self, request: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(request).await
    }

    async fn read_answer(&mut self) -> std::io::Result<(Answer, bool)> {
        let broken = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad response");
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status: u16 = line
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(broken)?;
        let (mut length, mut chunked, mut close) = (None, false, false);
        let (mut content_type, mut location) = (None, None);
        loop {
            line.clear();
            if self.reader.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if line == "\r\n" {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = Some(value.parse::<usize>().map_err(|_| broken())?),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                "content-type" => content_type = Some(value.to_owned()),
                "location" => location = Some(value.to_owned()),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).await?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| broken())?;
                if size == 0 {
                    // Trailers, up to the empty line.
                    loop {
                        line.clear();
                        if self.reader.read_line(&mut line).await? == 0 || line == "\r\n" {
                            break;
                        }
                    }
                    break;
                }
                let start = body.len();
                body.resize(start + size, 0);
                self.reader.read_exact(&mut body[start..]).await?;
                let mut crlf = [0; 2];
                self.reader.read_exact(&mut crlf).await?;
            }
        } else if let Some(length) = length {
            body.resize(length, 0);
            self.reader.read_exact(&mut body).await?;
        } else {
            self.reader.read_to_end(&mut body).await?;
            close = true;
        }
        Ok((
            Answer {
                status,
                content_type,
                location,
                body,
            },
            close,
        ))
    }
}

fn key_name(seed: u64, index: usize) -> String {
    format!("chaos-{seed}-{index}")
}

fn order_request(key: &str, amount: i64) -> Vec<u8> {
    let body = format!(r#"{{"key":"{key}","amount":{amount}}}"#);
    format!(
        "POST /orders HTTP/1.1\r\nhost: chaos\r\nidempotency-key: {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Client-side counters and what each key was answered.
#[derive(Default)]
struct Client {
    requests: AtomicUsize,
    cuts: AtomicUsize,
    timeouts: AtomicUsize,
    unresolved: AtomicUsize,
    rejected: AtomicUsize,
    mismatched: AtomicUsize,
    answers: Mutex<HashMap<usize, Answer>>,
}

impl Client {
    /// Records a final answer; a 2xx must equal every other 2xx of the same key.
    async fn record(&self, index: usize, answer: Answer) {
        if !(200..300).contains(&answer.status) {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "key {index}: final answer {}: {:?}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
            return;
        }
        let mut answers = self.answers.lock().await;
        match answers.get(&index) {
            Some(first) if *first != answer => {
                self.mismatched.fetch_add(1, Ordering::Relaxed);
                eprintln!("key {index}: answer {answer:?} differs from {first:?}");
            }
            Some(_) => {}
            None => {
                answers.insert(index, answer);
            }
        }
    }
}

enum Attempt {
    Final(Answer),
    Retry,
}

/// Sends one attempt for a key on `conn` (opened if absent), maybe with a fault.
async fn attempt(
    addr: SocketAddr,
    conn: &mut Option<Connection>,
    request: &[u8],
    rng: &mut Rng,
    client: &Client,
    chaos: bool,
) -> Attempt {
    client.requests.fetch_add(1, Ordering::Relaxed);
    let cut = chaos && rng.percent(CUT_PERCENT);
    let timeout = if chaos && rng.percent(SHORT_TIMEOUT_PERCENT) {
        Duration::from_millis(1 + rng.below(25))
    } else {
        REQUEST_TIMEOUT
    };
    if conn.is_none() {
        match Connection::open(addr).await {
            Ok(c) => *conn = Some(c),
            Err(_) => return Attempt::Retry,
        }
    }
    let Some(c) = conn.as_mut() else {
        return Attempt::Retry;
    };
    if c.send(request).await.is_err() {
        *conn = None;
        return Attempt::Retry;
    }
    if cut {
        // The request is out; the connection goes before any answer.
        client.cuts.fetch_add(1, Ordering::Relaxed);
        *conn = None;
        return Attempt::Retry;
    }
    match tokio::time::timeout(timeout, c.read_answer()).await {
        Err(_) => {
            client.timeouts.fetch_add(1, Ordering::Relaxed);
            *conn = None;
            Attempt::Retry
        }
        Ok(Err(_)) => {
            *conn = None;
            Attempt::Retry
        }
        Ok(Ok((answer, close))) => {
            if close {
                *conn = None;
            }
            match answer.status {
                408 | 409 | 425 | 429 | 500..=599 => Attempt::Retry,
                _ => Attempt::Final(answer),
            }
        }
    }
}

/// Sends a key until it gets a final answer or its budget runs out; returns that answer.
async fn drive_key(
    addr: SocketAddr,
    conn: &mut Option<Connection>,
    request: &[u8],
    rng: &mut Rng,
    client: &Client,
    chaos: bool,
) -> Option<Answer> {
    let budget = if chaos {
        RETRY_BUDGET
    } else {
        VERIFY_RETRY_BUDGET
    };
    for tries in 0..budget {
        match attempt(addr, conn, request, rng, client, chaos).await {
            Attempt::Final(answer) => return Some(answer),
            Attempt::Retry => {
                let pause = if tries < 10 {
                    1 + rng.below(20)
                } else {
                    50 + rng.below(200)
                };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }
    None
}

/// One client worker: takes keys until they run out or the load phase ends.
async fn worker(
    addr: SocketAddr,
    client: Arc<Client>,
    next: Arc<AtomicUsize>,
    keys: usize,
    seed: u64,
    worker_id: u64,
    load_deadline: Instant,
) {
    let mut rng = Rng(seed ^ (worker_id + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let mut conn = None;
    loop {
        if Instant::now() >= load_deadline {
            return;
        }
        let index = next.fetch_add(1, Ordering::Relaxed);
        if index >= keys {
            return;
        }
        let key = key_name(seed, index);
        let request = order_request(&key, 1 + (index as i64 % 997));
        // A duplicate racing the first attempt, on a connection of its own.
        let racer = rng.percent(CONCURRENT_DUPLICATE_PERCENT).then(|| {
            let client = Arc::clone(&client);
            let request = request.clone();
            let mut rng = Rng(rng.next());
            tokio::spawn(async move {
                let mut conn = None;
                if let Some(answer) =
                    drive_key(addr, &mut conn, &request, &mut rng, &client, true).await
                {
                    client.record(index, answer).await;
                }
            })
        });
        match drive_key(addr, &mut conn, &request, &mut rng, &client, true).await {
            Some(answer) => {
                client.record(index, answer).await;
                if rng.percent(LATE_DUPLICATE_PERCENT) {
                    if let Some(answer) =
                        drive_key(addr, &mut conn, &request, &mut rng, &client, true).await
                    {
                        client.record(index, answer).await;
                    }
                }
            }
            None => {
                client.unresolved.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(racer) = racer {
            let _ = racer.await;
        }
    }
}

/// Now and then kills a random backend of the app's pool; returns how many it killed.
/// Reconnects when its own connection goes (PostgreSQL restarted under the run, say).
async fn terminator(
    url: String,
    application_name: String,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut rng = Rng(seed ^ 0x5851_F42D_4C95_7F2D);
    let mut killed = 0;
    let mut admin: Option<tokio_postgres::Client> = None;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50 + rng.below(250))).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if admin.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            admin = match tokio_postgres::connect(&url, NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    Some(client)
                }
                Err(_) => None,
            };
        }
        let Some(client) = admin.as_ref() else {
            continue;
        };
        let result = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid() \
                 ORDER BY random() LIMIT 1",
                &[&application_name],
            )
            .await;
        if let Ok(rows) = result {
            killed += rows.iter().filter(|row| row.get::<_, bool>(0)).count();
        }
    }
    killed
}

struct Summary {
    keys: usize,
    retries: usize,
    faults: usize,
    timeouts: usize,
    gave_up: usize,
    unresolved: usize,
    rejected: usize,
    duplicates: usize,
    lost: usize,
    mismatched_replays: usize,
}

/// Connects, waiting up to 15 s for PostgreSQL (it may be restarting).
async fn connect(url: &str) -> Result<tokio_postgres::Client, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match tokio_postgres::connect(url, NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return Ok(client);
            }
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

fn pool_for(url: &str, schema: &str, size: usize) -> Result<Pool, BoxError> {
    let mut config: tokio_postgres::Config = url.parse()?;
    config.options(format!("-c search_path={schema}"));
    config.application_name(schema);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()?)
}

/// Migrates the schema and creates the order table.
async fn setup(pool: &Pool) -> Result<(), BoxError> {
    axum_idempotency::migrate(pool).await?;
    pool.get()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (
                 id       bigserial PRIMARY KEY,
                 idem_key text      NOT NULL,
                 amount   bigint    NOT NULL
             );
             CREATE INDEX IF NOT EXISTS orders_idem_key_idx ON orders (idem_key);",
        )
        .await?;
    Ok(())
}

async fn run(
    options: &Options,
    url: &str,
    schema: &str,
    started: Instant,
) -> Result<Summary, BoxError> {
    let pool = pool_for(url, schema, 16)?;
    // Retried for a while: PostgreSQL may be (re)starting.
    let setup_deadline = Instant::now() + Duration::from_secs(15);
    while let Err(e) = setup(&pool).await {
        if Instant::now() >= setup_deadline {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let server = Arc::new(Server {
        chaos: AtomicBool::new(true),
        seed: options.seed,
        draws: AtomicU64::new(0),
        injected_503: AtomicUsize::new(0),
    });
    let layer = IdempotencyLayer::new(pool.clone())
        .store_raw_key(true)
        .handler_timeout(Duration::from_secs(10));
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(layer.clone())
        .with_state(Arc::clone(&server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });

    // Load phase: a little over half the time cap; replaying every key and the checks take
    // about two thirds as long again.
    let budget = Duration::from_secs(options.seconds);
    let load_deadline = started + budget.mul_f64(0.55);
    let client = Arc::new(Client::default());
    let stop = Arc::new(AtomicBool::new(false));
    let killer = tokio::spawn(terminator(
        url.to_owned(),
        schema.to_owned(),
        options.seed,
        Arc::clone(&stop),
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..options.concurrency)
        .map(|id| {
            tokio::spawn(worker(
                addr,
                Arc::clone(&client),
                Arc::clone(&next),
                options.keys,
                options.seed,
                id as u64,
                load_deadline,
            ))
        })
        .collect();
    for w in workers {
        w.await?;
    }
    stop.store(true, Ordering::Relaxed);
    let terminated = killer.await?;
    server.chaos.store(false, Ordering::Relaxed);
    let keys = next.load(Ordering::Relaxed).min(options.keys);
    let load_requests = client.requests.load(Ordering::Relaxed);
    eprintln!(
        "load phase done after {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // Verify phase: every key once more, no faults; a 2xx must replay byte for byte.
    let verify_next = Arc::new(AtomicUsize::new(0));
    let verifiers: Vec<_> = (0..options.concurrency)
        .map(|id| {
            let client = Arc::clone(&client);
            let verify_next = Arc::clone(&verify_next);
            let seed = options.seed;
            tokio::spawn(async move {
                let mut rng = Rng(seed ^ 0x2545_F491_4F6C_DD1D ^ id as u64);
                let mut conn = None;
                let mut missing = 0;
                loop {
                    let index = verify_next.fetch_add(1, Ordering::Relaxed);
                    if index >= keys {
                        return missing;
                    }
                    let key = key_name(seed, index);
                    let request = order_request(&key, 1 + (index as i64 % 997));
                    match drive_key(addr, &mut conn, &request, &mut rng, &client, false).await {
                        Some(answer) => client.record(index, answer).await,
                        None => missing += 1,
                    }
                }
            })
        })
        .collect();
    let mut unanswered = 0;
    for v in verifiers {
        unanswered += v.await?;
    }
    eprintln!(
        "verify phase done after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    serving.abort();
    layer.drain().await;

    // Invariants against the database.
    // A connection of its own for the checks, opened now: an earlier one may have died
    // with a PostgreSQL restart during the run.
    let admin = connect(url).await?;
    admin
        .batch_execute(&format!("SET search_path = {schema}"))
        .await?;
    let mut rows: HashMap<String, Vec<i64>> = HashMap::new();
    for row in admin.query("SELECT idem_key, id FROM orders", &[]).await? {
        rows.entry(row.get(0)).or_default().push(row.get(1));
    }
    let mut records: HashMap<String, i16> = HashMap::new();
    for row in admin
        .query(
            "SELECT idempotency_key, status FROM idempotency_records",
            &[],
        )
        .await?
    {
        let key: Option<String> = row.get(0);
        records.insert(key.unwrap_or_default(), row.get(1));
    }
    let duplicates = rows.values().filter(|ids| ids.len() > 1).count();
    // Rows without a record, 2xx records without a row, and 2xx answers whose row is not
    // the committed one.
    let mut lost = rows.keys().filter(|k| !records.contains_key(*k)).count();
    lost += records
        .iter()
        .filter(|(k, status)| (200..300).contains(&**status) && !rows.contains_key(*k))
        .count();
    let answers = client.answers.lock().await;
    for (index, answer) in answers.iter() {
        let committed = rows.get(&key_name(options.seed, *index));
        let matches = answer
            .order_id()
            .is_some_and(|id| committed.is_some_and(|ids| ids.contains(&id)));
        if !matches {
            lost += 1;
            eprintln!("key {index}: answered {answer:?} but committed rows are {committed:?}");
        }
    }
    // Keys that never got a 2xx, not even in the fault-free verify phase.
    let unresolved = keys.saturating_sub(answers.len());
    if unanswered > 0 {
        eprintln!("{unanswered} keys exhausted their retry budget in the verify phase");
    }
    drop(answers);
    pool.close();

    Ok(Summary {
        keys,
        retries: load_requests.saturating_sub(keys),
        faults: client.cuts.load(Ordering::Relaxed)
            + terminated
            + server.injected_503.load(Ordering::Relaxed),
        timeouts: client.timeouts.load(Ordering::Relaxed),
        gave_up: client.unresolved.load(Ordering::Relaxed),
        unresolved,
        rejected: client.rejected.load(Ordering::Relaxed),
        duplicates,
        lost,
        mismatched_replays: client.mismatched.load(Ordering::Relaxed),
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let options = parse_options()?;
    let started = Instant::now();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let schema = format!(
        "chaos_{}_{}",
        std::process::id(),
        SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos()
    );
    connect(&url)
        .await?
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await?;
    let outcome = run(&options, &url, &schema, started).await;

    // The schema goes whatever happened.
    let cleanup = connect(&url).await?;
    cleanup
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&schema],
        )
        .await?;
    cleanup
        .batch_execute(&format!(
            "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {schema} CASCADE"
        ))
        .await?;

    let summary = outcome?;
    println!(
        "keys={} retries={} faults={} timeouts={} gave_up={} unresolved={} rejected={} \
         duplicates={} lost={} mismatched_replays={} seconds={:.1}",
        summary.keys,
        summary.retries,
        summary.faults,
        summary.timeouts,
        summary.gave_up,
        summary.unresolved,
        summary.rejected,
        summary.duplicates,
        summary.lost,
        summary.mismatched_replays,
        started.elapsed().as_secs_f64()
    );
    if summary.duplicates
        + summary.lost
        + summary.mismatched_replays
        + summary.unresolved
        + summary.rejected
        > 0
    {
        std::process::exit(1);
    }
    Ok(())
}
