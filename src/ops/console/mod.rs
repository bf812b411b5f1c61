//! The troubleshooting console: server-rendered pages over [`Admin`], to mount under the
//! application's own authentication.
//!
//! Every page is plain HTML that works without JavaScript (none is served); the one
//! stylesheet is compiled in. Everything shown is escaped. Every response forbids scripts,
//! framing and sniffing. Every action is a POST carrying a token bound to the console's
//! session cookie; the actions are idempotent and logged at INFO with who did what.

mod csrf;
mod form;
mod html;
mod pages;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::{HeaderMap, HeaderValue, StatusCode};

use self::csrf::Secret;
use self::form::Form;
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
            .route("/", get(overview::<D>))
            .route("/console.css", get(stylesheet))
            .route("/key", get(key::<D>))
            .route("/stale", get(stale::<D>))
            .route("/inbox", get(inbox::<D>))
            .route("/outbox", get(outbox::<D>))
            .route("/release-lease", post(release_lease::<D>))
            .route("/release-all", post(release_all::<D>))
            .route("/delete-record", post(delete_record::<D>))
            .route("/reset-attempts", post(reset_attempts::<D>))
            .route("/requeue", post(requeue::<D>))
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

fn query(raw: Option<String>) -> Form {
    Form::parse(raw.unwrap_or_default().as_bytes())
}

async fn overview<D>(State(inner): Shared<D>, headers: HeaderMap) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let session = session(&inner, &headers);
    let overview = match inner.console.admin.overview(inner.console.give_up).await {
        Ok(overview) => overview,
        Err(e) => return failed(&e),
    };
    let metrics = inner.console.metrics.as_ref().map(|render| render());
    let body = pages::overview(&overview, metrics.as_deref());
    html(&session, "Overview", "Overview", &body)
}

async fn key<D>(State(inner): Shared<D>, headers: HeaderMap, RawQuery(raw): RawQuery) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let session = session(&inner, &headers);
    let form = query(raw);
    let scope = form.get("scope").unwrap_or_default();
    let Some(key) = form.get("key").filter(|k| !k.is_empty()) else {
        let body = pages::key_search(scope, "");
        return html(&session, "Key", "Key", &body);
    };
    let admin = &inner.console.admin;
    let record = match admin.lookup(scope, key).await {
        Ok(record) => record,
        Err(Error::InvalidKey(e)) => {
            let body = format!(
                "{}<p class=\"warn\">Not a valid Idempotency-Key value: {}</p>",
                pages::key_search(scope, key),
                html::escape(&e.to_string())
            );
            return html(&session, "Key", "Key", &body);
        }
        Err(e) => return failed(&e),
    };
    let response = match &record {
        Some(record) => match admin.response(&record.id).await {
            Ok(response) => response,
            Err(e) => return failed(&e),
        },
        None => None,
    };
    let show_body = form.get("body") == Some("1");
    let body = pages::key(
        scope,
        key,
        record.as_ref(),
        response.as_ref(),
        show_body,
        form.get("done"),
        &session.token,
    );
    html(&session, "Key", "Key", &body)
}

async fn stale<D>(State(inner): Shared<D>, headers: HeaderMap, RawQuery(raw): RawQuery) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let session = session(&inner, &headers);
    let form = query(raw);
    let page = match inner
        .console
        .admin
        .stale_page(form.get("after"), pages::PAGE)
        .await
    {
        Ok(page) => page,
        Err(e) => return failed(&e),
    };
    let body = pages::stale(&page, form.get("done"), &session.token);
    html(&session, "Stale leases", "Stale leases", &body)
}

async fn inbox<D>(State(inner): Shared<D>, headers: HeaderMap, RawQuery(raw): RawQuery) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let session = session(&inner, &headers);
    let form = query(raw);
    let admin = &inner.console.admin;
    let body = match form.get("group") {
        None => match admin.overview(inner.console.give_up).await {
            Ok(overview) => pages::inbox_groups(&overview.inbox),
            Err(e) => return failed(&e),
        },
        Some(group) => match admin
            .failed_page(group, form.get("after"), pages::PAGE)
            .await
        {
            Ok(page) => pages::inbox(
                group,
                &page,
                inner.console.give_up,
                form.get("done"),
                &session.token,
            ),
            Err(e) => return failed(&e),
        },
    };
    html(&session, "Inbox", "Inbox", &body)
}

async fn outbox<D>(State(inner): Shared<D>, headers: HeaderMap, RawQuery(raw): RawQuery) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let session = session(&inner, &headers);
    let form = query(raw);
    let parked = form.get("state") == Some("parked");
    let state = if parked {
        crate::engine::view::OutboxState::Failed
    } else {
        crate::engine::view::OutboxState::Pending
    };
    let page = match inner
        .console
        .admin
        .outbox_page(state, form.get("after"), pages::PAGE)
        .await
    {
        Ok(page) => page,
        Err(e) => return failed(&e),
    };
    let body = pages::outbox(parked, &page, form.get("done"), &session.token);
    html(&session, "Outbox", "Outbox", &body)
}

/// A POSTed form whose CSRF token is the one of the request's console session, and who
/// sent it; or the 403 that refuses it.
struct Action {
    form: Form,
    who: String,
}

