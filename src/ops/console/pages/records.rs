//! The pages of the idempotency records: a key's record, the stale leases.

use std::fmt::Write;

use super::super::html::{age, escape, since, time, until, url};
use super::{button_form, hidden, notice, pager};
use crate::engine::view::{ArchivedRecord, Page, RecordInfo, ResponseBody, StoredResponse};

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
             purged; its archived records, if any, follow.</p>",
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

/// The key's archived records (the sweeper's archive), newest first, with their stored
/// answers when kept and `show_body` (else a link that shows them); nothing when none.
pub(crate) fn archived(
    archived: &[ArchivedRecord],
    show_body: bool,
    scope: &str,
    key: &str,
) -> String {
    if archived.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h2>Archived</h2><p>Records of this key the sweeper archived when it purged them, \
         the newest first.</p><table id=\"archived\"><tr><th>created</th><th>archived</th>\
         <th>state</th><th>status</th><th>fingerprint</th><th>response</th></tr>",
    );
    for a in archived {
        let r = &a.record;
        let response = if a.response_kept {
            format!("{} bytes kept", r.response_bytes)
        } else {
            "not kept (metadata only)".to_owned()
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td>\
             <td>{response}</td></tr>",
            time(r.created_at),
            time(a.archived_at),
            escape(&r.state),
            r.status,
            escape(&r.fingerprint)
        );
    }
    s.push_str("</table>");
    let kept = archived
        .iter()
        .filter_map(|a| Some((a, a.response.as_ref()?)));
    if !show_body {
        if kept.count() > 0 {
            let _ = write!(
                s,
                "<p><a id=\"show-archived-bodies\" href=\"key?scope={}&amp;key={}&amp;body=1\">\
                 Show the archived answers</a></p>",
                url(scope),
                url(key)
            );
        }
        return s;
    }
    for (a, response) in kept {
        let _ = write!(
            s,
            "<h3>Answer of {} ({})</h3>",
            time(a.record.created_at),
            a.record.status
        );
        match &response.body {
            ResponseBody::Plain(body) => {
                let _ = write!(
                    s,
                    "<pre class=\"archived-body\">{}</pre>",
                    escape(&String::from_utf8_lossy(body))
                );
            }
            ResponseBody::Sealed { key_id, len } => {
                let _ = write!(
                    s,
                    "<p class=\"archived-body\">[redacted: {len} bytes encrypted under key id \
                     {key_id}; give the console the layer's body keys to read it]</p>"
                );
            }
        }
    }
    s
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
