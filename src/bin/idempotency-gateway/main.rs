//! `idempotency-gateway`: a reverse proxy that gives services in any language the crate's
//! guarantees. A keyed request of a guarded method (`POST` and `PATCH` by default) is
//! forwarded once, with the client's `Idempotency-Key` and an `Idempotency-Fencing-Token`;
//! its answer is stored in the gateway's database and replayed to every repeat. Everything
//! else is proxied as it is. It is the crate's layer in lease mode in front of an HTTP
//! client: records in SQLite, PostgreSQL or MySQL/MariaDB, fail closed when the database
//! cannot be reached, a sweeper, metrics and the console.
//!
//! Configured by the environment (`UPSTREAM_URL` is required); the guide
//! `axum_idempotency::guide::gateway` has every setting and every answer.
//!
//! ```text
//! cargo install axum-idempotency --features gateway
//! UPSTREAM_URL=http://127.0.0.1:9000 idempotency-gateway
//! ```

mod config;
mod gateway;
mod proxy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use axum_idempotency::{
    Admin, IdempotencyLayer, InboxStore, IntoStore, LeaseStore, MaintenanceStore, OutboxStore,
    Sweeper,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sha2::{Digest, Sha256};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{Settings, Store};
use crate::gateway::Gateway;
use crate::proxy::{Upstream, chain};

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        // One line: what failed, and why.
        eprintln!("idempotency-gateway: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let settings = Settings::from_env()?;
    init_log();
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("could not install the metrics recorder: {e}"))?;
    let store = settings.store.clone();
    let unreachable = |e: &(dyn std::error::Error + 'static)| {
        format!("cannot use the store, {}: {}", store.describe(), chain(e))
    };
    match &store {
        Store::Sqlite(path) => {
            let options = axum_idempotency::sqlite::SqliteStore::connect_options(path);
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(5))
                .connect_with(options)
                .await
                .map_err(|e| unreachable(&e))?;
            serve(pool, settings, metrics).await
        }
        Store::MySql(url) => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(5))
                .connect(url)
                .await
                .map_err(|e| unreachable(&e))?;
            serve(pool, settings, metrics).await
        }
        Store::Postgres(url) => {
            use axum_idempotency::postgres::deadpool_postgres::{
                Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
            };
            use axum_idempotency::postgres::tokio_postgres;
            // A connection whose peer went silent fails within 4 s, and the pool waits no
            // longer than that for a connection: a lost database is a 503 in seconds.
            let link = Duration::from_secs(4);
            let mut config: tokio_postgres::Config = url.parse().map_err(|e| unreachable(&e))?;
            config.connect_timeout(link);
            axum_idempotency::postgres::detect_dead_peers(&mut config, link);
            let manager = Manager::from_config(
                config,
                tokio_postgres::NoTls,
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            let pool = Pool::builder(manager)
                .max_size(16)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(link))
                .create_timeout(Some(link))
                .build()
                .map_err(|e| unreachable(&e))?;
            serve(pool, settings, metrics).await
        }
    }
}

/// `RUST_LOG` as `target=level` directives; by default the crate's and the gateway's
/// information, on stderr.
fn init_log() {
    let default = "axum_idempotency=info,idempotency_gateway=info";
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| directives.parse::<Targets>().ok())
        .unwrap_or_else(|| default.parse().expect("a valid filter"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .with(filter)
        .init();
}

/// Migrates the store, then serves until Ctrl-C or SIGTERM.
async fn serve<P>(pool: P, settings: Settings, metrics: PrometheusHandle) -> Result<(), String>
where
    P: IntoStore + Clone + Send + Sync + 'static,
    P::Store:
        LeaseStore + MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let described = settings.store.describe();
    axum_idempotency::migrate(&pool)
        .await
        .map_err(|e| format!("cannot use the store, {described}: {}", chain(&e)))?;

    let upstream = Upstream::new(settings.upstream.clone(), settings.upstream_timeout);
    let mut layer = IdempotencyLayer::new(pool.clone())
        .lease(settings.lease)
        // The upstream's timeout ends a forwarded request first; the handler's deadline
        // only bounds the gateway's own steps.
        .handler_timeout(settings.lease)
        .methods(settings.methods.clone())
        .body_limit(settings.body_limit)
        .response_limit(settings.response_limit)
        .ttl(settings.ttl);
    if let Some(header) = settings.scope_header.clone() {
        // The header's value, hashed; requests without it share a scope of their own.
        layer = layer.scope(move |parts| {
            Some(match parts.headers.get(&header) {
                Some(value) => format!("h:{:x}", Sha256::digest(value.as_bytes())),
                None => String::new(),
            })
        });
    }
    if !settings.wait.is_zero() {
        layer = layer.wait_for_in_flight(settings.wait);
    }
    if settings.cache_bytes > 0 {
        // Replays of recent answers from memory: no database trip.
        layer = layer.cache_responses(settings.cache_bytes);
    }
    for name in &settings.keep_headers {
        layer = layer.keep_header(name.clone());
    }
    let guarded = Router::new()
        .fallback(gateway::forward_guarded)
        .layer(layer.clone())
        .with_state(Arc::new(upstream.clone()));
    let app = Router::new()
        .fallback(gateway::dispatch)
        .with_state(Arc::new(Gateway {
            upstream,
            methods: settings.methods.clone(),
            key_required: settings.key_required,
            guarded,
        }));

    let sweeper = Sweeper::new(pool.clone())
        .interval((settings.ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60)))
        .success_grace(Duration::ZERO)
        .spawn();
    let mut side = Vec::new();
    if let Some(addr) = settings.metrics_addr {
        let metrics = metrics.clone();
        let router = Router::new().route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        );
        side.push(listen("metrics", addr, router).await?);
    }
    if let Some(addr) = settings.console_addr {
        let token: Option<Arc<str>> = settings.console_token.as_deref().map(Arc::from);
        let render = metrics.clone();
        let console = axum_idempotency::Console::new(Admin::new(pool.clone()))
            .metrics(move || render.render())
            .into_router()
            .layer(axum::middleware::from_fn_with_state(
                token,
                gateway::console_guard,
            ));
        side.push(listen("console", addr, console).await?);
    }

    let listener = tokio::net::TcpListener::bind(settings.bind)
        .await
        .map_err(|e| format!("cannot listen on BIND_ADDR {}: {e}", settings.bind))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!(
        "idempotency-gateway listening on http://{addr}, forwarding to {}, records in {described}",
        settings.upstream
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await
    .map_err(|e| format!("serving failed: {e}"))?;
    layer.drain().await;
    sweeper.shutdown().await;
    for task in side {
        task.abort();
    }
    println!("idempotency-gateway stopped");
    Ok(())
}

/// Serves `router` on `addr` (metrics, console) in the background.
async fn listen(
    what: &str,
    addr: SocketAddr,
    router: Router,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen for the {what} on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!("idempotency-gateway {what} on http://{bound}");
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the side listener stopped");
        }
    }))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
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
        () = ctrl_c => {}
        () = terminate => {}
    }
}
