//! The troubleshooting console: server-rendered pages over [`Admin`], to mount under the
//! application's own authentication.
//!
//! Every page is plain HTML that works without JavaScript (none is served); the one
//! stylesheet is compiled in. Everything shown is escaped. Every response forbids scripts,
//! framing and sniffing. Every action is a POST carrying a token bound to the console's
//! session cookie; the actions are idempotent and logged at INFO with who did what.

mod actions;
mod csrf;
mod form;
mod html;
mod pages;
mod views;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, SET_COOKIE};
use http::{HeaderMap, HeaderValue, StatusCode};

use self::csrf::Secret;
use crate::engine::error::Error;
use crate::ops::admin::Admin;
use crate::store::{InboxStore, MaintenanceStore, OutboxStore};

/// The identity of the person using the console, for its log of actions. An application
/// whose own authentication knows the user inserts it as a request extension; without
/// one, the console logs the user name of the request's HTTP Basic credentials, or
/// `anonymous`.
///
/// ```
/// use axum_idempotency::ConsoleUser;
///
/// async fn authenticate(mut request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
///     // ... after checking the session or token of the request:
///     request.extensions_mut().insert(ConsoleUser("alice@example.com".to_owned()));
///     next.run(request).await
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleUser(pub String);

/// The troubleshooting console: an Axum [`Router`] of HTML pages over an [`Admin`] —
/// overview, a key's record, stale leases, failed inbox messages, the outbox — with the
/// repairs an operator makes (release a stuck lease, delete a record, reset a message's
/// attempts, requeue a parked message).
///
/// It has no authentication of its own: mount it behind the application's. The console
/// sets one cookie (`axum_idempotency_console`, its session for CSRF tokens) and links
/// relatively, so it works under any prefix that ends in `/`.
///
/// ```no_run
/// use axum::Router;
/// use axum_idempotency::{Admin, Console};
///
/// # fn auth_layer() -> tower_layer::Identity { tower_layer::Identity::new() }
/// # fn run(pool: deadpool_postgres::Pool) {
/// let console = Console::new(Admin::new(pool)).inbox_give_up(5);
/// let app: Router = Router::new()
///     // ... the application's routes ...
///     .nest("/admin", console.into_router().layer(auth_layer()));
/// // Open /admin/ in a browser.
/// # }
/// ```
#[derive(Clone)]
pub struct Console<D: MaintenanceStore> {
    admin: Admin<D>,
    give_up: u32,
    metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
}

