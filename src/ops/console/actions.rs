//! The console's actions: each a POST with the session's CSRF token, idempotent, logged.

use super::form::Form;
use super::*;
use crate::store::{InboxStore, MaintenanceStore, OutboxStore};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header::LOCATION;
use http::{HeaderValue, StatusCode};

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

pub(super) async fn release_lease<D>(State(inner): Shared<D>, request: Request) -> Response
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

pub(super) async fn release_all<D>(State(inner): Shared<D>, request: Request) -> Response
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

pub(super) async fn delete_record<D>(State(inner): Shared<D>, request: Request) -> Response
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

pub(super) async fn reset_attempts<D>(State(inner): Shared<D>, request: Request) -> Response
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

pub(super) async fn requeue<D>(State(inner): Shared<D>, request: Request) -> Response
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
