//! The driver's text queries of several statements, one round trip each: the claim that
//! begins the request's transaction and holds its key, and the completion that writes the
//! record and commits. Every value is inlined as a literal — bytes as hex (`X'..'`), text
//! as hex with its character set (`_utf8mb4 X'..'`), numbers as digits — so no text of a
//! request is ever spliced into SQL.

use std::fmt::Write as _;

use super::sql;
use crate::engine::record::NewRecord;

/// Records whose headers and body together are larger than this are written with a bound
/// statement instead (hex doubles their size, and a text query must fit the server's
/// `max_allowed_packet`).
pub(super) const INLINE_LIMIT: usize = 1 << 20;

/// `X'…'`: `bytes` as a binary string literal.
fn hex(out: &mut String, bytes: &[u8]) {
    out.reserve(bytes.len() * 2 + 3);
    out.push_str("X'");
    for byte in bytes {
        let _ = write!(out, "{byte:02X}");
    }
    out.push('\'');
}

/// `_utf8mb4 X'…'`: `text` as a UTF-8 string literal.
fn text(out: &mut String, text: &str) {
    out.push_str("_utf8mb4 ");
    hex(out, text.as_bytes());
}

/// The claim of a new key, in one round trip: the transaction begun (its lock waits bounded
/// to `lock_wait` seconds), the key's row lock taken — refused at once while a twin holds
/// it (`NOWAIT`), or waited for with `wait` — the placeholder row inserted (InnoDB holds it
/// locked until the transaction ends, so every twin's locking read waits for it), the
/// savepoint a stored 4xx rolls back to, and the lock wait timeout restored for the
/// handler. It stops at its first error: 1205/3572 (a twin holds the key), 1062 (the key
/// has a committed record the look-up before did not see).
pub(super) fn claim(id: &[u8], fingerprint: &[u8], lock_wait: u64, wait: bool) -> String {
    let mut query = sql::begin(Some(lock_wait), false);
    query.push_str("; SELECT 1 FROM idempotency_records WHERE id = ");
    hex(&mut query, id);
    query.push_str(if wait {
        " FOR UPDATE; "
    } else {
        " FOR UPDATE NOWAIT; "
    });
    placeholder(&mut query, id, fingerprint);
    query.push_str("; ");
    query.push_str(sql::WORK_SAVEPOINT);
    query
}

/// The claim of a key whose replaceable record the claim found under its lock: the record
/// deleted, the placeholder inserted, the savepoint taken and the lock wait restored.
pub(super) fn replace(id: &[u8], fingerprint: &[u8]) -> String {
    let mut query = String::from("DELETE FROM idempotency_records WHERE id = ");
    hex(&mut query, id);
    query.push_str("; ");
    placeholder(&mut query, id, fingerprint);
    query.push_str("; ");
    query.push_str(sql::WORK_SAVEPOINT);
    query
}

/// The key's placeholder: never committed as it is (the completion turns it into the
/// record), already expired and without a lease should anything ever commit it.
fn placeholder(query: &mut String, id: &[u8], fingerprint: &[u8]) {
    query.push_str(
        "INSERT INTO idempotency_records \
         (id, scope, fingerprint, status, headers, body, state, created_at, updated_at, \
          expires_at) VALUES (",
    );
    hex(query, id);
    query.push_str(", '', ");
    hex(query, fingerprint);
    query.push_str(
        ", 0, '', '', 'PROCESSING', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    );
}

/// The completion, in one round trip: the savepoint check (`RELEASE SAVEPOINT`, or for a
/// stored 4xx the rollback to it: either fails with 1305 when the transaction is gone), the
/// placeholder turned into the record, and the commit with the session restored — only
/// when that `UPDATE` changed the placeholder (1231 otherwise, nothing committed). `None`:
/// the record is too large to inline; see [`INLINE_LIMIT`].
pub(super) fn complete(record: &NewRecord<'_>, discard_handler_writes: bool) -> Option<String> {
    if record.headers.len() + record.body.bytes.len() > INLINE_LIMIT {
        return None;
    }
    let mut query = String::with_capacity(
        512 + 2 * (record.headers.len() + record.body.bytes.len() + record.scope.len()),
    );
    query.push_str(if discard_handler_writes {
        sql::ROLLBACK_WORK
    } else {
        sql::RELEASE_WORK
    });
    query.push_str("; UPDATE idempotency_records SET scope = ");
    text(&mut query, record.scope);
    query.push_str(", idempotency_key = ");
    match record.raw_key {
        Some(key) => text(&mut query, key),
        None => query.push_str("NULL"),
    }
    query.push_str(", fingerprint = ");
    hex(&mut query, &record.fingerprint.0);
    let _ = write!(query, ", status = {}, headers = ", record.status.as_u16());
    hex(&mut query, &record.headers);
    query.push_str(", body = ");
    hex(&mut query, &record.body.bytes);
    match record.body.key_id {
        Some(key_id) => {
            let _ = write!(query, ", body_key_id = {key_id}");
        }
        None => query.push_str(", body_key_id = NULL"),
    }
    let _ = write!(
        query,
        ", state = 'SUCCESS', retryable = FALSE, locked_until = NULL, \
         created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND WHERE id = ",
        super::conn::micros(record.ttl)
    );
    hex(&mut query, record.id.as_bytes());
    query.push_str(" AND state = 'PROCESSING' AND locked_until IS NULL; ");
    query.push_str(sql::COMMIT_ONE_ROW_AND_RESTORE);
    Some(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_hex_and_never_the_text_itself() {
        let mut out = String::new();
        text(&mut out, "a'); DROP TABLE x; --");
        assert!(out.starts_with("_utf8mb4 X'61"));
        assert!(!out.contains("DROP"));
        let mut out = String::new();
        hex(&mut out, &[]);
        assert_eq!(out, "X''");
        let mut out = String::new();
        hex(&mut out, &[0, 0xab, 0xff]);
        assert_eq!(out, "X'00ABFF'");
    }

    #[test]
    fn the_claim_stops_before_the_placeholder_when_the_lock_is_refused() {
        let query = claim(&[1; 16], &[2; 32], 1, false);
        let lock = query.find("FOR UPDATE NOWAIT").unwrap();
        let insert = query.find("INSERT INTO idempotency_records").unwrap();
        let savepoint = query.find("SAVEPOINT axum_idempotency_work").unwrap();
        assert!(query.find("START TRANSACTION").unwrap() < lock);
        assert!(lock < insert && insert < savepoint);
        assert!(claim(&[1; 16], &[2; 32], 3, true).contains("innodb_lock_wait_timeout = 3"));
    }
}
