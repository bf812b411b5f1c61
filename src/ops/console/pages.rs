//! The pages' markup. Every value that came from the database or the request goes
//! through [`escape`] (or [`url`] inside a link) before it is written.

use std::fmt::Write;

use super::html::{age, escape, since, time, until, url};
use crate::engine::view::{
    InboxFailures, MessageInfo, OutboxInfo, Overview, Page, RecordInfo, ResponseBody,
    StoredResponse,
};

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
         <tr><th>oldest stale lease ended</th><td>{}</td></tr></table>",
        o.records_estimate,
        o.processing,
        o.failed,
        o.stale,
        o.stale_oldest_seconds
            .map_or_else(|| "—".to_owned(), |s| format!("{} ago", age(s)))
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

pub(crate) fn key_search(scope: &str, key: &str) -> String {
    format!(
        "<form method=\"get\" action=\"key\">\
         <label>scope <input name=\"scope\" value=\"{}\"></label> \
         <label>key <input name=\"key\" value=\"{}\" size=\"40\"></label> \
         <button type=\"submit\">Find</button></form>",
        escape(scope),
        escape(key)
    )
}

pub(crate) fn key(
    scope: &str,
    key: &str,
    record: Option<&RecordInfo>,
    response: Option<&StoredResponse>,
    show_body: bool,
    done: Option<&str>,
    token: &str,
) -> String {
    let mut s = key_search(scope, key);
    s.push_str(notice(done));
    let Some(r) = record else {
        let _ = write!(
            s,
            "<p id=\"result\">No record for key <span class=\"mono\">{}</span> in scope \
             <span class=\"mono\">{}</span>: the request never committed, or its record was \
             purged.</p>",
            escape(key),
            escape(scope)
        );
        return s;
    };
    let lease = match r.locked_until {
        Some(at) if r.state == "PROCESSING" => {
            let left = until(at);
            if left >= 0.0 {
                format!("{} left", age(left))
            } else {
                format!(
                    "<span class=\"warn\">ran out {} ago (stale)</span>",
                    age(-left)
                )
            }
        }
        _ => "—".to_owned(),
    };
    let _ = write!(
        s,
        "<table id=\"record\"><tr><th>key</th><td class=\"mono\">{}</td></tr>\
         <tr><th>scope</th><td class=\"mono\">{}</td></tr>\
         <tr><th>record id</th><td class=\"mono\">{}</td></tr>\
         <tr><th>state</th><td id=\"state\">{}{}</td></tr>\
         <tr><th>status</th><td>{}</td></tr>\
         <tr><th>fingerprint</th><td class=\"mono\">{}</td></tr>\
         <tr><th>created</th><td>{}</td></tr><tr><th>updated</th><td>{}</td></tr>\
         <tr><th>expires</th><td>{}</td></tr>\
         <tr><th>fencing token</th><td>{}</td></tr>\
         <tr><th>lease</th><td>{lease}</td></tr>\
         <tr><th>response size</th><td>{} bytes</td></tr></table>",
        escape(key),
        escape(&r.scope),
        escape(&r.id),
        escape(&r.state),
        if r.state == "FAILED" {
            if r.retryable {
                " (retryable: the next retry runs again)"
            } else {
                " (final)"
            }
        } else {
            ""
        },
        r.status,
        escape(&r.fingerprint),
        time(r.created_at),
        time(r.updated_at),
        time(r.expires_at),
        r.fencing_token,
        r.response_bytes
    );
    if let Some(response) = response {
        if !response.headers.is_empty() {
            s.push_str("<h2>Response headers</h2><table>");
            for (name, value) in &response.headers {
                let _ = write!(
                    s,
                    "<tr><th class=\"mono\">{}</th><td class=\"mono\">{}</td></tr>",
                    escape(name.as_str()),
                    escape(&String::from_utf8_lossy(value.as_bytes()))
                );
            }
            s.push_str("</table>");
        }
        s.push_str("<h2>Response body</h2>");
        if show_body {
            match &response.body {
                ResponseBody::Plain(body) => {
                    let _ = write!(
                        s,
                        "<pre id=\"body\">{}</pre>",
                        escape(&String::from_utf8_lossy(body))
                    );
                }
                ResponseBody::Sealed { key_id, len } => {
                    let _ = write!(
                        s,
                        "<p id=\"body\">[redacted: {len} bytes encrypted under key id {key_id}; \
                         give the console the layer's body keys to read it]</p>"
                    );
                }
            }
        } else {
            let _ = write!(
                s,
                "<p><a id=\"show-body\" href=\"key?scope={}&amp;key={}&amp;body=1\">Show body</a></p>",
                url(scope),
                url(key)
            );
        }
    }
    let back = format!("{}{}", hidden("scope", scope), hidden("key", key));
    let record = format!(
        "{}{}{back}",
        hidden("id", &r.id),
        hidden("token", &r.fencing_token.to_string())
    );
    s.push_str("<h2>Actions</h2><p>");
    if r.state == "PROCESSING" && r.locked_until.is_some_and(|at| until(at) < 0.0) {
        s.push_str(&button_form(
            "release-lease",
            &record,
            "Release the stuck lease (the next retry runs)",
            token,
        ));
        s.push(' ');
    }
    s.push_str(&button_form(
        "delete-record",
        &record,
        "Delete the record",
        token,
    ));
    s.push_str("</p>");
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

pub(crate) fn stale(page: &Page<RecordInfo>, done: Option<&str>, token: &str) -> String {
    let mut s = String::from(notice(done));
    s.push_str(
        "<p>PROCESSING records whose lease ran out, the longest-expired first. Releasing one \
         marks it FAILED and retryable (as the sweeper does), so the client's next retry runs \
         the handler again with a new fencing token.</p>",
    );
    if page.items.is_empty() {
        s.push_str("<p id=\"result\">No stale leases.</p>");
        return s;
    }
    s.push_str(
        "<table id=\"leases\"><tr><th>record id</th><th>scope</th><th>key</th>\
         <th>lease ran out</th><th>fencing token</th><th></th></tr>",
    );
    let mut all = String::new();
    for r in &page.items {
        let ran_out = r
            .locked_until
            .map_or_else(|| "—".to_owned(), |at| format!("{} ago", age(since(at))));
        let fields = format!(
            "{}{}",
            hidden("id", &r.id),
            hidden("token", &r.fencing_token.to_string())
        );
        let _ = write!(
            s,
            "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td>\
             <td>{ran_out}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.id),
            escape(&r.scope),
            r.key.as_deref().map_or_else(
                || "<span class=\"muted\">not kept</span>".to_owned(),
                escape
            ),
            r.fencing_token,
            button_form("release-lease", &fields, "Release", token)
        );
        all.push_str(&hidden("lease", &format!("{}:{}", r.id, r.fencing_token)));
    }
    s.push_str("</table>");
    s.push_str(&button_form(
        "release-all",
        &all,
        "Release all shown",
        token,
    ));
    s.push_str(&pager("stale?", page.next.as_ref()));
    s
}

pub(crate) fn inbox_groups(groups: &[InboxFailures]) -> String {
    format!(
        "<p>Consumer groups with failed messages. A message at the give-up threshold is \
         acknowledged without running its work; reset its attempts and redeliver it to run \
         the work again.</p>{}",
        inbox_table(groups)
    )
}

pub(crate) fn inbox(
    group: &str,
    page: &Page<MessageInfo>,
    give_up: u32,
    done: Option<&str>,
    token: &str,
) -> String {
    let mut s = String::from(notice(done));
    let _ = write!(
        s,
        "<p>FAILED messages of consumer group <span class=\"mono\">{}</span>, the most \
         recently failed first (given up at {give_up} attempts).</p>",
        escape(group)
    );
    if page.items.is_empty() {
        s.push_str("<p id=\"result\">None.</p>");
        return s;
    }
    s.push_str(
        "<table id=\"messages\"><tr><th>message id</th><th>attempts</th><th>last error</th>\
         <th>last failed</th><th></th></tr>",
    );
    for m in &page.items {
        let fields = format!(
            "{}{}",
            hidden("group", group),
            hidden("message", &m.message_id)
        );
        let given_up = if m.attempts >= give_up {
            " <strong class=\"warn\">given up</strong>"
        } else {
            ""
        };
        let _ = write!(
            s,
            "<tr><td class=\"mono\">{}</td><td>{}{given_up}</td><td class=\"mono\">{}</td>\
             <td>{} ago</td><td>{}</td></tr>",
            escape(&m.message_id),
            m.attempts,
            escape(m.last_error.as_deref().unwrap_or("")),
            age(since(m.updated_at)),
            if m.attempts > 0 {
                button_form("reset-attempts", &fields, "Reset attempts", token)
            } else {
                "<span class=\"muted\">reset</span>".to_owned()
            }
        );
    }
    s.push_str("</table>");
    s.push_str(&pager(
        &format!("inbox?group={}&amp;", url(group)),
        page.next.as_ref(),
    ));
    s
}

pub(crate) fn outbox(
    parked: bool,
    page: &Page<OutboxInfo>,
    done: Option<&str>,
    token: &str,
) -> String {
    let mut s = String::from(notice(done));
    let _ = write!(
        s,
        "<p><a href=\"outbox\"{}>Pending</a> · <a href=\"outbox?state=parked\"{}>Parked</a></p>",
        if parked { "" } else { " class=\"current\"" },
        if parked { " class=\"current\"" } else { "" },
    );
    s.push_str(if parked {
        "<p>Messages the broker kept refusing, parked after their attempts. Requeue one once \
         its queue exists or its consumer is fixed.</p>"
    } else {
        "<p>Messages waiting for the relay, in commit order.</p>"
    });
    if page.items.is_empty() {
        s.push_str("<p id=\"result\">None.</p>");
        return s;
    }
    s.push_str(
        "<table id=\"messages\"><tr><th>seq</th><th>message id</th><th>topic</th>\
         <th>attempts</th><th>last error</th><th>age</th><th>size</th><th></th></tr>",
    );
    for m in &page.items {
        let action = if parked {
            button_form(
                "requeue",
                &hidden("message", &m.message_id),
                "Requeue",
                token,
            )
        } else {
            String::new()
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td><td>{}</td>\
             <td class=\"mono\">{}</td><td>{}</td><td>{} bytes</td><td>{action}</td></tr>",
            m.seq,
            escape(&m.message_id),
            escape(&m.topic),
            m.attempts,
            escape(m.last_error.as_deref().unwrap_or("")),
            age(since(m.created_at)),
            m.payload_bytes
        );
    }
    s.push_str("</table>");
    let link = if parked {
        "outbox?state=parked&amp;"
    } else {
        "outbox?"
    };
    s.push_str(&pager(link, page.next.as_ref()));
    s
}
