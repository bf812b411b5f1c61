//! The console's pages, as handlers: each reads through `Admin` and renders with `pages`.

use super::form::Form;
use super::*;
use crate::engine::error::Error;
use crate::store::{InboxStore, MaintenanceStore, OutboxStore};
use axum::extract::{RawQuery, State};
use axum::response::Response;
use http::HeaderMap;

fn query(raw: Option<String>) -> Form {
    Form::parse(raw.unwrap_or_default().as_bytes())
}

pub(super) async fn overview<D>(State(inner): Shared<D>, headers: HeaderMap) -> Response
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

pub(super) async fn key<D>(
    State(inner): Shared<D>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response
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
    let archived = match admin.archived(scope, key).await {
        Ok(archived) => archived,
        Err(e) => return failed(&e),
    };
    let show_body = form.get("body") == Some("1");
    let mut body = pages::key(
        scope,
        key,
        record.as_ref(),
        response.as_ref(),
        show_body,
        form.get("done"),
        &session.token,
    );
    body.push_str(&pages::archived(&archived, show_body, scope, key));
    html(&session, "Key", "Key", &body)
}

pub(super) async fn stale<D>(
    State(inner): Shared<D>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response
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

pub(super) async fn inbox<D>(
    State(inner): Shared<D>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response
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

pub(super) async fn outbox<D>(
    State(inner): Shared<D>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response
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
