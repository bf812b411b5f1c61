//! The orders examples' troubleshooting console: mounted at `/admin/` when `ADMIN_PASSWORD`
//! is set, behind HTTP Basic authentication as user `admin` with that password. Without
//! it, `/admin/` does not exist (404).

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use tower_http::validate_request::ValidateRequestHeaderLayer;

/// The console under `/admin/` (or nothing, without `ADMIN_PASSWORD`), to merge into the
/// application.
#[cfg(feature = "console")]
pub(crate) fn router<D>(
    admin: axum_idempotency::Admin<D>,
    metrics: impl Fn() -> String + Send + Sync + 'static,
) -> Router
where
    D: axum_idempotency::MaintenanceStore
        + axum_idempotency::InboxStore
        + axum_idempotency::OutboxStore
        + Clone
        + Send
        + Sync
        + 'static,
{
    let Ok(password) = std::env::var("ADMIN_PASSWORD") else {
        return Router::new();
    };
    println!("troubleshooting console at /admin/ (user admin)");
    let console = axum_idempotency::Console::new(admin)
        .metrics(metrics)
        .into_router()
        .layer(basic_auth("admin", &password));
    Router::new().nest("/admin/", console)
}

#[cfg(not(feature = "console"))]
pub(crate) fn router<A>(_admin: A, _metrics: impl Fn() -> String) -> Router {
    if std::env::var_os("ADMIN_PASSWORD").is_some() {
        println!("built without feature `console`: no console at /admin/");
    }
    Router::new()
}

/// Requires `Authorization: Basic` with `user` and `password`; a request that has them
/// carries the user as its [`ConsoleUser`](axum_idempotency::ConsoleUser), for the
/// console's log of actions.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
// tower-http's validator answers with the refusal itself, a whole `Response`.
#[allow(clippy::result_large_err)]
fn basic_auth(
    user: &str,
    password: &str,
) -> ValidateRequestHeaderLayer<
    impl FnMut(&mut Request<Body>) -> Result<(), Response<Body>> + Clone + use<>,
> {
    let expected = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
    let user = user.to_owned();
    ValidateRequestHeaderLayer::custom(move |request: &mut Request<Body>| {
        let given = request.headers().get(header::AUTHORIZATION);
        // Compared in constant time: the password's prefix cannot be timed out.
        let matches = given.is_some_and(|given| {
            let given = given.as_bytes();
            given.len() == expected.len()
                && given
                    .iter()
                    .zip(expected.as_bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        });
        if matches {
            #[cfg(feature = "console")]
            request
                .extensions_mut()
                .insert(axum_idempotency::ConsoleUser(user.clone()));
            let _ = &user;
            return Ok(());
        }
        let mut refused = Response::new(Body::empty());
        *refused.status_mut() = StatusCode::UNAUTHORIZED;
        refused.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"console\", charset=\"UTF-8\""),
        );
        Err(refused)
    })
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
