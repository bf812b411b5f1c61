//! The pages of the messages: the inbox's failed ones, the outbox's pending and parked.

use std::fmt::Write;

use super::super::html::{age, escape, since, url};
use super::{button_form, hidden, inbox_table, notice, pager};
use crate::engine::view::{InboxFailures, MessageInfo, OutboxInfo, Page};

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
