//! The example service the README runs: `POST /orders` takes effect once per
//! `Idempotency-Key`, scoped by the `X-User-Id` header, on the database `DATABASE_URL`
//! names:
//!
//! | `DATABASE_URL` | database | feature |
//! |---|---|---|
//! | unset | the SQLite file `orders.db` in the working directory, created on start | `sqlite` |
//! | `sqlite:PATH` (e.g. `sqlite:/var/lib/orders.db`) | that SQLite file | `sqlite` |
//! | `mysql://…` (or `mariadb://…`) | MySQL/MariaDB | `mysql` |
//! | `postgres://…` (or `postgresql://…`) | PostgreSQL, through tokio-postgres over deadpool | `deadpool` (default) |
//!
//! The crate's tables and the service's own are created on start. The handlers are written
//! once (below); each database's statements are in `examples/support/orders_db/`.
//!
//! ```text
//! cargo run --example orders --no-default-features --features sqlite
//! curl -i -X POST localhost:3000/orders -H "Idempotency-Key: order-$RANDOM$RANDOM" \
//!      -H 'X-User-Id: 1001' -H 'content-type: application/json' \
//!      -d '{"user_id": 1001, "amount": 299}'
//! curl localhost:3000/metrics
//! ```
//!
//! `POST /orders/{order_no}/pay` (no body; `Idempotency-Key` required, scoped like
//! `POST /orders`) moves the order from `NEW` to `PAID` and, only when this request changed
//! it, enqueues one `{"message_id", "user_id", "coupon_code": "PAID_THANKS"}` message for
//! the queue named by `PAYMENTS_QUEUE` (default `payment-succeeded`) in the same
//! transaction. With `AMQP_URL` set (and feature `rabbitmq`), the outbox relay runs in this
//! process and publishes it; `examples/coupon_consumer.rs` grants the coupon once:
//!
//! ```text
//! AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo run --example orders --features rabbitmq
//! curl -i -X POST localhost:3000/orders/ORD-1/pay -H 'Idempotency-Key: pay-1' -H 'X-User-Id: 1001'
//! ```
//!
//! `AMQP_URL` may list a cluster's nodes separated by commas (the relay connects to the first
//! that answers and moves on when its node fails); `QUEUE_TYPE=quorum` declares the queue as
//! a quorum queue (default: a durable classic queue). On PostgreSQL the relay is woken by
//! `LISTEN`/`NOTIFY`; on MySQL and SQLite it polls.
//! With `ADMIN_PASSWORD` set (and feature `console`), the troubleshooting console is at
//! `/admin/`, behind HTTP Basic authentication as user `admin` with that password:
//! `ADMIN_PASSWORD=secret cargo run --example orders --features console`, then open
//! <http://admin:secret@localhost:3000/admin/>. Without it, `/admin/` is 404.
//!
//! `RECORD_TTL_SECS` sets how long a key's record is replayed (default 24 h);
//! `SWEEP_INTERVAL_SECS` runs the crate's sweeper in this process at that interval, which
//! archives a record into `idempotency_records_archive` and purges it once its TTL has
//! passed. A key whose record was purged runs again as new; its archived row stays. With
//! `ARCHIVE_JSONL=archive.jsonl` as well, the sweeper archives into that file of JSON lines
//! instead (`examples/support/jsonl_archive.rs`: a sink written against the crate's
//! `ArchiveSink`).
//!
//! `GET /metrics` serves the crate's metrics in the Prometheus text format. `RUST_LOG`
//! (e.g. `axum_idempotency=debug,tower_http=debug`) controls the log output.
//!
//! Behind PgBouncer in transaction pooling mode without prepared-statement support (before
//! 1.21, or `max_prepared_statements` unset), set `PREPARED_STATEMENTS=false`: neither the
//! layer nor the handlers then use named prepared statements.

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_idempotency::outbox::{Listener, OutboxMessage};
use axum_idempotency::{IdempotencyLayer, IdempotentTx, IntoStore};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use tower_http::trace::TraceLayer;

#[path = "support/console.rs"]
mod console;
#[path = "support/errors.rs"]
mod errors;
#[path = "support/json.rs"]
mod json;
#[path = "support/jsonl_archive.rs"]
mod jsonl_archive;
#[path = "support/log.rs"]
mod log;
#[path = "support/openapi.rs"]
mod openapi;
#[path = "support/orders_db/mod.rs"]
mod orders_db;
#[path = "support/relay.rs"]
mod relay;
#[path = "support/retention.rs"]
mod retention;
#[path = "support/user.rs"]
mod user;

