//! The pages' markup. Every value that came from the database or the request goes
//! through [`escape`] (or [`url`] inside a link) before it is written.

use std::fmt::Write;

mod messages;
mod records;

pub(crate) use self::messages::{inbox, inbox_groups, outbox};
pub(crate) use self::records::{archived, key, key_search, stale};

use super::html::{age, escape, url};
use crate::engine::view::{InboxFailures, Overview};

/// Rows per page.
pub(crate) const PAGE: u32 = 50;

fn notice(done: Option<&str>) -> &'static str {
    match done {
        Some("changed") => "<p class=\"notice\">Done.</p>",
        Some("unchanged") => {
            "<p class=\"notice\">Nothing changed: it had been done already, or the row \
             changed since the page was shown.</p>"
        }
        _ => "",
    }
}

fn csrf_field(token: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        escape(token)
    )
}

fn hidden(name: &str, value: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
        escape(value)
    )
}

fn button_form(action: &str, fields: &str, label: &str, token: &str) -> String {
    format!(
        "<form class=\"inline\" method=\"post\" action=\"{action}\">{}{fields}\
         <button type=\"submit\">{label}</button></form>",
        csrf_field(token)
    )
}

fn opt_age(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "—".to_owned(), age)
}

/// `idempotency_requests_total` by outcome, from a Prometheus text rendering.
fn outcomes(text: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("idempotency_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(outcome) = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("outcome=\""))
            .and_then(|o| o.strip_suffix('"'))
        else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        match out.iter_mut().find(|(o, _)| o == outcome) {
            Some((_, total)) => *total += value,
            None => out.push((outcome.to_owned(), value)),
        }
    }
    out
}

pub(crate) fn overview(o: &Overview, metrics: Option<&str>) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<h2>Records</h2><table><tr><th>all (estimate)</th><td>{}</td></tr>\
         <tr><th>PROCESSING</th><td>{}</td></tr><tr><th>FAILED</th><td>{}</td></tr>\
         <tr><th>stale leases</th><td><a href=\"stale\">{}</a></td></tr>\
         <tr><th>oldest stale lease ended</th><td>{}</td></tr>\
         <tr><th>archived (estimate)</th><td id=\"archived-count\">{}</td></tr></table>",
        o.records_estimate,
        o.processing,
        o.failed,
        o.stale,
        o.stale_oldest_seconds
            .map_or_else(|| "—".to_owned(), |s| format!("{} ago", age(s))),
        o.archived_estimate
    );
    let _ = write!(
        s,
        "<h2>Outbox</h2><table><tr><th>pending</th><td><a href=\"outbox\">{}</a></td></tr>\
         <tr><th>oldest pending</th><td>{}</td></tr>\
         <tr><th>parked</th><td><a href=\"outbox?state=parked\">{}</a></td></tr></table>",
        o.outbox_pending,
        opt_age(o.outbox_oldest_pending_seconds),
        o.outbox_parked
    );
    s.push_str("<h2>Inbox</h2>");
    s.push_str(&inbox_table(&o.inbox));
    s.push_str("<h2>Requests</h2>");
    match metrics {
        None => s.push_str(
            "<p class=\"muted\">No metrics recorder was given to the console \
             (<code>Console::metrics</code>).</p>",
        ),
        Some(text) => {
            let outcomes = outcomes(text);
            let of = |name: &str| {
                outcomes
                    .iter()
                    .find(|(o, _)| o == name)
                    .map_or(0.0, |(_, v)| *v)
            };
            let (replayed, executed) = (of("replayed"), of("executed"));
            let ratio = if replayed + executed > 0.0 {
                format!("{:.1} %", 100.0 * replayed / (replayed + executed))
            } else {
                "—".to_owned()
            };
            let _ = write!(
                s,
                "<table><tr><th>replay (hit) ratio</th><td>{ratio}</td></tr>\
                 <tr><th>key reuse with another payload (422)</th><td>{}</td></tr>",
                of("payload_mismatch")
            );
            for (outcome, value) in &outcomes {
                let _ = write!(s, "<tr><th>{}</th><td>{value}</td></tr>", escape(outcome));
            }
            s.push_str("</table>");
        }
    }
    s
}

fn inbox_table(groups: &[InboxFailures]) -> String {
    if groups.is_empty() {
        return "<p>No failed inbox messages.</p>".to_owned();
    }
    let mut s =
        String::from("<table><tr><th>consumer group</th><th>failed</th><th>given up</th></tr>");
    for g in groups {
        let _ = write!(
            s,
            "<tr><td class=\"mono\"><a href=\"inbox?group={}\">{}</a></td><td>{}</td><td>{}</td></tr>",
            url(&g.consumer_group),
            escape(&g.consumer_group),
            g.failed,
            g.given_up
        );
    }
    s.push_str("</table>");
    s
}

fn pager(link: &str, next: Option<&String>) -> String {
    match next {
        Some(next) => format!(
            "<p><a id=\"next\" href=\"{link}after={}\">Next page →</a></p>",
            url(next)
        ),
        None => String::new(),
    }
}