fn action<D: MaintenanceStore>(
    inner: &Inner<D>,
    request: Request<()>,
    body: Bytes,
) -> Result<Action, Refused> {
    let (parts, ()) = request.into_parts();
    let form = Form::parse(&body);
    let valid = match (csrf::session(&parts.headers), form.get("csrf")) {
        (Some(session), Some(token)) => inner.secret.verify(&session, token),
        _ => false,
    };
    if !valid {
        tracing::warn!("console: a POST without its session's CSRF token was refused");
        return Err((
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or not this session's; reload the page and try again",
        ));
    }
    let who = parts
        .extensions
        .get::<ConsoleUser>()
        .map(|user| user.0.clone())
        .or_else(|| form::basic_user(&parts.headers))
        .unwrap_or_else(|| "anonymous".to_owned());
    Ok(Action { form, who })
}

/// The answer to an action: back to the page it was made on (a reload does not repeat
/// it), saying whether it changed anything.
fn done(back: String, changed: bool) -> Response {
    let location = format!(
        "{back}{}done={}",
        if back.contains('?') { "&" } else { "?" },
        if changed { "changed" } else { "unchanged" }
    );
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

/// The page a record action goes back to: the key's page, or the stale leases.
fn record_back(form: &Form) -> String {
    match (form.get("scope"), form.get("key")) {
        (Some(scope), Some(key)) => {
            format!("key?scope={}&key={}", html::url(scope), html::url(key))
        }
        _ => "stale".to_owned(),
    }
}

fn token(form: &Form) -> Result<i64, Refused> {
    form.get("token")
        .and_then(|t| t.parse().ok())
        .ok_or((StatusCode::BAD_REQUEST, "the form has no fencing token"))
}

/// Why a POST is refused: its status and the problem's detail.
type Refused = (StatusCode, &'static str);

fn split_request(request: Request) -> (Request<()>, Body) {
    let (parts, body) = request.into_parts();
    (Request::from_parts(parts, ()), body)
}

async fn body_bytes(body: Body) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, 64 * 1024).await.map_err(|_| {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the form is larger than 64 KiB",
        )
    })
}

async fn release_lease<D>(State(inner): Shared<D>, request: Request) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let (request, body) = split_request(request);
    let bytes = match body_bytes(body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let Action { form, who } = match action(&inner, request, bytes) {
        Ok(action) => action,
        Err((status, detail)) => return problem(status, detail),
    };
    let token = match token(&form) {
        Ok(token) => token,
        Err((status, detail)) => return problem(status, detail),
    };
    let id = form.get("id").unwrap_or_default();
    match inner.console.admin.release_lease(id, token).await {
        Ok(changed) => {
            tracing::info!(user = %who, action = "release_lease", record = %id, fencing_token = token, changed, "console action");
            done(record_back(&form), changed)
        }
        Err(e) => failed(&e),
    }
}

async fn release_all<D>(State(inner): Shared<D>, request: Request) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let (request, body) = split_request(request);
    let bytes = match body_bytes(body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let Action { form, who } = match action(&inner, request, bytes) {
        Ok(action) => action,
        Err((status, detail)) => return problem(status, detail),
    };
    let mut released = 0;
    let mut shown = 0;
    for lease in form.all("lease").take(pages::PAGE as usize) {
        let Some((id, token)) = lease.split_once(':') else {
            continue;
        };
        let Ok(token) = token.parse() else { continue };
        shown += 1;
        match inner.console.admin.release_lease(id, token).await {
            Ok(true) => released += 1,
            Ok(false) => {}
            Err(e) => return failed(&e),
        }
    }
    tracing::info!(user = %who, action = "release_all", shown, released, "console action");
    done("stale".to_owned(), released > 0)
}

async fn delete_record<D>(State(inner): Shared<D>, request: Request) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let (request, body) = split_request(request);
    let bytes = match body_bytes(body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let Action { form, who } = match action(&inner, request, bytes) {
        Ok(action) => action,
        Err((status, detail)) => return problem(status, detail),
    };
    let token = match token(&form) {
        Ok(token) => token,
        Err((status, detail)) => return problem(status, detail),
    };
    let id = form.get("id").unwrap_or_default();
    match inner.console.admin.delete_record(id, token).await {
        Ok(changed) => {
            tracing::info!(user = %who, action = "delete_record", record = %id, fencing_token = token, changed, "console action");
            done(record_back(&form), changed)
        }
        Err(e) => failed(&e),
    }
}

async fn reset_attempts<D>(State(inner): Shared<D>, request: Request) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let (request, body) = split_request(request);
    let bytes = match body_bytes(body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let Action { form, who } = match action(&inner, request, bytes) {
        Ok(action) => action,
        Err((status, detail)) => return problem(status, detail),
    };
    let group = form.get("group").unwrap_or_default();
    let message = form.get("message").unwrap_or_default();
    match inner.console.admin.reset_attempts(group, message).await {
        Ok(changed) => {
            tracing::info!(user = %who, action = "reset_attempts", group, message_id = message, changed, "console action");
            done(format!("inbox?group={}", html::url(group)), changed)
        }
        Err(e) => failed(&e),
    }
}

async fn requeue<D>(State(inner): Shared<D>, request: Request) -> Response
where
    D: MaintenanceStore + InboxStore + OutboxStore + Clone + Send + Sync + 'static,
{
    let (request, body) = split_request(request);
    let bytes = match body_bytes(body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let Action { form, who } = match action(&inner, request, bytes) {
        Ok(action) => action,
        Err((status, detail)) => return problem(status, detail),
    };
    let message = form.get("message").unwrap_or_default();
    match inner.console.admin.requeue_outbox(message).await {
        Ok(changed) => {
            tracing::info!(user = %who, action = "requeue", message_id = message, changed, "console action");
            done("outbox?state=parked".to_owned(), changed)
        }
        Err(e) => failed(&e),
    }
}