use orders_db::{Order, OrdersDb};

#[derive(Deserialize)]
struct NewOrder {
    user_id: i64,
    amount: i64,
}

/// Handler errors, as problem documents.
enum AppError {
    InvalidAmount,
    UnknownOrder,
    Database(axum_idempotency::Error),
}

impl From<axum_idempotency::Error> for AppError {
    fn from(e: axum_idempotency::Error) -> Self {
        Self::Database(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, code, detail) = match self {
            Self::InvalidAmount => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_amount",
                "amount must be positive".to_owned(),
            ),
            Self::UnknownOrder => (
                StatusCode::NOT_FOUND,
                "unknown_order",
                "no order with this number".to_owned(),
            ),
            Self::Database(e) => errors::database_problem(&e),
        };
        let body = serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason(),
            "status": status.as_u16(),
            "detail": detail,
            "code": code,
        });
        let mut response = (
            status,
            [("content-type", "application/problem+json")],
            body.to_string(),
        )
            .into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Like the layer's own 503s: a retry may succeed, in a second.
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// Creates an order. The order row and the idempotency record commit together.
async fn create_order<D: OrdersDb>(
    mut tx: IdempotentTx<D>,
    json::JsonBody(order): json::JsonBody<NewOrder>,
) -> Result<impl IntoResponse, AppError> {
    if order.amount <= 0 {
        return Err(AppError::InvalidAmount);
    }
    let order_no = D::insert_order(&mut tx, order.user_id, order.amount).await?;
    let location = format!("/orders/{order_no}");
    Ok((
        StatusCode::CREATED,
        [("location", location)],
        Json(Order {
            order_no,
            user_id: order.user_id,
            amount: order.amount,
        }),
    ))
}

/// Pays an order. The state-machine guard (`NEW` → `PAID`, a conditional update) and the
/// `payment-succeeded` message commit with the idempotency record, or not at all: the
/// message is enqueued only when this request changed the order, so paying it again under
/// another key answers the same and announces nothing.
async fn pay_order<D: OrdersDb>(
    mut tx: IdempotentTx<D>,
    Path(order_no): Path<String>,
) -> Result<Response, AppError> {
    if let Some(user_id) = D::mark_paid(&mut tx, &order_no).await? {
        // The same id on every retry of this request: the consumer's Inbox keeps one.
        let message_id = tx.derive_key("payment-succeeded");
        let event = serde_json::json!({
            "message_id": message_id,
            "user_id": user_id,
            "coupon_code": "PAID_THANKS",
        });
        let message = OutboxMessage::json(relay::payments_queue(), &event)
            .expect("a JSON object")
            .id(message_id);
        tx.enqueue(&message).await?;
    } else if !D::order_exists(&mut tx, &order_no).await? {
        return Ok(AppError::UnknownOrder.into_response());
    }
    Ok(Json(serde_json::json!({ "order_no": order_no, "status": "PAID" })).into_response())
}

