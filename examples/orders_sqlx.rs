//! The create-order service of `examples/orders.rs` on sqlx: the same environment, routes,
//! answers and tables, with an `sqlx::PgPool` and `sqlx` queries in the handlers.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example orders_sqlx --features sqlx
//! curl -i -X POST localhost:3000/orders -H "Idempotency-Key: order-$RANDOM$RANDOM" -H 'X-User-Id: 1001' \
//!      -H 'content-type: application/json' -d '{"user_id": 1001, "amount": 299}'
//! curl localhost:3000/metrics
//! ```
//!
//! `RECORD_TTL_SECS`, `SWEEP_INTERVAL_SECS` and `ARCHIVE_JSONL` as in `examples/orders.rs`.
//!
//! `PREPARED_STATEMENTS=false` (for a PgBouncer without prepared-statement support) sends
//! the layer's statements and the handlers' unprepared.
//!
//! `ADMIN_PASSWORD` mounts the troubleshooting console at `/admin/` (user `admin`, feature
//! `console`), as in `examples/orders.rs`.

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_idempotency::IdempotencyLayer;
use axum_idempotency::outbox::OutboxMessage;
use axum_idempotency::sqlx::{IdempotentTx, SqlxStore};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
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
#[path = "support/relay.rs"]
mod relay;
#[path = "support/retention.rs"]
mod retention;
#[path = "support/user.rs"]
mod user;

#[derive(Deserialize)]
struct NewOrder {
    user_id: i64,
    amount: i64,
}

#[derive(Serialize)]
struct Order {
    order_no: String,
    user_id: i64,
    amount: i64,
}

/// Handler errors, as problem documents.
enum AppError {
    InvalidAmount,
    UnknownOrder,
    Database(sqlx::Error),
    /// The crate's own errors answer as its problem documents.
    Idempotency(axum_idempotency::Error),
}