impl<D: MaintenanceStore> std::fmt::Debug for Console<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("give_up", &self.give_up)
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl<D> Console<D>
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    /// A console over `admin`. Give `admin` the layer's body keys
    /// ([`Admin::body_keys`]) and "show body" shows encrypted bodies decrypted; without
    /// them they are marked redacted.
    ///
    /// ```no_run
    /// # fn run(pool: deadpool_postgres::Pool) {
    /// let console = axum_idempotency::Console::new(axum_idempotency::Admin::new(pool));
    /// # }
    /// ```
    pub fn new(admin: Admin<D>) -> Self {
        Self {
            admin,
            give_up: 5,
            metrics: None,
        }
    }

    /// The [`Inbox::max_attempts`](crate::Inbox::max_attempts) the consumers use: failed
    /// messages at this many attempts are shown as given up. Default: 5 (the Inbox's
    /// default).
    ///
    /// ```no_run
    /// # fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>) {
    /// let console = axum_idempotency::Console::new(admin).inbox_give_up(10);
    /// # }
    /// ```
    #[must_use]
    pub fn inbox_give_up(mut self, attempts: u32) -> Self {
        self.give_up = attempts.max(1);
        self
    }

    /// The installed metrics recorder's rendering in the Prometheus text format (for
    /// `metrics-exporter-prometheus`: `move || handle.render()`): the overview then shows
    /// the requests by outcome, the replay (hit) ratio and the key-reuse conflicts.
    ///
    /// ```no_run
    /// # fn run(admin: axum_idempotency::Admin<axum_idempotency::postgres::PgStore>, handle: metrics_exporter_prometheus::PrometheusHandle) {
    /// let console = axum_idempotency::Console::new(admin).metrics(move || handle.render());
    /// # }
    /// ```
    #[must_use]
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// The console's routes, to [`nest`](Router::nest) under a prefix of the
    /// application's, behind its authentication.
    ///
    /// ```no_run
    /// # fn run(console: axum_idempotency::Console<axum_idempotency::postgres::PgStore>) {
    /// let app: axum::Router = axum::Router::new().nest("/ops/console/", console.into_router());
    /// # }
    /// ```
    pub fn into_router(self) -> Router {
        let state = Arc::new(Inner {
            console: self,
            secret: Secret::random(),
        });
        Router::new()
            .route("/", get(views::overview::<D>))
            .route("/console.css", get(stylesheet))
            .route("/key", get(views::key::<D>))
            .route("/stale", get(views::stale::<D>))
            .route("/inbox", get(views::inbox::<D>))
            .route("/outbox", get(views::outbox::<D>))
            .route("/release-lease", post(actions::release_lease::<D>))
            .route("/release-all", post(actions::release_all::<D>))
            .route("/delete-record", post(actions::delete_record::<D>))
            .route("/reset-attempts", post(actions::reset_attempts::<D>))
            .route("/requeue", post(actions::requeue::<D>))
            .with_state(state)
            .layer(axum::middleware::map_response(protect))
    }
}

impl<D> Admin<D>
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    /// The troubleshooting [`Console`] over this admin view, with its defaults, as a
    /// [`Router`] to nest behind the application's authentication.
    ///
    /// ```no_run
    /// # fn auth_layer() -> tower_layer::Identity { tower_layer::Identity::new() }
    /// # fn run(pool: deadpool_postgres::Pool) {
    /// let app: axum::Router = axum::Router::new()
    ///     .nest("/admin", axum_idempotency::Admin::new(pool).console().layer(auth_layer()));
    /// # }
    /// ```
    pub fn console(self) -> Router {
        Console::new(self).into_router()
    }
}

struct Inner<D: MaintenanceStore> {
    console: Console<D>,
    secret: Secret,
}

type Shared<D> = State<Arc<Inner<D>>>;

/// The headers of every console response: no scripts, no framing, no sniffing, no caching,
/// no referrer.
async fn protect(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn stylesheet() -> Response {
    (
        [(CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("console.css"),
    )
        .into_response()
}

/// A problem document (RFC 9457).
fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason(),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

fn failed(error: &Error) -> Response {
    match error {
        Error::InvalidKey(_) | Error::InvalidArgument(_) => {
            problem(StatusCode::BAD_REQUEST, &error.to_string())
        }
        _ => {
            tracing::warn!(error = %error, source = ?std::error::Error::source(error), "console: database error");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; retry later",
            )
        }
    }
}

/// The request's console session (a new one if it has none) and its CSRF token.
struct Session {
    token: String,
    new: Option<String>,
}

fn session<D: MaintenanceStore>(inner: &Inner<D>, headers: &HeaderMap) -> Session {
    match csrf::session(headers) {
        Some(id) => Session {
            token: inner.secret.token(&id),
            new: None,
        },
        None => {
            let id = csrf::new_session();
            Session {
                token: inner.secret.token(&id),
                new: Some(id),
            }
        }
    }
}

/// An HTML page, setting the session cookie if the session is new.
fn html(session: &Session, title: &str, current: &str, body: &str) -> Response {
    let mut response = (
        [(CONTENT_TYPE, "text/html; charset=utf-8")],
        html::page(title, current, body),
    )
        .into_response();
    if let Some(id) = &session.new {
        if let Ok(value) = HeaderValue::from_str(&csrf::set_cookie(id)) {
            response.headers_mut().insert(SET_COOKIE, value);
        }
    }
    response
}