async fn get_order<D: OrdersDb>(
    State(pool): State<D::Pool>,
    Path(order_no): Path<String>,
) -> Result<Response, AppError> {
    Ok(match D::find_order(&pool, &order_no).await? {
        Some(order) => Json(order).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

/// The application: the idempotent routes under the layer, `/metrics` beside them.
fn app<D: OrdersDb>(
    pool: D::Pool,
    idempotency: IdempotencyLayer<D>,
    metrics: PrometheusHandle,
    console: Router,
) -> Router {
    Router::new()
        .route(
            "/orders",
            post(create_order::<D>).route_layer(axum::middleware::from_fn(user::require)),
        )
        .route("/orders/{order_no}", get(get_order::<D>))
        .route(
            "/orders/{order_no}/pay",
            post(pay_order::<D>).route_layer(axum::middleware::from_fn(user::require)),
        )
        .layer(idempotency.clone())
        .with_state(pool)
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
        .merge(openapi::router(&idempotency))
        .merge(console)
        .layer(TraceLayer::new_for_http())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        // One line: what failed, and why, all the way down.
        eprintln!("orders example: {}", errors::chain(&*error));
        std::process::exit(1);
    }
}

/// What to paste to try the service: a `curl` creating an order under a key of its own
/// (printed once per start; pasted twice, the second answer is the replay).
fn first_request(addr: SocketAddr) -> String {
    // Reachable from this machine when the service listens on every address.
    let host = match addr.ip() {
        ip if ip.is_unspecified() => SocketAddr::new([127, 0, 0, 1].into(), addr.port()),
        _ => addr,
    };
    // Unique enough for a demo: the start time and the process id, no generator needed.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let key = format!("order-{:x}{:x}", nanos, std::process::id());
    format!(
        "try it (paste it twice: the second answer is the first one, replayed):\n  \
         curl -i -X POST http://{host}/orders -H 'Idempotency-Key: {key}' -H 'X-User-Id: 1001' \
         -H 'Content-Type: application/json' -d '{{\"user_id\": 1001, \"amount\": 299}}'"
    )
}

/// The database URL as it may be printed: without its password.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _password)) => {
                    format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// A start-up step that failed, with the database it was for.
#[derive(Debug)]
struct Startup {
    what: String,
    source: Box<dyn std::error::Error>,
}

impl std::fmt::Display for Startup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Startup {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// What the service was started with.
struct Settings {
    bind: SocketAddr,
    /// `PREPARED_STATEMENTS`, when set.
    prepared: Option<bool>,
    /// `RECORD_TTL_SECS` and `SWEEP_INTERVAL_SECS`.
    retention: retention::Retention,
    metrics: PrometheusHandle,
}

/// The database `DATABASE_URL` names (unset: the SQLite file `orders.db`).
enum Backend {
    Sqlite(String),
    MySql(String),
    Postgres(String),
}

impl Backend {
    fn from_env() -> Result<Self, String> {
        let Ok(url) = std::env::var("DATABASE_URL") else {
            return Ok(Self::Sqlite("sqlite:orders.db".to_owned()));
        };
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "sqlite" => Ok(Self::Sqlite(url)),
            "mysql" | "mariadb" => Ok(Self::MySql(url.replacen("mariadb:", "mysql:", 1))),
            "postgres" | "postgresql" => Ok(Self::Postgres(url)),
            _ => Err(format!(
                "DATABASE_URL must start with sqlite:, mysql:// or postgres:// (it starts with {scheme:?})"
            )),
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // Colours only for a terminal, never into a redirected log.
    log::init(
        std::io::stderr,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    let settings = Settings {
        bind: std::env::var("BIND_ADDR")
            .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
            .parse()?,
        prepared: match std::env::var("PREPARED_STATEMENTS") {
            Ok(value) => Some(value.parse::<bool>().map_err(|_| {
                format!("PREPARED_STATEMENTS must be `true` or `false`, not {value:?}")
            })?),
            Err(_) => None,
        },
        retention: retention::Retention::from_env()?,
        metrics: PrometheusBuilder::new().install_recorder()?,
    };
    match Backend::from_env()? {
        Backend::Sqlite(url) => sqlite(&url, settings).await,
        Backend::MySql(url) => mysql(&url, settings).await,
        Backend::Postgres(url) => postgres(&url, settings).await,
    }
}

/// The tables on `pool`, or the start-up error naming the database.
async fn prepare<D: OrdersDb>(pool: &D::Pool, url: &str) -> Result<(), Startup> {
    D::create_schema(pool).await.map_err(|e| Startup {
        what: format!("could not prepare the database at {}", redacted(url)),
        source: Box::new(e),
    })
}

#[cfg(feature = "sqlite")]
async fn sqlite(url: &str, settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    use std::str::FromStr;
    use std::time::Duration;

    use axum_idempotency::sqlite::SqliteStore;
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };

    // The URL's own settings (`mode=ro`, ...) with those of `SqliteStore::connect_options`
    // on top: the file created (unless the URL asks for read-only), WAL, a busy timeout.
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5))
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_lazy_with(options);
    prepare::<SqliteStore>(&pool, url).await?;
    let file = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let file = file.split('?').next().unwrap_or(file);
    let path = std::path::absolute(file).unwrap_or_else(|_| file.into());
    let database = format!("SQLite file {}", path.display());
    serve(pool.clone(), pool, None, settings, database).await
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(url: &str, _settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    Err(missing_feature(url, "sqlite"))
}

#[cfg(feature = "mysql")]
async fn mysql(url: &str, settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    use std::time::Duration;

    use axum_idempotency::mysql::MySqlStore;
    use sqlx::mysql::MySqlPoolOptions;

    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(url)?;
    prepare::<MySqlStore>(&pool, url).await?;
    let database = format!("MySQL/MariaDB {}", redacted(url));
    serve(pool.clone(), pool, None, settings, database).await
}

#[cfg(not(feature = "mysql"))]
async fn mysql(url: &str, _settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    Err(missing_feature(url, "mysql"))
}

/// How long a PostgreSQL connection may wait on a silent peer, and a request for a
/// connection from the pool.
#[cfg(feature = "deadpool")]
const LINK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

#[cfg(feature = "deadpool")]
async fn postgres(url: &str, settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    use axum_idempotency::postgres::PgStore;
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

    orders_db::postgres::use_prepared_statements(settings.prepared.unwrap_or(true));
    // A connection whose peer went silent (a cut link) fails within 4 s, and the pool
    // waits no longer than that for a connection.
    let mut config: tokio_postgres::Config = url.parse()?;
    axum_idempotency::postgres::detect_dead_peers(&mut config, LINK_TIMEOUT);
    let manager = Manager::from_config(
        config.clone(),
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(16)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(LINK_TIMEOUT))
        .create_timeout(Some(LINK_TIMEOUT))
        .build()?;
    prepare::<PgStore>(&pool, url).await?;
    // LISTEN does not work behind a transaction-pooling PgBouncer (no prepared
    // statements): the relay polls alone there.
    let wake = (settings.prepared != Some(false)).then(|| Listener::postgres(config));
    let database = format!("PostgreSQL {}", redacted(url));
    serve(pool.clone(), pool, wake, settings, database).await
}

#[cfg(not(feature = "deadpool"))]
async fn postgres(url: &str, _settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    Err(missing_feature(url, "deadpool"))
}

/// The error for a `DATABASE_URL` this build cannot serve.
#[allow(dead_code)]
fn missing_feature(url: &str, feature: &str) -> Box<dyn std::error::Error> {
    format!(
        "DATABASE_URL {} needs feature `{feature}`: cargo run --example orders --features {feature}",
        redacted(url)
    )
    .into()
}

/// Serves the application on `store`'s database (described by `database`, as printed) until
/// Ctrl-C or SIGTERM, then drains the requests in flight and stops the relay.
async fn serve<P>(
    store: P,
    pool: <P::Store as OrdersDb>::Pool,
    wake: Option<Listener>,
    settings: Settings,
    database: String,
) -> Result<(), Box<dyn std::error::Error>>
where
    P: IntoStore + Clone + Send + Sync + 'static,
    P::Store: OrdersDb,
{
    let mut idempotency = IdempotencyLayer::new(store.clone()).scope(|parts| {
        parts
            .headers
            .get("x-user-id")?
            .to_str()
            .ok()
            .map(str::to_owned)
    });
    idempotency = settings.retention.layer(idempotency);
    let sweeper = settings.retention.sweeper(store.clone());
    let mut admin = axum_idempotency::Admin::new(store.clone());
    if let Some(prepared) = settings.prepared {
        idempotency = idempotency.prepared_statements(prepared);
        admin = admin.prepared_statements(prepared);
    }
    let relay = relay::start(store, wake, settings.prepared.unwrap_or(true)).await?;
    let listener = tokio::net::TcpListener::bind(settings.bind).await?;
    let addr = listener.local_addr()?;
    println!("orders example listening on http://{addr}");
    println!("database: {database}");
    println!("{}", first_request(addr));
    // ADMIN_PASSWORD: the troubleshooting console at /admin/.
    let console = console::router(admin, {
        let metrics = settings.metrics.clone();
        move || metrics.render()
    });
    axum::serve(
        listener,
        app(pool, idempotency.clone(), settings.metrics, console),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await?;
    idempotency.drain().await;
    // After the drain: what the last requests enqueued is published before the relay stops.
    if let Some(relay) = relay {
        relay.shutdown().await;
    }
    if let Some(sweeper) = sweeper {
        sweeper.shutdown().await;
    }
    println!("orders example stopped");
    Ok(())
}