impl From<axum_idempotency::Error> for AppError {
    fn from(e: axum_idempotency::Error) -> Self {
        Self::Idempotency(e)
    }
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
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
            Self::Idempotency(e) => return e.into_response(),
            Self::Database(e) => errors::database_problem(&e.into()),
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

/// `PREPARED_STATEMENTS`: `false` for a PgBouncer without prepared-statement support.
static PREPARED_STATEMENTS: OnceLock<bool> = OnceLock::new();

fn prepared_statements() -> bool {
    *PREPARED_STATEMENTS.get().unwrap_or(&true)
}

/// Creates an order. The order row and the idempotency record commit together.
async fn create_order(
    mut tx: IdempotentTx,
    json::JsonBody(order): json::JsonBody<NewOrder>,
) -> Result<impl IntoResponse, AppError> {
    if order.amount <= 0 {
        return Err(AppError::InvalidAmount);
    }
    let order_no: String = sqlx::query_scalar(
        "INSERT INTO orders (order_no, user_id, amount) \
         VALUES ('ORD-' || nextval('orders_no_seq'), $1, $2) RETURNING order_no",
    )
    .bind(order.user_id)
    .bind(order.amount)
    .persistent(prepared_statements())
    .fetch_one(&mut *tx)
    .await?;
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

/// Pays an order: `NEW` → `PAID` with a conditional update, and only when this request
/// changed it one `payment-succeeded` message, both in the layer's transaction.
async fn pay_order(
    mut tx: IdempotentTx,
    Path(order_no): Path<String>,
) -> Result<Response, AppError> {
    let paid: Option<i64> = sqlx::query_scalar(
        "UPDATE orders SET status = 'PAID' \
         WHERE order_no = $1 AND status = 'NEW' RETURNING user_id",
    )
    .bind(&order_no)
    .persistent(prepared_statements())
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(user_id) = paid {
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
    } else {
        let known: Option<i32> = sqlx::query_scalar("SELECT 1 FROM orders WHERE order_no = $1")
            .bind(&order_no)
            .persistent(prepared_statements())
            .fetch_optional(&mut *tx)
            .await?;
        if known.is_none() {
            return Ok(AppError::UnknownOrder.into_response());
        }
    }
    Ok(Json(serde_json::json!({ "order_no": order_no, "status": "PAID" })).into_response())
}

async fn get_order(
    State(pool): State<PgPool>,
    Path(order_no): Path<String>,
) -> Result<Response, AppError> {
    let row: Option<(String, i64, i64)> =
        sqlx::query_as("SELECT order_no, user_id, amount FROM orders WHERE order_no = $1")
            .bind(order_no)
            .persistent(prepared_statements())
            .fetch_optional(&pool)
            .await?;
    Ok(match row {
        Some((order_no, user_id, amount)) => Json(Order {
            order_no,
            user_id,
            amount,
        })
        .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

/// The application: the idempotent routes under the layer, `/metrics` beside them.
fn app(
    pool: PgPool,
    idempotency: IdempotencyLayer<SqlxStore>,
    metrics: PrometheusHandle,
    console: Router,
) -> Router {
    Router::new()
        .route(
            "/orders",
            post(create_order).route_layer(axum::middleware::from_fn(user::require)),
        )
        .route("/orders/{order_no}", get(get_order))
        .route(
            "/orders/{order_no}/pay",
            post(pay_order).route_layer(axum::middleware::from_fn(user::require)),
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

async fn create_schema(pool: &PgPool) -> Result<(), axum_idempotency::Error> {
    axum_idempotency::migrate(pool).await?;
    sqlx::raw_sql(
        "CREATE SEQUENCE IF NOT EXISTS orders_no_seq;
         CREATE TABLE IF NOT EXISTS orders (
             order_no   text        PRIMARY KEY,
             user_id    bigint      NOT NULL,
             amount     bigint      NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now()
         );
         ALTER TABLE orders ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'NEW';",
    )
    .execute(pool)
    .await?;
    Ok(())
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
        let mut line = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            line.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        eprintln!("orders example: {line}");
        std::process::exit(1);
    }
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

/// How long a request waits for a connection from the pool, and a new connection for the
/// server. sqlx sets no TCP timeouts; the layer's store (`SqlxStore`, 4 s by default)
/// bounds the crate's statements and watches the link while a handler runs, so a silent
/// link cut is answered 503 within this bound too.
const LINK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // Colours only for a terminal, never into a redirected log.
    log::init(
        std::io::stderr,
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let bind: SocketAddr = std::env::var("BIND_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".to_owned())
        .parse()?;
    let prepared = match std::env::var("PREPARED_STATEMENTS") {
        Ok(value) => value
            .parse::<bool>()
            .map_err(|_| format!("PREPARED_STATEMENTS must be `true` or `false`, not {value:?}"))?,
        Err(_) => true,
    };
    PREPARED_STATEMENTS.get_or_init(|| prepared);
    let retention = retention::Retention::from_env()?;

    // A connection (or a checkout) that takes longer than LINK_TIMEOUT fails: at start-up
    // an unreachable database is one line after 4 s, not sqlx's default 30 s.
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(LINK_TIMEOUT)
        .connect(&database_url)
        .await
        .map_err(|e| Startup {
            what: format!("could not connect to {}", redacted(&database_url)),
            source: Box::new(e),
        })?;
    create_schema(&pool).await.map_err(|e| Startup {
        what: format!(
            "could not prepare the database at {}",
            redacted(&database_url)
        ),
        source: Box::new(e),
    })?;

    let store = SqlxStore::new(pool.clone()).link_timeout(LINK_TIMEOUT);
    let idempotency = IdempotencyLayer::new(store)
        .scope(|parts| {
            parts
                .headers
                .get("x-user-id")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .prepared_statements(prepared);
    let idempotency = retention.layer(idempotency);
    let sweeper = retention.sweeper(pool.clone());
    // LISTEN does not work behind a transaction-pooling PgBouncer (no prepared
    // statements): the relay polls alone there.
    let wake = prepared.then(|| axum_idempotency::outbox::Listener::sqlx(&pool));
    let relay = relay::start(pool.clone(), wake, prepared).await?;
    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!(
        "orders example listening on http://{}",
        listener.local_addr()?
    );
    // ADMIN_PASSWORD: the troubleshooting console at /admin/.
    let console = console::router(
        axum_idempotency::Admin::new(pool.clone()).prepared_statements(prepared),
        {
            let metrics = metrics.clone();
            move || metrics.render()
        },
    );
    axum::serve(listener, app(pool, idempotency.clone(), metrics, console))
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
